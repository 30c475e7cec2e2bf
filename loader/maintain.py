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

    def summary(self) -> str:
        return "maintenance: " + ("; ".join(t.line() for t in self.tables) if self.tables else "no tables")


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
        with stage_lock(self.settings, "merge"):
            for t in selected:
                cur = self.names.current(t)
                if self.spark.catalog.tableExists(cur):
                    report.tables.append(self._table(f"current {t.qualified}", cur, "deletes", None, expire, orphans))
        return report

    def _history(self, t: SourceTable, expire: bool, orphans: bool) -> TableReport:
        return self._table(
            f"history {t.qualified}",
            self.names.history(t),
            "sort",
            "pg_lsn ASC NULLS LAST, pg_seq ASC NULLS LAST",
            expire,
            orphans,
        )

    def _table(
        self, label: str, ident: str, mode: str, sort_order: str | None, expire: bool, orphans: bool
    ) -> TableReport:
        m = self.settings.maintenance
        rep = rewrite_data_files(self.spark, self.settings, label, ident, mode, sort_order)
        call = f"{quote_name(self.names.catalog)}.system"
        target = procedure_table_arg(ident, self.names.catalog)
        self.spark.sql(f"CALL {call}.rewrite_manifests(table => {target})").collect()
        if expire:
            # Measured at the call: this run's own rewrite commits count as they should. Microseconds
            # matter: cut to the second, a retention of 0 kept every snapshot of the last second
            # (this run's rewrite commits), found by the soak test.
            older = datetime.now(UTC) - timedelta(hours=m.snapshot_retention_hours)
            row = self.spark.sql(
                f"CALL {call}.expire_snapshots(table => {target}, "
                f"older_than => TIMESTAMP '{older:%Y-%m-%d %H:%M:%S.%f}', "
                f"retain_last => {int(m.retain_last)})"
            ).collect()
            if row:
                # One manifest list per snapshot: the lists deleted are the snapshots expired.
                rep.expired_snapshots = int(field_or(row[0], "deleted_manifest_lists_count", 0) or 0)
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
