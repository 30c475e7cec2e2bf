"""Landing format v2: a snapshot chunk as one Arrow IPC stream (``schemas/landing-snapshot.v2.md``).

One file holds consecutive read (``R``) rows of one table in one snapshot transaction, with at
most two control records beside them: the table's resync marker (``S``, before the rows) and the
snapshot's commit marker (after them). Everything the rows share (table, positions, xid, commit
time, key, column names and PostgreSQL types) is in a JSON header in the stream schema's metadata;
the columns are ``pg_seq`` (int64) and ``c0..cN`` (utf8, each value PostgreSQL's text form, NULL
as null; a column of an integer or boolean type may instead hold its values as Arrow integers or
booleans, see ``NATIVE_TYPES``). Record batches are compressed with zstd and small enough (``IPC_BATCH_ROWS``) that a file
cut short keeps every batch before the damage.

``records`` turns a file back into exactly the ChangeRecords a v1 file of the same content holds,
so every consumer that reads records (snapshot resume, replay, status, import tools) is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loader.landing.records import COMMIT, HEADER, ChangeRecord, Column

FORMAT_VERSION = 2
EXTENSION = ".arrows"
METADATA_KEY = b"loader.landing"
IPC_BATCH_ROWS = 8192
COMPRESSION = "zstd"
# PostgreSQL types whose values a file may hold as Arrow values instead of text: the text is
# exactly what Arrow's cast to utf8 gives back (an integer's decimal digits with a leading minus;
# true/false, as the snapshot's boolean::text prints them), and nothing is lost (the widths are the
# types' own). Readers get text unless they ask for these.
NATIVE_TYPES = {"smallint": "int16", "integer": "int32", "bigint": "int64", "boolean": "bool"}


@dataclass
class SnapshotHeader:
    """The JSON header of a v2 file (the stream schema's metadata under ``loader.landing``)."""

    schema: str
    table: str
    commit_lsn: int
    change_lsn: int
    xid: int
    ts: str
    pk: list[str]
    columns: list[tuple[str, str]]  # (name, PostgreSQL type) of c0..cN
    rows: int = 0
    resync: dict[str, Any] | None = None  # {"seq": int, "reason": str}: the table's S marker
    commit: dict[str, Any] | None = None  # {"seq": int}: the snapshot's commit marker

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def tables(self) -> dict[str, int]:
        """The v1 FileHeader's counts: records of each table (rows and the S marker)."""
        n = self.rows + (1 if self.resync is not None else 0)
        return {self.qualified: n} if n else {}

    def to_doc(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "op": HEADER,
            "format": "snapshot",
            "tables": self.tables,
            "schema": self.schema,
            "table": self.table,
            "commit_lsn": self.commit_lsn,
            "change_lsn": self.change_lsn,
            "xid": self.xid,
            "ts": self.ts,
            "pk": list(self.pk),
            "columns": [list(c) for c in self.columns],
            "rows": self.rows,
            "resync": self.resync,
            "commit": self.commit,
        }

    @classmethod
    def from_doc(cls, doc: Any) -> SnapshotHeader:
        if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or doc.get("format") != "snapshot":
            raise ValueError("not a landing v2 snapshot header")
        cols = doc["columns"]
        if not isinstance(cols, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in cols
        ):
            raise ValueError("header 'columns' must be [name, type] pairs")
        for k in ("commit_lsn", "change_lsn", "xid", "rows"):
            if not isinstance(doc[k], int) or isinstance(doc[k], bool):
                raise ValueError(f"header {k!r} must be an integer")
        resync, commit = doc.get("resync"), doc.get("commit")
        if resync is not None and not (isinstance(resync, dict) and isinstance(resync.get("seq"), int)):
            raise ValueError("header 'resync' must be {seq, reason}")
        if commit is not None and not (isinstance(commit, dict) and isinstance(commit.get("seq"), int)):
            raise ValueError("header 'commit' must be {seq}")
        return cls(
            schema=str(doc["schema"]),
            table=str(doc["table"]),
            commit_lsn=doc["commit_lsn"],
            change_lsn=doc["change_lsn"],
            xid=doc["xid"],
            ts=str(doc["ts"]),
            pk=[str(p) for p in doc["pk"]],
            columns=[(c[0], c[1]) for c in cols],
            rows=doc["rows"],
            resync=resync,
            commit=commit,
        )

    def template(self) -> dict[str, Any]:
        """The fields every record of the file shares."""
        return {
            "commit_lsn": self.commit_lsn,
            "xid": self.xid,
            "ts": self.ts,
            "schema": self.schema,
            "table": self.table,
            "change_lsn": self.change_lsn,
        }

    def resync_record(self) -> ChangeRecord | None:
        if self.resync is None:
            return None
        return ChangeRecord(
            op="S",
            seq=int(self.resync["seq"]),
            columns=[Column(c, t, None) for c, t in self.columns],
            pk=list(self.pk),
            reason=str(self.resync.get("reason") or ""),
            **self.template(),
        )

    def commit_record(self) -> ChangeRecord | None:
        if self.commit is None:
            return None
        return ChangeRecord(
            op=COMMIT, commit_lsn=self.commit_lsn, seq=int(self.commit["seq"]), xid=self.xid, ts=self.ts
        )


def _native(pg_type: str) -> Any:
    """The Arrow type a file may hold a column of ``pg_type`` in instead of text (None if none)."""
    import pyarrow as pa

    alias = NATIVE_TYPES.get(pg_type)
    return pa.type_for_alias(alias) if alias is not None else None


def _stored(pg_type: str, values: Any) -> Any:
    """The Arrow type a file holds a column of ``pg_type`` in: its native type (``_native``) when
    the values come as other than text, else utf8."""
    import pyarrow as pa

    native = _native(pg_type)
    if native is not None and values is not None and not pa.types.is_string(values.type):
        return native
    return pa.string()


def arrow_schema(header: SnapshotHeader, columns: list[Any] | None = None) -> Any:
    """The stream schema of a file with ``header``; ``columns`` (its arrays) decide which
    columns of ``NATIVE_TYPES`` are held natively (none when not given)."""
    import pyarrow as pa

    fields = [pa.field("pg_seq", pa.int64(), nullable=False)]
    fields += [
        pa.field(f"c{j}", _stored(t, columns[j] if columns else None)) for j, (_, t) in enumerate(header.columns)
    ]
    meta = json.dumps(header.to_doc(), ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return pa.schema(fields, metadata={METADATA_KEY: meta.encode("utf-8")})


def write_file(path: Path, header: SnapshotHeader, first_seq: int | Any, columns: list[Any]) -> None:
    """One v2 file at ``path`` (created 0600, ``open_private``): ``header.rows`` rows numbered from
    ``first_seq`` (or positioned by it, an int64 array), ``columns`` one utf8 array (or chunked
    array) per source column."""
    import pyarrow as pa

    from loader.landing.private import open_private

    n = header.rows
    if not n:
        columns = [pa.array([], pa.string()) for _ in header.columns]
    schema = arrow_schema(header, columns)
    if isinstance(first_seq, int):
        seqs = pa.array(range(first_seq, first_seq + n), type=pa.int64())
    else:
        seqs = first_seq
    arrays = [seqs] + [
        (c if isinstance(c, pa.ChunkedArray) else pa.chunked_array([c])).cast(f.type)
        for c, f in zip(columns, list(schema)[1:])
    ]
    table = pa.Table.from_arrays(arrays, schema=schema)
    options = pa.ipc.IpcWriteOptions(compression=COMPRESSION)
    with open_private(path) as out, pa.ipc.new_stream(out, schema, options=options) as writer:
        writer.write_table(table, max_chunksize=IPC_BATCH_ROWS)


@dataclass
class Salvage:
    """What a v2 file still holds: its header (None if unreadable), the row batches read, damage."""

    header: SnapshotHeader | None
    batches: list[Any]
    damage: str | None


def read_batches(data: bytes, header_from_doc: Any, names: Any, types: Any = None) -> tuple[Any, list[Any], str | None]:
    """A landing v2 file (either kind) read batch by batch: (header, the batches read before any
    damage, the damage). ``header_from_doc`` parses the header (ValueError when it is not one) and
    ``names(header)`` are the columns the stream must have; ``types(header, schema)``, when given,
    names a column whose Arrow type its header does not allow (None if none). Every batch is
    validated in full (offsets, UTF-8): a flipped bit in a file must not reach Arrow's kernels as an
    out-of-range offset."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
        meta = reader.schema.metadata or {}
        header = header_from_doc(json.loads(meta[METADATA_KEY].decode("utf-8")))
        # A column name that is not UTF-8 (a flipped bit in the schema message) raises here too.
        stream_names = reader.schema.names
    except (pa.ArrowException, ValueError, KeyError, TypeError, UnicodeDecodeError, OSError) as exc:
        # Arrow raises a plain OSError for a damaged schema message ("Invalid flatbuffers
        # message"): damage to the bytes in hand, not a failed read.
        return None, [], f"no readable Arrow stream header: {exc}"
    if stream_names != names(header):
        return None, [], "Arrow stream columns do not match its header"
    wrong = types(header, reader.schema) if types is not None else None
    if wrong is not None:
        return None, [], f"Arrow stream column {wrong} is of a type its header does not allow"
    batches: list[Any] = []
    while True:
        try:
            batch = reader.read_next_batch()
            batch.validate(full=True)
        except StopIteration:
            break
        except (pa.ArrowException, ValueError, OSError) as exc:  # (UnicodeDecodeError is a ValueError)
            return header, batches, f"Arrow stream damaged after {sum(b.num_rows for b in batches)} rows: {exc}"
        batches.append(batch)
    return header, batches, None


def _misfit(header: SnapshotHeader, schema: Any) -> str | None:
    """A column whose Arrow type is neither utf8 nor its PostgreSQL type's native one."""
    import pyarrow as pa

    for j, (_, t) in enumerate(header.columns):
        got = schema.field(j + 1).type
        if got != pa.string() and got != _native(t):
            return f"c{j} ({got}, {t})"
    return None


def as_text(batch: Any) -> Any:
    """``batch`` with every native column (``NATIVE_TYPES``) as PostgreSQL's text of its values."""
    import pyarrow as pa

    if all(batch.column(j).type == pa.string() for j in range(1, batch.num_columns)):
        return batch
    arrays = [batch.column(0)] + [batch.column(j).cast(pa.string()) for j in range(1, batch.num_columns)]
    names = batch.schema.names
    return pa.RecordBatch.from_arrays(
        arrays,
        schema=pa.schema(
            [batch.schema.field(0)] + [pa.field(n, pa.string()) for n in names[1:]], metadata=batch.schema.metadata
        ),
    )


def salvage(data: bytes, native: bool = False) -> Salvage:
    """Read a v2 snapshot file batch by batch, keeping every batch before any damage. Values come
    as text (``as_text``) unless ``native``: then the columns of ``NATIVE_TYPES`` come as held."""
    header, batches, damage = read_batches(
        data, SnapshotHeader.from_doc, lambda h: ["pg_seq"] + [f"c{j}" for j in range(len(h.columns))], _misfit
    )
    if header is not None and damage is None:
        got = sum(b.num_rows for b in batches)
        if got != header.rows:
            damage = f"Arrow stream holds {got} of the {header.rows} rows its header announces"
    return Salvage(header, batches if native else [as_text(b) for b in batches], damage)


def row_records(header: SnapshotHeader, batches: list[Any]) -> Iterator[ChangeRecord]:
    """The R records of the rows, in order."""
    names = [c for c, _ in header.columns]
    types = [t for _, t in header.columns]
    shared = header.template()
    pk = list(header.pk)
    for batch in batches:
        seqs = batch.column(0).to_pylist()
        values = [batch.column(j + 1).to_pylist() for j in range(len(names))]
        for i, seq in enumerate(seqs):
            yield ChangeRecord(
                op="R",
                seq=seq,
                columns=[Column(n, t, v[i]) for n, t, v in zip(names, types, values)],
                pk=pk,
                **shared,
            )


def records(data: bytes) -> Iterator[ChangeRecord]:
    """Every record of an intact v2 file (S marker, R rows, commit marker), as a v1 file would give
    them; ValueError naming the damage when the file is not intact."""
    return intact_records(salvage(data))


def intact_records(got: Salvage) -> Iterator[ChangeRecord]:
    """:func:`records` of a file already salvaged."""
    if got.damage is not None or got.header is None:
        raise ValueError(got.damage or "unreadable")
    header = got.header
    marker = header.resync_record()
    if marker is not None:
        yield marker
    yield from row_records(header, got.batches)
    commit = header.commit_record()
    if commit is not None:
        yield commit
