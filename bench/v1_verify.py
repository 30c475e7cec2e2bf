"""V1 ``loader verify`` of a large table while pgbench writes to it.

``pgbench -i -s BENCH_VERIFY_SCALE`` (default 100: 10M rows in pgbench_accounts) is loaded into a
fresh lake (``capture --snapshot``, ``load``, ``merge`` as commands); then pgbench's simple-update
workload writes to the table (``BENCH_VERIFY_CLIENTS`` clients, default 1) while ``loader verify
--json`` runs as its own process, ``BENCH_VERIFY_REPEATS`` times (default 1). Printed: rows/s
(median), the process's peak RSS and CPU seconds, the differences it reported (goal 0: every
difference under writes is lag, which verify must count as in flight), and the ceiling measured in
the same run: ``COPY pgbench_accounts TO STDOUT`` to a client.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from bench.common import Figure, env_int, lake_settings, loader_env, record, scratch_database, scratch_dir


def _env(settings: object) -> dict[str, str]:
    return loader_env(
        settings,  # type: ignore[arg-type]
        LOADER_SOURCE__INCLUDE='["public.pgbench_accounts"]',
        LOADER_SPARK__SHUFFLE_PARTITIONS="4",
        LOADER_SPARK__DRIVER_MEMORY="2g",
    )


def _run_measured(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``cmd`` to the end; its output and its own rusage (CPU, peak RSS), not every child's."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: dict[str, str] = {}

    def drain(name: str, stream: Any) -> None:
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, st)) for n, st in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(cmd, proc.returncode, out["out"], out["err"]), usage


def _copy_ceiling(dsn: str) -> float:
    """rows/s of ``COPY pgbench_accounts TO STDOUT`` to this client."""
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        rows = 0
        with conn.cursor().copy("COPY pgbench_accounts TO STDOUT") as copy:
            for chunk in copy:
                rows += bytes(chunk).count(b"\n")
        return rows / (time.perf_counter() - started)


def run() -> None:
    scale = env_int("BENCH_VERIFY_SCALE", 100)
    repeats = env_int("BENCH_VERIFY_REPEATS", 1)
    clients = env_int("BENCH_VERIFY_CLIENTS", 1)
    with (
        scratch_database("bench_verify_src") as src,
        scratch_database("bench_verify_cat") as cat,
        scratch_dir("bench-verify-") as root,
    ):
        subprocess.run(["pgbench", "-i", "-q", "-s", str(scale), src], check=True, capture_output=True)
        settings = lake_settings(root, cat, source_dsn=src)
        env = _env(settings)
        cli = [sys.executable, "-m", "loader.cli"]
        started = time.monotonic()
        for step in (["capture", "--snapshot"], ["load"], ["merge"]):
            subprocess.run([*cli, *step], env=env, check=True, capture_output=True)
        print(f"  lake built from pgbench scale {scale} in {time.monotonic() - started:.0f}s", flush=True)
        ceiling = _copy_ceiling(src)
        writer = subprocess.Popen(
            ["pgbench", "-n", "-b", "simple-update", "-c", str(clients), "-T", "100000", src],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        rates, cpu, reports = [], [], []
        verify_rss: list[float] = []
        try:
            time.sleep(5)  # writes under way before the first cut
            for _ in range(repeats):
                t0 = time.perf_counter()
                done, usage = _run_measured([*cli, "verify", "--json", "--table", "public.pgbench_accounts"], env)
                elapsed = time.perf_counter() - t0
                verify_rss.append(usage.ru_maxrss / 1024)  # verify's own peak (it starts no JVM)
                if done.returncode not in (0, 4):
                    raise RuntimeError(f"verify failed ({done.returncode}): {done.stderr[-2000:]}")
                doc = json.loads(done.stdout)
                reports.append(doc)
                rates.append(doc["rows"] / elapsed)
                cpu.append(usage.ru_utime + usage.ru_stime)
                t = doc["tables"][0]
                print(
                    f"  verify: {doc['rows']:,} rows in {elapsed:.1f}s, missing={t['missing']} extra={t['extra']} "
                    f"different={t['different']} in flight={t['in_flight']} buckets differing={t['buckets_differing']}",
                    flush=True,
                )
        finally:
            writer.terminate()
            writer.wait(timeout=60)
        peak_mb = max(verify_rss)
        rate = statistics.median(rates)
        rows = reports[-1]["rows"]
        differences = sum(t["missing"] + t["extra"] + t["different"] for r in reports for t in r["tables"])
        seconds_for_10m = 10_000_000 / rate
        record(
            Figure(
                "V1",
                f"verify of {rows / 1e6:.0f}M rows while pgbench writes ({clients} client)",
                rate,
                "rows/s",
                rival=ceiling,
                rival_what="COPY of the table to a client",
                ratio=rate / ceiling,
                goal="10M rows <= 60 s, peak RSS <= 1 GB, 0 differences",
                met=seconds_for_10m <= 60 and peak_mb <= 1024 and differences == 0,
                extra={
                    "seconds_per_10m_rows": seconds_for_10m,
                    "peak_rss_mb": peak_mb,
                    "cpu_seconds_median": statistics.median(cpu),
                    "rows_per_cpu_s": rows / statistics.median(cpu),
                    "differences": differences,
                    "in_flight": [t["in_flight"] for r in reports for t in r["tables"]],
                },
            )
        )
        print(f"  verify's peak RSS {peak_mb:.0f} MB; CPU {statistics.median(cpu):.1f}s per verify")


if __name__ == "__main__":
    run()
