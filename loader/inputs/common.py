"""Shared part of every input format: read documents, order by LSN, drop duplicates, quarantine, write landing files.

Positions. A message that carries its transaction's commit LSN (wal2json v2 ``B``/``C``,
wal2json v1 ``nextlsn``) keeps it. Formats that carry only each change's own LSN (pgkafka
messages, Debezium ``source.lsn``) get the largest change LSN of their transaction as its commit
position. That preserves the order of changes to any one row: a second transaction can only
change a row after the first one committed, so after all of the first one's change records.
Within a transaction, changes keep their LSN order (then file order). The ``seq`` numbers the
changes 1..N and the commit marker takes N+1, exactly as capture does.

Duplicates (Kafka delivers at least once) are identical messages; they are dropped by content.
A transaction whose position is at or before what the landing area already holds was imported
before and is skipped, so importing the same files twice changes nothing. A transaction an
interrupted import landed only in part (a ``_p`` file) is resumed after its last landed record.

Bad messages are quarantined, not fatal. A message that is not JSON, not an object, lacks what its
format needs, or cannot be applied (see :func:`invalid_change`) becomes a :class:`Quarantined`
item; the import goes on with the others. Every quarantined message of one import becomes one
``X`` control record in ONE control transaction (xid 0) positioned just before the first
transaction the import lands: ``(first_commit_lsn - 1, 1..k)`` and its commit marker at ``k + 1``.
No transaction can commit there (a commit LSN starts a WAL record, and records are at least 24
bytes long), and it is after everything landed (older transactions are skipped). When the import
lands no transaction, the control transaction follows what the landing area holds
(``(landed.commit_lsn, landed.seq + 1..)``, or ``(0, 1..k)`` in an empty area). The load turns
each X record into a row of the rejects table and parks its table (every table when the record
names none), so quarantining never silently loses a change.

Idempotence of quarantine. A bad message has no position of its own, so the position rule alone
cannot tell "quarantined by an earlier import" from "new": a re-import lands no transaction and
would append the X records again, and an import of old + new files (``topic+0+*.json``) would
place old and new bad messages before the first new transaction. So the landing area keeps a small
ledger (``_state/import-quarantine.json``): content fingerprint of each quarantined message ->
position of its X record. A bad message is skipped when the ledger has it at a position the
landing area still holds (the same "at or before the landed position" rule transactions follow);
otherwise (new, or the landing area was reset) it is quarantined again. The ledger is written
after the landing files are published: a crash in between writes those X records twice on the
next import (a duplicate reject row), never zero times.

Fatal, raised before anything is written: an input file that cannot be read at all (OS error,
corrupt gzip), and problems of the input as a whole rather than of one message (two transactions
claiming the same commit position: the input mixes sources; a transaction with several commit LSNs).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loader.errors import ConfigError, DecodeError
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import GZIP_DAMAGE, JSONL, MAX_DECOMPRESSED, LandingStore, LandingWriter, gunzip_bounded
from loader.lsn import ChangePosition, parse_lsn

# Landing state object of the quarantine ledger (see the module docstring).
QUARANTINE_STATE = "import-quarantine.json"
_MAX_LSN = (1 << 63) - 1  # history stores LSNs as BIGINT; real LSNs are far below
_SHOWN_REASONS = 20  # quarantined messages listed by the summary; the rejects table has them all
_SURROGATE = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8 (decoded with surrogateescape)


@dataclass
class Document:
    """One message of an input file: its exact text, and the parsed document or why it has none."""

    origin: str  # file:line where it starts
    raw: str  # source text, invalid UTF-8 bytes escaped as \\xNN
    doc: Any = None
    error: str | None = None  # not JSON / not UTF-8: the message cannot be read at all


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
    raw: str = ""  # the message's text, kept for the X record should the change prove invalid

    def fingerprint(self) -> str:
        doc = [
            self.op,
            self.txn,
            self.change_lsn,
            self.schema,
            self.table,
            [[c.name, c.type, c.value] for c in self.columns],
            [[c.name, c.type, c.value] for c in self.identity],
        ]
        return hashlib.sha1(json.dumps(doc, ensure_ascii=False).encode()).hexdigest()


@dataclass
class Quarantined:
    """A bad message: lands as an ``X`` record (reason + raw text) instead of failing the import."""

    origin: str
    what: str  # what is wrong, without the origin
    raw: str
    schema: str = ""  # named only when the message names its table readably (both parts)
    table: str = ""

    @property
    def reason(self) -> str:
        return f"{self.origin}: {self.what}"

    def fingerprint(self) -> str:
        # Content only (not the origin): the same message in a renamed or re-listed file is the same.
        # The table is part of it because a message naming several tables gives one X per table.
        return hashlib.sha1(json.dumps([self.schema, self.table, self.raw], ensure_ascii=False).encode()).hexdigest()


InputItem = InputChange | Quarantined


@dataclass
class ImportResult:
    files: list[str] = field(default_factory=list)
    messages: int = 0
    duplicates: int = 0
    transactions: int = 0
    changes: int = 0
    already_landed: int = 0
    quarantined: int = 0  # X records written by this import
    quarantined_before: int = 0  # bad messages an earlier import already quarantined (not written again)
    reasons: list[str] = field(default_factory=list)  # of the X records written

    def summary(self) -> str:
        text = (
            f"import: {self.messages} messages -> {self.changes} changes in {self.transactions} transactions, "
            f"{len(self.files)} landing files; {self.duplicates} duplicates dropped; "
            f"{self.already_landed} transactions already landed; {self.quarantined} bad messages quarantined"
        )
        if self.quarantined_before:
            text += f" ({self.quarantined_before} more quarantined by an earlier import)"
        if self.quarantined:
            text += "; 'loader load' puts them in the rejects table and parks their tables:"
            text += "".join(f"\n  quarantined: {r}" for r in self.reasons[:_SHOWN_REASONS])
            if len(self.reasons) > _SHOWN_REASONS:
                text += f"\n  ... and {len(self.reasons) - _SHOWN_REASONS} more"
        return text


def lsn_value(value: Any, origin: str = "") -> int:
    """An LSN given as 'X/X' text or as an integer (exact JSON text of one)."""
    try:
        if isinstance(value, bool):
            raise TypeError("a boolean")
        if isinstance(value, int):
            lsn = value
        else:
            text = str(value) if isinstance(value, str) else ""
            lsn = int(text) if text.isdigit() else parse_lsn(text)
        if not 0 <= lsn <= _MAX_LSN:
            raise ValueError("out of range")
        return lsn
    except (TypeError, ValueError) as exc:
        where = f"{origin}: " if origin else ""
        raise DecodeError(f"{where}{value!r} is not an LSN", hint="each message needs its change LSN") from exc


def read_text(path: Path, max_bytes: int = MAX_DECOMPRESSED) -> tuple[str, bool]:
    """A whole input file as text, and whether it held bytes that are not UTF-8 (then kept as surrogates).

    Not being able to read the file at all is fatal: no message of it can even be told apart. Nor
    can a gzip file decompressing past ``max_bytes`` (``landing.max_decompressed_mb``) be read.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"input {path} cannot be read: {exc}") from exc
    if path.name.endswith(".gz"):
        try:
            data = gunzip_bounded(data, max_bytes, f"input {path}")
        except GZIP_DAMAGE as exc:
            raise DecodeError(
                f"input {path} is not readable gzip: {exc}",
                hint="leave the damaged file out of the import, or repair it",
            ) from exc
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        # Only the messages holding the bad bytes are bad; surrogateescape keeps the rest exact.
        return data.decode("utf-8", "surrogateescape"), True


