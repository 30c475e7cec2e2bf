"""Data files written by the loader itself (the driver load, the driver merge): Parquet bytes and
the Arrow schema carrying a table's Iceberg field ids."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loader.spark import jvm_class
from loader.spills import private_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# Arrow's Parquet writer, unlike Java's parquet-mr, never tests whether a column's dictionary pays:
# it hashes every value until the dictionary page reaches its limit, then writes the rest plain. At
# Iceberg's default limit (write.parquet.dict-size-bytes, 2 MiB) a key column has 262k distinct
# int64 values hashed for nothing in each column chunk, and the file carries that dictionary page
# beside the plain pages. At 256 KiB a column of few distinct values (an operation, a status, a
# landing file's name) keeps its dictionary and a key column falls back after 32k values: 300k
# history rows of six columns 118 -> 77 ms and 3.84 -> 2.35 MB (docs/performance-log.md). The
# loader's own Parquet writers use it: pyiceberg's appends (``commits.data_files``) unless the table
# sets the property; the driver merge's and bulk builds' files always, as they always use zstd.
DICTIONARY_PAGE_BYTES = 256 << 10
DICTIONARY_PAGE_PROPERTY = "write.parquet.dict-size-bytes"


# Integer-like columns (integers, dates, times, timestamps, and decimals of up to 18 digits where
# the writer stores them as integers) are written DELTA_BINARY_PACKED, without a dictionary; the
# other columns keep the dictionary (and its fallback to plain). Arrow's dictionary hashes a key
# column's distinct values for nothing (above); delta encoding costs less than plain and packs what
# history holds: positions and sequence numbers that rise, transaction ids in runs, keys and times
# that mostly rise. 1M history rows of P2's table: 225 -> 191 ms and 7.2 -> 3.4 MB
# (docs/performance-log.md). Spark's readers (parquet-mr, Iceberg's vectorized reader: checked on
# Iceberg 1.10.2), Trino and DuckDB read the encoding; a table read by an engine that does not sets
# this property to "false" and gets Arrow's defaults again.
DELTA_INTEGERS_PROPERTY = "loader.write.parquet.delta-integers"


def delta_integers(properties: Any) -> bool:
    """Whether a table with ``properties`` (a dict, or a JVM table's map) takes delta encoding."""
    value = properties.get(DELTA_INTEGERS_PROPERTY)
    return value is None or str(value).strip().lower() != "false"


def parquet_encodings(schema: Any, decimals_as_integers: bool) -> dict[str, Any]:
    """pyarrow ``ParquetWriter`` arguments for Arrow ``schema`` (the names as the file has them):
    DELTA_BINARY_PACKED for every integer-like leaf column, the dictionary for the others ({} when
    the schema has no integer-like column). ``decimals_as_integers``: the writer stores decimals of
    up to 18 digits as integers (``store_decimal_as_integer``, as pyiceberg's writer does)."""
    import pyarrow as pa

    dictionary: list[str] = []
    delta: list[str] = []

    def walk(path: str, type_: Any) -> None:
        if pa.types.is_struct(type_):
            for i in range(type_.num_fields):
                walk(f"{path}.{type_.field(i).name}", type_.field(i).type)
        elif pa.types.is_map(type_):
            walk(f"{path}.key_value.key", type_.key_type)
            walk(f"{path}.key_value.value", type_.item_type)
        elif pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
            walk(f"{path}.list.element", type_.value_type)
        elif (
            pa.types.is_integer(type_)
            or pa.types.is_date32(type_)
            or pa.types.is_time(type_)
            or pa.types.is_timestamp(type_)
            or (decimals_as_integers and pa.types.is_decimal128(type_) and type_.precision <= 18)
        ):
            delta.append(path)
        else:
            dictionary.append(path)

    for field in schema:
        walk(field.name, field.type)
    if not delta:
        return {}
    return {"use_dictionary": dictionary, "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED")}


def table_encodings(properties: Any, schema: Any, decimals_as_integers: bool = False) -> dict[str, Any]:
    """:func:`parquet_encodings` of ``schema`` for a table with ``properties``: {} (Arrow's
    defaults) when the table sets :data:`DELTA_INTEGERS_PROPERTY` to false."""
    return parquet_encodings(schema, decimals_as_integers) if delta_integers(properties) else {}


# The loader's own Parquet writers (parquet_bytes, RollingParquet's files), beside their encodings.
_WRITER_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "write_statistics": True,
    "dictionary_pagesize_limit": DICTIONARY_PAGE_BYTES,
}


def parquet_bytes(table: Any, encodings: dict[str, Any] | None = None) -> bytes:
    """Arrow ``table`` as the bytes of a zstd Parquet file (``encodings``: :func:`table_encodings`)."""
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, **_WRITER_OPTIONS, **(encodings or {}))
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


def write_properties(properties: dict[str, str], rows: Any, file_schema: Any = None) -> dict[str, str]:
    """The table ``properties`` the loader's pyiceberg writes of ``rows`` use: its dictionary page
    limit :data:`DICTIONARY_PAGE_BYTES` unless the table sets one, counts only for columns holding
    dates beyond Python's (:func:`beyond_python`), and, given the Arrow ``file_schema`` the files
    are written in, the encodings of :func:`parquet_encodings` unless the table opts out (handed to
    pyarrow's writer by :mod:`loader.lake.pyiceberg_fixes`; never committed)."""
    import json

    from loader.lake.pyiceberg_fixes import WRITER_OPTIONS_PROPERTY

    out = {DICTIONARY_PAGE_PROPERTY: str(DICTIONARY_PAGE_BYTES), **properties}
    if file_schema is not None and (options := table_encodings(properties, file_schema, decimals_as_integers=True)):
        out[WRITER_OPTIONS_PROPERTY] = json.dumps(options)
    beyond = beyond_python(rows)
    return counts_only(out, beyond) if beyond else out


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


