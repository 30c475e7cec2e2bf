"""The history load: pending landing files -> Iceberg history tables, exactly once.

Exactly-once effect without a distributed transaction:
- files are taken in commit order up to the last one that ends on a commit, so history only
  ever holds whole transactions;
- each table's rows are appended with an anti-join on (pg_lsn, pg_seq) against the history
  files that can hold that LSN range (min/max pruning on the sorted pg_lsn column), and the
  append's snapshot summary carries the loaded-through position;
- the ledger (``loader.landing_files``) is appended last. A crash anywhere before it makes the
  re-run load the same files again, and the anti-join turns that into a no-op per table;
- only one load runs at a time per catalog (``loader.locks``).

Isolation: what goes wrong with one table stays with that table. A change that cannot be decoded
or typed goes to the rejects table and a ``park`` row is appended to its history at the start of
its transaction (in a snapshot, right after the table's rows of it: ``park_seq``); a damaged file parks the tables that lost changes; an incompatible retype retires
the old column and parks. Parked current tables stop at the park (see loader.merge) until a
resync of the table; every other table keeps advancing.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any, TypeVar

from loader.config import LoaderSettings
from loader.faults import checkpoint
from loader.lake.commits import OwnFile, ensure_loader_tables
from loader.lake.iceberg import (
    create_source_table,
    current_snapshot_id,
    iceberg_table,
    table_exists,
    table_properties,
    update_properties,
    watermark,
)
from loader.lake.tables import (
    HISTORY_METADATA,
    LEDGER_NAME,
    PROP_DROPPED_COLUMNS,
    PROP_LAST_POSITION,
    PROP_LATE_APPENDS,
    PROP_LOADED_THROUGH_TS,
    PROP_PARKED,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    PROP_RETIRED_COLUMNS,
    PROP_SOURCE_TABLE,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SUMMARY_MIN_POSITION,
    SourceTable,
    TableNames,
    newest_position,
    source_columns,
)
from loader.lake.types import quote_ident, spark_type, sql_string
from loader.landing.store import LandingFile, LandingStore, name_last_token, open_landing
from loader.load.decode import CHANGE_ROW_DDL, make_decoder, park_row, repair_hint
from loader.load.evolution import plan_evolution, retired_name
from loader.load.kernel import misfit_park_note
from loader.load.result import LoadResult
from loader.load.sql import LINE, RAW, REASON, HistoryColumn, rejects_select
from loader.load.staging import Committer, Pending, Staged
from loader.load.survey import PARK, BatchSurvey, survey
from loader.lsn import ChangePosition
from loader.names import lake_column
from loader.progress import each_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from loader.load.driver import TextGroup

T = TypeVar("T")

log = logging.getLogger("loader.load")


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


class HistoryLoad:
    """Load every pending landing file into history tables."""

    def __init__(self, spark: SparkSession, settings: LoaderSettings, store: LandingStore | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.store = store or open_landing(settings)
        self.names = TableNames(settings)
        self._newest_ts: str | None = None
        # why the batch stopped before a file (a missing earlier part, a snapshot still landing)
        self.gap: str | None = None
        self._erased: tuple[str, dict[str, list[tuple[str, str]]]] | None = None
        # Set per batch: the files' position ranges are disjoint (see _load_table).
        self._positions_unique = False
        self._spark_reason = "not plain"  # why the last batch went to the Spark path
        # Tables the driver committed to that this process's Spark session has cached older (see
        # _spark_catches_up): refreshed once each, when Spark next reads them or the load ends.
        self._stale: set[str] = set()
        self._stale_lock = threading.Lock()

    def loaded_files(self, files: list[LandingFile]) -> set[str]:
        """The landing files the ledger says are loaded (a scan of the ledger's file names with
        pyiceberg: no Spark job, and the table as committed now, not as Spark's catalog cached it).

        ``files``: the landing area as listed; only what deciding which of them are pending needs
        is read (:func:`ledger_bound`): the ledger rows of files ending at or after the oldest, which the ledger's position
        bounds prune to its newest data files. The ledger keeps a row for every file ever loaded,
        long after ``loader maintain`` retired it from the landing area: read whole, a load after
        months of follow mode would read millions of names."""
        from pyiceberg.expressions import GreaterThanOrEqual

        from loader.lake.catalog import open_catalog

        if not files:
            return set()
        ledger = open_catalog(self.settings).load_table((self.names.loader_ns, LEDGER_NAME))
        since = GreaterThanOrEqual("last_position", ledger_bound(files).token())  # type: ignore[misc,call-arg,arg-type]
        return set(ledger.scan(row_filter=since, selected_fields=("file",)).to_arrow().column("file").to_pylist())

    def pending_files(
        self, known_loaded: set[str] | None = None, max_files: int | None = None
    ) -> tuple[list[LandingFile], int]:
        """Files not loaded yet, in commit order, cut after the last complete one.

        ``known_loaded``: the loaded files as the caller already knows them (follow mode keeps them,
        so an idle cycle lists the landing area and touches nothing else). ``max_files`` bounds a
        batch, still cut at a file that ends a transaction.
        """
        from loader.landing.state import unfinished_snapshot

        # A snapshot or resync still copying (loader.capture.snapshot drains the stream meanwhile):
        # its files end inside its one transaction and later transactions may already be landed
        # after them; nothing loads from its first file on until its commit lands. The state is read
        # before the listing, so a snapshot done by then has every one of its files listed.
        state = unfinished_snapshot(self.store)
        copying = int(state["position_lsn"]) if state is not None and "position_lsn" in state else None
        files = self.store.files()
        if known_loaded is None:
            loaded = self.loaded_files(files)
        else:
            loaded = known_loaded
            forget_retired(known_loaded, files)
        pending = [f for f in files if f.name not in loaded]
        # A file that starts inside a transaction (seq > 1) continues the file ending just before it.
        # If that file is missing (not loaded, not pending before it), loading this one would make half
        # a transaction visible: stop the batch there until the earlier part arrives.
        # Ends of loaded files come from the ledger's names: loaded files may have left the landing
        # area. Worked out only when a pending file continues a transaction (rarely): the names
        # parsed then are those of the loaded files the listing reaches back to (ledger_bound).
        ends: set[ChangePosition] | None = None
        for i, f in enumerate(pending):
            if f.first.seq > 1:
                if ends is None:
                    ends = {p.last for p in pending[:i]}
                    ends.update(parsed.last for parsed in map(LandingFile.parse, loaded) if parsed is not None)
                if f.first.just_before() not in ends:
                    self.gap = (
                        f"landing file {f.name} continues a transaction whose earlier part is missing; waiting for it"
                    )
                    log.warning(self.gap)
                    pending = pending[:i]
                    break
            if ends is not None:
                ends.add(f.last)
            if copying is not None and f.first.commit_lsn == copying:
                self.gap = f"landing file {f.name} belongs to a snapshot still landing (copying, or interrupted)"
                log.info("%s; loading stops before it", self.gap)
                pending = pending[:i]
                break
        complete = [i for i, f in enumerate(pending) if f.complete]
        if max_files is not None and complete:
            within = [i for i in complete if i < max_files]
            last = within[-1] if within else complete[0]  # a transaction longer than the bound goes whole
        else:
            last = complete[-1] if complete else -1
        return pending[: last + 1], len(pending) - (last + 1)

    def run(self, known_loaded: set[str] | None = None, max_files: int | None = None) -> LoadResult:
        from loader.lake.commits import warehouse_answers
        from loader.locks import stage_lock

        with (
            stage_lock(self.settings, "load"),
            warehouse_answers("loading", "nothing more was marked loaded; re-run 'loader load' once it answers"),
            self._spark_caught_up(),
        ):
            checkpoint("load-locked")
            ensure_loader_tables(self.settings)
            batch, waiting = self.pending_files(known_loaded, max_files)
            result = LoadResult(waiting_files=waiting, gap=self.gap)
            if not batch:
                return result
            # Snapshot chunks (landing v2) and v1 files load as batches of their own, one after
            # another, each with its ledger rows: each can take its own driver path. A v1 backlog
            # larger than load.driver_max_bytes loads as several driver batches (bounded memory).
            # A group the driver typed is written on a thread of its own while the next group is
            # typed (loader.load.staging.Committer: in group order, one group at a time).
            # Its rows are written to data files then, and committed with the groups after it
            # (loader.load.staging: one commit per table and one ledger commit per interval).
            interval = self.settings.load.commit_interval_s
            with Committer(result, self._commit_pending, interval) as committer:
                for segment, group in self._sub_batches(batch):
                    part = LoadResult()
                    write = self._typed_group(segment, part, group, committer)
                    committer.settle()  # the group before is written (or its error raised here)
                    if write is None:
                        committer.flush()  # the groups before are committed first
                        self._load_batch(segment, part, group=group)
                        committer.add(part)
                    else:
                        committer.submit(write, part)
            return result

    def _sub_batches(self, batch: list[LandingFile]) -> Iterator[tuple[list[LandingFile], TextGroup | None]]:
        """``batch`` as the batches the load takes one after another, each with its ledger rows:
        snapshot chunks (landing v2) apart from the change stream's files (v1, or v2 change files:
        one format per segment), and those in groups the driver holds
        (loader.load.driver.plain_groups: read once, the next one read and checked ahead on a second
        thread while one is loaded, loader.load.driver.checked_ahead, so two are in memory at most),
        with what was read of them (None: the driver reads them when it loads them)."""
        from loader.landing.store import CHANGES, JSONL, TABLES
        from loader.load.driver import checked_ahead, plain_groups

        max_bytes = self.settings.load.driver_max_bytes
        for segment in _by_format(batch):
            # Overlapping files need the Spark path's dedupe: not read here only to be read again.
            if segment[0].format not in (JSONL, CHANGES, TABLES) or not max_bytes or not _disjoint(segment):
                yield segment, None
                continue
            groups = checked_ahead(plain_groups(self.store, segment, max_bytes), self.store, max_bytes)
            read_next = functools.partial(next, groups, None)
            while (group := _landing_read_explained(read_next)) is not None:
                yield group.files, group

    def replay(self, files: list[LandingFile], row_filter: str, dry_run: bool = False) -> LoadResult:
        """Load ``files`` again (``loader backfill replay``), only the changes ``row_filter`` keeps.

        Exactly-once by the same anti-join as every load: changes already in history add nothing.
        The ledger is not touched (the files are in it, or a normal load takes them later), and the
        loaded-through watermark does not move. Changes appended below a table's merged-through
        count as late appends, so its next merge rebuilds it.
        """
        from loader.locks import stage_lock

        with stage_lock(self.settings, "load"), self._spark_caught_up():
            ensure_loader_tables(self.settings)
            result = LoadResult()
            if files:
                self._load_batch(files, result, row_filter=row_filter, ledger=False, dry_run=dry_run)
            return result

    def _load_batch(
        self,
        batch: list[LandingFile],
        result: LoadResult,
        row_filter: str | None = None,
        ledger: bool = True,
        dry_run: bool = False,
        group: TextGroup | None = None,
    ) -> None:
        """``group``: ``batch`` as :meth:`_sub_batches` read it (its text, or why it is not plain)."""
        self._positions_unique = _disjoint(batch)
        if row_filter is None and not dry_run:
            plain = self._driver_load(batch, result, group)
            if plain is not None:
                self._driver_loaded(batch, plain, result, ledger)
                return
        else:
            self._spark_reason = "a replay or a dry run"
        self._spark_load(batch, result, self._spark_reason, row_filter, ledger, dry_run)

    def _committed_by_driver(self, spark_ident: str) -> None:
        """The driver committed to ``spark_ident``: the Spark session's cached table is older."""
        with self._stale_lock:
            self._stale.add(spark_ident)

    def _spark_catches_up(self) -> None:
        """Refresh, in this process's Spark session (if one runs), each table the driver committed
        to since the last call: its caching catalog would otherwise read them as they were. Once
        per table, not after every commit (each refresh reads the table's metadata in the JVM:
        about 50 ms, a third of a 300k-change group's commit). Called before the Spark path reads
        or changes tables, and when a load ends."""
        from loader.lake.commits import refresh_spark

        with self._stale_lock:
            stale, self._stale = self._stale, set()
        for ident in sorted(stale):
            refresh_spark(self.spark, ident)

    @contextlib.contextmanager
    def _spark_caught_up(self) -> Iterator[None]:
        """The block's driver commits are seen by the Spark session when it ends, even on an
        error (whose own error is not hidden by a refresh's)."""
        try:
            yield
        except BaseException:
            try:
                self._spark_catches_up()
            except Exception as exc:  # pragma: no cover - the load's own error matters more
                log.warning("load: refreshing Spark's view of the tables failed too: %s", exc)
            raise
        self._spark_catches_up()

    def _spark_load(
        self,
        batch: list[LandingFile],
        result: LoadResult,
        reason: str,
        row_filter: str | None = None,
        ledger: bool = True,
        dry_run: bool = False,
    ) -> None:
        """Load ``batch`` through Spark (``reason``: why not on the driver): the files decoded in
        the executors, every table appended, then the ledger."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from loader.config import executor_settings_json
        from loader.spark import executor_environment

        self._spark_catches_up()

        # Credentials reach executors as their environment, never in the pickled function.
        self.spark.sparkContext.environment.update(executor_environment(self.settings))
        result.engines.append(f"spark ({len(batch)} files): {reason}")
        log.info("load: %d files through Spark: %s", len(batch), reason)
        files_df = self.spark.createDataFrame([(f.name,) for f in batch], "landing_file STRING")
        parallelism = max(1, min(len(batch), self.spark.sparkContext.defaultParallelism * 2))
        decoded = files_df.repartition(parallelism).mapInArrow(
            make_decoder(executor_settings_json(self.settings)), CHANGE_ROW_DDL
        )
        if row_filter is not None:
            decoded = decoded.where(row_filter)
        decoded = decoded.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with _read_errors_explained():
                if dry_run:
                    counts = (
                        decoded.where("reject_reason IS NULL AND src_table IS NOT NULL")
                        .groupBy("src_schema", "src_table")
                        .count()
                        .collect()
                    )
                    result.rows_per_table = {f"{r[0]}.{r[1]}": int(r[2]) for r in counts}
                    result.files = [f.name for f in batch]
                    return
                # One job tells the tables, their columns, the ledger's counts, and whether the
                # rarer paths below have anything to do.
                batch_survey = survey(decoded)
                reject_parks: dict[SourceTable, list[dict[str, Any]]] = {}
                if batch_survey.rejects:
                    bad = decoded.where(F.col("reject_reason").isNotNull())
                    self._write_rejects(bad, result)
                    reject_parks = self._reject_parks(bad, decoded)
                good = decoded.where(F.col("reject_reason").isNull())
                tables = batch_survey.tables()
                unknown_damage = (
                    good.where("op = 'park' AND src_table IS NULL")
                    .select("landing_file", "commit_lsn", "ts", "note")
                    .collect()
                    if batch_survey.damaged_unknown
                    else []
                )
                for t in set(reject_parks) | (set(self._known_tables()) if unknown_damage else set()):
                    tables.setdefault(t, ([], []))

                def load_one(table: SourceTable) -> LoadResult:
                    columns, pk = tables[table]
                    extra = list(reject_parks.get(table, []))
                    damage = [
                        park_row(d.landing_file, table.schema, table.table, d.commit_lsn, d.ts, d.note)
                        for d in unknown_damage
                    ]
                    part = LoadResult()  # per table: tables load in parallel threads
                    self._load_table(good, table, columns, pk, extra, batch[-1], part, batch_survey, damage)
                    checkpoint("load-after-table")
                    return part

                for part in each_table(sorted(tables), load_one, self.settings.spark.table_threads, "load"):
                    result.absorb(part)
                ledger_rows = self._ledger_rows(batch_survey, batch)
            result.files = [f.name for f in batch]
            if ledger:
                self._write_ledger(batch, ledger_rows, result)
        finally:
            decoded.unpersist()

    def _write_ledger(self, batch: list[LandingFile], ledger_rows: list[tuple[Any, ...]], result: LoadResult) -> None:
        """Mark the batch loaded: the ledger's rows, with the loaded-through watermark in the
        commit's snapshot summary and (the same commit) in the table's properties, where snapshot
        expiry or compaction cannot take it away (see loader.lake.iceberg). pyiceberg's commit:
        no Spark job."""
        import pyarrow as pa
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        from loader.lake.catalog import open_catalog
        from loader.lake.commits import append_arrow

        ident = (self.names.loader_ns, LEDGER_NAME)
        catalog = open_catalog(self.settings)
        ledger = catalog.load_table(ident)
        loaded_through = self._loaded_through(batch, ledger)
        target = schema_to_pyarrow(ledger.schema(), include_field_ids=True)
        columns = dict(zip(_LEDGER_COLUMNS, zip(*ledger_rows, strict=True), strict=True))
        rows = pa.Table.from_arrays([pa.array(list(columns[f.name])).cast(f.type) for f in target], schema=target)
        props = {SUMMARY_LOADED_THROUGH: loaded_through}
        if self._newest_ts is not None:
            props[PROP_LOADED_THROUGH_TS] = self._newest_ts
        checkpoint("load-before-ledger")
        append_arrow(
            ledger,
            rows,
            {SUMMARY_LOADED_THROUGH: loaded_through},
            props,
            hint="history holds the batch, the ledger not yet: re-run 'loader load' once the warehouse answers"
            " (changes history holds are not appended again)",
        )
        self._committed_by_driver(self.names.ledger)
        checkpoint("load-after-ledger")
        result.loaded_through = loaded_through

    def _driver_load(
        self, batch: list[LandingFile], result: LoadResult, group: TextGroup | None = None
    ) -> BatchSurvey | None:
        """Load a plain batch on the driver (loader.load.driver): its survey, or None when the
        batch is not plain (nothing was appended; the Spark path loads it)."""
        typed = self._driver_typed(batch, result, group)
        if typed is None:
            return None
        plain, prepared = typed
        reason = self._driver_append_all(plain, prepared, batch, result)
        if reason is not None:
            self._spark_reason = reason
            return None
        return plain.survey

    def _typed_group(
        self, batch: list[LandingFile], result: LoadResult, group: TextGroup | None, committer: Committer
    ) -> Callable[[], bool] | None:
        """A group of the change stream the driver read and checked ahead (``group.plain``) typed
        here, table by table (their history tables created or evolved first, after the groups
        before are committed: ``committer.flush``), and what writes it: its tables' data files,
        kept with its ledger rows for the committer's next commit (or, should a table turn out not
        plain while its rows are written, the groups kept committed and the Spark path's load of
        the batch). A transaction longer than the bound (``group.streamed``) is checked here and
        typed file by file as its rows are written. None when the group is not one for this stage
        (the Spark path's batches, snapshot chunks) or not plain (then
        ``group.not_plain`` says why, so :meth:`_load_batch` takes the Spark path without typing
        it again)."""
        if group is None or (group.plain is None and not group.streamed):
            return None
        self._positions_unique = _disjoint(batch)
        typed = self._driver_typed(batch, result, group, committer.flush)
        if typed is None:
            group.plain, group.not_plain = None, self._spark_reason
            return None
        plain, prepared = typed

        def write() -> bool:
            staged = self._driver_stage_all(plain, prepared, batch, result)
            if isinstance(staged, str):
                committer.commit_pending()  # the groups before, first
                # (The Spark path reads _positions_unique, which the typing thread may have set for
                # a later group by now: True for this one, so a later False only adds a dedupe.)
                self._spark_load(batch, result, staged)
                return False
            self._driver_loaded(batch, plain.survey, result, ledger=False)  # its ledger rows: below
            rows = self._ledger_rows(plain.survey, batch)
            committer.stage(batch, staged, rows, plain.survey.newest_ts(), result)
            return True

        return write

    def _commit_pending(self, pending: Pending) -> None:
        """Commit groups written and kept (loader.load.staging): each history table's data files
        in one append, then every group's ledger rows in one commit."""
        last = pending.parts[-1]
        self._commit_staged(list(pending.tables.values()), last)
        self._newest_ts = pending.newest_ts
        self._write_ledger(pending.files, pending.ledger_rows, last)

    def _driver_loaded(
        self, batch: list[LandingFile], survey: BatchSurvey, result: LoadResult, ledger: bool = True
    ) -> None:
        """A batch the driver appended: its engine and files in ``result``, then (``ledger``) its
        ledger rows committed."""
        result.engines.append(f"driver ({len(batch)} files)")
        result.files = [f.name for f in batch]
        if ledger:
            self._write_ledger(batch, self._ledger_rows(survey, batch), result)

    def _driver_typed(
        self,
        batch: list[LandingFile],
        result: LoadResult,
        group: TextGroup | None = None,
        before_change: Callable[[], None] = lambda: None,
    ) -> tuple[Any, list[_DriverTable]] | None:
        """A plain batch read (unless ``group`` holds it read) and its tables prepared for the
        driver's append (:meth:`_driver_prepare`): (the batch, its tables), or None when the batch
        is not plain (``_spark_reason`` says why; nothing was committed)."""
        from loader.landing.store import ARROW, TABLES
        from loader.load.driver import NotPlain, PlainBatch, SnapshotBatch, StreamedPlainBatch, TablesBatch

        max_bytes = self.settings.load.driver_max_bytes
        if not max_bytes:
            self._spark_reason = "load.driver_max_bytes = 0"
            return None
        if group is not None and group.not_plain is not None:
            self._spark_reason = group.not_plain
            return None
        if not self._positions_unique:
            self._spark_reason = "landing files with overlapping positions (redelivered or re-landed changes)"
            return None
        prepared: list[_DriverTable] = []
        started = time.perf_counter()
        formats = {f.format for f in batch}
        if len(formats) > 1:
            self._spark_reason = "landing formats mixed in one batch"
            return None
        try:
            plain: PlainBatch | SnapshotBatch | StreamedPlainBatch | TablesBatch
            if formats == {ARROW}:
                plain = _landing_read_explained(lambda: SnapshotBatch(self.store, batch, max_bytes))
            elif group is not None and group.plain is not None:
                plain = group.plain
            elif group is not None and group.streamed:
                plain = _landing_read_explained(lambda: StreamedPlainBatch(self.store, batch, max_bytes))
            elif formats == {TABLES}:
                texts = group.texts if group is not None else None
                plain = _landing_read_explained(lambda: TablesBatch(self.store, batch, max_bytes, texts))
            else:
                # The group's text is handed over (PlainBatch empties the list as it parses it).
                texts = group.texts if group is not None else None
                plain = _landing_read_explained(lambda: PlainBatch(self.store, batch, max_bytes, texts))
            read = time.perf_counter()
            for table, (columns, pk) in sorted(plain.survey.tables().items()):
                prepared.append(self._driver_prepare(plain, table, columns, pk, result, before_change))
        except NotPlain as exc:
            self._spark_reason = str(exc)
            return None
        log.debug(
            "load on the driver: %d changes read %.2fs, tables prepared %.2fs",
            plain.num_rows,
            read - started,
            time.perf_counter() - read,
        )
        return plain, prepared

    def _driver_append_all(
        self, plain: Any, prepared: list[_DriverTable], batch: list[LandingFile], result: LoadResult
    ) -> str | None:
        """Append a driver batch's tables (``prepared``), each in one commit: None, or why the
        batch goes through the Spark path after all (a table found not plain while its rows were
        written: nothing of the batch was committed)."""
        started = time.perf_counter()
        staged = self._driver_stage_all(plain, prepared, batch, result)
        if isinstance(staged, str):
            return staged
        self._commit_staged(staged, result)
        log.debug("load on the driver: %d changes appended %.2fs", plain.num_rows, time.perf_counter() - started)
        return None

    def _driver_stage_all(
        self, plain: Any, prepared: list[_DriverTable], batch: list[LandingFile], result: LoadResult
    ) -> list[Staged] | str:
        """Write a driver batch's tables (``prepared``) to data files, nothing committed: each
        table's :class:`Staged` rows, or why the batch goes through the Spark path after all (a
        table found not plain while its rows were written; the files written are deleted)."""
        from loader.lake.catalog import open_catalog
        from loader.lake.commits import delete_uncommitted
        from loader.load.driver import NotPlain

        catalog = open_catalog(self.settings)
        last_file = batch[-1]
        written: list[tuple[Any, str]] = []  # (file io, path) of every data file written

        def delete_written() -> None:
            for io, path in written:
                delete_uncommitted(io, [path])

        def write_one(item: _DriverTable) -> tuple[LoadResult, Staged]:
            return self._driver_stage(plain, item, catalog, last_file, written)

        try:
            done = each_table(prepared, write_one, self.settings.spark.table_threads, "load")
        except NotPlain as exc:
            # Found while a snapshot too big to hold was typed file by file, or its rejects read
            # again: nothing of the batch was committed.
            delete_written()
            reason = f"{exc} (found while appending)"
            log.warning("load: %s; the batch goes through Spark", reason)
            return reason
        except BaseException:
            delete_written()
            raise
        for part, _ in done:
            result.absorb(part)
        return [s for _, s in done]

    def _commit_staged(self, staged: list[Staged], result: LoadResult) -> None:
        """Commit each table's data files written (:meth:`_driver_stage`), one commit per table
        with its bookkeeping."""
        from loader.lake.catalog import open_catalog

        catalog = open_catalog(self.settings)

        def commit_one(item: Staged) -> LoadResult:
            part = self._commit_table(catalog, item)
            checkpoint("load-after-table")
            return part

        for part in each_table(staged, commit_one, self.settings.spark.table_threads, "load"):
            result.absorb(part)

    def _driver_prepare(
        self,
        plain: Any,
        table: SourceTable,
        columns: list[tuple[str, str]],
        pk: list[str],
        result: LoadResult,
        before_change: Callable[[], None] = lambda: None,
    ) -> _DriverTable:
        """One table of a plain batch: its history table created or evolved, its rows typed (rows
        whose values do not fit as the Spark path leaves them: in the rejects table, with a park).
        NotPlain (nothing appended yet) for what only the Spark path does.

        The table is read, and created when missing, with pyiceberg: only a table to evolve goes
        through Spark's DDL, which starts a JVM. ``before_change`` runs before the catalog is
        changed (a table created or evolved): the commits of groups before this one are made first."""
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        from loader.lake.catalog import open_catalog
        from loader.lake.commits import create_table, default_location, warehouse_answers
        from loader.load.driver import NotPlain

        ident = self.names.history(table)
        erased = self._erased_keys()
        if erased and erased[1].get(table.qualified):
            raise NotPlain(f"{table.qualified}: erased subjects")
        catalog = open_catalog(self.settings)
        py_ident = (self.names.history_ns, table.iceberg_name)
        try:
            hist = catalog.load_table(py_ident)
        except NoSuchTableError:
            hist = None
        hist_columns: list[HistoryColumn] | None = None
        if hist is not None:
            props = hist.properties
            existing: dict[str, str] = json.loads(props.get(PROP_PG_TYPES, "{}"))
            plan = plan_evolution(table.qualified, existing, columns)
            if plan.retire:
                raise NotPlain(f"{table.qualified}: a column retyped incompatibly")
            present = {f.name for f in hist.schema().fields}
            # What _ensure_history_table returns without a DDL statement, decided the same way.
            if (
                plan.empty
                and all(name in present for name, _ in HISTORY_METADATA)
                and (not pk or json.loads(props.get(PROP_PRIMARY_KEY, "[]")) == pk)
            ):
                hist_columns = [HistoryColumn(n, t) for n, t in existing.items()]
        if hist is None:  # created here, as Spark's DDL would (no JVM: lake.commits.create_table)
            pg_types, props = _history_table_spec(table, columns, pk)
            lake_columns = source_columns(pg_types, HISTORY_METADATA)
            where = default_location(self.settings.catalog.warehouse, *py_ident)
            before_change()
            with warehouse_answers(f"creating {ident}", "re-run 'loader load' once the warehouse answers"):
                hist = create_table(
                    catalog, py_ident, lake_columns, props, "pg_txn_timestamp", ["pg_lsn", "pg_seq"], where
                )
            hist_columns = [HistoryColumn(n, t) for n, t in pg_types.items()]
        elif hist_columns is None:
            before_change()
            hist_columns, _ = self._ensure_history_table(table, columns, pk, None, result)  # type: ignore[arg-type]
            hist = catalog.load_table(py_ident)
        if self._dropped_columns(ident, table, plain.survey, hist_columns, hist.properties, before_change):
            raise NotPlain(f"{table.qualified}: columns dropped at the source")
        first, last = plain.span(table)
        if not _all_new(hist.properties, lambda: hist.current_snapshot() is None, first):
            raise NotPlain(f"{table.qualified}: history may hold some of these changes")
        target = schema_to_pyarrow(hist.schema(), include_field_ids=True)
        parts = plain.history_parts(table, hist_columns, target)
        markers = plain.resync_markers(table) if hasattr(plain, "resync_markers") else []
        return _DriverTable(table, ident, hist_columns, target, parts, first, last, markers)

    def _driver_stage(
        self, plain: Any, item: _DriverTable, catalog: Any, last_file: LandingFile, written: list[tuple[Any, str]]
    ) -> tuple[LoadResult, Staged]:
        """Write one table of a driver batch to data files (added to ``written``), nothing
        committed: its rows, and for rows whose values did not fit (the batch's ``misfits``, known
        once its rows are typed) the park the Spark path writes, their rejects appended now, before
        the table's commit, as on the Spark path: a run killed between the two writes no reject
        twice (they are matched by file and line) and parks the table again."""
        import uuid

        from loader.lake.commits import write_parts
        from loader.load.driver import APPEND_FILE_ARROW_BYTES, park_rows

        table, first, last = item.table, item.first, item.last
        part = LoadResult()
        hist = catalog.load_table((self.names.history_ns, table.iceberg_name))
        park: list[tuple[ChangePosition, str]] = []  # the park the misfits leave, once known

        def with_park(last_seq: dict[int, int]) -> Any:
            """The park row of the table's rows that did not fit (None if all fit), their rejects
            written (the batch's ``misfits`` are known once its rows are typed)."""
            found = plain.misfits.pop(table, None) if hasattr(plain, "misfits") else None
            if not found:
                return None
            rejects, at, ts, note = self._misfits(plain, item, found, last_seq)
            part.rejects += self._append_rejects(catalog, rejects)
            park.append((at, note))
            return park_rows(table, item.columns, item.target, at.commit_lsn, at.seq, ts, note)

        def rows() -> Iterator[Any]:
            import pyarrow as pa
            import pyarrow.compute as pc

            resync_lsns = {m[0] for m in item.markers if m[2] == "resync"}
            last_seq: dict[int, int] = {}  # per resync transaction, the table's last position in it

            def seen(rows: Any) -> None:
                for lsn in resync_lsns:
                    seqs = rows.column("pg_seq").filter(pc.equal(rows.column("pg_lsn"), lsn))
                    if len(seqs):
                        last_seq[lsn] = max(last_seq.get(lsn, -1), pc.max(seqs).as_py())

            if isinstance(item.parts, list):  # typed already: the park sorted in among the rows
                for rows in item.parts:
                    seen(rows)
                extra = with_park(last_seq)
                if extra is None:
                    yield from item.parts
                    return
                order = [("pg_lsn", "ascending"), ("pg_seq", "ascending")]
                yield pa.concat_tables([*item.parts, extra]).sort_by(order)
                return
            for rows in item.parts:  # typed as they are written: the park may sort before rows written
                seen(rows)
                yield rows
            extra = with_park(last_seq)
            if extra is not None:
                yield OwnFile(extra)  # in a data file of its own: each file stays in position order

        files: list[Any] = []

        def add(data_file: Any) -> None:
            written.append((hist.io, data_file.file_path))
            files.append(data_file)

        n = write_parts(hist.metadata, hist.io, rows(), uuid.uuid4(), add, APPEND_FILE_ARROW_BYTES)
        part.rows_per_table[table.qualified] = n
        markers = item.markers + [(at.commit_lsn, at.seq, "park", note) for at, note in park]
        lo, hi = min([first, *(at for at, _ in park)]), max([last, *(at for at, _ in park)])
        return part, Staged(table, item.ident, files, n, lo, hi, markers, last_file.last.token())

    def _commit_table(self, catalog: Any, item: Staged) -> LoadResult:
        """Commit one table's data files written by one or more driver groups, with the
        bookkeeping of the Spark path's append in the same commit: the snapshot summary's
        loaded-through and first position, the last position appended and late appends
        (:func:`_append_bookkeeping`), the park property after its park and resync rows."""
        from pyiceberg.exceptions import NoSuchTableError

        from loader.lake.catalog import watermark as table_watermark
        from loader.load.driver import commit_files
        from loader.load.kernel import parked_after

        table = item.table
        part = LoadResult()
        hist = catalog.load_table((self.names.history_ns, table.iceberg_name))
        props = hist.properties
        cur = (self.names.current_ns, table.iceberg_name)
        markers = sorted(item.markers)
        # What the Spark path's _note_parks does with the table's park and resync rows.
        parked = parked_after(props.get(PROP_PARKED), markers) if markers else props.get(PROP_PARKED)
        if markers and parked is not None:
            part.parked[table.qualified] = json.loads(parked)["reason"]

        def merged_through() -> str | None:
            try:
                return table_watermark(catalog.load_table(cur), SUMMARY_MERGED_THROUGH)
            except NoSuchTableError:
                return None

        # The merge's bookkeeping in the append's own commit (see _before_append).
        update = _append_bookkeeping(props, item.first, item.last, merged_through)
        if parked is not None and props.get(PROP_PARKED) != parked:
            update[PROP_PARKED] = parked
        remove = [PROP_PARKED] if parked is None and PROP_PARKED in props else []
        summary = {SUMMARY_LOADED_THROUGH: item.loaded_through, SUMMARY_MIN_POSITION: item.first.token()}
        commit_files(hist, item.files, summary, update, remove)
        self._committed_by_driver(item.ident)
        return part

    def _misfits(
        self, plain: Any, item: _DriverTable, found: list[Any], last_seq: dict[int, int]
    ) -> tuple[Any, ChangePosition, str, str]:
        """The rejects of a table's rows whose values did not fit (``found``), where its park goes
        (``loader.load.kernel.park_seq``: after the table's last row of a resync transaction,
        ``last_seq``), its commit time's text and its note."""
        import numpy as np

        from loader.load.driver import misfit_rejects
        from loader.load.kernel import park_seq as seq_of_park

        rejects = misfit_rejects(self.store, plain.batch, item.table, item.columns, found)
        lsn = rejects.column("pg_lsn").to_numpy()
        at = np.flatnonzero(lsn == lsn[0]).tolist()
        reasons = rejects.column("reason").to_pylist()
        k = min(at, key=lambda i: reasons[i])  # the Spark path's min(lsn, commit time, reason)
        first_lsn = int(lsn[0])
        seqs = [int(q) for q in rejects.column("pg_seq").to_numpy()[at]]
        last = max([*seqs, last_seq.get(first_lsn, -1)])
        where = ChangePosition(first_lsn, seq_of_park(last, first_lsn in last_seq))
        note = misfit_park_note(rejects.num_rows, first_lsn, reasons[k], item.table.qualified)
        return rejects.drop_columns(["ts"]), where, rejects.column("ts")[k].as_py(), note

    def _append_rejects(self, catalog: Any, rows: Any) -> int:
        """Rows of the rejects table (without ``rejected_at``) not there yet (by file and line)
        appended with pyiceberg: the rows appended."""
        from datetime import datetime

        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.expressions import In
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        from loader.lake.commits import append_arrow

        rejects = catalog.load_table((self.names.loader_ns, "rejects"))
        files = sorted(set(rows.column("landing_file").to_pylist()))
        known = rejects.scan(row_filter=In("landing_file", files), selected_fields=("landing_file", "line")).to_arrow()  # type: ignore[misc,call-arg,arg-type]
        seen = set(zip(known.column("landing_file").to_pylist(), known.column("line").to_pylist(), strict=True))
        keys = zip(rows.column("landing_file").to_pylist(), rows.column("line").to_pylist(), strict=True)
        new = rows.filter(pa.array([k not in seen for k in keys], pa.bool_()))
        if not new.num_rows:
            return 0
        now = pc.cast(pa.array([datetime.now(UTC)] * new.num_rows), pa.timestamp("us", tz="UTC"))
        target = schema_to_pyarrow(rejects.schema(), include_field_ids=True)
        columns = {**{n: new.column(n) for n in new.column_names}, "rejected_at": now}
        append_arrow(
            rejects,
            pa.Table.from_arrays([columns[f.name].cast(f.type) for f in target], schema=target),
            {},
            spark=self.spark,
            spark_ident=self.names.rejects,
            hint="nothing of the batch was marked loaded; re-run 'loader load' once the warehouse answers",
        )
        return int(new.num_rows)

    def _loaded_through(self, batch: list[LandingFile], ledger: Any) -> str:
        """The watermark never moves back: a late file below it leaves it where it was.
        ``ledger``: the ledger table (pyiceberg's)."""
        from loader.lake.catalog import watermark as table_watermark

        newest = max(f.last for f in batch).token()
        return newest_position(table_watermark(ledger, SUMMARY_LOADED_THROUGH), newest) or newest

    def _known_tables(self) -> list[SourceTable]:
        rows = self.spark.sql(
            f"SHOW TABLES IN {quote_ident(self.names.catalog)}.{quote_ident(self.names.history_ns)}"
        ).collect()
        return [SourceTable.from_iceberg_name(r.tableName) for r in rows]

    # --- history tables ----------------------------------------------------------------------
    def _ensure_history_table(
        self, table: SourceTable, columns: list[tuple[str, str]], pk: list[str], rows: DataFrame, result: LoadResult
    ) -> tuple[list[HistoryColumn], list[dict[str, Any]]]:
        """Create or evolve the history table: its columns after evolution, and park rows for retypes."""
        self._spark_catches_up()  # its DDL goes through the session's cached tables
        ident = self.names.history(table)
        if not table_exists(self.spark, ident):
            pg_types, props = _history_table_spec(table, columns, pk)
            create_source_table(
                self.spark, ident, pg_types, HISTORY_METADATA, props, "days(pg_txn_timestamp)", "pg_lsn, pg_seq"
            )
            return [HistoryColumn(n, t) for n, t in pg_types.items()], []
        props = table_properties(self.spark, ident)
        existing: dict[str, str] = json.loads(props.get(PROP_PG_TYPES, "{}"))
        retired: dict[str, dict[str, str]] = json.loads(props.get(PROP_RETIRED_COLUMNS, "{}"))
        self._add_missing_metadata(ident)
        plan = plan_evolution(table.qualified, existing, columns)
        if plan.empty and (not pk or json.loads(props.get(PROP_PRIMARY_KEY, "[]")) == pk):
            return [HistoryColumn(n, t) for n, t in existing.items()], []
        schema = iceberg_table(self.spark, ident).schema()

        def has(col: str) -> bool:
            return schema.findField(col) is not None

        # Each step checks the table first, so a load killed between two DDL commits re-plans and
        # finishes the same evolution on its re-run; the properties are written last.
        for name, pg_type in plan.add:
            if not has(lake_column(name)):
                self.spark.sql(
                    f"ALTER TABLE {ident} ADD COLUMN {quote_ident(lake_column(name))} {spark_type(pg_type).sql}"
                )
            existing[name] = pg_type
        for name, pg_type in plan.widen:
            self.spark.sql(
                f"ALTER TABLE {ident} ALTER COLUMN {quote_ident(lake_column(name))} TYPE {spark_type(pg_type).sql}"
            )
            existing[name] = pg_type
        for name, pg_type in plan.retext:
            existing[name] = pg_type
        parks: list[dict[str, Any]] = []
        for name, pg_type in plan.retire:
            lake = lake_column(name)
            version = 1 + sum(1 for r in retired.values() if r.get("column") == name)
            old_name = retired_name(lake, version)
            if not has(old_name):
                self.spark.sql(f"ALTER TABLE {ident} RENAME COLUMN {quote_ident(lake)} TO {quote_ident(old_name)}")
                schema = iceberg_table(self.spark, ident).schema()
                checkpoint("load-between-retire-steps")
            if not has(lake):
                self.spark.sql(f"ALTER TABLE {ident} ADD COLUMN {quote_ident(lake)} {spark_type(pg_type).sql}")
            retired[old_name] = {"column": name, "type": existing[name]}
            reason = (
                f"column {name} changed type from {existing[name]} to {pg_type}, which Iceberg cannot apply in "
                f"place: history keeps the old values in {old_name}; the current table waits for a resync "
                f"({repair_hint(table.qualified)}, automatic when capture saw the table rewrite)"
            )
            result.retired_columns.append(f"{table.qualified}: {reason}")
            first = self._first_with_type(rows, name, pg_type)
            if first is not None:
                parks.append(park_row("", table.schema, table.table, first[0], first[1], reason))
            existing[name] = pg_type
        new_props = {PROP_PG_TYPES: json.dumps(existing), PROP_RETIRED_COLUMNS: json.dumps(retired)}
        if pk:
            new_props[PROP_PRIMARY_KEY] = json.dumps(pk)
        update_properties(self.spark, ident, new_props)
        return [HistoryColumn(n, t) for n, t in existing.items()], parks

    def _add_missing_metadata(self, ident: str) -> None:
        """History tables of older versions lack newer metadata columns (pg_note)."""
        schema = iceberg_table(self.spark, ident).schema()
        for name, typ in HISTORY_METADATA:
            if schema.findField(name) is None:
                self.spark.sql(f"ALTER TABLE {ident} ADD COLUMN {name} {typ}")

    @staticmethod
    def _first_with_type(rows: DataFrame, column: str, pg_type: str) -> tuple[int, str] | None:
        """(commit LSN, commit timestamp) of the first change carrying ``column`` with ``pg_type``."""
        from pyspark.sql import functions as F

        typed = rows.where(
            F.exists(
                F.arrays_zip("col_names", "col_types"),
                lambda c: (c["col_names"] == column) & (c["col_types"] == pg_type),
            )
        )
        first = typed.agg(F.min(F.struct("commit_lsn", "seq", "ts"))).collect()[0][0]
        return (int(first["commit_lsn"]), str(first["ts"])) if first is not None else None

    # --- one table -------------------------------------------------------------------------
    def _load_table(
        self,
        good: DataFrame,
        table: SourceTable,
        columns: list[tuple[str, str]],
        pk: list[str],
        extra_parks: list[dict[str, Any]],
        last_file: LandingFile,
        result: LoadResult,
        batch_survey: BatchSurvey,
        unknown_damage: list[dict[str, Any]] | None = None,
    ) -> None:
        """``unknown_damage``: parks for files that lost changes of tables they cannot name (placed here)."""
        from pyspark.sql import functions as F

        rows = good.where((F.col("src_schema") == table.schema) & (F.col("src_table") == table.table))
        rows = self._without_erased(table, rows, result)
        ident = self.names.history(table)
        rows, damage_parks = self._damage_parks(table, rows, unknown_damage or [], batch_survey)
        hist_columns, retype_parks = self._ensure_history_table(table, columns, pk, rows, result)
        parks = one_park_per_position(extra_parks + damage_parks + retype_parks)
        if parks:
            rows = rows.unionByName(self.spark.createDataFrame(parks, CHANGE_ROW_DDL))
        dropped = self._dropped_columns(ident, table, batch_survey, hist_columns)
        typed = history_rows(rows, hist_columns, dropped).persist()
        try:
            self._append_typed(table, ident, typed, hist_columns, dropped, last_file, result, parks)
        finally:
            typed.unpersist()

    def _bounds(self, ok: DataFrame, misfit: Any = None) -> Any:
        """One job: (rows, first position, last position, park/resync rows[, misfits]) of ``ok``."""
        from pyspark.sql import functions as F

        good = F.col(REASON) == "" if misfit is not None else F.lit(True)
        aggs = [
            F.count(F.when(good, 1)),
            F.min(F.when(good, F.struct("pg_lsn", "pg_seq"))),
            F.max(F.when(good, F.struct("pg_lsn", "pg_seq"))),
            F.count(F.when(good & F.col("pg_operation").isin("park", "resync"), 1)),
        ]
        if misfit is not None:
            aggs.append(F.count(F.when(misfit, 1)))
        return ok.agg(*aggs).collect()[0]

    def _append_typed(
        self,
        table: SourceTable,
        ident: str,
        typed: DataFrame,
        hist_columns: list[HistoryColumn],
        dropped: dict[str, ChangePosition],
        last_file: LandingFile,
        result: LoadResult,
        parks: list[dict[str, Any]],
    ) -> None:
        """Quarantine the values that do not fit, then append what history does not hold yet.
        ``parks``: the park rows the load derived for the table, already in ``typed``."""
        from pyspark.sql import functions as F

        # The common case in one job: no misfits, and the bounds of what is to be appended.
        bounds = self._bounds(typed, misfit=F.col(REASON) != "")
        if bounds[4]:
            bad = typed.where(f"{REASON} <> ''")
            self._write_rejects(bad.selectExpr(*rejects_select(table.qualified)), result, typed=True)
            # Every misfit parks the table, those whose rejects an earlier run (killed before
            # its history commit) wrote too: they are not in history either.
            # The commit time in capture's UTC form (the session's zone is UTC), as the park's typing
            # reads it: without the offset it read as no commit time at all.
            utc = F.concat(F.col("pg_txn_timestamp").cast("string"), F.lit("+00"))
            earliest = F.min(F.struct("pg_lsn", utc, REASON))
            first = bad.agg(earliest).collect()[0][0]
            reason = misfit_park_note(bounds[4], first[0], first[2], table.qualified)
            seq = park_seq(typed, first[0], "pg_lsn", "pg_seq", "pg_operation")
            same = [p["note"] for p in parks if (p["commit_lsn"], p["seq"]) == (first[0], seq)]
            if same:
                # One park row a position (the append keeps one row a position): one note for all.
                reason = "; and ".join([*same, reason])
                at = (F.col("pg_operation") == "park") & (F.col("pg_lsn") == first[0]) & (F.col("pg_seq") == seq)
                typed = typed.where(~(at & (F.col(LINE) == 0)))
            park = self.spark.createDataFrame(
                [park_row("", table.schema, table.table, first[0], first[1], reason, seq)], CHANGE_ROW_DDL
            )
            typed = typed.unionByName(history_rows(park, hist_columns, dropped))
        ok = typed.where(f"{REASON} = ''").drop(LINE, REASON, RAW)
        # Read more than once only on the rarer paths (misfits or park rows: bounds again, the park
        # markers, the append); otherwise the append is its one reader, and caching it would copy
        # every row once more (``typed``, which it filters, is cached).
        cached = bool(bounds[4] or bounds[3])
        if cached:
            ok = ok.persist()
        try:
            if bounds[4]:
                bounds = self._bounds(ok)  # with the park row
            if bounds[3]:
                self._note_parks(ident, table, ok, result)
            if bounds[0] == 0:
                return
            target_cols = self.spark.table(ident).columns
            first, last = ChangePosition(*bounds[1]), ChangePosition(*bounds[2])
            if (
                self._positions_unique
                and not bounds[3]
                and _all_new(
                    table_properties(self.spark, ident), lambda: current_snapshot_id(self.spark, ident) is None, first
                )
            ):
                # The common case, shown without a Spark job: every change lies after everything
                # history holds, and no position can repeat (no park or resync rows, whose derived
                # positions could; each file's positions checked unique and inside its name's
                # range by the decoder; the files' ranges disjoint). The anti-join and the dedupe
                # (a shuffle of every row) would drop nothing.
                new = ok
                stats: Any = bounds
            else:
                existing = (
                    self.spark.table(ident)
                    .where(F.col("pg_lsn").between(first.commit_lsn, last.commit_lsn))
                    .select("pg_lsn", "pg_seq")
                )
                new = ok.join(existing, ["pg_lsn", "pg_seq"], "left_anti").dropDuplicates(["pg_lsn", "pg_seq"])
                stats = None
            new = new.select(
                *[F.col(quote_ident(c)) if c in new.columns else F.lit(None).alias(c) for c in target_cols]
            )
            if stats is None:
                new = new.persist()
            try:
                if stats is None:
                    stats = new.agg(
                        F.count(F.lit(1)), F.min(F.struct("pg_lsn", "pg_seq")), F.max(F.struct("pg_lsn", "pg_seq"))
                    ).collect()[0]
                n = stats[0]
                if n:
                    self._before_append(table, ident, ChangePosition(*stats[1]), ChangePosition(*stats[2]))
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
            result.duplicates_skipped += bounds[0] - n
        finally:
            if cached:
                ok.unpersist()

    def _damage_parks(
        self, table: SourceTable, rows: DataFrame, unknown: list[dict[str, Any]], batch_survey: BatchSurvey
    ) -> tuple[DataFrame, list[dict[str, Any]]]:
        """The table's rows without the park rows the decoder derived for damaged files, and those
        parks (with ``unknown``: damage to files that cannot name their tables) placed by
        ``park_seq``: a damaged file of a snapshot or resync is parked after the table's rows of
        it, where its resync marker cannot lift the park. (They sat at the transaction's start,
        seq 0: the resync lifted them, and its current table was built from what survived.)"""
        from pyspark.sql import functions as F

        found: list[dict[str, Any]] = []
        if any(s.table == table and s.kind == PARK for s in batch_survey.shapes):
            derived = F.coalesce((F.col("op") == "park") & (F.col("line") == 0), F.lit(False))
            found = [r.asDict(recursive=True) for r in rows.where(derived).collect()]
            if found:
                rows = rows.where(~derived)
        placed = [dict(p, seq=park_seq(rows, int(p["commit_lsn"]), "commit_lsn", "seq", "op")) for p in found + unknown]
        return rows, placed

    def _erased_keys(self) -> tuple[str, dict[str, list[tuple[str, str]]]] | None:
        """(salt, table -> [(column, value hash)]) of erased subjects (see loader.erase), once per load."""
        if self._erased is None:
            from pyiceberg.exceptions import NoSuchTableError

            from loader.lake.catalog import open_catalog
            from loader.lake.erased import PROP_SALT

            catalog = open_catalog(self.settings)
            ident = (self.names.loader_ns, "erased_keys")
            found: dict[str, list[tuple[str, str]]] = {}
            salt = ""
            try:  # read with pyiceberg: no Spark job
                erased = catalog.load_table(ident)
            except NoSuchTableError:
                erased = None
            if erased is not None:
                salt = erased.properties.get(PROP_SALT, "")
                fields = ("source_table", "source_column", "value_hash")
                rows = erased.scan(selected_fields=fields).to_arrow()
                for t, c, h in zip(*(rows.column(f).to_pylist() for f in fields), strict=True):
                    found.setdefault(t, []).append((c, h))
            self._erased = (salt, found)
        return self._erased if self._erased[1] else None

    def _without_erased(self, table: SourceTable, rows: DataFrame, result: LoadResult) -> DataFrame:
        """Changes carrying an erased subject's value (new row or old key) never reach history again:
        a replay, a resync or a late landing file cannot bring the subject back."""
        from pyspark.sql import functions as F

        from loader.lake.erased import erased_hashes_sql

        erased = self._erased_keys()
        keys = erased[1].get(table.qualified) if erased else None
        if not erased or not keys:
            return rows
        salt = sql_string(erased[0])
        conds = []
        for column, digest in keys:
            for source in ("map_from_arrays(col_names, col_values)", "map_from_arrays(key_names, key_values)"):
                conds.append(f"{erased_hashes_sql(salt, f'{source}[{sql_string(column)}]')} = {sql_string(digest)}")
        carries = f"coalesce({' OR '.join(conds)}, false)"
        dropped = rows.where(carries).count()
        if dropped:
            result.erased_dropped += int(dropped)
            log.info("dropped %d changes of erased subjects from %s", dropped, table.qualified)
        return rows.where(F.expr(f"NOT {carries}"))

    def _before_append(self, table: SourceTable, ident: str, first: ChangePosition, last: ChangePosition) -> None:
        """Bookkeeping the merge relies on (:func:`_append_bookkeeping`), committed before the
        Spark path's append so a crash never loses it."""
        cur = self.names.current(table)
        update = _append_bookkeeping(
            table_properties(self.spark, ident),
            first,
            last,
            lambda: watermark(self.spark, cur, SUMMARY_MERGED_THROUGH) if table_exists(self.spark, cur) else None,
        )
        if update:
            update_properties(self.spark, ident, update)

    def _note_parks(self, ident: str, table: SourceTable, ok: DataFrame, result: LoadResult) -> None:
        """Keep the history table's ``loader.parked`` property in step with its park/resync rows.

        Display only (status, verify): merges find parks from the rows themselves.
        """
        markers = (
            ok.where("pg_operation IN ('park', 'resync')")
            .select("pg_lsn", "pg_seq", "pg_operation", "pg_note")
            .orderBy("pg_lsn", "pg_seq")
            .collect()
        )
        if not markers:
            return
        from loader.load.kernel import parked_after

        props = table_properties(self.spark, ident)
        state = parked_after(props.get(PROP_PARKED), [tuple(m) for m in markers])
        if state is not None:
            result.parked[table.qualified] = json.loads(state)["reason"]
            if props.get(PROP_PARKED) != state:
                update_properties(self.spark, ident, {PROP_PARKED: state})
        elif PROP_PARKED in props:
            update_properties(self.spark, ident, remove=[PROP_PARKED])

    def _dropped_columns(
        self,
        ident: str,
        table: SourceTable,
        batch_survey: BatchSurvey,
        columns: list[HistoryColumn],
        props: dict[str, str] | None = None,
        before_change: Callable[[], None] = lambda: None,
    ) -> dict[str, ChangePosition]:
        """Columns dropped at the source, with the position the drop was first seen (see
        :meth:`loader.load.survey.BatchSurvey.dropped_columns`). Updates after that position carry
        the dropped column as NULL instead of "unchanged", and the merge writes NULL. Known drops
        are kept in the history table's properties."""
        if props is None:
            props = table_properties(self.spark, ident)
        known = {c: ChangePosition.from_token(t) for c, t in json.loads(props.get(PROP_DROPPED_COLUMNS, "{}")).items()}
        known, changed = batch_survey.dropped_columns(table, known, [(c.source, c.pg_type) for c in columns])
        if changed:
            value = json.dumps({c: p.token() for c, p in sorted(known.items())})
            before_change()
            update_properties(self.spark, ident, {PROP_DROPPED_COLUMNS: value})
        return known

    # --- rejects and the ledger --------------------------------------------------------------
    def _write_rejects(self, bad: DataFrame, result: LoadResult, typed: bool = False) -> int:
        from pyspark.sql import functions as F

        if not typed:
            bad = bad.selectExpr(
                "landing_file",
                "line",
                "concat_ws('.', src_schema, src_table) AS source_table",
                "commit_lsn AS pg_lsn",
                "seq AS pg_seq",
                "reject_reason AS reason",
                "raw",
            )
        df = bad.withColumn("rejected_at", F.current_timestamp())
        known = self.spark.table(self.names.rejects).select("landing_file", "line")
        df = df.join(known, ["landing_file", "line"], "left_anti").persist()
        try:
            n = df.count()
            if n:
                df.select(
                    "landing_file", "line", "source_table", "pg_lsn", "pg_seq", "reason", "raw", "rejected_at"
                ).writeTo(self.names.rejects).append()
        finally:
            df.unpersist()
        result.rejects += n
        return int(n)

    def _reject_parks(self, bad: DataFrame, decoded: DataFrame) -> dict[SourceTable, list[dict[str, Any]]]:
        """One park row per table that lost undecodable changes, at the start of the first one's
        transaction (after the table's resync when that transaction is a snapshot: ``park_seq``)."""
        from pyspark.sql import functions as F

        rows = (
            bad.where("src_table IS NOT NULL")
            .groupBy("src_schema", "src_table")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.min(
                    F.struct(F.coalesce("commit_lsn", F.lit(0)).alias("lsn"), "ts", "reject_reason", "landing_file")
                ).alias("first"),
            )
            .collect()
        )
        out: dict[SourceTable, list[dict[str, Any]]] = {}
        for r in rows:
            table = SourceTable(r.src_schema, r.src_table)
            f = r.first
            reason = (
                f"{r.n} changes quarantined in the rejects table (first in {f['landing_file']}: {f['reject_reason']}); "
                f"{repair_hint(table.qualified)}"
            )
            own = decoded.where((F.col("src_schema") == table.schema) & (F.col("src_table") == table.table))
            seq = park_seq(own, int(f["lsn"]), "commit_lsn", "seq", "op")
            out[table] = [park_row(f["landing_file"], table.schema, table.table, int(f["lsn"]), f["ts"], reason, seq)]
        return out

    def _ledger_rows(self, batch_survey: BatchSurvey, batch: list[LandingFile]) -> list[tuple[Any, ...]]:
        from datetime import datetime

        counts = batch_survey.file_counts()
        # Only accepted changes say how far the source is reflected (rejects may lack a position).
        self._newest_ts = batch_survey.newest_ts()
        now = datetime.now(UTC)
        return [(f.name, f.first.token(), f.last.token(), *counts.get(f.name, (0, 0)), now) for f in batch]


