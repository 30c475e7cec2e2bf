"""The stream keeps draining while a snapshot copies, so a long copy does not hold the WAL of
everything written meanwhile (issue: the source's disk is safe).

A snapshot's rows land at the consistent point; the changes the stream lands between its chunks
sort after them, and the load waits for the snapshot's commit before loading them. Each test ends
with the oracle: current tables equal the source, and history holds the snapshot and the changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from loader import faults
from loader.capture.capture import snapshot
from loader.load.history import HistoryLoad
from tests.capture.test_wal_safety import MB, admin_sql, retained, write_wal
from tests.harness import Env, finish, loader_process


def big_table(env: Env, rows: int) -> None:
    env.sql("CREATE TABLE public.big (id int PRIMARY KEY, v text)")
    env.sql(f"INSERT INTO public.big SELECT g, 'v' || g FROM generate_series(1, {rows}) g")
    env.sql("CREATE TABLE public.small (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.small VALUES (1, 'a'), (2, 'b')")


def on_chunk(monkeypatch: pytest.MonkeyPatch, actions: dict[int, Callable[[], None]]) -> list[int]:
    """Run ``actions[n]`` right after the snapshot published its n-th file (1-based)."""
    real = faults.checkpoint
    published: list[int] = []

    def hooked(point: str) -> None:
        real(point)
        if point == "snapshot-after-publish":
            published.append(len(published) + 1)
            action = actions.get(published[-1])
            if action is not None:
                action()

    monkeypatch.setattr(faults, "checkpoint", hooked)
    return published


def ops_by_id(env: Env, ids: list[int]) -> dict[int, list[str]]:
    # A delete carries its key in pg_old_key only.
    key = "coalesce(id, CAST(get_json_object(pg_old_key, '$.id') AS INT))"
    rows = (
        env.history("public.big")
        .selectExpr(f"{key} AS id", "pg_operation", "pg_lsn", "pg_seq")
        .where(f"id IN ({', '.join(map(str, ids))})")
        .orderBy("pg_lsn", "pg_seq")
        .collect()
    )
    out: dict[int, list[str]] = {}
    for r in rows:
        out.setdefault(r["id"], []).append(r["pg_operation"])
    return out


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_the_stream_drains_between_chunks_and_the_load_waits_for_the_snapshot(
    env: Env, pg_admin: str, other_db: str, monkeypatch: pytest.MonkeyPatch, plugin: str
) -> None:
    big_table(env, 6000)
    env.configure("source", snapshot_chunk_rows=1000, snapshot_drain_interval_s=0, heartbeat_interval_s=10)
    env.configure("source", plugin=plugin, publication=f"pub_{env.uid}")
    written: list[int] = []
    loads: list[Any] = []
    statuses: list[Any] = []

    def write_meanwhile() -> None:
        # After the first chunk: another database writes, and the captured tables change, rows
        # not copied yet included (the copy's snapshot still sees them as they were).
        written.append(write_wal(other_db, 80))
        env.sql("UPDATE public.big SET v = 'during' WHERE id <= 5 OR id BETWEEN 5001 AND 5005")
        env.sql("DELETE FROM public.big WHERE id BETWEEN 4001 AND 4003")
        env.sql("INSERT INTO public.big VALUES (7001, 'new'), (7002, 'new')")
        env.sql("UPDATE public.small SET v = 'c' WHERE id = 1")
        admin_sql(pg_admin, "CHECKPOINT")  # a running-transactions record for the slot to move to

    def load_meanwhile() -> None:
        # A scheduled load that starts while the copy goes on: the stream's files are already
        # landed after the snapshot's, but nothing may load before the snapshot's commit.
        loads.append(HistoryLoad(env.spark, env.settings).run())
        statuses.append(env.status())

    published = on_chunk(monkeypatch, {1: write_meanwhile, 4: load_meanwhile})
    done = snapshot(env.settings).run()
    assert len(published) >= 6 and done.rows == 6002, done.summary()
    assert done.drains >= 3 and done.streamed_during >= 12, done.summary()
    assert "the stream drained" in done.summary()

    # The slot was confirmed while the copy went on: it holds far less than what was written.
    assert written[0] > 70 * MB
    held = retained(pg_admin, env.settings.source.slot)
    assert held < 64 * MB, f"the slot retains {held / MB:.1f} MB after the snapshot"

    (mid,) = loads
    assert mid.files == [] and mid.gap is not None and "still landing" in mid.gap, mid.summary()
    (status,) = statuses  # status during the copy names it, and who copies
    assert status.snapshot is not None and status.snapshot.running and status.snapshot.rows_landed >= 4000
    assert "snapshot:           copying 2 tables" in status.render(), status.render()
    assert env.status().snapshot is None

    _, _, merge = env.run_all()
    assert not merge.parked, merge.summary()
    env.assert_reconciled()
    history = ops_by_id(env, [1, 4001, 5001, 7001, 100])
    assert history[1] == ["read", "update"]
    assert history[5001] == ["read", "update"]  # copied after its update committed: the snapshot's image first
    assert history[4001] == ["read", "delete"]
    assert history[7001] == ["insert"]
    assert history[100] == ["read"]


def test_killed_after_a_drain_the_snapshot_resumes_and_converges(env: Env) -> None:
    big_table(env, 5000)
    landing = env.tmp / "landing"
    # Held a second after each chunk's publication (the test writes meanwhile), killed right after
    # the third, when the drains after the first two have landed the stream's changes.
    proc = loader_process(
        env,
        "backfill",
        "snapshot",
        LOADER_SOURCE__SNAPSHOT_CHUNK_ROWS="1000",
        LOADER_SOURCE__SNAPSHOT_DRAIN_INTERVAL_S="0",
        LOADER_PAUSE="snapshot-after-publish:1",
        LOADER_FAULT="snapshot-after-publish@3",
    )
    try:
        deadline = time.monotonic() + 120
        while not list(landing.rglob("*.arrows")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        env.sql("UPDATE public.big SET v = 'during' WHERE id IN (1, 4500)")  # copied already / not yet
        env.sql("DELETE FROM public.big WHERE id = 4600")
        env.sql("UPDATE public.small SET v = 'k' WHERE id = 2")
    finally:
        code, out = finish(proc)
    assert code == -9, out
    interrupted = env.status()
    assert interrupted.snapshot is not None and interrupted.snapshot.running is False
    assert "the next capture resumes it" in interrupted.render(), interrupted.render()
    streamed = [p for p in landing.rglob("*.tables.arrow")]
    assert streamed, "the drains landed nothing before the kill"
    env.sql("UPDATE public.big SET v = 'after the kill' WHERE id IN (2, 4700)")
    code, out = finish(loader_process(env, "backfill", "snapshot", LOADER_SOURCE__SNAPSHOT_CHUNK_ROWS="1000"))
    assert code == 0 and "resumed" in out, out
    env.run_all()
    env.assert_reconciled()
    history = ops_by_id(env, [1, 4500, 4600])
    assert history[1] == ["read", "update"] and history[4600][-1] == "delete", history


def test_a_keyless_table_interrupted_mid_copy_is_read_again_exactly(env: Env) -> None:
    """A table without a key cannot resume after its last key, nor converge by key: read from a
    newer snapshot, it would hold rows the stream then lands again (an append-only log doubled)."""
    env.sql("CREATE TABLE public.aaa_log (at int, what text)")  # sorts first: copied first
    env.sql("ALTER TABLE public.aaa_log REPLICA IDENTITY FULL")  # verify judges it row for row
    env.sql("INSERT INTO public.aaa_log SELECT g, 'old' FROM generate_series(1, 1500) g")
    big_table(env, 1000)
    code, out = finish(
        loader_process(
            env,
            "backfill",
            "snapshot",
            LOADER_SOURCE__SNAPSHOT_CHUNK_ROWS="500",
            LOADER_FAULT="snapshot-after-publish@2",
        )
    )
    assert code == -9, out
    # Committed after the snapshot's consistent point: in the stream, and in any newer snapshot.
    env.sql("INSERT INTO public.aaa_log SELECT g, 'new' FROM generate_series(2001, 2010) g")
    env.sql("UPDATE public.big SET v = 'after the kill' WHERE id IN (1, 900)")
    code, out = finish(loader_process(env, "backfill", "snapshot", LOADER_SOURCE__SNAPSHOT_CHUNK_ROWS="500"))
    assert code == 0 and "resumed" in out, out
    env.run_all()
    env.assert_reconciled()
    # Read again after the resumed snapshot, at a consistent point of its own: its state starts there.
    notes = [r["pg_note"] for r in env.history("public.aaa_log").where("pg_operation = 'resync'").collect()]
    assert len(notes) == 1 and "consistent point of its own" in notes[0], notes
