"""Landing files -> canonical change rows (Arrow), run inside Spark executors via mapInArrow.

An intact landing v2 change file whose records are all plain changes is decoded in columns
(:func:`plain_change_rows`); every other file record by record, which is where the rules below
are applied one record at a time.

What is bad data and what is not:
- A line that cannot be decoded (not UTF-8, not JSON, not a landing record), a record the capture
  quarantined (``X``), or the cut-off last line of a truncated file becomes a row with
  ``reject_reason`` and its raw text: it goes to the rejects table, and its table (when known) is
  parked until a resync.
- A damaged file (truncated, corrupt gzip) keeps every line that is still readable. Its header
  (first gzip member) says how many records of each table it held; tables that lost records get a
  ``park`` row, so exactly those wait for a resync. Without a readable header, one park row with
  no table says "unknown tables": the load parks every table.
- Failing to *read* a file (S3/OS errors) is not bad data: the store retries, then the error
  propagates and fails the load with nothing marked loaded. Neither is a file that decompresses
  past ``landing.max_decompressed_mb``: decompression stops there, and the load fails naming it.
- A line nested too deeply for the JSON decoders (a recursion limit) is an undecodable line.
"""

from __future__ import annotations

import gc
import itertools
import json
import re
import zlib
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from loader.errors import DecompressedSizeError
from loader.landing.records import COMMIT, OPERATIONS, ChangeRecord, parse_header
from loader.landing.store import CHANGES, JSONL, MAX_DECOMPRESSED, TABLES, format_of, gunzip_bounded, too_large
from loader.lsn import ChangePosition
from loader.names import lake_column

CHANGE_ROW_DDL = (
    "landing_file STRING, line INT, op STRING, commit_lsn BIGINT, seq BIGINT, change_lsn BIGINT,"
    " xid BIGINT, ts STRING, src_schema STRING, src_table STRING,"
    " col_names ARRAY<STRING>, col_types ARRAY<STRING>, col_values ARRAY<STRING>,"
    " key_names ARRAY<STRING>, key_types ARRAY<STRING>, key_values ARRAY<STRING>, pk ARRAY<STRING>,"
    " note STRING, reject_reason STRING, raw STRING"
)

_FIELDS = (
    "landing_file",
    "line",
    "op",
    "commit_lsn",
    "seq",
    "change_lsn",
    "xid",
    "ts",
    "src_schema",
    "src_table",
    "col_names",
    "col_types",
    "col_values",
    "key_names",
    "key_types",
    "key_values",
    "pk",
    "note",
    "reject_reason",
    "raw",
)
_CHUNK = 1 << 16
_SMALL_CHUNK = 256


def record_row(file: str, line_no: int, rec: ChangeRecord, shape: _Shape | None = None) -> dict[str, Any]:
    shape = shape or _shape_of(rec)
    return {
        "landing_file": file,
        "line": line_no,
        "op": OPERATIONS[rec.op],
        "commit_lsn": rec.commit_lsn,
        "seq": rec.seq,
        "change_lsn": rec.change_lsn,
        "xid": rec.xid,
        "ts": rec.ts,
        "src_schema": rec.schema,
        "src_table": rec.table,
        # The name lists are the shape's own objects, shared by every row of the shape (never
        # mutated): rows_to_batch converts each distinct one to Arrow once.
        "col_names": shape.col_names,
        "col_types": shape.col_types,
        "col_values": [c.value for c in rec.columns],
        "key_names": shape.key_names,
        "key_types": shape.key_types,
        "key_values": [c.value for c in rec.identity],
        "pk": shape.pk,
        "note": rec.reason or None,
        "reject_reason": None,
        "raw": None,
    }


class _Shape:
    """What a record's validity and its row's name lists depend on besides its values: operation,
    table, column names and types, old-key names, primary key. Checked once per shape, not per row."""

    __slots__ = ("col_names", "col_types", "key_names", "key_types", "pk", "problem")

    def __init__(self, rec: ChangeRecord) -> None:
        self.col_names = [c.name for c in rec.columns]
        self.col_types = [c.type for c in rec.columns]
        self.key_names = [c.name for c in rec.identity]
        self.key_types = [c.type for c in rec.identity]
        self.pk = list(rec.pk)
        self.problem = _shape_problem(rec, self.col_names, self.key_names)


_SHAPES: dict[tuple[Any, ...], _Shape] = {}
_SHAPES_MAX = 4096


