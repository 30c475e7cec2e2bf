"""Soak (``make soak``, not part of ``make test``): hundreds of follow-mode cycles with changes and
maintenance, then the bounds a months-long run needs, the oracles, and late-file detection after
every snapshot but the last is expired.

``LOADER_SOAK_CYCLES`` (default 300) cycles; each one writes a few bank transactions, captures, and
runs ``Follower.cycle()`` (load + merge in this Spark session, as ``loader run --follow`` does);
maintenance runs every ``LOADER_SOAK_MAINTAIN_EVERY`` (50) cycles, as follow mode's policy would.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

from loader.follow import Follower
from loader.lake.tables import SourceTable
from loader.maintain import Maintenance
from loader.workload import BankWorkload
from tests.harness import Env, hold_back_landing_files, return_landing_files
from tests.oracle import assert_history_matches, assert_no_duplicate_positions

pytestmark = pytest.mark.skipif(not os.environ.get("LOADER_SOAK"), reason="soak: run with make soak")

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


def _file_counts(env: Env, table: str) -> tuple[int, int]:
    ident = env.names.current(SourceTable.parse(table))
    rows = env.spark.sql(f"SELECT content, count(*) AS n FROM {ident}.files GROUP BY content").collect()
    by = {r.content: r.n for r in rows}
    return by.get(0, 0), by.get(1, 0) + by.get(2, 0)


def test_soak_cycles_maintenance_bounds_and_late_files(env: Env) -> None:
    cycles = int(os.environ.get("LOADER_SOAK_CYCLES", "300"))
    maintain_every = int(os.environ.get("LOADER_SOAK_MAINTAIN_EVERY", "50"))
    env.configure("maintenance", snapshot_retention_hours=0, retain_last=5)
    wl = BankWorkload(env.settings.source.dsn, seed=7)
    wl.create_schema()
    env.capture()
    follower = Follower(env.settings, env.spark)
    merge_times: list[float] = []
    peak: dict[str, tuple[int, int]] = {}
    started = time.monotonic()
    for i in range(cycles):
        wl.run(3)
        env.capture()
        t = time.perf_counter()
        assert follower.cycle()
        merge_times.append(time.perf_counter() - t)
        if (i + 1) % maintain_every == 0:
            before = {t: _file_counts(env, t) for t in KEYS}
            Maintenance(env.spark, env.settings).run()
            after = {t: _file_counts(env, t) for t in KEYS}
            print(f"cycle {i + 1}: current (data, delete) files before/after maintenance {before} -> {after}")
        for table in KEYS:
            d, x = _file_counts(env, table) if (i + 1) % 10 == 0 else (0, 0)
            peak[table] = (max(peak.get(table, (0, 0))[0], d), max(peak.get(table, (0, 0))[1], x))
    first, last = statistics.median(merge_times[:20]), statistics.median(merge_times[-20:])
    final = {t: _file_counts(env, t) for t in KEYS}
    print(f"soak: {cycles} cycles in {time.monotonic() - started:.0f}s")
    print(f"soak: cycle time (load + merge), median of first 20 {first:.2f}s, of last 20 {last:.2f}s")
    print(f"soak: current (data files, delete files) at the end {final}; peak between maintenances {peak}")
    # Bounded: maintenance folds delete files away and compacts data files; between two
    # maintenances each cycle adds at most a few files per table.
    buckets = env.settings.merge.key_buckets
    for table, (data, deletes) in final.items():
        assert data <= 2 * buckets + 2 * maintain_every, (table, data)
        assert deletes <= 2 * maintain_every, (table, deletes)
    assert last <= 2 * first + 1.0, f"cycle time drifted: {first:.2f}s -> {last:.2f}s"
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)

    # Expire every snapshot but the last; a landing file that arrives late is still merged.
    env.configure("source", max_changes_per_file=30)
    wl.run(30)
    env.capture()
    held = hold_back_landing_files(env)
    wl.run(10)
    env.run_all()
    env.configure("maintenance", snapshot_retention_hours=0, retain_last=1)
    Maintenance(env.spark, env.settings).run(orphans=False)
    for table in KEYS:
        ident = env.names.current(SourceTable.parse(table))
        assert env.spark.sql(f"SELECT count(*) FROM {ident}.snapshots").first()[0] == 1
    return_landing_files(env, held)
    _, load, merge = env.run_all()
    assert {f.name for f in held} <= set(load.files)
    assert any("late changes" in t.note for t in merge.tables)
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)
