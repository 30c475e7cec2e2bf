"""P2 load throughput in steady state (one Spark session, JVM started) vs pyarrow's Parquet write.

Lands ``BENCH_LOAD_CHANGES`` synthetic changes of a six-column keyed table (transactions of 10,000
rows, 70% inserts, 30% updates, landing files of the configured size), then times one whole
``HistoryLoad.run()`` over them: decoding the landing files in executors, validation, exactly-once
dedupe, typing and the Iceberg append with the ledger commit. Repeated ``BENCH_REPEATS`` times on
fresh batches (median). A warm-up load creates the tables first.

The ceiling: the very rows that load wrote (read back from history as Arrow), written by pyarrow to
one zstd Parquet file in this process: the cost of the output alone, no decoding, no checks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

from bench.common import (
    SERIES,
    Figure,
    env_int,
    lake_settings,
    median_time,
    record,
    scratch_database,
    scratch_dir,
    write_landing,
)


def _changes(first_key: int, n: int) -> Iterator[tuple[str, str, int]]:
    for i in range(n):
        if i % 10 < 7:
            yield "I", "accounts", first_key + i
        else:
            yield "U", "accounts", first_key + i // 2


def run() -> None:
    import pyarrow.parquet as pq
    from pyiceberg.expressions import GreaterThanOrEqual

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
        times, key = [], 10_000
        for _ in range(repeats):
            first_lsn = lsn
            t = time.perf_counter()
            landed, lsn = write_landing(settings, _changes(key, n), 10_000, lsn)
            land_s = time.perf_counter() - t
            key += n
            started = time.perf_counter()
            res = HistoryLoad(spark, settings).run()
            times.append(time.perf_counter() - started)
            loaded = sum(res.rows_per_table.values())
            assert loaded == landed, (loaded, landed)
            print(f"  load of {landed:,} changes in {len(res.files)} files: {times[-1]:.1f}s (landing {land_s:.1f}s)")
            print(f"  engines: {'; '.join(res.engines)}")
        t_load = statistics.median(times)
        ident = (settings.catalog.history_namespace, SourceTable("public", "accounts").iceberg_name)
        hist = open_catalog(settings).load_table(ident)
        rows = hist.scan(row_filter=GreaterThanOrEqual("pg_lsn", first_lsn)).to_arrow()
        assert rows.num_rows == n, rows.num_rows
        out = root / "ceiling.parquet"
        t_pq = median_time(lambda: pq.write_table(rows, out, compression="zstd"), repeats)
        ours, ceiling = n / t_load, n / t_pq
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
            )
        )


if __name__ == "__main__":
    run()
