"""Spark-side access to Iceberg tables shared by the load and the merge (a thin I/O layer).

Table existence and properties go through Iceberg's Java API on the driver (a catalog lookup and
a metadata read, no Spark job); property updates are Iceberg commits of their own, so they need
no SQL quoting of names or values.

Watermarks (how far a table is loaded or merged) are written twice: into the snapshot summary of
the very commit they describe (atomic with the data, attached with Iceberg's
``CommitMetadata``), and into a table property right after it (the driver load's pyiceberg
commits, loader.lake.commits, write both in the one commit). Snapshot expiry and compaction by
anyone can remove the summaries, never the properties; a crash between the two leaves the property
behind, and the summary (while it lives) ahead. :func:`watermark` reads the newer of the two, so
a watermark never moves back, and losing both only makes a re-run replay an idempotent increment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from loader.lake.tables import SourceTable, TableNames, newest_position
from loader.lake.types import quote_ident
from loader.spark import java_map, jvm_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def iceberg_table(spark: SparkSession, ident: str) -> Any:
    """The JVM Iceberg Table behind a Spark identifier (``catalog.namespace.table``), refreshed."""
    # The JVM resolves the catalog with the calling thread's active session conf (SQLConf.get): a
    # thread of the per-table pool has none, and a catalog the session has not loaded yet (the
    # driver load creates tables with pyiceberg) would read as a namespace of spark_catalog.
    jvm_class(spark, "org.apache.spark.sql.SparkSession").setActiveSession(spark._jsparkSession)
    spark3util = jvm_class(spark, "org.apache.iceberg.spark.Spark3Util")
    table = spark3util.loadIcebergTable(spark._jsparkSession, ident)
    table.refresh()
    return table


def table_exists(spark: SparkSession, ident: str) -> bool:
    # A catalog lookup, not a query: DESCRIBE ... collect() runs a Spark job (seconds on a busy host).
    try:
        return bool(spark.catalog.tableExists(ident))
    except Exception as exc:  # AnalysisException: namespace not found
        if "TABLE_OR_VIEW_NOT_FOUND" in str(exc) or "not found" in str(exc).lower():
            return False
        raise


def table_properties(spark: SparkSession, ident: str) -> dict[str, str]:
    return java_map(spark, iceberg_table(spark, ident).properties())


def update_properties(
    spark: SparkSession, ident: str, set_: dict[str, str] | None = None, remove: list[str] | None = None
) -> None:
    """One Iceberg commit setting and removing table properties."""
    if not set_ and not remove:
        return
    update = iceberg_table(spark, ident).updateProperties()
    for k, v in (set_ or {}).items():
        update = update.set(k, v)
    for k in remove or []:
        update = update.remove(k)
    update.commit()


def delete_orphan_files(spark: SparkSession, ident: str, older_than: datetime) -> int:
    """Delete files under the table's location that no snapshot references and that are older than
    ``older_than``; the number deleted.

    Iceberg's action API, because its procedure refuses intervals under 24 hours: callers that hold
    every writer's lock (an erasure) may go down to "now".
    """
    table = iceberg_table(spark, ident)
    actions = jvm_class(spark, "org.apache.iceberg.spark.actions.SparkActions")
    action = actions.get(spark._jsparkSession).deleteOrphanFiles(table)
    result = action.olderThan(int(older_than.timestamp() * 1000)).execute()
    return sum(1 for _ in result.orphanFileLocations())


def watermark(spark: SparkSession, ident: str, key: str) -> str | None:
    """The newest of the property ``key`` and its value in the snapshot summaries (see module doc)."""
    table = iceberg_table(spark, ident)
    return newest_position(table.properties().get(key), _summary_walk(table, key))


def latest_summary_value(spark: SparkSession, ident: str, key: str) -> str | None:
    """The newest snapshot summary value of ``key`` along the current snapshot's ancestry."""
    return _summary_walk(iceberg_table(spark, ident), key)


def _summary_walk(table: Any, key: str) -> str | None:
    snap = table.currentSnapshot()
    while snap is not None:
        value = snap.summary().get(key)
        if value is not None:
            return str(value)
        parent = snap.parentId()
        snap = table.snapshot(parent) if parent is not None else None
    return None


def current_snapshot_id(spark: SparkSession, ident: str) -> int | None:
    snap = iceberg_table(spark, ident).currentSnapshot()
    return int(snap.snapshotId()) if snap is not None else None


# --- data and watermark in one commit ---------------------------------------------------------


class _JavaCallable:
    """A Python callable the JVM can call (py4j callback), keeping its exception for Python."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.error: BaseException | None = None

    def call(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # surfaced in Python after the JVM call returns
            self.error = exc
            raise
        return None

    class Java:
        implements: ClassVar[list[str]] = ["java.util.concurrent.Callable"]


def with_commit_properties(spark: SparkSession, properties: dict[str, str], fn: Callable[[], Any]) -> None:
    """Run ``fn`` (a Spark SQL statement that commits) with ``properties`` in its snapshot summary.

    Iceberg's ``CommitMetadata.withCommitProperties`` sets them in a JVM thread-local for the
    duration of a callable. PySpark's pinned-thread py4j gateway runs our Python callback on the
    same JVM thread, so the MERGE issued inside it commits with the watermark in its summary.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gw = spark.sparkContext._gateway
    assert gw is not None
    ensure_callback_server_started(gw)
    props = jvm_class(spark, "java.util.HashMap")()
    for k, v in properties.items():
        props.put(k, v)
    callable_ = _JavaCallable(fn)
    exc_class = jvm_class(spark, "java.lang.Class").forName("java.lang.RuntimeException")
    try:
        jvm_class(spark, "org.apache.iceberg.spark.CommitMetadata").withCommitProperties(props, callable_, exc_class)
    except Exception:
        if callable_.error is not None:
            raise callable_.error from None
        raise
    if callable_.error is not None:
        raise callable_.error


def create_source_table(
    spark: SparkSession,
    ident: str,
    pg_types: dict[str, str],
    metadata: Sequence[tuple[str, str]],
    properties: dict[str, str],
    partition: str,
    order: str,
) -> None:
    """Create a history or current table of one source table: its columns (lake names, lossless
    types), the loader's metadata columns, its properties (source name, key, PostgreSQL types),
    partitioning and write order."""
    import json

    from loader.lake.tables import PROP_PG_TYPES, source_columns
    from loader.lake.types import quote_ident, sql_string

    columns = [f"{quote_ident(n)} {t}" for n, t in source_columns(pg_types, metadata)]
    props = {**properties, PROP_PG_TYPES: json.dumps(pg_types)}
    prop_sql = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in props.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {ident} ({', '.join(columns)}) USING iceberg "
        f"PARTITIONED BY ({partition}) TBLPROPERTIES ({prop_sql})"
    )
    spark.sql(f"ALTER TABLE {ident} WRITE LOCALLY ORDERED BY {order}")


def history_tables(spark: SparkSession, names: TableNames) -> list[SourceTable]:
    rows = spark.sql(f"SHOW TABLES IN {quote_ident(names.catalog)}.{quote_ident(names.history_ns)}").collect()
    return sorted(SourceTable.from_iceberg_name(r.tableName) for r in rows)
