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
import signal
import statistics
import subprocess
import sys
import time

import psycopg

from bench.common import Figure, env_int, lake_settings, loader_env, record, scratch_database, scratch_dir


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
    from loader.lake.catalog import open_catalog
    from loader.lake.tables import SourceTable

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
        catalog = open_catalog(settings)
        ident = (settings.catalog.current_namespace, SourceTable("public", "probe").iceberg_name)

        last_scan: dict[str, object] = {}

        def seen_ids(low: int) -> set[int]:
            try:
                t = catalog.load_table(ident)
            except Exception:  # not created yet
                return set()
            # A row becomes visible only with a new snapshot: scan only when there is one (the
            # prober's own CPU would otherwise compete with the follower on 2 cores).
            snap = t.current_snapshot()
            key = (snap.snapshot_id if snap else None, low)
            if last_scan.get("key") == key:
                return last_scan["ids"]  # type: ignore[return-value]
            got = t.scan(row_filter=f"id >= {low}", selected_fields=("id",)).to_arrow()
            last_scan.update(key=key, ids=set(got["id"].to_pylist()))
            return last_scan["ids"]  # type: ignore[return-value]

        try:
            with psycopg.connect(src, autocommit=True) as conn:
                conn.execute("INSERT INTO probe (id) VALUES (0)")
                deadline = time.monotonic() + 600
                while 0 not in seen_ids(0):
                    if follower.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"follow mode did not start: see {root / 'follow.log'}")
                    time.sleep(0.5)
                bench = subprocess.Popen(
                    [_pgbench(), "-n", "-c", "2", "-j", "2", "-R", str(rate), "-T", str(seconds), src],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                committed: dict[int, float] = {}
                latency: dict[int, float] = {}
                probe, next_probe = 0, time.monotonic()
                started = time.monotonic()
                while time.monotonic() - started < seconds or (committed.keys() - latency.keys()):
                    now = time.monotonic()
                    if now >= next_probe and now - started < seconds:
                        probe += 1
                        conn.execute("INSERT INTO probe (id) VALUES (%s)", (probe,))
                        committed[probe] = time.monotonic()
                        next_probe += 1.0
                    waiting = sorted(committed.keys() - latency.keys())
                    if waiting:
                        seen = seen_ids(waiting[0])
                        at = time.monotonic()
                        for p in waiting:
                            if p in seen:
                                latency[p] = at - committed[p]
                    if time.monotonic() - started > seconds + 300:
                        raise RuntimeError("probes not visible 300 s after the load ended")
                    time.sleep(0.2)
                out, _ = bench.communicate(timeout=120)
        finally:
            follower.send_signal(signal.SIGTERM)
            try:
                follower.wait(timeout=300)
            except subprocess.TimeoutExpired:
                follower.kill()
            log.close()
        tps = next((line for line in out.splitlines() if line.startswith("tps")), "tps ?")
        values = sorted(latency.values())
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
