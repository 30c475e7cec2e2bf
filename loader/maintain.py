"""Table maintenance (``loader maintain``, and follow mode's periodic policy), via Iceberg's procedures.

- history tables: small files compacted by a *sort* rewrite on ``(pg_lsn, pg_seq)``, so each file
  still covers a narrow LSN range (what prunes the merge's increment reads);
- current tables (merge-on-read): data files rewritten with their deletes applied, dangling deletes
  removed, so reads stop paying for every MERGE's delete files;
- the loader's own tables (ledger, rejects): compacted;
- every table: snapshots older than ``maintenance.snapshot_retention_hours`` expired (the newest
  ``retain_last`` kept), manifests rewritten, files no snapshot references and older than
  ``maintenance.orphan_older_than_hours`` removed.

Watermarks survive all of it (they are table properties, see loader.lake.iceberg); the merge's late-file
detection is a counter property, not a walk over snapshots. History compaction takes the load
lock and current-table work the merge lock, so it never races the loader's own commits; maintenance
by someone else (these procedures run by hand, pyiceberg, a managed service) is safe too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from loader.config import LoaderSettings
from loader.lake.iceberg import delete_orphan_files, history_tables, iceberg_table
from loader.lake.procedures import TableReport, field_or, procedure_table_arg, quote_name, rewrite_data_files
from loader.lake.tables import SourceTable, TableNames
from loader.locks import stage_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.maintain")


@dataclass
class MaintenanceReport:
    tables: list[TableReport] = field(default_factory=list)
    landing_retired: int = 0  # landing files retired (loaded, older than landing.retention_hours)
    landing_retired_through: str | None = None

    def summary(self) -> str:
        """One short line of totals (every table's figures: --json, and the log at INFO)."""
        if not self.tables:
            return "maintenance: no tables"
        t = self.tables
        text = (
            f"maintenance: {len(t)} tables, {sum(r.rewritten_files for r in t)} files rewritten into "
            f"{sum(r.added_files for r in t)}, {sum(r.removed_delete_files for r in t)} delete files removed, "
            f"{sum(r.expired_snapshots for r in t)} snapshots expired, {sum(r.orphans_removed for r in t)} orphans removed"
        )
        if self.landing_retired:
            text += f"; {self.landing_retired} landing files retired (through {self.landing_retired_through})"
        return text


class Maintenance:
    def __init__(self, spark: SparkSession, settings: LoaderSettings, now: datetime | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)
        self.now = now or datetime.now(UTC)

    def run(self, tables: list[str] | None = None, expire: bool = True, orphans: bool = True) -> MaintenanceReport:
        report = MaintenanceReport()
        selected = [t for t in history_tables(self.spark, self.names) if not tables or t.qualified in tables]
        with stage_lock(self.settings, "load"):
            for t in selected:
                report.tables.append(self._history(t, expire, orphans))
            if not tables:
                for ident in (self.names.ledger, self.names.rejects):
                    report.tables.append(self._table(ident, ident, "binpack", None, expire, orphans))
                self._retire_landing(report)
        with stage_lock(self.settings, "merge"):
            for t in selected:
                cur = self.names.current(t)
                if self.spark.catalog.tableExists(cur):
                    report.tables.append(self._table(f"current {t.qualified}", cur, "deletes", None, expire, orphans))
        return report

    def expire(self, tables: list[str], ledger: bool) -> MaintenanceReport:
        """Snapshot expiry alone (no compaction, manifests or orphans) on the history and current
        tables of ``tables`` (qualified source names, as results give them: matched against the
        lake's history tables, so a dot inside a name cannot split it wrongly), and the ledger when
        ``ledger``: follow mode's step for the tables it has committed to many times since their
        last expiry, so ``max_snapshots`` holds between its maintenance runs, not only at them."""
        report = MaintenanceReport()
        wanted = set(tables)
        selected = [t for t in history_tables(self.spark, self.names) if t.qualified in wanted] if wanted else []
        with stage_lock(self.settings, "load"):
            for t in selected:
                report.tables.append(self._expired(f"history {t.qualified}", self.names.history(t)))
            if ledger:
                report.tables.append(self._expired(self.names.ledger, self.names.ledger))
        with stage_lock(self.settings, "merge"):
            for t in selected:
                cur = self.names.current(t)
                if self.spark.catalog.tableExists(cur):
                    report.tables.append(self._expired(f"current {t.qualified}", cur))
        return report

    def _expired(self, label: str, ident: str) -> TableReport:
        rep = TableReport(label)
        rep.expired_snapshots = self._expire(ident)
        log.info("expired %s: %d snapshots", label, rep.expired_snapshots)
        return rep

    def _retire_landing(self, report: MaintenanceReport) -> None:
        """Delete landing files that history holds (in the ledger, at or below loaded-through) and
        that were loaded more than ``landing.retention_hours`` ago; never a file of an unfinished
        snapshot. The horizon is recorded first, so replay refuses what is gone."""
        from loader.lake.iceberg import table_properties
        from loader.lake.tables import SUMMARY_LOADED_THROUGH, newest_position
        from loader.landing.state import RETENTION_STATE, unfinished_snapshot
        from loader.landing.store import open_landing
        from loader.lsn import ChangePosition

        hours = self.settings.landing.retention_hours
        if hours is None:
            return
        store = open_landing(self.settings)
        if unfinished_snapshot(store) is not None:
            return  # a snapshot in progress: its files wait for the load
        loaded = newest_position(table_properties(self.spark, self.names.ledger).get(SUMMARY_LOADED_THROUGH))
        if loaded is None:
            return
        through = ChangePosition.from_token(loaded)
        cutoff = (self.now - timedelta(hours=hours)).replace(tzinfo=None)
        old = {
            r[0]
            for r in self.spark.sql(
                f"SELECT file FROM {self.names.ledger} WHERE loaded_at < TIMESTAMP '{cutoff.isoformat(sep=' ')}'"
            ).collect()
        }
        retire = [f for f in store.files() if f.name in old and f.last <= through]
        if not retire:
            return
        horizon = max(f.last for f in retire)
        state = store.read_state(RETENTION_STATE) or {}
        if not state.get("retired_through") or state["retired_through"] < horizon.token():
            store.write_state(RETENTION_STATE, {"retired_through": horizon.token()})
        for f in retire:
            store.delete(f.name)
        report.landing_retired = len(retire)
        report.landing_retired_through = str(horizon)

    def _history(self, t: SourceTable, expire: bool, orphans: bool) -> TableReport:
        return self._table(
            f"history {t.qualified}",
            self.names.history(t),
            "sort",
            "pg_lsn ASC NULLS LAST, pg_seq ASC NULLS LAST",
            expire,
            orphans,
        )

    def _expire_before(self, ident: str, times: list[int] | None = None) -> datetime:
        """Snapshots committed before this are expired: those past ``snapshot_retention_hours``,
        and beyond the newest ``max_snapshots`` those older than ``snapshot_min_age_minutes``."""
        m = self.settings.maintenance
        now = datetime.now(UTC)
        older = now - timedelta(hours=m.snapshot_retention_hours)
        if m.max_snapshots is None:
            return older
        # The newest snapshot beyond the cap's (epoch microseconds: no session time zone involved).
        if times is not None:
            if len(times) <= m.max_snapshots:
                return older
            at = times[m.max_snapshots] * 1000
        else:
            row = self.spark.sql(
                f"SELECT unix_micros(committed_at) AS at FROM {ident}.snapshots"
                f" ORDER BY committed_at DESC LIMIT 1 OFFSET {int(m.max_snapshots)}"
            ).collect()
            if not row:
                return older
            at = int(row[0]["at"])
        # Expiry takes snapshots committed strictly before the bound, in milliseconds (Iceberg's
        # snapshot times): this one and all before it.
        beyond_cap = datetime.fromtimestamp(0, UTC) + timedelta(microseconds=at + 1000)
        return max(older, min(beyond_cap, now - timedelta(minutes=m.snapshot_min_age_minutes)))

    def _snapshot_times(self, ident: str) -> list[int] | None:
        """The commit times (epoch milliseconds) of ``ident``'s snapshots, newest first, from its
        metadata through pyiceberg (no Spark job); None where pyiceberg does not load it."""
        from loader.lake.catalog import open_catalog

        parts = self.names.parts(ident)
        if parts is None:
            return None
        try:
            table = open_catalog(self.settings).load_table(parts)
        except Exception as exc:  # Spark's path decides, and reports what persists
            log.debug("%s: snapshot times not read with pyiceberg (%s)", ident, exc)
            return None
        return sorted((s.timestamp_ms for s in table.metadata.snapshots), reverse=True)

    def _expire(self, ident: str) -> int:
        """Expire ``ident``'s snapshots before :meth:`_expire_before`; the number expired. No
        Spark job when no snapshot is that old (follow mode asks after every quarter of
        ``max_snapshots`` commits of a busy table, when its snapshots are usually all younger
        than ``snapshot_min_age_minutes``: two Spark jobs a table that expired nothing stalled a
        cycle for 1-1.5 s a table)."""
        # Measured at the call: this run's own rewrite commits count as they should. Microseconds
        # matter: cut to the second, a retention of 0 kept every snapshot of the last second
        # (this run's rewrite commits), found by the soak test.
        times = self._snapshot_times(ident)
        older = self._expire_before(ident, times)
        if times is not None and (not times or times[-1] * 1000 >= older.timestamp() * 1_000_000):
            return 0  # nothing committed before the bound: nothing to expire (and no file to delete)
        row = self.spark.sql(
            f"CALL {quote_name(self.names.catalog)}.system.expire_snapshots("
            f"table => {procedure_table_arg(ident, self.names.catalog)}, "
            f"older_than => TIMESTAMP '{older:%Y-%m-%d %H:%M:%S.%f}', "
            f"retain_last => {int(self.settings.maintenance.retain_last)})"
        ).collect()
        # One manifest list per snapshot: the lists deleted are the snapshots expired.
        return int(field_or(row[0], "deleted_manifest_lists_count", 0) or 0) if row else 0

    def _table(
        self, label: str, ident: str, mode: str, sort_order: str | None, expire: bool, orphans: bool
    ) -> TableReport:
        m = self.settings.maintenance
        rep = rewrite_data_files(self.spark, self.settings, label, ident, mode, sort_order)
        call = f"{quote_name(self.names.catalog)}.system"
        target = procedure_table_arg(ident, self.names.catalog)
        self.spark.sql(f"CALL {call}.rewrite_manifests(table => {target})").collect()
        if expire:
            rep.expired_snapshots = self._expire(ident)
        if orphans:
            older = datetime.now(UTC) - timedelta(hours=m.orphan_older_than_hours)
            rep.orphans_removed = delete_orphan_files(self.spark, ident, older)
        summary = iceberg_table(self.spark, ident).currentSnapshot()
        if summary is not None:
            s = summary.summary()
            rep.data_files = int(s.get("total-data-files") or 0)
            rep.delete_files = int(s.get("total-delete-files") or 0)
        log.info("maintained %s", rep.line())
        return rep
