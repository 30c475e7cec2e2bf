"""Driver merge: a small, plain increment merged with Arrow on the driver, no Spark job.

A follow-mode increment is typically a few thousand to a few hundred thousand changes, and Spark's
fixed cost per query (planning, a job per stage, task launch) dominated its merge: ~2 s for 50k
changes, most of it not spent on rows. When the increment is *plain*, the merge is a few vector
operations, so it runs here:

- the increment is read through pyiceberg at the history snapshot the load's watermark names
  (files pruned by their LSN bounds, erasures' position deletes applied);
- it holds no control rows (truncate/resync/park), no update left a value out (unchanged TOAST),
  no update changed the key, and the key columns are integers or text: then the newest event per
  key is the whole reduction (deletes are keyed by their old key, parsed from ``pg_old_key``);
- the current rows of those keys are found by reading only the key, ``pg_lsn`` and ``pg_seq``
  columns of the current table's data files at the snapshot the watermark was read from, minus
  their position deletes; the row position comes from the file order.

Anything else (and increments above ``merge.driver_max_rows``) goes to the Spark paths, which
implement every case; the rules applied here are the same: an event ends a current row only if it
is newer, an upsert writes the row. The files and the commit are :func:`loader.merge.rowdelta.commit_rows`:
one RowDelta validated against every commit since that snapshot.
"""

from __future__ import annotations

import io
import json
import logging
import time
from typing import Any

from loader.lake.types import spark_type
from loader.lsn import ChangePosition, arrow_positions_after, arrow_positions_at_or_before
from loader.merge.rowdelta import BUCKET, FILE, POS

log = logging.getLogger("loader.merge")

# Key types whose values compare the same in the table and in pg_old_key's text.
_INTEGER_TYPES = {"SMALLINT", "INT", "BIGINT"}
_KEY_TYPES = _INTEGER_TYPES | {"STRING"}
_CONTROL_OPS = ("truncate", "resync", "park")
_UPSERT_OPS = ("insert", "update", "read")


class NotPlainIncrement(Exception):
    """The increment or the table needs the Spark path (the reason is the message)."""


def _old_keys(
    texts: list[str | None], pk: list[str], pg_types: dict[str, str], arrow_types: dict[str, Any]
) -> dict[str, Any]:
    """Key columns parsed out of pg_old_key texts (JSON objects of text values, by lake name),
    typed by the load's rule (:func:`loader.load.values.typed`, the one the key columns of
    history's rows were typed by), in the Arrow types of the rows they meet (``arrow_types``: a
    scan may read text as large strings)."""
    import pyarrow as pa
    import pyarrow.json as pj

    from loader.load.values import Misfit, typed

    if any(t is None for t in texts):
        raise NotPlainIncrement("a change without its old key")
    parsed: dict[str, Any] | None = None
    if not any("\n" in t for t in texts):  # type: ignore[operator]
        # One JSON object per line: Arrow's reader parses them all at once, into text columns.
        try:
            table = pj.read_json(
                io.BytesIO("\n".join(texts).encode()),  # type: ignore[arg-type]
                parse_options=pj.ParseOptions(
                    explicit_schema=pa.schema([(k, pa.string()) for k in pk]), unexpected_field_behavior="ignore"
                ),
            )
            if table.num_rows == len(texts):
                parsed = {k: table.column(k).combine_chunks() for k in pk}
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            parsed = None
    if parsed is None:
        values: dict[str, list[Any]] = {k: [] for k in pk}
        for text in texts:
            obj = json.loads(text)  # type: ignore[arg-type]
            for k in pk:
                values[k].append(obj.get(k))
        parsed = {k: pa.array(values[k], pa.string()) for k in pk}
    out = {}
    for k in pk:
        arr = parsed[k]
        if arr.null_count:
            raise NotPlainIncrement("an old key without a value for every key column")
        try:
            out[k] = typed(arr, pg_types[k], k).cast(arrow_types[k])
        except Misfit as exc:
            raise NotPlainIncrement(f"old key of {k} does not parse as {pg_types[k]}: {exc}") from exc
    return out


def _arrow_types(rows: Any, pk: list[str]) -> dict[str, Any]:
    return {k: rows.schema.field(k).type for k in pk}


