"""Columnar decoding of wal2json format-version 2 rows: a block of rows in, an Arrow batch of
landing v2 records out, with no Python object per row or value.

Capture's row decoder (:class:`loader.capture.wal2json.Wal2JsonDecoder`) costs about 10 us of
Python per row, several times what PostgreSQL spends decoding the row. Most of a stream is plain:
begins, commits, inserts, updates and deletes whose values are strings, numbers, booleans or
null. A block of such rows is read here into the change-file columns directly: by the compiled
parser (``_wal2json.c``: one pass of C over the bytes into Arrow's buffers, about 0.6 us a 500-byte
row) where the install built it, else by Arrow's JSON reader (about 3.4 us with the quoting below).
The transaction bookkeeping (commit position, sequence numbers, commit time, the slot's confirm
position) is done on whole columns with numpy.

The compiled parser keeps a bare number or boolean as the text wal2json printed. Arrow's JSON
reader types a field once per block, and wal2json prints numbers and booleans bare
(``"value":12.50``), strings quoted: for it, before the read, every bare value is quoted
(:func:`quote_bare_values`, on whole numpy arrays of the block's bytes), so a value arrives as its
exact source text: numeric digits, exponent and all, as the row decoder keeps them. Only values of
the ``value`` key are quoted: inside a JSON string every quote is escaped, so ``"value":`` never
occurs there.

Anything else (logical messages, truncates, a JSON object as a value, invalid UTF-8, a row of
another shape, a transaction out of order) makes :func:`decode_block` return None, and the block
goes through the row decoder, which knows every case. Both give the same records (tested).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loader.capture.wal2json import Wal2JsonDecoder
from loader.landing import changefile
from loader.landing.records import OpenTransaction

log = logging.getLogger("loader.capture")

# What quote_bare_values quotes, as a regular expression (its specification; tested against it).
BARE_VALUE = r'"value":(-?[0-9][0-9.eE+-]*|true|false)'
QUOTED_VALUE = r'"value":"\1"'
_ACTIONS = ("B", "C", "I", "U", "D")
# The compiled parser's column of each row's shape number (see ``_wal2json.c``), after the schema's.
SHAPE_COLUMN = "shape"


def _row_schema() -> Any:
    import pyarrow as pa

    s = pa.string()
    column = pa.struct([("name", s), ("type", s), ("value", s)])
    key = pa.struct([("name", s), ("type", s)])
    return pa.schema(
        [
            ("action", s),
            ("xid", pa.int64()),
            ("timestamp", s),
            ("lsn", s),
            ("nextlsn", s),
            ("schema", s),
            ("table", s),
            ("columns", pa.list_(column)),
            ("identity", pa.list_(column)),
            ("pk", pa.list_(key)),
        ]
    )


@dataclass
class Block:
    """A block of rows decoded: the records, and what the decoder's state becomes after them.

    ``batch``: the records (changes and commit markers, in order; decoded v2 schema).
    ``txn``: each record's transaction in this block (0: the one open when the block began).
    ``confirm``: the slot's confirm position after each record's row (0: none yet).
    """

    batch: Any
    txn: Any
    confirm: Any
    carried: bool  # record transaction 0 continues one open before the block
    txns: int  # transactions the block touches, 0 included (the last is the one open after it)
    state: OpenTransaction | None
    confirm_lsn: int | None
    # Each record's shape number from the compiled parser (rows of one number share their table and
    # shape; commit markers have numbers of their own), None without it: landing v3's split.
    shapes: Any = None

    def accept(self, decoder: Wal2JsonDecoder) -> None:
        """Move ``decoder`` past the block, as feeding its rows one by one would."""
        decoder.txn = self.state
        decoder.confirm_lsn = self.confirm_lsn


# Rows of the kinds the columnar decoder leaves to the row decoder (logical messages, truncates).
# wal2json starts every row with its action, and a JSON string holds no bare quote, so these bytes
# only ever start such a row.
_SPECIAL_ROW = re.compile(rb'\{"action":"[MT]"')


def runs(data: bytes) -> Iterator[tuple[bytes, bool]]:
    """``data`` (whole rows) cut around its message and truncate rows: (rows, plain) in order,
    where ``plain`` runs hold none of them (a non-plain run is one such row)."""
    at = 0
    n = len(data)
    while at < n:
        found = _SPECIAL_ROW.search(data, at)  # one pass for both kinds
        if found is None:
            yield data[at:], True
            return
        # The line it is on (wal2json prints one row a line; a line that holds more is the row
        # decoder's to refuse whole, not to be cut in two runs).
        special = data.rfind(b"\n", at, found.start()) + 1 or at
        if special > at:
            yield data[at:special], True
        end = data.find(b"\n", special) + 1 or n
        yield data[special:end], False
        at = end


def commit_end(data: bytes) -> int:
    """Where the row after the first commit row of ``data`` starts (its length if none)."""
    start = data.find(b'{"action":"C"')
    if start < 0:
        return len(data)
    return data.find(b"\n", start) + 1 or len(data)


@functools.cache
def _byte_classes() -> tuple[Any, Any]:
    import numpy as np

    first = np.zeros(256, bool)  # the first byte of a match
    first[list(b"-0123456789tf")] = True
    number = np.zeros(256, bool)  # the bytes of a number
    number[list(b"0123456789.eE+-")] = True
    return first, number


# quote_bare_values works on pieces of about this many bytes (whole rows): its numpy temporaries,
# a few times a piece, stay small beside the block whatever the block's size.
_QUOTE_PIECE = 1 << 19


def quote_bare_values(data: bytes) -> Any:
    """``data`` (wal2json rows) with every bare number or boolean of a ``value`` key quoted, exactly
    as replacing ``BARE_VALUE`` with ``QUOTED_VALUE`` would (an Arrow buffer), three times faster
    than RE2's replacement, which scanned every byte for the pattern (a quarter of capture's
    decoding). Rows are taken a piece of about ``_QUOTE_PIECE`` bytes at a time (a match never
    spans rows), each piece's result copied into Arrow's memory before the next."""
    import pyarrow as pa

    view = memoryview(data)
    sink = pa.BufferOutputStream()  # Arrow's memory: each piece is copied once, then freed
    at = 0
    while at < len(data):
        end = data.find(b"\n", at + _QUOTE_PIECE) + 1 or len(data)
        sink.write(_quoted(view[at:end]))
        at = end
    return sink.getvalue()


def _quoted(view: memoryview) -> Any:
    """One piece of :func:`quote_bare_values`: the piece itself when nothing needs quoting, else a
    numpy array of its bytes with the quotes inserted. The colons are found in one vectorized pass;
    those before a match's first byte and after ``"value"`` are kept; the numbers' ends are found
    by stepping all of them at once."""
    import numpy as np

    first, number_byte = _byte_classes()
    n = len(view)
    a = np.frombuffer(view, np.uint8)
    colons = np.flatnonzero(a[7 : n - 1] == ord(":")) + 7  # room for '"value"' before, a byte after
    colons = colons[first[a[colons + 1]]]
    keyed = np.ones(len(colons), bool)
    for k, byte in enumerate(b'"value"'):
        keyed &= a[colons - 7 + k] == byte
    starts = colons[keyed] + 1
    last = n - 1  # reads past the end read the last byte instead: it cannot complete a match there

    def at(offset: int, where: Any = None) -> Any:
        return a[np.minimum((starts if where is None else starts[where]) + offset, last)]

    lead = a[starts]
    ends = starts + 1
    matched = (lead != ord("-")) | ((at(1) >= ord("0")) & (at(1) <= ord("9")))
    for word in (b"true", b"false"):
        which = np.flatnonzero(lead == word[0])
        spelled = np.ones(len(which), bool)
        for k, byte in enumerate(word[1:], 1):
            spelled &= at(k, which) == byte
        matched[which] = spelled
        ends[which] += len(word) - 1
    if not matched.any():
        return view
    starts, ends, lead = starts[matched], ends[matched], lead[matched]
    moving = np.flatnonzero((lead != ord("t")) & (lead != ord("f")))
    while len(moving):
        moving = moving[ends[moving] < n]
        moving = moving[number_byte[a[ends[moving]]]]
        ends[moving] += 1
    quotes = np.empty(2 * len(starts), np.int64)
    quotes[0::2], quotes[1::2] = starts, ends
    return np.insert(a, quotes, ord('"'))


def rows_at(table: Any, index: Any) -> Any:
    """The rows of Arrow ``table`` (or record batch) at the increasing positions ``index``: the
    runs of consecutive positions copied range by range when they are few (a block's rows but
    its begin markers, say), a take otherwise (which gathers value by value: several times the
    CPU on nested columns)."""
    import numpy as np
    import pyarrow as pa

    if len(index) == table.num_rows:
        return table
    if not len(index):
        return table.slice(0, 0)
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    if len(breaks) > 64:
        return table.take(pa.array(index))
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(index)]])
    parts = [table.slice(int(index[a]), int(e - a)) for a, e in zip(starts, ends, strict=True)]
    if isinstance(table, pa.RecordBatch):
        return pa.concat_batches(parts)
    return pa.concat_tables(parts).combine_chunks()


def valid_utf8(data: bytes) -> bool:
    """Whether ``data`` is UTF-8, checked by Arrow where it lies (decoding it to a str would copy
    the block into Python's memory)."""
    import numpy as np
    import pyarrow as pa

    offsets = pa.py_buffer(np.array([0, len(data)], np.int64))
    try:
        pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def read_rows(data: bytes) -> Any | None:
    """The rows of ``data`` (newline-terminated wal2json rows) as an Arrow table, or None when
    they are not all of the plain shape (see the module docstring): by the compiled parser where it
    was built, else by Arrow's JSON reader."""
    parser = compiled_parser()
    if parser is not None:
        parsed = parser(data)
        if parsed is None:
            log.debug("a block of %d bytes goes row by row: not of the plain shape", len(data))
            return None
        return _rows_from_buffers(parsed)
    return read_rows_arrow(data)


@functools.cache
def compiled_parser() -> Any | None:
    """``loader.capture._wal2json.parse`` (wal2json rows straight into column buffers, in C), or
    None where the extension was not built (an install without a C compiler) or
    ``LOADER_CAPTURE_PARSER=arrow`` asks for Arrow's JSON reader."""
    import os

    if os.environ.get("LOADER_CAPTURE_PARSER", "").lower() == "arrow":
        return None
    try:
        from loader.capture import _wal2json  # type: ignore[attr-defined]
    except ImportError:
        log.debug("the compiled wal2json parser is not built: capture uses Arrow's JSON reader")
        return None
    parse: Any = _wal2json.parse
    return parse


def _rows_from_buffers(parsed: Any) -> Any:
    """The compiled parser's buffers as the table :func:`read_rows_arrow` reads (``_row_schema``)."""
    import pyarrow as pa

    n, (xid, xid_valid, xid_nulls), strings, lists, shapes = parsed
    schema = _row_schema()

    def strings_of(count: int, column: Any) -> Any:
        offsets, data, valid, nulls = column
        bitmap = pa.py_buffer(valid) if nulls else None
        return pa.Array.from_buffers(
            pa.string(), count, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
        )

    def list_of(field: Any, column: Any) -> Any:
        offsets, valid, nulls, *children = column
        item = field.type.value_type
        entries = len(children[0][0]) // 4 - 1  # the names' offsets: one more than the entries
        struct = pa.StructArray.from_arrays(
            [strings_of(entries, child) for child in children if child is not None], fields=list(item)
        )
        bitmap = pa.py_buffer(valid) if nulls else None
        return pa.Array.from_buffers(
            field.type, n, [bitmap, pa.py_buffer(offsets)], null_count=nulls, children=[struct]
        )

    action, timestamp, lsn, nextlsn, schema_name, table = (strings_of(n, c) for c in strings)
    xids = pa.Array.from_buffers(
        pa.int64(), n, [pa.py_buffer(xid_valid) if xid_nulls else None, pa.py_buffer(xid)], null_count=xid_nulls
    )
    columns, identity, pk = (
        list_of(schema.field(name), c) for name, c in zip(("columns", "identity", "pk"), lists, strict=True)
    )
    shape = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(shapes)])
    return pa.Table.from_arrays(
        [action, xids, timestamp, lsn, nextlsn, schema_name, table, columns, identity, pk, shape],
        schema=schema.append(pa.field(SHAPE_COLUMN, pa.int32(), nullable=False)),
    )