def _shape_of(rec: ChangeRecord) -> _Shape:
    cols = rec.columns
    key = (
        rec.op,
        rec.schema,
        rec.table,
        tuple([c.name for c in cols]),
        tuple([c.type for c in cols]),
        tuple([c.name for c in rec.identity]),
        tuple([c.type for c in rec.identity]),
        tuple(rec.pk),
    )
    shape = _SHAPES.get(key)
    if shape is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        shape = _SHAPES[key] = _Shape(rec)
    return shape


def reject_row(file: str, line_no: int, raw: str, reason: str, rec: ChangeRecord | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {f: None for f in _FIELDS}
    row.update(landing_file=file, line=line_no, reject_reason=reason, raw=raw)
    if rec is not None:
        row.update(commit_lsn=rec.commit_lsn, seq=rec.seq, ts=rec.ts)
        if _routable(rec.schema, rec.table):
            row.update(src_schema=rec.schema, src_table=rec.table)
        return row
    # Keep whatever routing information survives so the reject names its table and LSN.
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return row
    if isinstance(doc, dict):
        if _routable(doc.get("schema"), doc.get("table")):
            row.update(src_schema=doc["schema"], src_table=doc["table"])
        if isinstance(doc.get("ts"), str) and _TIMESTAMP.match(doc["ts"]):
            row["ts"] = doc["ts"]
        for field, key in (("commit_lsn", "lsn"), ("seq", "seq")):
            if isinstance(doc.get(key), int) and not isinstance(doc.get(key), bool) and 0 <= doc[key] < 1 << 63:
                row[field] = doc[key]
    return row


def repair_hint(qualified: str | None) -> str:
    """The documented repair of a parked table (every table when it is not known)."""
    return f"repair: loader resync --table {qualified}" if qualified else "repair: loader resync"


def _routable(schema: Any, table: Any) -> bool:
    """A reject names its table only when that could be a real table: a loss is then parked there;
    otherwise the file's header (or, without one, every table) takes the park."""
    return all(isinstance(n, str) and 0 < len(n.encode("utf-8")) <= _MAX_NAME_BYTES for n in (schema, table))


def park_row(
    file: str, schema: str | None, table: str | None, lsn: int, ts: str | None, note: str, seq: int = 0
) -> dict[str, Any]:
    """A park marker the load derived (not read from the file): a damaged file lost this table's changes.
    At ``(lsn, seq)``: the start of the transaction (seq 0) unless ``park_seq`` says otherwise."""
    row: dict[str, Any] = {f: None for f in _FIELDS}
    row.update(
        landing_file=file,
        line=0,
        op="park",
        commit_lsn=lsn,
        seq=seq,
        change_lsn=0,
        xid=0,
        ts=ts,
        src_schema=schema,
        src_table=table,
        col_names=[],
        col_types=[],
        col_values=[],
        key_names=[],
        key_types=[],
        key_values=[],
        pk=[],
        note=note,
    )
    return row


def gunzip_salvage(data: bytes, limit: int = MAX_DECOMPRESSED, what: str = "landing file") -> tuple[bytes, str | None]:
    """Decompress a (multi-member) gzip file as far as it is readable: (bytes, damage or None).

    An intact file is decompressed by ISA-L (``isal``, twice zlib's speed here); a file it cannot
    read whole is read again by zlib, member by member, to keep what precedes the damage. Past
    ``limit`` decompressed bytes either way, ``DecompressedSizeError`` naming ``what``.
    """
    try:
        return gunzip_bounded(data, limit, what), None
    except DecompressedSizeError:
        raise
    except Exception:  # damaged or cut short (isal's own error, OSError, EOFError): salvage below
        pass
    out: list[bytes] = []
    total = 0
    offset = 0
    while offset < len(data):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            chunk = data[offset : offset + _CHUNK]
            if not chunk:
                out.append(d.flush())
                return b"".join(out), f"file ends inside a gzip member (cut off after {len(data)} bytes)"
            saved = d.copy()
            try:
                out.append(d.decompress(chunk, limit - total + 1))
                total += len(out[-1])
                if total > limit or d.unconsumed_tail:
                    raise too_large(what, limit)
            except zlib.error as exc:
                # Replay the chunk in small pieces from before it, to keep what precedes the damage.
                for i in range(0, len(chunk), _SMALL_CHUNK):
                    try:
                        out.append(saved.decompress(chunk[i : i + _SMALL_CHUNK]))
                    except zlib.error:
                        break
                return b"".join(out), f"gzip data damaged near byte {offset}: {exc}"
            offset += len(chunk) - len(d.unused_data)
        if not data[offset:].strip(b"\0"):
            break  # zero padding after the last member (some copy tools add it)
    return b"".join(out), None


def decode_file(
    file: str,
    data: bytes,
    first_lsn: int,
    span: tuple[ChangePosition, ChangePosition] | None = None,
    max_bytes: int = MAX_DECOMPRESSED,
) -> Iterator[dict[str, Any]]:
    """Canonical rows of one landing file: changes, control records, rejects and parks for losses.

    Every readable line is kept. Then the file's header is checked against what was read: a
    table with fewer records than the header says lost changes and gets a park row. Without a
    readable header, any loss (damage, or a reject that names no table) parks every table.
    ``span`` (the positions the file's name covers) rejects records placed outside it: such a
    record could take the position of a real change in another file, which the load's
    exactly-once dedupe would then drop. A file decompressing past ``max_bytes`` raises
    ``DecompressedSizeError`` (the load fails naming it).
    """
    if format_of(file) != JSONL:
        yield from _decode_arrow_file(file, data, first_lsn, span)
        return
    if file.endswith(".gz"):
        text, damage = gunzip_salvage(data, max_bytes, f"landing file {file}")
    else:
        text, damage = data, None
    lines = text.split(b"\n")
    tail = lines.pop() if lines else b""
    header = None
    seen: dict[str, int] = {}
    names: dict[str, tuple[str, str]] = {}  # qualified -> (schema, table), as the records name them
    unplaced = 0  # rejects that name no table: some table lost a change
    first_ts: str | None = None
    positions: set[tuple[int, int]] = set()
    rows: list[tuple[int, bytes]] = list(enumerate(lines, start=1))
    if tail.strip():
        if damage is None:  # an intact file whose last line has no newline
            rows.append((len(lines) + 1, tail))
        else:
            unplaced += 1
    for line_no, raw in rows:
        row = _decode_line(file, line_no, raw)
        if row is None:
            continue
        if row.get("op") == "header":
            header = row["header"]
            continue
        if row["reject_reason"] is None:
            row = _check_place(file, line_no, raw, row, span, positions)
        unplaced += _tally(row, seen, names)
        first_ts = first_ts or row["ts"]
        yield row
    if tail.strip() and damage is not None:
        yield reject_row(file, len(lines) + 1, tail.decode("utf-8", "backslashreplace"), f"line cut off: {damage}")
    yield from _account(
        file, data, damage, header.tables if header else None, seen, names, unplaced, first_lsn, first_ts
    )


def _account(
    file: str,
    data: bytes,
    damage: str | None,
    announced: dict[str, int] | None,
    seen: dict[str, int],
    names: dict[str, tuple[str, str]],
    unplaced: int,
    first_lsn: int,
    first_ts: str | None,
) -> Iterator[dict[str, Any]]:
    """Park rows for what a file lost: its header's counts (``announced``, None without a readable
    header) against the records ``seen`` per table, and ``unplaced`` rejects that name no table.
    A header names a table ``schema.table``: the records read tell where a name with more than one
    dot splits; a table all of whose records were lost leaves that unknown, and then every table
    is parked, as for a file without a header (never a guessed table)."""
    short = {
        t: n - seen.get(t, 0) for t, n in (announced.items() if announced is not None else ()) if n > seen.get(t, 0)
    }
    if damage is not None and announced is not None and not short and not unplaced:
        # Damaged after everything its header announced (e.g. junk appended): nothing is lost,
        # but the damage is recorded rather than passed over.
        yield reject_row(file, 0, data[-64:].hex(), f"landing file damaged after its last record: {damage}")
        return
    if damage is None and not unplaced and not short:
        return
    where = f"landing file {file} is damaged ({damage})" if damage else f"landing file {file} holds undecodable lines"
    # A record the capture could not attribute to any table (an X without one) is counted under an
    # empty name: like a file without a header, it may have cost any table a change.
    # So is a name with more than one dot that no record read says how to split.
    unattributed = any(not t.partition(".")[2] or (t not in names and t.count(".") > 1) for t in short)
    if announced is None or unattributed:
        yield park_row(
            file,
            None,
            None,
            first_lsn,
            first_ts,
            f"{where}; it has no readable header, so every table may have lost changes; {repair_hint(None)}",
        )
        return
    for qualified, lost in sorted(short.items()):
        schema, _, table = qualified.partition(".")
        schema, table = names.get(qualified, (schema, table))
        yield park_row(
            file,
            schema,
            table,
            first_lsn,
            first_ts,
            f"{where}: {lost} of its {announced[qualified]} changes of this table are unreadable; "
            f"{repair_hint(qualified)}",
        )


def _decode_arrow_file(
    file: str, data: bytes, first_lsn: int, span: tuple[ChangePosition, ChangePosition] | None
) -> Iterator[dict[str, Any]]:
    """``decode_file`` for a landing v2 file (a snapshot chunk, loader.landing.arrowfile, or
    records of the change stream, loader.landing.changefile): the rows a v1 file with the same
    records gives (line numbers as there: the header is line 1), every readable batch kept, the
    header's counts checked like v1's. A record's raw text (in a reject) is its v1 line."""
    from loader.landing import arrowfile, changefile, tablefile

    records: Iterator[ChangeRecord] = iter(())
    header: changefile.ChangeHeader | arrowfile.SnapshotHeader | tablefile.TablesHeader | None
    if format_of(file) == TABLES:
        got_tables = tablefile.salvage(data)
        header, damage = got_tables.header, got_tables.damage
        if header is not None:
            records = tablefile.readable_records(got_tables)
    elif format_of(file) == CHANGES:
        got_changes = changefile.salvage(data)
        header, damage = got_changes.header, got_changes.damage
        if header is not None:
            records = itertools.chain.from_iterable(changefile.batch_records(b) for b in got_changes.batches)
    else:
        got = arrowfile.salvage(data)
        header, damage = got.header, got.damage
        if got.header is not None:
            marker = got.header.resync_record()
            records = itertools.chain(
                [marker] if marker is not None else [], arrowfile.row_records(got.header, got.batches)
            )
    seen: dict[str, int] = {}
    names: dict[str, tuple[str, str]] = {}  # qualified -> (schema, table), as the records name them
    unplaced = 0
    first_ts: str | None = None
    positions: set[tuple[int, int]] = set()
    line_no = 1
    for rec in records:
        line_no += 1
        raw = rec.to_json()
        row = _record_to_row(file, line_no, rec, raw)
        if row is None:
            continue
        if row["reject_reason"] is None:
            row = _check_place(file, line_no, raw.encode("utf-8"), row, span, positions)
        unplaced += _tally(row, seen, names)
        first_ts = first_ts or row["ts"]
        yield row
    yield from _account(
        file, data, damage, header.tables if header else None, seen, names, unplaced, first_lsn, first_ts
    )


# Operations the columnar decoding takes: row changes and truncates (control records, quarantined
# input and anything damaged go row by row, which says what each one is).
_COLUMNAR_OPS = ("I", "U", "D", "R", "T")


def plain_change_rows(file: str, data: bytes, span: tuple[ChangePosition, ChangePosition] | None) -> Any:
    """The rows :func:`decode_file` gives for a landing v2 change file, built in Arrow columns
    when the file is intact and every record in it is a plain change (an operation of
    ``_COLUMNAR_OPS``, a valid position inside ``span`` in strictly increasing order, a commit time
    in timestamp form, a shape :func:`_shape_problem` passes, and the header's counts all read):
    one RecordBatch of :func:`_arrow_schema`, in the file's order. None for any other file: the
    row-by-row decoding then says what each record is (rejects, parks, control rows).
    ``tests/load/test_columnar_decode_unit.py`` holds the two to the same rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from loader.landing import changefile
    from loader.load.columns import NotPlain, RecordColumns, first_rows
    from loader.lsn import positions_after

    got = changefile.salvage(data, decode=False)
    if got.header is None or got.damage is not None:
        return None
    stored = pa.Table.from_batches(got.batches, schema=changefile.arrow_schema(stored=True))
    ops_all = stored.column("op").combine_chunks().cast(pa.string())
    at = np.flatnonzero(pc.not_equal(ops_all, COMMIT).to_numpy(zero_copy_only=False))
    rows = stored.take(pa.array(at, pa.int64()))
    ops = ops_all.take(pa.array(at, pa.int64()))
    n = len(at)
    if n and not pc.all(pc.is_in(ops, value_set=pa.array(_COLUMNAR_OPS))).as_py():
        return None
    lsn_u = rows.column("lsn").combine_chunks()
    if n and pc.max(lsn_u).as_py() >= 1 << 63:
        return None
    lsn = np.asarray(lsn_u.to_numpy(zero_copy_only=False), dtype=np.int64)
    seq = np.asarray(rows.column("seq").combine_chunks().to_numpy(zero_copy_only=False), dtype=np.int64)
    if n and (seq.min() < 0 or not ((lsn[1:] > lsn[:-1]) | ((lsn[1:] == lsn[:-1]) & (seq[1:] > seq[:-1]))).all()):
        return None  # a position repeated or out of order: the row path says which
    if n and span is not None:
        first, last = span
        if not positions_after(lsn[:1], seq[:1], first, inclusive=True).all():
            return None
        if positions_after(lsn[-1:], seq[-1:], last).any():
            return None
    ts = rows.column("ts").combine_chunks().cast(pa.string())
    if any(not _TIMESTAMP.match(t) for t in pc.unique(ts).to_pylist()):
        return None
    schema_col = rows.column("schema").combine_chunks().cast(pa.string())
    table_col = rows.column("table").combine_chunks().cast(pa.string())
    seen = pc.value_counts(pc.binary_join_element_wise(schema_col, table_col, ".")).to_pylist()
    counts = {c["values"]: c["counts"] for c in seen}
    if any(counts.get(t, 0) < k for t, k in got.header.tables.items()):
        return None  # fewer records of a table than the header announces: parks, row by row
    try:
        cols = RecordColumns(rows)
    except NotPlain:
        return None
    if n:
        shape, _, _ = cols.shape_ids(ops, schema_col, table_col)
        for r in first_rows(shape).tolist():
            kind = cols.shape(ops, schema_col, table_col, r)
            if _shape_problem(kind.record(), kind.names, kind.key_names) is not None:
                return None

    def lists(offsets: Any, items: Any) -> Any:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items.cast(pa.string()))

    op_dict = pc.dictionary_encode(ops)
    op_names = pa.array([OPERATIONS[c] for c in op_dict.dictionary.to_pylist()], pa.string())
    reason = rows.column("reason").combine_chunks()
    s, i64 = pa.string(), pa.int64()
    arrays = [
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([file], s)).cast(s),
        pa.array((at + 2).astype(np.int32)),  # line numbers as in a v1 file: the header is line 1
        op_names.take(op_dict.indices),
        pa.array(lsn, i64),
        pa.array(seq, i64),
        rows.column("change_lsn").combine_chunks().cast(i64),
        rows.column("xid").combine_chunks().cast(i64),
        ts,
        schema_col,
        table_col,
        lists(cols.col_offsets, cols.names),
        lists(cols.col_offsets, cols.types),
        lists(cols.col_offsets, cols.values),
        lists(cols.id_offsets, cols.id_names),
        lists(cols.id_offsets, cols.id_types),
        lists(cols.id_offsets, cols.id_values),
        lists(cols.pk_offsets, cols.pk_items),
        pc.if_else(pc.equal(pc.fill_null(reason, ""), ""), pa.scalar(None, s), reason),
        pa.nulls(n, s),
        pa.nulls(n, s),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_arrow_schema())


def layout_shape(layout: Any, shape: Any) -> tuple[Any, str | None]:
    """The kind of change a landing v3 layout's shape stands for (``loader.landing.tablefile``
    ``Layout``, ``RowShape``), as a RecordShape, and what :func:`_shape_problem` finds in it."""
    from loader.load.columns import RecordShape

    cols, ids = layout.record_columns(shape)
    kind = RecordShape(
        shape.op,
        layout.schema,
        layout.table,
        [n for n, _ in cols],
        [t for _, t in cols],
        [n for n, _ in ids],
        [t for _, t in ids],
        list(shape.pk),
    )
    return kind, _shape_problem(kind.record(), kind.names, kind.key_names)


def _shape_items(codes: Any, per_shape: list[list[int]]) -> tuple[Any, Any, Any]:
    """Rows whose list is their shape's (``per_shape[s]``: item indices): the lists' offsets, and
    for each item of the flattened lists its index and its row."""
    import numpy as np

    lengths = np.array([len(items) for items in per_shape], np.int64)[codes]
    offsets = np.zeros(len(codes) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    item = np.empty(int(offsets[-1]), np.int64)
    for s, items in enumerate(per_shape):
        if items:
            rows = np.flatnonzero(codes == s)
            item[offsets[rows][:, None] + np.arange(len(items))] = np.array(items, np.int64)[None, :]
    return offsets, item, np.repeat(np.arange(len(codes)), lengths)


def _lists(offsets: Any, items: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items)


def _listed(
    codes: Any, per_shape: list[tuple[int, ...]], pairs: tuple[tuple[str, str], ...], batch: Any, first: int
) -> list[Any]:
    """A v3 rows segment's (``batch``) column lists as a decoded row holds them: each row's names,
    types and values of its shape's columns (``per_shape``: indices into ``pairs``, whose values
    are the batch's columns from ``first`` on)."""
    import pyarrow as pa

    s = pa.string()
    offsets, item, row = _shape_items(codes, [list(c) for c in per_shape])
    names = pa.array([n for n, _ in pairs], s).take(pa.array(item))
    types = pa.array([t for _, t in pairs], s).take(pa.array(item))
    stacked = [batch.column(first + u) for u in range(len(pairs))]
    values = (pa.concat_arrays(stacked) if stacked else pa.array([], s)).take(pa.array(item * len(batch) + row))
    return [_lists(offsets, names), _lists(offsets, types), _lists(offsets, values)]