@dataclass
class _DriverTable:
    """One table of a batch the driver loads: its history columns and Arrow schema, its rows
    (``parts``, in position order, those whose values did not fit left out) and their first and
    last positions, and its resync rows ``markers`` ((lsn, seq, 'resync', note), in position
    order)."""

    table: SourceTable
    ident: str
    columns: list[HistoryColumn]
    target: Any
    parts: Any
    first: ChangePosition
    last: ChangePosition
    markers: list[tuple[int, int, str, str | None]] = field(default_factory=list)


_LEDGER_COLUMNS = ("file", "first_position", "last_position", "changes", "rejects", "loaded_at")


def history_rows(rows: DataFrame, columns: list[HistoryColumn], dropped: dict[str, ChangePosition]) -> DataFrame:
    """A table's change rows as history rows by the load kernel (``loader.load.kernel``), run by
    Spark in its executors: the same function the driver's load runs on its own batches."""
    from loader.load.kernel import history_batch, history_ddl

    def kernel(batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            yield history_batch(batch, columns, dropped)

    return rows.mapInArrow(kernel, history_ddl(columns))


def park_seq(rows: DataFrame, lsn: int, lsn_col: str, seq_col: str, op_col: str) -> int:
    """:func:`loader.load.kernel.park_seq` of the transaction committed at ``lsn`` (``rows``: the
    table's rows of the batch, those changes included)."""
    from pyspark.sql import functions as F

    from loader.load.kernel import park_seq as seq_of_park

    resyncs, last = (
        rows.where(F.col(lsn_col) == lsn)
        .agg(F.count(F.when(F.col(op_col) == "resync", 1)), F.max(seq_col))
        .collect()[0]
    )
    return seq_of_park(last, bool(resyncs))


def one_park_per_position(parks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The load's derived park rows of one table with those at one position made one, their notes
    joined: the append keeps one row a position (its dedupe), so two parks there (a retype's and
    a reject's in one transaction, both at its start) would lose one reason."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for p in parks:
        at = (int(p["commit_lsn"]), int(p["seq"]))
        if at not in out:
            out[at] = p
        elif p["note"] not in out[at]["note"]:
            out[at] = dict(out[at], note=f"{out[at]['note']}; and {p['note']}")
    return list(out.values())


def ledger_bound(files: list[LandingFile]) -> ChangePosition:
    """The oldest position whose ledger rows say anything about ``files`` (the landing area as
    listed, not empty): which of them are loaded (their ledger rows end at or after their own
    first position), and where loaded files end that a listed file continues (just before its
    first position). Files ending before it are history's and nobody's concern."""
    return ChangePosition(min(f.first.commit_lsn for f in files), 0)


def forget_retired(known: set[str], files: list[LandingFile]) -> None:
    """Drop from a set of loaded files' names (follow mode's, kept for its whole run) those that
    end before :func:`ledger_bound` of the landing area as listed: files ``loader maintain``
    retired, which nothing asks about again. Only once the set holds twice what the landing area
    does (a string comparison a name, no parsing), so the set stays the size of the landing
    area instead of growing by every file loaded while the process lives."""
    if not files or len(known) <= 2 * len(files) + 10_000:
        return
    bound = ledger_bound(files).token()
    known.difference_update([n for n in known if (last := name_last_token(n)) is not None and last < bound])


def _all_new(props: dict[str, str], empty: Callable[[], bool], first: ChangePosition) -> bool:
    """Whether a history table holds nothing at or after ``first``: its last-position property
    (raised by every load in or before its append, so never below what the table holds), or,
    without one, ``empty()``."""
    last = props.get(PROP_LAST_POSITION)
    if last is None:
        return empty()
    return ChangePosition.from_token(last) < first


def _append_bookkeeping(
    props: dict[str, str], first: ChangePosition, last: ChangePosition, merged_through: Callable[[], str | None]
) -> dict[str, str]:
    """The history table's properties an append of ``first``..``last`` changes (empty: none): the
    last position appended (a table whose last position is at or before its merged-through has
    nothing to merge: idle tables cost no Spark job), and the count of late appends, changes at or
    below what the current table already merged (``merged_through()``), which the merge must
    rebuild to place."""
    update = {PROP_LAST_POSITION: newest_position(props.get(PROP_LAST_POSITION), last.token()) or last.token()}
    merged = merged_through()
    if merged is not None and first <= ChangePosition.from_token(merged):
        update[PROP_LATE_APPENDS] = str(int(props.get(PROP_LATE_APPENDS, "0")) + 1)
    return {k: v for k, v in update.items() if props.get(k) != v}


def _history_table_spec(
    table: SourceTable, columns: list[tuple[str, str]], pk: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """A new history table's source columns (name -> PostgreSQL type) and properties."""
    pg_types = dict(columns)
    props = {
        **HISTORY_TABLE_PROPERTIES,
        PROP_SOURCE_TABLE: table.qualified,
        PROP_PRIMARY_KEY: json.dumps(pk),
        PROP_PG_TYPES: json.dumps(pg_types),
    }
    return pg_types, props


def _disjoint(files: list[LandingFile]) -> bool:
    """Whether the files' position ranges do not overlap (no change in two of them)."""
    spans = sorted((f.first, f.last) for f in files)
    return all(a[1] < b[0] for a, b in itertools.pairwise(spans))


def _by_format(batch: list[LandingFile]) -> list[list[LandingFile]]:
    """``batch`` cut where the landing format changes (v1 / v2 snapshot chunks / v2 change files), only after a file
    that ends a transaction (a cut never splits one); one segment when nothing is cut."""
    segments: list[list[LandingFile]] = []
    for f in batch:
        if segments and (segments[-1][-1].format == f.format or not segments[-1][-1].complete):
            segments[-1].append(f)
        else:
            segments.append([f])
    return segments


def _landing_read_explained(read: Callable[[], T]) -> T:
    """The driver's read of a batch's landing files, its outage said as the Spark path says it."""
    from loader.errors import LandingUnavailableError

    try:
        return read()
    except LandingUnavailableError as exc:
        raise LandingUnavailableError(
            f"load stopped while reading landing files: {exc}",
            hint="nothing was marked loaded; re-run 'loader load' once the landing area answers",
        ) from exc


class _read_errors_explained:
    """Turn a Spark job that failed reading landing files into the loader's transient error."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        text = str(exc)
        for marker in ("LandingUnavailableError", "LandingError"):
            if marker in text:
                from loader.errors import LandingError, LandingUnavailableError

                detail = next(
                    (ln.split(marker + ":", 1)[1].strip() for ln in text.splitlines() if marker + ":" in ln), text[:300]
                )
                cls = LandingUnavailableError if marker == "LandingUnavailableError" else LandingError
                raise cls(
                    f"load stopped while reading landing files: {detail}",
                    hint="nothing was marked loaded; re-run 'loader load' once the landing area answers",
                ) from exc
