"""Landing format v3 for the change stream: each table's changes in columns (``schemas/landing-change.v3.md``).

A file covers one position range, as v1 and v2 change files do (its name, the load's ledger,
exactly-once and salvage work as there). Its body is a sequence of *segments*, each a whole Arrow
IPC stream (zstd):

- a *rows* segment holds one table's plain changes (insert, update, delete: no note, no raw text)
  of one block, in file order. Its *layout* lists the columns its rows have, each a (name,
  PostgreSQL type), and the old-key columns, and the row *shapes*: an operation, the record's
  columns and old-key columns (indices into those lists, in the record's order) and key names.
  A column per source column holds the values in PostgreSQL's text form (null: SQL NULL, or a
  column the row's shape lacks, such as an unchanged TOAST value: absent stays distinct from
  NULL), a column per old-key column the old key's values; besides them each row's ordinal in the
  file (``n``), position (``lsn``, ``seq``), ``xid``, commit time (``ts``, dictionary-encoded),
  ``change_lsn`` and ``shape`` (its shape's number);
- a *records* segment holds every other record (commit markers, control records, truncates,
  quarantined input) in the v2 schema (:mod:`loader.landing.changefile`) with ``n`` in front.

The header is the first segment: a stream without columns whose schema metadata holds the JSON
header: v2's counts (records of each table, commit markers not counted; records in all) and the
segments in file order, each with its byte length, rows, first and last ordinal and position, and
for a rows segment its table and layout. So the load reads a table's columns in position order
without parsing a record, flattening name/type/value structs or sorting, a file cut short still
names every table and count it held, and it keeps every record before the first ordinal of its
first lost segment (:func:`salvage`).

A block closes every ``BATCH_RECORDS`` records, or sooner at the record that brings its texts to
``BLOCK_TEXT_BYTES``; its segments are written then (each table's rows in the order of its first
record, then the other records; shapes and columns numbered in order of first appearance): the
bytes depend on the records only, whether they came one by one or as Arrow blocks with or without
capture's shape numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from loader.landing import changefile
from loader.landing.arrowfile import COMPRESSION, METADATA_KEY
from loader.landing.records import COMMIT, HEADER, ChangeRecord, Column

FORMAT_VERSION = 3
FORMAT = "tables"
EXTENSION = ".tables.arrow"
# A block closes after this many records, or after the record that brings its texts (every column's
# and old-key column's name, type and value, and quarantined raw text: :func:`record_texts`) to
# BLOCK_TEXT_BYTES: the unit of damage, and what capture holds of a file at a time. Each segment
# costs its own framing, read and typing calls: at 8,192 records a block, a 1M-change load spent a
# third of its CPU on them (docs/performance-log.md, twenty-seventh round).
BATCH_RECORDS = 131072
BLOCK_TEXT_BYTES = 32 << 20
# A table with fewer plain changes than this in a block keeps them in the block's records segment
# (v2's layout): a segment costs about 2 KB of framing and its own write and read, so a block
# spread over thousands of tables would otherwise grow tenfold and more.
MIN_SEGMENT_ROWS = 256
PLAIN_OPS = ("I", "U", "D")


# --- the header --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowShape:
    """What the rows of one shape of a rows segment share: the operation, the record's columns and
    old-key columns (in the record's order, as indices into the segment's columns and old-key
    columns) and its key names."""

    op: str
    columns: tuple[int, ...]
    identity: tuple[int, ...]
    pk: tuple[str, ...]

    def to_doc(self) -> dict[str, Any]:
        return {"op": self.op, "columns": list(self.columns), "identity": list(self.identity), "pk": list(self.pk)}

    @classmethod
    def from_doc(cls, d: Any, columns: int, identity: int) -> RowShape:
        def indices(key: str, k: int) -> tuple[int, ...]:
            v = d.get(key)
            if (
                not isinstance(v, list)
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < k for x in v)
                or len(set(v)) != len(v)
            ):
                raise ValueError(f"a shape's '{key}' must be distinct indices of the segment's {key}")
            return tuple(v)

        if not isinstance(d, dict) or d.get("op") not in PLAIN_OPS:
            raise ValueError("a shape names a plain operation")
        pk = d.get("pk")
        if not isinstance(pk, list) or not all(isinstance(k, str) for k in pk):
            raise ValueError("a shape's 'pk' must be a list of names")
        return cls(d["op"], indices("columns", columns), indices("identity", identity), tuple(pk))


@dataclass(frozen=True)
class Layout:
    """The columns of a rows segment: one table's changes of a block. ``columns`` and ``identity``
    are the (name, PostgreSQL type) of ``v0..vK`` and ``o0..oM``, every column any of its rows
    has (a name twice when a record has it twice); ``shapes`` what each row's ``shape`` code
    stands for. A column a row's shape does not hold is null in that row."""

    schema: str
    table: str
    columns: tuple[tuple[str, str], ...]
    identity: tuple[tuple[str, str], ...]
    shapes: tuple[RowShape, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_doc(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "columns": [list(c) for c in self.columns],
            "identity": [list(c) for c in self.identity],
            "shapes": [s.to_doc() for s in self.shapes],
        }

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> Layout:
        def pairs(v: Any) -> tuple[tuple[str, str], ...]:
            if not isinstance(v, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in v
            ):
                raise ValueError("segment columns must be [name, type] pairs")
            return tuple((p[0], p[1]) for p in v)

        schema, table, shapes = d.get("schema"), d.get("table"), d.get("shapes")
        if not isinstance(schema, str) or not isinstance(table, str):
            raise ValueError("a rows segment names its table")
        columns, identity = pairs(d.get("columns")), pairs(d.get("identity"))
        if not isinstance(shapes, list) or not shapes or len(shapes) > SHAPES_MAX:
            raise ValueError(f"a rows segment lists 1 to {SHAPES_MAX} shapes")
        return cls(
            schema, table, columns, identity, tuple(RowShape.from_doc(s, len(columns), len(identity)) for s in shapes)
        )

    def arrow_schema(self) -> Any:
        import pyarrow as pa

        return pa.schema(
            _position_fields()
            + [pa.field("shape", pa.int16(), nullable=False)]
            + [pa.field(f"v{i}", pa.string()) for i in range(len(self.columns))]
            + [pa.field(f"o{i}", pa.string()) for i in range(len(self.identity))]
        )

    def record_columns(self, shape: RowShape) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(columns, old-key columns) of a row of ``shape``, as its record lists them."""
        return [self.columns[u] for u in shape.columns], [self.identity[u] for u in shape.identity]


# The column of a rows segment's first value (after the position fields and ``shape``).
VALUES_AT = 7
# Shapes a rows segment may list (its ``shape`` column is int16).
SHAPES_MAX = 1 << 15


def _position_fields() -> list[Any]:
    import pyarrow as pa

    return [
        pa.field("n", pa.int32(), nullable=False),
        pa.field("lsn", pa.uint64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("xid", pa.int64(), nullable=False),
        pa.field("ts", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("change_lsn", pa.int64(), nullable=False),
    ]


def records_schema() -> Any:
    """A records segment's columns: ``n``, then v2's (as v2 files store them)."""
    import pyarrow as pa

    return pa.schema([pa.field("n", pa.int32(), nullable=False), *changefile.arrow_schema(stored=True)])


@dataclass(frozen=True)
class SegmentInfo:
    """One segment as the header lists it; ``layout`` None for a records segment."""

    length: int
    rows: int
    n: tuple[int, int]  # first and last ordinal
    first: tuple[int, int]  # (lsn, seq) of its first row
    last: tuple[int, int]
    layout: Layout | None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": "records" if self.layout is None else "rows",
            "length": self.length,
            "rows": self.rows,
            "n": list(self.n),
            "first": list(self.first),
            "last": list(self.last),
        }
        if self.layout is not None:
            doc.update(self.layout.to_doc())
        return doc

    @classmethod
    def from_doc(cls, d: Any) -> SegmentInfo:
        if not isinstance(d, dict) or d.get("kind") not in ("rows", "records"):
            raise ValueError("a segment is 'rows' or 'records'")

        def ints(key: str, k: int) -> tuple[int, ...]:
            v = d.get(key)
            if (
                not isinstance(v, list)
                or len(v) != k
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            ):
                raise ValueError(f"segment '{key}' must be {k} integers")
            return tuple(v)

        length, rows = d.get("length"), d.get("rows")
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            raise ValueError("segment 'length' must be a byte count")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0:
            raise ValueError("segment 'rows' must be a count")
        n, first, last = ints("n", 2), ints("first", 2), ints("last", 2)
        layout = Layout.from_doc(d) if d["kind"] == "rows" else None
        return cls(length, rows, (n[0], n[1]), (first[0], first[1]), (last[0], last[1]), layout)


@dataclass
class TablesHeader:
    """The header of a v3 file: v2's counts (records of each table, commit markers not counted;
    records in all) and the segments in file order."""

    tables: dict[str, int]
    records: int
    segments: list[SegmentInfo] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "op": HEADER,
            "format": FORMAT,
            "tables": self.tables,
            "records": self.records,
            "segments": [s.to_doc() for s in self.segments],
        }

    @classmethod
    def from_doc(cls, doc: Any) -> TablesHeader:
        if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or doc.get("format") != FORMAT:
            raise ValueError("not a landing v3 change-file header")
        base = changefile.ChangeHeader.from_doc({**doc, "v": changefile.FORMAT_VERSION, "format": changefile.FORMAT})
        segments = doc.get("segments")
        if not isinstance(segments, list):
            raise ValueError("header 'segments' must be a list")
        return cls(base.tables, base.records, [SegmentInfo.from_doc(s) for s in segments])


def _header_bytes(header: TablesHeader) -> bytes:
    import pyarrow as pa

    meta = json.dumps(header.to_doc(), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([], metadata={METADATA_KEY: meta.encode("utf-8")})):
        pass
    return bytes(sink.getvalue().to_pybytes())


# --- writing -----------------------------------------------------------------------------------
# A record's shape as the writer keys it: (op, columns, old-key columns, key names).
_FullShape = tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], tuple[str, ...]]


def _occurrences(pairs: tuple[tuple[str, str], ...]) -> list[tuple[str, str, int]]:
    """Each (name, type) with how many times it came before in ``pairs``: a record with a column
    twice keeps two columns."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for p in pairs:
        k = seen.get(p, 0)
        seen[p] = k + 1
        out.append((p[0], p[1], k))
    return out


