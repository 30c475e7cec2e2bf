"""The pipelined read of a slot (loader/capture/stream.py) against the real PostgreSQL + wal2json.

Its oracle is the peek path: two slots created at the same WAL position, one read each way, must
land the same records in the same order and confirm the same position. Crash tests kill the
pipelined capture after each published file (before the slot moves) and with SIGKILL, and check
that the re-run lands exactly what an uninterrupted run lands and that no copy of the slot is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from loader.capture import slot as slots
from loader.capture.capture import Capture
from loader.capture.stream import RoundFetcher
from loader.config import LoaderSettings, SourceSettings
from loader.landing.records import HEADER
from tests.capture.conftest import Crash, Src, crash_after_each_file, landing_snapshot
from tests.harness import ROOT


def pipelined(s: LoaderSettings, *, round_rows: int = 700, confirm_interval_s: float | None = None) -> LoaderSettings:
    update: dict[str, float] = {"pipeline_min_lag_mb": 0.0, "pipeline_round_rows": round_rows}
    if confirm_interval_s is not None:
        update["confirm_interval_s"] = confirm_interval_s
    return s.model_copy(update={"source": s.source.model_copy(update=update)})


def peeking(s: LoaderSettings) -> LoaderSettings:
    return s.model_copy(update={"source": s.source.model_copy(update={"pipeline_min_lag_mb": -1.0})})


def landed_lines(landing: Path) -> list[bytes]:
    """Every record of a landing directory in file order as its v1 line (either format), without
    the file headers."""
    from loader.landing.store import LocalLandingStore

    store = LocalLandingStore(landing)
    out = []
    for name in landing_snapshot(landing):
        out += [line.encode() for line in store.read_lines(name) if f'"op":"{HEADER}"' not in line]
    return out


def copies_left(src: Src) -> list[str]:
    return [r[0] for r in src.sql("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'loader_copy_%'")]


def workload(src: Src) -> None:
    """Several tables, updates and deletes, a table the filters exclude, TOASTed values left out of
    updates, a non-transactional message, empty transactions and one transaction far larger than a
    landing file and a round."""
    src.sql("CREATE TABLE a (id int PRIMARY KEY, v text, big text)")
    src.sql("CREATE TABLE b (k text PRIMARY KEY, n numeric, f float8)")
    src.sql("CREATE TABLE skipped (id int PRIMARY KEY)")
    src.sql("ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL")
    for i in range(30):
        src.sql(
            "INSERT INTO a SELECT g, 'v' || g, CASE WHEN g %% 7 = 0 THEN repeat('x', 5000) END"
            " FROM generate_series(%s::int, %s::int) g",
            (i * 40, i * 40 + 39),
        )
        src.sql("INSERT INTO b VALUES (%s, %s, %s)", (f"k{i}", f"{i}.{i:03d}", -0.0 if i == 3 else i / 3))
        src.sql("INSERT INTO skipped VALUES (%s)", (i,))
        src.sql("UPDATE a SET v = v || '!' WHERE id %% 11 = %s", (i % 11,))
        src.sql("DELETE FROM a WHERE id = %s", (i * 13,))
        src.sql("SELECT pg_logical_emit_message(false, 'heartbeat', %s)", (str(i),))
        src.sql("SELECT txid_current()")  # an xid, a commit, no change
    src.sql("INSERT INTO b SELECT 'big' || g, g, g FROM generate_series(1, 4000) g")
    src.sql("UPDATE b SET n = n + 1 WHERE k LIKE 'big%'")
    # Values of every JSON kind and escapes, partitions that land as their root, a key the stream
    # does not name (USING INDEX): these rows go through capture's columnar decoder (their blocks are
    # plain), the peek through the row decoder.
    src.sql("CREATE TABLE c (id int NOT NULL, ok bool, raw bytea, t text, j json, e float8, big numeric)")
    src.sql("CREATE UNIQUE INDEX c_id ON c (id)")
    src.sql("ALTER TABLE c REPLICA IDENTITY USING INDEX c_id")
    src.sql("CREATE TABLE p (id int, part int, v text, PRIMARY KEY (id, part)) PARTITION BY LIST (part)")
    src.sql("CREATE TABLE p1 PARTITION OF p FOR VALUES IN (1)")
    src.sql("CREATE TABLE p2 PARTITION OF p FOR VALUES IN (2)")
    src.sql(
        "INSERT INTO c SELECT g, g % 3 = 0, decode(md5(g::text), 'hex'),"
        " E'quote \" back \\\\ nl \n tab \t é ☃ ' || g, '{\"a\": [1, 2]}', 1.5e300 * g,"
        " 123456789012345678901234567890.123456789 + g FROM generate_series(1, 3000) g"
    )
    src.sql("UPDATE c SET ok = NULL, t = NULL WHERE id % 5 = 0")
    src.sql("INSERT INTO p SELECT g, 1 + g % 2, 'p' || g FROM generate_series(1, 3000) g")
    src.sql("DELETE FROM p WHERE id % 9 = 0")


def test_pipelined_capture_lands_what_peeks_land(src: Src) -> None:
    base = src.settings.model_copy(
        update={"source": src.settings.source.model_copy(update={"exclude": ["public.skipped"]})}
    )
    peek = peeking(src.with_slot(base.source.slot + "_peek", src.tmp / "peek"))
    peek = peek.model_copy(update={"source": peek.source.model_copy(update={"exclude": ["public.skipped"]})})
    pipe = pipelined(src.with_slot(base.source.slot + "_pipe", src.tmp / "pipe"))
    pipe = pipe.model_copy(update={"source": pipe.source.model_copy(update={"exclude": ["public.skipped"]})})
    Capture(peek).run()
    Capture(pipe).run()
    workload(src)
    got_peek = Capture(peek).run()
    got_pipe = Capture(pipe).run()

    expected = landed_lines(src.tmp / "peek" / peek.source.slot)
    assert len(expected) > 9000
    assert landed_lines(src.tmp / "pipe" / pipe.source.slot) == expected
    assert got_pipe.changes == got_peek.changes and got_pipe.transactions == got_peek.transactions
    # The pipelined read decoded most rows in columns (blocks with messages went row by row).
    print("columnar", got_pipe.columnar_rows, "of", got_pipe.pipelined_rows)
    assert got_pipe.columnar_rows >= got_pipe.pipelined_rows // 2 > 0, got_pipe.summary()
    # Each run confirms past its own heartbeat (emitted before its bound), the pipelined read as the peeks.
    assert got_peek.heartbeat_lag_s is not None and got_pipe.heartbeat_lag_s is not None
    assert got_pipe.confirmed_lsn is not None and got_peek.confirmed_lsn is not None
    assert got_pipe.confirmed_lsn > got_peek.confirmed_lsn  # the pipe ran later: its heartbeat is later
    assert len(got_pipe.files) > 1
    assert copies_left(src) == []
    # A second run has nothing left to read, and says so in either mode (only its heartbeat moves the slot).
    again = Capture(pipe).run()
    assert again.changes == 0 and not again.files and again.heartbeat_lag_s is not None
    assert again.confirmed_lsn is not None and again.confirmed_lsn > got_pipe.confirmed_lsn


def test_pipelined_capture_killed_after_each_file_lands_each_change_once(src: Src) -> None:
    from loader.workload import BankWorkload

    settings = pipelined(src.settings, round_rows=150)
    ref = pipelined(src.with_slot(settings.source.slot + "_ref", src.tmp / "ref"), round_rows=150)
    wl = BankWorkload(settings.source.dsn, seed=5)
    wl.create_schema()
    Capture(ref).run()
    Capture(settings).run()
    wl.run(60)
    Capture(ref).run()
    reference = landing_snapshot(src.tmp / "ref" / ref.source.slot)
    assert len(reference) > 3
    left: list[list[str]] = []
    assert crash_after_each_file(settings, len(reference), after_crash=lambda: left.append(copies_left(src))) >= 2
    assert left and all(c == [] for c in left), "the copy of the slot goes with the run that made it"
    Capture(settings).run()
    assert landing_snapshot(Path(src.store.url.removeprefix("file://"))) == reference


_KILLED_CHILD = """
import sys
from loader.capture.capture import Capture
from loader.config import LoaderSettings, SourceSettings
s = LoaderSettings.model_validate_json(sys.argv[1])
Capture(s).run()
"""


def _backlog_beside_a_reference(src: Src, settings: LoaderSettings) -> LoaderSettings:
    """A reference slot created beside ``settings``' (both at the same position), 720 inserts in 8
    transactions after it, and the reference captured uninterrupted: its settings."""
    ref = pipelined(src.with_slot(settings.source.slot + "_ref", src.tmp / "ref"), round_rows=200)
    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    Capture(ref).run()
    Capture(settings).run()
    for i in range(8):
        src.sql("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g", (i * 90, i * 90 + 89))
    Capture(ref).run()
    return ref


def test_pipelined_capture_sigkilled_before_the_slot_moves_is_repaired_by_a_rerun(src: Src) -> None:
    settings = pipelined(src.settings, round_rows=200, confirm_interval_s=0)  # an advance after each file
    ref = _backlog_beside_a_reference(src, settings)
    env = dict(os.environ, LOADER_FAULT="capture-before-advance@2")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, settings.model_dump_json()],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    # The server drops a temporary slot when its session ends, however it ends.
    for _ in range(50):
        if not copies_left(src):
            break
        src.sql("SELECT pg_sleep(0.1)")
    assert copies_left(src) == []
    Capture(settings).run()
    got = landed_lines(Path(src.store.url.removeprefix("file://")))
    assert got == landed_lines(src.tmp / "ref" / ref.source.slot)


@pytest.mark.parametrize("interval", [0.0, 3600.0], ids=["every file", "at the end"])
def test_a_pipelined_read_advances_the_slot_at_most_every_confirm_interval(
    src: Src, interval: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each advance makes the server decode again from the slot's restart position, so a pipelined
    read advances the real slot at most every source.confirm_interval_s (and at its end): the same
    files as an uninterrupted read, the slot at its last advance, a crash in between repaired by the
    re-run (the landed position skips what the slot gives again)."""
    settings = pipelined(src.settings, round_rows=200, confirm_interval_s=interval)
    ref = _backlog_beside_a_reference(src, settings)
    reference = landing_snapshot(src.tmp / "ref" / ref.source.slot)
    advances: list[int] = []
    real = slots.advance_slot

    def counting(conn: psycopg.Connection, slot: str, lsn: int, settle: bool = False) -> None:
        advances.append(lsn)
        real(conn, slot, lsn, settle=settle)

    monkeypatch.setattr(slots, "advance_slot", counting)
    published: list[str] = []

    def stop_at_the_third(name: str) -> None:
        published.append(name)
        if len(published) == 3:
            raise Crash()

    with pytest.raises(Crash):  # stopped right after its third published file
        Capture(settings, on_published=stop_at_the_third).run()
    stopped = len(advances)
    got = Capture(settings).run()
    assert landing_snapshot(Path(src.store.url.removeprefix("file://"))) == reference
    assert len(got.files) > 1, got.files
    if interval:
        assert stopped == 0 and len(advances) == 1, advances  # once, at the end of the read
    else:  # after files that end a transaction too, not only at the end
        assert len(advances) - stopped >= 2, (advances, got.files)
    with slots.connect(settings.source.conninfo()) as conn:
        info, ref_info = slots.slot_info(conn, settings.source.slot), slots.slot_info(conn, ref.source.slot)
    assert info is not None and ref_info is not None
    assert info.confirmed_flush_lsn is not None and ref_info.confirmed_flush_lsn is not None
    assert info.confirmed_flush_lsn >= advances[-1]