def plain_table_rows(file: str, data: bytes, span: tuple[ChangePosition, ChangePosition] | None) -> Any:
    """The rows :func:`decode_file` gives for a landing v3 change file (loader.landing.tablefile),
    built in Arrow columns from its segments when the file is intact and holds plain changes and
    commit markers only, each table's count as its header says, positions strictly increasing in
    the file's order and inside ``span``, commit times in timestamp form, and shapes
    :func:`_shape_problem` passes: one RecordBatch of :func:`_arrow_schema`, in the file's order.
    None for any other file: the record-by-record decoding then says what each record is.
    ``tests/load/test_columnar_decode_unit.py`` holds the two to the same rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from loader.landing import tablefile
    from loader.lsn import positions_after

    got = tablefile.salvage(data)
    if got.header is None or got.damage is not None:
        return None
    s, i64 = pa.string(), pa.int64()
    counts: dict[str, int] = {}
    parts: list[list[Any]] = []
    ordinals = []
    try:
        segments = tablefile.rows_segments(got.segments)
    except ValueError:
        return None
    for seg, b in segments:
        layout = seg.layout
        if any(layout_shape(layout, shape)[1] is not None for shape in layout.shapes):
            return None
        counts[layout.qualified] = counts.get(layout.qualified, 0) + seg.rows
        if pc.max(b.column(1)).as_py() >= 1 << 63:
            return None
        r = len(b)
        codes = b.column(tablefile.VALUES_AT - 1).to_numpy()
        k = len(layout.columns)

        pk_items = [name for shape in layout.shapes for name in shape.pk]
        bases = np.concatenate([[0], np.cumsum([len(shape.pk) for shape in layout.shapes])]).astype(int)
        pk_offsets, pk_item, _ = _shape_items(
            codes, [list(range(bases[i], bases[i + 1])) for i in range(len(layout.shapes))]
        )
        op_names = pa.array([OPERATIONS[shape.op] for shape in layout.shapes], s)
        ordinals.append(b.column(0).to_numpy())
        parts.append(
            [
                op_names.take(pa.array(codes)),
                b.column(1).cast(i64),
                b.column(2),
                b.column(5),
                b.column(3),
                b.column(4).cast(s),
                pa.repeat(pa.scalar(layout.schema, s), r),
                pa.repeat(pa.scalar(layout.table, s), r),
                *_listed(codes, [shape.columns for shape in layout.shapes], layout.columns, b, tablefile.VALUES_AT),
                *_listed(
                    codes, [shape.identity for shape in layout.shapes], layout.identity, b, tablefile.VALUES_AT + k
                ),
                _lists(pk_offsets, pa.array(pk_items, s).take(pa.array(pk_item))),
            ]
        )
    if any(counts.get(t, 0) < n for t, n in got.header.tables.items()):
        return None
    if not parts:
        return pa.RecordBatch.from_pylist([], _arrow_schema())
    n_all = np.concatenate(ordinals)
    order = np.argsort(n_all, kind="stable")
    take = pa.array(order)
    columns = [pa.concat_arrays([p[j] for p in parts]).take(take) for j in range(len(parts[0]))]
    lsn, seq, ts = columns[1].to_numpy(), columns[2].to_numpy(), columns[5]
    if seq.min() < 0 or not positions_after(lsn[1:], seq[1:], (lsn[:-1], seq[:-1])).all():
        return None
    if span is not None and (
        not positions_after(lsn[:1], seq[:1], span[0], inclusive=True).all()
        or positions_after(lsn[-1:], seq[-1:], span[1]).any()
    ):
        return None
    if any(not _TIMESTAMP.match(t) for t in pc.unique(ts).to_pylist()):
        return None
    n = len(n_all)
    return pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([file], s)).cast(s),
            pa.array((n_all[order] + 2).astype(np.int32)),  # line numbers as in a v1 file: the header is line 1
            *columns,
            pa.nulls(n, s),
            pa.nulls(n, s),
            pa.nulls(n, s),
        ],
        schema=_arrow_schema(),
    )


def _tally(row: dict[str, Any], seen: dict[str, int], names: dict[str, tuple[str, str]]) -> int:
    """Count a decoded row for the file's header check: under its table in ``seen``; returns 1 for
    a reject that names no table (it may have cost any table a change), else 0."""
    if row["src_table"] is not None:
        t = f"{row['src_schema']}.{row['src_table']}"
        seen[t] = seen.get(t, 0) + 1
        names[t] = (row["src_schema"], row["src_table"])
        return 0
    return 1 if row["reject_reason"] is not None else 0


def _check_place(
    file: str,
    line_no: int,
    raw: bytes,
    row: dict[str, Any],
    span: tuple[ChangePosition, ChangePosition] | None,
    positions: set[tuple[int, int]],
) -> dict[str, Any]:
    """A decoded row stays only if its position is inside the file's span and not taken twice."""
    pos = (row["commit_lsn"], row["seq"])
    problem = None
    if span is not None and not (span[0] <= ChangePosition(*pos) <= span[1]):
        problem = f"position {ChangePosition(*pos)} is outside the file's range {span[0]}..{span[1]}"
    elif pos in positions:
        problem = f"position {ChangePosition(*pos)} appears twice in the file"
    if problem is None:
        positions.add(pos)
        return row
    bad = reject_row(file, line_no, raw.decode("utf-8", "backslashreplace"), problem)
    bad.update(src_schema=row["src_schema"], src_table=row["src_table"], commit_lsn=pos[0], seq=pos[1], ts=row["ts"])
    return bad


