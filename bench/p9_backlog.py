"""P9 catch-up of a backlog of changes end to end: ``loader capture``, ``loader load``, ``loader merge``.

A source table (P3's ``accounts``, six columns) whose slot exists; then ``BENCH_BACKLOG_CHANGES``
changes are written while nothing captures (default 10M: inserts in transactions of
``BENCH_BACKLOG_TXN_ROWS``, 100,000, and one update of every tenth row, so the merge has keys
changed twice), as a loader stopped for a while, or a first day after ``slot create``, meets them.
Then the three commands run once each, as their own processes, as a scheduler runs them; per
stage: wall seconds, CPU seconds of the command and its JVM, changes/s, peak RSS of the process
tree (P8's sampler). The ceiling, measured in the same run: the server's own decoding of the same
backlog streamed to a client that keeps nothing (``COPY (SELECT data FROM
pg_logical_slot_peek_changes(...)) TO STDOUT``, once: a peek does not consume); the ratio is the
end-to-end changes/s over it. After the merge the current table's row count is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg

from bench.common import Figure, env_int, lake_settings, loader_env, record, scratch_database, scratch_dir
from bench.p3_capture import ROWS, TABLE, _peek_copy
from bench.p8_snapshot import _counts, _stage, stage_report


def run() -> None:
    changes = env_int("BENCH_BACKLOG_CHANGES", 10_000_000)
    per_txn = env_int("BENCH_BACKLOG_TXN_ROWS", 100_000)
    sample_s = float(os.environ.get("BENCH_BACKLOG_SAMPLE_S", "0.5"))
    inserts = changes * 10 // 11
    with (
        scratch_database("bench_backlog") as source_dsn,
        scratch_database("bench_backlogcat") as catalog_dsn,
        scratch_dir("bench-backlog-") as root,
    ):
        settings = lake_settings(root, catalog_dsn, source_dsn)
        env = loader_env(
            settings,
            LOADER_SOURCE__INCLUDE='["public.accounts"]',
            LOADER_SPARK__DRIVER_MEMORY=os.environ.get("BENCH_BACKLOG_DRIVER_MEMORY", "4g"),
        )
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            conn.execute(TABLE)
        subprocess.run([sys.executable, "-m", "loader.cli", "capture"], env=env, check=True, capture_output=True)
        started = time.perf_counter()
        written = 0
        with psycopg.connect(source_dsn, autocommit=True) as conn:
            for first in range(1, inserts + 1, per_txn):
                last = min(inserts, first + per_txn - 1)
                conn.execute(ROWS, (first, last))
                written += last - first + 1
            updates = conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id % 10 = 0").rowcount
            written += updates
        print(f"  backlog: {written:,} changes written in {time.perf_counter() - started:.0f}s", flush=True)
        peek_s, peek_rows, _ = _peek_copy(source_dsn, settings.source.slot)
        ceiling = written / peek_s
        print(
            f"  ceiling: peek of the backlog {peek_s:.1f}s ({peek_rows:,} rows), {ceiling:,.0f} changes/s", flush=True
        )
        stages = [
            _stage("capture", ["capture"], env, sample_s),
            _stage("load", ["load"], env, sample_s),
            _stage("merge", ["merge"], env, sample_s),
        ]
        for line in stages[1].output.splitlines() + stages[2].output.splitlines():
            if line.strip().startswith(("merge:", "public.accounts", "engine:")):
                print(f"    {line.strip()}", flush=True)
        _, current = _counts(settings, "accounts")
        assert current == inserts, (current, inserts)
        total = sum(s.wall_s for s in stages)
        cpu = sum(s.cpu_s for s in stages)
        ours = written / total
        per_stage = stage_report(stages, written, "changes")
        print(
            f"  end to end {total:.1f} s: {ours:,.0f} changes/s, {written / cpu:,.0f} changes per CPU-second",
            flush=True,
        )
        record(
            Figure(
                "P9",
                f"catch-up of a backlog of {written:,} changes: capture+load+merge",
                ours,
                "changes/s",
                ceiling,
                "the server's decoding of the backlog (peek to a client that keeps nothing)",
                ours / ceiling,
                "printed (no goal yet)",
                None,
                extra={
                    "changes": written,
                    "stages": per_stage,
                    "total_wall_s": round(total, 2),
                    "changes_per_cpu_s": round(written / cpu),
                },
            )
        )


if __name__ == "__main__":
    run()
