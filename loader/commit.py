"""Attach properties to the Iceberg snapshot a Spark SQL statement commits.

Iceberg's ``CommitMetadata.withCommitProperties`` sets them in a JVM thread-local for the
duration of a callable. PySpark's pinned-thread py4j gateway runs our Python callback on the
same JVM thread, so the MERGE issued inside it commits with the watermark in its snapshot
summary: data and watermark land in one atomic commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class _JavaCallable:
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
        implements = ["java.util.concurrent.Callable"]


def with_commit_properties(spark: "SparkSession", properties: dict[str, str], fn: Callable[[], Any]) -> None:
    from pyspark.java_gateway import ensure_callback_server_started

    gw = spark.sparkContext._gateway
    assert gw is not None
    ensure_callback_server_started(gw)
    props = gw.jvm.java.util.HashMap()
    for k, v in properties.items():
        props.put(k, v)
    callable_ = _JavaCallable(fn)
    exc_class = gw.jvm.java.lang.Class.forName("java.lang.RuntimeException")
    try:
        gw.jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(props, callable_, exc_class)
    except Exception:
        if callable_.error is not None:
            raise callable_.error from None
        raise
    if callable_.error is not None:
        raise callable_.error


def latest_summary_value(spark: "SparkSession", ident: str, key: str) -> str | None:
    """The newest snapshot summary value of ``key`` among the table's current lineage."""
    from loader.load.typemap import sql_string

    rows = spark.sql(
        f"SELECT s.summary[{sql_string(key)}] AS v FROM {ident}.snapshots s "
        f"JOIN {ident}.history h ON s.snapshot_id = h.snapshot_id "
        f"WHERE h.is_current_ancestor AND s.summary[{sql_string(key)}] IS NOT NULL "
        f"ORDER BY s.committed_at DESC LIMIT 1"
    ).collect()
    return rows[0][0] if rows else None
