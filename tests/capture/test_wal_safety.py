"""The source's disk is safe: the slot never holds WAL the loader does not need.

Through the CLI against the real server: a heartbeat through the stream confirms the position
decoding reached although the captured tables are quiet while another database (or an excluded
table) writes; the heartbeat's confirm never skips a change; status shows the retained WAL, the
slot's wal_status, the heartbeat's age, and warns when the server sets no limit or lost the slot.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from loader.config import LoaderSettings
from loader.landing.records import COMMIT
from loader.lsn import parse_lsn
from tests.capture.conftest import Src, cli

MB = 1024 * 1024


def with_source(settings: LoaderSettings, **update: Any) -> LoaderSettings:
    return settings.model_copy(update={"source": settings.source.model_copy(update=update)})


def admin_sql(pg_admin: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def write_wal(dsn: str, mb: int, table: str = "wal_filler") -> int:
    """Write about ``mb`` MB of WAL through a logged table of wide rows, then drop it; bytes written."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id int, v text)")
        # ~1 kB rows stay inline and uncompressed (below the TOAST threshold, md5 text barely compresses
        # at that length): the WAL grows with the data.
        rows = mb * 1100
        conn.execute(f"INSERT INTO {table} SELECT g, repeat(md5(g::text), 30) FROM generate_series(1, %s) g", (rows,))
        conn.execute(f"DROP TABLE {table}")
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
    return end - start


def retained(pg_admin: str, slot: str) -> int:
    """pg_current_wal_lsn() - restart_lsn of the slot, after a CHECKPOINT."""
    admin_sql(pg_admin, "CHECKPOINT")
    row = admin_sql(
        pg_admin,
        f"SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = '{slot}'",
    )
    return int(row[0][0])


@pytest.fixture
def keep_size(pg_admin: str) -> Iterator[Any]:
    """Sets the server's max_slot_wal_keep_size for the test; restores it after."""

    def put(value: str | None) -> None:
        if value is None:
            admin_sql(pg_admin, "ALTER SYSTEM RESET max_slot_wal_keep_size")
        else:
            admin_sql(pg_admin, f"ALTER SYSTEM SET max_slot_wal_keep_size = '{value}'")
        admin_sql(pg_admin, "SELECT pg_reload_conf()")

    try:
        yield put
    finally:
        put(None)


def included_a(src: Src) -> LoaderSettings:
    src.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    return with_source(src.settings, include=["public.a"], heartbeat_interval_s=10.0)


# --- progress without changes ------------------------------------------------------------------


def test_a_quiet_slot_stops_holding_wal_another_database_writes(src: Src, pg_admin: str, other_db: str) -> None:
    settings = included_a(src)
    first = cli(settings, src.tmp, "capture")
    assert first.exit_code == 0, first.output
    # The slot's restart point moves only to running-transactions records, which the server's
    # background writer logs every 15 s while WAL is written, and a checkpoint at once: one early in
    # the stretch (a slow write, a checkpoint forced by max_wal_size), one after (retained()
    # checkpoints first). A single advance would stop at the early one.
    written = write_wal(other_db, 10)
    admin_sql(pg_admin, "CHECKPOINT")
    written += write_wal(other_db, 90)
    assert written > 90 * MB, written
    slot = settings.source.slot
    assert retained(pg_admin, slot) > written  # the slot held all of it so far
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert "captured 0 changes" in res.output and "heartbeat back after" in res.output
    held = retained(pg_admin, slot)
    assert held < 64 * MB, f"the slot still retains {held / MB:.1f} MB after a capture"
    # Nothing of a was invented, and a change after it still lands.
    src.sql("INSERT INTO a VALUES (1, 'x')")
    assert cli(settings, src.tmp, "capture").exit_code == 0
    assert [(r.op, r.table) for r in src.changes()] == [("I", "a")]


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_a_quiet_slot_stops_holding_wal_an_excluded_table_writes(src: Src, pg_admin: str, plugin: str) -> None:
    settings = with_source(included_a(src), plugin=plugin, publication=f"pub_{settings_slot(src)}")
    assert cli(settings, src.tmp, "capture").exit_code == 0
    written = write_wal(settings.source.dsn, 100, table="b_filler")
    src.sql("INSERT INTO b SELECT g, 'excluded' FROM generate_series(1, 100) g")
    # The server moves a slot's restart point only to a running-transactions record decoding passed:
    # the background writer logs one every 15 s while WAL is written, a checkpoint logs one at once.
    admin_sql(pg_admin, "CHECKPOINT")
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    held = retained(pg_admin, settings.source.slot)
    assert held < 64 * MB, f"the slot still retains {held / MB:.1f} MB of the {written / MB:.0f} MB written"
    assert src.changes() == []


def settings_slot(src: Src) -> str:
    return src.settings.source.slot