def _escape(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _next_message_start(text: str, pos: int) -> int:
    """After an unreadable message at ``pos``: where the next one may start.

    The next line that starts at column 0 with something that can begin a document. That ends a
    bad JSON line at its newline, and a bad pretty-printed document at the next document, whose
    inner lines are indented and whose closing bracket cannot start one.
    """
    n = len(text)
    i = text.find("\n", pos)
    while i != -1 and i + 1 < n:
        c = text[i + 1]
        if not c.isspace() and c not in '}],"':
            return i + 1
        i = text.find("\n", i + 1)
    return n


# No change message nests this deep (values are JSON strings); deeper ones are refused before any
# converter recurses into them.
MAX_NESTING = 64


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests lists/objects more than ``limit`` levels deep (iteratively: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        if children and depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def json_documents(path: Path, max_bytes: int = MAX_DECOMPRESSED) -> Iterator[Document]:
    """Every message of a file: JSON lines, or documents written back to back (pretty-printed).

    A stretch that is not JSON (or holds bytes that are not UTF-8, or is nested too deeply for the
    decoder) becomes a Document with ``error`` set, and reading goes on at the next line that can
    start a message.
    """
    text, lossy = read_text(path, max_bytes)
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
        doc: Any = None
        error: str | None = None
        try:
            doc, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            end = _next_message_start(text, pos)
            error = f"not JSON: {exc.msg.removesuffix(' at')} at character {exc.pos - pos + 1} of the message"
        except RecursionError:
            end = _next_message_start(text, pos)
            error = f"nested too deeply to decode (more than {MAX_NESTING} levels)"
        else:
            if _deeper_than(doc, MAX_NESTING):  # the converters recurse too: refused here, once
                error, doc = f"nested more than {MAX_NESTING} levels deep", None
        raw = text[pos:end]
        if lossy and _SURROGATE.search(raw):
            error, doc = "holds bytes that are not UTF-8", None
            raw = _escape(raw)
        yield Document(f"{path}:{line}", raw.rstrip(), doc, error)
        line += text.count("\n", pos, end)
        pos = end


def invalid_change(ch: InputChange) -> str | None:
    """Why a decoded change cannot be applied downstream, or None (the load's own checks, told early)."""
    if not ch.schema or not ch.table:
        return "no schema and table"
    if ch.op in ("I", "U", "R") and not ch.columns:
        return "an insert/update without column values"
    if ch.op == "D" and not ch.identity:
        return "a delete without the old key (replica identity): cannot tell which row went"
    names = [c.name for c in ch.columns]
    if len(set(names)) != len(names):
        return "a column appears twice in one change"
    return None


def _read_ledger(store: LandingStore) -> dict[str, ChangePosition]:
    doc = store.read_state(QUARANTINE_STATE) or {}
    out: dict[str, ChangePosition] = {}
    entries = doc.get("quarantined")
    for fp, token in entries.items() if isinstance(entries, dict) else ():
        try:
            out[str(fp)] = ChangePosition.from_token(str(token))
        except ValueError:
            continue  # an unreadable entry only means that message is quarantined again
    return out


def _control_start(landed: ChangePosition | None, first: tuple[int, int] | None) -> ChangePosition:
    """Where the control transaction of X records starts; ``first`` = (commit LSN, first seq) of the first transaction to land."""
    if first is not None:
        commit, first_seq = first
        before = ChangePosition(commit - 1, 1)
        if first_seq == 1 and (landed is None or before > landed):
            return before
        if landed is not None and landed.commit_lsn < commit:
            # commit - 1 is taken by an earlier import's control transaction that a crash kept
            # out of the ledger: still before the first transaction, right after it.
            return ChangePosition(landed.commit_lsn, landed.seq + 1)
        # The first transaction resumes one an interrupted import landed in part: nothing can go
        # in front of it, so the control transaction follows its commit marker. Seq 0 says so; the
        # caller writes it there, once it knows that transaction's length.
        return ChangePosition(commit, 0)
    if landed is None:
        return ChangePosition(0, 1)
    return ChangePosition(landed.commit_lsn, landed.seq + 1)


def import_changes(
    items: Iterable[InputItem],
    store: LandingStore,
    max_changes_per_file: int,
    result: ImportResult,
    format: str = JSONL,
) -> ImportResult:
    """Order, dedupe, quarantine and land ``items``; see the module docstring."""
    seen: set[str] = set()
    txns: dict[str, list[tuple[int, InputChange]]] = {}
    bad: list[Quarantined] = []
    for i, item in enumerate(items):
        result.messages += 1
        if isinstance(item, InputChange):
            problem = invalid_change(item)
            if problem is not None:
                item = Quarantined(
                    item.origin, problem, item.raw, item.schema if item.table else "", item.table if item.schema else ""
                )
        fp = item.fingerprint()
        if fp in seen:
            result.duplicates += 1
            continue
        seen.add(fp)
        if isinstance(item, Quarantined):
            bad.append(item)
        else:
            txns.setdefault(item.txn, []).append((i, item))
    ordered = []
    for txn, members in txns.items():
        members.sort(key=lambda t: (t[1].change_lsn, t[0]))
        explicit = {c.commit_lsn for _, c in members if c.commit_lsn is not None}
        if len(explicit) > 1:
            raise DecodeError(f"transaction {txn} has several commit LSNs in the input ({sorted(explicit)})")
        commit = explicit.pop() if explicit else max(c.change_lsn for _, c in members)
        ordered.append((commit, txn, [c for _, c in members]))
    ordered.sort(key=lambda t: t[0])
    commits = [c for c, _, _ in ordered]
    if len(set(commits)) != len(commits):
        dup = min(c for c in commits if commits.count(c) > 1)
        origins = [chs[0].origin for c, _, chs in ordered if c == dup]
        raise DecodeError(
            f"two transactions of the input share the commit position {dup} ({', '.join(origins)})",
            hint="the input mixes sources; import each source into a landing area (slot) of its own",
        )

    landed = store.landed_position()
    to_land: list[tuple[int, list[InputChange], int]] = []  # (commit, changes, first seq to write)
    for commit, _txn, changes in ordered:
        if landed is not None and ChangePosition(commit, len(changes) + 1) <= landed:
            result.already_landed += 1
            continue
        resume = landed.seq + 1 if landed is not None and landed.commit_lsn == commit else 1
        to_land.append((commit, changes, resume))

    ledger = _read_ledger(store)
    quarantine = []
    for q in bad:
        at = ledger.get(q.fingerprint())
        if at is not None and landed is not None and at <= landed:
            result.quarantined_before += 1
        else:
            quarantine.append(q)

    writer = LandingWriter(store, max_changes_per_file, format=format)
    written: dict[str, ChangePosition] = {}
    try:
        control: ChangePosition | None = None
        if quarantine:
            first = (to_land[0][0], to_land[0][2]) if to_land else None
            control = _control_start(landed, first)
            # Any valid commit time: the first landed transaction's, else the input's last one's.
            ts = (
                to_land[0][1][0].ts
                if to_land
                else ordered[-1][2][0].ts
                if ordered
                else datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S+00")
            )
            if control.seq > 0:
                written = _write_control(writer, control, quarantine, ts, result)
        for n, (commit, changes, resume) in enumerate(to_land):
            for seq, ch in enumerate(changes, start=1):
                if seq < resume:
                    continue
                writer.write(
                    ChangeRecord(
                        op=ch.op,
                        commit_lsn=commit,
                        seq=seq,
                        xid=ch.xid,
                        ts=ch.ts,
                        schema=ch.schema,
                        table=ch.table,
                        change_lsn=ch.change_lsn,
                        columns=ch.columns,
                        identity=ch.identity,
                        pk=ch.pk,
                    )
                )
                result.changes += 1
            writer.write(
                ChangeRecord(op=COMMIT, commit_lsn=commit, seq=len(changes) + 1, xid=changes[0].xid, ts=changes[0].ts)
            )
            result.transactions += 1
            if n == 0 and control is not None and control.seq == 0:
                written = _write_control(
                    writer, ChangePosition(commit, len(changes) + 2), quarantine, changes[0].ts, result
                )
        writer.close_file()
    except BaseException:
        writer.abort()
        raise
    result.files = list(writer.published)
    if written:
        entries = {fp: p.token() for fp, p in ledger.items()}
        entries.update({fp: p.token() for fp, p in written.items()})
        store.write_state(QUARANTINE_STATE, {"v": 1, "quarantined": dict(sorted(entries.items()))})
    return result


def _write_control(
    writer: LandingWriter, start: ChangePosition, quarantine: list[Quarantined], ts: str, result: ImportResult
) -> dict[str, ChangePosition]:
    """The control transaction: one X record per quarantined message from ``start``, then its commit marker."""
    written: dict[str, ChangePosition] = {}
    for k, q in enumerate(quarantine):
        pos = ChangePosition(start.commit_lsn, start.seq + k)
        writer.write(
            ChangeRecord(
                op="X",
                commit_lsn=pos.commit_lsn,
                seq=pos.seq,
                xid=0,
                ts=ts,
                schema=q.schema,
                table=q.table,
                reason=q.reason,
                raw=q.raw,
            )
        )
        written[q.fingerprint()] = pos
        result.quarantined += 1
        result.reasons.append(q.reason)
    writer.write(ChangeRecord(op=COMMIT, commit_lsn=start.commit_lsn, seq=start.seq + len(quarantine), xid=0, ts=ts))
    return written


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