def _decode_line(file: str, line_no: int, raw: bytes) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return reject_row(file, line_no, raw.decode("utf-8", "backslashreplace"), f"not UTF-8: {exc}")
    if line_no == 1:
        header = parse_header(line)
        if header is not None:
            return {"op": "header", "header": header}
    try:
        rec = ChangeRecord.from_json(line)
    except (ValueError, KeyError, TypeError) as exc:
        return reject_row(file, line_no, line, f"undecodable change record: {exc}")
    return _record_to_row(file, line_no, rec, line)


def _record_to_row(file: str, line_no: int, rec: ChangeRecord, line: str) -> dict[str, Any] | None:
    """A decoded record's row (None for a commit marker), or its reject with ``line`` as raw text."""
    if rec.op == COMMIT:
        return None
    problem = _invalid_position(rec)
    shape = None
    if problem is None and rec.op != "X":
        shape = _shape_of(rec)
        problem = shape.problem
    if problem:
        return reject_row(file, line_no, line, problem, rec)
    if shape is None:  # op X
        return reject_row(
            file,
            line_no,
            rec.raw if rec.raw is not None else line,
            f"quarantined before landing (capture or import): {rec.reason}",
            rec,
        )
    return record_row(file, line_no, rec, shape)


_TIMESTAMP = re.compile(r"^\d{4,}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([+-]\d{2}(:?\d{2})?|Z)?\Z")
# PostgreSQL's NAMEDATALEN - 1: no real schema, table or column name is longer.
_MAX_NAME_BYTES = 63


