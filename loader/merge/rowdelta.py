"""One RowDelta commit of a merge computed outside Spark: position deletes plus new rows.

What a merge-on-read MERGE commits is exactly that: a position delete for every current row an
event replaces or ends, and a data file of the rows it writes. :mod:`loader.merge.driver` computes
them with Arrow; this module writes them per key bucket (zstd Parquet with Iceberg field ids,
through the table's own FileIO; metrics read back from the footers by Iceberg) and commits them
with the watermark in the summary, in one ``RowDelta`` validated against every commit since the
snapshot the merge read its watermark from (data, deletes, removed files). A concurrent writer
fails it (:class:`MergeConflictError`, nothing committed, the merge recomputes) instead of being
overwritten. Readers see ordinary v2 position deletes, which every engine reads and compaction
removes alike.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.errors import MergeConflictError
from loader.faults import checkpoint
from loader.lake.files import iceberg_arrow_schema, parquet_bytes, parquet_data_file, table_encodings
from loader.names import internal
from loader.spark import jvm_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.merge")

# Columns of the rows handed to commit_rows: the data file and row position a delete ends, the
# key bucket (partition) of every row.
FILE, POS, BUCKET = internal("file"), internal("pos"), internal("bucket")
# Iceberg's reserved field ids of a position delete file's columns (table spec, "Position Delete Files").
_FILE_PATH_ID, _POS_ID = 2147483546, 2147483545


@dataclass
class DirectOutcome:
    deleted: int = 0  # current rows replaced or deleted
    written: int = 0  # rows written
    files: int = 0  # files added (data and delete)


def _position_delete_schema() -> Any:
    import pyarrow as pa

    def fid(n: int) -> dict[bytes, bytes]:
        return {b"PARQUET:field_id": str(n).encode()}

    return pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata=fid(_FILE_PATH_ID)),
            pa.field("pos", pa.int64(), nullable=False, metadata=fid(_POS_ID)),
        ]
    )


def _rows_for_schema(rows: Any, schema: Any) -> Any:
    """``rows`` in the table's column order and types; columns the increment does not carry
    (none today: history and current share their columns) are NULL."""
    import pyarrow as pa

    arrays = []
    for f in schema:
        if f.name in rows.column_names:
            arrays.append(rows.column(f.name).cast(f.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def commit_rows(
    spark: SparkSession,
    current_ident: str,
    ends: Any,
    writes: Any,
    pk: list[str],
    commit_props: dict[str, str],
    start_snapshot: int | None,
) -> DirectOutcome:
    """Write ``ends`` (position deletes: ``pg__file``, ``pg__pos``, ``pg__bucket``) and ``writes``
    (rows with ``pg__bucket``) as one file of each per bucket, and commit them and the watermark
    in one RowDelta validated against every commit after ``start_snapshot``. With nothing to
    write, the RowDelta carries only the watermark."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from loader.lake.iceberg import iceberg_table

    outcome = DirectOutcome(
        deleted=ends.num_rows if ends is not None else 0, written=writes.num_rows if writes is not None else 0
    )
    table = iceberg_table(spark, current_ident)
    spec, properties = table.spec(), table.properties()
    if table.specs().size() != 1 or spec.fields().size() != 1:
        raise AssertionError(f"{current_ident}: a direct merge needs one bucket partition spec")
    part_name = str(spec.fields().get(0).name())
    data_files = jvm_class(spark, "org.apache.iceberg.DataFiles")
    file_metadata = jvm_class(spark, "org.apache.iceberg.FileMetadata")
    parquet_util = jvm_class(spark, "org.apache.iceberg.parquet.ParquetUtil")
    metrics_config = jvm_class(spark, "org.apache.iceberg.MetricsConfig")
    fio, locations = table.io(), table.locationProvider()
    written: list[str] = []
    referenced = jvm_class(spark, "java.util.ArrayList")()
    delta = table.newRowDelta()
    stem = uuid.uuid4().hex
    lock = threading.Lock()

    def put(bucket: int, kind: str, content: Any) -> tuple[Any, str, int, Any]:
        partition = data_files.data(spec, f"{part_name}={bucket}")
        path = str(locations.newDataLocation(spec, partition, f"{stem}-{kind}-{bucket}.parquet"))
        data = parquet_bytes(content, table_encodings(properties, content.schema))
        out = fio.newOutputFile(path)
        stream = out.createOrOverwrite()
        with lock:
            written.append(path)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        return partition, path, len(data), out.toInputFile()

    buckets: set[int] = set()
    for part in (ends, writes):
        if part is not None and part.num_rows:
            buckets.update(int(x) for x in pc.unique(part.column(BUCKET)).to_pylist())
    try:
        schema = iceberg_arrow_schema(spark, table) if writes is not None and writes.num_rows else None
        pos_metrics = metrics_config.forPositionDelete(table)

        def delete_file(b: int) -> tuple[str, Any, list[str]] | None:
            bucket_ends = ends.filter(pc.equal(ends.column(BUCKET), b)) if ends is not None else None
            if bucket_ends is None or not bucket_ends.num_rows:
                return None
            pos = pa.Table.from_arrays(
                [bucket_ends.column(FILE).cast(pa.string()), bucket_ends.column(POS).cast(pa.int64())],
                schema=_position_delete_schema(),
            ).sort_by([("file_path", "ascending"), ("pos", "ascending")])
            files = pc.unique(pos.column("file_path")).to_pylist()
            partition, path, size, inp = put(b, "deletes", pos)
            builder = (
                file_metadata.deleteFileBuilder(spec)
                .ofPositionDeletes()
                .withPath(path)
                .withFormat("parquet")
                .withFileSizeInBytes(size)
                .withPartition(partition)
                .withMetrics(parquet_util.fileMetrics(inp, pos_metrics))
            )
            if len(files) == 1:
                builder = builder.withReferencedDataFile(files[0])
            return "deletes", builder.build(), files

        def data_file(b: int) -> tuple[str, Any, list[str]] | None:
            bucket_writes = writes.filter(pc.equal(writes.column(BUCKET), b)) if writes is not None else None
            if bucket_writes is None or not bucket_writes.num_rows:
                return None
            data = _rows_for_schema(bucket_writes, schema).sort_by([(k, "ascending") for k in pk])
            partition, path, size, inp = put(b, "data", data)
            return "data", parquet_data_file(spark, table, partition, path, size, inp), []

        # The files are independent: written on threads (each its own py4j connection), so their
        # uploads and footer reads overlap.
        jobs = [(fn, b) for b in sorted(buckets) for fn in (delete_file, data_file)]
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(jobs)))) as pool:
            made = list(pool.map(lambda job: job[0](job[1]), jobs))
        for item in made:
            if item is None:
                continue
            kind, built, files = item
            if kind == "deletes":
                delta = delta.addDeletes(built)
                for f in files:
                    referenced.add(f)
            else:
                delta = delta.addRows(built)
        outcome.files = len(written)
        expressions = jvm_class(spark, "org.apache.iceberg.expressions.Expressions")
        delta = delta.conflictDetectionFilter(expressions.alwaysTrue())
        delta = delta.validateNoConflictingDataFiles().validateNoConflictingDeleteFiles().validateDeletedFiles()
        delta = delta.validateDataFilesExist(referenced)
        if start_snapshot is not None:
            delta = delta.validateFromSnapshot(start_snapshot)
        for k, v in commit_props.items():
            delta = delta.set(k, v)
        checkpoint("merge-before-commit")
        commit_guarded(table, delta, current_ident, start_snapshot, written, "merge")
        return outcome
    finally:
        remove_uncommitted(fio, written)