@dataclass
class _Rows:
    """A table's rows of a block (one split: :func:`split`): the position columns (``ts`` as text),
    each row's shape as an index into ``shapes``, and the values of each (name, type, occurrence)
    column and old-key column (null where a row's shape lacks it)."""

    schema: str
    table: str
    head: list[Any]
    codes: Any
    shapes: list[_FullShape]
    values: dict[tuple[str, str, int], Any]
    old: dict[tuple[str, str, int], Any]

    @property
    def first_n(self) -> int:
        return int(self.head[0][0].as_py())

    def take(self) -> tuple[Layout, Any]:
        """The segment's layout and every row as one batch of its schema: shapes numbered in order
        of their first row (equal ones merged: numbers finer than the shapes make them), columns in
        order of the first shape holding each."""
        import numpy as np
        import pyarrow as pa

        numbered: dict[_FullShape, int] = {}
        remap = np.array([numbered.setdefault(s, len(numbered)) for s in self.shapes], np.int16)
        if len(numbered) > SHAPES_MAX:
            raise ValueError(f"{self.schema}.{self.table}: more than {SHAPES_MAX} shapes in one block")
        cols: dict[tuple[str, str, int], int] = {}
        ids: dict[tuple[str, str, int], int] = {}
        shapes = []
        for op, c, i, pk in numbered:
            shapes.append(
                RowShape(
                    op,
                    tuple(cols.setdefault(k, len(cols)) for k in _occurrences(c)),
                    tuple(ids.setdefault(k, len(ids)) for k in _occurrences(i)),
                    pk,
                )
            )
        layout = Layout(
            self.schema,
            self.table,
            tuple((n, t) for n, t, _ in cols),
            tuple((n, t) for n, t, _ in ids),
            tuple(shapes),
        )
        # Always concatenated: a copy of exactly the rows (a slice of a larger batch would write
        # its whole buffers, and the bytes would depend on how the records came).
        head = [pa.concat_arrays([a]) for a in self.head]
        head[4] = head[4].dictionary_encode()
        arrays = [*head, pa.array(remap[self.codes]), *(self.values[k] for k in cols), *(self.old[k] for k in ids)]
        return layout, pa.RecordBatch.from_arrays(arrays, schema=layout.arrow_schema())


