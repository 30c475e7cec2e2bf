"""Attach properties to the Iceberg snapshot a Spark SQL statement commits.

Iceberg's ``CommitMetadata.withCommitProperties`` sets them in a JVM thread-local for the
duration of a callable. PySpark's pinned-thread py4j gateway runs our Python callback on the
same JVM thread, so the MERGE issued inside it commits with the watermark in its snapshot
summary: data and watermark land in one atomic commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

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
        implements: ClassVar[list[str]] = ["java.util.concurrent.Callable"]


def with_commit_properties(spark: SparkSession, properties: dict[str, str], fn: Callable[[], Any]) -> None:
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


def iceberg_table(spark: SparkSession, ident: str) -> Any:
    """The JVM Iceberg Table behind a Spark identifier, refreshed (metadata reads without a Spark job)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, ident)
    table.refresh()
    return table


def latest_summary_value(spark: SparkSession, ident: str, key: str) -> str | None:
    """The newest snapshot summary value of ``key`` along the current snapshot's ancestry."""
    table = iceberg_table(spark, ident)
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


def snapshots_since(spark: SparkSession, ident: str, snapshot_id: int) -> list[dict[str, str]] | None:
    """Summaries of the current lineage's snapshots committed after ``snapshot_id`` (oldest last);
    None when ``snapshot_id`` is not in the lineage (expired, or another branch)."""
    table = iceberg_table(spark, ident)
    out: list[dict[str, str]] = []
    snap = table.currentSnapshot()
    while snap is not None:
        if int(snap.snapshotId()) == snapshot_id:
            return out
        out.append({str(k): str(v) for k, v in snap.summary().items()})
        parent = snap.parentId()
        snap = table.snapshot(parent) if parent is not None else None
    return None
