"""Pure decoding of wal2json format-version 2 rows into ChangeRecords.

wal2json emits one JSON document per action: B (begin, carrying the commit LSN as ``lsn``),
I/U/D/T changes, M messages and C (commit). Numbers are parsed as their exact source text so
numeric(38,20) or bigint values keep every digit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from loader.capture import ddl, heartbeat
from loader.errors import DecodeError
from loader.landing.records import ChangeRecord, Column, OpenTransaction
from loader.lsn import parse_lsn

# Options passed to pg_logical_slot_peek_changes (wal2json's README): format 2 with positions, xids,
# commit timestamps, types and keys.
WAL2JSON_OPTIONS: tuple[str, ...] = (
    "format-version",
    "2",
    "include-lsn",
    "1",
    "include-xids",
    "1",
    "include-timestamp",
    "1",
    "include-types",
    "1",
    "include-pk",
    "1",
    "include-transaction",
    "1",
)

# wal2json >= 2.6 can print numbers as JSON strings, which keeps numeric/float NaN and +-Infinity
# (older versions print them as JSON null, indistinguishable from SQL NULL). Capture passes it
# when the installed wal2json accepts it; see README "Known limitations".
NUMERIC_AS_STRING_OPTION: tuple[str, str] = ("numeric-data-types-as-string", "1")


def parse_json_exact(text: str) -> Any:
    """json.loads that keeps numbers as their source text and NaN/Infinity as text."""
    return json.loads(text, parse_float=str, parse_int=str, parse_constant=str)


def value_text(value: Any) -> str | None:
    """A wal2json column value -> PostgreSQL text form (None stays None)."""
    if value is None:
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    # Objects/arrays only appear if a plugin option renders json natively.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def column_text(pg_type: str, value: Any) -> str | None:
    """A wal2json value of a column of ``pg_type`` -> exactly PostgreSQL's ``::text`` form."""
    text = value_text(value)
    # wal2json prints a bytea as bare hex; PostgreSQL's text form (bytea_output=hex) starts with \x.
    if text is not None and pg_type == "bytea" and not text.startswith("\\x"):
        return "\\x" + text
    return text


def _columns(items: Iterable[dict[str, Any]] | None, with_values: bool = True) -> list[Column]:
    out = []
    for c in items or ():
        typ = c.get("type", "")
        out.append(Column(c["name"], typ, column_text(typ, c.get("value")) if with_values else None))
    return out


class _FastColumn(msgspec.Struct):
    name: str
    type: str = ""
    value: Any = None


class _FastKey(msgspec.Struct):
    name: str


class _FastRow(msgspec.Struct):
    """The shape of the wal2json rows that make up nearly all of a stream (B, C and I/U/D)."""

    action: str
    xid: int | None = None
    lsn: str | None = None
    nextlsn: str | None = None
    timestamp: str | None = None
    schema: str | None = None
    table: str | None = None
    columns: list[_FastColumn] | None = None
    identity: list[_FastColumn] | None = None
    pk: list[_FastKey] | None = None


# Typed decoding in C (msgspec) with floats kept as their source text. Integers arrive as exact
# Python ints, so their text is str(n), except "-0" (a double's negative zero), which the
# fast path cannot tell from "0": rows with an integer 0 in a floating column take the exact path.
_FAST: msgspec.json.Decoder[_FastRow] = msgspec.json.Decoder(_FastRow, float_hook=str)
_FLOAT_TYPES = frozenset(("double precision", "real", "float8", "float4"))


def _fast_columns(items: list[_FastColumn] | None) -> list[Column] | None:
    """Columns of a fast-decoded row, or None when a value needs the exact path."""
    out: list[Column] = []
    if not items:
        return out
    append = out.append
    for c in items:
        value = c.value
        if value.__class__ is not str:
            if value is None:
                append(Column(c.name, c.type, None))
                continue
            if value is True or value is False:
                value = "true" if value else "false"
            elif value.__class__ is int and (value or c.type not in _FLOAT_TYPES):
                value = str(value)
            else:
                return None  # JSON objects/arrays, a possible -0: decode the row exactly
        if c.type == "bytea" and not value.startswith("\\x"):
            value = "\\x" + value
        append(Column(c.name, c.type, value))
    return out