def _records_batch(ords: Any, batch: Any) -> Any:
    """Records (v2's decoded batch, their ordinals) as one batch of a records segment's schema (v2's
    texts dictionary-encoded)."""
    import pyarrow as pa

    stored = changefile.encode(batch)
    return pa.RecordBatch.from_arrays([ords, *stored.columns], schema=records_schema())


def _segment_info(length: int, batch: Any, layout: Layout | None) -> SegmentInfo:
    """The header's entry of a segment holding ``batch``: rows, first and last ordinal and position."""
    n, lsn, seq = batch.column(0), batch.column("lsn"), batch.column("seq")
    last = batch.num_rows - 1
    return SegmentInfo(
        length,
        batch.num_rows,
        (n[0].as_py(), n[last].as_py()),
        (lsn[0].as_py(), seq[0].as_py()),
        (lsn[last].as_py(), seq[last].as_py()),
        layout,
    )


def _gathered(
    source: Any, starts: Any, codes: Any, shapes: list[tuple[tuple[str, str], ...]]
) -> dict[tuple[str, str, int], Any]:
    """Per column (name, type, occurrence) of the rows' shapes: its values taken from ``source``
    (each row's value sits at its list's start plus the column's place in its shape), null in the
    rows whose shape lacks it. ``starts``: each row's list start; ``codes``: each row's shape."""
    import numpy as np
    import pyarrow as pa

    uses: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for s, columns in enumerate(shapes):
        for j, k in enumerate(_occurrences(columns)):
            uses.setdefault(k, []).append((s, j))
    out = {}
    for k, at_shape in uses.items():
        if len(at_shape) == len(shapes) and len({j for _, j in at_shape}) == 1:
            out[k] = source.take(pa.array(starts + at_shape[0][1]))  # every row, one place
            continue
        where = np.full(len(starts), -1, np.int64)
        for s, j in at_shape:
            sel = codes == s
            where[sel] = starts[sel] + j
        out[k] = source.take(pa.array(where, mask=where < 0))
    return out


