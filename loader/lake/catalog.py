"""pyiceberg access to the shared catalog (no JVM): used by ``status`` and tests."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from loader.config import LoaderSettings, redact, secret_text
from loader.errors import CatalogError
from loader.lake.tables import newest_position

if TYPE_CHECKING:
    from loader.lake.tables import SourceTable


def pyiceberg_uri(uri: str, password: str | None = None) -> str:
    """The SQLAlchemy URL pyiceberg's SqlCatalog needs (psycopg 3 driver, password merged in)."""
    from urllib.parse import quote

    u = urlparse(uri)
    if u.scheme not in ("postgresql", "postgres"):
        return uri
    if password is not None and u.password is None:
        user = f"{u.username or ''}:{quote(password, safe='')}@"
        host = u.netloc.rsplit("@", 1)[-1]
        u = u._replace(netloc=user + host)
    return "postgresql+psycopg" + u.geturl()[len(u.scheme) :]


def open_catalog(settings: LoaderSettings) -> Any:
    """The pyiceberg catalog for these settings; one per distinct catalog/S3 configuration.

    Cached because each SqlCatalog owns a SQLAlchemy connection pool: a new one per call would
    hold catalog-database connections until garbage collection.
    """
    c = settings.catalog
    s3 = settings.s3
    secret = secret_text(s3.secret_access_key)
    return _open_catalog(c.name, pyiceberg_uri(c.uri, c.secret()), c.warehouse, s3.model_dump_json(), secret)


@functools.lru_cache(maxsize=8)
def _open_catalog(name: str, uri: str, warehouse: str, s3_json: str, s3_secret: str | None) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from loader.config import S3Settings
    from loader.lake import pyiceberg_fixes

    pyiceberg_fixes.apply()

    s3 = S3Settings.model_validate_json(s3_json)
    props: dict[str, str] = {"uri": uri, "warehouse": warehouse}
    if s3.endpoint_url:
        props["s3.endpoint"] = s3.endpoint_url
    if s3.access_key_id:
        props["s3.access-key-id"] = s3.access_key_id
        props["s3.secret-access-key"] = s3_secret or ""
    props["s3.region"] = s3.region
    if s3.path_style:
        props["s3.force-virtual-addressing"] = "false"
    try:
        return SqlCatalog(name, **props)
    except Exception as exc:
        raise CatalogError(
            f"cannot open the Iceberg catalog at {redact(uri)}: {redact(str(exc))}",
            hint="check LOADER_CATALOG__URI and that its database is reachable",
        ) from exc


