"""P2 load throughput vs pyarrow's Parquet write: in steady state (one process, Spark session
started) and as a whole ``loader load`` command (a new process, as cron runs it).

Lands ``BENCH_LOAD_CHANGES`` synthetic changes of a six-column keyed table (transactions of 10,000
rows, 70% inserts, 30% updates, landing files of the configured size), then times one whole
``HistoryLoad.run()`` over them: reading and checking the landing files, typing, the Iceberg
append and the ledger commit (on the driver for such batches; the Spark path otherwise).
Repeated ``BENCH_REPEATS`` times on fresh batches (median), CPU seconds of the process and its JVM
beside. A warm-up load creates the tables first. Then another batch as a whole command: wall time,
CPU of its process tree, peak RSS.

The ceiling: the very rows that load wrote (read back from history as Arrow), written by pyarrow to
one zstd Parquet file in this process: the cost of the output alone, no decoding, no checks.

The changes land in the default format (landing v3, each table's changes in columns). Then the
same steady state with the changes landed as landing v2 (``source.stream_format = "arrow"``: one
stream of records per file), against the same ceiling: what v3 bought.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bench.common import (
    SERIES,
    Figure,
    env_int,
    lake_settings,
    loader_env,
    median_time,
    record,
    scratch_database,
    scratch_dir,
    write_landing,
)

if TYPE_CHECKING:
    from loader.config import LoaderSettings


def _changes(first_key: int, n: int) -> Iterator[tuple[str, str, int]]:
    for i in range(n):
        if i % 10 < 7:
            yield "I", "accounts", first_key + i
        else:
            yield "U", "accounts", first_key + i // 2


def run() -> None:
    import pyarrow.parquet as pq
    from pyiceberg.expressions import GreaterThanOrEqual

    from bench.p8_snapshot import _stage
    from loader.lake.catalog import open_catalog
    from loader.lake.tables import SourceTable
    from loader.load.history import HistoryLoad
    from loader.spark import get_spark

    n = env_int("BENCH_LOAD_CHANGES", 1_000_000)
    repeats = env_int("BENCH_REPEATS", 3)
    with scratch_database("bench_load") as catalog_dsn, scratch_dir("bench-load-") as root:
        settings = lake_settings(root, catalog_dsn)
        spark = get_spark(settings, "bench-load")
        _, lsn = write_landing(settings, _changes(0, 10_000), 10_000, 1_000)
        HistoryLoad(spark, settings).run()  # warm-up: tables created, JVM code paths hot
        times, cpus, key = [], [], 10_000
        for _ in range(repeats):
            first_lsn = lsn
            t = time.perf_counter()
            landed, lsn = write_landing(settings, _changes(key, n), 10_000, lsn)
            land_s = time.perf_counter() - t
            key += n
            started, cpu0 = time.perf_counter(), _cpu_s()
            res = HistoryLoad(spark, settings).run()
            times.append(time.perf_counter() - started)
            cpus.append(_cpu_s() - cpu0)
            loaded = sum(res.rows_per_table.values())
            assert loaded == landed, (loaded, landed)
            print(
                f"  load of {landed:,} changes in {len(res.files)} files: {times[-1]:.1f}s, {cpus[-1]:.1f} CPU-s"
                f" (landing {land_s:.1f}s)"
            )
            print(f"  engines: {'; '.join(res.engines)}")
        t_load = statistics.median(times)
        ident = (settings.catalog.history_namespace, SourceTable("public", "accounts").iceberg_name)
        hist = open_catalog(settings).load_table(ident)
        rows = hist.scan(row_filter=GreaterThanOrEqual("pg_lsn", first_lsn)).to_arrow()
        assert rows.num_rows == n, rows.num_rows
        out = root / "ceiling.parquet"
        t_pq = median_time(lambda: pq.write_table(rows, out, compression="zstd"), repeats)
        ours, ceiling = n / t_load, n / t_pq
        per_cpu = n / statistics.median(cpus)
        print(f"  steady state: {per_cpu:,.0f} changes per CPU-second (this process and its JVM)")
        # The same changes landed as landing v2 (one stream of records per file), same process.
        v2 = settings.model_copy(update={"source": settings.source.model_copy(update={"stream_format": "arrow"})})
        v2_times, v2_cpus = [], []
        for _ in range(repeats):
            landed, lsn = write_landing(v2, _changes(key, n), 10_000, lsn)
            key += n
            started, cpu0 = time.perf_counter(), _cpu_s()
            res = HistoryLoad(spark, v2).run()
            v2_times.append(time.perf_counter() - started)
            v2_cpus.append(_cpu_s() - cpu0)
            assert sum(res.rows_per_table.values()) == landed
            print(
                f"  v2: load of {landed:,} changes in {len(res.files)} files: {v2_times[-1]:.1f}s, {v2_cpus[-1]:.1f} CPU-s"
            )
        v2_rate = n / statistics.median(v2_times)
        record(
            Figure(
                "P2",
                f"load {n / 1e6:g}M changes landed as landing v2 (source.stream_format = arrow), steady state (changes/s)",
                v2_rate,
                "rows/s",
                ceiling,
                "pyarrow write_table zstd Parquet of the same rows",
                v2_rate / ceiling,
                "printed",
                None,
                extra={"changes_per_cpu_s": n / statistics.median(v2_cpus)},
            )
        )
        spark_rate, spark_per_cpu, spark_n, lsn = _spark_path(spark, settings, min(n, SPARK_PATH_CHANGES), key, lsn)
        key += spark_n + 10_000  # and the Spark path's warm-up
        # The whole command, as cron runs it: a new process, its start and everything it needs.
        landed, lsn = write_landing(settings, _changes(key, n), 10_000, lsn)
        whole = _stage("loader load (whole command)", ["load"], loader_env(settings), 0.5)
        whole_rate = landed / whole.wall_s
        print(f"  whole command: {whole_rate:,.0f} changes/s, {landed / whole.cpu_s:,.0f} changes per CPU-second")
        SERIES.setdefault("stage_throughput", {})["load"] = {"measured": ours, "ceiling": ceiling}
        record(
            Figure(
                "P2",
                f"load {n / 1e6:g}M changes, steady state (changes/s)",
                ours,
                "rows/s",
                ceiling,
                "pyarrow write_table zstd Parquet of the same rows",
                ours / ceiling,
                ">= 0.5",
                ours / ceiling >= 0.5,
                extra={"changes_per_cpu_s": per_cpu},
            )
        )
        record(
            Figure(
                "P2",
                f"load {spark_n / 1e3:g}k changes through Spark's executors (the cluster scheduler: the same"
                " kernel by mapInArrow; load.driver_max_bytes = 0), steady state (changes/s)",
                spark_rate,
                "rows/s",
                ceiling,
                "pyarrow write_table zstd Parquet of the same kind of rows",
                spark_rate / ceiling,
                "printed (no goal: on a cluster it scales with executors)",
                None,
                extra={"changes_per_cpu_s": spark_per_cpu},
            )
        )
        record(
            Figure(
                "P2",
                f"`loader load` of {n / 1e6:g}M changes, whole command (start included; changes/s)",
                whole_rate,
                "rows/s",
                ceiling,
                "pyarrow write_table zstd Parquet of the same rows",
                whole_rate / ceiling,
                ">= 200,000 changes/s",
                whole_rate >= 200_000,
                extra={"changes_per_cpu_s": landed / whole.cpu_s, "peak_rss_mb": whole.peak_rss_mb},
            )
        )


# Changes the Spark-path figure loads (at most): its rate is about a tenth of the driver's.
SPARK_PATH_CHANGES = 200_000


def _spark_path(spark: Any, settings: LoaderSettings, n: int, key: int, lsn: int) -> tuple[float, float, int, int]:
    """A batch of ``n`` changes loaded through Spark's executors (``load.driver_max_bytes = 0``),
    as the cluster scheduler loads every batch: (changes/s, changes per CPU-second of this process
    and its JVM, changes, the next LSN)."""
    from loader.config import LoadSettings
    from loader.load.history import HistoryLoad

    spark_only = settings.model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    # Warm-up: the executors' Python workers started and the kernel's modules imported, as in a
    # long-running cluster (the driver path's warm-up above did not touch them).
    _, lsn = write_landing(spark_only, _changes(key, 10_000), 10_000, lsn)
    HistoryLoad(spark, spark_only).run()
    landed, next_lsn = write_landing(spark_only, _changes(key + 10_000, n), 10_000, lsn)
    started, cpu0 = time.perf_counter(), _cpu_s()
    res = HistoryLoad(spark, spark_only).run()
    wall, cpu = time.perf_counter() - started, _cpu_s() - cpu0
    assert sum(res.rows_per_table.values()) == landed and all(e.startswith("spark") for e in res.engines), res.engines
    print(f"  Spark path: {landed:,} changes in {wall:.1f}s, {cpu:.1f} CPU-s ({'; '.join(res.engines)})")
    return landed / wall, landed / cpu, landed, next_lsn


def _cpu_s() -> float:
    """CPU seconds of this process and its children alive now (the JVM Spark runs in)."""
    import os

    from bench.p8_snapshot import _descendants

    return sum(c for c, _ in _descendants(os.getpid()).values())


if __name__ == "__main__":
    run()
