"""Shared part of every input format: order by LSN, drop duplicates, write landing files.

Positions. A message that carries its transaction's commit LSN (wal2json v2 ``B``/``C``,
wal2json v1 ``nextlsn``) keeps it. Formats that carry only each change's own LSN (pgkafka
messages, Debezium ``source.lsn``) get the largest change LSN of their transaction as its commit
position. That preserves the order of changes to any one row: a second transaction can only
change a row after the first one committed, so after all of the first one's change records.
Within a transaction, changes keep their LSN order (then file order). The ``seq`` numbers the
changes 1..N and the commit marker takes N+1, exactly as capture does.

Duplicates (Kafka delivers at least once) are identical messages; they are dropped by content.
A transaction whose position is at or before what the landing area already holds was imported
before and is skipped, so importing the same files twice changes nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loader.capture.landing import LandingStore, LandingWriter
from loader.capture.records import COMMIT, ChangeRecord, Column
from loader.errors import DecodeError
from loader.lsn import ChangePosition, parse_lsn


@dataclass
class InputChange:
    """One change read from an input file, before it gets its landing position."""

    op: str  # I / U / D / R / T
    txn: str  # transaction identity within the input (xid, txId, ...)
    change_lsn: int
    ts: str
    schema: str
    table: str
    columns: list[Column] = field(default_factory=list)
    identity: list[Column] = field(default_factory=list)
    pk: list[str] = field(default_factory=list)
    commit_lsn: int | None = None  # when the input carries it
    xid: int = 0
    origin: str = ""  # file:line, for error messages

    def fingerprint(self) -> str:
        doc = [self.op, self.txn, self.change_lsn, self.schema, self.table,
               [[c.name, c.type, c.value] for c in self.columns], [[c.name, c.type, c.value] for c in self.identity]]
        return hashlib.sha1(json.dumps(doc, ensure_ascii=False).encode()).hexdigest()


@dataclass
class ImportResult:
    files: list[str] = field(default_factory=list)
    messages: int = 0
    duplicates: int = 0
    transactions: int = 0
    changes: int = 0
    already_landed: int = 0

    def summary(self) -> str:
        return (
            f"import: {self.messages} messages -> {self.changes} changes in {self.transactions} transactions, "
            f"{len(self.files)} landing files; {self.duplicates} duplicates dropped; "
            f"{self.already_landed} transactions already landed"
        )


def lsn_value(value: Any, origin: str) -> int:
    """An LSN given as 'X/X' text or as an integer."""
    try:
        if isinstance(value, int):
            return value
        text = str(value)
        return int(text) if text.isdigit() else parse_lsn(text)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"{origin}: {value!r} is not an LSN", hint="each message needs its change LSN") from exc


def read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8")


def json_documents(path: Path) -> Iterator[tuple[str, Any]]:
    """Every JSON document of a file: JSON lines, or documents written back to back (pretty-printed)."""
    text = read_text(path)
    decoder = json.JSONDecoder(parse_float=str, parse_int=str, parse_constant=str)
    pos, n = 0, len(text)
    line = 1
    while pos < n:
        while pos < n and text[pos].isspace():
            if text[pos] == "\n":
                line += 1
            pos += 1
        if pos >= n:
            break
        try:
            doc, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DecodeError(f"{path}:{line}: not JSON: {exc.msg}", hint="check the --format option") from exc
        yield f"{path}:{line}", doc
        line += text.count("\n", pos, end)
        pos = end


def import_changes(
    changes: Iterable[InputChange], store: LandingStore, max_changes_per_file: int, result: ImportResult
) -> ImportResult:
    """Order, dedupe and land ``changes``; see the module docstring."""
    seen: set[str] = set()
    txns: dict[str, list[tuple[int, InputChange]]] = {}
    for i, ch in enumerate(changes):
        result.messages += 1
        fp = ch.fingerprint()
        if fp in seen:
            result.duplicates += 1
            continue
        seen.add(fp)
        txns.setdefault(ch.txn, []).append((i, ch))
    ordered = []
    for txn, items in txns.items():
        items.sort(key=lambda t: (t[1].change_lsn, t[0]))
        explicit = {c.commit_lsn for _, c in items if c.commit_lsn is not None}
        if len(explicit) > 1:
            raise DecodeError(f"transaction {txn} has several commit LSNs in the input ({sorted(explicit)})")
        commit = explicit.pop() if explicit else max(c.change_lsn for _, c in items)
        ordered.append((commit, txn, [c for _, c in items]))
    ordered.sort(key=lambda t: t[0])
    commits = [c for c, _, _ in ordered]
    if len(set(commits)) != len(commits):
        raise DecodeError("two transactions of the input share a commit position", hint="the input mixes sources")
    landed = store.landed_position()
    writer = LandingWriter(store, max_changes_per_file)
    try:
        for commit, _txn, items in ordered:
            if landed is not None and ChangePosition(commit, len(items) + 1) <= landed:
                result.already_landed += 1
                continue
            for seq, ch in enumerate(items, start=1):
                writer.write(
                    ChangeRecord(
                        op=ch.op, commit_lsn=commit, seq=seq, xid=ch.xid, ts=ch.ts, schema=ch.schema, table=ch.table,
                        change_lsn=ch.change_lsn, columns=ch.columns, identity=ch.identity, pk=ch.pk,
                    )
                )
                result.changes += 1
            writer.write(ChangeRecord(op=COMMIT, commit_lsn=commit, seq=len(items) + 1, xid=items[0].xid, ts=items[0].ts))
            result.transactions += 1
        writer.close_file()
    except BaseException:
        writer.abort()
        raise
    result.files = list(writer.published)
    return result


def value_text(value: Any) -> str | None:
    from loader.capture.wal2json import value_text as v

    return v(value)


def parse_pk_option(items: Iterable[str]) -> dict[str, list[str]]:
    """``schema.table=col1,col2`` options -> {qualified table: key columns}."""
    out: dict[str, list[str]] = {}
    for item in items:
        table, sep, cols = item.partition("=")
        if not sep or "." not in table or not cols:
            raise DecodeError(f"--pk {item!r} is not schema.table=col1,col2")
        out[table] = [c.strip() for c in cols.split(",") if c.strip()]
    return out
