"""Iceberg's Spark procedures the loader calls (``rewrite_data_files``), and the report of what one did to a table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.config import LoaderSettings
from loader.lake.tables import TableNames

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableReport:
    table: str
    rewritten_files: int = 0
    added_files: int = 0
    removed_delete_files: int = 0
    expired_snapshots: int = 0
    orphans_removed: int = 0
    data_files: int = 0  # after
    delete_files: int = 0  # after

    def line(self) -> str:
        return (
            f"{self.table}: {self.rewritten_files} files -> {self.added_files}, {self.removed_delete_files} delete files "
            f"removed, {self.expired_snapshots} snapshots expired, {self.orphans_removed} orphans removed; now "
            f"{self.data_files} data / {self.delete_files} delete files"
        )


def rewrite_data_files(
    spark: SparkSession,
    settings: LoaderSettings,
    label: str,
    ident: str,
    mode: str,
    sort_order: str | None = None,
    small_file_bytes: int | None = None,
) -> TableReport:
    """Iceberg's ``rewrite_data_files`` on one table: ``mode`` "deletes" rewrites every data file
    that has deletes (applying them) and drops dangling delete files; "sort" and "binpack" compact
    small files (``small_file_bytes``: the size below which a file counts as small, else
    Iceberg's default, three quarters of the target). One commit, which keeps every row (the
    caller holds the stage lock that writes the table)."""
    m = settings.maintenance
    catalog = TableNames(settings).catalog
    rep = TableReport(label)
    options = {
        "min-input-files": str(m.min_input_files),
        "target-file-size-bytes": str(m.target_file_mb * 1024 * 1024),
    }
    if small_file_bytes is not None:
        # Only files below it (or with a deleted-row share over Iceberg's delete-ratio-threshold,
        # for deletes scoped to one file) are rewritten: the big files and their deletes stay.
        options["min-file-size-bytes"] = str(small_file_bytes)
    if mode == "deletes":
        # The new files take the rewrite's own sequence number, above every delete file's, so
        # remove-dangling-deletes can drop all the deletes just applied (with the default, the
        # starting sequence number, the last merge's delete files stayed behind). Safe because
        # the caller holds the merge lock: no delete can commit during the rewrite.
        options |= {
            "delete-file-threshold": "1",
            "remove-dangling-deletes": "true",
            "use-starting-sequence-number": "false",
        }
    opts = "map(" + ", ".join(f"'{k}', '{v}'" for k, v in options.items()) + ")"
    strategy = f", strategy => 'sort', sort_order => '{sort_order}'" if sort_order else ""
    row = spark.sql(
        f"CALL {quote_name(catalog)}.system.rewrite_data_files(table => {procedure_table_arg(ident, catalog)}{strategy}, "
        f"options => {opts})"
    ).collect()
    if row:
        rep.rewritten_files = int(row[0]["rewritten_data_files_count"])
        rep.added_files = int(row[0]["added_data_files_count"])
        rep.removed_delete_files = int(field_or(row[0], "removed_delete_files_count", 0))
    return rep


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def procedure_table_arg(ident: str, catalog: str) -> str:
    """The procedure's ``table`` argument: the identifier without its catalog, as a SQL string."""
    prefix = quote_name(catalog) + "."
    inner = ident[len(prefix) :] if ident.startswith(prefix) else ident
    return "'" + inner.replace("\\", "\\\\").replace("'", "\\'") + "'"


def field_or(row: Any, name: str, default: Any) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError):
        return default


def rewrite_position_deletes(spark: SparkSession, settings: LoaderSettings, ident: str) -> tuple[int, int]:
    """Iceberg's ``rewrite_position_delete_files`` on one table: every position delete file
    rewritten into one per partition (up to the target size), the deletes of data files no longer
    in the table dropped. One commit that changes no row. (delete files before, after)."""
    catalog = TableNames(settings).catalog
    target = settings.maintenance.target_file_mb * 1024 * 1024
    row = spark.sql(
        f"CALL {quote_name(catalog)}.system.rewrite_position_delete_files(table => "
        f"{procedure_table_arg(ident, catalog)}, options => map('rewrite-all', 'true', "
        f"'target-file-size-bytes', '{target}'))"
    ).collect()
    if not row:
        return 0, 0
    return int(row[0]["rewritten_delete_files_count"]), int(row[0]["added_delete_files_count"])