def test_the_heartbeat_never_confirms_past_an_open_transaction(src: Src) -> None:
    settings = included_a(src)
    assert cli(settings, src.tmp, "capture").exit_code == 0
    src.sql("INSERT INTO a VALUES (0, 'before')")
    with psycopg.connect(settings.source.dsn) as open_txn:  # not autocommit: one open transaction
        open_txn.execute("INSERT INTO a SELECT g, 'open' FROM generate_series(1, 3) g")
        inside = parse_lsn(open_txn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        res = cli(settings, src.tmp, "capture")  # emits a heartbeat while the transaction is open
        assert res.exit_code == 0, res.output
        confirmed = parse_lsn(
            src.sql(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (settings.source.slot,),
            )[0][0]
        )
        assert confirmed > inside, "the heartbeat did not move the slot past the open transaction's changes"
        open_txn.execute("INSERT INTO a VALUES (4, 'open')")
        open_txn.commit()
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert cli(settings, src.tmp, "capture").exit_code == 0  # and again: nothing doubles
    ids = [int(dict((c.name, c.value) for c in r.columns)["id"]) for r in src.changes("a")]
    assert ids == [0, 1, 2, 3, 4]
    commits = [r for r in src.records() if r.op == COMMIT]
    assert len(commits) == 2


def test_without_the_right_to_emit_capture_warns_and_confirms_what_it_received(src: Src, pg_admin: str) -> None:
    role = f"cdc_{uuid.uuid4().hex[:8]}"
    src.sql(f"CREATE ROLE {role} LOGIN REPLICATION")
    src.sql("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC")
    try:
        settings = included_a(src)
        src.sql(f"GRANT SELECT ON a TO {role}")
        settings = with_source(settings, dsn=settings.source.dsn.replace("postgres@", f"{role}@", 1))
        first = cli(settings, src.tmp, "capture")
        assert first.exit_code == 0, first.output
        assert "refused the loader's heartbeat" in first.output and "GRANT EXECUTE" in first.output
        src.sql("INSERT INTO a VALUES (1, 'x')")
        res = cli(settings, src.tmp, "capture")
        assert res.exit_code == 0, res.output
        assert [r.op for r in src.changes("a")] == ["I"]
        # The GRANT the README names is enough.
        src.sql(f"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO {role}")
        res = cli(settings, src.tmp, "capture")
        assert "refused" not in res.output and "heartbeat back after" in res.output, res.output
    finally:
        src.sql(f"DROP OWNED BY {role}")
        with psycopg.connect(pg_admin, autocommit=True) as c:
            for pid in c.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s", (role,)).fetchall():
                c.execute("SELECT pg_terminate_backend(%s)", pid)
        src.sql(f"DROP ROLE {role}")


# --- seen before it hurts ------------------------------------------------------------------------


def test_status_shows_retained_wal_wal_status_heartbeat_and_the_missing_limit(src: Src, keep_size: Any) -> None:
    keep_size(None)  # -1: unlimited
    settings = included_a(src)
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert "max_slot_wal_keep_size is -1" in res.output
    st = cli(settings, src.tmp, "status", "--json")
    assert st.exit_code == 0, st.output
    doc = json.loads(st.output)
    slot = doc["slot"]
    assert slot["name"] == settings.source.slot and slot["wal_status"] == "reserved"
    assert isinstance(slot["retained_wal_bytes"], int) and slot["max_slot_wal_keep_size"] == "-1"
    assert any("max_slot_wal_keep_size is -1" in w for w in slot["warnings"])
    assert doc["heartbeat"]["seen_age_s"] is not None and doc["heartbeat"]["seen_age_s"] < 60
    assert doc["heartbeat"]["lag_s"] is not None
    text = cli(settings, src.tmp, "status")
    assert "retains" in text.output and "wal_status reserved" in text.output
    assert "heartbeat:          seen" in text.output and "max_slot_wal_keep_size is -1" in text.output
    keep_size("10GB")
    res = cli(settings, src.tmp, "capture")
    assert "max_slot_wal_keep_size is -1" not in res.output
    doc = json.loads(cli(settings, src.tmp, "status", "--json").output)
    assert doc["slot"]["max_slot_wal_keep_size"] == "10GB" and doc["slot"]["warnings"] == []


def test_a_slot_the_server_invalidated_is_named_in_status_with_the_resync(
    src: Src, pg_admin: str, keep_size: Any
) -> None:
    # No heartbeat: the quiet slot falls behind while the database writes, and the server drops its WAL.
    settings = with_source(included_a(src), heartbeat_interval_s=0)
    assert cli(settings, src.tmp, "capture").exit_code == 0
    src.sql("INSERT INTO a VALUES (1, 'x')")
    assert cli(settings, src.tmp, "capture").exit_code == 0
    keep_size("1MB")
    write_wal(settings.source.dsn, 64, table="b_filler")
    admin_sql(pg_admin, "CHECKPOINT")
    status = admin_sql(
        pg_admin, f"SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{settings.source.slot}'"
    )
    assert status[0][0] == "lost"
    doc = json.loads(cli(settings, src.tmp, "status", "--json").output)
    assert doc["slot"]["lost"] is True and doc["slot"]["wal_status"] == "lost"
    assert any("loader resync" in w for w in doc["slot"]["warnings"])
    text = cli(settings, src.tmp, "status").output
    assert "slot lost" in text and "loader resync" in text
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code != 0 and "invalidated" in res.output
