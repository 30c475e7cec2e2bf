"""Kill -9 anywhere, and overlapping runs: nothing lost, nothing doubled, no watermark moves back.

The stages run as real ``loader`` processes (``python -m loader.cli``): the crashed ones die by
SIGKILL at named points (``LOADER_FAULT``, see loader.faults), the overlapping ones are held at a
point while a second process starts (``LOADER_PAUSE``). Every test ends with the oracles: current
tables equal the source, and history holds every workload change exactly once, in commit order.
"""

from __future__ import annotations

import os
import signal

import pytest

from loader.lake.tables import SourceTable
from loader.workload import BankWorkload
from tests.harness import Env, finish, wait_for_holder
from tests.harness import loader_process as loader
from tests.oracle import assert_history_matches, assert_no_duplicate_positions

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


def workload(env: Env, seed: int) -> BankWorkload:
    wl = BankWorkload(env.settings.source.dsn, seed=seed)
    wl.create_schema()
    env.capture()
    return wl


def assert_exactly_once(env: Env, wl: BankWorkload) -> None:
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


# --- overlaps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["load", "merge"])
def test_two_overlapping_runs_of_a_stage(env: Env, stage: str) -> None:
    wl = workload(env, seed=21)
    wl.run(60)
    env.capture()
    if stage == "merge":
        env.load()
    first = loader(env, stage, LOADER_PAUSE=f"{stage}-locked:20")
    wait_for_holder(env, stage)
    # A second process (a cron overlap; on another machine it meets the same lock in the catalog).
    rc, out = finish(loader(env, stage))
    assert rc == 75, out
    assert f"another 'loader {stage}' is running" in out and "lakehouse-loader" in out
    # One that is told to wait runs after the first, and finds nothing left to do.
    waiting = loader(env, stage, LOADER_LOCKS__WAIT_SECONDS="300")
    rc1, out1 = finish(first)
    rc2, out2 = finish(waiting)
    assert rc1 == 0 and rc2 == 0, out1 + out2
    if stage == "load":
        assert "no new landing files" in out2
    else:
        assert "0 changes" in out2 or "changes -> 0 keys" in out2 or "0 keys" in out2, out2
    env.load()
    env.merge()
    assert_exactly_once(env, wl)


def test_two_overlapping_loader_runs(env: Env) -> None:
    wl = workload(env, seed=22)
    wl.run(40)
    first = loader(env, "run", LOADER_PAUSE="load-locked:20")
    wait_for_holder(env, "load")
    wl.run(20)
    rc, out = finish(loader(env, "run"))
    # The second run captures (the slot's lock is free again) and then finds the load busy.
    assert rc == 75 and "another 'loader load' is running" in out, out
    rc1, out1 = finish(first)
    assert rc1 == 0, out1
    env.run_all()
    assert_exactly_once(env, wl)


# --- kill -9 anywhere ---------------------------------------------------------------------------

# (stage, fault point, what the workload does first so that the point is reached)
KILL_POINTS: list[tuple[str, str, str]] = [
    ("capture", "capture-after-publish@2", "changes"),
    ("capture", "capture-before-advance", "changes"),
    ("capture", "capture-after-advance", "changes"),
    ("capture", "capture-before-resync", "add-column-default"),
    ("capture", "snapshot-after-publish", "rename-column"),
    ("load", "load-after-table", "changes"),
    ("load", "load-between-retire-steps", "retype"),
    ("load", "load-before-ledger", "changes"),
    ("load", "load-after-ledger", "changes"),
    ("merge", "merge-before-commit", "changes"),
    ("merge", "merge-after-commit", "changes"),
]
# make test kills at the points no other test of make test kills at (the fuzz seeds draw some of
# them too, but not by design); the four others have their own tests (test_stream_names,
# test_stream, test_snapshot_drain, merge/test_driver). LOADER_KILL_POINTS=all (make soak) kills at
# every point; the workload and its DDL run the same either way.
COVERED_ELSEWHERE = {
    "capture-after-publish@2",
    "capture-before-advance",
    "snapshot-after-publish",
    "merge-before-commit",
}
ALL_POINTS = os.environ.get("LOADER_KILL_POINTS", "") == "all"

