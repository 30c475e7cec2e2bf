"""Data files written by the loader itself (the driver load, the driver merge): Parquet bytes and
the Arrow schema carrying a table's Iceberg field ids."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loader.spark import jvm_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


# pyiceberg reads a data file's column bounds back through Python's date and datetime, which end at
# years 1 and 9999. The lake keeps dates and timestamps beyond them (+/-infinity, BC, years past
# 9999: lake.types), so a column holding one is written with counts only: Iceberg then reads its
# bounds in that file as unknown (no pruning on it; nothing is wrong). Spark's writer, in Java,
# writes such bounds; the data is the same either way.
_PYTHON_DAYS = (-719162, 2932896)  # 0001-01-01 and 9999-12-31
_PYTHON_MICROS = (-62135596800000000, 253402300799999999)
_METRICS_COLUMN = "write.metadata.metrics.column."


def beyond_python(rows: Any) -> list[str]:
    """The top-level date and timestamp columns of Arrow table ``rows`` holding a value beyond
    Python's date and datetime (nested columns get counts only from pyiceberg anyway)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    for field in rows.schema:
        if pa.types.is_date32(field.type):
            (lo, hi), storage = _PYTHON_DAYS, pa.int32()
        elif pa.types.is_timestamp(field.type):
            (lo, hi), storage = _PYTHON_MICROS, pa.int64()
        else:
            continue
        bounds = pc.min_max(rows.column(field.name).cast(storage))
        if bounds["min"].is_valid and (bounds["min"].as_py() < lo or bounds["max"].as_py() > hi):
            out.append(field.name)
    return out


def counts_only(properties: dict[str, str], columns: list[str]) -> dict[str, str]:
    """A table's ``properties`` with ``columns`` written with value and null counts only."""
    return {**properties, **{_METRICS_COLUMN + c: "counts" for c in columns}}


def iceberg_arrow_schema(spark: SparkSession, table: Any) -> Any:
    """The table's schema as Arrow, with Iceberg field ids (pyiceberg does the mapping)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema

    text = jvm_class(spark, "org.apache.iceberg.SchemaParser").toJson(table.schema())
    return schema_to_pyarrow(Schema.model_validate_json(text), include_field_ids=True)


def parquet_data_file(
    spark: SparkSession, table: Any, partition: Any, path: str, size: int, input_file: Any, sorted_: bool = False
) -> Any:
    """The Iceberg DataFile (JVM) of a Parquet file written at ``path`` in ``partition`` of ``table``'s
    spec, its column metrics read back from the file's footer; ``sorted_``: in the table's sort order."""
    spec = table.spec()
    builder = (
        jvm_class(spark, "org.apache.iceberg.DataFiles")
        .builder(spec)
        .withPath(path)
        .withFormat("parquet")
        .withFileSizeInBytes(size)
        .withPartition(partition)
    )
    if sorted_:
        builder = builder.withSortOrder(table.sortOrder())
    metrics = jvm_class(spark, "org.apache.iceberg.MetricsConfig").forTable(table)
    parquet_util = jvm_class(spark, "org.apache.iceberg.parquet.ParquetUtil")
    return builder.withMetrics(parquet_util.fileMetrics(input_file, metrics)).build()


class RollingParquet:
    """Parquet files written from Arrow parts in bounded memory, one open file per partition key.

    Parts of a key go into that key's open file (its bytes in memory); a row group is written
    once ``group_bytes`` of Arrow rows are buffered, and the file is finished (``finish(key,
    data)``, which uploads and registers it) once ``file_bytes`` of Arrow rows went in. Memory:
    one file's Parquet bytes and one row group's rows per open key."""

    def __init__(self, schema: Any, finish: Any, file_bytes: int, group_bytes: int) -> None:
        self.schema = schema
        self.finish = finish
        self.file_bytes = file_bytes
        self.group_bytes = group_bytes
        self.files = 0
        self._open: dict[Any, _OpenFile] = {}

    def add(self, key: Any, rows: Any) -> None:
        f = self._open.get(key)
        if f is None:
            f = self._open[key] = _OpenFile(self.schema)
        f.add(rows, self.group_bytes)
        if f.arrow_bytes >= self.file_bytes:
            self._finish(key)

    def close(self) -> None:
        """Finish every open file, in key order."""
        for key in sorted(self._open):
            self._finish(key)

    def _finish(self, key: Any) -> None:
        data = self._open.pop(key).close()
        self.files += 1
        self.finish(key, data)


class _OpenFile:
    def __init__(self, schema: Any) -> None:
        import pyarrow.parquet as pq

        self.sink = io.BytesIO()
        self.writer = pq.ParquetWriter(self.sink, schema, compression="zstd", write_statistics=True)
        self.buffered: list[Any] = []
        self.buffered_bytes = 0
        self.arrow_bytes = 0

    def add(self, rows: Any, group_bytes: int) -> None:
        self.buffered.append(rows)
        self.buffered_bytes += rows.nbytes
        self.arrow_bytes += rows.nbytes
        if self.buffered_bytes >= group_bytes:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if self.buffered:
            self.writer.write_table(pa.concat_tables(self.buffered), row_group_size=1 << 30)
            self.buffered, self.buffered_bytes = [], 0

    def close(self) -> bytes:
        self.flush()
        self.writer.close()
        return self.sink.getvalue()


def prefetched(parts: Iterator[Any], depth: int) -> Iterator[Any]:
    """``parts`` produced on a thread of its own, at most ``depth`` ahead of the consumer (Arrow
    releases the GIL, so producing and consuming overlap on two cores); its exception is raised
    here, and a consumer that stops early stops the producer at its next part."""
    import queue
    import threading

    done = object()
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for part in parts:
                while not stop.is_set():
                    try:
                        q.put((None, part), timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((None, done))
        except BaseException as exc:  # handed to the consumer
            q.put((exc, None))

    worker = threading.Thread(target=produce, name="prefetch", daemon=True)
    worker.start()
    try:
        while True:
            exc, part = q.get()
            if exc is not None:
                raise exc
            if part is done:
                return
            yield part
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                worker.join(0.1)
