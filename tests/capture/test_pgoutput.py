"""The pgoutput (protocol v1) decoder: hand-built messages, then a real PostgreSQL 15 against wal2json.

The unit tests pack messages with ``struct`` exactly as the protocol documents them; the integration
tests read one workload through a wal2json slot and a pgoutput slot and require the same records,
except where pgoutput is better (NaN / Infinity kept) or cannot say the same (generated columns,
transactions with nothing published).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import struct
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql

from loader.capture.pgoutput import (
    PgOutputDecoder,
    ensure_publication,
    format_timestamptz,
    format_type_lookup,
    peek_options,
    publication_exists,
    tables_without_replica_identity,
)
from loader.capture.slot import SESSION_OPTIONS
from loader.capture.wal2json import WAL2JSON_OPTIONS, Wal2JsonDecoder
from loader.errors import SourceError
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.lsn import parse_lsn
from tests.harness import TEST_PG, create_db

# ---------------------------------------------------------------------------------------------------
# Message builders (PostgreSQL 15 docs, "Logical Replication Message Formats", protocol version 1)
# ---------------------------------------------------------------------------------------------------

UNCHANGED = object()  # a 'u' column: unchanged TOASTed value
INT4, INT8, BOOL, TEXT, NUMERIC, FLOAT8, BYTEA = 23, 20, 16, 25, 1700, 701, 17
TYPES = {
    (INT4, -1): "integer",
    (INT8, -1): "bigint",
    (BOOL, -1): "boolean",
    (TEXT, -1): "text",
    (NUMERIC, -1): "numeric",
    (NUMERIC, (12 << 16 | 2) + 4): "numeric(12,2)",
    (FLOAT8, -1): "double precision",
    (BYTEA, -1): "bytea",
}
TS_US = 848_000_000_000_000  # 2026-11-14 19:33:20+00 in microseconds since 2000-01-01


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def begin(final_lsn: int, xid: int, ts: int = TS_US) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts, xid)


def commit(commit_lsn: int, end_lsn: int, ts: int = TS_US) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, ts)


def relation(oid: int, ns: str, name: str, cols: Sequence[tuple[int, str, int, int]], ident: bytes = b"d") -> bytes:
    body = b"".join(struct.pack(">B", f) + cstr(n) + struct.pack(">Ii", t, m) for f, n, t, m in cols)
    return b"R" + struct.pack(">I", oid) + cstr(ns) + cstr(name) + ident + struct.pack(">h", len(cols)) + body


def tuple_data(values: Sequence[Any]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            raw = v if isinstance(v, bytes) else str(v).encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def insert(oid: int, values: Sequence[Any]) -> bytes:
    return b"I" + struct.pack(">I", oid) + b"N" + tuple_data(values)


def update(oid: int, new: Sequence[Any], old: Sequence[Any] | None = None, tag: bytes = b"K") -> bytes:
    old_part = tag + tuple_data(old) if old is not None else b""
    return b"U" + struct.pack(">I", oid) + old_part + b"N" + tuple_data(new)


def delete(oid: int, old: Sequence[Any], tag: bytes = b"K") -> bytes:
    return b"D" + struct.pack(">I", oid) + tag + tuple_data(old)


def truncate(oids: Sequence[int], options: int = 0) -> bytes:
    return b"T" + struct.pack(">iB", len(oids), options) + b"".join(struct.pack(">I", o) for o in oids)


def message(transactional: bool, lsn: int, prefix: str, content: bytes) -> bytes:
    return b"M" + struct.pack(">BQ", int(transactional), lsn) + cstr(prefix) + struct.pack(">i", len(content)) + content


def type_message(oid: int, ns: str, name: str) -> bytes:
    return b"Y" + struct.pack(">I", oid) + cstr(ns) + cstr(name)


def origin_message(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


ACCOUNTS = 16_400
ACCOUNTS_COLS = [
    (1, "id", INT4, -1),
    (0, "active", BOOL, -1),
    (0, "balance", NUMERIC, (12 << 16 | 2) + 4),
    (0, "ratio", FLOAT8, -1),
    (0, "note", TEXT, -1),
]
EVENTS = 16_410  # REPLICA IDENTITY FULL: every column flagged as key
EVENTS_COLS = [(1, "a", INT4, -1), (1, "b", TEXT, -1), (1, "c", NUMERIC, -1)]


class FakeTypes:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, oid: int, typmod: int) -> str:
        self.calls.append((oid, typmod))
        return TYPES[(oid, typmod)]


def feed_all(dec: PgOutputDecoder, msgs: Sequence[tuple[bytes, int]]) -> list[ChangeRecord]:
    return [rec for data, lsn in msgs for rec in dec.feed(data, lsn)]


def described() -> PgOutputDecoder:
    """A decoder that has seen the Relation messages of both test tables (outside any transaction)."""
    dec = PgOutputDecoder(FakeTypes())
    assert (
        feed_all(
            dec,
            [
                (relation(ACCOUNTS, "public", "accounts", ACCOUNTS_COLS), 1),
                (relation(EVENTS, "app", "events", EVENTS_COLS, b"f"), 1),
            ],
        )
        == []
    )
    return dec


def cols(*triples: tuple[str, str, str | None]) -> list[Column]:
    return [Column(*t) for t in triples]


# ---------------------------------------------------------------------------------------------------
# Unit tests
# ---------------------------------------------------------------------------------------------------


def test_insert_then_commit_gives_wal2json_shaped_records() -> None:
    types = FakeTypes()
    dec = PgOutputDecoder(types)
    assert not dec.in_transaction and dec.confirm_lsn is None
    recs = feed_all(
        dec,
        [
            (begin(0x1_0000_0200, 741), 0x1_0000_0100),
            (relation(ACCOUNTS, "public", "accounts", ACCOUNTS_COLS), 0x1_0000_0100),
            (insert(ACCOUNTS, [1, "t", "NaN", "-Infinity", None]), 0x1_0000_0100),
            (insert(ACCOUNTS, [2, "f", "12.50", "Infinity", "héllo\n"]), 0x1_0000_0180),
        ],
    )
    assert dec.in_transaction and dec.confirm_lsn is None
    ts = "2026-11-14 19:33:20+00"
    assert recs == [
        ChangeRecord(
            op="I",
            commit_lsn=0x1_0000_0200,
            seq=1,
            xid=741,
            ts=ts,
            schema="public",
            table="accounts",
            change_lsn=0x1_0000_0100,
            columns=cols(
                ("id", "integer", "1"),
                ("active", "boolean", "true"),
                ("balance", "numeric(12,2)", "NaN"),
                ("ratio", "double precision", "-Infinity"),
                ("note", "text", None),
            ),
        ),
        ChangeRecord(
            op="I",
            commit_lsn=0x1_0000_0200,
            seq=2,
            xid=741,
            ts=ts,
            schema="public",
            table="accounts",
            change_lsn=0x1_0000_0180,
            columns=cols(
                ("id", "integer", "2"),
                ("active", "boolean", "false"),
                ("balance", "numeric(12,2)", "12.50"),
                ("ratio", "double precision", "Infinity"),
                ("note", "text", "héllo\n"),
            ),
        ),
    ]
    assert recs[0].identity == [] and recs[0].pk == []
    done = list(dec.feed(commit(0x1_0000_0200, 0x1_0000_0230), 0x1_0000_0230))
    assert done == [ChangeRecord(op=COMMIT, commit_lsn=0x1_0000_0200, seq=3, xid=741, ts=ts)]
    assert not dec.in_transaction and dec.confirm_lsn == 0x1_0000_0230
    # One type lookup per distinct (oid, typmod).
    assert sorted(types.calls) == sorted({(c[2], c[3]) for c in ACCOUNTS_COLS})


def test_type_names_are_looked_up_once_across_relations_and_redescriptions() -> None:
    types = FakeTypes()
    dec = PgOutputDecoder(types)
    for _ in range(3):
        list(dec.feed(relation(ACCOUNTS, "public", "accounts", ACCOUNTS_COLS), 1))
        list(dec.feed(relation(ACCOUNTS + 1, "public", "other", [(1, "id", INT4, -1), (0, "x", TEXT, -1)]), 1))
    assert len(types.calls) == len(set(types.calls)) == len({(c[2], c[3]) for c in ACCOUNTS_COLS})


def test_update_with_unchanged_toast_leaves_the_column_out_and_keys_it_from_the_new_row() -> None:
    dec = described()
    recs = feed_all(
        dec,
        [
            (begin(500, 7), 400),
            (update(ACCOUNTS, [1, "t", "3.00", None, UNCHANGED]), 410),
            (commit(500, 530), 530),
        ],
    )
    upd = recs[0]
    assert upd.op == "U" and upd.seq == 1 and upd.change_lsn == 410
    assert [c.name for c in upd.columns] == ["id", "active", "balance", "ratio"]  # note absent, not null
    assert upd.columns[3] == Column("ratio", "double precision", None)
    # wal2json prints the identity of an update that kept its key from the new row's key columns.
    assert upd.identity == cols(("id", "integer", "1"))
    assert recs[1].op == COMMIT and recs[1].seq == 2


def test_key_changing_update_carries_the_old_key_only() -> None:
    dec = described()
    recs = feed_all(
        dec,
        [
            (begin(500, 7), 400),
            (update(ACCOUNTS, [10, "f", "1.00", "0.5", "x"], old=[1, None, None, None, None], tag=b"K"), 410),
            (commit(500, 530), 530),
        ],
    )
    assert recs[0].identity == cols(("id", "integer", "1"))
    assert recs[0].columns[0] == Column("id", "integer", "10")


def test_replica_identity_full_update_and_delete_carry_the_whole_old_row() -> None:
    dec = described()
    recs = feed_all(
        dec,
        [
            (begin(900, 8), 800),
            (update(EVENTS, [1, "new", "NaN"], old=[1, "old", "NaN"], tag=b"O"), 810),
            (delete(EVENTS, [2, None, "-Infinity"], tag=b"O"), 820),
            (commit(900, 930), 930),
        ],
    )
    upd, dele, c = recs
    assert (upd.schema, upd.table) == ("app", "events")
    assert upd.identity == cols(("a", "integer", "1"), ("b", "text", "old"), ("c", "numeric", "NaN"))
    assert upd.columns == cols(("a", "integer", "1"), ("b", "text", "new"), ("c", "numeric", "NaN"))
    assert dele.op == "D" and dele.seq == 2 and dele.columns == []
    assert dele.identity == cols(("a", "integer", "2"), ("b", "text", None), ("c", "numeric", "-Infinity"))
    assert c.op == COMMIT and c.seq == 3


def test_delete_with_key_tuple_keeps_key_columns() -> None:
    dec = described()
    recs = feed_all(dec, [(begin(500, 7), 400), (delete(ACCOUNTS, [3, None, None, None, None]), 410)])
    assert recs[0].op == "D" and recs[0].columns == [] and recs[0].identity == cols(("id", "integer", "3"))


def test_truncate_of_two_relations_gives_one_record_each() -> None:
    dec = described()
    msgs = [(begin(500, 7), 400), (truncate([ACCOUNTS, EVENTS], options=1), 410), (commit(500, 530), 530)]
    recs = feed_all(dec, msgs)
    assert [(r.op, r.seq, r.table, r.columns, r.change_lsn) for r in recs] == [
        ("T", 1, "accounts", [], 410),
        ("T", 2, "events", [], 410),
        (COMMIT, 3, "", [], 0),
    ]


def test_logical_messages_types_and_origins_are_skipped() -> None:
    dec = described()
    recs = feed_all(
        dec,
        [
            (message(False, 300, "pfx", b"outside"), 300),
            (begin(500, 7), 400),
            (origin_message(0xABC, "upstream"), 400),
            (type_message(16_500, "public", "mood"), 400),
            (message(True, 405, "pfx", b"\x00\xffbinary content"), 405),
            (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 410),
            (commit(500, 530), 530),
        ],
    )
    assert [(r.op, r.seq) for r in recs] == [("I", 1), (COMMIT, 2)]
    assert dec.messages_skipped == 2 and dec.quarantined_outside_transaction == 0


def test_empty_transaction_still_commits() -> None:
    dec = PgOutputDecoder(FakeTypes())
    recs = feed_all(dec, [(begin(500, 7), 400), (commit(500, 530), 530)])
    assert recs == [ChangeRecord(op=COMMIT, commit_lsn=500, seq=1, xid=7, ts="2026-11-14 19:33:20+00")]
    assert dec.confirm_lsn == 530


@pytest.mark.parametrize(
    ("msg", "reason", "table"),
    [
        (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"])[:-3], "Insert message truncated", "accounts"),
        (insert(99_999, [1]), "relation oid 99999, never described", ""),
        (b"Z\x00\x01", "unknown pgoutput message type 0x5a", ""),
        (b"", "empty pgoutput message", ""),
        (insert(ACCOUNTS, [1, "t", "1.00", "1", b"\xff\xfe"]), "column 'note' is not valid UTF-8", "accounts"),
        (
            insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]).replace(b"t\x00\x00\x00\x01x", b"b\x00\x00\x00\x01x"),
            "binary format",
            "accounts",
        ),
        (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]) + b"\x00", "1 unexpected trailing bytes", "accounts"),
        (insert(ACCOUNTS, [1, "t"]), "new tuple has 2 columns, the Relation message described 5", "accounts"),
        (update(ACCOUNTS, [1, "t", "1.00", "1", "x"])[:5] + b"Q", "expected 'N'", "accounts"),
        (delete(ACCOUNTS, [1, None, None, None, None], tag=b"N"), "expected 'K' or 'O'", "accounts"),
        (relation(ACCOUNTS + 5, "public", "t", [(1, "id", INT4, -1)])[:-3], "Relation message truncated", ""),
        (message(True, 1, "p", b"abc")[:-1], "Message message truncated", ""),
        (type_message(1, "public", "x")[:-1], "no terminating NUL", ""),
        (b"B" + b"\x00" * 10, "Begin message truncated", ""),
    ],
)
def test_malformed_messages_inside_a_transaction_become_quarantine_records(msg: bytes, reason: str, table: str) -> None:
    dec = described()
    list(dec.feed(begin(500, 7), 400))
    list(dec.feed(insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 405))
    recs = list(dec.feed(msg, 410))
    assert len(recs) == 1
    x = recs[0]
    assert x.op == "X" and x.seq == 2 and x.commit_lsn == 500 and x.xid == 7 and x.change_lsn == 410
    assert reason in x.reason, x.reason
    assert x.table == table and x.schema == ("public" if table else "")
    assert x.raw == msg.hex() and x.columns == []
    # The stream goes on: later changes and the commit keep counting after the quarantine record.
    rest = feed_all(dec, [(insert(ACCOUNTS, [2, "f", "1.00", "1", "y"]), 420), (commit(500, 530), 530)])
    assert [(r.op, r.seq) for r in rest] == [("I", 3), (COMMIT, 4)]
    assert dec.confirm_lsn == 530 and not dec.in_transaction
    # The landing form carries it.
    back = ChangeRecord.from_json(x.to_json())
    assert back == x


def test_a_malformed_relation_forgets_the_old_description() -> None:
    dec = described()
    list(dec.feed(begin(500, 7), 400))
    [bad] = dec.feed(relation(ACCOUNTS, "public", "accounts", ACCOUNTS_COLS)[:-2], 401)
    assert bad.op == "X"
    [x] = dec.feed(insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 402)
    assert x.op == "X" and "never described" in x.reason


def test_truncate_naming_an_unknown_relation_quarantines_only_that_one() -> None:
    dec = described()
    list(dec.feed(begin(500, 7), 400))
    recs = list(dec.feed(truncate([ACCOUNTS, 77_777, EVENTS]), 410))
    assert [(r.op, r.seq, r.table) for r in recs] == [("T", 1, "accounts"), ("X", 2, ""), ("T", 3, "events")]
    assert "77777" in recs[1].reason


def test_malformed_input_outside_a_transaction_is_counted_not_raised() -> None:
    dec = described()
    outside = [
        begin(500, 7)[:-1],  # truncated Begin: what follows is outside a transaction too
        insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]),
        truncate([ACCOUNTS]),
        commit(500, 530),
        b"\x01",
    ]
    assert feed_all(dec, [(m, 400) for m in outside]) == []
    assert dec.quarantined_outside_transaction == len(outside)
    assert dec.last_outside_reason is not None and "unknown pgoutput message type" in dec.last_outside_reason
    assert dec.confirm_lsn is None and not dec.in_transaction
    # A well-formed transaction afterwards decodes normally.
    recs = feed_all(
        dec, [(begin(600, 8), 590), (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 595), (commit(600, 630), 630)]
    )
    assert [(r.op, r.seq, r.commit_lsn) for r in recs] == [("I", 1, 600), (COMMIT, 2, 600)]


def test_a_truncated_commit_still_ends_the_transaction_at_its_row_lsn() -> None:
    dec = described()
    recs = feed_all(
        dec, [(begin(500, 7), 400), (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 410), (commit(500, 530)[:-4], 530)]
    )
    assert [(r.op, r.seq) for r in recs] == [("I", 1), ("X", 2), (COMMIT, 3)]
    assert "Commit message truncated" in recs[1].reason
    # The commit row's lsn column is the commit's end LSN (checked against the server below).
    assert dec.confirm_lsn == 530 and not dec.in_transaction


def test_a_begin_without_the_previous_commit_closes_it_without_confirming() -> None:
    dec = described()
    recs = feed_all(
        dec,
        [
            (begin(500, 7), 400),
            (insert(ACCOUNTS, [1, "t", "1.00", "1", "x"]), 410),
            (begin(700, 8), 600),
            (commit(700, 730), 730),
        ],
    )
    assert [(r.op, r.seq, r.commit_lsn) for r in recs] == [
        ("I", 1, 500),
        ("X", 2, 500),
        (COMMIT, 3, 500),
        (COMMIT, 1, 700),
    ]
    assert dec.confirm_lsn == 730


def test_a_commit_for_another_transaction_is_flagged() -> None:
    dec = described()
    recs = feed_all(dec, [(begin(500, 7), 400), (commit(501, 530), 530)])
    assert [(r.op, r.seq) for r in recs] == [("X", 1), (COMMIT, 2)]
    assert "differs from the Begin's final LSN" in recs[0].reason


def test_pg_catalog_namespace_is_sent_empty() -> None:
    dec = PgOutputDecoder(FakeTypes())
    list(dec.feed(relation(5, "", "pg_x", [(1, "id", INT4, -1)]), 1))
    assert dec.relations[5].schema == "pg_catalog"


@pytest.mark.parametrize(
    ("usecs", "text"),
    [
        (0, "2000-01-01 00:00:00+00"),
        (1, "2000-01-01 00:00:00.000001+00"),
        (19_510, "2000-01-01 00:00:00.01951+00"),
        (19_217, "2000-01-01 00:00:00.019217+00"),
        (500_000, "2000-01-01 00:00:00.5+00"),
        (-1, "1999-12-31 23:59:59.999999+00"),
        (TS_US, "2026-11-14 19:33:20+00"),
        (-63_082_368_000_000_000, "0001-12-31 00:00:00+00 BC"),
        (9_223_371_331_200_000_000 - 1, "294276-12-31 23:59:59.999999+00"),
        ((1 << 63) - 1, "infinity"),
        (-(1 << 63), "-infinity"),
    ],
)
def test_format_timestamptz_prints_like_postgresql(usecs: int, text: str) -> None:
    assert format_timestamptz(usecs) == text


def test_format_timestamptz_agrees_with_datetime() -> None:
    rnd = random.Random(20261122)
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    low = int((dt.datetime(1, 1, 1, tzinfo=dt.UTC) - epoch).total_seconds()) * 1_000_000
    high = int((dt.datetime(9999, 12, 31, tzinfo=dt.UTC) - epoch).total_seconds()) * 1_000_000
    for _ in range(5000):
        us = rnd.randint(low, high)
        want = (epoch + dt.timedelta(microseconds=us)).isoformat(sep=" ").replace("+00:00", "")
        date_time, _, frac = want.partition(".")
        want = date_time + ("." + frac.rstrip("0") if frac.rstrip("0") else "") + "+00"
        assert format_timestamptz(us) == want


def test_peek_options_quote_names_that_would_be_folded() -> None:
    assert peek_options("loader_pub") == ("proto_version", "1", "publication_names", "loader_pub")
    assert peek_options("Loader") == ("proto_version", "1", "publication_names", '"Loader"')
    assert peek_options('a"b') == ("proto_version", "1", "publication_names", '"a""b"')


# ---------------------------------------------------------------------------------------------------
# Integration: the same workload through wal2json and pgoutput on a real PostgreSQL 15
# ---------------------------------------------------------------------------------------------------


@dataclass
class Source:
    dsn: str
    conn: psycopg.Connection
    uid: str
    slots: list[str] = field(default_factory=list)

    def run(self, *statements: str) -> None:
        for s in statements:
            self.conn.execute(s)

    def slot(self, name: str, plugin: str) -> None:
        self.conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))
        self.slots.append(name)


@pytest.fixture
def source(pg_admin: str) -> Iterator[Source]:
    uid = uuid.uuid4().hex[:8]
    db = f"pgout_{uid}"
    create_db(pg_admin, db)
    dsn = f"{TEST_PG}/{db}"
    conn = psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS)
    src = Source(dsn, conn, uid)
    try:
        yield src
    finally:
        conn.close()
        with psycopg.connect(pg_admin, autocommit=True) as admin:
            for slot in src.slots:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


def peek_wal2json(conn: psycopg.Connection, slot: str) -> tuple[list[ChangeRecord], Wal2JsonDecoder, list[str]]:
    placeholders = ", ".join(["%s"] * len(WAL2JSON_OPTIONS))
    rows = conn.execute(
        f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {placeholders})",
        (slot, *WAL2JSON_OPTIONS),
    ).fetchall()
    dec = Wal2JsonDecoder()
    recs: list[ChangeRecord] = []
    messages: list[str] = []
    for (data,) in rows:
        if json.loads(data)["action"] == "M":
            # Messages carry no change, and a non-transactional one arrives outside any transaction,
            # which this decoder does not accept (yet).
            messages.append(data)
            continue
        recs.extend(dec.feed(data))
    return recs, dec, messages


def peek_pgoutput(
    conn: psycopg.Connection, slot: str, publication: str, *extra: str
) -> tuple[list[ChangeRecord], PgOutputDecoder, list[tuple[bytes, int]]]:
    options = (*peek_options(publication), *extra)
    placeholders = ", ".join(["%s"] * len(options))
    rows = conn.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, {placeholders})",
        (slot, *options),
    ).fetchall()
    raw = [(bytes(data), parse_lsn(lsn)) for lsn, data in rows]
    dec = PgOutputDecoder(format_type_lookup(conn))
    recs = [rec for data, lsn in raw for rec in dec.feed(data, lsn)]
    return recs, dec, raw


PAYLOAD = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 4000) g)"  # 128 kB, TOASTed out of line
GENERATED = {("public", "gen_t", "doubled")}  # pgoutput (PostgreSQL 15) does not send generated columns


def workload(src: Source) -> None:
    src.run(
        "INSERT INTO typed VALUES (1, 9223372036854775807, 1234567890.12, 'NaN', 'Infinity', '-Infinity', true,"
        " E'h\u00e9llo \"quoted\" \\\\ tab\\t', " + PAYLOAD + ", '\\x00ff10', '2024-02-29 12:34:56.789+05:30',"
        " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, 2.50, null], \"s\": \"x\"}', '{1,NULL,3}', 'varchar',"
        " 'ab', 'bp', 'happy', '{a,\"b c\"}', '{t,f}', '2024-02-29', '1 day 02:03:04.5', 't')",
        "INSERT INTO typed (id, big, amount, n, r, d, flag, note, payload, ints)"
        " VALUES (2, -1, -0.5, 'Infinity', 'NaN', 'NaN', false, NULL, 'small', '{}'),"
        "        (3, 0, 0, '-Infinity', '-Infinity', 1.5e300, NULL, '', 'tiny', NULL)",
    )
    with src.conn.transaction():
        src.run(
            "UPDATE typed SET note = 'changed', flag = false WHERE id = 1",  # payload unchanged: sent as 'u'
            "UPDATE typed SET id = 20 WHERE id = 2",  # key change: old key as a 'K' tuple
        )
    src.run(
        "UPDATE typed SET payload = 'now small', r = 0.1 WHERE id = 1",
        "DELETE FROM typed WHERE id = 3",
        "INSERT INTO full_t VALUES (1, 'a', 'NaN'), (2, NULL, 1.5)",
        "UPDATE full_t SET b = 'z' WHERE a = 1",
        "DELETE FROM full_t WHERE a = 2",
        "INSERT INTO idx_t VALUES (1, 1, 'x')",
        "UPDATE idx_t SET v = 'y'",
        "UPDATE idx_t SET b = 2",
        "DELETE FROM idx_t",
        "INSERT INTO gen_t (id, x) VALUES (1, 21)",
        "UPDATE gen_t SET x = 22",
        "INSERT INTO trunc_a VALUES (1)",
        "INSERT INTO trunc_b VALUES (1)",
        "TRUNCATE trunc_a, trunc_b",
        "BEGIN",
        "COMMIT",  # no xid: decoded by neither plugin
        "CREATE TABLE ddl_only (x int)",  # a transaction with nothing to publish
        "SELECT pg_logical_emit_message(true, 'pfx', 'transactional alone')",
        "SELECT pg_logical_emit_message(false, 'pfx', 'not transactional')",
    )
    with src.conn.transaction():
        src.run(
            "INSERT INTO trunc_a VALUES (2)",
            "SELECT pg_logical_emit_message(true, 'pfx', 'inside')",
            "SELECT pg_logical_emit_message(false, 'pfx', 'inside, not transactional')",
            "INSERT INTO trunc_a VALUES (3)",
        )
    # A transaction replayed from another node carries an origin: pgoutput adds an 'O' message.
    origin = f"pgout_origin_{src.uid}"
    src.conn.execute("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        src.conn.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        src.run("INSERT INTO trunc_b VALUES (5)")
        src.conn.execute("SELECT pg_replication_origin_session_reset()")
    finally:
        src.conn.execute("SELECT pg_replication_origin_drop(%s)", (origin,))
    src.run("DELETE FROM trunc_a WHERE id = 2")


SCHEMA = (
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE DOMAIN yes_no AS boolean",
    (
        "CREATE TABLE typed (id int PRIMARY KEY, big bigint, amount numeric(12,2), n numeric, r real,"
        " d double precision, flag boolean, note text, payload text, data bytea, at timestamptz, u uuid, j jsonb,"
        " ints int[], vc varchar(20), ch char(3), bp bpchar, m mood, tags text[], flags boolean[], day date,"
        " span interval, yn yes_no)"
    ),
    "CREATE TABLE full_t (a int, b text, c numeric)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    "CREATE TABLE idx_t (a int NOT NULL, b int NOT NULL, v text)",
    "CREATE UNIQUE INDEX idx_t_ab ON idx_t (a, b)",
    "ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ab",
    "CREATE TABLE gen_t (id int PRIMARY KEY, x int, doubled int GENERATED ALWAYS AS (x * 2) STORED)",
    "CREATE TABLE trunc_a (id int PRIMARY KEY)",
    "CREATE TABLE trunc_b (id int PRIMARY KEY)",
)
SPECIAL = {"NaN", "Infinity", "-Infinity"}


def test_pgoutput_matches_wal2json_on_a_real_server(source: Source) -> None:
    src = source
    src.run(*SCHEMA)
    pub = f"pub_{src.uid}"
    # The publication first: pgoutput cannot decode changes written before it existed.
    ensure_publication(src.conn, pub)
    assert publication_exists(src.conn, pub)
    w_slot, p_slot = f"w2j_{src.uid}", f"pgo_{src.uid}"
    src.slot(w_slot, "wal2json")
    src.slot(p_slot, "pgoutput")
    workload(src)

    wrecs, wdec, wmessages = peek_wal2json(src.conn, w_slot)
    precs, pdec, raw = peek_pgoutput(src.conn, p_slot, pub)
    assert len(wmessages) == 4  # wal2json decodes every logical message...
    assert pdec.messages_skipped == 0  # ...pgoutput sends none unless asked ('messages' option)
    assert pdec.quarantined_outside_transaction == 0 and not pdec.in_transaction
    assert not [r for r in precs if r.op == "X"]

    # Transactions with nothing published (DDL only, a lone transactional message) have a commit record
    # from wal2json and nothing at all from pgoutput on PostgreSQL 15.
    def changed(recs: list[ChangeRecord]) -> set[int]:
        return {r.commit_lsn for r in recs if r.op != COMMIT}

    empty_w = [r for r in wrecs if r.op == COMMIT and r.commit_lsn not in changed(wrecs)]
    assert len(empty_w) >= 2, "expected the DDL and the lone-message transactions"
    assert all(r.seq == 1 for r in empty_w)
    assert not [r for r in precs if r.op == COMMIT and r.commit_lsn not in changed(precs)]
    wrecs = [r for r in wrecs if r.commit_lsn in changed(wrecs)]

    assert [(r.position, r.op, r.xid, r.ts, r.schema, r.table, r.change_lsn) for r in precs] == [
        (r.position, r.op, r.xid, r.ts, r.schema, r.table, r.change_lsn) for r in wrecs
    ]
    specials = 0

    def same(pcols: list[Column], wcols: list[Column]) -> None:
        nonlocal specials
        assert [(c.name, c.type) for c in pcols] == [(c.name, c.type) for c in wcols]
        for pc, wc in zip(pcols, wcols):
            if pc.value in SPECIAL and pc.type in ("numeric", "real", "double precision"):
                assert wc.value is None, (pc, wc)  # wal2json 2.5 prints NaN / Infinity as null
                specials += 1
            else:
                assert pc.value == wc.value, (pc, wc)

    for p, w in zip(precs, wrecs):
        same(p.columns, [c for c in w.columns if (w.schema, w.table, c.name) not in GENERATED])
        same(p.identity, [c for c in w.identity if (w.schema, w.table, c.name) not in GENERATED])
        assert p.pk == []
    # typed: inserts 3 + 3 + 2, updates 3 + 3 + 2 (r set to 0.1 in the last); full_t: the NaN row's insert,
    # then its update (new row and old identity).
    assert specials == 8 + 8 + 1 + 2
    # Same slot position to confirm, and a commit row's lsn column is the commit's end LSN.
    assert pdec.confirm_lsn is not None and pdec.confirm_lsn == wdec.last_commit_end_lsn
    for data, lsn in raw:
        if data[:1] == b"C":
            assert struct.unpack(">Q", data[10:18])[0] == lsn
    assert b"O" in {data[:1] for data, _ in raw}, "the origin transaction should send an Origin message"
    assert b"Y" in {data[:1] for data, _ in raw}, "the enum and the domain should send Type messages"

    by_table: dict[str, list[ChangeRecord]] = {}
    for r in precs:
        by_table.setdefault(r.table, []).append(r)
    typed = by_table["typed"]
    first = {c.name: c for c in typed[0].columns}
    assert first["n"].value == "NaN" and first["r"].value == "Infinity" and first["d"].value == "-Infinity"
    assert first["flag"] == Column("flag", "boolean", "true")
    assert first["yn"] == Column("yn", "yes_no", "t")  # a domain over boolean stays as sent, as in wal2json
    assert first["flags"].value == "{t,f}"
    assert first["amount"] == Column("amount", "numeric(12,2)", "1234567890.12")
    assert first["vc"].type == "character varying(20)" and first["ch"].type == "character(3)"
    assert first["bp"].type == "bpchar" and first["m"].type == "mood" and first["tags"].type == "text[]"
    assert first["at"] == Column("at", "timestamp with time zone", "2024-02-29 07:04:56.789+00")
    assert first["data"].value == "\\x00ff10" and first["note"].value == 'héllo "quoted" \\ tab\t'
    assert len(first["payload"].value or "") == 128_000
    toast_update, key_update = typed[3], typed[4]
    assert toast_update.op == "U" and "payload" not in {c.name for c in toast_update.columns}
    assert toast_update.identity == [Column("id", "integer", "1")]
    assert key_update.identity == [Column("id", "integer", "2")]
    assert {c.name: c.value for c in key_update.columns}["id"] == "20"
    full_delete = next(r for r in by_table["full_t"] if r.op == "D")
    assert full_delete.identity == [
        Column("a", "integer", "2"),
        Column("b", "text", None),
        Column("c", "numeric", "1.5"),
    ]
    assert [r.identity for r in by_table["idx_t"]][1:] == [
        [Column("a", "integer", "1"), Column("b", "integer", "1")],  # update keeping the key
        [Column("a", "integer", "1"), Column("b", "integer", "1")],  # update changing it: old key
        [Column("a", "integer", "1"), Column("b", "integer", "2")],  # delete
    ]
    truncs = [r for r in precs if r.op == "T"]
    assert [(r.table, r.seq) for r in truncs] == [("trunc_a", 1), ("trunc_b", 2)]
    assert truncs[0].commit_lsn == truncs[1].commit_lsn


def test_messages_option_sends_logical_messages_which_are_skipped(source: Source) -> None:
    src = source
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    pub = f"pub_{src.uid}"
    ensure_publication(src.conn, pub)
    slot = f"pgo_{src.uid}"
    src.slot(slot, "pgoutput")
    src.run(
        "SELECT pg_logical_emit_message(false, 'pfx', 'outside')",
        "SELECT pg_logical_emit_message(true, 'pfx', 'alone')",
    )
    with src.conn.transaction():
        src.run("INSERT INTO t VALUES (1)", "SELECT pg_logical_emit_message(true, 'pfx', 'inside')")
    plain, plain_dec, _ = peek_pgoutput(src.conn, slot, pub)
    with_messages, dec, raw = peek_pgoutput(src.conn, slot, pub, "messages", "true")
    assert dec.messages_skipped == 3 and plain_dec.messages_skipped == 0
    assert dec.quarantined_outside_transaction == 0 and not [r for r in with_messages if r.op == "X"]
    # The message layout as the server sends it: flags, LSN, prefix, content length, content.
    outside = next(d for d, _ in raw if d[:1] == b"M" and d[1] == 0)
    assert outside[10:14] == b"pfx\0" and outside[14:18] == struct.pack(">i", 7) and outside[18:] == b"outside"
    # A lone transactional message now opens a transaction of its own (commit record only).
    assert [(r.op, r.seq) for r in with_messages] == [(COMMIT, 1), ("I", 1), (COMMIT, 2)]
    assert [(r.op, r.seq) for r in plain] == [("I", 1), (COMMIT, 2)]


def test_publication_created_after_the_slot_breaks_decoding(source: Source) -> None:
    """Why ensure_publication must run before the slot is created (documented, not worked around)."""
    src = source
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    slot = f"pgo_{src.uid}"
    src.slot(slot, "pgoutput")
    src.run("INSERT INTO t VALUES (1)")
    pub = f"pub_{src.uid}"
    ensure_publication(src.conn, pub)
    with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist"):
        peek_pgoutput(src.conn, slot, pub)


def test_ensure_publication_refuses_to_block_updates_of_tables_without_identity(source: Source) -> None:
    src = source
    src.run(
        "CREATE TABLE keyed (id int PRIMARY KEY)",
        "CREATE TABLE keyless (a int)",
        "CREATE TABLE nothing (id int PRIMARY KEY)",
        "ALTER TABLE nothing REPLICA IDENTITY NOTHING",
        "CREATE TABLE full_ok (a int)",
        "ALTER TABLE full_ok REPLICA IDENTITY FULL",
        "CREATE TABLE deferred_key (id int PRIMARY KEY DEFERRABLE)",
        "CREATE TABLE deferrable_full (id int PRIMARY KEY DEFERRABLE)",
        "ALTER TABLE deferrable_full REPLICA IDENTITY FULL",
        "INSERT INTO keyless VALUES (1)",
    )
    assert tables_without_replica_identity(src.conn) == ["public.deferred_key", "public.keyless", "public.nothing"]
    pub = f"pub_{src.uid}"
    with pytest.raises(SourceError, match=r"public\.deferred_key, public\.keyless, public\.nothing") as err:
        ensure_publication(src.conn, pub)
    assert "REPLICA IDENTITY FULL" in err.value.hint
    assert not publication_exists(src.conn, pub)
    # Forced, the publication does what the check warns about.
    ensure_publication(src.conn, pub, allow_blocked_tables=True)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
        src.run("UPDATE keyless SET a = 2")
    ensure_publication(src.conn, pub)  # exists: nothing to do


def test_ensure_publication_rejects_a_partial_publication(source: Source) -> None:
    src = source
    src.run("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.run(f"CREATE PUBLICATION inserts_{src.uid} FOR ALL TABLES WITH (publish = 'insert')")
    with pytest.raises(SourceError, match="does not publish every"):
        ensure_publication(src.conn, f"inserts_{src.uid}")
    src.run(f"CREATE PUBLICATION filtered_{src.uid} FOR TABLE t WHERE (id > 10)")
    with pytest.raises(SourceError, match="row filters or column lists"):
        ensure_publication(src.conn, f"filtered_{src.uid}")


def test_ensure_publication_without_privilege_says_what_to_run(source: Source, pg_admin: str) -> None:
    src = source
    src.run("CREATE TABLE t (id int PRIMARY KEY)")
    role = f"pgout_user_{src.uid}"
    src.conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    db = src.dsn.rsplit("/", 1)[1]
    try:
        src.conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(db), sql.Identifier(role)))
        with psycopg.connect(src.dsn, user=role, autocommit=True) as conn:
            pub = f"pub_{src.uid}"
            with pytest.raises(SourceError, match="cannot create publication") as err:
                ensure_publication(conn, pub, captured_tables=["public.t"])
            assert f'an administrator must run: CREATE PUBLICATION "{pub}" FOR ALL TABLES;' in err.value.hint
            assert f'CREATE PUBLICATION "{pub}" FOR TABLE "public"."t"' in err.value.hint
            assert not publication_exists(conn, pub)
    finally:
        revoke = sql.SQL("REVOKE CREATE ON DATABASE {} FROM {}")
        src.conn.execute(revoke.format(sql.Identifier(db), sql.Identifier(role)))
        src.conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_format_type_lookup_matches_what_wal2json_prints(source: Source) -> None:
    lookup = format_type_lookup(source.conn)
    assert lookup(23, -1) == "integer"
    assert lookup(1042, -1) == "bpchar"  # -1 passed as given: a NULL typmod would print "character"
    assert lookup(1042, 7) == "character(3)"
    assert lookup(1700, (12 << 16 | 2) + 4) == "numeric(12,2)"
    assert lookup(1009, -1) == "text[]"
    assert lookup(1184, -1) == "timestamp with time zone"
