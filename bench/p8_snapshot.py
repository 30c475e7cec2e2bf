"""P8 initial snapshot of ``pgbench -i -s S`` through whole ``loader`` commands vs the COPY ceiling.

A source database initialised by ``pgbench -i -s BENCH_SNAPSHOT_SCALE`` (default 100: 10M rows of
``pgbench_accounts``; ``BENCH_SNAPSHOT_SCALE=10`` for a quick run), captured with
``source.include = ["public.pgbench_*"]`` by three commands, each its own process, as a scheduler
runs them: ``loader capture --snapshot`` (creates the slot and lands the snapshot), ``loader load``,
``loader merge``; after them history and current tables are queryable (their row counts are read
from the Iceberg metadata and checked). Per stage: wall seconds, CPU seconds (the command's own
rusage plus the last sampled CPU time of its descendants: PySpark does not wait for its JVM, so the
JVM's time never reaches a rusage), rows/s of ``pgbench_accounts`` and the peak RSS of the process
tree (sampled every ``BENCH_SNAPSHOT_SAMPLE_S``, default 0.2 s).

``BENCH_SNAPSHOT_MERGE_REPEATS`` (default 1) times the merge again that many times more on fresh
current tables (dropped between runs; the table's first current state is the snapshot's case) and
reports the median. The ceiling, measured in the same run: ``COPY pgbench_accounts TO STDOUT`` to a
client that discards the bytes (rows/s, median of 3); the ratio is the end-to-end rows/s (capture +
load + merge wall time) over it, goal >= 0.25.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.common import SERIES, Figure, env_int, lake_settings, loader_env, record, scratch_database, scratch_dir

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Stage:
    name: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    output: str


def _env(settings: object) -> dict[str, str]:
    return loader_env(
        settings,  # type: ignore[arg-type]
        LOADER_SOURCE__INCLUDE='["public.pgbench_*"]',
        LOADER_SPARK__SHUFFLE_PARTITIONS=str(settings.spark.shuffle_partitions),  # type: ignore[attr-defined]
        LOADER_SPARK__DRIVER_MEMORY=os.environ.get("BENCH_SNAPSHOT_DRIVER_MEMORY", "4g"),
    )


def _proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[21]) * PAGE


def _descendants(root: int) -> dict[int, tuple[float, int]]:
    """CPU seconds and RSS bytes of ``root`` and every process below it."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None:
                stats[int(name)] = st
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = (stats[pid][1], stats[pid][2])
            todo.extend(p for p, st in stats.items() if st[0] == pid)
    return out


# Runs a command as a child of this small process and writes the child's own peak RSS (KiB) to the
# file named first. Linux's ru_maxrss of a process counts the memory of the process it was spawned
# from (vfork or fork, then exec: the old address space's high-water mark is kept), so a command
# spawned straight from a benchmark holding a million rows read as the benchmark's size.
_PEAK_RSS = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "with open(sys.argv[1], 'w') as f:\n"
    "    f.write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status) % 256)\n"
)


