"""Table maintenance (``loader maintain``, and follow mode's periodic policy), via Iceberg's procedures.

- history tables: small files compacted by a *sort* rewrite on ``(pg_lsn, pg_seq)``, so each file
  still covers a narrow LSN range (what prunes the merge's increment reads);
- current tables (merge-on-read): data files rewritten with their deletes applied, dangling deletes
  removed, so reads stop paying for every MERGE's delete files;
- the loader's own tables (ledger, rejects): compacted;
- every table: snapshots older than ``maintenance.snapshot_retention_hours`` expired (the newest
  ``retain_last`` kept), manifests rewritten, files no snapshot references and older than
  ``maintenance.orphan_older_than_hours`` removed.

Watermarks survive all of it (they are table properties, see loader.iceberg); the merge's late-file
detection is a counter property, not a walk over snapshots. History compaction takes the load
lock and current-table work the merge lock, so it never races the loader's own commits; maintenance
by someone else (these procedures run by hand, pyiceberg, a managed service) is safe too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from loader.config import LoaderSettings
from loader.iceberg import delete_orphan_files, iceberg_table
from loader.locks import stage_lock
from loader.tables import SourceTable, TableNames

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.maintain")


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


@dataclass
class MaintenanceReport:
    tables: list[TableReport] = field(default_factory=list)

    def summary(self) -> str:
        return "maintenance: " + ("; ".join(t.line() for t in self.tables) if self.tables else "no tables")


class Maintenance:
    def __init__(self, spark: SparkSession, settings: LoaderSettings, now: datetime | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)
        self.now = now or datetime.now(UTC)

    def run(self, tables: list[str] | None = None, expire: bool = True, orphans: bool = True) -> MaintenanceReport:
        from loader.merge.current import history_tables

        report = MaintenanceReport()
        selected = [t for t in history_tables(self.spark, self.names) if not tables or t.qualified in tables]
        with stage_lock(self.settings, "load"):
            for t in selected:
                report.tables.append(self._history(t, expire, orphans))
            if not tables:
                for ident in (self.names.ledger, self.names.rejects):
                    report.tables.append(self._table(ident, ident, "binpack", None, expire, orphans))
        with stage_lock(self.settings, "merge"):
            for t in selected:
                cur = self.names.current(t)
                if self.spark.catalog.tableExists(cur):
                    report.tables.append(self._table(f"current {t.qualified}", cur, "deletes", None, expire, orphans))
        return report

    def _history(self, t: SourceTable, expire: bool, orphans: bool) -> TableReport:
        return self._table(
            f"history {t.qualified}",
            self.names.history(t),
            "sort",
            "pg_lsn ASC NULLS LAST, pg_seq ASC NULLS LAST",
            expire,
            orphans,
        )

    def _table(
        self, label: str, ident: str, mode: str, sort_order: str | None, expire: bool, orphans: bool
    ) -> TableReport:
        m = self.settings.maintenance
        rep = rewrite_data_files(self.spark, self.settings, label, ident, mode, sort_order)
        call = f"{_q(self.names.catalog)}.system"
        target = _table_arg(ident, self.names.catalog)
        self.spark.sql(f"CALL {call}.rewrite_manifests(table => {target})").collect()
        if expire:
            # Measured at the call: this run's own rewrite commits count as they should. Microseconds
            # matter: cut to the second, a retention of 0 kept every snapshot of the last second
            # (this run's rewrite commits), found by the soak test.
            older = datetime.now(UTC) - timedelta(hours=m.snapshot_retention_hours)
            row = self.spark.sql(
                f"CALL {call}.expire_snapshots(table => {target}, "
                f"older_than => TIMESTAMP '{older:%Y-%m-%d %H:%M:%S.%f}', "
                f"retain_last => {int(m.retain_last)})"
            ).collect()
            if row:
                # One manifest list per snapshot: the lists deleted are the snapshots expired.
                rep.expired_snapshots = int(_field(row[0], "deleted_manifest_lists_count", 0) or 0)
        if orphans:
            older = datetime.now(UTC) - timedelta(hours=m.orphan_older_than_hours)
            rep.orphans_removed = delete_orphan_files(self.spark, ident, older)
        summary = iceberg_table(self.spark, ident).currentSnapshot()
        if summary is not None:
            s = summary.summary()
            rep.data_files = int(s.get("total-data-files") or 0)
            rep.delete_files = int(s.get("total-delete-files") or 0)
        log.info("maintained %s", rep.line())
        return rep


def rewrite_data_files(
    spark: SparkSession, settings: LoaderSettings, label: str, ident: str, mode: str, sort_order: str | None = None
) -> TableReport:
    """Iceberg's ``rewrite_data_files`` on one table: ``mode`` "deletes" rewrites every data file
    that has deletes (applying them) and drops dangling delete files; "sort" and "binpack" compact
    small files. One commit, which keeps every row (the caller holds the stage lock that writes
    the table)."""
    m = settings.maintenance
    catalog = TableNames(settings).catalog
    rep = TableReport(label)
    options = {
        "min-input-files": str(m.min_input_files),
        "target-file-size-bytes": str(m.target_file_mb * 1024 * 1024),
    }
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
        f"CALL {_q(catalog)}.system.rewrite_data_files(table => {_table_arg(ident, catalog)}{strategy}, "
        f"options => {opts})"
    ).collect()
    if row:
        rep.rewritten_files = int(row[0]["rewritten_data_files_count"])
        rep.added_files = int(row[0]["added_data_files_count"])
        rep.removed_delete_files = int(_field(row[0], "removed_delete_files_count", 0))
    return rep


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _table_arg(ident: str, catalog: str) -> str:
    """The procedure's ``table`` argument: the identifier without its catalog, as a SQL string."""
    prefix = _q(catalog) + "."
    inner = ident[len(prefix) :] if ident.startswith(prefix) else ident
    return "'" + inner.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _field(row: Any, name: str, default: Any) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError):
        return default
