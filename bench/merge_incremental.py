"""Benchmark: incremental MERGE of a fixed-size increment vs the full recompute Simple's views did.

For history tables of growing size (generated directly with Spark, one change per transaction,
about ten changes per key), it times
- incremental: ``CurrentMerge.merge_table`` of an increment of ``BENCH_INCREMENT`` changes
  (updates, inserts, deletes), reading only the increment from history and merging into the
  bucketed merge-on-read current table;
- full: ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY pg_lsn DESC)`` over the whole history,
  deletes removed (computed completely, written to Spark's no-op sink, so output cost is not counted);
and prints the medians of ``BENCH_REPEATS`` runs and their ratio, plus how many history files the
increment read planned (Iceberg min/max pruning on pg_lsn) and how many current files the MERGE wrote.

Needs PostgreSQL for the JDBC catalog: ``LOADER_BENCH_PG`` or ``LOADER_TEST_PG`` (default the test
server on 127.0.0.1:55433). Sizes: ``BENCH_MERGE_SIZES=200000,800000,3200000``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from loader.config import LoaderSettings
from loader.lsn import ChangePosition
from loader.tables import SUMMARY_MERGED_THROUGH, SourceTable, TableNames

PG = os.environ.get("LOADER_BENCH_PG", os.environ.get("LOADER_TEST_PG", "postgresql://postgres@127.0.0.1:55433"))
COLUMNS = [("id", "bigint"), ("v", "bigint"), ("s", "text"), ("amount", "numeric(18,2)")]
TS0 = 1_704_067_200  # 2024-01-01


def _settings(root: Path, catalog_db: str) -> LoaderSettings:
    uid = uuid.uuid4().hex[:6]
    return LoaderSettings(
        catalog={
            "name": "bench",
            "uri": f"{PG}/{catalog_db}",
            "warehouse": (root / "warehouse").as_uri(),
            "history_namespace": f"h_{uid}",
            "current_namespace": f"c_{uid}",
            "loader_namespace": f"l_{uid}",
        },
        landing={"url": (root / "landing").as_uri()},
        spark={"shuffle_partitions": int(os.environ.get("BENCH_SHUFFLE_PARTITIONS", "8")), "driver_memory": "4g"},
    )


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
               CAST(array() AS ARRAY<STRING>) AS pg_absent_columns, 'bench' AS pg_landing_file
        FROM (SELECT i, r, op, {key} AS k FROM (
            SELECT id AS i, r, {op} AS op FROM (SELECT id, rand({seed}) AS r FROM range({first}, {first + count}))))"""


def _append(spark: Any, ident: str, sql: str) -> None:
    spark.sql(sql).sortWithinPartitions("pg_lsn", "pg_seq").writeTo(ident).append()


def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        fn()
        times.append(time.monotonic() - started)
    return statistics.median(times)


def run() -> None:
    from pyiceberg.expressions import GreaterThan

    from loader.catalog import open_catalog
    from loader.load.history import HistoryLoad, ensure_loader_tables
    from loader.merge.current import CurrentMerge
    from loader.merge.sql import full_recompute_sql
    from loader.spark import get_spark

    sizes = [int(s) for s in os.environ.get("BENCH_MERGE_SIZES", "200000,800000,3200000").split(",")]
    increment = int(os.environ.get("BENCH_INCREMENT", "1000"))
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    catalog_db = f"bench_catalog_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {catalog_db}")
    root = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    try:
        first_settings = _settings(root, catalog_db)
        spark = get_spark(first_settings, "bench-merge")
        print(
            f"increment = {increment} changes; median of {repeats} runs; "
            f"current table: bucket({first_settings.merge.key_buckets}, id), merge-on-read"
        )
        print(
            f"{'history rows':>12} {'incremental s':>14} {'full recompute s':>17} {'ratio':>7}  history files read/total  current files written/total"
        )
        for n in sizes:
            settings = _settings(root, catalog_db)
            names = TableNames(settings)
            ensure_loader_tables(spark, names)
            table = SourceTable("public", "bench")
            loader = HistoryLoad(spark, settings)
            loader._ensure_history_table(table, COLUMNS, ["id"])
            hist = names.history(table)
            keys = max(1, n // 10)
            # The base history in several appends, like successive loads.
            appends = 8
            per = n // appends
            for a in range(appends):
                _append(spark, hist, _rows_sql(a * per, per, keys, 0, a, base=True))
            done = appends * per
            merge = CurrentMerge(spark, settings)
            merge.merge_table(table, ChangePosition(1000 + done - 1, 1).token())  # initial build, not timed
            times = []
            for r in range(repeats):
                _append(spark, hist, _rows_sql(done, increment, keys, 10 * n, 100 + r, base=False))
                done += increment
                started = time.monotonic()
                merge.merge_table(table, ChangePosition(1000 + done - 1, 1).token())
                times.append(time.monotonic() - started)
            t_inc = statistics.median(times)
            state = {"lsn": 1000 + done - 1}
            pk_types = dict(COLUMNS)
            full_sql = full_recompute_sql(hist, ["id"], pk_types, [c for c, _ in COLUMNS])
            t_full = _median_time(
                lambda sql=full_sql: spark.sql(sql).write.format("noop").mode("overwrite").save(), repeats
            )
            catalog = open_catalog(settings)
            h = catalog.load_table((settings.catalog.history_namespace, table.iceberg_name))
            since = state["lsn"] - increment  # the last increment's lower bound
            read = len(list(h.scan(row_filter=GreaterThan("pg_lsn", since)).plan_files()))
            total = len(list(h.scan().plan_files()))
            c = catalog.load_table((settings.catalog.current_namespace, table.iceberg_name))
            snap = c.current_snapshot()
            summary = snap.summary.additional_properties if snap and snap.summary else {}
            written = int(summary.get("added-data-files", 0)) + int(summary.get("added-delete-files", 0))
            cur_total = int(summary.get("total-data-files", 0)) + int(summary.get("total-delete-files", 0))
            assert summary.get(SUMMARY_MERGED_THROUGH) == ChangePosition(state["lsn"], 1).token()
            print(
                f"{n:>12} {t_inc:>14.2f} {t_full:>17.2f} {t_full / t_inc:>6.1f}x  {read:>10}/{total:<13} {written:>10}/{cur_total}",
                flush=True,
            )
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        try:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {catalog_db} WITH (FORCE)")
        except psycopg.Error:
            pass


if __name__ == "__main__":
    run()
