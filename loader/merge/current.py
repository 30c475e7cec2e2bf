"""Incremental merge: history increment since the last merge -> current table (bulk, driver or MERGE).

Watermarks live in the snapshot summary of the very commit they describe:
- ``loader.loaded-through`` on the ledger's appends: every table's history holds all complete
  transactions up to that position;
- ``loader.merged-through`` on each current table's MERGE commit: the current table equals the
  source at that position.
The increment is (merged-through, loaded-through], cut at a commit boundary by construction, so a
transaction is never half-applied. The MERGE's LSN guard makes a replay of an older increment a
no-op, and a re-run after a crash recomputes the same increment. Control rows in the increment
(truncate, resync, park) are planned by :mod:`loader.merge.plan`: a parked table stops alone.

A resync in the increment is built in bulk (:meth:`CurrentMerge._bulk_build`): the snapshot's rows
overwrite the whole current table in one commit, written once with no join against the old rows,
and only the changes after them go through the driver merge or MERGE, in a second commit. The
first commit's watermark is the snapshot's last row, so a crash between the two re-runs only the
changes after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from loader.config import LoaderSettings
from loader.errors import CatalogError, ConfigError, MergeConflictError
from loader.faults import checkpoint
from loader.lake.catalog import (
    history_source_tables,
    latest_summary,
    load_or_none,
    open_catalog,
    set_properties,
    snapshot_id,
)
from loader.lake.catalog import watermark as table_watermark
from loader.lake.commits import create_table, default_location, ensure_loader_tables, refresh_spark, warehouse_answers
from loader.lake.iceberg import (
    current_snapshot_id,
    iceberg_table,
    latest_summary_value,
    update_properties,
    with_commit_properties,
)
from loader.lake.procedures import rewrite_data_files, rewrite_position_deletes
from loader.lake.tables import (
    CURRENT_METADATA,
    LEDGER_NAME,
    PROP_LAST_POSITION,
    PROP_LATE_APPENDS,
    PROP_LATE_APPENDS_SEEN,
    PROP_LOADED_THROUGH_TS,
    PROP_MERGED_THROUGH_TS,
    PROP_MERGES_SINCE_COMPACTION,
    PROP_PARKED,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    PROP_SOURCE_TABLE,
    SUMMARY_HISTORY_SNAPSHOT,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SourceTable,
    TableNames,
    consistent_through,
    source_columns,
    table_consistent_at,
)
from loader.lake.types import quote_ident, spark_type, sql_string
from loader.load.evolution import can_widen
from loader.lsn import ChangePosition, position_after_sql, position_before_sql
from loader.merge.plan import Marker, MergePlan, plan_compaction, plan_markers, replay_key_changes
from loader.merge.rowdelta import commit_rows
from loader.merge.sql import FROM, KIND, SUB, col, key_events_sql, merge_sql, reduce_sql, touched_buckets_sql
from loader.names import lake_column
from loader.progress import each_table
from loader.spark import java_map, spark_started

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from loader.merge.bulk import BulkPlan

T = TypeVar("T")

log = logging.getLogger("loader.merge")

CURRENT_TABLE_PROPERTIES: dict[str, str] = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
    "write.parquet.compression-codec": "zstd",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


@dataclass
class TableMerge:
    table: str
    increment_rows: int = 0
    keys_changed: int | None = None  # counted by rebuilds; an incremental MERGE does not count them
    merged_through: str | None = None
    skipped_reason: str | None = None
    note: str = ""
    parked: str | None = None  # why the table's current table waits for a resync
    # How the data was committed: "bulk" (a resync's rows written once over the whole table),
    # "bulk+merge" / "bulk+driver" (then the changes after it), "driver", "merge", "rebuild";
    # "" when no data commit was needed (nothing new, or only the watermark recorded).
    method: str = ""
    bulk_engine: str = ""  # "driver" (loader.merge.bulk) or "spark" when a bulk build ran
    keyed: bool = True  # False: no primary key, history only (no current table)
    # The position the current table equals the source at (loader.lake.tables.table_consistent_at).
    consistent_at: str | None = None

    def describe(self) -> str:
        if self.skipped_reason:
            return f"{self.table}: {self.skipped_reason}"
        note = f" ({self.note})" if self.note else ""
        keys = f" -> {self.keys_changed} keys" if self.keys_changed is not None else ""
        by = f" by {self.method}" if self.method else ""
        return f"{self.table}: {self.increment_rows} changes{keys}{by}{note}"


@dataclass
class MergeResult:
    tables: list[TableMerge] = field(default_factory=list)

    def summary(self) -> str:
        parts = [t.describe() for t in self.tables]
        head = "merge: " + ("; ".join(parts) if parts else "no history tables")
        return head + (f"\nconsistent through: {self.consistent_through}" if self.consistent_through else "")

    @property
    def parked(self) -> dict[str, str]:
        return {t.table: t.parked for t in self.tables if t.parked}

    @property
    def consistent_through(self) -> str | None:
        """The position every current table has reached, by the rule ``loader status`` uses
        (:func:`loader.lake.tables.consistent_through`): the tables agree as of this position."""
        token = consistent_through([t.consistent_at for t in self.tables if t.keyed])
        return str(ChangePosition.from_token(token)) if token else None


def _portable(data_type: Any) -> tuple[str, str, str] | None:
    """(encode, decode, encoded type) of a date/time type as integers: Python's datetime holds only
    years 1-9999, and the lake keeps +/-infinity as the storage types' limits (loader.lake.types)."""
    from pyspark.sql.types import DateType, TimestampNTZType, TimestampType

    if isinstance(data_type, TimestampType):
        return "unix_micros({})", "timestamp_micros({})", "BIGINT"
    if isinstance(data_type, TimestampNTZType):  # the session time zone is UTC (loader.spark)
        return (
            "timestampdiff(MICROSECOND, TIMESTAMP_NTZ'1970-01-01 00:00:00', {})",
            "CAST(timestamp_micros({}) AS TIMESTAMP_NTZ)",
            "BIGINT",
        )
    if isinstance(data_type, DateType):
        return "unix_date({})", "date_from_unix_date({})", "INT"
    return None