class Wal2JsonDecoder:
    """Stateful over a stream of wal2json rows; yields ChangeRecords in order.

    Nothing the plugin emits stops the stream: logical messages (transactional or not) are
    counted and skipped, and a row that cannot be decoded (invalid UTF-8 from a SQL_ASCII
    database, JSON the decoder does not understand, an unknown action) becomes an ``X``
    (quarantine) record at its place in the transaction, with its raw text, so the load puts it in
    the rejects table and parks its table. ``confirm_lsn`` is what the slot may be advanced to once
    every record yielded so far is durable.
    """

    def __init__(self) -> None:
        self.txn: OpenTransaction | None = None
        self.confirm_lsn: int | None = None
        self.messages_skipped = 0
        self.quarantined = 0
        self.quarantined_outside_transaction = 0
        # Loader heartbeats seen in committed transactions (see loader.capture.heartbeat), in order.
        self.heartbeats: list[heartbeat.Seen] = []
        self._txn_heartbeats: list[heartbeat.Seen] = []
        # DDL messages (loader.capture.ddl) of committed transactions, in order; capture takes them.
        self.ddl: list[ddl.Message] = []
        self._txn_ddl: list[ddl.Message] = []

    @property
    def last_commit_end_lsn(self) -> int | None:
        return self.confirm_lsn

    def feed(self, data: str | bytes) -> Iterator[ChangeRecord]:
        return iter(self.records(data))

    def records(self, data: str | bytes) -> list[ChangeRecord]:
        """The records one wal2json row makes (usually one, none for begin and message rows); a
        list rather than a generator: capture calls this for every row."""
        try:
            row = _FAST.decode(data)
        except (msgspec.MsgspecError, UnicodeError):
            row = None  # not UTF-8, not JSON, or an unexpected shape: the exact path says what
        if row is not None:
            rec = self._fast(row)
            if rec is None:
                return []
            if rec is not False:
                return [rec]  # type: ignore[list-item]
        return list(self._feed_exact(data))

    def _fast(self, row: _FastRow) -> ChangeRecord | bool | None:
        """Decode the common rows without building dicts: a record, None (consumed, nothing to
        yield), or False (take the exact path, which handles everything else)."""
        action, txn = row.action, self.txn
        if txn is not None and action in ("I", "U", "D") and row.schema is not None and row.table is not None:
            columns = _fast_columns(row.columns)
            identity = _fast_columns(row.identity)
            if columns is None or identity is None:
                return False
            try:
                change_lsn = parse_lsn(row.lsn) if row.lsn is not None else 0
            except ValueError:
                return False
            txn.seq += 1
            return ChangeRecord(
                action,
                txn.commit_lsn,
                txn.seq,
                txn.xid,
                txn.ts,
                row.schema,
                row.table,
                change_lsn,
                columns,
                identity,
                [p.name for p in row.pk] if row.pk else [],
            )
        if action == "C" and txn is not None:
            self._committed(txn)
            return txn.commit()
        if action == "B" and txn is None and row.lsn and row.nextlsn and row.timestamp:
            try:
                self.txn = OpenTransaction(
                    xid=row.xid or 0, commit_lsn=parse_lsn(row.lsn), end_lsn=parse_lsn(row.nextlsn), ts=row.timestamp
                )
            except ValueError:
                return False
            return None
        return False

    def _feed_exact(self, data: str | bytes) -> Iterator[ChangeRecord]:
        raw = data if isinstance(data, str) else None
        try:
            text = data if isinstance(data, str) else data.decode("utf-8")
        except UnicodeDecodeError as exc:
            assert isinstance(data, bytes)
            yield from self._quarantine(
                data.decode("utf-8", "backslashreplace"), f"wal2json output is not UTF-8: {exc}", None
            )
            return
        raw = text
        try:
            doc = parse_json_exact(text)
            action = doc["action"]
        except (ValueError, KeyError, TypeError) as exc:
            yield from self._quarantine(raw, f"wal2json produced an unreadable row: {exc}", None)
            return
        if action == "B":
            if self.txn is not None:
                raise DecodeError(
                    f"wal2json began a transaction inside another one: {raw[:200]!r}", hint="re-run capture"
                )
            try:
                self.txn = OpenTransaction(
                    xid=int(doc.get("xid", 0)),
                    commit_lsn=parse_lsn(doc["lsn"]),
                    end_lsn=parse_lsn(doc["nextlsn"]),
                    ts=doc["timestamp"],
                )
            except (KeyError, ValueError, TypeError) as exc:
                # Without the commit position nothing of the transaction can be placed: this is a
                # capture setup problem (options), not bad data.
                raise DecodeError(
                    f"wal2json begin record without lsn/nextlsn/timestamp: {raw[:200]!r}",
                    hint="capture passes include-lsn and include-timestamp; check the slot's plugin",
                ) from exc
            return
        if action == "M":
            beat = heartbeat.parse(doc.get("prefix"), doc.get("content"), _lsn_or_zero(doc.get("lsn")))
            if beat is not None and self.txn is not None and doc.get("transactional", True):
                self._txn_heartbeats.append(beat)  # counted once its transaction commits
                return
            change = ddl.parse(doc.get("prefix"), doc.get("content"), _lsn_or_zero(doc.get("lsn")))
            if change is not None and self.txn is not None and doc.get("transactional", True):
                self._txn_ddl.append(change)  # acted on once its transaction commits
                return
            self.messages_skipped += 1
            if self.txn is None and not doc.get("transactional", True):
                # A non-transactional message (heartbeats, Debezium signals) sits between
                # transactions: confirming past it is safe, and needed, or every peek returns it again.
                try:
                    after = parse_lsn(doc["lsn"]) + 1
                except (KeyError, ValueError, TypeError):
                    return
                self.confirm_lsn = max(self.confirm_lsn or 0, after)
            return
        txn = self.txn
        if txn is None:
            if action in ("I", "U", "D", "T", "C"):
                # Its begin record was lost (unreadable): the transaction cannot be placed, and
                # skipping it would lose it once a later commit moves the slot. Stop here.
                raise DecodeError(
                    f"wal2json {action!r} record outside a transaction: {raw[:200]!r}",
                    hint="the slot was not advanced past it; re-run capture, and report the plugin output if it repeats",
                )
            yield from self._quarantine(raw, f"wal2json row outside a transaction (action {action!r})", doc)
            return
        if action == "C":
            yield txn.commit()
            self._committed(txn)
            return
        if action in ("I", "U", "D", "T"):
            try:
                rec = ChangeRecord(
                    op=action,
                    commit_lsn=txn.commit_lsn,
                    seq=txn.seq + 1,
                    xid=txn.xid,
                    ts=txn.ts,
                    schema=str(doc["schema"]),
                    table=str(doc["table"]),
                    change_lsn=parse_lsn(doc["lsn"]) if "lsn" in doc else 0,
                    columns=_columns(doc.get("columns")),
                    identity=_columns(doc.get("identity")),
                    pk=[str(p["name"]) for p in doc.get("pk") or ()],
                )
            except (KeyError, ValueError, TypeError, AttributeError) as exc:
                yield from self._quarantine(raw, f"wal2json change not understood: {exc!r}", doc)
                return
            txn.seq += 1
            yield rec
            return
        yield from self._quarantine(raw, f"unknown wal2json action {action!r}", doc)

    def _committed(self, txn: OpenTransaction) -> None:
        """The transaction's commit: the slot may move to its end once its records are durable."""
        self.confirm_lsn = max(self.confirm_lsn or 0, txn.end_lsn)
        self.txn = None
        if self._txn_heartbeats:
            for beat in self._txn_heartbeats:
                beat.end_lsn = txn.end_lsn
            self.heartbeats += self._txn_heartbeats
            self._txn_heartbeats = []
        if self._txn_ddl:
            for change in self._txn_ddl:
                change.commit_lsn = txn.commit_lsn
            self.ddl += self._txn_ddl
            self._txn_ddl = []

    def _quarantine(self, raw: str, reason: str, doc: Any) -> Iterator[ChangeRecord]:
        txn = self.txn
        if txn is None:
            # Outside a transaction there is no position to keep it at; nothing was lost from any
            # table either: changes only exist inside transactions, and a change after an unreadable
            # begin record stops the capture (above).
            self.quarantined_outside_transaction += 1
            return
        txn.seq += 1
        self.quarantined += 1
        fields = doc if isinstance(doc, dict) else {}
        schema = fields["schema"] if isinstance(fields.get("schema"), str) else ""
        table = fields["table"] if isinstance(fields.get("table"), str) else ""
        yield txn.record("X", schema, table, reason=reason, raw=raw)

    @property
    def holds_messages(self) -> bool:
        """Whether the open transaction carries heartbeats or DDL messages its commit acts on."""
        return bool(self._txn_heartbeats or self._txn_ddl)

    @property
    def in_transaction(self) -> bool:
        return self.txn is not None


def _lsn_or_zero(text: Any) -> int:
    try:
        return parse_lsn(text) if isinstance(text, str) else 0
    except ValueError:
        return 0
