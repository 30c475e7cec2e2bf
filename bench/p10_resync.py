"""P10 resync of a big table while follow mode keeps another table fresh.

A source database initialised by ``pgbench -i -s BENCH_RESYNC_SCALE`` (default 100: 10M rows of
``pgbench_accounts``) plus a ``probe`` table, brought into the lake by ``capture --snapshot``,
``load`` and ``merge`` (commands); then ``loader run --follow`` (interval 1 s, its own process and
JVM) while ``pgbench -R BENCH_PGBENCH_RATE`` writes (2 clients, every pgbench table, accounts
included) and a probe row is inserted every second, as in P4. After ``BENCH_RESYNC_BASELINE_S``
seconds, ``loader resync --table public.pgbench_accounts`` runs as a command beside the follower (it
takes the slot's capture lock between two of the follower's captures; the follower's capture
waits meanwhile). Measured: the resync command's wall time and peak RSS; until the resynced
table's current state is the snapshot's again (the follower's merge after the resync: the current
table's ``merged-through`` past the resync's position); the follower's peak RSS over the run; the
probe table's freshness (commit -> visible in its current table through pyiceberg) before the
resync and while it ran. No ceiling: the figure is the other table's worst latency during the
resync, against its median before it (ratio: that median over the worst, 1 when nothing stalls).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
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
from bench.p4_freshness import _pgbench
from bench.p8_snapshot import _descendants, _stage


def run() -> None:
    from loader.lake.tables import SourceTable

    scale = env_int("BENCH_RESYNC_SCALE", 100)
    rate = env_int("BENCH_PGBENCH_RATE", 50)
    baseline_s = env_int("BENCH_RESYNC_BASELINE_S", 30)
    after_s = env_int("BENCH_RESYNC_AFTER_S", 30)
    rows = 100_000 * scale
    with (
        scratch_database("bench_resync_src") as src,
        scratch_database("bench_resync_cat") as cat,
        scratch_dir("bench-resync-") as root,
    ):
        settings = lake_settings(root, cat, source_dsn=src)
        started = time.perf_counter()
        subprocess.run([_pgbench(), "-i", "-q", "-s", str(scale), src], check=True, capture_output=True)
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (id int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())")
            conn.execute("INSERT INTO probe (id) VALUES (0)")
        print(f"  pgbench -i -s {scale}: {rows:,} accounts in {time.perf_counter() - started:.0f}s", flush=True)
        env = loader_env(
            settings,
            LOADER_SOURCE__INCLUDE='["public.pgbench_*", "public.probe"]',
            LOADER_FOLLOW__INTERVAL_S="1",
            LOADER_FOLLOW__CAPTURE_INTERVAL_S="1",
            LOADER_SPARK__DRIVER_MEMORY=os.environ.get("BENCH_RESYNC_DRIVER_MEMORY", "2g"),
        )
        for name, args in (("capture --snapshot", ["capture", "--snapshot"]), ("load", ["load"]), ("merge", ["merge"])):
            _stage(name, args, env, 1.0)
        probes = Probes(settings)
        catalog = probes.catalog
        accounts_id = (settings.catalog.current_namespace, SourceTable("public", "pgbench_accounts").iceberg_name)

        def accounts_snapshot() -> int | None:  # the current table's snapshot before the resync
            snap = catalog.load_table(accounts_id).current_snapshot()
            return snap.snapshot_id if snap else None

        log = open(root / "follow.log", "w")  # noqa: SIM115 - closed below
        follower = subprocess.Popen(
            [sys.executable, "-m", "loader.cli", "run", "--follow"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], sum(r for _, r in _descendants(follower.pid).values()))
                sampling.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        resync: dict[str, float] = {}
        try:
            with psycopg.connect(src, autocommit=True) as conn:
                probe, next_probe, bench = 0, time.monotonic(), None
                t0 = time.monotonic()
                resync_proc: threading.Thread | None = None
                stage_box: list[object] = []
                accounts_before: int | None = None

                def run_resync() -> None:
                    stage_box.append(_stage("resync", ["resync", "--table", "public.pgbench_accounts"], env, 0.5))

                while True:
                    now = time.monotonic()
                    if bench is None and 0 in probes.seen(0):
                        bench = subprocess.Popen(
                            [_pgbench(), "-n", "-c", "2", "-j", "2", "-R", str(rate), "-T", "3600", src],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        t0 = now
                    if follower.poll() is not None:
                        raise RuntimeError(f"the follower stopped: see {root / 'follow.log'}")
                    probing = "merged" not in resync or now - resync["merged"] <= after_s
                    if bench is not None and probing and now >= next_probe:
                        probe += 1
                        probes.insert(conn, probe)
                        next_probe = max(next_probe + 1.0, now)
                    if bench is not None and resync_proc is None and now - t0 >= baseline_s:
                        accounts_before = accounts_snapshot()
                        resync["start"] = time.monotonic()
                        resync_proc = threading.Thread(target=run_resync, daemon=True)
                        resync_proc.start()
                    if resync_proc is not None and "end" not in resync and not resync_proc.is_alive():
                        resync["end"] = time.monotonic()
                    if "end" in resync and "merged" not in resync and _rebuilt(catalog, accounts_id, accounts_before):
                        resync["merged"] = time.monotonic()
                    if not probes.check() and not probing:
                        break
                    if bench is not None and time.monotonic() - t0 > 3000:
                        raise RuntimeError(f"the resync did not finish in 3000 s: see {root / 'follow.log'}")
                    time.sleep(0.2)
                if bench is not None:
                    bench.terminate()
                    bench.wait(timeout=60)
        finally:
            sampling.set()
            stop_follower(follower, log)
        stage = stage_box[0]
        latency, committed = probes.latency, probes.committed
        before = [latency[p] for p in latency if committed[p] < resync["start"]]
        during = [latency[p] for p in latency if resync["start"] <= committed[p] <= resync["merged"]]
        after = [latency[p] for p in latency if committed[p] > resync["merged"]]
        copy_s = resync["end"] - resync["start"]
        total_s = resync["merged"] - resync["start"]
        print(
            f"  resync of {rows:,} rows: command {copy_s:.1f}s (peak RSS {stage.peak_rss_mb:,.0f} MB), current table"  # type: ignore[attr-defined]
            f" rebuilt {total_s:.1f}s after it started; follower peak RSS {peak[0] / 2**20:,.0f} MB",
            flush=True,
        )
        print(
            f"  probe freshness: before median {statistics.median(before):.1f}s max {max(before):.1f}s;"
            f" during the resync median {statistics.median(during):.1f}s max {max(during):.1f}s;"
            f" after median {statistics.median(after):.1f}s",
            flush=True,
        )
        record(
            Figure(
                "P10",
                f"resync of {rows / 1e6:g}M rows beside follow mode: worst freshness of another table (s)",
                max(during),
                "s",
                statistics.median(before),
                "the same table's median freshness before the resync",
                statistics.median(before) / max(during),
                "printed (no goal yet)",
                None,
                extra={
                    "resync_command_s": round(copy_s, 1),
                    "resync_to_current_s": round(total_s, 1),
                    "resync_peak_rss_mb": round(stage.peak_rss_mb),  # type: ignore[attr-defined]
                    "follower_peak_rss_mb": round(peak[0] / 2**20),
                    "during_median_s": round(statistics.median(during), 1),
                    "after_median_s": round(statistics.median(after), 1) if after else None,
                },
            )
        )


def _rebuilt(catalog: object, ident: tuple[str, str], since: int | None) -> bool:
    """Whether a commit after snapshot ``since`` replaced every data file of the table (the merge's
    bulk build of a resync: one overwrite, every data file new)."""
    table = catalog.load_table(ident)  # type: ignore[attr-defined]
    after = False
    for snap in table.snapshots():
        if snap.snapshot_id == since:
            after = True
            continue
        summary = snap.summary
        if not after or summary is None or summary.operation.value != "overwrite":
            continue
        props = summary.additional_properties
        if props.get("total-data-files") == props.get("added-data-files"):
            return True
    return False


if __name__ == "__main__":
    run()
