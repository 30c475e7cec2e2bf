"""Kill -9 anywhere, and overlapping runs: nothing lost, nothing doubled, no watermark moves back.

The stages run as real ``loader`` processes (``python -m loader.cli``): the crashed ones die by
SIGKILL at named points (``LOADER_FAULT``, see loader.faults), the overlapping ones are held at a
point while a second process starts (``LOADER_PAUSE``). Every test ends with the oracles: current
tables equal the source, and history holds every workload change exactly once, in commit order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from loader.workload import BankWorkload
from tests.harness import Env
from tests.oracle import assert_history_matches, assert_no_duplicate_positions

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


def cli_env(env: Env, **extra: str) -> dict[str, str]:
    s = env.settings
    out = dict(os.environ)
    out.update(
        {
            "LOADER_SOURCE__DSN": s.source.dsn,
            "LOADER_SOURCE__SLOT": s.source.slot,
            "LOADER_SOURCE__MAX_CHANGES_PER_FILE": str(s.source.max_changes_per_file),
            "LOADER_LANDING__URL": s.landing.url,
            "LOADER_CATALOG__URI": s.catalog.uri,
            "LOADER_CATALOG__WAREHOUSE": s.catalog.warehouse,
            "LOADER_CATALOG__HISTORY_NAMESPACE": s.catalog.history_namespace,
            "LOADER_CATALOG__CURRENT_NAMESPACE": s.catalog.current_namespace,
            "LOADER_CATALOG__LOADER_NAMESPACE": s.catalog.loader_namespace,
            "LOADER_SPARK__SHUFFLE_PARTITIONS": "2",
            "LOADER_SPARK__DRIVER_MEMORY": "1g",
            "LOADER_MERGE__KEY_BUCKETS": str(s.merge.key_buckets),
        }
    )
    out.pop("LOADER_FAULT", None)
    out.pop("LOADER_PAUSE", None)
    out.update(extra)
    return out


def loader(env: Env, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loader.cli", *args],
        env=cli_env(env, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_for_holder(env: Env, stage: str, timeout: float = 120) -> None:
    """Until a 'loader <stage>' process holds its lock (its session shows in the catalog database)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(env.settings.catalog.uri, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s",
                (f"lakehouse-loader {stage} %",),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"no 'loader {stage}' took its lock within {timeout}s")


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

DDL = {
    "add-column-default": ["ALTER TABLE public.accounts ADD COLUMN tier text NOT NULL DEFAULT 'standard'"],
    "rename-column": ["ALTER TABLE public.accounts RENAME COLUMN tier TO service_tier"],
    "retype": [
        "ALTER TABLE public.transactions ALTER COLUMN memo TYPE varchar(80)",
        "ALTER TABLE public.accounts ALTER COLUMN interest_rate TYPE text USING interest_rate::text",
    ],
}


def test_kill_anywhere_then_rerun(env: Env) -> None:
    """SIGKILL of capture, load and merge at 11 points of a workload with DDL; re-runs repair."""
    env.configure("source", max_changes_per_file=40)
    wl = workload(env, seed=23)
    wl.run(30)
    env.run_all()
    killed: list[str] = []
    for i, (stage, point, before) in enumerate(KILL_POINTS):
        wl.run(25)
        for statement in DDL.get(before, []):
            env.sql(statement)
        wl.run(5)
        if stage in ("load", "merge"):
            env.capture()
        if stage == "merge":
            env.load()
        rc, out = finish(loader(env, stage, LOADER_FAULT=point))
        assert rc == -signal.SIGKILL, f"{point} was not reached (exit {rc}):\n{out}"
        killed.append(point)
        # Re-run everything, as the next cron tick would.
        env.run_all()
        if i % 4 == 3:
            assert_exactly_once(env, wl)
    assert len(set(killed)) >= 8
    wl.run(20)
    env.run_all()
    assert_exactly_once(env, wl)
    assert not {t.table: t.parked for t in env.status().tables if t.parked}