def test_small_backlogs_peek_and_large_ones_stream(src: Src) -> None:
    src.sql("CREATE TABLE t (id int PRIMARY KEY)")
    default_lag = SourceSettings.model_fields["pipeline_min_lag_mb"].default  # whatever the environment says
    cap = Capture(
        src.settings.model_copy(
            update={"source": src.settings.source.model_copy(update={"pipeline_min_lag_mb": default_lag})}
        )
    )
    cap.run()
    src.sql("INSERT INTO t SELECT generate_series(1, 10)")
    with slots.connect(src.settings.source.conninfo()) as conn:
        info = slots.slot_info(conn, src.settings.source.slot)
        upto = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert info is not None and upto is not None
    assert not cap._pipelined(info, upto[0])  # a few KB of WAL: one peek is cheaper than a copy
    assert Capture(pipelined(src.settings))._pipelined(info, upto[0])
    assert not Capture(peeking(src.settings))._pipelined(info, upto[0])


def test_fetcher_reads_rows_whatever_bytes_they_hold(src: Src, tmp_path: Path) -> None:
    """Rows whose JSON holds the COPY delimiter or quote bytes (escaped by wal2json, so never raw)
    and text that is not ASCII come back exactly as a peek returns them. The rounds it spools hold
    the source's rows: 0600 files in a 0700 directory, whatever the umask."""
    import stat

    from loader.capture.wal2json import WAL2JSON_OPTIONS

    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    slot = src.settings.source.slot
    src.sql("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
    odd = ["\x01\x02", 'quote " and \\ backslash', "line\nbreak\ttab\r", "ünïcødé ✓", ""]
    for i, v in enumerate(odd):
        src.sql("INSERT INTO t VALUES (%s, %s)", (i, v))
    placeholders = ", ".join(["%s"] * len(WAL2JSON_OPTIONS))
    with psycopg.connect(src.settings.source.dsn, autocommit=True, options=slots.SESSION_OPTIONS) as conn:
        upto = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        peeked = [
            bytes(r[0], "utf-8")
            for r in conn.execute(
                f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {placeholders})",
                (slot, *WAL2JSON_OPTIONS),
            )
        ]
    assert upto is not None
    from loader.lsn import parse_lsn

    spool = tmp_path / "spool"
    spool.mkdir()
    modes: set[tuple[str, int]] = set()
    old = os.umask(0)
    try:
        fetcher = RoundFetcher(
            src.settings.source.conninfo(), slot, WAL2JSON_OPTIONS, parse_lsn(str(upto[0])), 2, spool_dir=spool
        )
        fetcher.start()
        try:
            fetched = []
            for row in fetcher.rows():
                fetched.append(row)
                for p in spool.rglob("*"):
                    kind = "dir" if p.is_dir() else "log" if p.name == "fetcher.log" else "round"
                    modes.add((kind, stat.S_IMODE(p.stat().st_mode)))
        finally:
            fetcher.close()
    finally:
        os.umask(old)
    assert modes == {("dir", 0o700), ("log", 0o600), ("round", 0o600)}
    assert fetched == peeked
    assert fetcher.rounds > 2
    # Five transactions of three rows: a round that came back full doubles the next (the copy's
    # every round decodes again from its restart_lsn: fixed rounds cost the square of a backlog).
    assert fetcher.asked == [2, 4, 8, 8]
    assert copies_left(src) == []


