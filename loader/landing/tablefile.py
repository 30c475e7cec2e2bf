"""Landing format v3 for the change stream: each table's changes in columns (``schemas/landing-change.v3.md``).

A file covers one position range, as v1 and v2 change files do (its name, the load's ledger,
exactly-once and salvage work as there). Its body is a sequence of *segments*, each a whole Arrow
IPC stream (zstd):

- a *rows* segment holds plain changes (insert, update, delete: no note, no raw text) of one table
  in one *shape*: the same operation, column names and types, old-key columns and key names. A
  column per source column holds its values in PostgreSQL's text form (null: SQL NULL; a column
  absent from the change, an unchanged TOAST value, is a different shape), a column per old-key
  column the old key's values; besides them the record's ordinal in the file (``n``), its position
  (``lsn``, ``seq``), ``xid``, commit time (``ts``, dictionary-encoded) and ``change_lsn``;
- a *records* segment holds every other record (commit markers, control records, truncates,
  quarantined input) in the v2 schema (:mod:`loader.landing.changefile`) with ``n`` in front.

The header is the first segment: a stream without columns whose schema metadata holds the JSON
header: v2's counts (records of each table, commit markers not counted; records in all) and the
segments in file order, each with its byte length, rows, first and last ordinal and position, and
for a rows segment its table and shape. So the load reads a table's columns without parsing a
record or a list of name/type/value structs, a file cut short still names every table and count
it held, and it keeps every record before the first ordinal of its first lost segment
(:func:`salvage`).

Every ``BATCH_RECORDS`` records from the file's start close a block, whose segments are written
then (each shape's rows in the order of its first record, then the other records): the bytes
depend on the records only, whether they came one by one or as Arrow blocks, and one split, in
Arrow, takes both apart.
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
# Records per block (the segments of a block hold at most this many rows): the unit of damage.
BATCH_RECORDS = 8192
PLAIN_OPS = ("I", "U", "D")


# --- the header --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What every row of a rows segment shares."""

    schema: str
    table: str
    op: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type) of v0..vN
    identity: tuple[tuple[str, str], ...]  # (name, type) of the old key's o0..oM
    pk: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_doc(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "op": self.op,
            "columns": [list(c) for c in self.columns],
            "identity": [list(c) for c in self.identity],
            "pk": list(self.pk),
        }

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> Shape:
        def pairs(v: Any) -> tuple[tuple[str, str], ...]:
            if not isinstance(v, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in v
            ):
                raise ValueError("segment columns must be [name, type] pairs")
            return tuple((p[0], p[1]) for p in v)

        schema, table, op, pk = d.get("schema"), d.get("table"), d.get("op"), d.get("pk")
        if not isinstance(schema, str) or not isinstance(table, str) or op not in PLAIN_OPS:
            raise ValueError("a rows segment names its table and a plain operation")
        if not isinstance(pk, list) or not all(isinstance(k, str) for k in pk):
            raise ValueError("segment 'pk' must be a list of names")
        return cls(schema, table, op, pairs(d.get("columns")), pairs(d.get("identity")), tuple(pk))

    def arrow_schema(self) -> Any:
        import pyarrow as pa

        return pa.schema(
            _position_fields()
            + [pa.field(f"v{i}", pa.string()) for i in range(len(self.columns))]
            + [pa.field(f"o{i}", pa.string()) for i in range(len(self.identity))]
        )


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
    """One segment as the header lists it; ``shape`` None for a records segment."""

    length: int
    rows: int
    n: tuple[int, int]  # first and last ordinal
    first: tuple[int, int]  # (lsn, seq) of its first row
    last: tuple[int, int]
    shape: Shape | None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": "records" if self.shape is None else "rows",
            "length": self.length,
            "rows": self.rows,
            "n": list(self.n),
            "first": list(self.first),
            "last": list(self.last),
        }
        if self.shape is not None:
            doc.update(self.shape.to_doc())
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
        shape = Shape.from_doc(d) if d["kind"] == "rows" else None
        return cls(length, rows, (n[0], n[1]), (first[0], first[1]), (last[0], last[1]), shape)


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
class _Rows:
    """A shape's rows of the open block, as Arrow batches (``ts`` as text)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.batches: list[Any] = []
        self.rows = 0

    @property
    def first_n(self) -> int:
        return int(self.batches[0].column(0)[0].as_py())

    def append(self, arrays: list[Any]) -> None:
        import pyarrow as pa

        self.batches.append(pa.RecordBatch.from_arrays(arrays, schema=_plain_schema(self.shape)))
        self.rows += len(arrays[0])

    def take(self) -> Any:
        """Every row as one batch of the segment's schema."""
        import pyarrow as pa

        table = pa.Table.from_batches(self.batches, schema=_plain_schema(self.shape))
        arrays = [pa.concat_arrays(c.chunks) for c in table.columns]
        arrays[4] = arrays[4].dictionary_encode()
        return pa.RecordBatch.from_arrays(arrays, schema=self.shape.arrow_schema())


