"""Capture against the real PostgreSQL + wal2json, without Spark: what lands, exactly.

Each test gets a fresh source database, a slot name and a landing directory (``src`` fixture).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from loader.capture import slot as slots
from loader.capture.capture import Capture
from loader.capture.source_tables import list_tables
from loader.errors import LandingError, SlotBusyError, SlotMissingError
from loader.landing.records import COMMIT, ChangeRecord
from loader.landing.state import SLOT_STATE
from loader.landing.store import LocalLandingStore, open_landing
from loader.lsn import ChangePosition
from tests.capture.conftest import Crash, Src, cli, crash_after_each_file, landing_snapshot
from tests.harness import ROOT, s3_bucket

SCHEMA_PATH = ROOT / "schemas" / "landing-change.v1.json"


def values(rec: ChangeRecord) -> dict[str, str | None]:
    return {c.name: c.value for c in rec.columns}


# --- slot lifecycle ----------------------------------------------------------------------------


def test_slot_missing_after_data_landed_is_refused(src: Src) -> None:
    src.sql("CREATE TABLE t (id int primary key)")
    src.capture()  # creates the slot
    src.sql("INSERT INTO t VALUES (1)")
    src.capture()
    with slots.connect(src.settings.source.dsn) as conn:
        slots.drop_slot(conn, src.settings.source.slot)
    with pytest.raises(SlotMissingError) as err:
        src.capture()
    assert src.settings.source.slot in str(err.value) and "loader resync" in err.value.hint
    with pytest.raises(SlotMissingError):
        Capture(src.settings).run(create_slot=False)


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_slot_create_makes_the_slot_capture_would_and_capture_takes_it(src: Src, plugin: str) -> None:
    """``loader slot create`` is capture's own creation: source.plugin, the pgoutput publication
    listing the captured tables, the slot state; then capture reads it. It never hides a lost slot."""
    src.sql("CREATE TABLE t (id int primary key, v text)")
    s = src.settings.source
    settings = src.settings.model_copy(
        update={"source": s.model_copy(update={"plugin": plugin, "publication": f"pub_{s.slot}"})}
    )
    res = cli(settings, src.tmp, "slot", "create")
    assert res.exit_code == 0 and f"slot {s.slot} ({plugin}) created at" in res.output, res.output
    with slots.connect(s.dsn) as conn:
        info = slots.slot_info(conn, s.slot)
    assert info is not None and info.plugin == plugin
    published = src.sql(
        "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel pr JOIN pg_class c ON c.oid = pr.prrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_publication p ON p.oid = pr.prpubid"
        " WHERE p.pubname = %s",
        (f"pub_{s.slot}",),
    )
    assert published == ([("public.t",)] if plugin == "pgoutput" else [])
    state = open_landing(settings).read_state(SLOT_STATE)
    assert state == {"slot": s.slot, "confirmed": info.confirmed_flush_lsn}
    src.sql("INSERT INTO t VALUES (1, 'a')")
    # A table created before the first capture: pgoutput withheld its changes until that capture
    # added it to the publication, so it is resynced; wal2json sent them.
    src.sql("CREATE TABLE u (id int primary key)")
    src.sql("INSERT INTO u VALUES (1)")
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0 and "captured" in res.output, res.output
    assert [(r.op, values(r)["id"]) for r in src.changes("t")] == [("I", "1")]
    assert [(r.op, values(r)["id"]) for r in src.changes("u") if r.op in ("I", "R")] == [
        ("R" if plugin == "pgoutput" else "I", "1")
    ], res.output
    res = cli(settings, src.tmp, "slot", "create")
    assert res.exit_code == 1 and "already exists" in res.output, res.output
    # Gone after changes landed: a new slot would hide the changes missed in between.
    with slots.connect(s.dsn) as conn:
        slots.drop_slot(conn, s.slot)
    res = cli(settings, src.tmp, "slot", "create")
    assert res.exit_code == 1 and "is gone" in res.output and "loader resync" in res.output, res.output
    with slots.connect(s.dsn) as conn:
        assert slots.slot_info(conn, s.slot) is None
    # The repair it names: resync finds the loss by the same check, makes the slot again, resyncs all.
    res = cli(settings, src.tmp, "resync", "--table", "public.t")
    assert res.exit_code == 0 and "every captured table is resynced" in res.output, res.output
    with slots.connect(s.dsn) as conn:
        again = slots.slot_info(conn, s.slot)
    assert again is not None and again.plugin == plugin
    src.sql("INSERT INTO t VALUES (2, 'b')")
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0 and "captured 1 changes" in res.output, res.output


def test_slot_held_by_another_process_is_refused(src: Src) -> None:
    src.sql("CREATE TABLE t (id int primary key)")
    src.capture()
    # A second loader process: the advisory capture lock names its pid.
    other = slots.connect(src.settings.source.dsn)
    try:
        slots.capture_lock(other, src.settings.source.slot)
        pid = other.info.backend_pid
        with pytest.raises(SlotBusyError) as err:
            src.capture()
        assert str(pid) in str(err.value)
    finally:
        other.close()
    # A foreign consumer streaming from the slot: PostgreSQL's active_pid.
    recv = shutil.which("pg_recvlogical") or "/usr/lib/postgresql/15/bin/pg_recvlogical"
    proc = subprocess.Popen(
        [recv, "-d", src.settings.source.dsn, "--slot", src.settings.source.slot, "--start", "-f", "/dev/null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with slots.connect(src.settings.source.dsn) as conn:
            for _ in range(100):
                info = slots.slot_info(conn, src.settings.source.slot)
                if info is not None and info.active_pid:
                    break
                conn.execute("SELECT pg_sleep(0.05)")
        assert info is not None and info.active_pid
        with pytest.raises(SlotBusyError) as err:
            src.capture()
        assert str(info.active_pid) in str(err.value)
    finally:
        proc.terminate()
        proc.wait(10)


def test_capture_waits_out_a_lock_its_previous_run_leaves_behind(src: Src) -> None:
    # A run that just ended (or was killed) holds its session lock until its server backend exits,
    # which happens after the client is gone: the next scheduled run must wait that out, not fail.
    src.sql("CREATE TABLE t (id int primary key)")
    src.capture()
    src.sql("INSERT INTO t VALUES (1)")
    other = slots.connect(src.settings.source.dsn)
    slots.capture_lock(other, src.settings.source.slot)
    timer = threading.Timer(1.0, other.close)
    timer.start()
    try:
        assert src.capture().changes == 1
    finally:
        timer.cancel()
        other.close()
    # A run that ends normally gives the lock back before it returns: an immediate take succeeds.
    with slots.connect(src.settings.source.dsn) as conn:
        slots.capture_lock(conn, src.settings.source.slot, grace=0)


def test_slot_info_reports_retained_wal_and_lag(src: Src) -> None:
    src.sql("CREATE TABLE t (id int primary key, v text)")
    res = src.capture()
    assert res.slot_created
    src.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g")
    with slots.connect(src.settings.source.dsn) as conn:
        behind = slots.slot_info(conn, src.settings.source.slot)
    assert behind is not None and behind.lag_bytes > 100_000 and behind.retained_wal_bytes >= behind.lag_bytes
    res = src.capture()
    assert res.changes == 2000
    # The server is shared, so other databases' WAL moves the lag too; the slot itself must move past our insert.
    assert res.confirmed_lsn is not None and behind.confirmed_flush_lsn is not None
    assert res.confirmed_lsn - behind.confirmed_flush_lsn > 100_000
    assert "retained WAL" in res.summary() and "lag" in res.summary()


# --- ordering key ------------------------------------------------------------------------------


def test_positions_are_unique_and_in_commit_order_across_split_transactions(src: Src) -> None:
    src.sql("CREATE TABLE a (id int primary key, v int)")
    src.sql("CREATE TABLE b (id int primary key, v int)")
    src.capture()
    # Two interleaved transactions: b's commits first although a started first.
    a = psycopg.connect(src.settings.source.dsn, autocommit=False)
    a.execute("INSERT INTO a SELECT g, 0 FROM generate_series(1, 120) g")
    src.sql("INSERT INTO b SELECT g, 1 FROM generate_series(1, 30) g")
    a.execute("INSERT INTO b VALUES (1000, 2)")
    a.commit()
    a.close()
    src.capture()
    files = src.store.files()
    assert any(not f.complete for f in files), "the 121-change transaction must be split (max 50 per file)"
    recs = src.records()
    positions = [r.position for r in recs]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    first_b = next(i for i, r in enumerate(recs) if r.table == "b")
    first_a = next(i for i, r in enumerate(recs) if r.table == "a")
    assert first_b < first_a, "commit order, not start order"
    # The transaction boundary survives the split: one commit marker per transaction.
    assert sum(1 for r in recs if r.op == COMMIT) == 2
    for f in files:
        file_recs = list(src.store.read_records(f.name))
        assert (file_recs[0].position, file_recs[-1].position) == (f.first, f.last)
        assert f.complete == (file_recs[-1].op == COMMIT)


# --- types --------------------------------------------------------------------------------------

TYPE_CASES: list[tuple[str, str, list[str]]] = [
    (
        "n",
        "numeric",
        [
            "12345678901234567890123456789.123456789012345678901234567890",
            "-0.000000000000000000000000000001",
            "NaN",
            "Infinity",
            "-Infinity",
        ],
    ),
    ("n50", "numeric(50,20)", ["123456789012345678901234567890.12345678901234567890"]),
    ("f8", "double precision", ["1e-300", "-0", "1.7976931348623157e308", "NaN", "Infinity", "-Infinity"]),
    ("f4", "real", ["3.4028235e38", "0.1"]),
    ("ts", "timestamptz", ["2024-02-29 23:59:59.123456+05:30", "infinity", "-infinity", "4713-01-01 00:00:00+00 BC"]),
    ("tsn", "timestamp", ["0001-01-01 00:00:00 BC", "294276-12-31 23:59:59.999999", "2000-01-01 00:00:00"]),
    ("d", "date", ["infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "2024-02-29"]),
    ("tm", "time", ["24:00:00", "00:00:00.000001"]),
    ("tz", "timetz", ["12:00+03"]),
    ("iv", "interval", ["1 year 2 mons -3 days 04:05:06.789", "-178000000 years", "00:00:00"]),
    ("u", "uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("j", "json", ['{"a": [1, 2.50],  "b": "\\u00e9", "a": null}']),
    ("jb", "jsonb", ['{"b": 1e400, "z": [true, null, "x"]}', '"scalar"']),
    ("by", "bytea", ["\\x00ff10", "\\x"]),
    ("ai", "integer[]", ["{1,NULL,3}", "{{1,2},{3,4}}", "{}"]),
    ("at", "text[]", ['{"a b","c\\"d",NULL,"NULL",""}']),
    ("e", "mood", ["ok", "sad"]),
    ("dm", "posint", ["5"]),
    ("m", "money", ["$1,234.56", "-$0.01"]),
    ("ip", "inet", ["192.168.0.1/24", "::1"]),
    ("cd", "cidr", ["10.0.0.0/8"]),
    ("bo", "boolean", ["true", "false"]),
    ("vc", "varchar(10)", ["abc"]),
    ("ch", "char(5)", ["ab"]),
    (
        "tx",
        "text",
        [
            'tab\there\nnewline "quote" back\\slash \u0001 ctl',
            # BMP, SMP (emoji), SIP (CJK ext B), TIP, SSP (tag), both private-use planes.
            "é中\U0001f600\U00020000\U00030000\U000e0001\U000f0000\U0010fffd",
        ],
    ),
]
SPECIAL_FLOATS = {"NaN", "Infinity", "-Infinity"}


def create_type_table(s: Src, name: str = "typed") -> int:
    s.sql("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    s.sql("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
    cols = ", ".join(f"{c} {t}" for c, t, _ in TYPE_CASES)
    s.sql(f"CREATE TABLE {name} (id int primary key, {cols})")
    rows = max(len(v) for _, _, v in TYPE_CASES)
    for i in range(rows):
        names = [c for c, _, v in TYPE_CASES if i < len(v)]
        vals = [v[i] for _, _, v in TYPE_CASES if i < len(v)]
        s.sql(
            f"INSERT INTO {name} (id, {', '.join(names)}) VALUES (%s, {', '.join('%s' for _ in vals)})",
            [i, *vals],
        )
    s.sql(f"INSERT INTO {name} (id) VALUES ({rows})")  # every column NULL
    return rows + 1


def source_text(s: Src, table: str) -> dict[int, dict[str, str | None]]:
    """What PostgreSQL prints for each value (its output function, as psql shows it; booleans true/false).

    Note ``::text`` differs for two types: char(n) loses its padding, inet gains a /32 or /128.
    """
    cols = ", ".join(
        f"{c}::text" if t == "boolean" else f"CASE WHEN {c} IS NULL THEN NULL ELSE concat({c}) END"
        for c, t, _ in TYPE_CASES
    )
    names = [c for c, _, _ in TYPE_CASES]
    return {r[0]: dict(zip(names, r[1:])) for r in s.sql(f"SELECT id, {cols} FROM {table}")}


def test_every_type_lands_as_postgres_text(src: Src) -> None:
    src.sql("SELECT 1")
    src.capture()  # slot first, so the inserts are streamed
    n = create_type_table(src)
    res = src.capture()
    expected = source_text(src, "typed")
    landed = {int(values(r)["id"] or -1): r for r in src.changes("typed")}
    assert set(landed) == set(range(n))
    for i, rec in landed.items():
        got = values(rec)
        types = {c.name: c.type for c in rec.columns}
        for col, _pg_type, _ in TYPE_CASES:
            want = expected[i][col]
            if want in SPECIAL_FLOATS and not res.numeric_special_values:
                # Known limitation of wal2json < 2.6: numeric/float NaN and +-Infinity are printed as
                # JSON null. The snapshot path (next test) keeps them; see README.
                assert got[col] is None, (col, got[col])
                continue
            assert got[col] == want, f"row {i} column {col} ({types[col]}): landed {got[col]!r}, source {want!r}"
        assert types["e"] == "mood" and types["dm"] == "posint" and types["n50"] == "numeric(50,20)"


def test_snapshot_keeps_every_type_including_nan(src: Src) -> None:
    from loader.capture.capture import snapshot

    create_type_table(src)
    snapshot(src.settings).run()
    expected = source_text(src, "typed")
    reads = src.changes("typed")
    assert reads[0].op == "S" and {r.op for r in reads[1:]} == {"R"}
    reads = reads[1:]
    for rec in reads:
        got = values(rec)
        i = int(got["id"] or -1)
        for col, _, _ in TYPE_CASES:
            assert got[col] == expected[i][col], (i, col)
    # Snapshot rows are typed exactly like streamed rows of the same table.
    src.sql("INSERT INTO typed (id) VALUES (1000)")
    src.capture()
    streamed = next(r for r in src.changes("typed") if r.op == "I")
    assert [(c.name, c.type) for c in streamed.columns] == [(c.name, c.type) for c in reads[0].columns]


def test_null_is_distinct_from_unchanged_toast(src: Src) -> None:
    src.sql("CREATE TABLE doc (id int primary key, body text, n int)")
    src.capture()
    src.sql("INSERT INTO doc SELECT 1, string_agg(md5(g::text), ''), 0 FROM generate_series(1, 800) g")
    src.sql("UPDATE doc SET n = 1")  # body unchanged and TOASTed: wal2json omits it
    src.sql("UPDATE doc SET body = NULL, n = 2")  # body present, NULL
    src.capture()
    ins, upd1, upd2 = src.changes("doc")
    assert len(values(ins)["body"] or "") == 800 * 32
    assert "body" not in values(upd1) and values(upd1)["n"] == "1"
    assert "body" in values(upd2) and values(upd2)["body"] is None


# --- keyless tables -----------------------------------------------------------------------------


def test_replica_identity_modes_are_captured_and_reported(src: Src) -> None:
    src.sql("CREATE TABLE k_default (a int NOT NULL, b text)")
    src.sql("CREATE TABLE k_full (a int NOT NULL, b text)")
    src.sql("ALTER TABLE k_full REPLICA IDENTITY FULL")
    src.sql("CREATE TABLE k_nothing (a int NOT NULL, b text)")
    src.sql("ALTER TABLE k_nothing REPLICA IDENTITY NOTHING")
    src.sql("CREATE TABLE k_index (a int NOT NULL, b text)")
    src.sql("CREATE UNIQUE INDEX k_index_a ON k_index (a)")
    src.sql("ALTER TABLE k_index REPLICA IDENTITY USING INDEX k_index_a")
    src.sql("CREATE TABLE pk_nothing (a int PRIMARY KEY, b text)")
    src.sql("ALTER TABLE pk_nothing REPLICA IDENTITY NOTHING")
    tables = ["k_default", "k_full", "k_nothing", "k_index", "pk_nothing"]
    src.capture()
    for t in tables:
        src.sql(f"INSERT INTO {t} VALUES (1, 'x'), (2, 'x')")
        src.sql(f"UPDATE {t} SET b = 'y' WHERE a = 1")
        src.sql(f"DELETE FROM {t} WHERE a = 2")
    res = src.capture()
    ops = {t: [r.op for r in src.changes(t)] for t in tables}
    # What wal2json 2.5 decodes (verified): no identity -> updates and deletes are not decoded.
    assert ops["k_default"] == ["I", "I"]
    assert ops["k_nothing"] == ["I", "I"]
    assert ops["pk_nothing"] == ["I", "I"]
    assert ops["k_full"] == ["I", "I", "U", "D"]
    assert ops["k_index"] == ["I", "I", "U", "D"]
    full_upd = next(r for r in src.changes("k_full") if r.op == "U")
    assert {c.name: c.value for c in full_upd.identity} == {"a": "1", "b": "x"}  # the whole old row
    idx = src.changes("k_index")
    assert all(r.pk == ["a"] for r in idx), "USING INDEX identity gives the table a key downstream"
    assert {c.name: c.value for c in idx[3].identity} == {"a": "2"}
    assert all(r.pk == [] for r in src.changes("k_full"))
    # Reported: in the capture summary and in the table listing.
    assert set(res.limited_tables) == {"public.k_default", "public.k_full", "public.k_nothing", "public.pk_nothing"}
    assert "inserts only" in res.limited_tables["public.k_default"]
    assert "history only" in res.limited_tables["public.k_full"]
    with slots.connect(src.settings.source.dsn) as conn:
        listing = {t.table: t for t in list_tables(conn)}
    assert listing["k_index"].key == ["a"] and listing["k_index"].downstream.startswith("current + history")
    assert not listing["pk_nothing"].updates_deletes_captured
    assert listing["k_full"].updates_deletes_captured and not listing["k_full"].key


# --- schema changes -----------------------------------------------------------------------------


def test_schema_changes_land_with_the_schema_they_were_written_under(src: Src) -> None:
    src.sql("CREATE TABLE acct (id int primary key, amount int, note text)")
    src.capture()
    src.sql("INSERT INTO acct VALUES (1, 10, 'a')")
    src.sql("ALTER TABLE acct ADD COLUMN flag boolean")  # no default
    src.sql("INSERT INTO acct VALUES (2, 20, 'b', true)")
    src.sql("ALTER TABLE acct ADD COLUMN region text NOT NULL DEFAULT 'eu'")  # with default
    src.sql("UPDATE acct SET amount = 11 WHERE id = 1")
    src.sql("ALTER TABLE acct DROP COLUMN note")
    src.sql("INSERT INTO acct VALUES (3, 30, false, 'us')")
    src.sql("ALTER TABLE acct ALTER COLUMN amount TYPE numeric(12,2)")
    src.sql("INSERT INTO acct VALUES (4, 40.5, NULL, 'us')")
    src.sql("ALTER TABLE acct ALTER COLUMN amount TYPE text")
    src.sql("UPDATE acct SET amount = 'lots' WHERE id = 4")
    src.capture()
    stream = [r for r in src.changes("acct") if r.op in ("I", "U", "D")]
    shapes = [[(c.name, c.type, c.value) for c in r.columns] for r in stream]
    assert shapes[0] == [("id", "integer", "1"), ("amount", "integer", "10"), ("note", "text", "a")]
    assert shapes[1] == [
        ("id", "integer", "2"),
        ("amount", "integer", "20"),
        ("note", "text", "b"),
        ("flag", "boolean", "true"),
    ]
    assert shapes[2] == [
        ("id", "integer", "1"),
        ("amount", "integer", "11"),
        ("note", "text", "a"),
        ("flag", "boolean", None),
        ("region", "text", "eu"),
    ]
    assert shapes[3] == [
        ("id", "integer", "3"),
        ("amount", "integer", "30"),
        ("flag", "boolean", "false"),
        ("region", "text", "us"),
    ]
    assert shapes[4][1] == ("amount", "numeric(12,2)", "40.50")
    assert shapes[5][1] == ("amount", "text", "lots")
    # The default that filled row 1 and the retypes left no row changes: capture saw them in the
    # catalog, parked the table before the stream's changes and resynced it after them.
    markers = [r for r in src.changes("acct") if r.op in ("P", "S")]
    assert [m.op for m in markers] == ["P", "S"]
    assert markers[0].position < stream[0].position and markers[1].position > stream[-1].position
    # (The retype's rewrite also stored region's default in every row, so the rewrite is what is named.)
    assert "amount changed type from integer to text with a table rewrite" in markers[1].reason
    reads = {values(r)["id"]: values(r) for r in src.changes("acct") if r.op == "R"}
    assert reads["1"]["region"] == "eu" and reads["4"]["amount"] == "lots"


# --- include / exclude, new tables -----------------------------------------------------------


def test_include_exclude_patterns_and_tables_created_later(src: Src) -> None:
    src.sql("CREATE SCHEMA app")
    src.sql("CREATE SCHEMA audit")
    src.sql("CREATE TABLE app.orders (id int primary key)")
    src.sql("CREATE TABLE app.tmp_scratch (id int primary key)")
    src.sql("CREATE TABLE audit.log (id int primary key)")
    settings = src.settings.model_copy(
        update={"source": src.settings.source.model_copy(update={"include": ["app.*"], "exclude": ["app.tmp_*"]})}
    )
    Capture(settings).run()
    src.sql("INSERT INTO app.orders VALUES (1)")
    src.sql("INSERT INTO app.tmp_scratch VALUES (1)")
    src.sql("INSERT INTO audit.log VALUES (1)")
    src.sql("CREATE TABLE app.invoices (id int primary key)")  # appears after capture started
    src.sql("INSERT INTO app.invoices VALUES (7)")
    src.sql("CREATE TABLE app.tmp_other (id int primary key)")
    src.sql("INSERT INTO app.tmp_other VALUES (1)")
    res = Capture(settings).run()
    landed = sorted({r.qualified_table for r in src.changes()})
    assert landed == ["app.invoices", "app.orders"]
    assert res.transactions == 2, "transactions touching only excluded tables land nothing"


# --- crash safety ------------------------------------------------------------------------------


def test_killed_capture_rerun_yields_the_same_landing_files(src: Src) -> None:
    from loader.workload import BankWorkload

    wl = BankWorkload(src.settings.source.dsn, seed=3)
    wl.create_schema()
    # A reference slot and the slot under test, created at the same WAL position.
    ref = src.with_slot(src.settings.source.slot + "_ref", src.tmp / "ref")
    Capture(ref).run()
    Capture(src.settings).run()
    wl.run(60)
    Capture(ref).run()
    reference = landing_snapshot(src.tmp / "ref" / ref.source.slot)
    assert len(reference) > 3
    # Crash after every published file in turn (slot not yet advanced), then finish.
    assert crash_after_each_file(src.settings, len(reference)) >= 2
    Capture(src.settings).run()
    got = landing_snapshot(Path(src.store.url.removeprefix("file://")))
    assert got == reference


class FailingStore(LocalLandingStore):
    """A real local store whose n-th publish fails, like a disk or network error mid-round."""

    def __init__(self, path: Path, fail_at: int) -> None:
        super().__init__(path)
        self.fail_at = fail_at
        self.calls = 0

    def publish(self, local_path: Path, name: str) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise LandingError(f"injected failure publishing {name}")
        super().publish(local_path, name)


def test_error_mid_round_then_rerun_lands_each_change_once(src: Src) -> None:
    src.sql("CREATE TABLE t (id int primary key, v int)")
    src.capture()
    for i in range(10):
        src.sql("INSERT INTO t SELECT g, %s::int FROM generate_series(%s::int, %s::int) g", (i, i * 40, i * 40 + 39))
    path = Path(src.store.url.removeprefix("file://"))
    with pytest.raises(LandingError):
        Capture(src.settings, FailingStore(path, fail_at=4)).run()
    assert len(src.store.files()) == 3
    assert not list(path.glob(".*")), "no torn temp file left behind"
    Capture(src.settings).run()
    ids = [int(values(r)["id"] or -1) for r in src.changes("t")]
    assert sorted(ids) == list(range(400)) and len(ids) == len(set(ids))


# --- landing format -----------------------------------------------------------------------------


def test_landing_lines_validate_against_the_published_schema(src: Src) -> None:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    src.sql("CREATE TABLE t (id int primary key, v text, big text)")
    src.sql("INSERT INTO t VALUES (0, 'before slot', NULL)")
    from loader.capture.capture import snapshot

    snapshot(src.settings).run()
    src.sql("INSERT INTO t SELECT 1, 'x', string_agg(md5(g::text), '') FROM generate_series(1, 400) g")
    src.sql("UPDATE t SET v = NULL WHERE id = 1")
    src.sql("UPDATE t SET id = 2 WHERE id = 1")
    src.sql("DELETE FROM t")
    src.sql("TRUNCATE t")
    src.capture()
    store = src.store
    ops = set()
    for f in store.files():
        for line in store.read_lines(f.name):
            doc = json.loads(line)
            validator.validate(doc)
            ops.add(doc["op"])
    assert ops >= {"R", "I", "U", "D", "C"}
    # And the schema rejects what the loader must never write.
    bad = {
        "v": 1,
        "op": "I",
        "lsn": 1,
        "seq": 1,
        "xid": 1,
        "ts": "x",
        "schema": "s",
        "table": "t",
        "columns": [["a", "int", 5]],
        "pk": [],
    }
    assert not validator.is_valid(bad)


def test_s3_landing_uses_multipart_for_large_files(src: Src, s3_server: str) -> None:
    client, bucket = s3_bucket(s3_server, "land")
    settings = src.settings.model_copy(
        update={
            "landing": src.settings.landing.model_copy(
                update={"url": f"s3://{bucket}/cdc", "multipart_threshold_mb": 5}
            ),
            "s3": src.settings.s3.model_copy(update={"endpoint_url": s3_server}),
            "source": src.settings.source.model_copy(update={"max_changes_per_file": 100_000}),
        }
    )
    src.sql("CREATE TABLE blob (id int primary key, body text)")
    Capture(settings).run()
    # ~12 MB of incompressible text in one transaction -> one landing file above the threshold.
    src.sql(
        "INSERT INTO blob SELECT g, (SELECT string_agg(md5(random()::text || g || h), '') FROM generate_series(1, 120) h)"
        " FROM generate_series(1, 3000) g"
    )
    res = Capture(settings).run()
    assert len(res.files) == 1
    key = f"cdc/{settings.source.slot}/{res.files[0]}"
    head = client.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] > 5 * 1024 * 1024
    assert "-" in head["ETag"], "multipart uploads have an ETag of the form <md5>-<parts>"
    store = open_landing(settings)
    assert len([r for r in store.read_records(res.files[0]) if r.op == "I"]) == 3000
    assert store.landed_position() == ChangePosition(store.files()[-1].last.commit_lsn, 3001)


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_snapshot_capture_slot_info_and_tables(src: Src) -> None:
    from click.testing import CliRunner

    from loader.cli import main

    src.sql("CREATE TABLE keyed (id int primary key, v text)")
    src.sql("CREATE TABLE bare (v text)")
    src.sql("INSERT INTO keyed VALUES (1, 'a'), (2, 'b')")
    env = {
        "LOADER_SOURCE__DSN": src.settings.source.dsn,
        "LOADER_SOURCE__SLOT": src.settings.source.slot,
        "LOADER_LANDING__URL": src.settings.landing.url,
    }
    runner = CliRunner()
    out = runner.invoke(main, ["capture", "--snapshot"], env=env)
    assert out.exit_code == 0, out.output
    assert "snapshot of 2 tables" in out.output and "2 rows" in out.output and "captured 0 changes" in out.output
    src.sql("INSERT INTO keyed VALUES (3, 'c')")
    src.sql("INSERT INTO bare VALUES ('x')")
    out = runner.invoke(main, ["capture"], env=env)
    assert out.exit_code == 0 and "captured 2 changes" in out.output and "public.bare: history" in out.output, (
        out.output
    )
    out = runner.invoke(main, ["slot", "info"], env=env)
    info = json.loads(out.output)
    assert info["slot"] == src.settings.source.slot and "retained_wal_bytes" in info and "lag_bytes" in info
    assert info["snapshot"]["done"] and info["snapshot"]["tables"] == ["public.bare", "public.keyed"]
    out = runner.invoke(main, ["slot", "tables", "--json"], env=env)
    tables = {t["table"]: t for t in json.loads(out.output)}
    assert tables["public.keyed"]["key"] == ["id"] and tables["public.bare"]["key"] == []
    assert "inserts only" in tables["public.bare"]["downstream"]
    # Missing slot after data landed: one clear line, exit 1.
    with slots.connect(src.settings.source.dsn) as conn:
        slots.drop_slot(conn, src.settings.source.slot)
    out = runner.invoke(main, ["capture"], env=env)
    assert out.exit_code == 1 and "is gone" in out.output and "loader resync" in out.output


def test_column_rename_is_detected_by_attnum(src: Src) -> None:
    src.sql("CREATE TABLE t (id int primary key, a text, c int)")
    src.capture()
    src.sql("INSERT INTO t VALUES (1, 'x', 1)")
    first = src.capture()
    assert not first.resynced
    src.sql("ALTER TABLE t RENAME COLUMN a TO b")
    src.sql("ALTER TABLE t DROP COLUMN c")
    src.sql("ALTER TABLE t ADD COLUMN c int")  # same name, new attnum: not a rename
    src.sql("INSERT INTO t VALUES (2, 'y', 2)")
    res = src.capture()
    # A rename rewrites no row: the table is resynced so every row has the new column name.
    assert res.resynced == {"public.t": "column a was renamed to b"}
    assert "renamed" in res.summary()
    stream = [r for r in src.changes("t") if r.op == "I"]
    assert [c.name for c in stream[-1].columns] == ["id", "b", "c"]
    reads = [r for r in src.changes("t") if r.op == "R"]
    assert sorted(values(r)["id"] for r in reads) == ["1", "2"] and all("b" in values(r) for r in reads)


def test_snapshot_state_and_resume_on_s3_landing(src: Src, s3_server: str) -> None:

    from loader.capture.capture import SnapshotInProgressError, snapshot

    _, bucket = s3_bucket(s3_server, "snap")
    settings = src.settings.model_copy(
        update={
            "landing": src.settings.landing.model_copy(update={"url": f"s3://{bucket}/cdc"}),
            "s3": src.settings.s3.model_copy(update={"endpoint_url": s3_server}),
        }
    )
    src.sql("CREATE TABLE t (id int primary key, v text)")
    src.sql("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g")
    published: list[str] = []

    def crash_after_two(name: str) -> None:
        published.append(name)
        if len(published) == 2:
            raise Crash()

    with pytest.raises(Crash):
        snapshot(settings, chunk_rows=100, on_published=crash_after_two).run()
    with pytest.raises(SnapshotInProgressError):
        Capture(settings, watch=False).run()  # a capture that does not resume snapshots refuses to stream
    res = snapshot(settings, chunk_rows=100).run()
    assert res.resumed and res.rows == 100  # the third chunk only
    src.sql("INSERT INTO t VALUES (1000, 'after')")
    Capture(settings).run()
    store = open_landing(settings)
    ids = [values(r)["id"] for f in store.files() for r in store.read_records(f.name) if r.op in ("R", "I")]
    assert sorted(map(int, ids)) == [*range(1, 301), 1000]
    assert not any(n.startswith("_state") for n in store.names())
    state = store.read_state("snapshot.state.json")
    assert state is not None and state["done"] and not state["exact"]


def test_tables_whose_nan_wal2json_2_5_turns_into_null_are_flagged(src: Src) -> None:
    """wal2json before 2.6 prints numeric/float NaN and ±Infinity as null, which a NULL also is:
    capture cannot quarantine them, so it names the exposed tables and columns, and the fix."""
    src.sql("CREATE TABLE public.measures (id int PRIMARY KEY, n numeric, f double precision, note text)")
    src.sql("CREATE TABLE public.words (id int PRIMARY KEY, note text)")
    src.capture()
    src.sql("INSERT INTO public.measures VALUES (1, 'NaN', '-Infinity', 'x')")
    src.sql("INSERT INTO public.words VALUES (1, 'x')")
    res = src.capture()
    if res.numeric_special_values:
        pytest.skip("this wal2json keeps NaN (numeric-data-types-as-string)")
    flagged = [n for n in res.notes if n.startswith("public.measures:")]
    assert len(flagged) == 1 and "n, f" in flagged[0] and "pgoutput" in flagged[0], res.notes
    assert not [n for n in res.notes if n.startswith("public.words:")]
    assert "NaN and ±Infinity" in res.summary()


def test_changes_of_a_partition_dropped_since_the_last_run_land_as_its_root(src: Src) -> None:
    """A partitioned table dropped (with its partitions) after changes it made since the last capture:
    the catalog no longer says whose partition the changed table was, and those changes landed as a
    table of their own named after the partition (found by the fuzzer, seed 1). The last run's
    picture of the catalog knows: they are its root's changes."""
    src.sql("CREATE TABLE public.p (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    src.sql("CREATE TABLE public.p_low PARTITION OF public.p FOR VALUES FROM (MINVALUE) TO (100)")
    src.sql("CREATE TABLE public.p_high PARTITION OF public.p FOR VALUES FROM (100) TO (MAXVALUE)")
    src.capture()
    src.sql("INSERT INTO public.p VALUES (1, 'a'), (200, 'b')")
    src.capture()
    src.sql("UPDATE public.p SET v = 'c' WHERE id = 1")
    src.sql("DELETE FROM public.p WHERE id = 200")
    src.sql("DROP TABLE public.p")
    src.capture()
    tables = {r.qualified_table for r in src.changes() if r.op in ("I", "U", "D")}
    assert tables == {"public.p"}, tables


def test_a_slot_waiting_for_a_forgotten_transaction_names_it_and_gives_up(src: Src) -> None:
    """A new logical slot waits until every transaction in progress when it began has ended: a
    session left idle in a transaction (or a forgotten prepared transaction, which outlives its
    session) held the first capture, and every resync's temporary slot, forever and silently. The
    creation now names them in a warning, and gives up after source.slot_create_timeout_s with an
    error naming them and what to run."""
    import time

    from loader.errors import SlotCreationBlockedError, TransientError

    src.sql("CREATE TABLE t (id int PRIMARY KEY)")
    blocker = psycopg.connect(src.settings.source.dsn, autocommit=True, application_name="forgotten")
    prepared = False
    try:
        blocker.execute("BEGIN")
        blocker.execute("INSERT INTO t VALUES (1)")  # holds a transaction id, idle from now on
        pid = blocker.info.backend_pid
        if int(src.sql("SHOW max_prepared_transactions")[0][0]) > 0:
            src.sql("BEGIN")
            src.sql("INSERT INTO t VALUES (2)")
            src.sql("PREPARE TRANSACTION 'lost_gid'")
            prepared = True
        settings = src.settings.model_copy(
            update={"source": src.settings.source.model_copy(update={"slot_create_timeout_s": 3.0})}
        )
        started = time.monotonic()
        with pytest.raises(SlotCreationBlockedError) as err:  # transient: exit 75, follow mode retries
            Capture(settings).run()
        assert time.monotonic() - started < 30
        text = str(err.value)
        assert isinstance(err.value, TransientError)
        assert f"pid {pid} (" in text and "forgotten, idle in transaction" in text, text
        assert not prepared or "prepared transaction 'lost_gid'" in text, text
        assert (
            "pg_terminate_backend" in (err.value.hint or "")
            and slots.slot_info(src.conn, src.settings.source.slot) is None
        )
        # Without a bound it waits, saying what for, and goes on once they end.
        unbounded = src.settings.model_copy(
            update={"source": src.settings.source.model_copy(update={"slot_create_timeout_s": None})}
        )

        def end_them() -> None:
            time.sleep(13)
            blocker.execute("ROLLBACK")
            if prepared:
                with psycopg.connect(src.settings.source.dsn, autocommit=True) as c:
                    c.execute("ROLLBACK PREPARED 'lost_gid'")

        ender = threading.Thread(target=end_them)
        ender.start()
        res = cli(unbounded, src.tmp, "capture", "--snapshot")
        ender.join()
        assert res.exit_code == 0, res.output
        warned = [line for line in res.output.splitlines() if "has waited" in line]
        assert warned and f"pid {pid} (" in warned[0], res.output
    finally:
        blocker.close()
        if prepared and src.sql("SELECT 1 FROM pg_prepared_xacts WHERE gid = 'lost_gid'"):
            src.sql("ROLLBACK PREPARED 'lost_gid'")


@contextmanager
def database_defaults(src: Src, **settings: str) -> Iterator[None]:
    """The source database's defaults for new sessions (``ALTER DATABASE ... SET``, as a DBA sets
    them for applications), reset after."""
    from psycopg import sql

    db = sql.Identifier(src.sql("SELECT current_database()")[0][0])
    for name, value in settings.items():
        src.sql(sql.SQL("ALTER DATABASE {} SET {} = {}").format(db, sql.Identifier(name), sql.Literal(value)))
    try:
        yield
    finally:
        src.sql(sql.SQL("ALTER DATABASE {} RESET ALL").format(db))


def test_a_database_s_timeouts_for_applications_do_not_cut_a_snapshot(src: Src) -> None:
    """A DBA's ALTER DATABASE ... SET statement_timeout (or idle_in_transaction_session_timeout),
    meant for applications, cancelled the snapshot's long reads and killed the sessions holding its
    exported snapshot between chunks ("invalid snapshot identifier"): the snapshot could never
    finish. The loader's source sessions set no timeouts, as pg_dump does."""
    src.sql("CREATE TABLE big (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO big SELECT g, repeat('x', 200) || g FROM generate_series(1, 300000) g")
    with database_defaults(src, statement_timeout="50", idle_in_transaction_session_timeout="50", lock_timeout="50"):
        settings = src.settings.model_copy(
            update={"source": src.settings.source.model_copy(update={"snapshot_chunk_rows": 50_000})}
        )
        res = cli(settings, src.tmp, "capture", "--snapshot")
        assert res.exit_code == 0, res.output
        src.sql("UPDATE big SET v = v || 'y' WHERE id % 3 = 0")
        res = cli(settings, src.tmp, "capture")
        assert res.exit_code == 0 and "captured 100000 changes" in res.output, res.output


def test_a_read_only_database_default_leaves_capture_working_without_its_own_writes(src: Src) -> None:
    """``ALTER DATABASE ... SET default_transaction_read_only = on`` (or for the loader's role), a
    DBA's way to keep a CDC role from writing: capture failed outright on installing its DDL
    trigger. Capture needs no write of its own (slots, peeks, heartbeats all work read-only): the
    trigger is left out with a warning (catalog comparison only), as for a role that may not create
    one, and pgoutput's publication, which it must create, fails with what an administrator runs."""
    from loader.errors import SourceError

    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO t VALUES (1, 'a')")
    with database_defaults(src, default_transaction_read_only="on"):
        res = cli(src.settings, src.tmp, "capture", "--snapshot")
        assert res.exit_code == 0, res.output
        assert "DDL capture is off: the loader's sessions are read-only" in res.output, res.output
        src.sql("INSERT INTO t VALUES (2, 'b')")
        src.sql("UPDATE t SET v = 'c' WHERE id = 1")
        got = Capture(src.settings, heartbeat=True).run()
        assert got.changes == 2 and got.heartbeat_seen_at is not None, got.summary()
        pg = src.settings.model_copy(
            update={
                "source": src.settings.source.model_copy(
                    update={"plugin": "pgoutput", "slot": src.settings.source.slot + "_po", "publication": "po_ro"}
                )
            }
        )
        with pytest.raises(SourceError) as err:
            Capture(pg).run()
        assert "read-only transaction" in str(err.value) and "an administrator must run" in (err.value.hint or "")


def test_a_database_s_client_encoding_does_not_stop_capture(src: Src) -> None:
    """``ALTER DATABASE ... SET client_encoding = 'LATIN1'`` (for old applications) applied to the
    loader's sessions too: the server converted decoded text to LATIN1, and a character LATIN1 has
    not (the euro sign) failed every capture from then on. Source sessions ask for UTF-8."""
    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO t VALUES (1, 'ü€😀')")
    with database_defaults(src, client_encoding="LATIN1"):
        res = cli(src.settings, src.tmp, "capture", "--snapshot")
        assert res.exit_code == 0, res.output
        src.sql("INSERT INTO t VALUES (2, 'ä€😀')")
        assert Capture(src.settings).run().changes == 1
        landed = [c.value for rec in src.changes("t") for c in rec.columns if c.name == "v"]
        assert landed[-2:] == ["ü€😀", "ä€😀"], landed  # the snapshot's row, then the stream's


def test_source_sessions_name_themselves_to_the_dba(src: Src) -> None:
    """pg_stat_activity shows which sessions are the loader's (host and pid), unless the DSN names
    them itself."""
    import os

    with slots.connect(src.settings.source.dsn) as conn:
        name = conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
    assert name is not None and name[0].startswith("lakehouse-loader source ") and name[0].endswith(f":{os.getpid()}")
    with slots.connect(src.settings.source.dsn + "?application_name=etl") as conn:
        name = conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
    assert name == ("etl",)