DDL = {
    "add-column-default": ["ALTER TABLE public.accounts ADD COLUMN tier text NOT NULL DEFAULT 'standard'"],
    "rename-column": ["ALTER TABLE public.accounts RENAME COLUMN tier TO service_tier"],
    "retype": [
        "ALTER TABLE public.transactions ALTER COLUMN memo TYPE varchar(80)",
        "ALTER TABLE public.accounts ALTER COLUMN interest_rate TYPE text USING interest_rate::text",
    ],
}


def test_kill_anywhere_then_rerun(env: Env) -> None:
    """SIGKILL of capture, load and merge at 7 points (11 with LOADER_KILL_POINTS=all) of a workload
    with DDL; re-runs repair."""
    env.configure("source", max_changes_per_file=40)
    wl = workload(env, seed=23)
    wl.run(30)
    env.run_all()
    killed: list[str] = []
    for stage, point, before in KILL_POINTS:
        wl.run(25)
        for statement in DDL.get(before, []):
            env.sql(statement)
        wl.run(5)
        if point in COVERED_ELSEWHERE and not ALL_POINTS:
            continue
        if stage in ("load", "merge"):
            env.capture()
        if stage == "merge":
            env.load()
        rc, out = finish(loader(env, stage, LOADER_FAULT=point))
        assert rc == -signal.SIGKILL, f"{point} was not reached (exit {rc}):\n{out}"
        killed.append(point)
        # Re-run everything, as the next cron tick would.
        env.run_all()
        if len(killed) % 4 == 3:
            assert_exactly_once(env, wl)
    assert len(killed) == (len(KILL_POINTS) if ALL_POINTS else len(KILL_POINTS) - len(COVERED_ELSEWHERE))
    wl.run(20)
    env.run_all()
    assert_exactly_once(env, wl)
    assert not {t.table: t.parked for t in env.status().tables if t.parked}


def test_kill_between_and_inside_driver_load_groups(env: Env) -> None:
    """A backlog above load.driver_max_bytes loads as several driver groups, written as they are
    typed and committed together (load.commit_interval_s), and a transaction longer than the bound
    is streamed file by file into one commit per table: SIGKILL once two groups are written and
    none committed (nothing is marked loaded), then, committing every group, after the second
    group's ledger, then in the middle of the streamed transaction; the re-runs load the rest
    exactly once."""
    env.configure("source", max_changes_per_file=40)
    # Arrow bytes of the files read (v2 change files: names and types dictionary-encoded), so that
    # the 90 changes before the long transaction make more than two groups.
    env.configure("load", driver_max_bytes=24_000)
    wl = workload(env, seed=31)
    env.sql("CREATE TABLE public.bulk (id integer PRIMARY KEY, note text NOT NULL)")
    wl.run(60)
    env.transaction("INSERT INTO public.bulk SELECT g, repeat('x', 200) || g FROM generate_series(1, 1500) g")
    wl.run(30)
    env.capture()
    rc, out = finish(loader(env, "load", LOADER_FAULT="load-group-written@2"))
    assert rc == -signal.SIGKILL, f"no second driver group (exit {rc}):\n{out}"
    assert env.spark.table(env.names.ledger).count() == 0, "groups written were committed before the interval"
    every_group = {"LOADER_LOAD__COMMIT_INTERVAL_S": "0"}
    rc, out = finish(loader(env, "load", LOADER_FAULT="load-after-ledger@2", **every_group))
    assert rc == -signal.SIGKILL, f"no second driver group (exit {rc}):\n{out}"
    rc, out = finish(loader(env, "load", LOADER_FAULT="load-streamed-file@2"))
    assert rc == -signal.SIGKILL, f"the long transaction was not streamed (exit {rc}):\n{out}"
    res = env.load()
    assert all(e.startswith("driver") for e in res.engines), res.engines
    wl.run(10)
    env.run_all()
    assert_exactly_once(env, wl)
    hist = env.spark.table(env.names.history(SourceTable("public", "bulk")))
    assert hist.where("pg_operation = 'insert'").count() == 1500
