"""P3 capture throughput vs the COPY peek ceiling, and capture's peak memory on a 1M-row transaction.

Throughput: ``BENCH_CAPTURE_TXNS`` transactions of ``BENCH_CAPTURE_TXN_ROWS`` inserts of a
six-column table (default 100 x 10,000 = 1M changes), seen by ``BENCH_REPEATS`` slots created
before the writes. The ceiling is the server's own decoding streamed to a client that does
nothing with it: ``COPY (SELECT data FROM pg_logical_slot_peek_changes(...)) TO STDOUT`` with
capture's wal2json options (median of the repeats; a peek does not consume). Then each slot is
captured once by ``loader capture`` (``Capture.run()``) in a child process, to landing files on
local disk (median time).

Memory: one transaction of ``BENCH_ROWS`` (1M) rows in a second database, captured in a child
process that reports its own peak RSS (goal <= 512 MB: capture streams, it never holds a
transaction).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.common import SERIES, Figure, env_int, record, scratch_database, scratch_dir

_CHILD = """
import json, resource, sys, time
from loader.capture.capture import Capture
from loader.config import LoaderSettings
s = LoaderSettings(source={"dsn": sys.argv[1], "slot": sys.argv[2]}, landing={"url": sys.argv[3]})
t = time.perf_counter()
r = Capture(s).run()
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": time.perf_counter() - t, "changes": r.changes, "files": len(r.files),
                  "rss_mb": me.ru_maxrss / 1024,
                  # the process and its fetcher (a child, waited for): start-up included
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))
"""

TABLE = (
    "CREATE TABLE accounts (id bigint PRIMARY KEY, customer_id bigint NOT NULL, balance numeric(18,2),"
    " status text, opened_at timestamptz, note text)"
)
ROWS = (
    "INSERT INTO accounts SELECT g, g * 7 %% 1000003, (g %% 10000000) / 100.0,"
    " (ARRAY['open','closed','frozen'])[g %% 3 + 1], timestamptz '2023-05-01 08:30:00+00' + g * interval '1 second',"
    " CASE WHEN g %% 2 = 0 THEN 'note ' || g %% 1000 END"
    " FROM generate_series(%s::bigint, %s::bigint) g"
)


def _capture(dsn: str, slot: str, landing: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, dsn, slot, landing.as_uri()],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _peek_copy(dsn: str, slot: str) -> tuple[float, int, int]:
    from loader.capture.wal2json import WAL2JSON_OPTIONS

    opts = ", ".join(f"'{o}'" for o in WAL2JSON_OPTIONS)
    sql = f"COPY (SELECT data FROM pg_logical_slot_peek_changes('{slot}', NULL, NULL, {opts})) TO STDOUT"
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        size = rows = 0
        with conn.cursor().copy(sql) as copy:
            for block in copy:
                size += len(block)
                rows += bytes(block).count(b"\n")
        return time.perf_counter() - started, rows, size


def run() -> None:
    txns = env_int("BENCH_CAPTURE_TXNS", 100)
    txn_rows = env_int("BENCH_CAPTURE_TXN_ROWS", 10_000)
    repeats = env_int("BENCH_REPEATS", 3)
    big = env_int("BENCH_ROWS", 1_000_000)
    n = txns * txn_rows
    with scratch_database("bench_capture") as dsn, scratch_dir("bench-capture-") as root:
        slots = [f"bench_capture_{i}" for i in range(repeats)]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            for slot in slots:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
            for t in range(txns):
                conn.execute(ROWS, (t * txn_rows + 1, (t + 1) * txn_rows))
        peeks = [_peek_copy(dsn, slots[0]) for _ in range(repeats)]
        t_ceiling = statistics.median(p[0] for p in peeks)
        print(f"  COPY peek: {peeks[0][1]:,} wal2json rows, {peeks[0][2] / 1e6:.0f} MB, median {t_ceiling:.2f}s")
        runs = []
        for i, slot in enumerate(slots):
            res = _capture(dsn, slot, root / f"landing{i}")
            assert res["changes"] == n, res
            runs.append(res)
            print(
                f"  capture: {res['changes']:,} changes in {res['seconds']:.2f}s, {res['cpu_s']:.2f} CPU-s"
                f" (this process and its fetcher), {res['files']} files"
            )
        t_capture = statistics.median(r["seconds"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        print(f"  capture: {n / cpu:,.0f} changes per CPU-second (median)")
        ours, ceiling = n / t_capture, n / t_ceiling
        SERIES.setdefault("stage_throughput", {})["capture"] = {"measured": ours, "ceiling": ceiling}
        record(
            Figure(
                "P3",
                f"capture {n / 1e6:g}M changes ({txns} txns of {txn_rows:,})",
                ours,
                "changes/s",
                ceiling,
                "COPY of pg_logical_slot_peek_changes, same options",
                ours / ceiling,
                ">= 0.7",
                ours / ceiling >= 0.7,
                {"capture_rss_mb": max(r["rss_mb"] for r in runs), "changes_per_cpu_s": round(n / cpu)},
            )
        )
    with scratch_database("bench_capture_big") as dsn, scratch_dir("bench-capture-") as root:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("SELECT pg_create_logical_replication_slot('bench_big', 'wal2json')")
            conn.execute(ROWS, (1, big))
        res = _capture(dsn, "bench_big", root / "landing")
        assert res["changes"] == big, res
        record(
            Figure(
                "P3m",
                f"capture peak RSS, one {big / 1e6:g}M-row transaction",
                res["rss_mb"],
                "MB",
                goal="<= 512 MB",
                met=res["rss_mb"] <= 512,
                extra={"seconds": res["seconds"]},
            )
        )


if __name__ == "__main__":
    run()
