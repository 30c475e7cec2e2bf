"""P1 incremental MERGE vs full recompute, and P5 the same merge vs pyiceberg ``Table.upsert``.

For history tables of growing size (generated directly with Spark, one change per transaction,
about ten changes per key), it times
- incremental: ``CurrentMerge.merge_table`` of an increment of ``BENCH_INCREMENT`` changes
  (80% updates, 10% inserts, 10% deletes), reading only the increment from history and merging into
  the bucketed merge-on-read current table;
- full: ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY pg_lsn DESC)`` over the whole history,
  deletes removed (computed completely, written to Spark's no-op sink, so output cost is not counted),
  what the Simple design recomputed on every run;
and records the medians of ``BENCH_REPEATS`` runs and their ratio (goal: >= 20x at the largest
size, and the incremental time grows <= 1.5x from the smallest to the largest).

P5, at the smallest size: ``BENCH_REPEATS`` more increments, each merged by the loader and its
final rows applied to a copy of the current table by pyiceberg's ``Table.upsert`` (plus
``Table.delete`` for the deleted keys); medians of both. The rival is handed the already-resolved
final row of each key (it does no history work at all), so the comparison favours it. Both tables
are compared row for row after each round.

Sizes: ``BENCH_MERGE_SIZES=2000000,20000000`` (history rows), ``BENCH_INCREMENT=50000``.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from bench.common import SERIES, Figure, env_int, lake_settings, median_time, record, scratch_database, scratch_dir
from loader.lake.tables import SourceTable, TableNames
from loader.lsn import ChangePosition

COLUMNS = [("id", "bigint"), ("v", "bigint"), ("s", "text"), ("amount", "numeric(18,2)")]
TS0 = 1_704_067_200  # 2024-01-01


def _rows_sql(first: int, count: int, keys: int, new_keys_from: int, seed: int, base: bool) -> str:
    """Changes number first..first+count-1 (LSN 1000 + number): in the base, the first ``keys``
    insert every key and the rest update one; an increment updates (80%), inserts new keys (10%)
    and deletes (10%)."""
    if base:
        op = f"IF(i < {keys}, 'insert', 'update')"
        key = f"IF(i < {keys}, i, pmod(hash(i, {seed}), {keys}))"
    else:
        op = "CASE WHEN r < 0.8 THEN 'update' WHEN r < 0.9 THEN 'insert' ELSE 'delete' END"
        key = f"IF(r >= 0.8 AND r < 0.9, {new_keys_from} + i, pmod(hash(i, {seed}), {keys}))"
    return f"""
        SELECT IF(op = 'delete', NULL, k) AS id, IF(op = 'delete', NULL, k * 7 + i) AS v,
               IF(op = 'delete', NULL, concat('value-', i)) AS s,
               IF(op = 'delete', NULL, CAST((i % 100000) / 100.0 AS DECIMAL(18,2))) AS amount,
               1000 + i AS pg_lsn, CAST(1 AS BIGINT) AS pg_seq, i AS pg_txn_id, op AS pg_operation,
               timestamp_seconds({TS0} + i DIV 200) AS pg_txn_timestamp, 1000 + i AS pg_change_lsn,
               IF(op = 'insert', NULL, to_json(map('id', CAST(k AS STRING)))) AS pg_old_key,
               CAST(array() AS ARRAY<STRING>) AS pg_absent_columns, 'bench' AS pg_landing_file,
               CAST(NULL AS STRING) AS pg_note
        FROM (SELECT i, r, op, {key} AS k FROM (
            SELECT id AS i, r, {op} AS op FROM (SELECT id, rand({seed}) AS r FROM range({first}, {first + count}))))"""


def _append(spark: Any, ident: str, sql: str) -> None:
    spark.sql(sql).sortWithinPartitions("pg_lsn", "pg_seq").writeTo(ident).append()


def run() -> None:
    from loader.lake.commits import ensure_loader_tables
    from loader.load.history import HistoryLoad, LoadResult
    from loader.merge.current import CurrentMerge
    from loader.merge.sql import full_recompute_sql
    from loader.spark import get_spark

    sizes = [int(s) for s in os.environ.get("BENCH_MERGE_SIZES", "2000000,20000000").split(",")]
    increment = env_int("BENCH_INCREMENT", 50_000)
    repeats = env_int("BENCH_REPEATS", 3)
    series: dict[str, Any] = {"history_rows": [], "incremental_s": [], "full_s": [], "increment": increment}
    with scratch_database("bench_catalog") as catalog_dsn, scratch_dir("bench-merge-") as root:
        spark = get_spark(lake_settings(root, catalog_dsn), "bench-merge")
        print(f"increment = {increment:,} changes; median of {repeats} runs")
        print(f"{'history rows':>12} {'incremental s':>14} {'full recompute s':>17} {'ratio':>7}  files read/total")
        for idx, n in enumerate(sizes):
            settings = lake_settings(root, catalog_dsn)
            names = TableNames(settings)
            ensure_loader_tables(settings)
            table = SourceTable("public", "bench")
            # A new table: creation reads neither the rows nor the result.
            HistoryLoad(spark, settings)._ensure_history_table(table, COLUMNS, ["id"], None, LoadResult())  # type: ignore[arg-type]
            hist = names.history(table)
            keys = max(1, n // 10)
            appends = 8  # the base history in several appends, like successive loads
            per = n // appends
            for a in range(appends):
                _append(spark, hist, _rows_sql(a * per, per, keys, 0, a, base=True))
            done = appends * per
            merge = CurrentMerge(spark, settings)
            merge.merge_table(table, ChangePosition(1000 + done - 1, 1).token())  # initial build, not timed
            times = []
            for r in range(repeats):
                _append(spark, hist, _rows_sql(done, increment, keys, 10 * n + r * increment, 100 + r, base=False))
                done += increment
                started = time.perf_counter()
                merge.merge_table(table, ChangePosition(1000 + done - 1, 1).token())
                times.append(time.perf_counter() - started)
            t_inc = statistics.median(times)
            full_sql = full_recompute_sql(hist, ["id"], dict(COLUMNS), [c for c, _ in COLUMNS])
            t_full = median_time(
                lambda sql=full_sql: spark.sql(sql).write.format("noop").mode("overwrite").save(), repeats
            )
            read, total = _files_read(settings, table, 1000 + done - 1 - increment)
            print(f"{n:>12,} {t_inc:>14.2f} {t_full:>17.2f} {t_full / t_inc:>6.1f}x  {read}/{total}", flush=True)
            series["history_rows"].append(n)
            series["incremental_s"].append(t_inc)
            series["full_s"].append(t_full)
            if idx == 0:
                _p5(spark, settings, table, merge, hist, done, keys, n, increment)
        SERIES["merge_vs_history"] = series
        big, small = series["history_rows"][-1], series["history_rows"][0]
        ratio = series["full_s"][-1] / series["incremental_s"][-1]
        record(
            Figure(
                "P1",
                f"incremental merge, history {big / 1e6:g}M, +{increment // 1000}k",
                series["incremental_s"][-1],
                "s",
                series["full_s"][-1],
                "full ROW_NUMBER() recompute, same history",
                ratio,
                ">= 20x",
                ratio >= 20,
            )
        )
        growth = series["incremental_s"][-1] / series["incremental_s"][0]
        record(
            Figure(
                "P1b",
                f"incremental merge time growth {small / 1e6:g}M -> {big / 1e6:g}M",
                growth,
                "x",
                goal="<= 1.5x",
                met=growth <= 1.5,
            )
        )


def _files_read(settings: Any, table: SourceTable, since: int) -> tuple[int, int]:
    from pyiceberg.expressions import GreaterThan

    from loader.lake.catalog import open_catalog

    h = open_catalog(settings).load_table((settings.catalog.history_namespace, table.iceberg_name))
    return len(list(h.scan(row_filter=GreaterThan("pg_lsn", since)).plan_files())), len(list(h.scan().plan_files()))


def _p5(
    spark: Any, settings: Any, table: SourceTable, merge: Any, hist: str, done: int, keys: int, n: int, increment: int
) -> None:
    """P5: more increments, each merged by the loader and by pyiceberg's upsert on a copy (medians)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import In

    from loader.lake.catalog import open_catalog

    repeats = env_int("BENCH_REPEATS", 3)
    catalog = open_catalog(settings)
    ours = catalog.load_table((settings.catalog.current_namespace, table.iceberg_name))
    before = ours.scan().to_arrow()
    rival_ns = f"r_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(rival_ns)
    rival = catalog.create_table((rival_ns, "bench"), schema=ours.schema())
    rival.append(before)
    t_ours_all, t_rival_all = [], []
    for r in range(repeats):
        _append(spark, hist, _rows_sql(done, increment, keys, 20 * n + r * increment, 999 + r, base=False))
        done += increment
        started = time.perf_counter()
        merge.merge_table(table, ChangePosition(1000 + done - 1, 1).token())
        t_ours_all.append(time.perf_counter() - started)
        after = catalog.load_table((settings.catalog.current_namespace, table.iceberg_name)).scan().to_arrow()
        touched = spark.sql(
            f"SELECT DISTINCT coalesce(id, get_json_object(pg_old_key, '$.id')) AS id FROM {hist} WHERE pg_lsn > {1000 + done - 1 - increment}"
        )
        touched_ids = pa.array([int(row.id) for row in touched.collect()], pa.int64())
        upserts = after.filter(pc.is_in(after["id"], value_set=touched_ids))
        present = set(upserts["id"].to_pylist())
        deleted = [k for k in touched_ids.to_pylist() if k not in present]
        started = time.perf_counter()
        rival.upsert(upserts, join_cols=["id"])
        if deleted:
            rival.delete(In("id", deleted))
        t_rival_all.append(time.perf_counter() - started)
        rival = rival.refresh()
        got = rival.scan().to_arrow().sort_by("id")
        want = after.sort_by("id")
        want = want.select(got.column_names)
        # Values, not representations: pyiceberg reads text as string or large_string depending on
        # the files it read (Spark's, the driver merge's, its own).
        got = got.cast(want.schema)
        if not got.equals(want):
            g, w = {tuple(r.values()) for r in got.to_pylist()}, {tuple(r.values()) for r in want.to_pylist()}
            raise AssertionError(
                f"P5: pyiceberg's upserted copy differs from the loader's current table: {got.num_rows} vs"
                f" {want.num_rows} rows; only in pyiceberg's: {sorted(g - w)[:3]}; only in ours: {sorted(w - g)[:3]}"
            )
        print(
            f"P5 round {r + 1}: loader merge {t_ours_all[-1]:.2f}s, pyiceberg upsert+delete {t_rival_all[-1]:.2f}s"
            f" ({len(upserts):,} upserts, {len(deleted):,} deletes)"
        )
    t_ours, t_rival = statistics.median(t_ours_all), statistics.median(t_rival_all)
    record(
        Figure(
            "P5",
            f"merge +{increment // 1000}k into {len(before) / 1000:.0f}k keys (median of {repeats})",
            t_ours,
            "s",
            t_rival,
            "pyiceberg Table.upsert + delete, same final rows",
            t_rival / t_ours,
            ">= 3x faster",
            t_rival / t_ours >= 3,
        )
    )


if __name__ == "__main__":
    run()
