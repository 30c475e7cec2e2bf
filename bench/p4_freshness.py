"""P4 freshness in follow mode: commit -> visible in current, under a steady ``pgbench -R`` load.

A source database initialised by ``pgbench -i`` plus a ``probe`` table; ``loader capture
--snapshot``; then ``loader run --follow --interval BENCH_FOLLOW_INTERVAL`` as its own process
(its own JVM, like production). While ``pgbench -R BENCH_PGBENCH_RATE`` (TPC-B transactions per
second, 2 clients) runs for ``BENCH_FRESHNESS_SECONDS``, a probe row is inserted every second; each
probe's latency is from its commit until a reader of the current table (pyiceberg, as a BI tool
would) sees it. Prints the median and p95 (goal: p95 <= 10 s).
"""

from __future__ import annotations

import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

import psycopg

from bench.common import (
    Figure,
    Probes,
    env_int,
    lake_settings,
    loader_env,
    record,
    scratch_database,
    scratch_dir,
    stop_follower,
)


def _pgbench() -> str:
    found = shutil.which("pgbench") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))), None)
    if not found:
        raise RuntimeError("pgbench not found (Debian: postgresql-15)")
    return found


def _env(settings: object, interval: float) -> dict[str, str]:
    return loader_env(
        settings,  # type: ignore[arg-type]
        LOADER_SPARK__SHUFFLE_PARTITIONS="2",
        LOADER_FOLLOW__INTERVAL_S=str(interval),
        LOADER_FOLLOW__CAPTURE_INTERVAL_S=str(min(interval, 1.0)),
    )


def run() -> None:

    rate = env_int("BENCH_PGBENCH_RATE", 100)
    seconds = env_int("BENCH_FRESHNESS_SECONDS", 90)
    interval = float(os.environ.get("BENCH_FOLLOW_INTERVAL", "1"))
    with (
        scratch_database("bench_fresh_src") as src,
        scratch_database("bench_fresh_cat") as cat,
        scratch_dir("bench-fresh-") as root,
    ):
        settings = lake_settings(root, cat, source_dsn=src)
        subprocess.run([_pgbench(), "-i", "-q", "-s", "1", src], check=True, capture_output=True)
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (id int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())")
        env = _env(settings, interval)
        cli = [sys.executable, "-m", "loader.cli"]
        subprocess.run([*cli, "capture", "--snapshot"], env=env, check=True, capture_output=True)
        log = open(root / "follow.log", "w")  # noqa: SIM115 - closed below
        follower = subprocess.Popen([*cli, "run", "--follow"], env=env, stdout=log, stderr=subprocess.STDOUT)
        probes = Probes(settings)

        try:
            with psycopg.connect(src, autocommit=True) as conn:
                conn.execute("INSERT INTO probe (id) VALUES (0)")
                deadline = time.monotonic() + 600
                while 0 not in probes.seen(0):
                    if follower.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"follow mode did not start: see {root / 'follow.log'}")
                    time.sleep(0.5)
                bench = subprocess.Popen(
                    [_pgbench(), "-n", "-c", "2", "-j", "2", "-R", str(rate), "-T", str(seconds), src],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                probe, next_probe = 0, time.monotonic()
                started = time.monotonic()
                while time.monotonic() - started < seconds or probes.waiting():
                    now = time.monotonic()
                    if now >= next_probe and now - started < seconds:
                        probe += 1
                        probes.insert(conn, probe)
                        next_probe += 1.0
                    probes.check()
                    if time.monotonic() - started > seconds + 300:
                        raise RuntimeError("probes not visible 300 s after the load ended")
                    time.sleep(0.2)
                out, _ = bench.communicate(timeout=120)
        finally:
            stop_follower(follower, log)
        tps = next((line for line in out.splitlines() if line.startswith("tps")), "tps ?")
        values = sorted(probes.latency.values())
        p95 = statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]
        p50 = statistics.median(values)
        print(f"  pgbench -R {rate}: {tps.strip()}; {len(values)} probes; latency median {p50:.1f}s p95 {p95:.1f}s")
        record(
            Figure(
                "P4",
                f"follow freshness p95, pgbench -R {rate}, interval {interval:g}s",
                p95,
                "s",
                goal="<= 10 s",
                met=p95 <= 10,
                extra={"median_s": p50, "probes": len(values), "pgbench": tps.strip()},
            )
        )


if __name__ == "__main__":
    run()
