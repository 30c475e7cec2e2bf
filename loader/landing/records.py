"""The canonical change record that every input format decodes to, and its landing-file JSON form.

One JSON object per line (see ``schemas/landing-change.v1.json``). All column values are kept as
PostgreSQL's text form (or JSON null), so nothing is lost between the source and the typed load:
numbers keep every digit, timestamps keep their offset, and a column absent from ``columns`` (an
unchanged TOASTed value) stays distinct from one present with value null.

Besides row changes (I/U/D/R/T) and commit markers (C), the stream carries three kinds of
*control records*, each positioned in commit order like a change:

- ``S`` resync: the table's state is replaced at this position by the ``R`` rows that follow in the
  same snapshot (keys absent from them are deleted downstream). Every snapshot starts each table
  with one.
- ``P`` park: from this position on, the table's change stream cannot keep a current table exact
  (replica identity lost, table dropped or made unlogged, ...); current tables stop here until a
  later resync. History keeps what arrives.
- ``X`` quarantine: input that could not be decoded (its raw text and the reason); the load puts it
  in the rejects table and parks its table when the table is known.

A file may begin with a header line (``op`` ``H``, see :class:`FileHeader`) listing the tables it
holds and how many changes of each, so a damaged file still says which tables it touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from loader.lsn import ChangePosition

# Operation codes as they appear in landing files and in history's pg_operation column.
OPERATIONS = {
    "I": "insert",
    "U": "update",
    "D": "delete",
    "R": "read",
    "T": "truncate",
    "S": "resync",
    "P": "park",
    "X": "quarantine",
}
# Codes that carry a row (a change of the table's data).
ROW_OPERATIONS = frozenset("IUDR")
# Control records: positioned like changes, but about the table as a whole (see module docstring).
CONTROL_OPERATIONS = frozenset("SPX")
COMMIT = "C"
HEADER = "H"
FORMAT_VERSION = 1


class Column(msgspec.Struct, frozen=True, array_like=True):
    """One column of a change: name, PostgreSQL type name, value in PostgreSQL's text form.

    A msgspec Struct (array-like): landing files hold it as ``[name, type, value]``, and msgspec
    encodes and decodes it in C; per record, JSON was most of capture's and load's CPU time.
    """

    name: str
    type: str
    value: str | None


class ChangeRecord(msgspec.Struct):
    """One committed change, a control record, or a transaction's commit marker (op 'C').

    Its landing form is :class:`_LandingLine`; ``to_json``/``from_json`` convert.
    """

    op: str
    commit_lsn: int
    seq: int
    xid: int
    ts: str
    schema: str = ""
    table: str = ""
    change_lsn: int = 0
    columns: list[Column] = []
    identity: list[Column] = []
    pk: list[str] = []
    # Control records: why (S, P, X); the undecodable input as text (X, invalid bytes escaped).
    reason: str = ""
    raw: str | None = None

    @property
    def position(self) -> ChangePosition:
        return ChangePosition(self.commit_lsn, self.seq)

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_json(self) -> str:
        return self.to_json_bytes().decode("utf-8")

    def to_json_bytes(self) -> bytes:
        """The landing line (without newline), UTF-8. Field order and omissions are fixed, so the
        same records always give the same bytes (a re-capture writes identical files)."""
        if self.op == COMMIT:
            return _ENCODER.encode(_CommitLine(FORMAT_VERSION, COMMIT, self.commit_lsn, self.seq, self.xid, self.ts))
        return _ENCODER.encode(
            _LandingLine(
                FORMAT_VERSION,
                self.op,
                self.commit_lsn,
                self.seq,
                self.xid,
                self.ts,
                self.change_lsn,
                self.schema,
                self.table,
                self.columns,
                self.identity or msgspec.UNSET,
                self.pk,
                self.reason or msgspec.UNSET,
                msgspec.UNSET if self.raw is None else self.raw,
            )
        )

    @classmethod
    def from_json(cls, line: str | bytes) -> ChangeRecord:
        """Decode one landing line; ValueError (naming the field) when it is not a valid record."""
        try:
            doc = _DECODER.decode(line)
        except msgspec.MsgspecError:
            return cls._from_json_checked(line)  # the same verdict, with a precise reason
        except RecursionError:
            raise ValueError("nested too deeply to decode (not a landing record)") from None
        if doc.v != FORMAT_VERSION or (doc.op != COMMIT and doc.op not in OPERATIONS):
            return cls._from_json_checked(line)
        if not all(c.name for c in doc.columns) or (doc.identity and not all(c.name for c in doc.identity)):
            return cls._from_json_checked(line)
        return cls(
            doc.op,
            doc.lsn,
            doc.seq,
            doc.xid,
            doc.ts,
            doc.schema,
            doc.table,
            doc.change_lsn,
            doc.columns,
            [] if doc.identity is msgspec.UNSET else doc.identity,
            doc.pk,
            "" if doc.reason is msgspec.UNSET else doc.reason,
            None if doc.raw is msgspec.UNSET else doc.raw,
        )

    @classmethod
    def _from_json_checked(cls, line: str | bytes) -> ChangeRecord:
        """The field-by-field decoder: slow, but says exactly what is wrong with a line."""
        try:
            doc = json.loads(line)
        except RecursionError:
            raise ValueError("nested too deeply to decode (not a landing record)") from None
        if not isinstance(doc, dict):
            raise ValueError("a landing line must be a JSON object")
        if doc.get("v") != FORMAT_VERSION:
            raise ValueError(f"unsupported landing format version {doc.get('v')!r}")
        op = doc["op"]
        if op != COMMIT and op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}")
        raw = doc.get("raw")
        if raw is not None and not isinstance(raw, str):
            raise ValueError("raw must be text")
        return cls(
            op=op,
            commit_lsn=_int(doc["lsn"], "lsn"),
            seq=_int(doc["seq"], "seq"),
            xid=_int(doc["xid"], "xid"),
            ts=_text(doc["ts"], "ts"),
            schema=_text(doc.get("schema", ""), "schema"),
            table=_text(doc.get("table", ""), "table"),
            change_lsn=_int(doc.get("change_lsn", 0), "change_lsn"),
            columns=[Column(*_col(c)) for c in _list(doc.get("columns", []), "columns")],
            identity=[Column(*_col(c)) for c in _list(doc.get("identity", []), "identity")],
            pk=[_text(p, "pk") for p in _list(doc.get("pk", []), "pk")],
            reason=_text(doc.get("reason", ""), "reason"),
            raw=raw,
        )


@dataclass
class OpenTransaction:
    """A transaction a decoder is reading: its records share the commit position, xid and time.

    ``seq`` counts the records so far (the caller advances it); ``end_lsn`` is where the slot may
    be confirmed to once the transaction is durable (wal2json's ``nextlsn``; 0 if unknown).
    """

    xid: int
    commit_lsn: int
    ts: str
    end_lsn: int = 0
    seq: int = 0

    def record(self, op: str, schema: str = "", table: str = "", change_lsn: int = 0, **fields: Any) -> ChangeRecord:
        """A record at the current ``seq``."""
        return ChangeRecord(op, self.commit_lsn, self.seq, self.xid, self.ts, schema, table, change_lsn, **fields)

    def commit(self) -> ChangeRecord:
        """The commit marker, after every record."""
        return ChangeRecord(COMMIT, self.commit_lsn, self.seq + 1, self.xid, self.ts)


class _CommitLine(msgspec.Struct):
    """A commit marker's landing line (schemas/landing-change.v1.json)."""

    v: int
    op: str
    lsn: int
    seq: int
    xid: int
    ts: str


class _LandingLine(_CommitLine):
    """A change or control record's landing line (schemas/landing-change.v1.json), in field order:
    the commit marker's fields, then these.

    Decoding is strict about types (an integer field given as text, a value that is a number) and
    lenient about what may be absent, like the field-by-field decoder it fronts.
    """

    change_lsn: int = 0
    schema: str = ""
    table: str = ""
    columns: list[Column] = []
    identity: list[Column] | msgspec.UnsetType = msgspec.UNSET
    pk: list[str] = []
    reason: str | msgspec.UnsetType = msgspec.UNSET
    raw: str | msgspec.UnsetType = msgspec.UNSET


_ENCODER = msgspec.json.Encoder()
_DECODER: msgspec.json.Decoder[_LandingLine] = msgspec.json.Decoder(_LandingLine)


@dataclass
class FileHeader:
    """First line of a landing file: the tables it holds and how many records of each.

    Written by capture and import; optional (files of older versions have none). When a file is
    damaged, the load compares what it could read with these counts and parks exactly the
    tables that lost changes.
    """

    tables: dict[str, int]

    def to_json(self) -> str:
        return json.dumps(
            {"v": FORMAT_VERSION, "op": HEADER, "tables": self.tables}, ensure_ascii=False, separators=(",", ":")
        )

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FileHeader:
        tables = doc.get("tables")
        if not isinstance(tables, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in tables.items()
        ):
            raise ValueError("header 'tables' must map schema.table to a count")
        return cls(dict(tables))


def parse_header(line: str) -> FileHeader | None:
    """The header of a landing file if ``line`` (its first line) is one, else None."""
    if '"op":"H"' not in line:
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("op") != HEADER:
        return None
    try:
        return FileHeader.from_doc(doc)
    except ValueError:
        return None


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, got {type(value).__name__}")
    return value


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{name} must be a list, got {type(value).__name__}")
    return value


def _col(c: Any) -> tuple[str, str, str | None]:
    if not isinstance(c, list) or len(c) != 3:
        raise ValueError("a column must be [name, type, value]")
    name, typ, value = c
    if not isinstance(name, str) or not name or not isinstance(typ, str):
        raise ValueError("a column name and type must be text")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"column {name!r} value must be text or null, got {type(value).__name__}")
    return name, typ, value
