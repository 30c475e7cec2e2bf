"""Driver bulk build: a resync's rows written once as a table's whole current state, no Spark job.

A table's first current state, and the state after every resync, is the snapshot's rows: nothing
to join, only rows to file under their key's bucket. Spark's version of this
(:meth:`loader.merge.current.CurrentMerge._bulk_build`) reads the whole increment into its cache,
aggregates it twice and shuffles it into buckets: about a minute and 4 GB for 10M rows on two
cores. Here the rows stream from history's Parquet files (pyiceberg, the load's snapshot, deletes
applied) into one Parquet writer per bucket (bounded memory: :class:`loader.lake.files.RollingParquet`)
and are committed as one overwrite of the whole table (every data and delete file out, the new
files in), validated against every commit since the merge read its watermark.

The rules are the Spark bulk build's, read from the same increment:

- the increment's control rows decide (:func:`loader.merge.plan.plan_markers`): the newest
  boundary before the cut is a resync, and no park holds the table;
- the rows at the resync's commit position after its marker are the snapshot: every one must be
  a read with every value sent (else :class:`NotPlainBulk`, and the Spark path merges it);
- the watermark is the cut when nothing follows the snapshot, else the snapshot's last row (the
  changes after it are merged as any increment after that position).

Keys are integers or text (the bucket of an integer key is computed for a whole column at once,
:func:`bucket_ints`, and checked against Spark's ``bucket`` in the tests).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.lake.buckets import bucket_ints, key_hashes
from loader.lake.catalog import scan_batches
from loader.lake.files import (
    SPILL_PREFIX,
    LocalParquet,
    RollingParquet,
    counts_only,
    iceberg_arrow_schema,
    parquet_data_file,
    prefetched,
    table_encodings,
)
from loader.lake.types import spark_type
from loader.lsn import ChangePosition, arrow_positions_after, arrow_positions_at_or_before
from loader.merge.plan import Marker, MergePlan, plan_markers
from loader.spark import jvm_class
from loader.spills import private_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.merge")

# A current data file is cut once this many bytes of Arrow rows went into it, a row group at this.
BULK_FILE_ARROW_BYTES = 512 << 20
BULK_ROW_GROUP_BYTES = 64 << 20

_CONTROL_OPS = ["truncate", "resync", "park"]
_KEY_TYPES = {"SMALLINT", "INT", "BIGINT", "STRING"}

__all__ = [
    "BULK_FILE_ARROW_BYTES",
    "BulkPlan",
    "NotPlainBulk",
    "bucket_ints",
    "current_state_rows",
    "first_state_rows",
    "key_hashes",
    "plan_bulk",
    "write_bulk",
]


class NotPlainBulk(Exception):
    """The increment is not a plain snapshot the driver can write (the reason is the message)."""


@dataclass(frozen=True)
class BulkPlan:
    plan: MergePlan
    at: ChangePosition  # the resync marker's position
    increment_rows: int
    tail_rows: int  # history rows after the snapshot, up to the cut
    tail_toast: int  # upserts among them that may leave a value out


def _range_filter(since: ChangePosition | None, cut: ChangePosition) -> Any:
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual

    upper = LessThanOrEqual("pg_lsn", cut.commit_lsn)  # type: ignore[misc,call-arg,arg-type]
    if since is None:
        return upper
    return And(GreaterThanOrEqual("pg_lsn", since.commit_lsn), upper)  # type: ignore[misc,call-arg,arg-type]


def _in_range(batch: Any, since: ChangePosition | None, cut: ChangePosition) -> Any:
    """The rows of ``batch`` in (since, cut] by position."""
    import pyarrow.compute as pc

    lsn, seq = batch.column("pg_lsn"), batch.column("pg_seq")
    keep = arrow_positions_at_or_before(lsn, seq, cut)
    if since is not None:
        keep = pc.and_(keep, arrow_positions_after(lsn, seq, since))
    return batch.filter(keep)


def plan_bulk(
    hist: Any, hist_snapshot: int, since: ChangePosition | None, cut: ChangePosition, pk_types: list[str]
) -> BulkPlan:
    """Read the increment's control rows (one column of every file in range) and, when its newest
    boundary is a resync, count what follows the snapshot; NotPlainBulk otherwise."""
    import pyarrow.compute as pc
    from pyiceberg.expressions import GreaterThan

    if any(t not in _KEY_TYPES for t in pk_types):
        raise NotPlainBulk(f"key types {pk_types}")
    scan = hist.scan(
        row_filter=_range_filter(since, cut),
        selected_fields=("pg_lsn", "pg_seq", "pg_operation", "pg_note"),
        snapshot_id=hist_snapshot,
    )
    markers: list[Marker] = []
    rows = 0
    for batch in scan_batches(scan):
        batch = _in_range(batch, since, cut)
        rows += batch.num_rows
        control = batch.filter(pc.is_in(batch.column("pg_operation"), value_set=_pa_strings(_CONTROL_OPS)))
        for lsn, seq, op, note in zip(*(control.column(c).to_pylist() for c in control.schema.names)):
            markers.append(Marker(ChangePosition(lsn, seq), op, note or ""))
    plan = plan_markers(markers, cut)
    if plan.parked is not None or plan.boundary is None:
        raise NotPlainBulk("no resync to build from" if plan.boundary is None else "parked")
    at = plan.boundary
    if [m.op for m in sorted(markers) if m.position == at][-1:] != ["resync"]:
        raise NotPlainBulk("the newest boundary is a truncate")
    tail_rows = tail_toast = 0
    if plan.cut.commit_lsn > at.commit_lsn:
        tail = hist.scan(
            row_filter=GreaterThan("pg_lsn", at.commit_lsn),  # type: ignore[misc,call-arg,arg-type]
            selected_fields=("pg_lsn", "pg_seq", "pg_operation", "pg_absent_columns"),
            snapshot_id=hist_snapshot,
        )
        for batch in scan_batches(tail):
            batch = _in_range(batch, at, plan.cut)
            tail_rows += batch.num_rows
            upsert = pc.is_in(batch.column("pg_operation"), value_set=_pa_strings(["insert", "update", "read"]))
            sent = pc.fill_null(pc.equal(pc.list_value_length(batch.column("pg_absent_columns")), 0), False)
            tail_toast += int(pc.sum(pc.and_(upsert, pc.invert(sent))).as_py() or 0)
    return BulkPlan(plan, at, rows, tail_rows, tail_toast)


# A table's first state from changes is reduced in partitions of about this many history rows.
FIRST_STATE_PARTITION_ROWS = 1 << 18


def first_state_rows(
    hist: Any,
    hist_snapshot: int,
    cut: ChangePosition,
    pk: list[str],
    pk_pg_types: list[str],
    spill_dir: str | None = None,
) -> tuple[int, Callable[[Any, int], Iterator[tuple[Any, Any, int]]]]:
    """A table's first current state from the changes history holds up to ``cut`` (no snapshot in
    them): for every key its newest change, when that is an insert, update or read. Returns (the
    increment's rows, a ``rows_source`` for :func:`write_bulk`).

    Bounded memory whatever the backlog: the changes stream from history's files (one batch at a
    time) into spill files on local disk, partitioned by the key's bucket hash (so a key's changes
    all fall in one partition, and every partition in one bucket of the current table), and each
    partition is reduced alone. The rules are the driver merge's (:mod:`loader.merge.driver`): no
    control rows, no update leaving a value out, none changing the key (else NotPlainBulk, and
    Spark's MERGE builds it); a delete is keyed by its old key; of two events at one position the
    upsert wins over the delete. Keys are integers or text (``pk_pg_types``: their PostgreSQL types)."""
    import pyarrow.compute as pc

    key_pg_types = dict(zip(pk, pk_pg_types, strict=True))
    if any(spark_type(t).sql not in _KEY_TYPES for t in pk_pg_types):
        raise NotPlainBulk(f"key types {pk_pg_types}")
    scan = hist.scan(row_filter=_range_filter(None, cut), snapshot_id=hist_snapshot)
    tasks = list(scan.plan_files())
    total = sum(t.file.record_count for t in tasks)
    if not total:
        raise NotPlainBulk("no changes to build from")

    def source(target: Any, n_buckets: int) -> Iterator[tuple[Any, Any, int]]:
        import shutil

        import numpy as np
        import pyarrow as pa
        import pyarrow.ipc as ipc

        from loader.merge.driver import _newest_per_key

        parts = n_buckets * max(1, -(-total // (FIRST_STATE_PARTITION_ROWS * n_buckets)))
        spill_schema = pa.schema([*target, pa.field("sub", pa.int8())])
        data = [f.name for f in target]
        wanted = [*dict.fromkeys([*data, "pg_operation", "pg_absent_columns", "pg_old_key"])]
        tmp = private_dir(SPILL_PREFIX, spill_dir)
        try:
            writers: dict[int, Any] = {}
            try:
                for batch in scan_batches(
                    hist.scan(
                        row_filter=_range_filter(None, cut), selected_fields=tuple(wanted), snapshot_id=hist_snapshot
                    )
                ):
                    batch = _in_range(batch, None, cut)
                    if not batch.num_rows:
                        continue
                    events = _first_state_events(batch, pk, key_pg_types, spill_schema)
                    part_of = key_hashes(events.column(pk[0]).combine_chunks()) % np.uint32(parts)
                    order = np.argsort(part_of, kind="stable")
                    events, part_of = events.take(pa.array(order)), part_of[order]
                    bounds = [0, *(np.flatnonzero(np.diff(part_of)) + 1).tolist()]
                    for start, stop in zip(bounds, [*bounds[1:], len(part_of)], strict=True):
                        p = int(part_of[start])
                        if p not in writers:
                            writers[p] = ipc.new_stream(f"{tmp}/{p}.arrows", spill_schema)
                        writers[p].write_table(events.slice(start, stop - start))
            finally:
                for w in writers.values():
                    w.close()
            for p in sorted(writers):
                with ipc.open_stream(f"{tmp}/{p}.arrows") as reader:
                    events = reader.read_all()
                newest = _newest_per_key(events, pk)
                rows = newest.filter(pc.equal(newest.column("sub"), 1)).select(data)
                del events, newest
                if rows.num_rows:
                    # partition p of n_buckets * k: its keys' hashes are p modulo n_buckets * k,
                    # so their bucket (hash modulo n_buckets) is p modulo n_buckets.
                    yield rows, np.full(rows.num_rows, p % n_buckets, np.int32), cut.seq
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return total, source


def _first_state_events(batch: Any, pk: list[str], key_pg_types: dict[str, str], schema: Any) -> Any:
    """A batch of history rows as key events in ``schema`` (the current table's columns and
    ``sub``: 1 an upsert with its row, 0 a delete with its old key); NotPlainBulk for what only
    Spark's MERGE handles."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from loader.merge.driver import NotPlainIncrement, _old_keys, plain_upserts

    table = pa.Table.from_batches([batch])
    try:
        upsert = plain_upserts(table, pk, key_pg_types)
        dels = table.filter(pc.equal(table.column("pg_operation"), "delete"))
        like = {k: schema.field(k).type for k in pk}
        old = _old_keys(dels.column("pg_old_key").to_pylist(), pk, key_pg_types, like) if dels.num_rows else {}
    except NotPlainIncrement as exc:
        raise NotPlainBulk(str(exc)) from None
    ups = table.filter(upsert)
    parts = []
    if ups.num_rows:
        cols = [ups.column(f.name).cast(f.type) for f in schema if f.name != "sub"]
        parts.append(pa.Table.from_arrays([*cols, pa.array(np.ones(ups.num_rows, np.int8))], schema=schema))
    if dels.num_rows:
        cols = []
        for f in schema:
            if f.name in old:
                cols.append(old[f.name].cast(f.type))
            elif f.name in ("pg_lsn", "pg_seq"):
                cols.append(dels.column(f.name).cast(f.type))
            elif f.name == "sub":
                cols.append(pa.array(np.zeros(dels.num_rows, np.int8)))
            else:
                cols.append(pa.nulls(dels.num_rows, f.type))
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    events = pa.concat_tables(parts) if parts else schema.empty_table()
    if any(events.column(k).null_count for k in pk):
        raise NotPlainBulk("a key without a value")
    return events


def _pa_strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())


