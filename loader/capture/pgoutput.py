"""Pure decoding of PostgreSQL's built-in ``pgoutput`` plugin (protocol version 1) into ChangeRecords.

Owns: the binary message parser for rows of ``pg_logical_slot_peek_binary_changes(slot, upto_lsn,
upto_nchanges, 'proto_version', '1', 'publication_names', '<pub>')`` (see :func:`peek_options`), and
the publication the plugin needs (:func:`ensure_publication` and friends). The capture loop, slot
lifecycle and landing files stay in ``capture.py`` / ``slot.py`` / ``landing.py``.

The records have the shape :class:`loader.capture.wal2json.Wal2JsonDecoder` gives for the same change
(positions, xids, commit timestamp text, column names/types/values, identity), so downstream treats
both alike. Differences from the wal2json path, all verified against a PostgreSQL 15 server in
``tests/capture/test_pgoutput.py``:

- numeric and float ``NaN`` / ``Infinity`` / ``-Infinity`` are kept as text (wal2json 2.5 prints JSON
  null, indistinguishable from SQL NULL).
- values arrive as PostgreSQL's text output; booleans (type ``boolean`` itself, not domains over it,
  as in wal2json) are normalised from ``t``/``f`` to ``true``/``false``, what the wal2json path yields.
- a *publication* must exist **before the slot is created**: pgoutput looks the publication up in
  the catalog as of each decoded change, so changes written before ``CREATE PUBLICATION`` make every
  peek fail with ``publication "..." does not exist`` until the slot is advanced past them.
- a publication that publishes updates/deletes makes PostgreSQL *reject* UPDATE and DELETE on
  tables without a replica identity (no primary key under REPLICA IDENTITY DEFAULT, or NOTHING);
  wal2json merely skips them. :func:`ensure_publication` refuses to create one over such tables.
- generated columns are not sent by pgoutput in PostgreSQL 15 (wal2json prints them).
- transactions with nothing to publish (DDL only, a transactional logical message) produce no
  Begin/Commit at all in PostgreSQL 15, so there is no commit record for them (wal2json gives one).
- logical decoding messages (``pg_logical_emit_message``): capture passes the ``messages`` option
  (PostgreSQL 14+) so the loader's own heartbeat comes through (``loader.capture.heartbeat``);
  every other message is counted and skipped (``messages_skipped``).
- type names come from ``format_type(oid, typmod)`` on the current catalog (wal2json uses the
  historic one), so a type dropped or renamed after the change prints differently.

Malformed input never raises: it becomes an ``X`` (quarantine) record inside the current
transaction, or, outside one, is counted in ``quarantined_outside_transaction``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql

from loader.capture import ddl, heartbeat
from loader.capture.source_tables import HAS_IDENTITY_SQL, split_qualified
from loader.errors import SourceError
from loader.landing.records import ChangeRecord, Column, OpenTransaction
from loader.lsn import format_lsn

PLUGIN = "pgoutput"
BOOL_OID = 16
# Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 00:00:00 UTC).
_PG_EPOCH_DAYS_FROM_UNIX = 10_957
_USECS_PER_DAY = 86_400_000_000
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# Relation flag bit: the column is part of the replica identity (every column under FULL).
_KEY_FLAG = 1

_MESSAGE_NAMES = {
    "B": "Begin",
    "C": "Commit",
    "R": "Relation",
    "Y": "Type",
    "O": "Origin",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "M": "Message",
}


def peek_options(publication: str, messages: bool = False) -> tuple[str, ...]:
    """Plugin options for ``pg_logical_slot_peek_binary_changes`` (after slot, upto_lsn, upto_nchanges);
    ``messages``: also send logical messages (PostgreSQL 14+), which carry the loader's heartbeat."""
    # publication_names is parsed as an identifier list: unquoted names are folded to lower case.
    quoted = (
        publication
        if publication.isidentifier() and publication.islower()
        else ('"' + publication.replace('"', '""') + '"')
    )
    return ("proto_version", "1", "publication_names", quoted) + (("messages", "true") if messages else ())