def test_a_pipelined_run_splits_files_and_keeps_commit_order(src: Src) -> None:
    src.sql("CREATE TABLE t (id int PRIMARY KEY)")
    settings = pipelined(src.settings)
    Capture(settings).run()
    src.sql("INSERT INTO t SELECT generate_series(1, 500)")
    res = Capture(settings).run()
    assert res.changes == 500 and len(res.files) >= 10  # max_changes_per_file = 50
    ids = [int(dict((c.name, c.value) for c in r.columns)["id"] or 0) for r in src.changes("t")]
    assert ids == list(range(1, 501))


def test_spools_of_killed_captures_are_removed_by_the_next(tmp_path: Path) -> None:
    from loader.capture.stream import SPOOL_PREFIX
    from loader.spills import remove_orphans

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"loader-rounds-{int(gone.stdout)}-abc"
    alive = tmp_path / "loader-rounds-1-def"  # init never exits
    mine = tmp_path / f"loader-rounds-{os.getpid()}-ghi"
    other = tmp_path / "unrelated-123-x"
    for d in (dead, alive, mine, other):
        d.mkdir()
        (d / "round-00000001.csv").write_bytes(b"{}\n")
    remove_orphans(SPOOL_PREFIX, tmp_path)
    assert not dead.exists() and alive.exists() and mine.exists() and other.exists()


def test_without_a_free_slot_for_the_copy_capture_peeks(src: Src, caplog: pytest.LogCaptureFixture) -> None:
    settings = pipelined(src.settings)
    src.sql("CREATE TABLE t (id int PRIMARY KEY)")
    Capture(settings).run()
    src.sql("INSERT INTO t SELECT generate_series(1, 300)")
    used, limit = src.sql(
        "SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int"
    )[0]
    fillers = [f"{settings.source.slot}_fill{i}" for i in range(limit - used)]
    try:
        for name in fillers:  # physical slots: nothing to decode, nothing retained
            src.sql("SELECT pg_create_physical_replication_slot(%s)", (name,))
        with caplog.at_level("WARNING", logger="loader.capture"):
            res = Capture(settings).run()
    finally:
        for name in fillers:
            src.sql("SELECT pg_drop_replication_slot(%s)", (name,))
    assert "capture peeks instead" in caplog.text
    assert res.changes == 300
    ids = [int(dict((c.name, c.value) for c in r.columns)["id"] or 0) for r in src.changes("t")]
    assert ids == list(range(1, 301))
    assert copies_left(src) == []