def read_rows_arrow(data: bytes) -> Any | None:
    """:func:`read_rows` by Arrow's JSON reader, after quoting bare values."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not valid_utf8(data):  # Arrow's reader does not check; the row decoder quarantines such rows
        return None
    quoted = quote_bare_values(data)
    try:
        return pj.read_json(
            pa.BufferReader(quoted),
            read_options=pj.ReadOptions(block_size=max(1 << 20, quoted.size + 1024)),  # one block
            parse_options=pj.ParseOptions(explicit_schema=_row_schema(), unexpected_field_behavior="error"),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        # Not a failure: the row decoder takes the block and says (or quarantines) what it holds.
        log.debug("a block of %d bytes goes row by row: %s", len(data), str(exc)[:200])
        return None


def decode_block(data: bytes, decoder: Wal2JsonDecoder) -> Block | None:
    """The records of a block of rows that follows what ``decoder`` has been fed; None when the
    block is not plain. Does not change ``decoder`` (see :meth:`Block.accept`)."""
    if decoder.holds_messages:
        return None  # an open transaction carries messages its commit must act on
    rows = read_rows(data)
    if rows is None or rows.num_rows == 0:
        return None
    try:
        return _records(rows.combine_chunks(), decoder.txn, decoder.confirm_lsn)
    except ValueError as exc:
        log.debug("a block of %d bytes goes row by row: %s", len(data), exc)
        return None  # a position that is not an LSN: the row decoder says which


def _records(rows: Any, open_txn: OpenTransaction | None, confirm_lsn: int | None) -> Block | None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = rows.num_rows
    action = rows.column("action")
    if action.null_count:
        return None
    is_ = {a: pc.equal(action, a).to_numpy(zero_copy_only=False) for a in _ACTIONS}
    begin, commit = is_["B"], is_["C"]
    change = is_["I"] | is_["U"] | is_["D"]
    if int(begin.sum() + commit.sum() + change.sum()) != n:
        return None  # a message, a truncate or an unknown action
    # Transactions well nested: a begin outside one, everything else inside one.
    opened = np.cumsum(begin, dtype=np.int64)
    depth_before = (1 if open_txn is not None else 0) + opened - begin - np.cumsum(commit, dtype=np.int64) + commit
    if not (depth_before == np.where(begin, 0, 1)).all():
        return None
    begins = np.flatnonzero(begin)
    if len(begins):
        b = rows.take(pa.array(begins))
        if b.column("lsn").null_count or b.column("nextlsn").null_count or b.column("timestamp").null_count:
            return None
        b_commit = lsn_array(b.column("lsn"))
        b_end = lsn_array(b.column("nextlsn"))
        b_xid = b.column("xid").fill_null(0).to_numpy()
        b_ts = b.column("timestamp").to_pylist()
    else:
        b_commit = b_end = b_xid = np.zeros(0, np.uint64)
        b_ts = []
    t0 = open_txn or OpenTransaction(xid=0, commit_lsn=0, ts="")
    txn_commit = np.concatenate([[np.uint64(t0.commit_lsn)], b_commit.astype(np.uint64)])
    txn_end = np.concatenate([[np.uint64(t0.end_lsn)], b_end.astype(np.uint64)])
    txn_xid = np.concatenate([[t0.xid], b_xid]).astype(np.int64)
    txn_ts = pa.array([t0.ts, *b_ts], pa.string())
    # Sequence numbers: a transaction's changes count from where it stood (0 for a new one).
    changes_after = np.cumsum(change, dtype=np.int64)
    start = np.concatenate([[0], changes_after[begins]])
    base = np.concatenate([[t0.seq], np.zeros(len(begins), np.int64)])
    seq_row = changes_after - start[opened] + base[opened]
    ends_at = np.where(commit, txn_end[opened].astype(np.int64), 0)
    confirm_row = np.maximum.accumulate(np.maximum(ends_at, confirm_lsn or 0))

    out = np.flatnonzero(change | commit)
    if len(out) and rows.column("schema").take(pa.array(np.flatnonzero(change))).null_count:
        return None
    if rows.column("table").take(pa.array(np.flatnonzero(change))).null_count:
        return None
    recs = rows_at(rows, out)
    k = opened[out]
    is_commit = commit[out]
    change_lsn = np.where(is_commit, 0, lsn_array(recs.column("lsn").fill_null("0/0")).astype(np.int64))
    text = pa.string()
    batch = pa.RecordBatch.from_arrays(
        [
            recs.column("action").combine_chunks(),
            pa.array(txn_commit[k], pa.uint64()),
            pa.array(seq_row[out] + is_commit, pa.int64()),
            pa.array(txn_xid[k], pa.int64()),
            txn_ts.take(pa.array(k)),
            pa.array(change_lsn, pa.int64()),
            recs.column("schema").fill_null("").combine_chunks(),
            recs.column("table").fill_null("").combine_chunks(),
            _entries(recs.column("columns").combine_chunks()),
            _entries(recs.column("identity").combine_chunks()),
            _key_names(recs.column("pk").combine_chunks()),
            pa.nulls(len(out), text),
            pa.nulls(len(out), text),
        ],
        schema=changefile.arrow_schema(),
    )
    last = int(opened[-1])
    still_open = depth_before[-1] + begin[-1] - commit[-1] == 1
    state = None
    if still_open:
        state = OpenTransaction(
            xid=int(txn_xid[last]),
            commit_lsn=int(txn_commit[last]),
            ts=txn_ts[last].as_py(),
            end_lsn=int(txn_end[last]),
            seq=int(seq_row[-1]),
        )
    final_confirm = int(confirm_row[-1]) or None
    shapes = rows.column(SHAPE_COLUMN).to_numpy()[out] if SHAPE_COLUMN in rows.column_names else None
    return Block(
        batch=batch,
        txn=k,
        confirm=confirm_row[out],
        carried=open_txn is not None,
        txns=last + 1,
        state=state,
        confirm_lsn=final_confirm if final_confirm is not None else confirm_lsn,
        shapes=shapes,
    )


def _empty_nulls(lists: Any) -> Any:
    """A list array with null lists as empty ones (wal2json leaves ``identity`` out of inserts)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not lists.null_count:
        return lists
    lengths = pc.list_value_length(lists).fill_null(0)
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(lengths.to_numpy(), out=offsets[1:])
    values = pc.list_flatten(lists)  # the values of non-null lists only
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _entries(lists: Any) -> Any:
    """wal2json's ``columns``/``identity`` lists as the file's entries: bytea values in
    PostgreSQL's text form (wal2json prints bare hex; ``::text`` starts with ``\\x``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = _empty_nulls(lists)
    flat = pc.list_flatten(lists)
    names, types, values = flat.field("name"), flat.field("type"), flat.field("value")
    if names.null_count or types.null_count:
        raise ValueError("a column without name or type")
    bare = pc.and_kleene(pc.equal(types, "bytea"), pc.invert(pc.starts_with(values, "\\x")))
    if pc.any(bare).as_py():
        values = pc.if_else(bare, pc.binary_join_element_wise("\\x", values, ""), values)
    item = changefile.arrow_schema().field("columns").type
    struct = pa.StructArray.from_arrays([names, types, values], fields=list(item.value_type))
    offsets = pc.subtract(lists.offsets, lists.offsets[0])
    return pa.ListArray.from_arrays(offsets, struct, type=item)


def _key_names(lists: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = _empty_nulls(lists)
    names = pc.list_flatten(lists).field("name")
    if names.null_count:
        raise ValueError("a key column without a name")
    offsets = pc.subtract(lists.offsets, lists.offsets[0])
    return pa.ListArray.from_arrays(offsets, names, type=changefile.arrow_schema().field("pk").type)


@functools.cache
def _hex_digits() -> Any:
    """Byte -> hex digit value (255: not a hex digit)."""
    import numpy as np

    table = np.full(256, 255, np.uint8)
    for i, ch in enumerate(b"0123456789abcdef"):
        table[ch] = i
    for i, ch in enumerate(b"ABCDEF"):
        table[ch] = 10 + i
    return table


def lsn_array(texts: Any) -> Any:
    """PostgreSQL LSN texts (``X/Y``, hex) as uint64 numbers; ValueError when one is not an LSN."""
    import numpy as np
    import pyarrow.compute as pc

    n = len(texts)
    if n == 0:
        return np.zeros(0, np.uint64)
    if texts.null_count or not pc.all(pc.match_substring_regex(texts, r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$")).as_py():
        raise ValueError("not an LSN")
    parts = pc.split_pattern(texts, "/", max_splits=1)
    out = np.zeros(n, np.uint64)
    for i in (0, 1):
        half = pc.utf8_lpad(pc.list_element(parts, i), 8, "0")
        if hasattr(half, "combine_chunks"):
            half = half.combine_chunks()
        first = int(np.frombuffer(half.buffers()[1], np.int32)[half.offset])
        raw = np.frombuffer(half.buffers()[2], np.uint8)[first : first + 8 * n].reshape(n, 8)
        digits = _hex_digits()[raw].astype(np.uint64)
        value = np.zeros(n, np.uint64)
        for j in range(8):
            value = (value << np.uint64(4)) | digits[:, j]
        out = (out << np.uint64(32)) | value
    return out
