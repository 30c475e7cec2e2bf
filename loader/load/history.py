"""The history load: pending landing files -> Iceberg history tables, exactly once.

Exactly-once effect without a distributed transaction:
- files are taken in commit order up to the last one that ends on a commit, so history only
  ever holds whole transactions;
- each table's rows are appended with an anti-join on (pg_lsn, pg_seq) against the history
  files that can hold that LSN range (min/max pruning on the sorted pg_lsn column), and the
  append's snapshot summary carries the loaded-through position;
- the ledger (``loader.landing_files``) is appended last. A crash anywhere before it makes the
  re-run load the same files again, and the anti-join turns that into a no-op per table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loader.capture.landing import LandingFile, LandingStore, open_landing
from loader.config import LoaderSettings
from loader.load.decode import CHANGE_ROW_DDL, make_decoder
from loader.load.evolution import plan_evolution
from loader.load.typemap import never_toasted, quote_ident, spark_type, sql_string, typed_expr
from loader.lsn import ChangePosition
from loader.tables import (
    HISTORY_METADATA,
    METADATA_NAMES,
    PROP_DROPPED_COLUMNS,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    PROP_SOURCE_TABLE,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MIN_POSITION,
    SourceTable,
    TableNames,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REJECTS_DDL = (
    "landing_file STRING, line INT, source_table STRING, pg_lsn BIGINT, pg_seq BIGINT,"
    " reason STRING, raw STRING, rejected_at TIMESTAMP"
)
LEDGER_DDL = "file STRING, first_position STRING, last_position STRING, changes BIGINT, rejects BIGINT, loaded_at TIMESTAMP"


@dataclass
class LoadResult:
    files: list[str] = field(default_factory=list)
    rows_per_table: dict[str, int] = field(default_factory=dict)
    duplicates_skipped: int = 0
    rejects: int = 0
    waiting_files: int = 0
    loaded_through: str | None = None

    def summary(self) -> str:
        if not self.files:
            return "load: no new landing files" + (
                f" ({self.waiting_files} waiting for the rest of their transaction)" if self.waiting_files else ""
            )
        per = ", ".join(f"{t}={n}" for t, n in sorted(self.rows_per_table.items()))
        return (
            f"load: {len(self.files)} files, {sum(self.rows_per_table.values())} changes appended ({per}); "
            f"{self.duplicates_skipped} duplicates skipped; {self.rejects} rejected"
        )


# History tables take many small appends and are read by LSN range and by commit day.
HISTORY_TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    # Appends are already sorted by (pg_lsn, pg_seq) in each task: no shuffle before writing.
    "write.distribution-mode": "none",
    # Commit timestamps are not strictly monotone in LSN order, so one task may revisit a day
    # partition; the fanout writer keeps one file open per partition instead of failing.
    "write.spark.fanout.enabled": "true",
    # Min/max of the ordering columns must always be kept: they are what prunes history files
    # for the merge's LSN-range increment and for time-ranged audits (metrics are kept only for
    # the first 100 columns by default, and the metadata columns come after the source ones).
    "write.metadata.metrics.column.pg_lsn": "full",
    "write.metadata.metrics.column.pg_seq": "full",
    "write.metadata.metrics.column.pg_txn_timestamp": "full",
    # Frequent small commits: merge manifests early, keep metadata files bounded, retry races.
    "commit.manifest.min-count-to-merge": "50",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    "commit.retry.num-retries": "10",
}


def ensure_loader_tables(spark: "SparkSession", names: TableNames) -> None:
    for ns in names.namespaces():
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {names.ledger} ({LEDGER_DDL}) USING iceberg")
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {names.rejects} ({REJECTS_DDL}) USING iceberg "
        "PARTITIONED BY (days(rejected_at))"
    )


def table_properties(spark: "SparkSession", ident: str) -> dict[str, str]:
    rows = spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()
    return {r[0]: r[1] for r in rows}


def table_exists(spark: "SparkSession", ident: str) -> bool:
    # A catalog lookup, not a query: DESCRIBE ... collect() runs a Spark job (seconds on a busy host).
    try:
        return bool(spark.catalog.tableExists(ident))
    except Exception as exc:  # AnalysisException: namespace not found
        if "TABLE_OR_VIEW_NOT_FOUND" in str(exc) or "not found" in str(exc).lower():
            return False
        raise


def absent_columns_sql(pg_types: dict[str, str], dropped: dict[str, ChangePosition]) -> str:
    """pg_absent_columns: the columns an update did not send because their value is unchanged.

    Not sent but not "unchanged": fixed-length columns (never TOASTed) and columns dropped at or
    before the change's position; those read NULL.
    """
    items = []
    for name, pg_type in pg_types.items():
        if never_toasted(pg_type):
            continue
        cond = f"NOT array_contains(col_names, {sql_string(name)})"
        if name in dropped:
            d = dropped[name]
            cond += f" AND struct(commit_lsn, seq) < struct(CAST({d.commit_lsn} AS BIGINT) AS commit_lsn, CAST({d.seq} AS BIGINT) AS seq)"
        items.append(f"IF({cond}, {sql_string(name)}, NULL)")
    if not items:
        return "CAST(array() AS ARRAY<STRING>)"
    return f"IF(op = 'update', array_compact(array({', '.join(items)})), CAST(array() AS ARRAY<STRING>))"


class HistoryLoad:
    """Load every pending landing file into history tables."""

    def __init__(self, spark: "SparkSession", settings: LoaderSettings, store: LandingStore | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.store = store or open_landing(settings)
        self.names = TableNames(settings)

    def pending_files(self) -> tuple[list[LandingFile], int]:
        """Files not in the ledger, in commit order, cut after the last complete one."""
        loaded = {r[0] for r in self.spark.table(self.names.ledger).select("file").collect()}
        pending = [f for f in self.store.files() if f.name not in loaded]
        last_complete = max((i for i, f in enumerate(pending) if f.complete), default=-1)
        return pending[: last_complete + 1], len(pending) - (last_complete + 1)

    def run(self) -> LoadResult:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        ensure_loader_tables(self.spark, self.names)
        batch, waiting = self.pending_files()
        result = LoadResult(waiting_files=waiting)
        if not batch:
            return result
        files_df = self.spark.createDataFrame([(f.name,) for f in batch], "landing_file STRING")
        parallelism = max(1, min(len(batch), self.spark.sparkContext.defaultParallelism * 2))
        decoded = (
            files_df.repartition(parallelism)
            .mapInArrow(make_decoder(self.settings.model_dump_json()), CHANGE_ROW_DDL)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            self._write_rejects(decoded.where(F.col("reject_reason").isNotNull()), result, typed=False)
            good = decoded.where(F.col("reject_reason").isNull())
            for table, columns, pk in self._tables_in(good):
                self._load_table(good, table, columns, pk, batch[-1], result)
            ledger_rows = self._ledger_rows(decoded, batch)
            loaded_through = self._loaded_through(batch)
            (
                self.spark.createDataFrame(ledger_rows, LEDGER_DDL)
                .writeTo(self.names.ledger)
                .option(f"snapshot-property.{SUMMARY_LOADED_THROUGH}", loaded_through)
                .append()
            )
        finally:
            decoded.unpersist()
        result.files = [f.name for f in batch]
        result.loaded_through = loaded_through
        return result

    def _loaded_through(self, batch: list[LandingFile]) -> str:
        """The watermark never moves back: a late file below it leaves it where it was."""
        from loader.commit import latest_summary_value

        newest = max(f.last for f in batch)
        previous = latest_summary_value(self.spark, self.names.ledger, SUMMARY_LOADED_THROUGH)
        if previous is not None and ChangePosition.from_token(previous) > newest:
            return previous
        return newest.token()

    def _tables_in(self, good: "DataFrame") -> list[tuple[SourceTable, list[tuple[str, str]], list[str]]]:
        """(table, [(column, pg type)] in source order, primary key) for every table in the batch."""
        from pyspark.sql import functions as F

        cols = (
            good.select(
                "src_schema", "src_table", "commit_lsn", "seq", F.posexplode(F.arrays_zip("col_names", "col_types"))
            )
            .select(
                "src_schema", "src_table", "pos", F.struct("commit_lsn", "seq").alias("at"),
                F.col("col.col_names").alias("name"), F.col("col.col_types").alias("type"),
            )
            # A column retyped inside the batch takes its newest type (all its values fit it, or
            # evolution refuses the change).
            .groupBy("src_schema", "src_table", "name")
            .agg(F.min("pos").alias("pos"), F.max_by("type", "at").alias("type"))
            .collect()
        )
        pks = (
            good.where(F.size("pk") > 0)
            .groupBy("src_schema", "src_table")
            .agg(F.max_by("pk", F.struct("commit_lsn", "seq")).alias("pk"))
            .collect()
        )
        tables = {(r.src_schema, r.src_table) for r in good.select("src_schema", "src_table").distinct().collect()}
        out = []
        for schema, table in sorted(tables):
            these = sorted((r.pos, r.name, r.type) for r in cols if (r.src_schema, r.src_table) == (schema, table))
            pk = next((list(r.pk) for r in pks if (r.src_schema, r.src_table) == (schema, table)), [])
            out.append((SourceTable(schema, table), [(n, t) for _, n, t in these], pk))
        return out

    def _ensure_history_table(self, table: SourceTable, columns: list[tuple[str, str]], pk: list[str]) -> dict[str, str]:
        """Create or evolve the history table; returns column -> pg type after evolution."""
        ident = self.names.history(table)
        for name, _ in columns:
            if name in METADATA_NAMES:
                from loader.errors import SchemaEvolutionError

                raise SchemaEvolutionError(
                    f"table {table.qualified} has a column named {name!r}, which the loader reserves for metadata",
                    hint="rename the source column or exclude the table",
                )
        if not table_exists(self.spark, ident):
            pg_types = dict(columns)
            col_ddl = ", ".join(f"{quote_ident(n)} {spark_type(t).sql}" for n, t in columns)
            meta_ddl = ", ".join(f"{n} {t}" for n, t in HISTORY_METADATA)
            props = {
                **HISTORY_TABLE_PROPERTIES,
                PROP_SOURCE_TABLE: table.qualified,
                PROP_PRIMARY_KEY: json.dumps(pk),
                PROP_PG_TYPES: json.dumps(pg_types),
            }
            prop_sql = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in props.items())
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {ident} ({col_ddl}{', ' if col_ddl else ''}{meta_ddl}) USING iceberg "
                f"PARTITIONED BY (days(pg_txn_timestamp)) TBLPROPERTIES ({prop_sql})"
            )
            self.spark.sql(f"ALTER TABLE {ident} WRITE LOCALLY ORDERED BY pg_lsn, pg_seq")
            return pg_types
        props = table_properties(self.spark, ident)
        existing = json.loads(props.get(PROP_PG_TYPES, "{}"))
        plan = plan_evolution(table.qualified, existing, columns)
        if plan.empty and (not pk or json.loads(props.get(PROP_PRIMARY_KEY, "[]")) == pk):
            return existing
        for name, pg_type in plan.add:
            self.spark.sql(f"ALTER TABLE {ident} ADD COLUMN {quote_ident(name)} {spark_type(pg_type).sql}")
            existing[name] = pg_type
        for name, pg_type in plan.widen:
            self.spark.sql(f"ALTER TABLE {ident} ALTER COLUMN {quote_ident(name)} TYPE {spark_type(pg_type).sql}")
            existing[name] = pg_type
        for name, pg_type in plan.retext:
            existing[name] = pg_type
        new_props = {PROP_PG_TYPES: json.dumps(existing)}
        if pk:
            new_props[PROP_PRIMARY_KEY] = json.dumps(pk)
        prop_sql = ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in new_props.items())
        self.spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({prop_sql})")
        return existing

    def _load_table(
        self,
        good: "DataFrame",
        table: SourceTable,
        columns: list[tuple[str, str]],
        pk: list[str],
        last_file: LandingFile,
        result: LoadResult,
    ) -> None:
        from pyspark.sql import functions as F

        pg_types = self._ensure_history_table(table, columns, pk)
        ident = self.names.history(table)
        rows = good.where((F.col("src_schema") == table.schema) & (F.col("src_table") == table.table))
        rows = rows.withColumn("_m", F.map_from_arrays("col_names", "col_values"))
        dropped = self._dropped_columns(ident, rows, pg_types)
        select = []
        checks = []
        for name, pg_type in pg_types.items():
            raw = f"_m[{sql_string(name)}]"
            expr = typed_expr(pg_type, raw)
            select.append(f"{expr} AS {quote_ident(name)}")
            if not spark_type(pg_type).lossless_text:
                checks.append(
                    f"IF({raw} IS NOT NULL AND ({expr}) IS NULL, "
                    f"concat('column {name.replace(chr(39), '')} ({pg_type}): value ', {raw}, ' does not fit'), NULL)"
                )
        select += [
            "commit_lsn AS pg_lsn",
            "seq AS pg_seq",
            "xid AS pg_txn_id",
            "op AS pg_operation",
            "CAST(ts AS TIMESTAMP) AS pg_txn_timestamp",
            "change_lsn AS pg_change_lsn",
            "IF(size(key_names) > 0, to_json(map_from_arrays(key_names, key_values)), NULL) AS pg_old_key",
            f"{absent_columns_sql(pg_types, dropped)} AS pg_absent_columns",
            "landing_file AS pg_landing_file",
            "line AS _line",
            (f"concat_ws('; ', {', '.join(checks)})" if checks else "''") + " AS _reason",
            "to_json(struct(op, commit_lsn, seq, xid, ts, src_schema, src_table, col_names, col_values, key_names, key_values)) AS _raw",
        ]
        typed = rows.selectExpr(*select)
        bad = typed.where("_reason <> ''")
        self._write_rejects(
            bad.selectExpr(
                "pg_landing_file AS landing_file", "_line AS line", f"{sql_string(table.qualified)} AS source_table",
                "pg_lsn", "pg_seq", "_reason AS reject_reason", "_raw AS raw",
            ),
            result,
            typed=True,
        )
        ok = typed.where("_reason = ''").drop("_reason", "_raw", "_line")
        bounds = ok.agg(F.min("pg_lsn"), F.max("pg_lsn"), F.count(F.lit(1))).collect()[0]
        if bounds[2] == 0:
            return
        lo, hi = bounds[0], bounds[1]
        existing = self.spark.table(ident).where(F.col("pg_lsn").between(lo, hi)).select("pg_lsn", "pg_seq")
        new = ok.join(existing, ["pg_lsn", "pg_seq"], "left_anti").dropDuplicates(["pg_lsn", "pg_seq"])
        target_cols = [c for c in self.spark.table(ident).columns]
        new = new.select(*[F.col(quote_ident(c)) if c in new.columns else F.lit(None).alias(c) for c in target_cols])
        new = new.persist()
        try:
            stats = new.agg(F.count(F.lit(1)), F.min(F.struct("pg_lsn", "pg_seq"))).collect()[0]
            n = stats[0]
            if n:
                (
                    new.sortWithinPartitions("pg_lsn", "pg_seq")
                    .writeTo(ident)
                    .option(f"snapshot-property.{SUMMARY_LOADED_THROUGH}", last_file.last.token())
                    .option(f"snapshot-property.{SUMMARY_MIN_POSITION}", ChangePosition(*stats[1]).token())
                    .append()
                )
        finally:
            new.unpersist()
        result.rows_per_table[table.qualified] = n
        result.duplicates_skipped += bounds[2] - n

    def _dropped_columns(self, ident: str, rows: "DataFrame", pg_types: dict[str, str]) -> dict[str, ChangePosition]:
        """Columns dropped at the source, with the position the drop was first seen.

        wal2json sends every column of an insert, and every fixed-length column of an update;
        only varlena values left unchanged in TOAST storage are omitted from updates. So a column
        missing from an insert (or a fixed-length one missing from an update) no longer exists.
        Updates after that position carry the dropped column as NULL instead of "unchanged", and
        the merge writes NULL. Known drops are kept in the history table's properties; a column
        seen again after its drop (re-added under the same name) is live again.
        """
        known = {
            c: ChangePosition.from_token(t)
            for c, t in json.loads(table_properties(self.spark, ident).get(PROP_DROPPED_COLUMNS, "{}")).items()
        }
        aggs = []
        for i, (name, pg_type) in enumerate(pg_types.items()):
            lit = sql_string(name)
            evidence = "op IN ('insert', 'read')" + (" OR op = 'update'" if never_toasted(pg_type) else "")
            aggs.append(f"min(IF(({evidence}) AND NOT array_contains(col_names, {lit}), struct(commit_lsn, seq), NULL)) AS d{i}")
            aggs.append(f"max(IF(array_contains(col_names, {lit}), struct(commit_lsn, seq), NULL)) AS p{i}")
        if not aggs:
            return known
        row = rows.selectExpr(*aggs).collect()[0]
        changed = False
        for i, name in enumerate(pg_types):
            gone, seen = row[f"d{i}"], row[f"p{i}"]
            gone_at = ChangePosition(*gone) if gone is not None else None
            seen_at = ChangePosition(*seen) if seen is not None else None
            if name in known and seen_at is not None and seen_at > known[name]:
                del known[name]
                changed = True
            if gone_at is not None and name not in known and (seen_at is None or seen_at < gone_at):
                known[name] = gone_at
                changed = True
        if changed:
            value = json.dumps({c: p.token() for c, p in sorted(known.items())})
            self.spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({sql_string(PROP_DROPPED_COLUMNS)}={sql_string(value)})")
        return known

    def _write_rejects(self, bad: "DataFrame", result: LoadResult, typed: bool) -> None:
        from pyspark.sql import functions as F

        if typed:
            df = bad.withColumnRenamed("reject_reason", "reason")
        else:
            df = bad.selectExpr(
                "landing_file", "line",
                "concat_ws('.', src_schema, src_table) AS source_table",
                "commit_lsn AS pg_lsn", "seq AS pg_seq", "reject_reason AS reason", "raw",
            )
        df = df.withColumn("rejected_at", F.current_timestamp())
        known = self.spark.table(self.names.rejects).select("landing_file", "line")
        df = df.join(known, ["landing_file", "line"], "left_anti").persist()
        try:
            n = df.count()
            if n:
                df.select("landing_file", "line", "source_table", "pg_lsn", "pg_seq", "reason", "raw", "rejected_at").writeTo(
                    self.names.rejects
                ).append()
        finally:
            df.unpersist()
        result.rejects += n

    def _ledger_rows(self, decoded: "DataFrame", batch: list[LandingFile]) -> list[tuple]:
        from datetime import datetime, timezone

        from pyspark.sql import functions as F

        counts = {
            r.landing_file: (r.changes, r.rejects)
            for r in decoded.groupBy("landing_file")
            .agg(
                F.count(F.when(F.col("reject_reason").isNull(), 1)).alias("changes"),
                F.count(F.when(F.col("reject_reason").isNotNull(), 1)).alias("rejects"),
            )
            .collect()
        }
        now = datetime.now(timezone.utc)
        return [
            (f.name, f.first.token(), f.last.token(), *counts.get(f.name, (0, 0)), now) for f in batch
        ]