def history_source_tables(settings: LoaderSettings) -> list[SourceTable]:
    """The source tables the lake holds (one per history table), in order, without a JVM."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    from loader.lake.tables import SourceTable

    try:
        idents = open_catalog(settings).list_tables(settings.catalog.history_namespace)
    except NoSuchNamespaceError:
        return []
    return sorted(SourceTable.from_iceberg_name(i[-1]) for i in idents)


def lake_source_table(settings: LoaderSettings, qualified: str) -> SourceTable:
    """The lake's table a user names ``schema.table`` (:meth:`SourceTable.among` over the lake's
    tables: a dot inside a name does not move the split)."""
    from loader.lake.tables import SourceTable

    return SourceTable.among(qualified, history_source_tables(settings))


def lake_tables(settings: LoaderSettings) -> list[str]:
    """The source tables the lake holds (``schema.table`` of every history table), without a JVM."""
    return sorted(t.qualified for t in history_source_tables(settings))


def latest_summary(table: Any, key: str) -> str | None:
    """Newest value of a snapshot-summary key along the current snapshot's ancestry."""
    meta = table.metadata
    snap = table.current_snapshot()
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    while snap is not None:
        summary = snap.summary.additional_properties if snap.summary else {}
        if key in summary:
            return str(summary[key])
        snap = by_id.get(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return None


def watermark(table: Any, key: str) -> str | None:
    """The newer of the property ``key`` and its snapshot-summary value (see loader.lake.iceberg)."""
    return newest_position(table.properties.get(key), latest_summary(table, key))


def load_or_none(catalog: Any, ident: tuple[str, str]) -> Any | None:
    """The table (pyiceberg's, its newest metadata), or None when it does not exist."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        return None


def snapshot_id(table: Any) -> int | None:
    snap = table.current_snapshot()
    return int(snap.snapshot_id) if snap is not None else None


def set_properties(table: Any, update: dict[str, str], remove: list[str] | None = None) -> None:
    """One commit setting ``update`` and removing ``remove`` (the Java API's ``updateProperties``):
    property updates carry no requirement on the table's snapshot, so a commit that lost a race
    is retried on the newer metadata (loader.lake.commits: the same catalog, the same rules)."""
    if not update and not remove:
        return
    with table.transaction() as tx:
        if update:
            tx.set_properties(update)
        if remove:
            tx.remove_properties(*remove)


def scan_batches(scan: Any) -> Any:
    """The rows of a pyiceberg ``scan`` as a RecordBatchReader holding one batch at a time.

    pyiceberg's ``to_arrow_batch_reader`` reads each data file whole into a list of batches, every
    file at once in its thread pool (a 10M-row table took verify to 1.5 GB, a bulk build to 1.8 GB);
    its per-file generator, given the delete files read first, yields the same batches one at a
    time (with the same projection, filter, schema evolution and deletes). Where that generator is
    missing (another pyiceberg), the batch reader is used."""
    import pyarrow as pa
    from pyiceberg.io import pyarrow as iceberg_arrow

    arrow_scan = iceberg_arrow.ArrowScan(
        scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive, scan.limit
    )
    stream = getattr(arrow_scan, "_record_batches_from_scan_tasks_and_deletes", None)
    read_deletes = getattr(iceberg_arrow, "_read_all_delete_files", None)
    if stream is None or read_deletes is None:
        return scan.to_arrow_batch_reader()
    tasks = list(scan.plan_files())
    target = iceberg_arrow.schema_to_pyarrow(scan.projection())
    return pa.RecordBatchReader.from_batches(target, stream(tasks, read_deletes(scan.io, tasks))).cast(target)


#: Position delete files read by :func:`live_rows` at most (bytes on storage); above, the count is
#: the summary's estimate. ``loader maintain`` applies and removes them.
MAX_DELETE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RowCount:
    rows: int
    exact: bool  # False: the snapshot summary's estimate (see live_rows)


def live_rows(table: Any, max_delete_bytes: int = MAX_DELETE_BYTES) -> RowCount:
    """The rows a scan of the current snapshot returns, without reading any data file.

    Without delete files, the summary's ``total-records``. With position deletes, the summary's
    ``total-position-deletes`` also counts deletes left behind whose data file was rewritten since
    (an erasure's rewrite keeps them; a merge-on-read table gathers them), so the position delete
    files that still apply (pyiceberg's scan planning) are read and only their distinct positions
    in live data files are subtracted. Equality deletes, or more than ``max_delete_bytes`` of
    position delete files: the summary's records minus deletes, marked as an estimate.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFileContent, FileFormat

    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return RowCount(0, True)
    p = snap.summary.additional_properties
    records = int(p.get("total-records", 0))
    position, equality = int(p.get("total-position-deletes", 0)), int(p.get("total-equality-deletes", 0))
    if not position and not equality:
        return RowCount(records, True)
    estimate = RowCount(max(0, records - position - equality), False)
    if equality:
        return estimate
    tasks = list(table.scan().plan_files())
    deletes = {d.file_path: d for t in tasks for d in t.delete_files}
    if any(
        d.content != DataFileContent.POSITION_DELETES or d.file_format != FileFormat.PARQUET for d in deletes.values()
    ):
        return estimate
    if sum(d.file_size_in_bytes for d in deletes.values()) > max_delete_bytes:
        return estimate
    rows = sum(t.file.record_count for t in tasks)
    live = pa.array(sorted({t.file.file_path for t in tasks}))
    parts = []
    for path in deletes:
        with table.io.new_input(path).open() as f:
            part = pq.read_table(f, columns=["file_path", "pos"])
        paths = part["file_path"].cast(pa.string())
        parts.append(pa.table({"file_path": paths, "pos": part["pos"]}).filter(pc.is_in(paths, value_set=live)))
    if parts:
        hits = pa.concat_tables(parts).group_by(["file_path", "pos"]).aggregate([])
        rows -= hits.num_rows
    return RowCount(max(0, rows), True)


def row_count(table: Any) -> int:
    """Live rows from the current snapshot's summary: no scan, also for merge-on-read tables.

    Position deletes remove one row each; Spark writes no equality deletes, but they are
    subtracted the same way if another writer made some.
    """
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    p = snap.summary.additional_properties
    deletes = int(p.get("total-position-deletes", 0)) + int(p.get("total-equality-deletes", 0))
    return max(0, int(p.get("total-records", 0)) - deletes)