def format_timestamptz(usecs: int) -> str:
    """PostgreSQL's timestamptz output (DateStyle ISO, TimeZone UTC) for microseconds since 2000-01-01.

    Matches what wal2json prints as a transaction's timestamp: ``2026-11-22 19:29:55.01951+00``,
    trailing fraction zeros removed, no fraction when it is zero.
    """
    if usecs == _INT64_MAX:
        return "infinity"
    if usecs == _INT64_MIN:
        return "-infinity"
    days, rem = divmod(usecs, _USECS_PER_DAY)
    secs, frac = divmod(rem, 1_000_000)
    year, month, day = _civil_from_days(days + _PG_EPOCH_DAYS_FROM_UNIX)
    hh, rest = divmod(secs, 3600)
    mm, ss = divmod(rest, 60)
    # PostgreSQL has no year 0: astronomical year y <= 0 prints as (1 - y) with a " BC" suffix.
    shown_year = year if year > 0 else 1 - year
    text = f"{shown_year:04d}-{month:02d}-{day:02d} {hh:02d}:{mm:02d}:{ss:02d}"
    if frac:
        text += "." + f"{frac:06d}".rstrip("0")
    text += "+00"
    return text if year > 0 else text + " BC"


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day count from 1970-01-01 (any range, unlike datetime)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type: str
    type_oid: int
    key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    schema: str
    table: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