def _bucketing(target: Any, key: str, n: int) -> Callable[[Any], Any]:
    """The bucket of each key of an Arrow column (numpy int32) of the ``target`` schema's column
    ``key``, as Iceberg's bucket(``n``) transform: integers or text, else NotPlainBulk."""
    import numpy as np

    key_type = str(target.field(key).type)
    if key_type in ("int8", "int16", "int32", "int64"):
        return lambda keys: bucket_ints(keys.to_numpy(zero_copy_only=False), n)
    if key_type not in ("string", "large_string"):
        raise NotPlainBulk(f"key column {key} is {key_type}")
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import StringType

    one = BucketTransform(n).transform(StringType())
    return lambda keys: np.fromiter((one(v) for v in keys.to_pylist()), dtype=np.int32, count=len(keys))


def current_state_rows(
    current: Any, snapshot: int, pk: list[str]
) -> Callable[[Any, int], Iterator[tuple[Any, Any, int]]]:
    """A ``rows_source`` for :func:`write_bulk`: a current table's rows as of ``snapshot`` (pyiceberg's
    table; its position deletes applied), bucketed and in key order within each bucket: a
    compaction written once on the driver (a small table: the caller bounds its rows)."""

    def source(target: Any, n_buckets: int) -> Iterator[tuple[Any, Any, int]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            rows = current.scan(snapshot_id=snapshot).to_arrow()
            rows = pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in target], schema=target)
        except OSError:
            raise  # the warehouse did not answer: the caller's to report
        except Exception as exc:  # a type or file pyiceberg does not read as Spark does: Spark compacts
            raise NotPlainBulk(f"rows not read with pyiceberg ({type(exc).__name__}: {exc})") from None
        if not rows.num_rows:
            return
        buckets = _bucketing(target, pk[0], n_buckets)(rows.column(pk[0]))
        names = ["b", *(f"k{i}" for i in range(len(pk)))]
        keyed = pa.Table.from_arrays([pa.array(buckets), *(rows.column(k) for k in pk)], names=names)
        order = pc.sort_indices(keyed, sort_keys=[(c, "ascending") for c in names])
        yield rows.take(order), buckets[order.to_numpy()], 0

    return source


