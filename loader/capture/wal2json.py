"""Pure decoding of wal2json format-version 2 rows into ChangeRecords.

wal2json emits one JSON document per action: B (begin, carrying the commit LSN as ``lsn``),
I/U/D/T changes, M messages and C (commit). Numbers are parsed as their exact source text so
numeric(38,20) or bigint values keep every digit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from loader.capture.records import COMMIT, ChangeRecord, Column
from loader.errors import DecodeError
from loader.lsn import parse_lsn

# Options passed to pg_logical_slot_peek_changes; see PLATFORM.md and wal2json's README.
WAL2JSON_OPTIONS: tuple[str, ...] = (
    "format-version", "2",
    "include-lsn", "1",
    "include-xids", "1",
    "include-timestamp", "1",
    "include-types", "1",
    "include-pk", "1",
    "include-transaction", "1",
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


@dataclass
class TransactionState:
    """What the decoder knows about the transaction in progress."""

    xid: int
    commit_lsn: int
    end_lsn: int
    ts: str
    seq: int = 0


class Wal2JsonDecoder:
    """Stateful over a stream of (row_lsn, xid, data) rows; yields ChangeRecords in order.

    ``end_lsn`` of the last commit seen is what the slot may be advanced to once everything up
    to it is durable.
    """

    def __init__(self) -> None:
        self.txn: TransactionState | None = None
        self.last_commit_end_lsn: int | None = None

    def feed(self, data: str) -> Iterator[ChangeRecord]:
        try:
            doc = parse_json_exact(data)
            action = doc["action"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError(f"wal2json produced an unreadable row: {data[:200]!r}") from exc
        if action == "B":
            self.txn = TransactionState(
                xid=int(doc["xid"]),
                commit_lsn=parse_lsn(doc["lsn"]),
                end_lsn=parse_lsn(doc["nextlsn"]),
                ts=doc["timestamp"],
            )
            return
        txn = self.txn
        if txn is None:
            raise DecodeError(f"wal2json row outside a transaction: {data[:200]!r}")
        if action == "C":
            yield ChangeRecord(op=COMMIT, commit_lsn=txn.commit_lsn, seq=txn.seq + 1, xid=txn.xid, ts=txn.ts)
            self.last_commit_end_lsn = txn.end_lsn
            self.txn = None
            return
        if action in ("I", "U", "D", "T"):
            txn.seq += 1
            yield ChangeRecord(
                op=action,
                commit_lsn=txn.commit_lsn,
                seq=txn.seq,
                xid=txn.xid,
                ts=txn.ts,
                schema=doc["schema"],
                table=doc["table"],
                change_lsn=parse_lsn(doc["lsn"]) if "lsn" in doc else 0,
                columns=_columns(doc.get("columns")),
                identity=_columns(doc.get("identity")),
                pk=[p["name"] for p in doc.get("pk") or ()],
            )
            return
        # "M" (logical messages) carry no table change.
        return

    @property
    def in_transaction(self) -> bool:
        return self.txn is not None