def commit_guarded(
    table: Any, update: Any, current_ident: str, start_snapshot: int | None, written: list[str], what: str
) -> None:
    """Commit ``update`` (a JVM RowDelta or OverwriteFiles of ``table``) unless anyone committed to
    the table since ``start_snapshot`` (even a commit Iceberg's validations let through, a watermark
    alone): MergeConflictError then, and on a validation failure. ``written`` (the files of the
    update) is cleared once they belong to the table, or may (an unknown commit outcome: the files
    must stay; if it did not land, orphan cleanup removes them)."""
    table.refresh()
    now = table.currentSnapshot()
    # (A table that had no snapshot when the work began must have none now either.)
    if (None if now is None else int(now.snapshotId())) != start_snapshot:
        raise MergeConflictError(
            f"another writer committed to {current_ident} while its {what} ran",
            hint="nothing was committed; re-run 'loader merge'",
        )
    try:
        update.commit()
    except Exception as exc:
        if "ValidationException" in str(exc) or "CommitFailedException" in str(exc):
            raise MergeConflictError(
                f"another writer committed to {current_ident} while its {what} ran: {_first_line(exc)}",
                hint="nothing was committed; re-run 'loader merge'",
            ) from exc
        written.clear()
        raise
    written.clear()  # committed: the table owns them now


def remove_uncommitted(fio: Any, written: list[str]) -> None:
    """Remove files written for a commit that did not happen (orphan cleanup catches a crash)."""
    for path in written:
        try:
            fio.deleteFile(path)
        except Exception:  # pragma: no cover - best effort
            log.warning("could not remove uncommitted file %s", path)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "Exception" in line:
            return line.strip()[:300]
    return text.splitlines()[0][:300] if text else type(exc).__name__