def plain_upserts(rows: Any, pk: list[str], pg_types: dict[str, str]) -> Any:
    """Which of the history ``rows`` are upserts, when the rows are plain for a reduction to the
    newest event per key: no control rows (truncate/resync/park), every upsert sent every value
    (no unchanged TOAST), no update that carries its old key changed it. NotPlainIncrement names
    what is not."""
    import pyarrow as pa
    import pyarrow.compute as pc

    op = rows.column("pg_operation")
    if pc.any(pc.is_in(op, pa.array(_CONTROL_OPS))).as_py():
        raise NotPlainIncrement("the increment holds control rows")
    is_upsert = pc.is_in(op, pa.array(_UPSERT_OPS))
    absent = pc.list_value_length(rows.column("pg_absent_columns"))
    if pc.any(pc.and_kleene(is_upsert, pc.or_kleene(pc.is_null(absent), pc.greater(absent, 0)))).as_py():
        raise NotPlainIncrement("an update left values out (unchanged TOAST)")
    upserts = rows.filter(is_upsert)
    with_old = upserts.filter(
        pc.and_(pc.equal(upserts.column("pg_operation"), "update"), pc.is_valid(upserts.column("pg_old_key")))
    )
    if with_old.num_rows:
        old = _old_keys(with_old.column("pg_old_key").to_pylist(), pk, pg_types, _arrow_types(rows, pk))
        for k in pk:
            if not pc.all(pc.equal(old[k], with_old.column(k))).as_py():
                raise NotPlainIncrement("an update changed the key")
    return is_upsert