def _plain_schema(shape: Shape) -> Any:
    """A rows batch before it is written: ``ts`` as plain text."""
    import pyarrow as pa

    schema = shape.arrow_schema()
    return schema.set(4, pa.field("ts", pa.string(), nullable=False))


class _Records:
    """The other records of the open block: (ordinals, v2's decoded batch) pairs."""

    def __init__(self) -> None:
        self.batches: list[tuple[Any, Any]] = []
        self.rows = 0

    @property
    def first_n(self) -> int:
        return int(self.batches[0][0][0].as_py())

    def append(self, ords: Any, batch: Any) -> None:
        self.batches.append((ords, batch))
        self.rows += batch.num_rows

    def take(self) -> Any:
        """Every record as one batch of a records segment's schema (v2's texts dictionary-encoded)."""
        import pyarrow as pa

        ords = pa.concat_arrays([o for o, _ in self.batches])
        table = pa.Table.from_batches([b for _, b in self.batches], schema=changefile.arrow_schema())
        rows = pa.RecordBatch.from_arrays([pa.concat_arrays(c.chunks) for c in table.columns], schema=table.schema)
        stored = changefile.encode(rows)
        return pa.RecordBatch.from_arrays([ords, *stored.columns], schema=records_schema())


class Spool:
    """The segments of a file being written, in ``out`` (a private spool file) block by block;
    :meth:`finish` writes the published file: the header, then the segments as they are.

    Records come one by one (:meth:`add`) or as Arrow batches of v2's decoded schema
    (:meth:`add_batch`, capture's columnar path), in any mix, in the file's order. Every
    ``BATCH_RECORDS`` records from the file's start close a block: its rows segments (each shape's
    rows, in order of their first record) and its records segment are written, so a file cut
    short keeps every block before the damage, and the bytes depend on the records only."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._n = 0  # the next record's ordinal, of those taken apart
        self._in_block = 0  # records of the open block, those in the batcher included
        # Records added one by one wait here (as v2's batch builder holds them) and are taken apart
        # with the Arrow blocks' code: one way to split records into shapes.
        self._batcher = changefile.Batcher()
        self._shapes: dict[Shape, _Rows] = {}
        self._records = _Records()
        self.segments: list[SegmentInfo] = []

    def add(self, record: ChangeRecord) -> None:
        self._batcher.add(record)
        self._in_block += 1
        if self._in_block == BATCH_RECORDS:
            self._write_block()

    def add_batch(self, batch: Any) -> None:
        """The records of ``batch`` (v2's decoded schema), after those added before."""
        self._take_batcher()
        at = 0
        while at < batch.num_rows:
            k = min(batch.num_rows - at, BATCH_RECORDS - self._in_block)
            self._add_rows(batch.slice(at, k))
            at += k
            self._in_block += k
            if self._in_block == BATCH_RECORDS:
                self._write_block()

    def _take_batcher(self) -> None:
        if self._batcher.count:
            self._add_rows(self._batcher.take())

    def _add_rows(self, batch: Any) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        if self._n + n >= 1 << 31:
            raise ValueError("a landing v3 file holds fewer than 2**31 records")
        ops = batch.column(0)
        plain = pc.and_(
            pc.is_in(ops, value_set=pa.array(PLAIN_OPS)),
            pc.and_(pc.equal(pc.fill_null(batch.column(11), ""), ""), pc.is_null(batch.column(12))),
        ).to_numpy(zero_copy_only=False)
        ords = np.arange(self._n, self._n + n, dtype=np.int32)
        self._n += n
        other = np.flatnonzero(~plain)
        if len(other):
            self._records.append(pa.array(ords[other]), batch.take(pa.array(other)))
        at = np.flatnonzero(plain)
        if len(at):
            self._add_plain(batch, at, ords)

    def _add_plain(self, batch: Any, at: Any, ords: Any) -> None:
        """Plain rows ``at`` of ``batch`` appended to their shapes' rows."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        take = pa.array(at)
        every = len(at) == batch.num_rows  # the common case: no copy of the rows first

        def rows_of(i: int) -> Any:
            return batch.column(i) if every else batch.column(i).take(take)

        cols, ident, pk = rows_of(8), rows_of(9), rows_of(10)
        # Zero-based offsets into the rows' own entries (a slice's ``values`` is its whole child).
        c_off = (cols.offsets.to_numpy() - cols.offsets[0].as_py()).astype(np.int32)
        i_off = (ident.offsets.to_numpy() - ident.offsets[0].as_py()).astype(np.int32)
        p_off = (pk.offsets.to_numpy() - pk.offsets[0].as_py()).astype(np.int32)
        c_vals, i_vals, pk_vals = cols.flatten(), ident.flatten(), pk.flatten()

        def coded(offsets: Any, child: Any) -> Any:
            # Each row's list as the text of its items' dictionary codes ("3,0,7"): exact, and no
            # text of a name can be mistaken for a separator.
            codes = child.dictionary_encode().indices.cast(pa.string())
            return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), codes), ",")

        def code(texts: Any) -> Any:
            return texts.dictionary_encode().indices.cast(pa.string())

        schemas, tables, ops = rows_of(6), rows_of(7), rows_of(0)
        key = pc.binary_join_element_wise(
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
        enc = key.dictionary_encode()
        codes = enc.indices.to_numpy()
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(enc.dictionary)))])
        lsn, seq, xid, ts, change_lsn = (rows_of(i) for i in (1, 2, 3, 4, 5))
        values, old = c_vals.field("value"), i_vals.field("value")
        for k in range(len(enc.dictionary)):
            rows = order[bounds[k] : bounds[k + 1]]
            r0 = int(rows[0])
            shape = Shape(
                schemas[r0].as_py(),
                tables[r0].as_py(),
                ops[r0].as_py(),
                tuple((e["name"], e["type"]) for e in cols[r0].as_py()),
                tuple((e["name"], e["type"]) for e in ident[r0].as_py()),
                tuple(pk[r0].as_py()),
            )
            pending = self._shapes.get(shape)
            if pending is None:
                pending = self._shapes[shape] = _Rows(shape)
            idx = pa.array(rows)
            starts_c, starts_i = c_off[rows], i_off[rows]
            pending.append(
                [
                    pa.array(ords[at[rows]]),
                    lsn.take(idx),
                    seq.take(idx),
                    xid.take(idx),
                    ts.take(idx),
                    pc.fill_null(change_lsn.take(idx), 0),
                    *(values.take(pa.array(starts_c + j)) for j in range(len(shape.columns))),
                    *(old.take(pa.array(starts_i + j)) for j in range(len(shape.identity))),
                ]
            )

    def _write_block(self) -> None:
        """The block's pending rows as segments: each shape's and the records', in order of
        their first record."""
        self._take_batcher()
        pending: list[_Rows | _Records] = [p for p in self._shapes.values() if p.rows]
        if self._records.rows:
            pending.append(self._records)
        for p in sorted(pending, key=lambda p: p.first_n):
            self._write(p)
        self._shapes.clear()
        self._records = _Records()
        self._in_block = 0

    def _write(self, pending: _Rows | _Records) -> None:
        """The rows of ``pending`` as one segment at the end of the spool."""
        import pyarrow as pa

        batch = pending.take()
        shape = pending.shape if isinstance(pending, _Rows) else None
        start = self._out.tell()
        options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
        with pa.ipc.new_stream(self._out, batch.schema, options=options) as writer:
            writer.write_batch(batch)
        n = batch.column(0)
        lsn, seq = batch.column("lsn"), batch.column("seq")
        last = batch.num_rows - 1
        self.segments.append(
            SegmentInfo(
                self._out.tell() - start,
                batch.num_rows,
                (n[0].as_py(), n[last].as_py()),
                (lsn[0].as_py(), seq[0].as_py()),
                (lsn[last].as_py(), seq[last].as_py()),
                shape,
            )
        )

    def close(self) -> None:
        """The last block's rows into segments."""
        self._write_block()

    def finish(self, spooled: Path, tables: dict[str, int], records: int, out: IO[bytes]) -> None:
        """Write to ``out`` the file whose segments ``spooled`` (this closed spool's file) holds."""
        out.write(_header_bytes(TablesHeader(tables, records, list(self.segments))))
        with open(spooled, "rb") as body:
            while chunk := body.read(1 << 20):
                out.write(chunk)


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

    reader = pa.ipc.open_stream(data)
    want = seg.shape.arrow_schema() if seg.shape is not None else records_schema()
    if not reader.schema.equals(want):
        raise ValueError("columns other than its header's")
    batches = list(reader)
    for b in batches:
        b.validate(full=True)
    rows = sum(len(b) for b in batches)
    if rows != seg.rows:
        raise ValueError(f"{rows} rows, its header says {seg.rows}")
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=want).combine_chunks().to_batches()[0]


def segment_records(seg: SegmentInfo, batch: Any) -> Iterator[tuple[int, ChangeRecord]]:
    """A segment's records with their ordinals, as a v1 file gives them."""
    import pyarrow as pa

    if seg.shape is None:
        ords = batch.column(0).to_pylist()
        v2 = pa.RecordBatch.from_arrays(batch.columns[1:], schema=changefile.arrow_schema(stored=True))
        yield from zip(ords, changefile.batch_records(changefile.decoded(v2)), strict=True)
        return
    shape = seg.shape
    k = len(shape.columns)
    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    cols[4] = batch.column(4).cast(pa.string()).to_pylist()
    for r in range(batch.num_rows):
        yield (
            cols[0][r],
            ChangeRecord(
                op=shape.op,
                commit_lsn=cols[1][r],
                seq=cols[2][r],
                xid=cols[3][r],
                ts=cols[4][r],
                schema=shape.schema,
                table=shape.table,
                change_lsn=cols[5][r],
                columns=[Column(name, t, cols[6 + i][r]) for i, (name, t) in enumerate(shape.columns)],
                identity=[Column(name, t, cols[6 + k + i][r]) for i, (name, t) in enumerate(shape.identity)],
                pk=list(shape.pk),
            ),
        )


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
