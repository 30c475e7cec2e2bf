"""P2, per-table columns: the load of rows landed one table per file, a column per source column,
in steady state, against pyarrow's Parquet write of the same history rows.

What a load costs when capture hands it a table's values as columns (the layout landing v3 is to
give change files; see docs/performance-log.md, twenty-fourth round) rather than v2's records (every
value a string in a list of structs). The load reads one such format today: snapshot and resync
chunks (``loader.landing.arrowfile``). ``pgbench -i -s BENCH_COLUMNAR_SCALE`` (default 10: 1M rows of
``pgbench_accounts``) is captured by ``loader capture --snapshot`` and loaded once (warm-up: tables
created, modules imported); then ``BENCH_REPEATS`` times ``loader resync --table
public.pgbench_accounts`` lands the table again as chunks and ``HistoryLoad.run()`` is timed in this
process (median), with its CPU seconds. The ceiling: the rows that load wrote, read back from
history as Arrow, written by pyarrow to one zstd Parquet file. No goal: P2's goal is for change
files; this is where the load stands on the layout v3 would give them.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from bench.common import (
    Figure,
    env_int,
    lake_settings,
    loader_env,
    median_time,
    record,
    scratch_database,
    scratch_dir,
)
from bench.p4_freshness import _pgbench


def run() -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.expressions import GreaterThan

    from loader.lake.catalog import open_catalog
    from loader.lake.tables import SourceTable
    from loader.load.history import HistoryLoad

    scale = env_int("BENCH_COLUMNAR_SCALE", 10)
    repeats = env_int("BENCH_REPEATS", 3)
    rows = 100_000 * scale
    with (
        scratch_database("bench_col") as source_dsn,
        scratch_database("bench_colcat") as catalog_dsn,
        scratch_dir("bench-col-") as root,
    ):
        subprocess.run([_pgbench(), "-i", "-q", "-s", str(scale), source_dsn], check=True, capture_output=True)
        settings = lake_settings(root, catalog_dsn, source_dsn, source={"include": ["public.pgbench_*"]})
        env = loader_env(settings, LOADER_SOURCE__INCLUDE='["public.pgbench_*"]')

        def loader(*args: str) -> None:
            command = [sys.executable, "-m", "loader.cli", *args]  # as the other benchmarks run the CLI
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            assert done.returncode == 0, f"loader {' '.join(args)}: {done.stderr[-2000:]}"

        loader("capture", "--snapshot")
        HistoryLoad(None, settings).run()  # warm-up: tables created, modules imported
        ident = (settings.catalog.history_namespace, SourceTable("public", "pgbench_accounts").iceberg_name)
        times, cpus = [], []
        for _ in range(repeats):
            before = open_catalog(settings).load_table(ident)
            newest = pc.max(before.scan(selected_fields=("pg_lsn",)).to_arrow().column("pg_lsn")).as_py()
            after_lsn = -1 if newest is None else newest
            loader("resync", "--table", "public.pgbench_accounts")
            started, cpu0 = time.perf_counter(), time.process_time()
            res = HistoryLoad(None, settings).run()
            times.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu0)
            assert res.rows_per_table.get("public.pgbench_accounts", 0) >= rows, res.rows_per_table
            print(f"  load of {rows:,} rows in {len(res.files)} chunk files: {times[-1]:.2f}s, {cpus[-1]:.2f} CPU-s")
        hist = open_catalog(settings).load_table(ident)
        written = hist.scan(row_filter=GreaterThan("pg_lsn", after_lsn)).to_arrow()
        assert written.num_rows >= rows, written.num_rows
        out = root / "ceiling.parquet"
        t_pq = median_time(lambda: pq.write_table(written, out, compression="zstd"), repeats)
        ours, ceiling = rows / statistics.median(times), written.num_rows / t_pq
        per_cpu = rows / statistics.median(cpus)
        print(f"  {ours:,.0f} rows/s, {per_cpu:,.0f} rows per CPU-second; pyarrow's write {ceiling:,.0f} rows/s")
        record(
            Figure(
                "P2",
                f"load of {rows / 1e6:g}M rows landed as per-table columns (resync chunks of pgbench_accounts),"
                " steady state (rows/s)",
                ours,
                "rows/s",
                ceiling,
                "pyarrow write_table zstd Parquet of the same history rows",
                ours / ceiling,
                "printed (the layout landing v3 is to give change files)",
                None,
                extra={"rows_per_cpu_s": per_cpu},
            )
        )


if __name__ == "__main__":
    run()