def _invalid_position(rec: ChangeRecord) -> str | None:
    """The checks of a record's own values (position, commit time), before its shape's."""
    if rec.commit_lsn < 0 or rec.seq < 0 or rec.commit_lsn >= 1 << 63:
        return f"position {rec.commit_lsn}#{rec.seq} is not a valid change position"
    ts = rec.ts
    ok = _TS_SEEN.get(ts)  # a transaction's records share their commit time
    if ok is None:
        if len(_TS_SEEN) >= _SHAPES_MAX:
            _TS_SEEN.clear()
        ok = _TS_SEEN[ts] = bool(_TIMESTAMP.match(ts))
    if not ok:
        return f"commit timestamp {ts[:60]!r} is not a timestamp"
    return None


_TS_SEEN: dict[str, bool] = {}


def _case_clash(names: list[str]) -> tuple[str, str] | None:
    """Two column names whose lake names are equal but for case (PostgreSQL's quoted identifiers
    tell "Value" and value apart; Spark's and Iceberg's case-insensitive resolution cannot)."""
    seen: dict[str, str] = {}
    for name in names:
        folded = lake_column(name).casefold()
        if folded in seen:
            return seen[folded], name
        seen[folded] = name
    return None


def _shape_problem(rec: ChangeRecord, names: list[str], key_names: list[str]) -> str | None:
    """The checks that depend on the record's shape only (see _Shape)."""
    if not rec.schema or not rec.table:
        return f"{OPERATIONS[rec.op]} record without schema and table"
    # (A name of at most 15 characters fits in 63 bytes of UTF-8: most skip the encode.)
    too_long = [n for n in (rec.schema, rec.table, *names) if len(n) > 15 and len(n.encode("utf-8")) > _MAX_NAME_BYTES]
    if too_long:
        return f"name longer than PostgreSQL allows ({_MAX_NAME_BYTES} bytes): {too_long[0][:80]!r}"
    if rec.op in ("I", "U", "R") and not names:
        return f"{OPERATIONS[rec.op]} without column values"
    if rec.op == "D" and not key_names:
        return "delete without the old key (replica identity): cannot tell which row went"
    if len(set(names)) != len(names):
        return "a column appears twice in one change"
    clash = _case_clash(names)
    if clash:
        return (
            f"columns {clash[0]!r} and {clash[1]!r} differ only in case: the lake's engines (Spark, most BI "
            "tools) resolve column names case-insensitively and cannot hold both; rename one at the source, "
            f"then 'loader resync --table {rec.schema}.{rec.table}'"
        )
    if len(set(key_names)) != len(key_names):
        return "a column appears twice in the old key"
    if rec.op in ("I", "U", "R") and rec.pk and not set(rec.pk) <= set(names):
        missing = sorted(set(rec.pk) - set(names))
        return f"key column {missing[0]!r} missing from the change"
    return None