def _stage(name: str, args: list[str], env: dict[str, str], sample_s: float) -> Stage:
    """Run ``loader <args>`` to the end, sampling its process tree; raise if it fails. Its peak
    RSS is its own (``_PEAK_RSS``) or the sampled tree's, whichever is higher."""
    import tempfile

    started = time.perf_counter()
    peak_file = Path(tempfile.mkstemp(prefix="bench-peak-")[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", _PEAK_RSS, str(peak_file), sys.executable, "-m", "loader.cli", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cpu: dict[int, float] = {}  # last seen CPU seconds of each descendant
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            tree = _descendants(proc.pid)
            for pid, (c, _) in tree.items():
                st = _proc_stat(pid)
                # The wrapper and the command are counted by wait4 (the command is waited for).
                if pid != proc.pid and st is not None and st[0] != proc.pid:
                    cpu[pid] = c
            peak[0] = max(peak[0], sum(r for _, r in tree.values()))
            done.wait(sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"loader {' '.join(args)} failed (exit {proc.returncode}):\n{output}")
    own = usage.ru_utime + usage.ru_stime  # the wrapper's and (waited for) the command's
    own_peak_kib = int(peak_file.read_text() or 0)
    peak_file.unlink()
    peak_mb = max(peak[0] / 2**20, own_peak_kib / 1024)
    stage = Stage(name, wall, own + sum(cpu.values()), peak_mb, output)
    print(f"  {name}: {wall:.1f}s wall, {stage.cpu_s:.1f}s CPU, peak RSS {peak_mb:,.0f} MB", flush=True)
    return stage


def stage_report(stages: list[Stage], n: int, unit: str) -> dict[str, dict[str, float]]:
    """One line per stage (wall, CPU, ``unit``/s over ``n``, peak RSS), and the same as figures."""
    width = max(len(s.name) for s in stages)
    for s in stages:
        print(
            f"  {s.name:<{width}} {s.wall_s:8.1f} s wall {s.cpu_s:8.1f} s CPU {n / s.wall_s:12,.0f} {unit}/s"
            f" {s.peak_rss_mb:8,.0f} MB peak RSS",
            flush=True,
        )
    return {
        s.name: {
            "wall_s": round(s.wall_s, 2),
            "cpu_s": round(s.cpu_s, 2),
            f"{unit}_per_s": round(n / s.wall_s),
            "peak_rss_mb": round(s.peak_rss_mb),
        }
        for s in stages
    }


def _ceiling(dsn: str, rows: int, repeats: int = 3) -> float:
    """rows/s of ``COPY pgbench_accounts TO STDOUT`` read by a client that keeps nothing."""
    times = []
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for _ in range(repeats):
            started = time.perf_counter()
            with cur.copy("COPY pgbench_accounts TO STDOUT") as copy:
                for _block in copy:
                    pass
            times.append(time.perf_counter() - started)
    return rows / statistics.median(times)


def _counts(settings: object, table: str) -> tuple[int, int]:
    """(history rows, current rows) of ``public.<table>`` from the tables' Iceberg metadata."""
    from loader.lake.catalog import open_catalog
    from loader.lake.tables import SourceTable

    catalog = open_catalog(settings)  # type: ignore[arg-type]
    name = SourceTable("public", table).iceberg_name
    out = []
    for ns in (settings.catalog.history_namespace, settings.catalog.current_namespace):  # type: ignore[attr-defined]
        summary = catalog.load_table((ns, name)).current_snapshot().summary
        out.append(int(summary["total-records"]) - int(summary.get("total-position-deletes", "0")))
    return out[0], out[1]


def _drop_current(settings: object) -> None:
    from loader.lake.catalog import open_catalog

    catalog = open_catalog(settings)  # type: ignore[arg-type]
    ns = settings.catalog.current_namespace  # type: ignore[attr-defined]
    for ident in catalog.list_tables(ns):
        catalog.drop_table(ident)


def run() -> None:
    scale = env_int("BENCH_SNAPSHOT_SCALE", 100)
    repeats = env_int("BENCH_SNAPSHOT_MERGE_REPEATS", 1)
    sample_s = float(os.environ.get("BENCH_SNAPSHOT_SAMPLE_S", "0.2"))
    rows = 100_000 * scale
    with (
        scratch_database("bench_snap") as source_dsn,
        scratch_database("bench_snapcat") as catalog_dsn,
        scratch_dir("bench-snap-") as root,
    ):
        started = time.perf_counter()
        subprocess.run(["pgbench", "-i", "-q", "-s", str(scale), source_dsn], check=True, capture_output=True)
        print(f"  pgbench -i -s {scale}: {rows:,} accounts in {time.perf_counter() - started:.0f}s", flush=True)
        ceiling = _ceiling(source_dsn, rows)
        print(f"  ceiling: COPY pgbench_accounts TO STDOUT {ceiling:,.0f} rows/s", flush=True)
        settings = lake_settings(root, catalog_dsn, source_dsn)
        env = _env(settings)
        stages = [
            _stage("capture --snapshot", ["capture", "--snapshot"], env, sample_s),
            _stage("load", ["load"], env, sample_s),
            _stage("merge", ["merge"], env, sample_s),
        ]
        merge_line = next((ln for ln in stages[2].output.splitlines() if ln.startswith("merge:")), "")
        print(f"  {merge_line}", flush=True)
        history, current = _counts(settings, "pgbench_accounts")
        assert current == rows, (current, rows)
        assert history == rows + 1, (history, rows)  # the rows and the resync marker
        merges = [stages[2].wall_s]
        for _ in range(repeats - 1):
            _drop_current(settings)
            merges.append(_stage("merge (again, fresh current tables)", ["merge"], env, sample_s).wall_s)
            assert _counts(settings, "pgbench_accounts")[1] == rows
        total = sum(s.wall_s for s in stages)
        ours = rows / total
        per_stage = stage_report(stages, rows, "rows")
        total_cpu = sum(s.cpu_s for s in stages)
        print(f"  CPU (commands and their JVMs) {total_cpu:.1f} s: {rows / total_cpu:,.0f} rows per CPU-second")
        if repeats > 1:
            print(f"  merge: median {statistics.median(merges):.1f}s of {[round(m, 1) for m in merges]}", flush=True)
        SERIES.setdefault("stage_throughput", {})["snapshot"] = {"measured": ours, "ceiling": ceiling}
        record(
            Figure(
                "P8",
                f"pgbench -s {scale} snapshot, capture+load+merge",
                ours,
                "rows/s",
                ceiling,
                "COPY pgbench_accounts TO STDOUT to a client",
                ours / ceiling,
                ">= 0.25",
                ours / ceiling >= 0.25,
                extra={
                    "scale": scale,
                    "stages": per_stage,
                    "total_wall_s": round(total, 2),
                    "total_cpu_s": round(sum(s.cpu_s for s in stages), 2),
                    "rows_per_cpu_s": round(rows / sum(s.cpu_s for s in stages)),
                    "merge_wall_s": [round(m, 2) for m in merges],
                    "merge_median_s": round(statistics.median(merges), 2),
                    "merge": merge_line,
                },
            )
        )


if __name__ == "__main__":
    run()