def split(batch: Any, ords: Any, hint: Any, min_rows: int = 0) -> tuple[Any, list[_Rows]]:
    """``batch`` (v2's decoded schema; ``ords``: its records' ordinals; ``hint``: shape numbers or
    None) taken apart: (the indices of the records for a records segment, in order: every record
    that is not a plain change, and the plain changes of tables with fewer than ``min_rows`` of
    them), and each other table's rows, in order of their first record."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ops = batch.column(0)
    plain = pc.and_(
        pc.is_in(ops, value_set=pa.array(PLAIN_OPS)),
        pc.and_(pc.equal(pc.fill_null(batch.column(11), ""), ""), pc.is_null(batch.column(12))),
    ).to_numpy(zero_copy_only=False)
    other = np.flatnonzero(~plain)
    at = np.flatnonzero(plain)
    if len(at) and min_rows > 1:
        # Tables with few changes first, by their names' dictionary codes: their rows are not split.
        schemas = batch.column(6).dictionary_encode().indices.to_numpy()[at].astype(np.int64)
        names = batch.column(7).dictionary_encode().indices.to_numpy()[at].astype(np.int64)
        table = schemas * (int(names.max()) + 1) + names
        _, inverse, counts = np.unique(table, return_inverse=True, return_counts=True)
        few = counts[inverse.reshape(-1)] < min_rows
        if few.any():
            other = np.sort(np.concatenate([other, at[few]]))
            at = at[~few]
    if not len(at):
        return other, []
    tables = _split_plain(batch, at, ords, None if hint is None else np.asarray(hint)[at])
    return other, sorted(tables, key=lambda t: t.first_n)


def _split_plain(batch: Any, at: Any, ords: Any, hint: Any) -> list[_Rows]:
    """Plain rows ``at`` of ``batch`` (``ords``: the batch's ordinals; ``hint``: the rows' shape
    numbers, if known) by table."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    take = pa.array(at)
    every = len(at) == batch.num_rows  # the common case: no copy of the rows first

    def rows_of(i: int) -> Any:
        return batch.column(i) if every else batch.column(i).take(take)

    cols, ident, pk = rows_of(8), rows_of(9), rows_of(10)
    # Zero-based offsets into the rows' own entries (a slice's ``values`` is its whole child).
    c_off = (cols.offsets.to_numpy() - cols.offsets[0].as_py()).astype(np.int64)
    i_off = (ident.offsets.to_numpy() - ident.offsets[0].as_py()).astype(np.int64)
    p_off = (pk.offsets.to_numpy() - pk.offsets[0].as_py()).astype(np.int32)
    c_vals, i_vals, pk_vals = cols.flatten(), ident.flatten(), pk.flatten()

    def coded(offsets: Any, child: Any) -> Any:
        # Each row's list as the text of its items' dictionary codes ("3,0,7"): exact, and no
        # text of a name can be mistaken for a separator.
        codes = child.dictionary_encode().indices.cast(pa.string())
        return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), codes), ",")

    def code(texts: Any) -> Any:
        return texts.dictionary_encode().indices.cast(pa.string())

    schemas, tables, ops = rows_of(6), rows_of(7), rows_of(0)
    if hint is None:
        hint = (
            pc.binary_join_element_wise(
                code(schemas),
                code(tables),
                code(ops),
                coded(c_off, c_vals.field("name")),
                coded(c_off, c_vals.field("type")),
                coded(i_off, i_vals.field("name")),
                coded(i_off, i_vals.field("type")),
                coded(p_off, pk_vals),
                "|",
            )
            .dictionary_encode()
            .indices.to_numpy()
        )
    # Shapes numbered in order of their first row, whatever numbers came: the file's bytes do
    # not depend on them. (Numbers finer than the shapes make shapes that ``_Rows.take`` merges.)
    distinct, first_row, codes = np.unique(hint, return_index=True, return_inverse=True)
    by_first = np.argsort(first_row)
    rank = np.empty(len(distinct), np.int64)
    rank[by_first] = np.arange(len(distinct))
    codes, first_row = rank[codes.reshape(-1)], first_row[by_first]
    k_shapes = len(distinct)
    by_table: dict[tuple[str, str], list[int]] = {}
    full: list[_FullShape] = []
    for k in range(k_shapes):
        r0 = int(first_row[k])
        full.append(
            (
                ops[r0].as_py(),
                tuple((e["name"], e["type"]) for e in cols[r0].as_py()),
                tuple((e["name"], e["type"]) for e in ident[r0].as_py()),
                tuple(pk[r0].as_py()),
            )
        )
        by_table.setdefault((schemas[r0].as_py(), tables[r0].as_py()), []).append(k)
    table_of = np.empty(k_shapes, np.int32)
    local = np.empty(k_shapes, np.int32)  # a shape's index among its table's
    for t, keys in enumerate(by_table.values()):
        table_of[keys] = t
        local[keys] = np.arange(len(keys))
    row_table = table_of[codes]
    order = np.argsort(row_table, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(row_table, minlength=len(by_table)))])
    lsn, seq, xid, ts, change_lsn = (rows_of(i) for i in (1, 2, 3, 4, 5))
    change_lsn = pc.fill_null(change_lsn, 0)
    values, old = c_vals.field("value"), i_vals.field("value")
    out: list[_Rows] = []
    for t, ((schema, table), keys) in enumerate(by_table.items()):
        rows = order[bounds[t] : bounds[t + 1]]
        whole = len(rows) == len(codes)
        idx = None if whole else pa.array(rows)
        lcodes = local[codes[rows]]
        shapes = [full[k] for k in keys]

        rows_of_table = _Rows(
            schema,
            table,
            [
                pa.array(ords[at[rows]]),
                *(c if idx is None else c.take(idx) for c in (lsn, seq, xid, ts, change_lsn)),
            ],
            lcodes,
            shapes,
            _gathered(values, c_off[rows], lcodes, [c for _, c, _, _ in shapes]),
            _gathered(old, i_off[rows], lcodes, [i for _, _, i, _ in shapes]),
        )
        out.append(rows_of_table)
    return out