def resolve_key_change_toast(
    spark: SparkSession, events: DataFrame, current: str | None, pk: list[str], columns: list[str]
) -> DataFrame:
    """Fill the unchanged-TOAST columns of key-changing updates from the old key's row.

    An update that changes the key and leaves a TOASTed value unchanged does not send it, and
    the value lives under the old key: in an earlier change of the increment or in the current
    table. Key changes are rare, so the few keys they involve are collected and replayed in
    commit order (:func:`loader.merge.plan.replay_key_changes`), and the values patched in.
    Dates and timestamps travel through Python as integers (:func:`_portable`), so values beyond
    Python's datetime (+/-infinity, BC, years past 9999) are carried over exactly.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType, _parse_datatype_string

    key_changes = events.where(f"{FROM} IS NOT NULL")
    if not key_changes.where("size(pg_absent_columns) > 0").select(F.lit(1)).limit(1).collect():
        return events
    non_key = [c for c in columns if c not in pk]
    portable = {c: _portable(events.schema[c].dataType) for c in columns}

    def enc_sql(c: str, expr: str) -> str:
        p = portable[c]
        return p[0].format(expr) if p else expr

    def enc(c: str, expr: str | None = None) -> Any:
        return F.expr(enc_sql(c, expr or col(c))).alias(c)

    def encoded_type(c: str) -> Any:
        p = portable[c]
        return _parse_datatype_string(p[2]) if p else events.schema[c].dataType

    keys: set[tuple[Any, ...]] = set()
    old_key = F.when(F.col(FROM).isNotNull(), F.struct(*[enc(k, f"{FROM}.k{i}") for i, k in enumerate(pk)]))
    for r in key_changes.select(*[enc(k) for k in pk], old_key.alias(FROM)).collect():
        keys.add(tuple(r[k] for k in pk))
        keys.add(tuple(r[FROM]))
    key_schema = StructType([StructField(k, encoded_type(k), True) for k in pk])
    key_df = spark.createDataFrame(sorted(keys, key=repr), key_schema)
    on = [F.expr(enc_sql(k, f"`_e`.{col(k)}")).eqNullSafe(F.col(f"`_k`.{col(k)}")) for k in pk]
    involved = [
        {
            **{c: r[c] for c in columns},
            "pg_lsn": r["pg_lsn"],
            "pg_seq": r["pg_seq"],
            "kind": r[KIND],
            "absent": r["pg_absent_columns"],
            "from": r[FROM],
        }
        for r in events.alias("_e")
        .join(key_df.alias("_k"), on, "left_semi")
        .select(*[enc(c) for c in columns], "pg_lsn", "pg_seq", SUB, KIND, "pg_absent_columns", old_key.alias(FROM))
        .orderBy("pg_lsn", "pg_seq", SUB)
        .collect()
    ]
    state: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    if current is not None:
        cur_df = spark.table(current)
        on_cur = [F.expr(enc_sql(k, f"`_c`.{col(k)}")).eqNullSafe(F.col(f"`_k`.{col(k)}")) for k in pk]
        for r in (
            cur_df.alias("_c")
            .join(key_df.alias("_k"), on_cur, "left_semi")
            .select(*[enc(c) for c in columns])
            .collect()
        ):
            state[tuple(r[k] for k in pk)] = {c: r[c] for c in non_key}
    patches = replay_key_changes(involved, state, pk, non_key)
    if not patches:
        return events
    patch_schema = StructType(
        [events.schema["pg_lsn"], events.schema["pg_seq"]]
        + [StructField(f"p{i}", encoded_type(c), True) for i, c in enumerate(non_key)]
        + [StructField("patched", ArrayType(StringType()), False)]
    )
    patch_df = spark.createDataFrame(
        [(p.position[0], p.position[1], *[p.values[c] for c in non_key], p.columns) for p in patches], patch_schema
    ).toDF("pg_lsn", "pg_seq", *[f"pg__p{i}" for i in range(len(non_key))], "pg__patched")
    joined = events.join(patch_df, ["pg_lsn", "pg_seq"], "left")
    is_patch = f"({SUB} = 1 AND pg__patched IS NOT NULL)"
    out = []
    for c in events.columns:
        if c in non_key:
            i = non_key.index(c)
            p = portable[c]
            value = p[1].format(f"pg__p{i}") if p else f"pg__p{i}"
            out.append(
                F.expr(f"IF({is_patch} AND array_contains(pg__patched, {sql_string(c)}), {value}, {col(c)})").alias(c)
            )
        elif c == "pg_absent_columns":
            out.append(
                F.expr(f"IF({is_patch}, array_except(pg_absent_columns, pg__patched), pg_absent_columns)").alias(c)
            )
        else:
            out.append(F.col(col(c)))
    return joined.select(*out)


class CurrentMerge:
    def __init__(self, spark: SparkSession, settings: LoaderSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)
        self._loaded_ts: str | None = None
        self._loaded_token: str | None = None

    def run(self, tables: list[str] | None = None) -> MergeResult:
        from loader.locks import stage_lock

        with stage_lock(self.settings, "merge"):
            checkpoint("merge-locked")
            ensure_loader_tables(self.settings)
            loaded = self._loaded_through()
            result = MergeResult()
            selected = [t for t in history_source_tables(self.settings) if not tables or t.qualified in tables]
            result.tables.extend(
                each_table(selected, lambda t: self.merge_table(t, loaded), self.settings.spark.table_threads, "merge")
            )
            return result

    def rebuild(self, qualified: str, upto: ChangePosition | None = None) -> TableMerge:
        """Recompute one current table from its history as of ``upto`` (default: all loaded)."""
        from loader.locks import stage_lock

        with stage_lock(self.settings, "merge"):
            ensure_loader_tables(self.settings)
            known = history_source_tables(self.settings)
            table = SourceTable.among(qualified, known)
            if table not in known:
                raise ConfigError(
                    f"no history table for {qualified}", hint="give --table as schema.table of a loaded source table"
                )
            loaded = self._loaded_through()
            return self.merge_table(table, loaded, upto=upto, rebuild=True)

    def _loaded_through(self) -> str | None:
        """The load's watermark, and the commit time of the transaction there (for freshness)."""
        ledger = open_catalog(self.settings).load_table((self.names.loader_ns, LEDGER_NAME))
        self._loaded_ts = ledger.properties.get(PROP_LOADED_THROUGH_TS)
        self._loaded_token = table_watermark(ledger, SUMMARY_LOADED_THROUGH)
        return self._loaded_token

    # Table metadata is read and written with pyiceberg (the catalog's newest metadata, no JVM):
    # a merge that the driver does whole never starts Spark. What Spark does next in this process
    # sees the commits made here: each is followed by refresh_spark when a session runs.
    def _history(self, table: SourceTable) -> Any:
        return open_catalog(self.settings).load_table((self.names.history_ns, table.iceberg_name))

    def _current(self, table: SourceTable) -> Any | None:
        """The current table (pyiceberg's), or None when it does not exist yet."""
        return load_or_none(open_catalog(self.settings), (self.names.current_ns, table.iceberg_name))

    def _refresh(self, ident: str) -> None:
        if spark_started(self.spark):
            refresh_spark(self.spark, ident)

    def merge_table(
        self, table: SourceTable, loaded_through: str | None, upto: ChangePosition | None = None, rebuild: bool = False
    ) -> TableMerge:
        """Merge one table's increment; ``rebuild`` recomputes the whole current table from history.

        A direct commit that another writer's commit invalidated (nothing was committed) is
        recomputed once from the new state; a second conflict is reported (transient).
        """
        try:
            return self._merge_table(table, loaded_through, upto, rebuild)
        except MergeConflictError as exc:
            log.warning("%s; merging %s again", exc, table.qualified)
            return self._merge_table(table, loaded_through, upto, rebuild)

    def _merge_table(
        self, table: SourceTable, loaded_through: str | None, upto: ChangePosition | None, rebuild: bool
    ) -> TableMerge:
        props = dict(self._history(table).properties)
        out = self._merge_increment(table, props, loaded_through, upto, rebuild)
        if out.keyed:
            # The history's properties as read before the merge, with the loaded-through it merged to.
            parked = out.parked is not None or PROP_PARKED in props
            merged = out.merged_through
            current = self._current(table) if merged is None and out.parked is not None else None
            if current is not None:
                # A key change waits for a resync: the current table stays where it was merged.
                merged = table_watermark(current, SUMMARY_MERGED_THROUGH)
            out.consistent_at = table_consistent_at(merged, props.get(PROP_LAST_POSITION), loaded_through, parked)
        return out

    def _merge_increment(
        self,
        table: SourceTable,
        props: dict[str, str],
        loaded_through: str | None,
        upto: ChangePosition | None,
        rebuild: bool,
    ) -> TableMerge:
        from pyspark.sql import functions as F

        out = TableMerge(table.qualified)
        hist = self.names.history(table)
        pk: list[str] = json.loads(props.get(PROP_PRIMARY_KEY, "[]"))
        if not pk:
            out.keyed = False
            out.skipped_reason = "no primary key: history only"
            return out
        if loaded_through is None:
            out.skipped_reason = "nothing loaded yet"
            return out
        cut = ChangePosition.from_token(loaded_through)
        if upto is not None and upto < cut:
            cut = upto
        source_types: dict[str, str] = json.loads(props[PROP_PG_TYPES])
        if any(k not in source_types for k in pk):
            # History holds only changes that carried no columns (deletes of keys it never saw, a
            # late file still to come): no key type to build a current table with, and nothing it
            # would hold. The first change with columns gives the types; the merge then starts
            # from history's beginning, in position order.
            out.skipped_reason = "no key column typed in history yet (only deletes loaded)"
            return out
        cur = self.names.current(table)
        key_changed = self._key_changed(table, pk)
        current = None if key_changed else self._ensure_current(table, cur, pk, source_types)
        # The snapshot the watermark is read from: a direct commit is validated against every
        # commit after it.
        start_snapshot = None if current is None else snapshot_id(current)
        merged = None if current is None else table_watermark(current, SUMMARY_MERGED_THROUGH)
        since = ChangePosition.from_token(merged) if merged else None
        cur_props = {} if current is None else dict(current.properties)
        late_appends = props.get(PROP_LATE_APPENDS, "0")
        if not rebuild and since is not None and late_appends != cur_props.get(PROP_LATE_APPENDS_SEEN, "0"):
            # A landing file arrived after later changes were merged: the LSN guard alone cannot
            # place its changes (TOAST carry-over, deletes), so recompute this table from history.
            rebuild = True
            out.note = "late changes below the merged position: rebuilt from history"
        last = props.get(PROP_LAST_POSITION)
        if not rebuild and not key_changed and since is not None and last is not None and last <= since.token():
            # Nothing appended since the last merge: no Spark job, no commit.
            out.merged_through = merged
            out.parked = self._parked_note(cur_props)
            return out
        hist_snapshot = snapshot_id(self._history(table))
        if rebuild or key_changed:
            since = None
        elif since is not None and since >= cut:
            out.merged_through = merged
            out.parked = self._parked_note(cur_props)
            return out
        if (
            not rebuild
            and not key_changed
            # A table's first state from stream changes too: its current table never committed.
            and (since is not None or start_snapshot is None)
            and self.settings.merge.driver_max_rows > 0
            and self._driver_merge(table, cur, pk, source_types, since, cut, hist_snapshot, start_snapshot, out)
        ):
            return out
        if not rebuild and not key_changed and hist_snapshot is not None and self.settings.merge.driver_max_rows > 0:
            built = self._driver_bulk(table, cur, pk, source_types, since, cut, hist_snapshot, start_snapshot, out)
            if built is not None:
                return built
            if (
                since is None
                and start_snapshot is None
                and self._driver_first_state(table, cur, pk, source_types, cut, hist_snapshot, out)
            ):
                return out
        if hist_snapshot is None:
            inc = self.spark.table(hist)
        else:
            # Read the snapshot the watermark was taken against, not whatever a concurrent load adds.
            # It came from the catalog (pyiceberg): a session whose cached table is older (a load by
            # another process, or on the driver) does not know it until the table is refreshed
            # (fuzz seed 141: "Cannot find snapshot with ID").
            self._refresh(hist)
            inc = self.spark.sql(f"SELECT * FROM {hist} VERSION AS OF {hist_snapshot}")
        inc = inc.where(F.col("pg_lsn") <= cut.commit_lsn).where(position_before_sql("pg_lsn", "pg_seq", cut))
        if since is not None:
            inc = inc.where(position_after_sql("pg_lsn", "pg_seq", since))
        # From here on every name is a lake name (what the tables and their metadata hold).
        lake_pk = [lake_column(k) for k in pk]
        lake_types = {lake_column(c): t for c, t in source_types.items()}
        buckets = None if rebuild or key_changed else self._bucket_spec(cur, lake_pk)
        inc = inc.persist()
        try:
            # One job over the increment: its size, its markers, whether updates left TOAST values
            # out, whether it holds key events at all, and the current table's buckets they touch.
            aggs = [
                F.count(F.lit(1)),
                F.collect_list(
                    F.when(
                        F.col("pg_operation").isin("truncate", "resync", "park"),
                        F.struct("pg_lsn", "pg_seq", "pg_operation", "pg_note"),
                    )
                ),
                # Upserts that may leave a value out (a NULL list, which no loader version writes,
                # counts as "may").
                F.count(
                    F.when(
                        F.col("pg_operation").isin("insert", "update", "read")
                        & (F.col("pg_absent_columns").isNull() | (F.size("pg_absent_columns") > 0)),
                        1,
                    )
                ),
                F.count(F.when(F.col("pg_operation").isin("insert", "update", "read", "delete"), 1)),
            ]
            if buckets is not None:
                aggs += [F.expr(e) for e in touched_buckets_sql(buckets[0], lake_pk[0], lake_types[lake_pk[0]])]
            stats = inc.agg(*aggs).collect()[0]
            touched: tuple[tuple[str, int], list[int | None]] | None = None
            if buckets is not None:
                # collect_set drops NULL: a NULL key (never at the source) would be in no bucket.
                touched = (buckets, [*stats[4], *([None] if stats[5] else [])])
            out.increment_rows = stats[0]
            markers = [Marker(ChangePosition(m[0], m[1]), m[2], m[3] or "") for m in stats[1]]
            plan = plan_markers(markers, cut)
            out.note = "; ".join(n for n in (out.note, plan.note) if n)
            if key_changed:
                # Only a resync after the change (and after every park) tells the rows by the new key.
                if not plan.resynced or plan.parked is not None:
                    out.parked = f"key changed from {key_changed} to {pk}; the current table waits for a resync"
                    out.skipped_reason = "parked: " + out.parked
                    return out
                self.spark.sql(f"DROP TABLE IF EXISTS {cur}")
                self._ensure_current(table, cur, pk, source_types)
                rebuild = True
            if plan.parked is not None:
                out.parked = plan.parked.note or "parked"
            if since is not None and plan.cut <= since:
                out.merged_through = since.token()
                self._after_commit(table, plan, None, late_appends if rebuild else None)
                return out
            if plan.cut < cut:
                inc = inc.where(position_before_sql("pg_lsn", "pg_seq", plan.cut))
            props_out = {SUMMARY_MERGED_THROUGH: plan.cut.token()}
            if hist_snapshot is not None:
                props_out[SUMMARY_HISTORY_SNAPSHOT] = str(hist_snapshot)
            events = inc
            if plan.boundary is not None:
                events = inc.where(position_after_sql("pg_lsn", "pg_seq", plan.boundary))
            bulk = None
            if not rebuild and plan.boundary is not None and _op_at(markers, plan.boundary) == "resync":
                bulk = self._bulk_build(table, inc, plan, lake_pk, list(lake_types), hist_snapshot, out)
            if bulk is not None:
                if bulk.tail_rows == 0:
                    # The snapshot was the whole increment: one commit, the table is done.
                    out.merged_through = plan.cut.token()
                    return out
                # The changes after the snapshot, merged as any increment after `bulk.end` (what a
                # re-run after a crash right here merges too).
                since = bulk.end
                tail_plan = dataclasses.replace(plan, boundary=None, resynced=False)
                if (
                    plan.parked is None
                    and self.settings.merge.driver_max_rows > 0
                    and self._driver_merge(
                        table,
                        cur,
                        pk,
                        source_types,
                        since,
                        plan.cut,
                        hist_snapshot,
                        current_snapshot_id(self.spark, cur),
                        out,
                    )
                ):
                    out.increment_rows = stats[0]
                    out.method = "bulk+driver"
                    return out
                tail = inc.where(position_after_sql("pg_lsn", "pg_seq", since))
                touched_tail = None
                if buckets is not None:
                    hit = tail.agg(
                        *[F.expr(e) for e in touched_buckets_sql(buckets[0], lake_pk[0], lake_types[lake_pk[0]])]
                    )
                    row = hit.collect()[0]
                    touched_tail = (buckets, [*row[0], *([None] if row[1] else [])])
                kind = self._apply(
                    _Apply(
                        table,
                        cur,
                        tail,
                        lake_pk,
                        lake_types,
                        props_out,
                        False,
                        tail_plan,
                        bulk.tail_toast > 0,
                        since,
                        True,
                        touched_tail,
                    ),
                    out,
                )
                out.method = "bulk+merge"
                self._after_commit(table, plan, plan.cut.token(), None, kind, out)
                out.merged_through = plan.cut.token()
                return out
            kind = self._apply(
                _Apply(
                    table,
                    cur,
                    events,
                    lake_pk,
                    lake_types,
                    props_out,
                    rebuild,
                    plan,
                    stats[2] > 0,
                    since,
                    stats[3] > 0,
                    None if rebuild else touched,
                ),
                out,
            )
            out.method = kind
            self._after_commit(table, plan, plan.cut.token(), late_appends if rebuild else None, kind, out)
        finally:
            inc.unpersist()
        out.merged_through = plan.cut.token()
        return out

    def _apply(self, a: _Apply, out: TableMerge) -> str:
        """Commit the increment: "rebuild" (every row rewritten), "merge" (a MERGE ran) or ""
        (nothing to change, the progress recorded)."""
        from pyspark.sql import functions as F

        columns = list(a.pg_types)
        view = f"pg__inc_{a.table.iceberg_name}"
        a.events.createOrReplaceTempView(quote_ident(view))
        events = self.spark.sql(key_events_sql(quote_ident(view), a.pk, a.pg_types, columns))
        if a.toast_updates:
            events = resolve_key_change_toast(self.spark, events, None if a.rebuild else a.cur, a.pk, columns)
        events_view, reduced_view = view + "_events", view + "_reduced"
        events.createOrReplaceTempView(quote_ident(events_view))
        reduced = self.spark.sql(reduce_sql(quote_ident(events_view), a.pk, columns))
        if a.rebuild:
            reduced = reduced.persist()  # counted, then written; the MERGE reads it once
        try:
            reduced.createOrReplaceTempView(quote_ident(reduced_view))
            if a.rebuild:
                out.keys_changed = reduced.count()
                rows = reduced.where(f"{KIND} = 'upsert'").select(
                    *[col(c) for c in columns], *[n for n, _ in CURRENT_METADATA]
                )
                writer = rows.sortWithinPartitions(*[col(k) for k in a.pk]).writeTo(a.cur)
                for k, v in a.commit_props.items():
                    writer = writer.option(f"snapshot-property.{k}", v)
                # One atomic commit replaces every row, whatever the table held.
                writer.overwrite(F.lit(True))
                checkpoint("merge-after-commit")
                return "rebuild"
            boundary = a.plan.boundary
            if not a.key_events and boundary is None:
                self._record_progress(a.cur, a.commit_props)
                return ""
            statement = merge_sql(
                a.cur,
                quote_ident(reduced_view),
                a.pk,
                columns,
                (boundary.commit_lsn, boundary.seq) if boundary is not None else None,
                None
                if a.touched is None or boundary is not None
                else self._bucket_filter(a.touched[0], a.pk, a.touched[1]),
                (a.since.commit_lsn, a.since.seq) if a.since is not None else None,
                all_sent=not a.toast_updates,
            )
            checkpoint("merge-before-commit")
            with_commit_properties(self.spark, a.commit_props, lambda: self.spark.sql(statement))
            checkpoint("merge-after-commit")
            if (
                latest_summary_value(self.spark, a.cur, SUMMARY_MERGED_THROUGH)
                != a.commit_props[SUMMARY_MERGED_THROUGH]
            ):
                # Every matched row was already at or past its event (a replayed increment): the
                # MERGE changed nothing and committed nothing; record the progress explicitly.
                self._record_progress(a.cur, a.commit_props)
            return "merge"
        finally:
            reduced.unpersist()

    def _bulk_build(
        self,
        table: SourceTable,
        inc: DataFrame,
        plan: MergePlan,
        pk: list[str],
        columns: list[str],
        hist_snapshot: int | None,
        out: TableMerge,
    ) -> _Bulk | None:
        """Replace the current table with the rows of the resync at ``plan.boundary``, written once.

        A resync lands its marker and then the table's rows as reads, at one commit position: from
        the marker on, the table's state is those rows, then the changes after them. The rows are
        written over the whole table in one overwrite (no join with the old current table), with
        the watermark at the snapshot's last row, or at ``plan.cut`` when nothing follows it; a
        crash after this commit leaves a table equal to the source there, and the re-run merges
        only the changes after it. None (nothing committed) when the rows at the resync's
        position are not plain reads, every value sent: the MERGE handles those.
        """
        from pyspark.sql import functions as F

        cur = self.names.current(table)
        assert plan.boundary is not None
        at = plan.boundary
        in_snapshot = (F.col("pg_lsn") == at.commit_lsn) & (F.col("pg_seq") > at.seq)
        after = F.col("pg_lsn") > at.commit_lsn
        all_sent = F.col("pg_absent_columns").isNotNull() & (F.size("pg_absent_columns") == 0)
        upsert = F.col("pg_operation").isin("insert", "update", "read")
        rows, last_seq, other, tail, tail_toast = inc.agg(
            F.count(F.when(in_snapshot, 1)),
            F.max(F.when(in_snapshot, F.col("pg_seq"))),
            F.count(F.when(in_snapshot & ~((F.col("pg_operation") == "read") & all_sent), 1)),
            F.count(F.when(after, 1)),
            F.count(F.when(after & upsert & ~all_sent, 1)),
        ).collect()[0]
        if other:
            log.info("%s: the resync at %s holds more than plain reads; merged by MERGE", cur, at)
            return None
        end = ChangePosition(at.commit_lsn, at.seq if last_seq is None else int(last_seq))
        through = plan.cut if tail == 0 else end
        props = {SUMMARY_MERGED_THROUGH: through.token()}
        if hist_snapshot is not None:
            props[SUMMARY_HISTORY_SNAPSHOT] = str(hist_snapshot)
        # The table's write order (and bucket distribution) sorts the rows; no sort of our own.
        writer = (
            inc.where(in_snapshot).select(*[col(c) for c in columns], *[n for n, _ in CURRENT_METADATA]).writeTo(cur)
        )
        for k, v in props.items():
            writer = writer.option(f"snapshot-property.{k}", v)
        checkpoint("merge-before-bulk")
        # One atomic commit replaces every row of every partition, whatever the table held.
        writer.overwrite(F.lit(True))
        checkpoint("merge-after-bulk")
        if latest_summary_value(self.spark, cur, SUMMARY_MERGED_THROUGH) != through.token():
            self._record_progress(cur, props)
        log.info("%s: %d rows of the resync at %s written in bulk, %d changes after it", cur, rows, at, tail)
        out.method = "bulk"
        out.bulk_engine = "spark"
        self._after_commit(table, plan, through.token(), None, "rebuild", out)
        return _Bulk(end, int(tail), int(tail_toast))

    def _driver_bulk(
        self,
        table: SourceTable,
        cur: str,
        pk: list[str],
        source_types: dict[str, str],
        since: ChangePosition | None,
        cut: ChangePosition,
        hist_snapshot: int,
        start_snapshot: int | None,
        out: TableMerge,
    ) -> TableMerge | None:
        """A resync's rows built on the driver (loader.merge.bulk), then what follows them; None
        (nothing committed) when the increment is not a plain snapshot."""
        from loader.merge.bulk import NotPlainBulk, plan_bulk

        def build(hist: Any) -> tuple[BulkPlan, tuple[int, ChangePosition, ChangePosition]]:
            bulk = plan_bulk(hist, hist_snapshot, since, cut, [spark_type(source_types[k]).sql for k in pk])
            if since is not None and bulk.plan.cut <= since:
                raise NotPlainBulk("nothing after the watermark")
            return bulk, self._write_bulk(hist, hist_snapshot, cur, bulk, source_types, pk, start_snapshot)

        built = self._on_driver(table, "bulk build", build)
        if built is None:
            return None
        bulk, (rows, end, through) = built
        log.info(
            "%s: %d rows of the resync at %s written in bulk (driver), %d changes after it",
            cur,
            rows,
            bulk.at,
            bulk.tail_rows,
        )
        out.method = "bulk"
        out.bulk_engine = "driver"
        out.increment_rows = bulk.increment_rows
        out.note = "; ".join(n for n in (out.note, bulk.plan.note) if n)
        self._after_commit(table, bulk.plan, through.token(), None, "rebuild", out)
        out.merged_through = through.token()
        if bulk.tail_rows == 0:
            return out
        # The changes after the snapshot, merged as any increment after `end` (what a re-run
        # after a crash right here merges too).
        current = self._current(table)
        if self._driver_merge(
            table, cur, pk, source_types, end, bulk.plan.cut, hist_snapshot, current and snapshot_id(current), out
        ):
            out.increment_rows = bulk.increment_rows
            out.method = "bulk+driver"
            return out
        rest = self._merge_table(table, self._loaded_token, bulk.plan.cut, False)
        rest.increment_rows = bulk.increment_rows
        rest.method = f"bulk+{rest.method}" if rest.method else "bulk"
        rest.bulk_engine = "driver"
        rest.note = "; ".join(n for n in (out.note, rest.note) if n)
        return rest

    def _driver_first_state(
        self,
        table: SourceTable,
        cur: str,
        pk: list[str],
        source_types: dict[str, str],
        cut: ChangePosition,
        hist_snapshot: int,
        out: TableMerge,
    ) -> bool:
        """A table's first current state from changes alone (a backlog above merge.driver_max_rows,
        no snapshot among them), reduced and written on the driver in bounded memory
        (loader.merge.bulk.first_state_rows), one overwrite commit; False (nothing committed) when
        the changes are not plain."""
        from loader.merge.bulk import BulkPlan, first_state_rows

        plan = MergePlan(cut=cut, boundary=None, parked=None, resynced=False)

        def build(hist: Any) -> tuple[int, tuple[int, ChangePosition, ChangePosition]]:
            pk_types = [source_types[k] for k in pk]
            total, source = first_state_rows(hist, hist_snapshot, cut, [lake_column(k) for k in pk], pk_types)
            bulk = BulkPlan(plan, cut, total, 0, 0)
            return total, self._write_bulk(hist, hist_snapshot, cur, bulk, source_types, pk, None, source)

        built = self._on_driver(table, "first state", build)
        if built is None:
            return False
        total, (rows, _, through) = built
        log.info("%s: first state of %d rows from %d changes written in bulk (driver)", cur, rows, total)
        out.method = "bulk"
        out.bulk_engine = "driver"
        out.note = "; ".join(n for n in (out.note, f"first state from {total} changes") if n)
        out.increment_rows = total
        self._after_commit(table, plan, through.token(), None, "rebuild", out)
        out.merged_through = through.token()
        return True

    def _on_driver(self, table: SourceTable, what: str, build: Callable[[Any], T]) -> T | None:
        """``build(history table)`` (a bulk write on the driver, loader.merge.bulk), or None
        (nothing committed) when it is not plain, or when pyiceberg could not read the warehouse:
        Spark's path reads through S3A, which retries, and reports what persists."""
        from loader.lake.catalog import open_catalog
        from loader.merge.bulk import NotPlainBulk

        try:
            built = build(open_catalog(self.settings).load_table((self.names.history_ns, table.iceberg_name)))
        except NotPlainBulk as exc:
            log.debug("%s: %s not built on the driver (%s)", table.qualified, what, exc)
            return None
        except OSError as exc:
            log.warning("%s: the %s could not read the warehouse (%s); using Spark", table.qualified, what, exc)
            return None
        checkpoint("merge-after-bulk")
        return built

    def _write_bulk(
        self,
        hist: Any,
        hist_snapshot: int,
        cur: str,
        bulk: BulkPlan,
        source_types: dict[str, str],
        pk: list[str],
        start_snapshot: int | None,
        rows_source: Any = None,
    ) -> tuple[int, ChangePosition, ChangePosition]:
        """loader.merge.bulk.write_bulk of the current table ``cur`` with the merge's watermark;
        a table's first state (no snapshot yet) through pyiceberg (write_first_bulk), no JVM."""
        from loader.merge.bulk import write_bulk, write_first_bulk

        columns = [lake_column(c) for c in source_types]
        commit_props = {SUMMARY_HISTORY_SNAPSHOT: str(hist_snapshot)}

        def before_commit() -> None:
            checkpoint("merge-before-bulk")

        if start_snapshot is None:
            # The current table has the history table's name, in the current namespace.
            current = open_catalog(self.settings).load_table((self.names.current_ns, hist.name()[-1]))
            built = write_first_bulk(
                current,
                hist,
                hist_snapshot,
                bulk,
                columns,
                lake_column(pk[0]),
                commit_props,
                SUMMARY_MERGED_THROUGH,
                before_commit=before_commit,
                rows_source=rows_source,
            )
            self._refresh(cur)
            return built
        return write_bulk(
            self.spark,
            hist,
            hist_snapshot,
            cur,
            bulk,
            columns,
            lake_column(pk[0]),
            commit_props,
            SUMMARY_MERGED_THROUGH,
            start_snapshot,
            before_commit=before_commit,
            rows_source=rows_source,
        )

    def _driver_merge(
        self,
        table: SourceTable,
        cur: str,
        pk: list[str],
        source_types: dict[str, str],
        since: ChangePosition | None,
        cut: ChangePosition,
        hist_snapshot: int | None,
        start_snapshot: int | None,
        out: TableMerge,
    ) -> bool:
        """Merge a plain increment on the driver (loader.merge.driver); False if it is not plain.
        ``since`` None: the table's first state (its current table has no snapshot)."""
        from loader.lake.catalog import open_catalog
        from loader.merge.driver import NotPlainIncrement, driver_rows

        lake_pk = [lake_column(k) for k in pk]
        try:
            ends, writes, rows = driver_rows(
                open_catalog(self.settings),
                (self.names.history_ns, table.iceberg_name),
                (self.names.current_ns, table.iceberg_name),
                lake_pk,
                {lake_column(c): t for c, t in source_types.items()},
                since,
                cut,
                hist_snapshot,
                start_snapshot,
                self.settings.merge.driver_max_rows,
            )
        except NotPlainIncrement as exc:
            log.debug("%s: merged by Spark (%s)", table.qualified, exc)
            return False
        except OSError as exc:
            # The warehouse did not answer pyiceberg's reads: Spark's path reads through S3A,
            # which retries, and reports what persists.
            log.warning(
                "%s: the driver merge could not read the warehouse (%s); merging with Spark", table.qualified, exc
            )
            return False
        commit_props = {SUMMARY_MERGED_THROUGH: cut.token(), SUMMARY_HISTORY_SNAPSHOT: str(hist_snapshot)}
        done = commit_rows(self.spark, cur, ends, writes, lake_pk, commit_props, start_snapshot)
        checkpoint("merge-after-commit")
        log.info("%s: %d rows ended, %d written, %d files (driver)", cur, done.deleted, done.written, done.files)
        out.increment_rows = rows
        out.method = "driver"
        plan = MergePlan(cut=cut, boundary=None, parked=None, resynced=False)
        self._after_commit(table, plan, cut.token(), None, "merge", out)
        out.merged_through = cut.token()
        return True

    def _key_changed(self, table: SourceTable, pk: list[str]) -> list[str] | None:
        """The current table's key when it differs from history's (the source key changed), else None."""
        current = self._current(table)
        if current is None:
            return None
        have = json.loads(current.properties.get(PROP_PRIMARY_KEY, "[]"))
        return have if have and have != pk else None

    @staticmethod
    def _parked_note(cur_props: dict[str, str]) -> str | None:
        raw = cur_props.get(PROP_PARKED)
        return json.loads(raw).get("reason") if raw else None

    def _after_commit(
        self,
        table: SourceTable,
        plan: MergePlan,
        merged_through: str | None,
        late_seen: str | None,
        kind: str = "",
        out: TableMerge | None = None,
    ) -> None:
        """One property commit after the data commit: the watermark again (see loader.lake.iceberg), the
        commit time it stands for, the late appends a rebuild covered, the park (status reads it)
        and the merges since the last compaction; then the compaction when it is due."""
        cur = self.names.current(table)
        current = open_catalog(self.settings).load_table((self.names.current_ns, table.iceberg_name))
        props = current.properties
        update: dict[str, str] = {}
        remove: list[str] = []
        every = self.settings.merge.compact_every
        # Tables start counting at different offsets, so their compactions fall in different cycles.
        start = str(zlib.crc32(cur.encode()) % every) if every > 0 else "0"
        due = False
        if kind == "rebuild":
            update[PROP_MERGES_SINCE_COMPACTION] = start
        elif kind == "merge":
            merges = int(props.get(PROP_MERGES_SINCE_COMPACTION, start)) + 1
            # When due, the count stays below `every` until the compaction has committed, so a
            # compaction that fails is tried again by the next merge.
            due = 0 < every <= merges
            if not due:
                update[PROP_MERGES_SINCE_COMPACTION] = str(merges)
        if merged_through is not None:
            update[SUMMARY_MERGED_THROUGH] = merged_through
            if self._loaded_ts and plan.parked is None and merged_through >= (self._loaded_token or "~"):
                update[PROP_MERGED_THROUGH_TS] = self._loaded_ts
        if late_seen is not None:
            update[PROP_LATE_APPENDS_SEEN] = late_seen
        if plan.parked is not None:
            update[PROP_PARKED] = json.dumps({"since": plan.parked.position.token(), "reason": plan.parked.note})
        elif PROP_PARKED in props:
            remove.append(PROP_PARKED)
        update = {k: v for k, v in update.items() if props.get(k) != v}
        if update or remove:
            set_properties(current, update, remove)
            self._refresh(cur)
        if due:
            self._compact(table, cur, out)

    def _compact_on_driver(self, table: SourceTable, cur: str, summary: dict[str, str]) -> tuple[int, int] | None:
        """A current table of at most ``merge.driver_max_rows`` rows rewritten whole on the driver
        (its rows read with pyiceberg, deletes applied; loader.merge.bulk.current_state_rows) in one
        overwrite validated against every commit since the snapshot read, its watermark as it
        was: (data files before, after), or None (nothing committed) for a table Spark's
        procedure compacts. A Spark job costs a second or two for any table, which follow mode
        paid in the cycle of every small table's compaction."""
        from loader.merge.bulk import BulkPlan, NotPlainBulk, current_state_rows, write_bulk

        limit = self.settings.merge.driver_max_rows
        try:
            records = int(summary["total-records"])
            files = int(summary["total-data-files"])
        except (KeyError, ValueError):
            return None
        if not limit or records > limit or int(summary.get("total-equality-deletes", "0")):
            return None
        current = open_catalog(self.settings).load_table((self.names.current_ns, table.iceberg_name))
        snap = current.current_snapshot()
        through = table_watermark(current, SUMMARY_MERGED_THROUGH)
        pk = [lake_column(k) for k in json.loads(current.properties.get(PROP_PRIMARY_KEY, "[]"))]
        if snap is None or through is None or not pk:
            return None
        cut = ChangePosition.from_token(through)
        bulk = BulkPlan(MergePlan(cut, None, None, False), cut, records, 0, 0)
        props = {}
        if (history_snapshot := latest_summary(current, SUMMARY_HISTORY_SNAPSHOT)) is not None:
            props[SUMMARY_HISTORY_SNAPSHOT] = history_snapshot
        try:
            write_bulk(
                self.spark,
                None,
                0,
                cur,
                bulk,
                [],
                pk[0],
                props,
                SUMMARY_MERGED_THROUGH,
                snap.snapshot_id,
                rows_source=current_state_rows(current, snap.snapshot_id, pk),
            )
        except NotPlainBulk as exc:
            log.debug("%s: not compacted on the driver (%s)", cur, exc)
            return None
        except OSError as exc:
            log.warning("%s: the compaction could not read the warehouse (%s); using Spark", cur, exc)
            return None
        self._refresh(cur)
        after = iceberg_table(self.spark, cur).currentSnapshot()
        return files, int(java_map(self.spark, after.summary()).get("total-data-files", "0"))

    def _compact(self, table: SourceTable, cur: str, out: TableMerge | None) -> None:
        """Compact the current table (loader.merge.plan.plan_compaction): once enough of its rows
        are deleted, its data files rewritten with their deletes applied (what ``loader
        maintain`` does to it, without expiry); before that, its small files combined and its
        delete files rewritten into one per bucket. Either way the files later merges read stop
        piling up, and only the full rewrite costs the table's size."""
        checkpoint("merge-before-compaction")
        snap = iceberg_table(self.spark, cur).currentSnapshot()
        summary = java_map(self.spark, snap.summary()) if snap is not None else {}
        m = self.settings
        on_driver = self._compact_on_driver(table, cur, summary)
        if on_driver is not None:
            kind, reason, done = "rewritten on the driver", "", f"{on_driver[0]} data files -> {on_driver[1]}"
        else:
            plan = plan_compaction(
                summary, m.merge.key_buckets, m.merge.compact_deleted_ratio, m.maintenance.target_file_mb << 20
            )
            if plan.full:
                rep = rewrite_data_files(self.spark, m, f"current {cur}", cur, "deletes")
                deletes = f"{rep.removed_delete_files} delete files removed"
            else:
                rep = rewrite_data_files(
                    self.spark, m, f"current {cur}", cur, "binpack", small_file_bytes=plan.small_file_bytes
                )
                checkpoint("merge-between-compactions")
                before, after = rewrite_position_deletes(self.spark, m, cur)
                deletes = f"{before} delete files -> {after}"
            kind = "all data files with deletes" if plan.full else "small data files"
            reason, done = f"; {plan.reason}", f"{rep.rewritten_files} data files -> {rep.added_files}, {deletes}"
        update_properties(self.spark, cur, {PROP_MERGES_SINCE_COMPACTION: "0"})
        log.info("compacted %s (%s%s): %s", cur, kind, reason, done)
        if out is not None:
            note = f"compacted ({kind}): {done}"
            out.note = "; ".join(n for n in (out.note, note) if n)

    def _bucket_spec(self, cur: str, pk: list[str]) -> tuple[str, int] | None:
        """(``catalog.system.bucket(N, {col})`` template, N) when the current table is partitioned
        by bucket(N, first key column) only, else None."""
        table = iceberg_table(self.spark, cur)
        fields = table.spec().fields()  # a Java list: size() and get(), no py4j iteration
        if fields.size() != 1 or table.schema().findColumnName(fields.get(0).sourceId()) != pk[0]:
            return None
        m = re.fullmatch(r"bucket\[(\d+)\]", str(fields.get(0).transform().toString()))
        if not m:
            return None
        return f"{quote_ident(self.names.catalog)}.system.bucket({int(m.group(1))}, {{col}})", int(m.group(1))

    @staticmethod
    def _bucket_filter(spec: tuple[str, int], pk: list[str], hit: list[int | None]) -> str | None:
        """``bucket(N, key) IN (...)`` over the buckets the increment touches, or None if it is all.

        The current table is partitioned by bucket(N, first key column); with the predicate in
        the MERGE condition, Iceberg plans only those partitions' data and delete files.
        """
        fn, n = spec
        if not hit or len(hit) >= n or any(b is None for b in hit):
            return None
        return f"{fn.format(col='t.' + col(pk[0]))} IN ({', '.join(str(b) for b in sorted(int(b) for b in hit if b is not None))})"

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

    def _ensure_current(self, table: SourceTable, cur: str, pk: list[str], pg_types: dict[str, str]) -> Any:
        """Create or evolve the current table; ``pk`` and ``pg_types`` by source names, as history
        keeps them. Returns it (pyiceberg's). Created with pyiceberg as Spark's DDL would
        (``create_source_table``: tests/load/test_table_creation.py holds them equal); evolved
        with Spark's DDL."""
        current = self._current(table)
        if current is None:
            props = {
                **CURRENT_TABLE_PROPERTIES,
                PROP_SOURCE_TABLE: table.qualified,
                PROP_PRIMARY_KEY: json.dumps(pk),
                PROP_PG_TYPES: json.dumps(pg_types),
            }
            ident = (self.names.current_ns, table.iceberg_name)
            with warehouse_answers(f"creating {cur}", "re-run 'loader merge' once the warehouse answers"):
                return create_table(
                    open_catalog(self.settings),
                    ident,
                    source_columns(pg_types, CURRENT_METADATA),
                    props,
                    None,
                    [lake_column(k) for k in pk],
                    default_location(self.settings.catalog.warehouse, *ident),
                    bucket=(lake_column(pk[0]), self.settings.merge.key_buckets),
                )
        have: dict[str, str] = json.loads(current.properties.get(PROP_PG_TYPES, "{}"))
        if have == pg_types:
            return current
        schema = iceberg_table(self.spark, cur).schema()
        for name, pg_type in pg_types.items():
            lake = lake_column(name)
            new_sql = spark_type(pg_type).sql
            if name not in have:
                if schema.findField(lake) is None:
                    self.spark.sql(f"ALTER TABLE {cur} ADD COLUMN {col(lake)} {new_sql}")
            elif spark_type(have[name]).sql != new_sql:
                if can_widen(spark_type(have[name]).sql, new_sql):
                    self.spark.sql(f"ALTER TABLE {cur} ALTER COLUMN {col(lake)} TYPE {new_sql}")
                else:
                    # An incompatible retype: history retired the old column and parked the table,
                    # so every row of this column is rewritten by the resync that unparks it. Two
                    # schema commits: a run killed between them left the column dropped (and the
                    # types property old), so the drop is for a column that is there.
                    if schema.findField(lake) is not None:
                        self.spark.sql(f"ALTER TABLE {cur} DROP COLUMN {col(lake)}")
                    self.spark.sql(f"ALTER TABLE {cur} ADD COLUMN {col(lake)} {new_sql}")
        update_properties(self.spark, cur, {PROP_PG_TYPES: json.dumps(pg_types)})
        return self._current(table)


def _op_at(markers: list[Marker], position: ChangePosition) -> str | None:
    """The operation of the control row at ``position`` (the newest one there, if several)."""
    ops = [m.op for m in sorted(markers) if m.position == position]
    return ops[-1] if ops else None


@dataclass(frozen=True)
class _Bulk:
    """A resync's rows committed in bulk: through which position, and what follows them."""

    end: ChangePosition  # the snapshot's last row (the bulk commit's watermark when changes follow)
    tail_rows: int  # history rows after the snapshot in the increment
    tail_toast: int  # upserts among them that may leave a value out


@dataclass
class _Apply:
    """Everything one table's MERGE (or rebuild) needs, decided before it runs."""

    table: SourceTable
    cur: str
    events: DataFrame
    pk: list[str]
    pg_types: dict[str, str]
    commit_props: dict[str, str]
    rebuild: bool
    plan: MergePlan
    toast_updates: bool
    since: ChangePosition | None
    key_events: bool  # the increment holds inserts, updates or deletes (else only markers)
    # ((bucket template, N), buckets the key events touch) when the current table is bucketed by the key
    touched: tuple[tuple[str, int], list[int | None]] | None = None
