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
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loader.commit import current_snapshot_id, latest_summary_value, snapshots_since, with_commit_properties
from loader.config import LoaderSettings
from loader.errors import CatalogError, ConfigError
from loader.load.history import ensure_loader_tables, table_exists, table_properties
from loader.load.typemap import quote_ident, spark_type, sql_string
from loader.lsn import ChangePosition
from loader.merge.sql import key_events_sql, merge_sql, reduce_sql
from loader.tables import (
    CURRENT_METADATA,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    PROP_SOURCE_TABLE,
    SUMMARY_HISTORY_SNAPSHOT,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SUMMARY_MIN_POSITION,
    SourceTable,
    TableNames,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class TableMerge:
    table: str
    increment_rows: int = 0
    keys_changed: int = 0
    merged_through: str | None = None
    skipped_reason: str | None = None
    note: str = ""


@dataclass
class MergeResult:
    tables: list[TableMerge] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        for t in self.tables:
            if t.skipped_reason:
                parts.append(f"{t.table}: {t.skipped_reason}")
            else:
                note = f" ({t.note})" if t.note else ""
                parts.append(f"{t.table}: {t.increment_rows} changes -> {t.keys_changed} keys{note}")
        head = "merge: " + ("; ".join(parts) if parts else "no history tables")
        return head + (f"\nconsistent through: {self.consistent_through}" if self.consistent_through else "")

    @property
    def consistent_through(self) -> str | None:
        """The position every merged table has reached: the tables agree as of this LSN."""
        done = [t.merged_through for t in self.tables if t.merged_through]
        return str(ChangePosition.from_token(min(done))) if done else None


def resolve_key_change_toast(
    spark: "SparkSession", events: "DataFrame", current: str | None, pk: list[str], columns: list[str]
) -> "DataFrame":
    """Fill the unchanged-TOAST columns of key-changing updates from the old key's row.

    An update that changes the key and leaves a TOASTed value unchanged does not send it, and
    the value lives under the old key: in an earlier change of the increment or in the current
    table. Key changes are rare, so the few keys they involve are replayed here in commit order
    (following chains of key changes) and the missing values patched into the events.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    key_changes = events.where("_from IS NOT NULL")
    if not key_changes.where("size(pg_absent_columns) > 0").limit(1).collect():
        return events
    q = quote_ident
    non_key = [c for c in columns if c not in pk]
    keys: set[tuple] = set()
    for r in key_changes.select(*[q(k) for k in pk], "_from").collect():
        keys.add(tuple(r[k] for k in pk))
        keys.add(tuple(r["_from"]))
    key_schema = StructType([events.schema[k] for k in pk])
    key_df = spark.createDataFrame(sorted(keys, key=repr), key_schema)
    on = [events[q(k)].eqNullSafe(key_df[q(k)]) for k in pk]
    involved = events.join(key_df, on, "left_semi").orderBy("pg_lsn", "pg_seq", "_sub").collect()
    state: dict[tuple, dict[str, object] | None] = {}
    if current is not None:
        cur_df = spark.table(current)
        on_cur = [cur_df[q(k)].eqNullSafe(key_df[q(k)]) for k in pk]
        for r in cur_df.join(key_df, on_cur, "left_semi").collect():
            state[tuple(r[k] for k in pk)] = {c: r[c] for c in non_key}
    before_delete: dict[tuple, dict[str, object] | None] = {}
    patches = []
    for e in involved:
        k = tuple(e[c] for c in pk)
        if e["_kind"] == "delete":
            before_delete[k] = state.get(k)
            state[k] = None
            continue
        absent = set(e["pg_absent_columns"] or ())
        if e["_from"] is not None:
            base = before_delete.get(tuple(e["_from"])) or {}
            patched = sorted(c for c in absent if c in base)
        else:
            base = state.get(k) or {}
            patched = []
        state[k] = {c: (base.get(c) if c in absent else e[c]) for c in non_key}
        if patched:
            patches.append((e["pg_lsn"], e["pg_seq"], *[state[k][c] for c in non_key], patched))
    if not patches:
        return events
    patch_schema = StructType(
        [events.schema["pg_lsn"], events.schema["pg_seq"]]
        + [StructField(f"_p{i}", events.schema[c].dataType, True) for i, c in enumerate(non_key)]
        + [StructField("_patched", ArrayType(StringType()), False)]
    )
    patch_df = spark.createDataFrame(patches, patch_schema)
    joined = events.join(patch_df, ["pg_lsn", "pg_seq"], "left")
    is_patch = "(_sub = 1 AND _patched IS NOT NULL)"
    cols = []
    for c in events.columns:
        if c in non_key:
            i = non_key.index(c)
            cols.append(F.expr(f"IF({is_patch} AND array_contains(_patched, {sql_string(c)}), _p{i}, {q(c)})").alias(c))
        elif c == "pg_absent_columns":
            cols.append(F.expr(f"IF({is_patch}, array_except(pg_absent_columns, _patched), pg_absent_columns)").alias(c))
        else:
            cols.append(F.col(q(c)))
    return joined.select(*cols)


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

    def rebuild(self, qualified: str, upto: ChangePosition | None = None) -> TableMerge:
        """Recompute one current table from its history as of ``upto`` (default: all loaded)."""
        ensure_loader_tables(self.spark, self.names)
        schema, _, name = qualified.partition(".")
        table = SourceTable(schema, name)
        if table not in history_tables(self.spark, self.names):
            raise ConfigError(
                f"no history table for {qualified}", hint="give --table as schema.table of a loaded source table"
            )
        loaded = latest_summary_value(self.spark, self.names.ledger, SUMMARY_LOADED_THROUGH)
        return self.merge_table(table, loaded, upto=upto, rebuild=True)

    def merge_table(
        self, table: SourceTable, loaded_through: str | None, upto: ChangePosition | None = None, rebuild: bool = False
    ) -> TableMerge:
        """Merge one table's increment; ``rebuild`` recomputes the whole current table from history."""
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
        hist_snapshot = current_snapshot_id(self.spark, hist)
        if not rebuild and since is not None and self._late_changes(hist, cur, since):
            # A landing file arrived after later changes were merged: the LSN guard alone cannot
            # place its changes (TOAST carry-over, deletes), so recompute this table from history.
            rebuild = True
            out.note = "late changes below the merged position: rebuilt from history"
        if rebuild:
            since = None
        elif since is not None and since >= cut:
            out.merged_through = merged
            return out
        props_out = {SUMMARY_MERGED_THROUGH: cut.token()}
        if hist_snapshot is not None:
            props_out[SUMMARY_HISTORY_SNAPSHOT] = str(hist_snapshot)
        if hist_snapshot is None:
            inc = self.spark.table(hist)
        else:
            # Read the snapshot the watermark was taken against, not whatever a concurrent load adds.
            inc = self.spark.sql(f"SELECT * FROM {hist} VERSION AS OF {hist_snapshot}")
        inc = inc.where(F.col("pg_lsn") <= cut.commit_lsn)
        inc = inc.where((F.col("pg_lsn") < cut.commit_lsn) | (F.col("pg_seq") <= cut.seq))
        if since is not None:
            inc = inc.where(
                (F.col("pg_lsn") > since.commit_lsn)
                | ((F.col("pg_lsn") == since.commit_lsn) & (F.col("pg_seq") > since.seq))
            )
        inc = inc.persist()
        try:
            stats = inc.agg(
                F.count(F.lit(1)),
                F.max(F.when(F.col("pg_operation") == "truncate", F.struct("pg_lsn", "pg_seq"))),
                F.count(F.when((F.col("pg_operation") == "update") & (F.size("pg_absent_columns") > 0), 1)),
            ).collect()[0]
            out.increment_rows = stats[0]
            truncated = ChangePosition(*stats[1]) if stats[1] is not None else None
            toast_updates = stats[2]
            if truncated is not None:
                out.note = (out.note + "; " if out.note else "") + f"truncated at {truncated}"
                inc_events = inc.where(
                    (F.col("pg_lsn") > truncated.commit_lsn)
                    | ((F.col("pg_lsn") == truncated.commit_lsn) & (F.col("pg_seq") > truncated.seq))
                )
            else:
                inc_events = inc
            self._apply(table, cur, inc_events, pk, pg_types, props_out, out, rebuild, truncated, toast_updates > 0, since)
        finally:
            inc.unpersist()
        out.merged_through = cut.token()
        return out

    def _apply(
        self,
        table: SourceTable,
        cur: str,
        inc: "DataFrame",
        pk: list[str],
        pg_types: dict[str, str],
        commit_props: dict[str, str],
        out: TableMerge,
        rebuild: bool,
        truncated: ChangePosition | None,
        toast_updates: bool = True,
        since: ChangePosition | None = None,
    ) -> None:
        from pyspark.sql import functions as F

        columns = list(pg_types)
        view = f"_inc_{table.iceberg_name}"
        inc.createOrReplaceTempView(quote_ident(view))
        events = self.spark.sql(key_events_sql(quote_ident(view), pk, pg_types, columns))
        if toast_updates:
            events = resolve_key_change_toast(self.spark, events, None if rebuild else cur, pk, columns)
        events_view, reduced_view = view + "_events", view + "_reduced"
        events.createOrReplaceTempView(quote_ident(events_view))
        reduced = self.spark.sql(reduce_sql(quote_ident(events_view), pk, columns)).persist()
        try:
            reduced.createOrReplaceTempView(quote_ident(reduced_view))
            out.keys_changed = reduced.count()
            if rebuild:
                rows = reduced.where("_kind = 'upsert'").select(
                    *[quote_ident(c) for c in columns], *[n for n, _ in CURRENT_METADATA]
                )
                writer = rows.sortWithinPartitions(*[quote_ident(k) for k in pk]).writeTo(cur)
                for k, v in commit_props.items():
                    writer = writer.option(f"snapshot-property.{k}", v)
                # One atomic commit replaces every row, whatever the table held.
                writer.overwrite(F.lit(True))
                return
            if out.keys_changed == 0 and truncated is None:
                self._record_progress(cur, commit_props)
                return
            statement = merge_sql(
                cur, quote_ident(reduced_view), pk, columns,
                (truncated.commit_lsn, truncated.seq) if truncated is not None else None,
                None if truncated is not None else self._bucket_filter(cur, pk, quote_ident(reduced_view)),
                (since.commit_lsn, since.seq) if since is not None else None,
            )
            with_commit_properties(self.spark, commit_props, lambda: self.spark.sql(statement))
            if latest_summary_value(self.spark, cur, SUMMARY_MERGED_THROUGH) != commit_props[SUMMARY_MERGED_THROUGH]:
                # Every matched row was already at or past its event (a replayed increment): the
                # MERGE changed nothing and committed nothing; record the progress explicitly.
                self._record_progress(cur, commit_props)
        finally:
            reduced.unpersist()

    def _bucket_filter(self, cur: str, pk: list[str], reduced_view: str) -> str | None:
        """``bucket(N, key) IN (...)`` over the buckets the increment touches, or None if it is all.

        The current table is partitioned by bucket(N, first key column); with the predicate in
        the MERGE condition, Iceberg plans only those partitions' data and delete files.
        """
        from loader.commit import iceberg_table

        table = iceberg_table(self.spark, cur)
        fields = list(table.spec().fields())
        if len(fields) != 1 or table.schema().findColumnName(fields[0].sourceId()) != pk[0]:
            return None
        m = re.fullmatch(r"bucket\[(\d+)\]", str(fields[0].transform().toString()))
        if not m:
            return None
        fn = f"{quote_ident(self.names.catalog)}.system.bucket({int(m.group(1))}, {{col}})"
        hit = [r[0] for r in self.spark.sql(f"SELECT DISTINCT {fn.format(col=quote_ident(pk[0]))} FROM {reduced_view}").collect()]
        if not hit or len(hit) >= int(m.group(1)) or any(b is None for b in hit):
            return None
        return f"{fn.format(col='t.' + quote_ident(pk[0]))} IN ({', '.join(str(int(b)) for b in sorted(hit))})"

    def _late_changes(self, hist: str, cur: str, since: ChangePosition) -> bool:
        """Did a history append after the last merge add changes at or below its position?"""
        last = latest_summary_value(self.spark, cur, SUMMARY_HISTORY_SNAPSHOT)
        if last is None:
            return False
        newer = snapshots_since(self.spark, hist, int(last))
        if newer is None:
            return False  # the snapshot expired: nothing to compare with
        return any(s.get(SUMMARY_MIN_POSITION, "~") <= since.token() for s in newer)

    def _record_progress(self, cur: str, commit_props: dict[str, str]) -> None:
        """Commit the watermark without data: an empty append carries it in its snapshot summary."""
        writer = self.spark.table(cur).limit(0).writeTo(cur)
        for k, v in commit_props.items():
            writer = writer.option(f"snapshot-property.{k}", v)
        writer.append()
        if latest_summary_value(self.spark, cur, SUMMARY_MERGED_THROUGH) != commit_props[SUMMARY_MERGED_THROUGH]:
            raise CatalogError(
                f"the merge of {cur} could not record its watermark {commit_props[SUMMARY_MERGED_THROUGH]}",
                hint="check that the catalog accepts commits, then re-run 'loader merge'",
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