def _newest_per_key(events: Any, pk: list[str]) -> Any:
    """The last event of each key (by position; a delete before an upsert at the same one)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if events.num_rows == 0:
        return events
    order = [(k, "ascending") for k in pk] + [("pg_lsn", "descending"), ("pg_seq", "descending"), ("sub", "descending")]
    ev = events.sort_by(order)
    first = np.zeros(ev.num_rows, dtype=bool)
    first[0] = True
    for k in pk:
        col = ev.column(k).combine_chunks()
        differs = pc.not_equal(col.slice(1), col.slice(0, len(col) - 1)).to_numpy(zero_copy_only=False)
        first[1:] |= differs
    return ev.filter(pa.array(first))


def driver_rows(
    catalog: Any,
    hist_id: tuple[str, str],
    cur_id: tuple[str, str],
    pk: list[str],
    pg_types: dict[str, str],
    since: ChangePosition | None,
    cut: ChangePosition,
    hist_snapshot: int | None,
    start_snapshot: int | None,
    max_rows: int,
) -> tuple[Any, Any, int]:
    """(rows to end, rows to write, increment rows) for :func:`loader.merge.rowdelta.commit_rows`;
    raises :class:`NotPlainIncrement` when the Spark path must merge this increment. ``since``
    None: the increment is all of history up to ``cut``, for a current table that never committed
    (``start_snapshot`` None)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, EqualTo, GreaterThan, LessThanOrEqual
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.transforms import BucketTransform

    for k in pk:
        if spark_type(pg_types[k]).sql not in _KEY_TYPES:
            raise NotPlainIncrement(f"key column {k} is {pg_types[k]}")
    if hist_snapshot is None or (start_snapshot is None) != (since is None):
        raise NotPlainIncrement("no snapshot to read")

    # --- the current table: one bucket spec on the first key column, at the watermark's snapshot
    cur = catalog.load_table(cur_id)
    snap = cur.current_snapshot()
    if (None if snap is None else snap.snapshot_id) != start_snapshot:
        raise NotPlainIncrement("the current table moved since its watermark was read")
    specs = cur.specs()
    spec = cur.spec()
    schema = cur.schema()
    if len(specs) != 1 or len(spec.fields) != 1 or not isinstance(spec.fields[0].transform, BucketTransform):
        raise NotPlainIncrement("the current table is not bucketed by its key")
    key_field = schema.find_field(pk[0])
    if spec.fields[0].source_id != key_field.field_id:
        raise NotPlainIncrement("the current table is not bucketed by its first key column")
    bucket_of = spec.fields[0].transform.transform(key_field.field_type)

    # --- the increment: (since, cut] of history at the load's snapshot
    started = time.perf_counter()
    hist = catalog.load_table(hist_id)
    # A watermark is normally a transaction's end (its commit marker), so the increment starts at
    # the next commit LSN and the file that ends at the watermark need not be read. Only a park
    # cut stops inside a transaction: rows at the watermark's LSN after it send this to Spark
    # (two columns of the last row group of that file are read to know).
    upto = LessThanOrEqual("pg_lsn", cut.commit_lsn)  # type: ignore[misc,call-arg,arg-type]
    row_filter: Any = upto
    if since is not None:
        at_since = EqualTo("pg_lsn", since.commit_lsn)  # type: ignore[misc,call-arg,arg-type]
        at_tasks = list(hist.scan(row_filter=at_since, snapshot_id=hist_snapshot).plan_files())
        if at_tasks:
            pos_schema = hist.schema().select("pg_lsn", "pg_seq")
            at = ArrowScan(hist.metadata, hist.io, pos_schema, at_since).to_table(at_tasks)
            if pc.any(pc.greater(at.column("pg_seq"), since.seq)).as_py():
                raise NotPlainIncrement("rows at the watermark's LSN follow it (a park)")
        row_filter = And(GreaterThan("pg_lsn", since.commit_lsn), upto)  # type: ignore[misc,call-arg,arg-type]
    scan = hist.scan(row_filter=row_filter, snapshot_id=hist_snapshot)
    tasks = list(scan.plan_files())
    if sum(t.file.record_count for t in tasks) > max_rows:
        raise NotPlainIncrement("the increment's files hold more rows than merge.driver_max_rows")
    inc = ArrowScan(hist.metadata, hist.io, scan.projection(), row_filter).to_table(tasks)
    read_s = time.perf_counter() - started
    in_range = arrow_positions_at_or_before(inc.column("pg_lsn"), inc.column("pg_seq"), cut)
    if since is not None:
        in_range = pc.and_(arrow_positions_after(inc.column("pg_lsn"), inc.column("pg_seq"), since), in_range)
    inc = inc.filter(in_range)
    n_rows = inc.num_rows
    if n_rows == 0:
        return None, None, 0
    is_upsert = plain_upserts(inc, pk, pg_types)
    op = inc.column("pg_operation")

    inc = inc.append_column("idx", pa.array(range(n_rows), pa.int64()))
    upserts = inc.filter(is_upsert)
    deletes = inc.filter(pc.equal(op, "delete"))
    meta = ["pg_lsn", "pg_seq", "idx"]
    parts = [upserts.select([*pk, *meta]).append_column("sub", pa.array([1] * upserts.num_rows, pa.int8()))]
    if deletes.num_rows:
        old = _old_keys(deletes.column("pg_old_key").to_pylist(), pk, pg_types, _arrow_types(inc, pk))
        parts.append(
            pa.Table.from_arrays(
                [old[k] for k in pk]
                + [deletes.column(m) for m in meta]
                + [pa.array([0] * deletes.num_rows, pa.int8())],
                names=[*pk, *meta, "sub"],
            )
        )
    events = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    if any(events.column(k).null_count for k in pk):
        raise NotPlainIncrement("an event without a key value")
    newest = _newest_per_key(events, pk)
    keys = newest.select(pk)

    # --- current rows of those keys: key, position, file and row number, minus position deletes
    reduce_s = time.perf_counter() - started - read_s
    matched = _current_rows(cur, start_snapshot, pk, keys, 250 * max_rows)
    log.debug(
        "driver merge %s: increment %d rows read in %.3f s, reduced in %.3f s; %d current rows found in %.3f s",
        ".".join(cur_id),
        n_rows,
        read_s,
        reduce_s,
        matched.num_rows,
        time.perf_counter() - started - read_s - reduce_s,
    )
    if matched.num_rows and matched.select(pk).group_by(pk).aggregate([]).num_rows != matched.num_rows:
        raise NotPlainIncrement("the current table holds a key twice")
    joined = newest.join(matched, pk, join_type="left outer")
    found = pc.is_valid(joined.column(FILE))
    newer = pc.fill_null(
        arrow_positions_after(
            joined.column("pg_lsn"), joined.column("pg_seq"), (joined.column("t_lsn"), joined.column("t_seq"))
        ),
        False,
    )
    ends = joined.filter(pc.and_(found, newer)).select([FILE, POS, BUCKET])
    # An upsert writes its row when it is newer than the current one, or the key has none (every
    # event of the increment is after the watermark, which is where inserts may start).
    chosen = joined.filter(pc.and_(pc.equal(joined.column("sub"), 1), pc.or_(pc.invert(found), newer)))
    writes = inc.take(chosen.column("idx"))
    data_cols = [f.name for f in schema.fields if f.name in writes.column_names]
    writes = writes.select(data_cols)
    # A key the table holds stays in its row's bucket; only new keys are hashed (Iceberg's bucket
    # transform, one value at a time).
    buckets = chosen.column(BUCKET).combine_chunks()
    if buckets.null_count:
        new_keys = writes.column(pk[0]).filter(pc.is_null(buckets))
        if pa.types.is_integer(new_keys.type) and not new_keys.null_count:
            # A whole column at once (a table's first state makes every key new).
            from loader.lake.buckets import bucket_ints

            hashed = iter(bucket_ints(new_keys.to_numpy(), spec.fields[0].transform.num_buckets).tolist())
        else:
            hashed = iter(bucket_of(v) for v in new_keys.to_pylist())
        buckets = pa.array(
            [b if b is not None else next(hashed) for b in buckets.to_pylist()],
            pa.int32(),
        )
    writes = writes.append_column(BUCKET, buckets.cast(pa.int32()))
    return ends, writes, n_rows


