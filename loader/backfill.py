"""Backfills: replay an LSN range from the landing area, rebuild a current table as of a point, and
the time-travel SQL (a table as of a source commit time).

- ``replay``: the landing files covering ``[from, to]`` (by commit LSN) are loaded again, keeping
  only changes in that range (and of the given tables). History's exactly-once append makes it a
  no-op for every change already there; changes that were missing (a damaged file restored, a
  gap) are appended, and the tables that got any are rebuilt from history by their next merge,
  which ``replay`` runs. Erased subjects stay erased (the load filters them).
- ``rebuild``: a current table recomputed from history as of an LSN (every transaction committed at
  or before it) or as of a source commit timestamp, in one atomic overwrite.
- ``as_of_sql``: SQL any engine on the catalog can run for "current as of T" (from dbt's SCD2 table)
  and "history up to T".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from loader.config import LoaderSettings
from loader.errors import ConfigError, UsageError
from loader.lake.catalog import lake_source_table
from loader.lake.tables import SourceTable, TableNames
from loader.lake.types import quote_ident, sql_string
from loader.landing.store import LandingFile, LandingStore, open_landing
from loader.lsn import ChangePosition, format_lsn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class ReplayResult:
    from_lsn: int
    to_lsn: int
    dry_run: bool
    files: list[str] = field(default_factory=list)
    changes_in_range: dict[str, int] = field(default_factory=dict)  # dry run: per table, from the files
    appended: dict[str, int] = field(default_factory=dict)
    already_in_history: int = 0
    rebuilt: list[str] = field(default_factory=list)

    def summary(self) -> str:
        span = f"{format_lsn(self.from_lsn)}..{format_lsn(self.to_lsn)}"
        if self.dry_run:
            per = ", ".join(f"{t}={n}" for t, n in sorted(self.changes_in_range.items())) or "none"
            return f"replay {span} (dry run): {len(self.files)} landing files, changes in range: {per}"
        per = ", ".join(f"{t}={n}" for t, n in sorted(self.appended.items())) or "nothing"
        return (
            f"replay {span}: {len(self.files)} landing files; appended {per}; {self.already_in_history} changes were "
            f"already in history" + (f"; rebuilt {', '.join(self.rebuilt)}" if self.rebuilt else "")
        )


def parse_time(text: str) -> datetime:
    """A source commit time as users type it: ISO 8601 (``2026-01-31``, ``2026-01-31 12:00:00+00``,
    ``2026-01-31T12:00Z``), with or without a zone (UTC when none). ValueError for anything else."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a time (ISO 8601, e.g. 2026-01-31 12:00:00+00)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)


def time_literal(when: datetime) -> str:
    """SQL for an instant, the same on every engine whatever its session time zone."""
    return f"CAST({sql_string(when.astimezone(UTC).isoformat(sep=' '))} AS TIMESTAMP)"


def files_for_range(store: LandingStore, from_lsn: int, to_lsn: int) -> list[LandingFile]:
    """Landing files holding any change of a transaction committed in ``[from_lsn, to_lsn]``."""
    return [f for f in store.files() if f.last.commit_lsn >= from_lsn and f.first.commit_lsn <= to_lsn]


def range_filter(from_lsn: int, to_lsn: int, tables: list[SourceTable] | None) -> str:
    """Decoded-row filter of a replay (whole transactions: the range is by commit LSN)."""
    cond = f"(commit_lsn IS NULL OR commit_lsn BETWEEN {int(from_lsn)} AND {int(to_lsn)})"
    if tables:
        pairs = " OR ".join(
            f"(src_schema = {sql_string(t.schema)} AND src_table = {sql_string(t.table)})" for t in tables
        )
        cond += f" AND ({pairs})"
    return cond


class Backfill:
    def __init__(self, spark: SparkSession, settings: LoaderSettings, store: LandingStore | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)
        self.store = store or open_landing(settings)

    def replay(
        self, from_lsn: int, to_lsn: int, tables: list[str] | None = None, dry_run: bool = False
    ) -> ReplayResult:
        from loader.load.history import HistoryLoad
        from loader.merge.current import CurrentMerge

        if to_lsn < from_lsn:
            raise UsageError("--to-lsn is before --from-lsn", hint="give the range in commit order")
        selected = [lake_source_table(self.settings, t) for t in tables] if tables else None
        from loader.landing.state import RETENTION_STATE

        retired = (self.store.read_state(RETENTION_STATE) or {}).get("retired_through")
        if retired and from_lsn <= ChangePosition.from_token(retired).commit_lsn:
            raise UsageError(
                f"landing files through {ChangePosition.from_token(retired)} were retired "
                f"(landing.retention_hours): a replay can begin only after that position",
                hint="replay a later range, or rebuild a current table from history with 'loader backfill rebuild-current'",
            )
        files = files_for_range(self.store, from_lsn, to_lsn)
        out = ReplayResult(from_lsn, to_lsn, dry_run, files=[f.name for f in files])
        load = HistoryLoad(self.spark, self.settings, self.store).replay(
            files, range_filter(from_lsn, to_lsn, selected), dry_run=dry_run
        )
        if dry_run:
            out.changes_in_range = load.rows_per_table
            return out
        out.appended = {t: n for t, n in load.rows_per_table.items() if n}
        out.already_in_history = load.duplicates_skipped
        if out.appended:
            merge = CurrentMerge(self.spark, self.settings).run(sorted(out.appended))
            out.rebuilt = sorted(t.table for t in merge.tables if "rebuilt" in t.note)
        return out

    def position_at(self, table: str, timestamp: datetime) -> ChangePosition:
        """The end of the last transaction of ``table``'s history committed at or before ``timestamp``."""
        hist = self.names.history(lake_source_table(self.settings, table))
        row = self.spark.sql(
            f"SELECT max(pg_lsn) FROM {hist} WHERE pg_txn_timestamp <= {time_literal(timestamp)}"
        ).collect()[0]
        if row[0] is None:
            raise ConfigError(f"{table} has no change committed at or before {timestamp}", hint="pick a later time")
        return ChangePosition.end_of(int(row[0]))


def as_of_sql(settings: LoaderSettings, table: str, timestamp: datetime) -> dict[str, str]:
    """SQL for ``table`` as of a source commit time: its current rows then, and its history up to then.

    The current rows come from dbt's exact SCD2 table (``loader dbt build`` makes it): the version of
    each key valid at the time. Ties of commit timestamps are resolved by commit order.
    """
    from loader.dbtgen import model_name

    c = settings.catalog
    t = lake_source_table(settings, table)
    name = t.iceberg_name
    ts = time_literal(timestamp)
    scd2 = ".".join(quote_ident(p) for p in (c.name, settings.dbt.analytics_namespace, model_name(name) + "__scd2"))
    hist = ".".join(quote_ident(p) for p in (c.name, c.history_namespace, name))
    return {
        "current": f"SELECT * FROM {scd2} WHERE valid_from <= {ts} AND (valid_to IS NULL OR valid_to > {ts})",
        "history": (
            f"SELECT * FROM {hist} WHERE pg_txn_timestamp <= {ts} "
            "AND pg_operation IN ('insert', 'update', 'delete', 'read', 'truncate', 'resync') ORDER BY pg_lsn, pg_seq"
        ),
    }
