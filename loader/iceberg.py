"""Spark-side access to Iceberg tables shared by the load and the merge (a thin I/O layer).

Table existence and properties go through Iceberg's Java API on the driver (a catalog lookup and
a metadata read, no Spark job); property updates are Iceberg commits of their own, so they need
no SQL quoting of names or values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loader.tables import TableNames

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REJECTS_DDL = (
    "landing_file STRING, line INT, source_table STRING, pg_lsn BIGINT, pg_seq BIGINT,"
    " reason STRING, raw STRING, rejected_at TIMESTAMP"
)
LEDGER_DDL = (
    "file STRING, first_position STRING, last_position STRING, changes BIGINT, rejects BIGINT, loaded_at TIMESTAMP"
)


def ensure_loader_tables(spark: SparkSession, names: TableNames) -> None:
    """The namespaces and the loader's own tables (ledger, rejects)."""
    for ns in names.namespaces():
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {names.ledger} ({LEDGER_DDL}) USING iceberg")
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {names.rejects} ({REJECTS_DDL}) USING iceberg PARTITIONED BY (days(rejected_at))"
    )


def iceberg_table(spark: SparkSession, ident: str) -> Any:
    """The JVM Iceberg Table behind a Spark identifier, refreshed."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, ident)
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
    props = iceberg_table(spark, ident).properties()
    return {str(k): str(v) for k, v in props.items()}


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