def make_decoder(settings_json: str, batch_rows: int = 20_000) -> Any:
    """The mapInArrow function: batches of landing_file names in, change rows out."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:

        from loader.config import LoaderSettings
        from loader.landing.store import LandingFile, open_landing

        settings = LoaderSettings.model_validate_json(settings_json)
        store = open_landing(settings)
        schema = _arrow_schema()
        buf: list[dict[str, Any]] = []
        # The rows (dicts of lists) are acyclic and freed by reference counting; the cyclic
        # collector would only walk them, again and again as a batch grows: a quarter of the
        # decoding time. Off while this task decodes (the worker runs nothing else meanwhile).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for batch in batches:
                for name in batch.column(0).to_pylist():
                    parsed = LandingFile.parse(name)
                    first_lsn = parsed.first.commit_lsn if parsed is not None else 0
                    span = (parsed.first, parsed.last) if parsed is not None else None
                    # Read errors (after the store's retries) propagate: the task, and the load, fail.
                    data = store.open_bytes(name)
                    fmt = format_of(name)
                    plain = (
                        plain_change_rows(name, data, span)
                        if fmt == CHANGES
                        else plain_table_rows(name, data, span)
                        if fmt == TABLES
                        else None
                    )
                    if plain is not None:
                        yield plain
                        continue
                    for row in decode_file(name, data, first_lsn, span, store.max_decompressed):
                        buf.append(row)
                        if len(buf) >= batch_rows:
                            yield rows_to_batch(buf, schema)
                            buf = []
            if buf:
                yield rows_to_batch(buf, schema)
        finally:
            if was_enabled:
                gc.enable()

    return decode


def rows_to_batch(rows: list[dict[str, Any]], schema: Any) -> Any:
    """Change rows -> one Arrow RecordBatch, column by column (several times faster than
    ``RecordBatch.from_pylist``, which converts row by row).

    The rows are transposed in C (itemgetter, zip). Name lists shared by many rows (a shape's, see
    record_row) are converted once each and repeated by an Arrow ``take``.
    """
    import pyarrow as pa

    columns = list(zip(*map(itemgetter(*schema.names), rows))) if rows else [() for _ in schema.names]
    arrays = [
        _shared_lists(values, f.type) if f.name in _SHARED_LISTS else pa.array(values, type=f.type)
        for f, values in zip(schema, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# Columns whose values are usually one of a few list objects (record_row).
_SHARED_LISTS = frozenset({"col_names", "col_types", "key_names", "key_types", "pk"})


def _shared_lists(values: tuple[Any, ...], arrow_type: Any) -> Any:
    import pyarrow as pa

    index: dict[int, int] = {}
    distinct: list[Any] = []
    positions = []
    for v in values:
        i = index.get(id(v))  # the rows hold every value, so no id is reused meanwhile
        if i is None:
            i = index[id(v)] = len(distinct)
            distinct.append(v)
        positions.append(i)
    return pa.array(distinct, type=arrow_type).take(pa.array(positions, type=pa.int32()))


def _arrow_schema() -> Any:
    import pyarrow as pa

    s, i64, i32 = pa.string(), pa.int64(), pa.int32()
    ls = pa.list_(s)
    return pa.schema(
        [
            ("landing_file", s),
            ("line", i32),
            ("op", s),
            ("commit_lsn", i64),
            ("seq", i64),
            ("change_lsn", i64),
            ("xid", i64),
            ("ts", s),
            ("src_schema", s),
            ("src_table", s),
            ("col_names", ls),
            ("col_types", ls),
            ("col_values", ls),
            ("key_names", ls),
            ("key_types", ls),
            ("key_values", ls),
            ("pk", ls),
            ("note", s),
            ("reject_reason", s),
            ("raw", s),
        ]
    )