def _bulk_parts(
    hist: Any,
    hist_snapshot: int,
    bulk: BulkPlan,
    columns: list[str],
    target: Any,
    key: str,
    n: int,
) -> Iterator[tuple[Any, Any, int]]:
    """(rows in ``target``'s schema sorted by bucket, their buckets, the batch's last seq) of each
    batch of the resync's snapshot rows; NotPlainBulk when the snapshot holds anything but plain
    reads, or a key the driver cannot bucket."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, EqualTo, GreaterThan

    at, cut = bulk.at, bulk.plan.cut
    buckets_of = _bucketing(target, key, n)
    in_snapshot = And(EqualTo("pg_lsn", at.commit_lsn), GreaterThan("pg_seq", at.seq))  # type: ignore[misc,call-arg,arg-type]
    scan = hist.scan(
        row_filter=in_snapshot,
        selected_fields=(*columns, "pg_lsn", "pg_seq", "pg_txn_timestamp", "pg_operation", "pg_absent_columns"),
        snapshot_id=hist_snapshot,
    )
    for batch in scan_batches(scan):
        batch = _in_range(batch, at, cut)
        if not batch.num_rows:
            continue
        reads = pc.equal(batch.column("pg_operation"), "read")
        sent = pc.fill_null(pc.equal(pc.list_value_length(batch.column("pg_absent_columns")), 0), False)
        if not pc.all(pc.and_(reads, sent)).as_py():
            raise NotPlainBulk(f"the resync at {at} holds more than plain reads")
        keys = batch.column(key)
        if keys.null_count:
            raise NotPlainBulk("a key without a value")
        buckets = buckets_of(keys)
        out = pa.Table.from_batches([batch]).select([f.name for f in target])
        out = pa.Table.from_arrays([out.column(f.name).cast(f.type) for f in target], schema=target)
        # A stable sort by bucket keeps each bucket's rows in the snapshot's (key) order.
        order = pc.sort_indices(pa.array(buckets))
        yield out.take(order), buckets[order.to_numpy()], int(pc.max(batch.column("pg_seq")).as_py())


def _parts(
    hist: Any,
    hist_snapshot: int,
    bulk: BulkPlan,
    columns: list[str],
    target: Any,
    key: str,
    n: int,
    rows_source: Callable[[Any, int], Iterator[tuple[Any, Any, int]]] | None,
) -> Iterator[tuple[Any, Any, int]]:
    """The parts a bulk build writes: ``rows_source``'s when given, else the resync's snapshot rows."""
    if rows_source is not None:
        return rows_source(target, n)
    return _bulk_parts(hist, hist_snapshot, bulk, columns, target, key, n)


def _write_parts(
    parts: Iterator[tuple[Any, Any, int]], files: RollingParquet, at: ChangePosition
) -> tuple[int, ChangePosition]:
    """Every part filed under its buckets (each bucket's rows into its own files); (rows, the
    position of the last row written)."""
    import numpy as np

    rows = 0
    last_seq = at.seq
    try:
        # Read and bucketed on a thread of their own while the parts before them are encoded.
        for sorted_out, sorted_buckets, batch_last in prefetched(parts, depth=2):
            rows += sorted_out.num_rows
            last_seq = max(last_seq, batch_last)
            bounds = [0, *(np.flatnonzero(np.diff(sorted_buckets)) + 1).tolist()]
            for start, stop in zip(bounds, [*bounds[1:], len(sorted_buckets)]):
                files.add(int(sorted_buckets[start]), sorted_out.slice(start, stop - start))
    except BaseException:
        files.discard()
        raise
    files.close()
    return rows, ChangePosition(at.commit_lsn, last_seq)


def write_bulk(
    spark: SparkSession,
    hist: Any,
    hist_snapshot: int,
    current_ident: str,
    bulk: BulkPlan,
    columns: list[str],
    key: str,
    commit_props: dict[str, str],
    watermark_key: str,
    start_snapshot: int | None,
    before_commit: Any = None,
    rows_source: Callable[[Any, int], Iterator[tuple[Any, Any, int]]] | None = None,
) -> tuple[int, ChangePosition, ChangePosition]:
    """Write the snapshot's rows as the current table's only files, in one overwrite commit with
    ``commit_props`` and the watermark under ``watermark_key``: the cut when nothing follows the
    snapshot, else the snapshot's last row. Returns (rows written, that last row, the watermark).

    ``rows_source(target schema, number of buckets)``: other rows to write instead of the snapshot's
    (:func:`first_state_rows`), as (rows in ``target``'s schema sorted by bucket, their buckets, a
    seq at ``bulk.at``'s LSN) parts."""
    from loader.lake.iceberg import iceberg_table
    from loader.merge.rowdelta import commit_guarded, remove_uncommitted

    at, cut = bulk.at, bulk.plan.cut
    table = iceberg_table(spark, current_ident)
    spec = table.spec()
    fields = spec.fields()
    if (
        table.specs().size() != 1
        or fields.size() != 1
        or table.schema().findColumnName(fields.get(0).sourceId()) != key
    ):
        raise NotPlainBulk("the current table is not bucketed by its first key column alone")
    transform = str(fields.get(0).transform().toString())
    if not transform.startswith("bucket["):
        raise NotPlainBulk(f"the current table is partitioned by {transform}")
    n = int(transform[len("bucket[") : -1])
    part_name = str(fields.get(0).name())
    target = iceberg_arrow_schema(spark, table)
    data_files = jvm_class(spark, "org.apache.iceberg.DataFiles")
    fio, locations = table.io(), table.locationProvider()
    stem = uuid.uuid4().hex
    written: list[str] = []
    built: list[Any] = []

    def finish(bucket: int, data: LocalParquet) -> None:
        partition = data_files.data(spec, f"{part_name}={bucket}")
        path = str(locations.newDataLocation(spec, partition, f"{stem}-bulk-{bucket}-{len(written):05d}.parquet"))
        written.append(path)
        out = fio.newOutputFile(path)
        stream = out.createOrOverwrite()
        try:
            for chunk in data.chunks():
                stream.write(bytearray(chunk))
        finally:
            stream.close()
        built.append(parquet_data_file(spark, table, partition, path, data.size, out.toInputFile()))

    encodings = table_encodings(table.properties(), target)
    files = RollingParquet(target, finish, BULK_FILE_ARROW_BYTES, BULK_ROW_GROUP_BYTES, encodings=encodings)
    parts = _parts(hist, hist_snapshot, bulk, columns, target, key, n, rows_source)
    try:
        rows, end = _write_parts(parts, files, at)
        overwrite = table.newOverwrite()
        expressions = jvm_class(spark, "org.apache.iceberg.expressions.Expressions")
        overwrite = overwrite.overwriteByRowFilter(expressions.alwaysTrue())
        for f in built:
            overwrite = overwrite.addFile(f)
        if start_snapshot is not None:
            overwrite = overwrite.validateFromSnapshot(start_snapshot)
        overwrite = overwrite.conflictDetectionFilter(expressions.alwaysTrue()).validateNoConflictingData()
        overwrite = overwrite.validateNoConflictingDeletes()
        through = cut if bulk.tail_rows == 0 else end
        for k, v in {**commit_props, watermark_key: through.token()}.items():
            overwrite = overwrite.set(k, v)
        if before_commit is not None:
            before_commit()
        commit_guarded(table, overwrite, current_ident, start_snapshot, written, "bulk build")
        return rows, end, through
    finally:
        remove_uncommitted(fio, written)


def write_first_bulk(
    table: Any,
    hist: Any,
    hist_snapshot: int,
    bulk: BulkPlan,
    columns: list[str],
    key: str,
    commit_props: dict[str, str],
    watermark_key: str,
    before_commit: Any = None,
    rows_source: Callable[[Any, int], Iterator[tuple[Any, Any, int]]] | None = None,
) -> tuple[int, ChangePosition, ChangePosition]:
    """:func:`write_bulk` for a current table that has never committed (a table's first state),
    without a JVM: the same files (one Parquet writer per bucket, bounded memory), registered and
    appended in one pyiceberg commit (``table``: pyiceberg's), the summary as ``write_bulk``'s.
    An append onto a table without a snapshot is the overwrite ``write_bulk`` commits; a table
    that gained a snapshot meanwhile fails the commit (nothing of it is kept)."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
        schema_to_pyarrow,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.typedef import Record

    from loader.errors import MergeConflictError
    from loader.lake.commits import uncommitted_removed, warehouse_answers

    name = ".".join(table.name())
    if table.current_snapshot() is not None:
        raise NotPlainBulk("the current table has committed before")
    spec, schema = table.spec(), table.schema()
    fields = spec.fields
    if (
        len(table.specs()) != 1
        or len(fields) != 1
        or schema.find_column_name(fields[0].source_id) != key
        or not isinstance(fields[0].transform, BucketTransform)
    ):
        raise NotPlainBulk("the current table is not bucketed by its first key column alone")
    n = fields[0].transform.num_buckets
    target = schema_to_pyarrow(schema, include_field_ids=True)
    locations = load_location_provider(table_location=table.location(), table_properties=table.properties)
    stats_plan = compute_statistics_plan(schema, table.properties)
    id_mapping = parquet_path_to_id_mapping(schema)
    stem = uuid.uuid4().hex
    written: list[str] = []
    built: list[Any] = []

    def finish(bucket: int, data: LocalParquet) -> None:
        pkey = PartitionKey(field_values=[PartitionFieldValue(fields[0], bucket)], partition_spec=spec, schema=schema)
        footer = data.footer()
        try:
            try:
                stats = data_file_statistics_from_parquet_metadata(
                    parquet_metadata=footer, stats_columns=stats_plan, parquet_column_mapping=id_mapping
                )
            except OverflowError:
                # A date or time beyond Python's range (lake.files.beyond_python): this file's date
                # and timestamp columns with counts only.
                temporal = [f.name for f in target if pa.types.is_date32(f.type) or pa.types.is_timestamp(f.type)]
                stats = data_file_statistics_from_parquet_metadata(
                    parquet_metadata=footer,
                    stats_columns=compute_statistics_plan(schema, counts_only(table.properties, temporal)),
                    parquet_column_mapping=id_mapping,
                )
        except (OverflowError, ValueError) as exc:
            raise NotPlainBulk(f"pyiceberg cannot take this table's column bounds ({exc})") from exc
        path = locations.new_data_location(f"{stem}-bulk-{bucket}-{len(written):05d}.parquet", pkey)
        written.append(path)
        with table.io.new_output(path).create(overwrite=True) as out:
            for chunk in data.chunks():
                out.write(chunk)
        built.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=path,
                file_format=FileFormat.PARQUET,
                partition=Record(bucket),
                file_size_in_bytes=data.size,
                sort_order_id=None,
                spec_id=spec.spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
        )

    hint = "nothing was committed; re-run 'loader merge' once the warehouse answers"
    encodings = table_encodings(table.properties, target)
    files = RollingParquet(target, finish, BULK_FILE_ARROW_BYTES, BULK_ROW_GROUP_BYTES, encodings=encodings)
    parts = _parts(hist, hist_snapshot, bulk, columns, target, key, n, rows_source)
    with uncommitted_removed(table.io, written):
        with warehouse_answers(f"building {name}", hint):
            rows, end = _write_parts(parts, files, bulk.at)
        through = bulk.plan.cut if bulk.tail_rows == 0 else end
        if before_commit is not None:
            before_commit()
        with warehouse_answers(f"committing the bulk build of {name}", hint), table.transaction() as tx:
            if tx.table_metadata.current_snapshot_id is not None:
                raise MergeConflictError(f"{name} gained a snapshot while its first state was built")
            summary = {**commit_props, watermark_key: through.token()}
            with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
                for data_file in built:
                    append.append_data_file(data_file)
    return rows, end, through