class _Malformed(Exception):
    """Internal: this message cannot be decoded; becomes an X record (or a count outside transactions)."""

    def __init__(self, reason: str, relation: Relation | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.relation = relation


class _Reader:
    """Big-endian reads over one message; any overrun raises _Malformed naming what was being read."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 1  # past the message type byte
        self.what = what

    def take(self, n: int, field: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _Malformed(
                f"{self.what} message truncated: {field} needs {n} bytes at offset {self.pos}, "
                f"message has {len(self.data)}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int8(self, field: str) -> int:
        return self.take(1, field)[0]

    def int16(self, field: str) -> int:
        return int(struct.unpack(">h", self.take(2, field))[0])

    def int32(self, field: str) -> int:
        return int(struct.unpack(">i", self.take(4, field))[0])

    def uint32(self, field: str) -> int:
        return int(struct.unpack(">I", self.take(4, field))[0])

    def int64(self, field: str) -> int:
        return int(struct.unpack(">q", self.take(8, field))[0])

    def uint64(self, field: str) -> int:
        return int(struct.unpack(">Q", self.take(8, field))[0])

    def char(self, field: str) -> str:
        return chr(self.int8(field))

    def string(self, field: str) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise _Malformed(f"{self.what} message truncated: {field} at offset {self.pos} has no terminating NUL")
        raw = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Malformed(
                f"{self.what} message: {field} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None

    def end(self) -> None:
        # Protocol v1 messages have an exact layout: extra bytes mean the layout is not what we parse
        # (another protocol version, or corruption), and guessing would misplace every field.
        if self.pos != len(self.data):
            raise _Malformed(f"{self.what} message has {len(self.data) - self.pos} unexpected trailing bytes")


# One column of a TupleData: (relation column, value) or None when the column was sent as
# 'u' (unchanged TOASTed value, absent from the record).
_TupleValue = tuple[RelationColumn, str | None]


class PgOutputDecoder:
    """Stateful over the rows of one peek; yields ChangeRecords in commit order.

    ``confirm_lsn`` is what the slot may be advanced to once every record yielded so far is durable
    (the end LSN of the last Commit), ``None`` before the first one. ``quarantined_outside_transaction``
    counts undecodable messages that had no transaction to be positioned in (a damaged Begin makes
    everything up to the next Begin such a message); nothing of theirs reaches the records.

    ``type_name`` is called for each distinct (type oid, typmod) of a Relation message; an error it
    raises (the source connection failing) propagates: it is not bad input.
    """

    def __init__(self, type_name: Callable[[int, int], str]) -> None:
        self._type_name = type_name
        self._type_cache: dict[tuple[int, int], str] = {}
        # pgoutput describes each relation once per decoding session (again after a schema change),
        # so descriptions outlive the transaction they arrived in.
        self._relations: dict[int, Relation] = {}
        self._txn: OpenTransaction | None = None
        self.confirm_lsn: int | None = None
        self.messages_skipped = 0
        self.quarantined_outside_transaction = 0
        # Loader heartbeats seen in committed transactions (see loader.capture.heartbeat), in order.
        self.heartbeats: list[heartbeat.Seen] = []
        self._txn_heartbeats: list[heartbeat.Seen] = []
        # DDL messages (loader.capture.ddl) of committed transactions, in order; capture takes them.
        self.ddl: list[ddl.Message] = []
        self._txn_ddl: list[ddl.Message] = []
        # Why the last message outside a transaction was quarantined (for the capture's report).
        self.last_outside_reason: str | None = None

    @property
    def in_transaction(self) -> bool:
        return self._txn is not None

    @property
    def relations(self) -> dict[int, Relation]:
        return dict(self._relations)

    def feed(self, data: bytes, row_lsn: int) -> Iterator[ChangeRecord]:
        """Decode one pgoutput message (a peek row's ``data``; ``row_lsn`` is that row's ``lsn``)."""
        msg = bytes(data)
        txn = self._txn
        saved_seq = txn.seq if txn is not None else 0
        try:
            # Decode the whole message before yielding anything, so a malformed one is quarantined
            # as a unit and never half-emitted.
            records = self._decode(msg, row_lsn)
        except _Malformed as exc:
            if txn is not None:
                txn.seq = saved_seq
            records = self._quarantine(msg, row_lsn, exc.reason, exc.relation)
        yield from records

    # -- dispatch ---------------------------------------------------------------------------------

    def _decode(self, msg: bytes, row_lsn: int) -> list[ChangeRecord]:
        if not msg:
            raise _Malformed("empty pgoutput message")
        kind = chr(msg[0])
        what = _MESSAGE_NAMES.get(kind)
        if what is None:
            raise _Malformed(f"unknown pgoutput message type {msg[0]:#04x} ({kind!r})")
        r = _Reader(msg, what)
        if kind == "B":
            return self._begin(r, row_lsn)
        if kind == "C":
            return self._commit(r, row_lsn)
        if kind == "R":
            self._relation(r)
            return []
        if kind == "Y":
            r.uint32("type oid")
            r.string("type namespace")
            r.string("type name")
            r.end()
            return []
        if kind == "O":
            r.uint64("origin commit LSN")
            r.string("origin name")
            r.end()
            return []
        if kind == "M":
            flags = r.int8("flags")
            message_lsn = r.uint64("message LSN")
            prefix = r.string("prefix")
            length = r.int32("content length")
            if length < 0:
                raise _Malformed(f"Message message has a negative content length {length}")
            body = r.take(length, "content")
            r.end()
            beat = heartbeat.parse(prefix, body, message_lsn)
            if beat is not None and flags & 1 and self._txn is not None:
                self._txn_heartbeats.append(beat)  # counted once its transaction commits
                return []
            change = ddl.parse(prefix, body, message_lsn)
            if change is not None and flags & 1 and self._txn is not None:
                self._txn_ddl.append(change)  # acted on once its transaction commits
                return []
            self.messages_skipped += 1
            return []
        if kind == "T":
            return self._truncate(r, row_lsn)
        return self._row_change(kind, r, row_lsn)

    def _begin(self, r: _Reader, row_lsn: int) -> list[ChangeRecord]:
        final_lsn = r.uint64("final LSN")
        commit_ts = r.int64("commit timestamp")
        xid = r.uint32("xid")
        r.end()
        out: list[ChangeRecord] = []
        if self._txn is not None:
            # A Begin inside a transaction means its Commit never arrived: close it so its records stay
            # positioned and the stream moves on, but do not confirm past it (its end is unknown).
            old = self._txn
            old.seq += 1
            out.append(self._x_record(old, row_lsn, "transaction ended without a Commit message", r.data, None))
            out.append(old.commit())
        self._txn = OpenTransaction(xid=xid, commit_lsn=final_lsn, ts=format_timestamptz(commit_ts))
        return out

    def _commit(self, r: _Reader, row_lsn: int) -> list[ChangeRecord]:
        txn = self._txn
        if txn is None:
            raise _Malformed("Commit message outside a transaction")
        out: list[ChangeRecord] = []
        try:
            r.int8("flags")
            commit_lsn = r.uint64("commit LSN")
            end_lsn = r.uint64("end LSN")
            r.int64("commit timestamp")
            r.end()
        except _Malformed as exc:
            # The transaction still ends here. A commit row's own lsn column is the commit's end LSN
            # (verified against the server), so the slot can move past it instead of wedging on a
            # message that decodes the same way on every peek.
            txn.seq += 1
            out.append(self._x_record(txn, row_lsn, exc.reason, r.data, None))
            end_lsn = row_lsn if row_lsn > txn.commit_lsn else -1
        else:
            if commit_lsn != txn.commit_lsn:
                txn.seq += 1
                reason = (
                    f"Commit LSN {format_lsn(commit_lsn)} differs from the Begin's final LSN "
                    f"{format_lsn(txn.commit_lsn)}"
                )
                out.append(self._x_record(txn, row_lsn, reason, r.data, None))
        out.append(txn.commit())
        if end_lsn >= 0:
            self.confirm_lsn = end_lsn
            for beat in self._txn_heartbeats:
                beat.end_lsn = end_lsn
            self.heartbeats += self._txn_heartbeats
            for change in self._txn_ddl:
                change.commit_lsn = txn.commit_lsn
            self.ddl += self._txn_ddl
        self._txn_heartbeats = []
        self._txn_ddl = []
        self._txn = None
        return out

    def _relation(self, r: _Reader) -> None:
        oid = r.uint32("relation oid")
        try:
            self._relations[oid] = self._relation_body(oid, r)
        except _Malformed:
            # Forget an older description: decoding later changes with it could misread their columns,
            # while an unknown relation quarantines them.
            self._relations.pop(oid, None)
            raise

    def _relation_body(self, oid: int, r: _Reader) -> Relation:
        namespace = r.string("namespace")
        name = r.string("relation name")
        replica_identity = r.char("replica identity")
        ncols = r.int16("column count")
        if ncols < 0:
            raise _Malformed(f"Relation message has a negative column count {ncols}")
        described: list[tuple[str, int, int, bool]] = []
        for i in range(ncols):
            flags = r.int8(f"column {i + 1} flags")
            col_name = r.string(f"column {i + 1} name")
            type_oid = r.uint32(f"column {i + 1} type oid")
            typmod = r.int32(f"column {i + 1} typmod")
            described.append((col_name, type_oid, typmod, bool(flags & _KEY_FLAG)))
        r.end()
        columns = tuple(RelationColumn(n, self._type(t, m), t, k) for n, t, m, k in described)
        # pgoutput sends an empty namespace for pg_catalog.
        return Relation(oid, namespace or "pg_catalog", name, replica_identity, columns)

    def _type(self, oid: int, typmod: int) -> str:
        key = (oid, typmod)
        name = self._type_cache.get(key)
        if name is None:
            name = self._type_name(oid, typmod)
            self._type_cache[key] = name
        return name

    def _row_change(self, kind: str, r: _Reader, row_lsn: int) -> list[ChangeRecord]:
        oid = r.uint32("relation oid")
        rel = self._relations.get(oid)
        if rel is None:
            raise _Malformed(f"{r.what} for relation oid {oid}, never described by a Relation message")
        try:
            tag = r.char("tuple tag")
            old: list[_TupleValue | None] | None = None
            old_tag = ""
            if kind in ("U", "D") and tag in ("K", "O"):
                old_tag = tag
                old = self._tuple(r, rel, "old tuple")
                if kind == "U":
                    tag = r.char("new tuple tag")
            elif kind == "D":
                raise _Malformed(f"Delete message: expected 'K' or 'O' tuple, got {tag!r}")
            new: list[_TupleValue | None] = []
            if kind in ("I", "U"):
                if tag != "N":
                    raise _Malformed(f"{r.what} message: expected 'N' (new tuple), got {tag!r}")
                new = self._tuple(r, rel, "new tuple")
            r.end()
        except _Malformed as exc:
            raise _Malformed(exc.reason, rel) from None
        txn = self._txn
        if txn is None:
            raise _Malformed(f"{r.what} of {rel.schema}.{rel.table} outside a transaction", rel)
        if kind == "I":
            identity: list[Column] = []
        elif old is None:
            # Update without an old tuple: the key did not change. wal2json then prints the identity from
            # the new row's key columns; do the same so both inputs give history the same old key.
            identity = _columns(new, keys_only=True)
        elif old_tag == "K":
            # A 'K' tuple carries every column, the non-key ones as nulls: keep the key columns.
            identity = _columns(old, keys_only=True)
        else:
            identity = _columns(old)
        txn.seq += 1
        return [txn.record(kind, rel.schema, rel.table, row_lsn, columns=_columns(new), identity=identity)]

    def _tuple(self, r: _Reader, rel: Relation, which: str) -> list[_TupleValue | None]:
        ncols = r.int16(f"{which} column count")
        if ncols != len(rel.columns):
            raise _Malformed(
                f"{r.what} of {rel.schema}.{rel.table}: {which} has {ncols} columns, "
                f"the Relation message described {len(rel.columns)}"
            )
        out: list[_TupleValue | None] = []
        for col in rel.columns:
            kind = r.char(f"{which} column {col.name!r} kind")
            if kind == "n":
                out.append((col, None))
            elif kind == "u":
                out.append(None)
            elif kind == "t":
                length = r.int32(f"{which} column {col.name!r} length")
                if length < 0:
                    raise _Malformed(f"{r.what} of {rel.schema}.{rel.table}: column {col.name!r} has length {length}")
                raw = r.take(length, f"{which} column {col.name!r} value")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _Malformed(
                        f"{r.what} of {rel.schema}.{rel.table}: column {col.name!r} is not valid UTF-8 "
                        f"({exc.reason} at byte {exc.start})"
                    ) from None
                out.append((col, _value_text(col, text)))
            elif kind == "b":
                raise _Malformed(
                    f"{r.what} of {rel.schema}.{rel.table}: column {col.name!r} sent in binary format, "
                    "which proto_version 1 text mode never requests"
                )
            else:
                raise _Malformed(f"{r.what} of {rel.schema}.{rel.table}: column {col.name!r} has unknown kind {kind!r}")
        return out

    def _truncate(self, r: _Reader, row_lsn: int) -> list[ChangeRecord]:
        count = r.int32("relation count")
        if count < 0:
            raise _Malformed(f"Truncate message has a negative relation count {count}")
        r.int8("options")
        oids = [r.uint32(f"relation oid {i + 1}") for i in range(count)]
        r.end()
        txn = self._txn
        if txn is None:
            raise _Malformed("Truncate outside a transaction")
        out: list[ChangeRecord] = []
        for oid in oids:
            txn.seq += 1
            rel = self._relations.get(oid)
            if rel is None:
                # Only this relation is unknown: the others' truncates still apply.
                out.append(
                    self._x_record(
                        txn,
                        row_lsn,
                        f"Truncate of relation oid {oid}, never described by a Relation message",
                        r.data,
                        None,
                    )
                )
                continue
            out.append(txn.record("T", rel.schema, rel.table, row_lsn))
        return out

    # -- quarantine -------------------------------------------------------------------------------

    def _quarantine(self, msg: bytes, row_lsn: int, reason: str, rel: Relation | None) -> list[ChangeRecord]:
        txn = self._txn
        if txn is None:
            self.quarantined_outside_transaction += 1
            self.last_outside_reason = f"{reason} (row LSN {format_lsn(row_lsn)})"
            return []
        txn.seq += 1
        return [self._x_record(txn, row_lsn, reason, msg, rel)]

    @staticmethod
    def _x_record(txn: OpenTransaction, row_lsn: int, reason: str, msg: bytes, rel: Relation | None) -> ChangeRecord:
        return txn.record(
            "X", rel.schema if rel else "", rel.table if rel else "", row_lsn, reason=reason, raw=msg.hex()
        )


def _value_text(col: RelationColumn, text: str) -> str:
    # wal2json prints boolean (the type itself, not a domain over it) as JSON true/false, which the
    # wal2json path turns into 'true'/'false'; boolout sends 't'/'f'.
    if col.type_oid == BOOL_OID:
        if text == "t":
            return "true"
        if text == "f":
            return "false"
    return text


def _columns(values: Iterable[_TupleValue | None], keys_only: bool = False) -> list[Column]:
    """Record columns of a tuple: unchanged TOASTed values ('u') are left out, nulls kept."""
    return [
        Column(col.name, col.type, value)
        for col, value in (v for v in values if v is not None)
        if col.key or not keys_only
    ]


# -- publication helpers (psycopg 3 connection in autocommit mode) ---------------------------------


def publication_exists(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)", (name,)).fetchone()
    return bool(row and row[0])


_BLOCKED_TABLES_SQL = f"""
SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
  AND NOT {HAS_IDENTITY_SQL}
ORDER BY 1, 2
"""


def tables_without_replica_identity(conn: psycopg.Connection) -> list[str]:
    """Tables whose UPDATE and DELETE PostgreSQL rejects once a publication of all tables exists.

    A publication that publishes updates/deletes makes the server refuse them on a table with no
    replica identity to send ("cannot update table ... because it does not have a replica identity
    and publishes updates"). Fix: a primary key, or ``ALTER TABLE ... REPLICA IDENTITY FULL``.
    """
    return [f"{s}.{t}" for s, t in conn.execute(_BLOCKED_TABLES_SQL).fetchall()]


def ensure_publication(
    conn: psycopg.Connection,
    name: str,
    *,
    captured_tables: Iterable[str] = (),
    allow_blocked_tables: bool = False,
    tables: Iterable[str] | None = None,
) -> None:
    """Create ``CREATE PUBLICATION <name> FOR TABLE <tables>`` (``FOR ALL TABLES`` when ``tables``
    is None) unless a publication of that name exists.

    Capture passes ``tables``: exactly the captured tables (included by the configuration, readable
    by the role, with a replica identity); :func:`sync_publication` keeps the list in step.

    Run it before creating the pgoutput slot: changes decoded from before the publication existed
    make pgoutput fail. An existing publication is checked to publish every action without row
    filters or column lists (otherwise changes would be silently missing from the stream).

    Refuses (``SourceError``) when some table has no replica identity, because the new publication
    would make its UPDATE/DELETE fail on the source; ``allow_blocked_tables=True`` overrides.
    ``captured_tables`` ("schema.table") only shapes the hint of the privilege error.
    """
    if publication_exists(conn, name):
        _check_publication(conn, name)
        return
    listed = sorted(tables) if tables is not None else None
    if listed is None:
        stmt = sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(name))
    elif listed:
        stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE ").format(sql.Identifier(name)) + sql.SQL(", ").join(
            _qualified_sql(conn, t) for t in listed
        )
    else:
        stmt = sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(name))
    if not allow_blocked_tables:
        blocked = tables_without_replica_identity(conn)
        if listed is not None:
            blocked = [t for t in blocked if t in listed]
        if blocked:
            shown = ", ".join(blocked[:10]) + (f" and {len(blocked) - 10} more" if len(blocked) > 10 else "")
            raise SourceError(
                f"not creating publication {name!r}: PostgreSQL would then reject UPDATE and DELETE on "
                f"{len(blocked)} table(s) without a replica identity: {shown}",
                hint="give them a primary key or ALTER TABLE ... REPLICA IDENTITY FULL, or have an administrator "
                "create a publication FOR TABLE listing only the captured tables",
            )
    try:
        conn.execute(stmt)
    except psycopg.errors.DuplicateObject:
        # Created concurrently by someone else: fine, as long as it publishes everything.
        _check_publication(conn, name)
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
        # Read-only: default_transaction_read_only set for the loader's role or database, which an
        # administrator meant; the loader does not override it.
        alternative = ""
        shown_tables = [_qualified_sql(conn, t) for t in (listed if listed is not None else captured_tables)]
        if shown_tables:
            alt = sql.SQL("CREATE PUBLICATION {} FOR TABLE ").format(sql.Identifier(name)) + sql.SQL(", ").join(
                shown_tables
            )
            alternative = f", or: {alt.as_string(conn)};"
        else:
            quoted = sql.Identifier(name).as_string(conn)
            alternative = f", or CREATE PUBLICATION {quoted} FOR TABLE <the captured tables>;"
        raise SourceError(
            f"cannot create publication {name!r}: {str(exc).strip()}",
            hint=f"an administrator must run: {stmt.as_string(conn)};{alternative}"
            " (before the pgoutput slot is created)",
        ) from exc


class PublicationNotSynced(SourceError):
    """The publication could not be made to list exactly the captured tables (capture goes on)."""


def published_tables(conn: psycopg.Connection, name: str) -> list[str] | None:
    """The tables the publication lists by name (``schema.table``); None for ``FOR ALL TABLES``."""
    row = conn.execute("SELECT oid, puballtables FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    if row is None:
        return []
    if row[1]:
        return None
    rows = conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = %s ORDER BY 1",
        (row[0],),
    ).fetchall()
    return [r[0] for r in rows]


def sync_publication(conn: psycopg.Connection, name: str, tables: Iterable[str]) -> tuple[list[str], list[str]]:
    """Make the publication list exactly ``tables`` (``ALTER PUBLICATION ... SET TABLE``); returns
    (added, removed). ``PublicationNotSynced`` when it is ``FOR ALL TABLES`` or the role may not
    alter it (altering needs ownership of the publication and of each table), with the statement
    an administrator can run.

    A table added here was not published before: its changes up to now were never decoded, so the
    caller resyncs it.
    """
    want = sorted(set(tables))
    before = published_tables(conn, name)
    if before is None:
        raise PublicationNotSynced(
            f"publication {name!r} is FOR ALL TABLES: every table's changes are sent, including tables not "
            "captured (the loader drops them)",
            hint="an administrator replaces it, in one transaction: DROP PUBLICATION "
            f"{sql.Identifier(name).as_string(conn)}; CREATE PUBLICATION {sql.Identifier(name).as_string(conn)} "
            f"FOR TABLE {', '.join(sql.Identifier(*t.split('.', 1)).as_string(conn) for t in want) or '...'}",
        )
    added = sorted(set(want) - set(before))
    removed = sorted(set(before) - set(want))
    if not added and not removed:
        return [], []
    stmt = _set_table_sql(conn, name, want, before)
    try:
        conn.execute(stmt)
    except (
        psycopg.errors.InsufficientPrivilege,
        psycopg.errors.ObjectNotInPrerequisiteState,
        psycopg.errors.ReadOnlySqlTransaction,
    ) as exc:
        raise PublicationNotSynced(
            f"cannot update publication {name!r} ({len(added)} table(s) to add, {len(removed)} to remove): "
            f"{str(exc).strip()}",
            hint=f"an administrator runs: {stmt.as_string(conn)};",
        ) from exc
    return added, removed


def _set_table_sql(conn: psycopg.Connection, name: str, want: list[str], before: list[str]) -> sql.Composed:
    if want:
        return sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(sql.Identifier(name)) + sql.SQL(", ").join(
            _qualified_sql(conn, t) for t in want
        )
    return sql.SQL("ALTER PUBLICATION {} DROP TABLE ").format(sql.Identifier(name)) + sql.SQL(", ").join(
        _qualified_sql(conn, t) for t in before
    )


def _qualified_sql(conn: psycopg.Connection, table: str) -> sql.Composable:
    if "." not in table:
        return sql.Identifier(table)
    return sql.Identifier(*split_qualified(conn, table))


def _check_publication(conn: psycopg.Connection, name: str) -> None:
    row = conn.execute(
        "SELECT pubinsert AND pubupdate AND pubdelete AND pubtruncate,"
        " EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid"
        "         AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL))"
        " FROM pg_publication p WHERE pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return
    all_actions, filtered = row
    if not all_actions:
        raise SourceError(
            f"publication {name!r} does not publish every insert, update, delete and truncate",
            hint=f"ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate')",
        )
    if filtered:
        raise SourceError(
            f"publication {name!r} has row filters or column lists, so its stream is not the tables' full history",
            hint="use a publication without WHERE clauses or column lists",
        )


def format_type_lookup(conn: psycopg.Connection) -> Callable[[int, int], str]:
    """``type_name`` for :class:`PgOutputDecoder`: cached ``format_type(oid, typmod)`` on ``conn``.

    The typmod is passed as given, -1 included (the Relation message's "no typmod"): that is what
    wal2json prints (``bpchar`` for an unsized bpchar column; a NULL typmod would say ``character``).
    """
    cache: dict[tuple[int, int], str] = {}

    def type_name(oid: int, typmod: int) -> str:
        key = (oid, typmod)
        name = cache.get(key)
        if name is None:
            row = conn.execute("SELECT format_type(%s::oid, %s::integer)", (oid, typmod)).fetchone()
            name = str(row[0]) if row and row[0] is not None else "???"
            cache[key] = name
        return name

    return type_name
