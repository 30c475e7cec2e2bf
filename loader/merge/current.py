"""Incremental merge: history increment since the last merge -> current table, one MERGE per table.

Watermarks live in the snapshot summary of the very commit they describe:
- ``loader.loaded-through`` on the ledger's appends: every table's history holds all complete
  transactions up to that position;
- ``loader.merged-through`` on each current table's MERGE commit: the current table equals the
  source at that position.
The increment is (merged-through, loaded-through], cut at a commit boundary by construction, so a
transaction is never half-applied. The MERGE's LSN guard makes a replay of an older increment a
no-op, and a re-run after a crash recomputes the same increment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loader.commit import latest_summary_value, with_commit_properties
from loader.config import LoaderSettings
from loader.load.history import ensure_loader_tables, table_exists, table_properties
from loader.load.typemap import quote_ident, spark_type, sql_string
from loader.lsn import ChangePosition
from loader.merge.sql import key_events_sql, merge_sql, reduce_sql
from loader.tables import (
    CURRENT_METADATA,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    PROP_SOURCE_TABLE,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SourceTable,
    TableNames,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableMerge:
    table: str
    increment_rows: int = 0
    keys_changed: int = 0
    merged_through: str | None = None
    skipped_reason: str | None = None


@dataclass
class MergeResult:
    tables: list[TableMerge] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        for t in self.tables:
            if t.skipped_reason:
                parts.append(f"{t.table}: {t.skipped_reason}")
            else:
                parts.append(f"{t.table}: {t.increment_rows} changes -> {t.keys_changed} keys")
        return "merge: " + ("; ".join(parts) if parts else "no history tables")


def history_tables(spark: "SparkSession", names: TableNames) -> list[SourceTable]:
    rows = spark.sql(f"SHOW TABLES IN {quote_ident(names.catalog)}.{quote_ident(names.history_ns)}").collect()
    return sorted(SourceTable.from_iceberg_name(r.tableName) for r in rows)


class CurrentMerge:
    def __init__(self, spark: "SparkSession", settings: LoaderSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)

    def run(self, tables: list[str] | None = None) -> MergeResult:
        ensure_loader_tables(self.spark, self.names)
        loaded = latest_summary_value(self.spark, self.names.ledger, SUMMARY_LOADED_THROUGH)
        result = MergeResult()
        for table in history_tables(self.spark, self.names):
            if tables and table.qualified not in tables:
                continue
            result.tables.append(self.merge_table(table, loaded))
        return result

    def merge_table(self, table: SourceTable, loaded_through: str | None, upto: ChangePosition | None = None) -> TableMerge:
        from pyspark.sql import functions as F

        out = TableMerge(table.qualified)
        hist = self.names.history(table)
        props = table_properties(self.spark, hist)
        pk: list[str] = json.loads(props.get(PROP_PRIMARY_KEY, "[]"))
        if not pk:
            out.skipped_reason = "no primary key: history only"
            return out
        if loaded_through is None:
            out.skipped_reason = "nothing loaded yet"
            return out
        cut = ChangePosition.from_token(loaded_through)
        if upto is not None and upto < cut:
            cut = upto
        pg_types: dict[str, str] = json.loads(props[PROP_PG_TYPES])
        cur = self.names.current(table)
        self._ensure_current(table, cur, pk, pg_types)
        merged = latest_summary_value(self.spark, cur, SUMMARY_MERGED_THROUGH)
        since = ChangePosition.from_token(merged) if merged else None
        if since is not None and since >= cut:
            out.merged_through = merged
            return out
        inc = self.spark.table(hist).where(F.col("pg_lsn") <= cut.commit_lsn)
        if since is not None:
            inc = inc.where(
                (F.col("pg_lsn") > since.commit_lsn)
                | ((F.col("pg_lsn") == since.commit_lsn) & (F.col("pg_seq") > since.seq))
            )
        inc = inc.where((F.col("pg_lsn") < cut.commit_lsn) | (F.col("pg_seq") <= cut.seq))
        columns = list(pg_types)
        view = f"_inc_{table.iceberg_name}".replace("-", "_")
        inc.createOrReplaceTempView(quote_ident(view))
        events_view, reduced_view = view + "_events", view + "_reduced"
        self.spark.sql(key_events_sql(quote_ident(view), pk, pg_types, columns)).createOrReplaceTempView(quote_ident(events_view))
        reduced = self.spark.sql(reduce_sql(quote_ident(events_view), pk, columns)).persist()
        try:
            reduced.createOrReplaceTempView(quote_ident(reduced_view))
            out.keys_changed = reduced.count()
            out.increment_rows = inc.count()
            statement = merge_sql(cur, quote_ident(reduced_view), pk, columns)
            with_commit_properties(
                self.spark,
                {SUMMARY_MERGED_THROUGH: cut.token()},
                lambda: self.spark.sql(statement),
            )
            if out.keys_changed == 0:
                # A MERGE with an empty source commits nothing; record progress explicitly.
                self._record_progress(cur, cut)
        finally:
            reduced.unpersist()
        out.merged_through = cut.token()
        return out

    def _record_progress(self, cur: str, cut: ChangePosition) -> None:
        with_commit_properties(
            self.spark,
            {SUMMARY_MERGED_THROUGH: cut.token()},
            lambda: self.spark.sql(f"DELETE FROM {cur} WHERE false"),
        )
        if latest_summary_value(self.spark, cur, SUMMARY_MERGED_THROUGH) != cut.token():
            # An empty DELETE may not commit either; fall back to a table-property commit.
            self.spark.sql(
                f"ALTER TABLE {cur} SET TBLPROPERTIES ({sql_string('loader.merged-through-empty')}={sql_string(cut.token())})"
            )

    def _ensure_current(self, table: SourceTable, cur: str, pk: list[str], pg_types: dict[str, str]) -> None:
        if not table_exists(self.spark, cur):
            cols = ", ".join(f"{quote_ident(n)} {spark_type(t).sql}" for n, t in pg_types.items())
            meta = ", ".join(f"{n} {t}" for n, t in CURRENT_METADATA)
            props = {
                "format-version": "2",
                "write.merge.mode": "merge-on-read",
                "write.update.mode": "merge-on-read",
                "write.delete.mode": "merge-on-read",
                "write.parquet.compression-codec": "zstd",
                "write.metadata.delete-after-commit.enabled": "true",
                "write.metadata.previous-versions-max": "100",
                PROP_SOURCE_TABLE: table.qualified,
                PROP_PRIMARY_KEY: json.dumps(pk),
                PROP_PG_TYPES: json.dumps(pg_types),
            }
            prop_sql = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in props.items())
            buckets = self.settings.merge.key_buckets
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {cur} ({cols}, {meta}) USING iceberg "
                f"PARTITIONED BY (bucket({buckets}, {quote_ident(pk[0])})) TBLPROPERTIES ({prop_sql})"
            )
            self.spark.sql(f"ALTER TABLE {cur} WRITE LOCALLY ORDERED BY {', '.join(quote_ident(k) for k in pk)}")
            return
        cprops = table_properties(self.spark, cur)
        have: dict[str, str] = json.loads(cprops.get(PROP_PG_TYPES, "{}"))
        changed = False
        for name, pg_type in pg_types.items():
            if name not in have:
                self.spark.sql(f"ALTER TABLE {cur} ADD COLUMN {quote_ident(name)} {spark_type(pg_type).sql}")
                changed = True
            elif spark_type(have[name]).sql != spark_type(pg_type).sql:
                self.spark.sql(f"ALTER TABLE {cur} ALTER COLUMN {quote_ident(name)} TYPE {spark_type(pg_type).sql}")
                changed = True
            elif have[name] != pg_type:
                changed = True
        if changed:
            self.spark.sql(
                f"ALTER TABLE {cur} SET TBLPROPERTIES ({sql_string(PROP_PG_TYPES)}={sql_string(json.dumps(pg_types))})"
            )