def _current_rows(cur: Any, snapshot_id: int | None, pk: list[str], keys: Any, max_rows: int) -> Any:
    """Live rows of the current table whose key is in ``keys``: key columns, ``pg__file``,
    ``pg__pos``, ``pg__bucket``, ``t_lsn``, ``t_seq`` (none when ``snapshot_id`` is None: the table
    never committed)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFileContent

    schema = cur.schema()
    wanted = {schema.find_field(c).field_id: c for c in (*pk, "pg_lsn", "pg_seq")}
    tasks = list(cur.scan(snapshot_id=snapshot_id).plan_files()) if snapshot_id is not None else []
    if sum(t.file.record_count for t in tasks) > max_rows:
        raise NotPlainIncrement("the current table holds more rows than the driver reads (250 x merge.driver_max_rows)")
    seen_deletes: set[str] = set()
    delete_tables = []
    for task in tasks:
        for d in task.delete_files:
            if d.content != DataFileContent.POSITION_DELETES:
                raise NotPlainIncrement("the current table has equality deletes")
            if d.file_path not in seen_deletes:
                seen_deletes.add(d.file_path)
                with cur.io.new_input(d.file_path).open() as f:
                    delete_tables.append(pq.read_table(f, columns=["file_path", "pos"]))
    deletes = pa.concat_tables(delete_tables, promote_options="permissive") if delete_tables else None
    key_set = [keys.column(k).combine_chunks() for k in pk]
    out = []
    for task in tasks:
        path = task.file.file_path
        gone = None
        if deletes is not None:
            gone = deletes.filter(pc.equal(deletes.column("file_path"), path)).column("pos").combine_chunks()
            gone = gone.cast(pa.int64()) if len(gone) else None
        bucket = int(task.file.partition[0])
        with cur.io.new_input(path).open() as f:
            pf = pq.ParquetFile(f)
            names = {}
            for field in pf.schema_arrow:
                fid = (field.metadata or {}).get(b"PARQUET:field_id")
                if fid is not None and int(fid) in wanted:
                    names[wanted[int(fid)]] = field.name
            if len(names) != len(wanted):
                raise NotPlainIncrement(f"data file {path} lacks a key or position column")
            offset = 0
            # Batch by batch: memory holds one batch of three columns, whatever the file's size.
            for batch in pf.iter_batches(batch_size=1 << 20, columns=[names[c] for c in (*pk, "pg_lsn", "pg_seq")]):
                t = pa.Table.from_batches([batch]).rename_columns([*pk, "t_lsn", "t_seq"])
                # An older file may hold a key column before it was widened (int -> bigint).
                t = t.cast(
                    pa.schema([pa.field(k, key_set[i].type) for i, k in enumerate(pk)] + list(t.schema)[len(pk) :])
                )
                t = t.append_column(POS, pa.array(np.arange(offset, offset + t.num_rows, dtype=np.int64)))
                offset += t.num_rows
                mask = pc.is_in(t.column(pk[0]), value_set=key_set[0])
                for k, ks in zip(pk[1:], key_set[1:], strict=True):
                    mask = pc.and_(mask, pc.is_in(t.column(k), value_set=ks))
                if gone is not None:
                    mask = pc.and_(mask, pc.invert(pc.is_in(t.column(POS), value_set=gone)))
                t = t.filter(mask)
                if t.num_rows:
                    t = t.append_column(FILE, pa.array([path] * t.num_rows, pa.string()))
                    t = t.append_column(BUCKET, pa.array([bucket] * t.num_rows, pa.int32()))
                    out.append(t)
    if not out:
        fields = [pa.field(k, keys.schema.field(k).type) for k in pk] + [
            pa.field("t_lsn", pa.int64()),
            pa.field("t_seq", pa.int64()),
            pa.field(POS, pa.int64()),
            pa.field(FILE, pa.string()),
            pa.field(BUCKET, pa.int32()),
        ]
        return pa.schema(fields).empty_table()
    return pa.concat_tables(out, promote_options="permissive")
