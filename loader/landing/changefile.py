"""Landing format v2 for the change stream: records as one Arrow IPC stream (``schemas/landing-change.v2.md``).

A file holds what a v1 file holds (changes, control records, commit markers, in position order),
one record per row, in columns: the fields every record has, and its columns, old key and key
names as lists of ``{name, type, value}`` structs, so one file holds records of many tables and
shapes. Values keep PostgreSQL's text form (a null value is SQL NULL; a column absent from the
list, an unchanged TOAST value, stays absent). The header (tables and counts, records) is the
stream schema's metadata, in front of every batch; capture only knows it when the file closes, so
the batches are spooled as they come (``Spool``) and the final file is the header's schema message
followed by the spooled batch messages, copied as they are (no second compression).

Batches hold at most ``BATCH_RECORDS`` records, so a file cut short keeps every batch before the
damage, and the load reads a file in Arrow without parsing a line (``loader.load.driver``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loader.landing.arrowfile import COMPRESSION, METADATA_KEY, read_batches
from loader.landing.records import COMMIT, ChangeRecord, Column

FORMAT_VERSION = 2
FORMAT = "changes"
EXTENSION = ".changes.arrow"
# Records per Arrow batch: capture's unit of work and of damage (a cut file keeps the batches before it).
BATCH_RECORDS = 4096


def _column_list(stored: bool = False) -> Any:
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string()) if stored else pa.string()
    entry = pa.struct(
        [
            pa.field("name", text, nullable=False),
            pa.field("type", text, nullable=False),
            pa.field("value", pa.string()),
        ]
    )
    return pa.list_(pa.field("item", entry, nullable=False))


def arrow_schema(stored: bool = False) -> Any:
    """The columns of a v2 change file (no header). ``stored``: as the file holds them, the
    repetitive texts (operation, commit time, table, column names and types, key names)
    dictionary-encoded per batch; readers see them decoded (:func:`decoded`)."""
    import pyarrow as pa

    s = pa.string()
    text = pa.dictionary(pa.int32(), s) if stored else s
    return pa.schema(
        [
            pa.field("op", text, nullable=False),
            pa.field("lsn", pa.uint64(), nullable=False),
            pa.field("seq", pa.int64(), nullable=False),
            pa.field("xid", pa.int64(), nullable=False),
            pa.field("ts", text, nullable=False),
            pa.field("change_lsn", pa.int64(), nullable=False),
            pa.field("schema", text, nullable=False),
            pa.field("table", text, nullable=False),
            pa.field("columns", _column_list(stored), nullable=False),
            pa.field("identity", _column_list(stored), nullable=False),
            pa.field("pk", pa.list_(pa.field("item", text, nullable=False)), nullable=False),
            pa.field("reason", s),
            pa.field("raw", s),
        ]
    )


def decoded(batch: Any) -> Any:
    """A batch as read from a file, with its dictionary-encoded texts decoded."""
    return batch.cast(arrow_schema())


@dataclass
class ChangeHeader:
    """The header of a v2 change file: v1's FileHeader counts (records of each table, commit
    markers not counted) and the number of records (rows) in the stream."""

    tables: dict[str, int]
    records: int

    def to_doc(self) -> dict[str, Any]:
        return {"v": FORMAT_VERSION, "op": "H", "format": FORMAT, "tables": self.tables, "records": self.records}

    @classmethod
    def from_doc(cls, doc: Any) -> ChangeHeader:
        if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or doc.get("format") != FORMAT:
            raise ValueError("not a landing v2 change-file header")
        tables, records = doc.get("tables"), doc.get("records")
        if not isinstance(tables, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in tables.items()
        ):
            raise ValueError("header 'tables' must map table names to counts")
        if not isinstance(records, int) or isinstance(records, bool) or records < 0:
            raise ValueError("header 'records' must be a count")
        return cls(dict(tables), records)


def header_schema(header: ChangeHeader) -> Any:
    meta = json.dumps(header.to_doc(), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return arrow_schema(stored=True).with_metadata({METADATA_KEY: meta.encode("utf-8")})


class Batcher:
    """Records taken apart into column buffers as they come (plain strings and ints: the record
    itself is freed at once, as v1's encoded line frees it, instead of living on as a tree of
    objects the garbage collector walks again and again), then built into one Arrow batch."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.count = 0
        self._fields: list[list[Any]] = [[] for _ in range(8)]  # op lsn seq xid ts change_lsn schema table
        self._entries = [_EntryBuffers(), _EntryBuffers()]  # columns, identity
        self._pk_counts: list[int] = []
        self._pk: list[str] = []
        self._reason: list[str | None] = []
        self._raw: list[str | None] = []

    def add(self, r: ChangeRecord) -> None:
        f = self._fields
        f[0].append(r.op)
        f[1].append(r.commit_lsn)
        f[2].append(r.seq)
        f[3].append(r.xid)
        f[4].append(r.ts)
        f[5].append(r.change_lsn)
        f[6].append(r.schema)
        f[7].append(r.table)
        self._entries[0].add(r.columns)
        self._entries[1].add(r.identity)
        self._pk_counts.append(len(r.pk))
        self._pk.extend(r.pk)
        self._reason.append(r.reason or None)
        self._raw.append(r.raw)
        self.count += 1

    def take(self) -> Any:
        """The records added so far as one Arrow batch of the (decoded) schema; the buffers start over."""
        import pyarrow as pa

        s, i64 = pa.string(), pa.int64()
        f = self._fields
        arrays = [
            pa.array(f[0], s),
            pa.array(f[1], pa.uint64()),
            pa.array(f[2], i64),
            pa.array(f[3], i64),
            pa.array(f[4], s),
            pa.array(f[5], i64),
            pa.array(f[6], s),
            pa.array(f[7], s),
            self._entries[0].take(),
            self._entries[1].take(),
            pa.ListArray.from_arrays(_offsets(self._pk_counts), pa.array(self._pk, s), type=pa.list_(_ITEM_TEXT)),
            pa.array(self._reason, s),
            pa.array(self._raw, s),
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


class _EntryBuffers:
    """A batch's column lists: their lengths and the Column objects, flat (msgspec leaves these
    untracked by the garbage collector, so holding them costs nothing), taken apart at the end."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.flat: list[Column] = []

    def add(self, columns: list[Column]) -> None:
        self.counts.append(len(columns))
        self.flat.extend(columns)

    def take(self) -> Any:
        import pyarrow as pa

        flat = self.flat
        entries = pa.StructArray.from_arrays(
            [
                pa.array([c.name for c in flat], pa.string()),
                pa.array([c.type for c in flat], pa.string()),
                pa.array([c.value for c in flat], pa.string()),
            ],
            fields=list(_column_list().value_type),
        )
        return pa.ListArray.from_arrays(_offsets(self.counts), entries, type=_column_list())


def _offsets(counts: list[int]) -> Any:
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(np.array(counts, np.int32), out=offsets[1:])
    return pa.array(offsets)


def _item_text() -> Any:
    import pyarrow as pa

    return pa.field("item", pa.string(), nullable=False)


_ITEM_TEXT = _item_text()


def _dict_list(lists: Any, encode: Any) -> Any:
    """A list array rebuilt from zero-based offsets, its items passed through ``encode``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = lists.offsets
    start = offsets[0].as_py()
    values = lists.values.slice(start, offsets[-1].as_py() - start)
    if start:
        offsets = pc.subtract(offsets, pa.scalar(start, pa.int32()))
    return offsets, encode(values)


def encode(batch: Any) -> Any:
    """A batch of the decoded schema as files store it: the repetitive texts dictionary-encoded
    (codes in order of first appearance). A function of the batch's values only, so the same
    records give the same bytes however they arrived (record by record, or as Arrow blocks)."""
    import pyarrow as pa

    schema = arrow_schema(stored=True)
    cols = batch.columns

    def text(a: Any) -> Any:
        return a.dictionary_encode()

    def entries(values: Any) -> Any:
        return pa.StructArray.from_arrays(
            [text(values.field("name")), text(values.field("type")), values.field("value")],
            fields=list(_column_list(stored=True).value_type),
        )

    arrays = [text(cols[0]), cols[1], cols[2], cols[3], text(cols[4]), cols[5], text(cols[6]), text(cols[7])]
    for i, build in ((8, entries), (9, entries), (10, text)):
        offsets, values = _dict_list(cols[i], build)
        arrays.append(pa.ListArray.from_arrays(offsets, values, type=schema.field(i).type))
    arrays += [cols[11], cols[12]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def record_batch(records: Iterable[ChangeRecord]) -> Any:
    """``records`` as one Arrow batch of the v2 change-file schema, as files store it."""
    batcher = Batcher()
    for r in records:
        batcher.add(r)
    return encode(batcher.take())


class Spool:
    """The batches of a file being written, as an IPC stream in ``out`` (a private spool file);
    :meth:`finish` writes the published file: the header, then these batches as they are.

    Records come one by one (:meth:`add`) or as Arrow batches of the decoded schema
    (:meth:`add_batch`, capture's columnar path), in any mix; the file's batches are cut every
    ``BATCH_RECORDS`` records from its start either way, so its bytes depend on its records only.
    """

    def __init__(self, out: IO[bytes]) -> None:
        import pyarrow as pa

        self._out = out
        options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
        self._writer = pa.ipc.new_stream(out, arrow_schema(stored=True), options=options)
        self._batcher = Batcher()
        self._pending: list[Any] = []  # decoded batches not yet written, fewer than BATCH_RECORDS rows
        self._pending_rows = 0

    def add(self, record: ChangeRecord) -> None:
        """One more record: a batch is written every ``BATCH_RECORDS`` records."""
        self._batcher.add(record)
        if self._batcher.count + self._pending_rows >= BATCH_RECORDS:
            self._emit()

    def add_batch(self, batch: Any) -> None:
        """The records of ``batch`` (decoded schema), after those added before."""
        if self._batcher.count:
            self._take_batcher()
        if batch.num_rows:
            self._pending.append(batch)
            self._pending_rows += batch.num_rows
            self._emit()

    def write(self, records: list[ChangeRecord]) -> None:
        """``records`` as one batch (after the records added before)."""
        self.flush()
        if records:
            self._writer.write_batch(record_batch(records))

    def _take_batcher(self) -> None:
        n = self._batcher.count
        self._pending.append(self._batcher.take())
        self._pending_rows += n

    def _emit(self, final: bool = False) -> None:
        """Write every full batch pending (and, when ``final``, the rest)."""
        import pyarrow as pa

        if self._batcher.count:
            self._take_batcher()
        if self._pending_rows < BATCH_RECORDS and not (final and self._pending_rows):
            return
        pending = pa.Table.from_batches(self._pending)
        at = 0
        while self._pending_rows - at >= BATCH_RECORDS or (final and at < self._pending_rows):
            n = min(BATCH_RECORDS, self._pending_rows - at)
            # Copied, not sliced: fresh compact arrays, so the bytes written do not depend on where
            # the records sat in the batches they came in (a slice's buffers can reach past it).
            # Concatenation copies ranges of buffers (a take gathered every value: 3x the CPU).
            part = pending.slice(at, n)
            rows = pa.RecordBatch.from_arrays(
                [pa.concat_arrays(column.chunks) for column in part.columns], schema=part.schema
            )
            self._writer.write_batch(encode(rows))
            at += n
        rest = pending.slice(at)
        self._pending = rest.combine_chunks().to_batches() if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def flush(self) -> None:
        self._emit(final=True)

    def close(self) -> None:
        self.flush()
        self._writer.close()  # the end-of-stream marker

    @staticmethod
    def finish(spooled: Path, header: ChangeHeader, out: IO[bytes]) -> None:
        """Write to ``out`` the file whose batches ``spooled`` (a closed Spool's file) holds."""
        start = _schema_message_end(spooled)
        out.write(header_schema(header).serialize().to_pybytes())
        with open(spooled, "rb") as body:
            body.seek(start)
            while chunk := body.read(1 << 20):
                out.write(chunk)


def _schema_message_end(spooled: Path) -> int:
    import pyarrow as pa

    with pa.OSFile(str(spooled), "rb") as f:
        pa.ipc.MessageReader.open_stream(f).read_next_message()
        return int(f.tell())


def write_file(path: Path, records: Iterable[ChangeRecord]) -> None:
    """One v2 change file at ``path`` (created 0600) holding ``records`` (in position order)."""
    import pyarrow as pa

    from loader.landing.private import open_private

    recs = list(records)
    tables: dict[str, int] = {}
    for r in recs:
        if r.op != COMMIT:
            tables[r.qualified_table] = tables.get(r.qualified_table, 0) + 1
    header = ChangeHeader(dict(sorted(tables.items())), len(recs))
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
    with open_private(path) as out, pa.ipc.new_stream(out, header_schema(header), options=options) as writer:
        for i in range(0, len(recs), BATCH_RECORDS):
            writer.write_batch(record_batch(recs[i : i + BATCH_RECORDS]))


@dataclass
class Salvage:
    """What a v2 change file still holds: its header (None if unreadable), the batches read, damage."""

    header: ChangeHeader | None
    batches: list[Any]
    damage: str | None


def as_stored(batch: Any) -> Any:
    """A batch as read from a file, in the stored schema (its texts dictionary-encoded); a batch
    whose columns cannot be read as the format's raises (ArrowException)."""
    stored = arrow_schema(stored=True)
    return batch if batch.schema.equals(stored) else batch.cast(stored)


def salvage(data: bytes, decode: bool = True) -> Salvage:
    """Read a v2 change file batch by batch, keeping every batch before any damage; its texts
    decoded (``decoded``), or as stored (dictionary-encoded) without ``decode``."""
    header, batches, damage = read_batches(data, ChangeHeader.from_doc, lambda _: arrow_schema().names)
    try:
        batches = [decoded(b) if decode else as_stored(b) for b in batches]
    except (ValueError, TypeError, OSError) as exc:  # ArrowException is a ValueError/TypeError/OSError
        return Salvage(header, [], f"Arrow stream columns of other types than the format's: {exc}")
    if header is not None and damage is None:
        got = sum(b.num_rows for b in batches)
        if got != header.records:
            damage = f"Arrow stream holds {got} of the {header.records} records its header announces"
    return Salvage(header, batches, damage)


def _columns(entries: list[dict[str, Any]] | None) -> list[Column]:
    return [Column(e["name"], e["type"], e["value"]) for e in entries or ()]


def batch_records(batch: Any) -> Iterator[ChangeRecord]:
    """The records of one batch, as a v1 file gives them."""
    for row in batch.to_pylist():
        if row["op"] == COMMIT:
            yield ChangeRecord(COMMIT, row["lsn"], row["seq"], row["xid"], row["ts"])
            continue
        yield ChangeRecord(
            op=row["op"],
            commit_lsn=row["lsn"],
            seq=row["seq"],
            xid=row["xid"],
            ts=row["ts"],
            schema=row["schema"],
            table=row["table"],
            change_lsn=row["change_lsn"],
            columns=_columns(row["columns"]),
            identity=_columns(row["identity"]),
            pk=list(row["pk"] or ()),
            reason=row["reason"] or "",
            raw=row["raw"],
        )


def records(data: bytes) -> Iterator[ChangeRecord]:
    """Every record of an intact v2 change file; ValueError naming the damage when it is not intact."""
    return intact_records(salvage(data))


def intact_records(got: Salvage) -> Iterator[ChangeRecord]:
    """:func:`records` of a file already salvaged."""
    if got.damage is not None or got.header is None:
        raise ValueError(got.damage or "unreadable")
    for batch in got.batches:
        yield from batch_records(batch)