class Spool:
    """The segments of a file being written, in ``out`` (a private spool file) block by block;
    :meth:`finish` writes the published file: the header, then the segments as they are.

    Records come one by one (:meth:`add`) or as Arrow batches of v2's decoded schema
    (:meth:`add_batch`, capture's columnar path), in any mix, in the file's order. A block closes
    after ``BATCH_RECORDS`` records or at the record that brings its texts to
    ``BLOCK_TEXT_BYTES``: its rows segments (each shape's rows, in order of their first record)
    and its records segment are written, so a file cut short keeps every block before the damage,
    and the bytes depend on the records only."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._n = 0  # the next block's first ordinal
        self._in_block = 0  # records of the open block, those in the batcher included
        self._block_texts = 0  # their texts' bytes (record_texts)
        # Records added one by one wait here (as v2's batch builder holds them) and are taken apart
        # with the Arrow blocks' code: one way to split records into tables and shapes.
        self._batcher = changefile.Batcher()
        self._pending: list[tuple[Any, Any]] = []  # the open block's batches, with shape numbers or None
        self.segments: list[SegmentInfo] = []

    def add(self, record: ChangeRecord) -> None:
        self._batcher.add(record)
        self._in_block += 1
        self._block_texts += record_texts_of(record)
        if self._in_block == BATCH_RECORDS or self._block_texts >= BLOCK_TEXT_BYTES:
            self._write_block()

    def add_batch(self, batch: Any, shapes: Any = None) -> None:
        """The records of ``batch`` (v2's decoded schema), after those added before. ``shapes``, if
        given: a number per record such that records of one number have the same table and shape
        (capture's parser numbers them); the split then compares no texts. Numbers finer than the
        shapes give the same file."""
        import numpy as np

        self._take_batcher()
        texts = np.cumsum(record_texts(batch))  # texts of the batch's records up to each one
        at = 0
        while at < batch.num_rows:
            before = int(texts[at - 1]) if at else 0
            # The record that brings the block's texts to the bound closes it.
            last = int(np.searchsorted(texts, before + BLOCK_TEXT_BYTES - self._block_texts, side="left"))
            k = min(batch.num_rows - at, BATCH_RECORDS - self._in_block, last - at + 1)
            self._pending.append((batch.slice(at, k), None if shapes is None else shapes[at : at + k]))
            at += k
            self._in_block += k
            self._block_texts += int(texts[at - 1]) - before
            if self._in_block == BATCH_RECORDS or self._block_texts >= BLOCK_TEXT_BYTES:
                self._write_block()

    def _take_batcher(self) -> None:
        if self._batcher.count:
            self._pending.append((self._batcher.take(), None))

    def _write_block(self) -> None:
        """The block's records as segments: each table's rows segment and the records segment, in
        order of their first record."""
        import numpy as np
        import pyarrow as pa

        self._take_batcher()
        if not self._pending:
            return
        batches = [b for b, _ in self._pending]
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        hint = None
        if all(h is not None for _, h in self._pending):
            # Each piece's numbers are its own parse's: kept apart by an offset (finer is fine).
            parts, base = [], 0
            for _, h in self._pending:
                parts.append(np.asarray(h, np.int64) + base)
                base += int(h.max()) + 1 if len(h) else 0
            hint = np.concatenate(parts)
        n = batch.num_rows
        if self._n + n >= 1 << 31:
            raise ValueError("a landing v3 file holds fewer than 2**31 records")
        ords = np.arange(self._n, self._n + n, dtype=np.int32)
        self._n += n
        other, tables = split(batch, ords, hint, MIN_SEGMENT_ROWS)
        out: list[tuple[int, Layout | None, Any]] = [(t.first_n, *t.take()) for t in tables]
        if len(other):
            out.append((int(ords[other[0]]), None, _records_batch(pa.array(ords[other]), batch.take(pa.array(other)))))
        for _, layout, segment in sorted(out, key=lambda entry: entry[0]):
            self._write(layout, segment)
        self._pending = []
        self._in_block = 0
        self._block_texts = 0

    def _write(self, layout: Layout | None, batch: Any) -> None:
        """``batch`` (a rows segment's of ``layout``, or the records segment's) as one segment at
        the end of the spool."""
        import pyarrow as pa

        start = self._out.tell()
        options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
        with pa.ipc.new_stream(self._out, batch.schema, options=options) as writer:
            writer.write_batch(batch)
        self.segments.append(_segment_info(self._out.tell() - start, batch, layout))

    def close(self) -> None:
        """The last block's rows into segments."""
        self._write_block()

    def finish(self, spooled: Path, tables: dict[str, int], records: int, out: IO[bytes]) -> None:
        """Write to ``out`` the file whose segments ``spooled`` (this closed spool's file) holds."""
        out.write(_header_bytes(TablesHeader(tables, records, list(self.segments))))
        with open(spooled, "rb") as body:
            while chunk := body.read(1 << 20):
                out.write(chunk)


def record_texts_of(record: ChangeRecord) -> int:
    """The bytes (UTF-8) of ``record``'s texts that count toward its block's bound: the name, type
    and value of each column and old-key column, and its raw text (:func:`record_texts` of an
    Arrow batch gives the same numbers)."""
    n = len(record.raw.encode()) if record.raw else 0
    for c in (*record.columns, *record.identity):
        n += len(c.name.encode()) + len(c.type.encode()) + (len(c.value.encode()) if c.value else 0)
    return n


def record_texts(batch: Any) -> Any:
    """:func:`record_texts_of` of each record of ``batch`` (v2's decoded schema), as numpy int64."""
    import numpy as np
    import pyarrow.compute as pc

    out = pc.binary_length(batch.column("raw")).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    for name in ("columns", "identity"):
        lists = batch.column(name)
        entries = lists.flatten()
        each = np.zeros(len(entries), np.int64)
        for part in ("name", "type", "value"):
            each += pc.binary_length(entries.field(part)).fill_null(0).to_numpy(zero_copy_only=False)
        # Per record, the sum of its entries (its list is never null): cumulative sums at its ends.
        counts = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
        ends = np.cumsum(counts)
        running = np.concatenate([[0], np.cumsum(each)])
        out += running[ends] - running[ends - counts]
    return out


def write_file(path: Path, records: Iterable[ChangeRecord]) -> None:
    """One v3 change file at ``path`` (created 0600) holding ``records`` (in position order)."""
    import os
    import tempfile

    from loader.landing.private import open_private

    tables: dict[str, int] = {}
    count = 0
    fd, tmp = tempfile.mkstemp(suffix=EXTENSION, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as body:
            spool = Spool(body)
            for r in records:
                count += 1
                if r.op != COMMIT:
                    tables[r.qualified_table] = tables.get(r.qualified_table, 0) + 1
                spool.add(r)
            spool.close()
        with open_private(path) as out:
            spool.finish(Path(tmp), dict(sorted(tables.items())), count, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


# --- reading -----------------------------------------------------------------------------------
@dataclass
class Salvage:
    """What a v3 file still holds: its header (None if unreadable), the segments read before any
    damage (each with its batch: ``ts`` and the records' texts as stored), and from which ordinal
    records are lost (``cut``; None when the file is whole)."""

    header: TablesHeader | None
    segments: list[tuple[SegmentInfo, Any]]
    damage: str | None
    cut: int | None = None


def salvage(data: bytes) -> Salvage:
    """Read a v3 file segment by segment, keeping every segment before any damage. Every batch is
    validated in full (offsets, UTF-8) and checked against its header's shape."""
    import pyarrow as pa

    try:
        f = pa.BufferReader(data)
        reader = pa.ipc.MessageReader.open_stream(f)
        message = reader.read_next_message()
        schema = pa.ipc.read_schema(message)
        try:
            reader.read_next_message()
            raise ValueError("the header stream holds a batch")
        except StopIteration:
            pass
        start = f.tell()
        header = TablesHeader.from_doc(json.loads((schema.metadata or {})[METADATA_KEY].decode("utf-8")))
    except StopIteration:
        return Salvage(None, [], "no readable header: the file is empty", 0)
    except (pa.ArrowException, ValueError, KeyError, TypeError, UnicodeDecodeError, OSError) as exc:
        return Salvage(None, [], f"no readable header: {exc}", 0)
    got: list[tuple[SegmentInfo, Any]] = []
    buffer = pa.py_buffer(data)
    at = start
    for i, seg in enumerate(header.segments):
        problem = None
        if at + seg.length > len(data):
            problem = f"the file ends inside segment {i} (at byte {len(data)} of {at + seg.length})"
        else:
            try:
                batch = _read_segment(buffer.slice(at, seg.length), seg)
            except (pa.ArrowException, ValueError, TypeError, OSError) as exc:
                problem = f"segment {i} damaged: {exc}"
        if problem is not None:
            lost = header.segments[i:]
            return Salvage(header, got, f"Arrow segments damaged: {problem}", min(s.n[0] for s in lost))
        got.append((seg, batch))
        at += seg.length
    if at != len(data):
        return Salvage(header, got, f"{len(data) - at} bytes after the last segment", None)
    total = sum(seg.rows for seg in header.segments)
    if total != header.records:
        return Salvage(header, got, f"segments hold {total} of the {header.records} records its header announces", 0)
    return Salvage(header, got, None)


def _read_segment(data: Any, seg: SegmentInfo) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    reader = pa.ipc.open_stream(data)
    want = seg.layout.arrow_schema() if seg.layout is not None else records_schema()
    if not reader.schema.equals(want):
        raise ValueError("columns other than its header's")
    batches = list(reader)
    for b in batches:
        b.validate(full=True)
    rows = sum(len(b) for b in batches)
    if rows != seg.rows:
        raise ValueError(f"{rows} rows, its header says {seg.rows}")
    batch = (
        batches[0]
        if len(batches) == 1
        else pa.Table.from_batches(batches, schema=want).combine_chunks().to_batches()[0]
    )
    if seg.layout is not None:
        low, high = pc.min_max(batch.column(VALUES_AT - 1)).values()
        if low.as_py() < 0 or high.as_py() >= len(seg.layout.shapes):
            raise ValueError("a row of a shape its header does not list")
    return batch


def segment_records(seg: SegmentInfo, batch: Any) -> Iterator[tuple[int, ChangeRecord]]:
    """A segment's records with their ordinals, as a v1 file gives them."""
    import pyarrow as pa

    if seg.layout is None:
        ords = batch.column(0).to_pylist()
        v2 = pa.RecordBatch.from_arrays(batch.columns[1:], schema=changefile.arrow_schema(stored=True))
        yield from zip(ords, changefile.batch_records(changefile.decoded(v2)), strict=True)
        return
    layout = seg.layout
    k = len(layout.columns)
    names, types = [n for n, _ in layout.columns], [t for _, t in layout.columns]
    id_names, id_types = [n for n, _ in layout.identity], [t for _, t in layout.identity]
    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    cols[4] = batch.column(4).cast(pa.string()).to_pylist()
    for r in range(batch.num_rows):
        shape = layout.shapes[cols[VALUES_AT - 1][r]]
        yield (
            cols[0][r],
            ChangeRecord(
                op=shape.op,
                commit_lsn=cols[1][r],
                seq=cols[2][r],
                xid=cols[3][r],
                ts=cols[4][r],
                schema=layout.schema,
                table=layout.table,
                change_lsn=cols[5][r],
                columns=[Column(names[u], types[u], cols[VALUES_AT + u][r]) for u in shape.columns],
                identity=[Column(id_names[u], id_types[u], cols[VALUES_AT + k + u][r]) for u in shape.identity],
                pk=list(shape.pk),
            ),
        )


def records_tables(batch: Any) -> tuple[Any, list[tuple[SegmentInfo, Any]]]:
    """A records segment's batch taken apart as the writer takes a block apart: (v2's decoded
    batch of its records that are not plain changes, and each table's plain changes as a rows
    segment of its own, ``length`` 0). A table with few changes in a block keeps them in the
    block's records segment (``MIN_SEGMENT_ROWS``): readers by columns read them this way."""
    import pyarrow as pa

    v2 = changefile.decoded(pa.RecordBatch.from_arrays(batch.columns[1:], schema=changefile.arrow_schema(stored=True)))
    ords = batch.column(0).to_numpy()
    other, tables = split(v2, ords, None, 0)
    out = []
    for t in tables:
        layout, rows = t.take()
        out.append((_segment_info(0, rows, layout), rows))
    return v2.take(pa.array(other)), out


def rows_segments(segments: list[tuple[SegmentInfo, Any]]) -> list[tuple[Any, Any]]:
    """A v3 file's segments as rows segments only, in file order (so each table's in position
    order): a records segment's plain changes taken apart into rows segments of their own
    (:func:`records_tables`). ValueError when a records segment holds anything but those and
    commit markers (control records, truncates, quarantined input: for the record-by-record path)."""
    import pyarrow.compute as pc

    out = []
    for seg, b in segments:
        if seg.layout is not None:
            out.append((seg, b))
            continue
        others, tables = records_tables(b)
        ops = others.column(0)
        if ops.null_count or set(pc.unique(ops).to_pylist()) - {COMMIT}:
            raise ValueError("control records")
        out.extend(tables)
    return out


def readable_records(got: Salvage) -> Iterator[ChangeRecord]:
    """The records of a salvaged file before its ``cut``, in the file's order."""
    out = [
        pair
        for seg, batch in got.segments
        for pair in segment_records(seg, batch)
        if got.cut is None or pair[0] < got.cut
    ]
    out.sort(key=lambda p: p[0])
    for _, rec in out:
        yield rec


def records(data: bytes) -> Iterator[ChangeRecord]:
    """Every record of an intact v3 file; ValueError naming the damage when it is not intact."""
    return intact_records(salvage(data))


def intact_records(got: Salvage) -> Iterator[ChangeRecord]:
    """:func:`records` of a file already salvaged."""
    if got.damage is not None or got.header is None:
        raise ValueError(got.damage or "unreadable")
    return readable_records(got)