# The merge's bulk-build spill directories (loader.spills): RollingParquet's, a first state's.
SPILL_PREFIX = "loader-spill-"


class RollingParquet:
    """Parquet files written from Arrow parts in bounded memory, one open file per partition key.

    Parts of a key go into that key's open file, which is written to local disk (``spill_dir``,
    else the system's temporary directory), never held in memory. A key's buffered rows become a
    row group once ``group_bytes`` of Arrow rows are buffered, or earlier when the rows buffered
    for all keys together pass ``buffer_bytes`` (the key holding most is written first; a slice of a
    larger table is buffered as a compact copy, so it does not hold the table); a file is
    finished once ``file_bytes`` of Arrow rows went in: ``finish(key, written)`` uploads and
    registers it (:class:`LocalParquet`: its path, size, footer, chunks) and the local copy is
    removed. Memory: ``buffer_bytes`` of rows and one writer's column buffers per open key, whatever
    the number of keys or rows (a bulk build of 10M rows over 16 buckets held a row group and a
    whole file's bytes per bucket: 1.3 GB). ``encodings``: :func:`table_encodings`."""

    def __init__(
        self,
        schema: Any,
        finish: Any,
        file_bytes: int,
        group_bytes: int,
        buffer_bytes: int = 64 << 20,
        spill_dir: str | None = None,
        encodings: dict[str, Any] | None = None,
    ) -> None:
        self.schema = schema
        self.encodings = encodings or {}
        self.finish = finish
        self.file_bytes = file_bytes
        self.group_bytes = group_bytes
        self.buffer_bytes = buffer_bytes
        self.files = 0
        self._open: dict[Any, _OpenFile] = {}
        self._dir = private_dir(SPILL_PREFIX, spill_dir)
        self._made = 0

    def add(self, key: Any, rows: Any) -> None:
        if rows.get_total_buffer_size() > 2 * rows.nbytes + (64 << 10):
            # A slice of a larger table (one bucket's rows of a batch) would keep the whole
            # table's buffers alive while it waits here: buffered as a compact copy.
            rows = _compact(rows)
        f = self._open.get(key)
        if f is None:
            self._made += 1
            f = self._open[key] = _OpenFile(self.schema, str(self._dir / f"{self._made:06d}.parquet"), self.encodings)
        f.add(rows, self.group_bytes)
        if f.arrow_bytes >= self.file_bytes:
            self._finish(key)
        buffered = sum(o.buffered_bytes for o in self._open.values())
        while buffered > self.buffer_bytes:
            fullest = max(self._open.values(), key=lambda o: o.buffered_bytes)
            buffered -= fullest.buffered_bytes
            fullest.flush()

    def close(self) -> None:
        """Finish every open file, in key order, and remove the local directory."""
        try:
            for key in sorted(self._open):
                self._finish(key)
        finally:
            self.discard()

    def discard(self) -> None:
        """Forget every open file and remove the local copies (after a failure)."""
        for f in self._open.values():
            f.abandon()
        self._open.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _finish(self, key: Any) -> None:
        written = self._open.pop(key).close()
        try:
            self.files += 1
            self.finish(key, written)
        finally:
            written.remove()


def _compact(rows: Any) -> Any:
    """``rows`` in buffers of their own (a slice's columns copied out of its table's)."""
    import pyarrow as pa

    return pa.Table.from_arrays([pa.concat_arrays(c.chunks) for c in rows.columns], schema=rows.schema)


class LocalParquet:
    """A finished Parquet file on local disk, before it is uploaded."""

    CHUNK = 8 << 20

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = os.path.getsize(path)

    def footer(self) -> Any:
        import pyarrow.parquet as pq

        return pq.read_metadata(self.path)

    def chunks(self) -> Iterator[bytes]:
        """Its bytes in pieces of at most ``CHUNK`` (an upload holds one at a time)."""
        with open(self.path, "rb") as src:
            while chunk := src.read(self.CHUNK):
                yield chunk

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _OpenFile:
    def __init__(self, schema: Any, path: str, encodings: dict[str, Any]) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self.writer = pq.ParquetWriter(path, schema, **_WRITER_OPTIONS, **encodings)
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

    def close(self) -> LocalParquet:
        self.flush()
        self.writer.close()
        return LocalParquet(self.path)

    def abandon(self) -> None:
        self.buffered = []
        with contextlib.suppress(Exception):
            self.writer.close()


def prefetched(parts: Iterator[Any], depth: int) -> Iterator[Any]:
    """``parts`` produced on a thread of its own, at most ``depth`` ahead of the consumer (the
    part being produced counted: the consumer's part and ``depth`` more are held at most). Arrow
    releases the GIL, so producing and consuming overlap on two cores; the producer's exception is
    raised here, and a consumer that stops early stops the producer at its next part."""
    import queue
    import threading

    done = object()
    q: queue.Queue[Any] = queue.Queue()
    room = threading.Semaphore(depth)  # taken before a part is produced, given back when it is consumed
    stop = threading.Event()

    def produce() -> None:
        try:
            it = iter(parts)
            while True:
                while not room.acquire(timeout=0.5):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                part = next(it, done)
                q.put((None, part))
                if part is done:
                    return
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
            room.release()
            yield part
    finally:
        stop.set()
        room.release()  # a producer waiting for room wakes and sees the stop
        worker.join()
