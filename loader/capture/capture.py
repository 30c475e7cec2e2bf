"""The capture run: decode the slot, write landing files, advance the slot only after publishing.

Crash safety: the slot's confirmed position is advanced only to the end of transactions whose
changes are all published. After a crash, decoding restarts from the slot, and every change at
or before the last landed position (read back from the landing file names) is skipped, so the
landing area holds each change exactly once.

Every run first checks what the WAL cannot show (``loader.capture.watch``): the slot itself (gone,
invalidated, or consumed by someone else: ``SlotLostError``), and the catalog of every table
(defaults filling rows, rewrites, renames, identity changes, re-inclusion). Tables whose stream can
no longer keep a current table exact get a *park* record, and tables to be resynced get one too,
placed right after the last landed transaction: before anything the change touched. Resyncs run at
the end of the run (a consistent re-snapshot through a temporary slot), and stay pending in the
landing area's state until they succeed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import psycopg

from loader.capture import ddl, wal2json_arrow
from loader.capture import heartbeat as heartbeats
from loader.capture import slot as slots
from loader.capture.snapshot import Snapshot
from loader.capture.source_filter import (
    SourcePlan,
    TableFilter,
    captured_plan,
    current_role,
    publication_plan,
    why_not_readable,
)
from loader.capture.source_tables import KeyLookup, split_qualified
from loader.capture.stream import PipelineUnavailable, RoundFetcher
from loader.capture.wal2json import NUMERIC_AS_STRING_OPTION, WAL2JSON_OPTIONS, Wal2JsonDecoder
from loader.capture.watch import (
    TYPES_CHANGED_SQL,
    TableFacts,
    WatchPlan,
    first_seen,
    plan_stream_table,
    plan_types_changed,
    plan_watch,
    read_facts,
)
from loader.config import LoaderSettings
from loader.errors import DecodeError, LandingError, SlotLostError, SourceError, TransientError
from loader.faults import checkpoint
from loader.landing.records import COMMIT, ChangeRecord
from loader.landing.state import (
    CATALOG_STATE,
    RESYNC_REQUESTS,
    SOURCE_STATE,
    record_confirmed,
    unfinished_snapshot,
)
from loader.landing.store import STREAM_FORMATS, LandingStore, LandingWriter, open_landing, stream_landing_format
from loader.lsn import ChangePosition, format_lsn, parse_lsn
from loader.progress import bar

log = logging.getLogger("loader.capture")


class SnapshotInProgressError(TransientError):
    """An initial snapshot is unfinished; streaming must wait until it completes."""


@dataclass
class CaptureResult:
    files: list[str] = field(default_factory=list)
    changes: int = 0
    transactions: int = 0
    skipped_already_landed: int = 0
    confirmed_lsn: int | None = None
    lag_bytes: int = 0
    retained_wal_bytes: int = 0
    wal_status: str | None = None  # the slot's (reserved / extended / unreserved / lost)
    # The loader's heartbeat (loader.capture.heartbeat): emitted this run, and how long the last one
    # seen took to come back out of the slot (None: none seen in this run).
    heartbeat_emitted: bool = False
    heartbeat_lag_s: float | None = None
    heartbeat_seen_at: float | None = None  # epoch seconds
    slot_created: bool = False
    # Tables seen in this run whose changes cannot give a current table, with the reason.
    limited_tables: dict[str, str] = field(default_factory=dict)
    numeric_special_values: bool = False  # NaN/Infinity kept (pgoutput, or wal2json with numeric-data-types-as-string)
    tables: set[str] = field(default_factory=set)  # tables with changes landed in this run
    parked: dict[str, str] = field(default_factory=dict)  # table -> reason, park records landed in this run
    resynced: dict[str, str] = field(default_factory=dict)  # table -> reason, resyncs done in this run
    notes: list[str] = field(default_factory=list)
    messages_skipped: int = 0
    quarantined: int = 0
    # Plugin rows read from a pipelined copy of the slot, and those decoded in columns
    # (loader.capture.wal2json_arrow) rather than one by one.
    pipelined_rows: int = 0
    columnar_rows: int = 0
    # Tables the configuration includes but capture never reads (no SELECT right, ...), with why.
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        lsn = format_lsn(self.confirmed_lsn) if self.confirmed_lsn is not None else "-"
        text = (
            f"captured {self.changes} changes in {self.transactions} transactions into "
            f"{len(self.files)} landing files; slot confirmed at {lsn}; lag {self.lag_bytes} bytes, "
            f"retained WAL {self.retained_wal_bytes} bytes"
            + (f" (wal_status {self.wal_status})" if self.wal_status else "")
            + (f"; heartbeat back after {self.heartbeat_lag_s:.3f} s" if self.heartbeat_lag_s is not None else "")
            + (f"; skipped {self.skipped_already_landed} already landed" if self.skipped_already_landed else "")
            + (f"; {self.messages_skipped} logical messages skipped" if self.messages_skipped else "")
            + (f"; {self.quarantined} undecodable rows quarantined" if self.quarantined else "")
            + (
                f"; {self.columnar_rows} of {self.pipelined_rows} pipelined rows decoded in columns"
                if self.pipelined_rows
                else ""
            )
        )
        for table, what in sorted(self.limited_tables.items()):
            text += f"\n  note: {table}: {what}"
        for note in self.notes:
            text += f"\n  note: {note}"
        for table, why in sorted(self.skipped.items()):
            text += f"\n  {why if why.startswith('skipped') else 'skipped: ' + why}: {table}"
        for table, why in sorted(self.parked.items()):
            text += f"\n  parked: {table}: {why}"
        for table, why in sorted(self.resynced.items()):
            text += f"\n  resynced: {table}: {why}"
        return text


# Column types whose NaN/±Infinity wal2json before 2.6 prints as null (arrays of them too).
_SPECIAL_FLOAT_TYPES = re.compile(r"^(numeric|real|double precision|float4|float8)\b")


def lossy_specials_note(table: str, columns: list[str]) -> str:
    """Capture's note for a table whose NaN/±Infinity wal2json before 2.6 prints as null."""
    return (
        f"{table}: NaN and ±Infinity in {', '.join(columns)} arrive as NULL from wal2json before 2.6 "
        '(indistinguishable from NULL in its output): set source.plugin = "pgoutput" or install '
        "wal2json 2.6+ to keep them; snapshots and resyncs keep them"
    )


class _Controls:
    """Park records waiting for their place: right after the last landed (or written) commit."""

    def __init__(
        self,
        landed: ChangePosition | None,
        landed_complete: bool,
        split: Callable[[str], tuple[str, str]] = lambda q: (q.partition(".")[0], q.partition(".")[2]),
    ) -> None:
        self.pending: list[tuple[str, str]] = []  # (table, reason)
        self.split = split  # "schema.table" -> (schema, table), by the source's catalog when one is at hand
        self.boundary = landed  # position of the last commit marker landed or written
        self.at_boundary = landed_complete

    def after(self, rec: ChangeRecord) -> None:
        if rec.op == COMMIT:
            self.boundary, self.at_boundary = rec.position, True
        else:
            self.at_boundary = False

    def flush(self, writer: LandingWriter, ts: str) -> None:
        """Write the pending park records as their own transaction at the boundary."""
        if not self.pending or not self.at_boundary:
            return
        lsn, seq = (self.boundary.commit_lsn, self.boundary.seq) if self.boundary else (0, 0)
        for table, reason in self.pending:
            seq += 1
            schema, name = self.split(table)
            writer.write(
                ChangeRecord(op="P", commit_lsn=lsn, seq=seq, xid=0, ts=ts, schema=schema, table=name, reason=reason)
            )
        commit = ChangeRecord(op=COMMIT, commit_lsn=lsn, seq=seq + 1, xid=0, ts=ts)
        writer.write(commit)
        self.after(commit)
        self.pending = []


class Capture:
    """One capture run against the configured slot."""

    def __init__(
        self,
        settings: LoaderSettings,
        store: LandingStore | None = None,
        *,
        on_published: Callable[[str], None] | None = None,
        round_changes: int | None = None,
        watch: bool = True,
        heartbeat: bool | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or open_landing(settings)
        self.filter = TableFilter(settings.source.include, settings.source.exclude)
        # Test seam and hook: called after each file is durable, before the slot moves.
        self.on_published = on_published
        self.round_changes = round_changes or max(settings.source.max_changes_per_file * 4, 10_000)
        self.options: tuple[str, ...] = WAL2JSON_OPTIONS  # extended in run() by what the plugin supports
        self.keys: KeyLookup | None = None
        self.facts: dict[str, TableFacts] = {}
        self._keys_of: dict[str, tuple[Any, Any, list[str]]] = {}  # table -> (facts or info, info, key)
        self.roots: dict[str, str] = {}  # leaf partition -> partitioned table (source.partitions = root)
        self._roots_before: dict[str, str] = {}  # the same as the last run saw it (partitions dropped since)
        self._not_partitions: set[str] = set()
        # A nested run (inside a resync) lands the stream only; the outer run watches the catalog.
        self.watch = watch
        # Emit a heartbeat at the start of the run (None: when source.heartbeat_interval_s > 0 and
        # the run watches the catalog; a nested run up to a snapshot's consistent point never does).
        self.heartbeat = (watch and settings.source.heartbeat_interval_s > 0) if heartbeat is None else heartbeat
        self._heartbeats: list[heartbeats.Seen] = []
        self._emitted: tuple[int, int, float] | None = None  # (seq, lsn, when) of this run's heartbeat
        self.controls = _Controls(None, True)
        self._pending_resyncs: dict[str, str] = {}
        self._requested: dict[str, str] = {}
        self._last_confirm: int | None = None
        self._last_advance = time.monotonic()  # when the slot was last advanced (see _confirm)
        self._progress: Any = None  # the run's progress bar, moved as the slot is confirmed
        self._begin: int | None = None
        # The source-side filter of this run (see loader.capture.source_filter), read after the
        # run's upper bound is taken.
        self.source_plan = SourcePlan()
        self._published: list[str] | None = None  # pgoutput: the publication's tables after this run's sync
        # DDL in the stream (loader.capture.ddl): the trigger's installation as this run found it,
        # the last picture of each table by oid, and whether a message said it could not be made.
        self._ddl_token: str | None = None
        self._ddl_known: dict[int, TableFacts] = {}
        self._ddl_names: dict[int, str] = {}  # the last name of each table by oid (renames)
        self._ddl_held: dict[str, int] = {}  # the oid that last had each name (created again)
        self._ddl_in_stream = False
        self._before: dict[str, TableFacts] | None = None  # the previous run's catalog picture
        self._first_seen: set[str] = set()  # tables that picture did not have (by oid)
        self._ddl_incomplete = False
        self._facts_by_oid: dict[int, str] | None = None
        self._publication_resyncs: dict[str, str] = {}
        self._role: str | None = None
        self._lossy_known: dict[str, Any] | None = None  # source state's lossy_specials, once read (_note_exposed)

    # --- the run ---------------------------------------------------------------------------
    def run(self, create_slot: bool = True, *, upto_lsn: int | None = None, locked: bool = False) -> CaptureResult:
        """Capture every transaction committed before ``upto_lsn`` (default: the WAL end now).

        ``locked``: the caller already holds the slot's capture lock (snapshot does).
        """
        src = self.settings.source
        result = CaptureResult()
        with slots.connect(src.conninfo()) as conn, slots.owning(conn, src.slot, held=locked):
            slots.check_wal_level(conn)
            if not locked:
                checkpoint("capture-locked")
                self._finish_unfinished_snapshot()
            landing_files = self.store.files()
            if not self._slot_ready(conn, create_slot, landing_files, result):
                return self._recover_slot(result)
            self.keys = KeyLookup(conn)
            if self.watch:
                self._warn_unbounded_wal(conn, result)
            if self.heartbeat and upto_lsn is None:
                # Before the bound: this run decodes it, and confirms the slot to its end once
                # everything before it is landed, however quiet the captured tables are.
                result.heartbeat_emitted = self._emit_heartbeat(conn)
            if upto_lsn is None:
                row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                assert row is not None
                upto = row[0]
            else:
                upto = format_lsn(upto_lsn)
            # After the bound: a table the listing misses was created after it, so every change it
            # has lies past the bound and the next run (which lists it) decodes it.
            self._plan_source(conn, result)
            self._choose_options(conn, result)
            landed = landing_files[-1].last if landing_files else None
            self.controls = _Controls(
                landed,
                not landing_files or landing_files[-1].complete,
                lambda qualified: split_qualified(conn, qualified),
            )
            start = slots.slot_info(conn, src.slot)
            # Launched before the catalog is read, so the fetcher process starts meanwhile.
            fetcher = self._fetcher(upto) if self._pipelined(start, upto) else None
            try:
                plan = self._watch(conn, result) if self.watch else None
                begin = start.confirmed_flush_lsn if start is not None and start.confirmed_flush_lsn else None
                with bar(parse_lsn(upto) - begin if begin is not None else None, "capture", "B") as progress:
                    self._progress, self._begin = progress, begin
                    if fetcher is None or not self._stream(conn, fetcher, landed, result):
                        while True:
                            rows, landed = self._round(conn, upto, landed, result)
                            if rows == 0:
                                break
                    self._progress = None
            finally:
                if fetcher is not None:
                    fetcher.close()
            if plan is not None:
                self._settle_deferred(plan, result)
            self._flush_controls(result)
            self._note_lossy_specials(result, self._lossy_unreported())
            if plan is not None:
                self._save_catalog_state(plan)
                self._resync(result)
                self._save_source_state(result)
            info = slots.slot_info(conn, src.slot)
            if info is not None:
                result.confirmed_lsn = info.confirmed_flush_lsn
                result.lag_bytes = info.lag_bytes
                result.retained_wal_bytes = info.retained_wal_bytes
                result.wal_status = info.wal_status
                self._note_heartbeat(info, result)
        return result

    def _note_lossy_specials(self, result: CaptureResult, unreported: dict[str, list[str]] | None = None) -> None:
        """Flag each table whose numeric or float values may have lost NaN/±Infinity to NULL.

        wal2json before 2.6 prints those as JSON null, which a NULL also is: nothing in the stream
        tells them apart, so the loader cannot quarantine them. It says which tables are exposed,
        every run they change, and how to be exact (pgoutput, or wal2json 2.6+); 'loader verify'
        finds any row that differs, and a resync repairs it. ``unreported``: tables an earlier run
        landed exposed changes of but stopped before it said so (table -> columns, see
        :meth:`_note_exposed`): they are named too.
        """
        flagged = dict(unreported or {})
        if not result.numeric_special_values:
            for table in result.tables:
                facts = self.facts.get(table)
                if facts is None:
                    continue
                exposed = [c.name for c in facts.columns.values() if _SPECIAL_FLOAT_TYPES.match(c.type)]
                if exposed:
                    flagged[table] = exposed
        for table, exposed in sorted(flagged.items()):
            result.notes.append(lossy_specials_note(table, exposed))

    def _note_exposed(self, qualified: str, rec: ChangeRecord, result: CaptureResult) -> None:
        """Before a table's first change of the run is landed: when its numeric or float values may
        have lost NaN/±Infinity to NULL (wal2json before 2.6), say so durably in the landing area's
        source state (``lossy_specials``: table -> columns, the first position landed so, whether
        a run's summary named it yet). A capture killed after publishing the files then still
        names the table (the next run's summary, and ``loader status`` from then on)."""
        if result.numeric_special_values:
            return
        facts = self.facts.get(qualified)
        columns = [(c.name, c.type) for c in facts.columns.values()] if facts is not None else []
        columns = columns or [(c.name, c.type) for c in rec.columns]
        exposed = [name for name, pg_type in columns if _SPECIAL_FLOAT_TYPES.match(pg_type or "")]
        if not exposed:
            return
        if self._lossy_known is None:  # read once a run: a table's first change is not a read of the store
            self._lossy_known = dict(self._source_state().get("lossy_specials", {}))
        known = self._lossy_known.get(qualified, {})
        if set(exposed) <= set(known.get("columns", [])):
            return
        self._lossy_known[qualified] = {
            "columns": sorted(set(exposed) | set(known.get("columns", []))),
            "since": known.get("since", rec.position.token()),
            "reported": False,
        }
        state = self._source_state()
        state["lossy_specials"] = {**state.get("lossy_specials", {}), qualified: self._lossy_known[qualified]}
        self.store.write_state(SOURCE_STATE, state)

    def _source_state(self) -> dict[str, Any]:
        """The landing area's source state of this slot (a fresh one after the slot changed)."""
        slot = self.settings.source.slot
        state = self.store.read_state(SOURCE_STATE) or {}
        return state if state.get("slot") == slot else {"slot": slot}

    def _lossy_unreported(self) -> dict[str, list[str]]:
        """Tables :meth:`_note_exposed` recorded that no run's summary named yet; marked named now."""
        state = self._source_state()
        lossy = state.get("lossy_specials", {})
        unreported = {t: list(e["columns"]) for t, e in lossy.items() if not e.get("reported")}
        if unreported:
            for t in unreported:
                lossy[t]["reported"] = True
            self.store.write_state(SOURCE_STATE, state)
        return unreported

    # --- WAL safety: the heartbeat and the server's limit ------------------------------------
    def _emit_heartbeat(self, conn: psycopg.Connection) -> bool:
        """One heartbeat into the stream; False (warned once per process) if the source refuses it."""
        src = self.settings.source
        state = heartbeats.read_state(self.store, src.slot)
        seq = int(state.get("emitted_seq", 0)) + 1
        try:
            lsn = heartbeats.emit(conn, src.slot, seq)
        except heartbeats.Refused as exc:
            _warn_once(
                ("heartbeat", src.slot),
                "the source refused the loader's heartbeat (%s): the slot is confirmed only up to the last "
                "change captured, so WAL written elsewhere stays held while the captured tables are quiet; "
                "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <loader role>, "
                "or set source.heartbeat_interval_s = 0 to silence this",
                exc,
            )
            return False
        self._emitted = (
            seq,
            lsn,
            time.time(),
        )  # recorded with what came back, in one state write at the end of the run
        return True

    def _note_heartbeat(self, info: slots.SlotInfo, result: CaptureResult) -> None:
        """Remember the newest of our heartbeats that came back and that the slot is confirmed past."""
        src = self.settings.source
        ours = [
            b
            for b in self._heartbeats
            if b.slot == src.slot and info.confirmed_flush_lsn is not None and b.end_lsn <= info.confirmed_flush_lsn
        ]
        last = max(ours, key=lambda b: b.end_lsn) if ours else None
        if self._emitted is None and last is None:
            return
        state = heartbeats.note(self.store, src.slot, self._emitted, last)
        if last is not None:
            result.heartbeat_lag_s = float(state["seen_lag_s"])
            result.heartbeat_seen_at = float(state["seen_at"])

    def _warn_unbounded_wal(self, conn: psycopg.Connection, result: CaptureResult) -> None:
        """max_slot_wal_keep_size = -1: a slot left behind can fill the source's disk."""
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
        if row is None or row[0] != "-1":
            return
        msg = (
            "the source's max_slot_wal_keep_size is -1 (unlimited): if capture stops, replication slot "
            f"{self.settings.source.slot!r} keeps WAL until the source's disk is full; set it (e.g. "
            "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf()) and alert on "
            "the slot's retained WAL (see README 'WAL safety')"
        )
        result.notes.append(msg)
        _warn_once(("max_slot_wal_keep_size", self.settings.source.slot), "%s", msg)

    def _slot_ready(
        self, conn: psycopg.Connection, create_slot: bool, landing_files: list[Any], result: CaptureResult
    ) -> bool:
        """Create the slot on the first run; detect a lost one. False: the slot must be recovered."""
        src = self.settings.source
        info = slots.slot_info(conn, src.slot)
        if info is None and not landing_files and create_slot:
            self._create_slot(conn)
            result.slot_created = True
            return True
        if info is None and not landing_files:
            slots.require_slot(conn, src.slot, src.plugin)  # raises SlotMissingError with the fix
        try:
            slots.check_landed(info, src.slot, self.store, landing_files)
        except SlotLostError:
            if src.on_slot_loss == "resync" and self.watch:
                log.warning("replication slot %s was lost; recovering with a resync of every table", src.slot)
                return False
            raise
        slots.require_slot(conn, src.slot, src.plugin)
        return True

    def _create_slot(self, conn: psycopg.Connection) -> int:
        """The slot with source.plugin (pgoutput: its publication first, since pgoutput reads the
        publication as of each change it decodes), and the slot state that says this loader made it."""
        src = self.settings.source
        published: list[str] | None = None
        if src.plugin == "pgoutput":
            from loader.capture import pgoutput

            plan = publication_plan(conn, self.settings)
            pgoutput.ensure_publication(conn, src.publication, tables=sorted(plan.wanted))
            published = pgoutput.published_tables(conn, src.publication)
        created_at = slots.create_slot(
            conn, src.slot, src.plugin, dsn=src.conninfo(), timeout_s=src.slot_create_timeout_s
        )
        record_confirmed(self.store, src.slot, created_at)
        if src.plugin == "pgoutput" and published is not None:
            # What the publication listed as the slot began: a table a later sync adds (one created
            # meanwhile, however long before the first capture) had its changes withheld, and is resynced.
            state = self.store.read_state(SOURCE_STATE) or {}
            state = state if state.get("slot") == src.slot else {"slot": src.slot}
            self.store.write_state(SOURCE_STATE, {**state, "published": published})
        return created_at

    def create_slot(self) -> int:
        """``loader slot create``: the slot a first run would create, made ahead of it; returns its
        consistent point. Refused when the slot exists, and when the landing area already holds
        changes (the slot was lost: a new one would hide the changes missed, 'loader resync' repairs it)."""
        src = self.settings.source
        with slots.connect(src.conninfo()) as conn, slots.owning(conn, src.slot):
            slots.check_wal_level(conn)
            info = slots.slot_info(conn, src.slot)
            if info is not None:
                raise SourceError(f"replication slot {src.slot!r} already exists (plugin {info.plugin})")
            landing_files = self.store.files()
            if landing_files:
                slots.check_landed(None, src.slot, self.store, landing_files)  # raises SlotLostError
            return self._create_slot(conn)

    def _recover_slot(self, result: CaptureResult) -> CaptureResult:
        snap = snapshot(self.settings, self.store, on_published=self.on_published, recover=True).run(locked=True)
        result.files += snap.files
        result.resynced.update({t: "replication slot lost: resynced every table" for t in snap.tables})
        result.slot_created = True
        return result

    def _choose_options(self, conn: psycopg.Connection, result: CaptureResult) -> None:
        src = self.settings.source
        if src.plugin == "pgoutput":
            from loader.capture import pgoutput

            # Logical messages (the heartbeat) need the messages option, PostgreSQL 14+.
            self.options = pgoutput.peek_options(src.publication, messages=conn.info.server_version >= 140000)
            result.numeric_special_values = True
            return
        self.options = WAL2JSON_OPTIONS
        if slots.plugin_supports(conn, src.slot, *NUMERIC_AS_STRING_OPTION):
            self.options = WAL2JSON_OPTIONS + NUMERIC_AS_STRING_OPTION
            result.numeric_special_values = True
        # Every read of the slot (peeks and the fetcher's COPY) passes these.
        self.options += self.source_plan.wal2json_options()

    # --- the source-side filter ------------------------------------------------------------
    def _plan_source(self, conn: psycopg.Connection, result: CaptureResult) -> None:
        """List the tables, decide what the server may send, and (pgoutput) keep the publication in step."""
        self._role = current_role(conn)
        self.source_plan = captured_plan(conn, self.settings, self._role)
        if self.settings.source.plugin == "pgoutput" and self.watch:
            self._sync_publication(conn, result)
        result.skipped.update(self.source_plan.skipped)

    def _sync_publication(self, conn: psycopg.Connection, result: CaptureResult) -> None:
        """The publication lists exactly the captured tables; a table it did not list at the last
        run had its changes withheld until now, so it is resynced."""
        from loader.capture import pgoutput

        src = self.settings.source
        try:
            pgoutput.sync_publication(conn, src.publication, self.source_plan.wanted)
        except pgoutput.PublicationNotSynced as exc:
            log.warning("%s; %s", exc, exc.hint)
            result.notes.append(f"{exc} ({exc.hint})")
        self._published = pgoutput.published_tables(conn, src.publication)
        state = self.store.read_state(SOURCE_STATE) or {}
        before = state.get("published") if state.get("slot") == src.slot else None
        if self._published is None or before is None:
            return  # FOR ALL TABLES sends everything; first run: the slot starts after the publication
        for table in sorted(set(self._published) - set(before)):
            self._publication_resyncs[table] = (
                f"added to publication {src.publication}: changes made before that were not sent"
            )

    def _captured(self, table: str) -> bool:
        """The configuration includes it and the source-side filter did not skip it."""
        return self.filter(table) and table not in self.source_plan.skipped

    def _save_source_state(self, result: CaptureResult) -> None:
        """What ``loader status`` shows as skipped; the publication's list; the one-time notice."""
        src = self.settings.source
        state = self.store.read_state(SOURCE_STATE) or {}
        if state.get("slot") != src.slot:
            state = {"slot": src.slot}
        doc = dict(state)
        doc["skipped"] = dict(sorted(self.source_plan.skipped.items()))
        if self._published is not None:
            doc["published"] = sorted(self._published)
        if src.plugin == "wal2json" and self.source_plan.add_tables is None and not state.get("every_table_notice"):
            msg = (
                f"source.include {src.include!r} captures every current and future table of the source that "
                f"role {self._role} may SELECT (except source.exclude {src.exclude!r}); restrict it "
                'with source.include (e.g. ["public.*"]) or revoke SELECT from the role'
            )
            log.warning(msg)
            result.notes.append(msg)
            doc["every_table_notice"] = True
        for table, why in sorted(self.source_plan.skipped.items()):
            if state.get("skipped", {}).get(table) != why:
                log.warning("%s: %s", table, why)
        if doc != state:
            self.store.write_state(SOURCE_STATE, doc)

    def _finish_unfinished_snapshot(self) -> None:
        """A snapshot or resync that was interrupted resumes before streaming (it must land first)."""
        state = unfinished_snapshot(self.store)
        if state is None:
            return
        if not self.watch:
            self.check_no_snapshot_in_progress()
        log.warning("resuming the snapshot interrupted at consistent point %s", state.get("consistent_lsn"))
        snapshot(self.settings, self.store, on_published=self.on_published).run(locked=True)

    def check_no_snapshot_in_progress(self) -> None:
        state = unfinished_snapshot(self.store)
        if state is not None:
            raise SnapshotInProgressError(
                f"a snapshot of {len(state.get('tables', []))} tables at LSN {state.get('consistent_lsn')} is unfinished "
                f"in {self.store.url}; streaming now would land changes before the rest of it",
                hint="finish it with 'loader backfill snapshot' (it resumes where it stopped)",
            )

    # --- the catalog watch -----------------------------------------------------------------
    def _watch(self, conn: psycopg.Connection, result: CaptureResult) -> WatchPlan:
        """Compare the catalog with the last run; queue park records and resyncs."""
        src = self.settings.source
        state = self.store.read_state(CATALOG_STATE)
        # pgoutput sends logical messages from PostgreSQL 14 on; before that the trigger's never arrive.
        delivered = src.plugin != "pgoutput" or conn.info.server_version >= 140000
        trigger = ddl.ensure(conn, src.ddl_trigger and delivered)
        self._ddl_token = trigger.token
        # Every DDL since the last run is in the stream only if the same installation was in
        # place, enabled, at both runs (a trigger dropped and installed again has new oids).
        ddl_in_stream = trigger.token is not None and state is not None and state.get("ddl_trigger") == trigger.token
        view = read_facts(conn, src.partitions)
        self.facts, self.roots = view.facts, view.roots
        self._facts_by_oid = None
        self._roots_before = dict(state.get("partition_roots", {})) if state else {}
        before = {t: TableFacts.from_doc(d) for t, d in state["tables"].items()} if state else None
        included_before = set(state.get("included", [])) if state else set()
        plan = plan_watch(
            before,
            self.facts,
            self._captured,
            lambda t: t in included_before,
            src.resync_on_table_rewrite,
            roots_before=dict(state.get("partition_roots", {})) if state else {},
            roots_now=self.roots,
            ddl_in_stream=ddl_in_stream,
            skipped=self.source_plan.skipped,
        )
        self._ddl_known = ddl.known_from(before or {})
        self._ddl_names = {f.oid: t for t, f in (before or {}).items()}
        self._ddl_held = {t: f.oid for t, f in (before or {}).items()}
        self._ddl_in_stream, self._before = ddl_in_stream, before
        self._first_seen = first_seen(before, self.facts)
        if before is not None and not ddl_in_stream:  # the DDL trigger's messages name type changes
            new = {t: self.facts[t] for t in self._first_seen if self._captured(t)}
            if new:
                rows = conn.execute(TYPES_CHANGED_SQL, ([f.oid for f in new.values()],)).fetchall()
                for table, why in plan_types_changed(rows, new).items():
                    plan.resync.setdefault(table, why)
        pending = dict(state.get("pending_resyncs", {})) if state else {}
        # Resyncs another process asked for (continuous verification's auto-repair): pending from
        # now on, saved with the catalog state, then the request is cleared.
        self._requested = dict((self.store.read_state(RESYNC_REQUESTS) or {}).get("tables", {}))
        pending.update({t: f"requested: {why}" for t, why in self._requested.items()})
        for table, why in self._publication_resyncs.items():
            plan.resync.setdefault(table, why)
        if src.auto_resync:
            pending.update(plan.resync)
        else:
            for table, reason in plan.resync.items():
                plan.park.setdefault(
                    table, f"{reason}; run 'loader resync --table {table}' (source.auto_resync is off)"
                )
        # Until its resync lands, a table's current table stops here: after the last landed
        # change, before anything the catalog change touched.
        parks = {t: f"waiting for a resync: {why}" for t, why in plan.resync.items()}
        parks.update(plan.park)
        self.controls.pending = sorted(parks.items())
        result.parked.update(parks)
        result.notes += plan.notes
        self._pending_resyncs = pending
        return plan

    def _save_catalog_state(self, plan: WatchPlan) -> None:
        """After the park records are durable: what the catalog looks like now, and resyncs to do."""
        self.store.write_state(
            CATALOG_STATE,
            {
                "version": 1,
                "tables": {t: f.to_doc() for t, f in sorted(self.facts.items())},
                "included": sorted(t for t in self.facts if self._captured(t)),
                "partition_roots": dict(sorted(self.roots.items())),
                "pending_resyncs": dict(sorted(self._pending_resyncs.items())),
                "ddl_trigger": self._ddl_token,
            },
        )
        if self._requested:
            self.store.write_state(RESYNC_REQUESTS, {"tables": {}})
            self._requested = {}

    # --- DDL in the stream ------------------------------------------------------------------
    def _on_ddl(self, decoder: Any, result: CaptureResult) -> None:
        """DDL messages of a transaction that just committed (loader.capture.ddl): a table whose
        stored rows the DDL changed outside the WAL is parked right after it and resynced at the end
        of the run. The resync is recorded as requested before the slot can move past the message,
        so a run killed after that still does it."""
        messages, decoder.ddl = decoder.ddl, []
        wanted: dict[str, str] = {}
        for msg in messages:
            if msg.error:
                self._ddl_incomplete = True
                result.notes.append(
                    f"the DDL trigger could not describe a {msg.doc.get('tag', 'DDL')} at {format_lsn(msg.lsn)} "
                    f"({msg.error}): this run compares catalogs only"
                )
                continue
            plan = ddl.plan_message(msg, self._ddl_known, self._landed_as, self._ddl_names, self._ddl_held)
            result.notes += plan.notes
            for table, why in plan.resync.items():
                if not self._captured(table) or (self.watch and table in self._pending_resyncs):
                    continue  # not captured, or already parked (earlier) and waiting for its resync
                why = f"{why} (DDL at {format_lsn(msg.lsn)})"
                wanted[table] = f"{wanted[table]}; {why}" if table in wanted else why
        self._want_resyncs(wanted, result)

    def _want_resyncs(self, wanted: dict[str, str], result: CaptureResult) -> None:
        """Park each table right here and resync it at the end of the run; the resync is recorded
        as requested at once (before the slot can move past what asked for it), so a run killed
        after that still does it."""
        if not wanted:
            return
        if not self.settings.source.auto_resync:
            for table, why in wanted.items():
                parked = f"{why}; run 'loader resync --table {table}' (source.auto_resync is off)"
                self.controls.pending.append((table, parked))
                result.parked[table] = parked
            return
        requests = dict((self.store.read_state(RESYNC_REQUESTS) or {}).get("tables", {}))
        requests.update(wanted)
        self.store.write_state(RESYNC_REQUESTS, {"tables": requests})
        if not self.watch:
            return  # a nested run (inside a resync): the next run takes the requests
        self._requested.update(wanted)
        for table, why in wanted.items():
            earlier = self._pending_resyncs.get(table)
            self._pending_resyncs[table] = f"{earlier}; {why}" if earlier and why not in earlier else (earlier or why)
            parked = f"waiting for a resync: {why}"
            self.controls.pending.append((table, parked))
            result.parked[table] = parked

    def _check_stream_table(self, rec: ChangeRecord, result: CaptureResult) -> None:
        """The first change of a table in this run (``rec``, routed to its root), by the names and
        transaction the stream carries: what the catalog's pictures cannot explain (a table created
        since the last run, then renamed, dropped or created again, or with a column renamed) parks
        and resyncs (``watch.plan_stream_table``)."""
        qualified = rec.qualified_table
        if not self.watch or not self.facts or not self._captured(qualified):
            return
        plan = plan_stream_table(
            qualified,
            [(c.name, c.type) for c in rec.columns],
            self._before,
            self.facts,
            self._first_seen,
            self._captured,
            self._ddl_in_stream,
            rec.xid or None,
        )
        for table, why in plan.park.items():
            if table not in result.parked:
                self.controls.pending.append((table, why))
                result.parked[table] = why
        self._want_resyncs({t: why for t, why in plan.resync.items() if t not in self._pending_resyncs}, result)

    def _landed_as(self, table: str, root: str | None, oid: int) -> str | None:
        """The table a source table's changes land as: its root, for a partition with partitions =
        root; else its name in this run's catalog picture (renamed since), None if it is gone (a
        nested run has no picture: the name in the message)."""
        if self.settings.source.partitions == "root" and root:
            return root
        if not self.facts:
            return table
        if self._facts_by_oid is None or len(self._facts_by_oid) != len(self.facts):
            self._facts_by_oid = {f.oid: t for t, f in self.facts.items()}
        return self._facts_by_oid.get(oid)

    def _settle_deferred(self, plan: WatchPlan, result: CaptureResult) -> None:
        """Rewrites the catalog showed without a column change, with the DDL trigger in place: a
        table_rewrite message in the stream resyncs the table (``_on_ddl``); without one the
        rewrite was TRUNCATE (in the stream), VACUUM FULL, CLUSTER or SET TABLESPACE, and nothing
        is resynced, unless a DDL message said it could not be made (then as without the trigger)."""
        for table, why in sorted(plan.deferred.items()):
            if table in self._pending_resyncs:
                continue
            if self._ddl_incomplete:
                self._pending_resyncs[table] = why
                parked = f"waiting for a resync: {why}"
                self.controls.pending.append((table, parked))
                result.parked[table] = parked
            else:
                result.notes.append(
                    f"{table}: rewritten without a rewriting ALTER (the DDL trigger saw none: TRUNCATE, "
                    "VACUUM FULL, CLUSTER or SET TABLESPACE), so not resynced"
                )

    def _resync(self, result: CaptureResult) -> None:
        """Run the pending resyncs (a consistent snapshot of each table through a temporary slot)."""
        pending = {t: r for t, r in self._pending_resyncs.items() if t in self.facts and self._captured(t)}
        if not pending:
            if self._pending_resyncs:
                self._pending_resyncs = {}
                self._save_catalog_state(WatchPlan())
            return
        checkpoint("capture-before-resync")
        snap = snapshot(
            self.settings, self.store, tables=sorted(pending), reasons=pending, on_published=self.on_published
        )
        done = snap.run(locked=True)
        result.files += done.files
        result.resynced.update({t: pending[t] for t in done.tables})
        self._pending_resyncs = {}
        self._save_catalog_state(WatchPlan())

    # --- the stream ------------------------------------------------------------------------
    def _peek(self, conn: psycopg.Connection, upto: str) -> Iterator[tuple[Any, ...]]:
        src = self.settings.source
        fn = "pg_logical_slot_peek_binary_changes" if src.plugin == "pgoutput" else "pg_logical_slot_peek_changes"
        placeholders = ", ".join(["%s"] * len(self.options))
        # The data column is read as raw bytes: a SQL_ASCII source can hold invalid UTF-8, which
        # must reach the decoder (and be quarantined) instead of failing the fetch.
        sql = f"SELECT lsn::text, data FROM {fn}(%s, %s::pg_lsn, %s, {placeholders})"
        with conn.cursor(name="loader_capture") as cur:
            cur.adapters.register_loader("text", _RawText)
            cur.itersize = src.fetch_size
            try:
                cur.execute(sql, (src.slot, upto, self.round_changes, *self.options))
            except psycopg.errors.InsufficientPrivilege as exc:
                from loader.errors import SourceError

                raise SourceError(
                    f"the source role may not read replication slot {src.slot!r}: {str(exc).strip()}",
                    hint="the loader's role needs the REPLICATION attribute (on RDS: GRANT rds_replication)",
                ) from exc
            yield from cur

    def _decoder(self, conn: psycopg.Connection) -> Any:
        if self.settings.source.plugin == "pgoutput":
            from loader.capture import pgoutput

            return pgoutput.PgOutputDecoder(pgoutput.format_type_lookup(conn))
        return Wal2JsonDecoder()

    def _round(
        self,
        conn: psycopg.Connection,
        upto: str,
        landed: ChangePosition | None,
        result: CaptureResult,
    ) -> tuple[int, ChangePosition | None]:
        """One peek of at most ``round_changes`` changes: land them, then confirm them on the slot.

        Returns (rows read, landed position); 0 rows ends the run.
        """
        from loader.lsn import parse_lsn

        src = self.settings.source
        decoder = self._decoder(conn)
        writer = self._writer()
        lander = _Lander(self, conn, writer, landed, result)
        rows = 0
        strict_outside = src.plugin == "pgoutput"
        try:
            with conn.transaction():
                for row_lsn, data in self._peek(conn, upto):
                    rows += 1
                    records = decoder.feed(data, parse_lsn(row_lsn.decode())) if strict_outside else decoder.feed(data)
                    for rec in records:
                        lander.land(rec)
                    if decoder.ddl:
                        self._on_ddl(decoder, result)
                    if strict_outside and decoder.quarantined_outside_transaction:
                        raise DecodeError(
                            f"pgoutput message outside a transaction could not be decoded ({decoder.last_outside_reason})",
                            hint="the slot was not advanced past it; re-run capture",
                        )
            self._end_read(decoder, writer, result)
        except BaseException:
            writer.abort()
            raise
        result.messages_skipped += decoder.messages_skipped
        self._heartbeats += decoder.heartbeats
        confirm = decoder.confirm_lsn
        if not rows:
            return 0, landed
        if confirm is None or confirm == self._last_confirm:
            # Nothing new to confirm: another peek would return the same rows; stop rather than spin.
            return 0, landed
        self._confirm(conn, confirm)
        new_landed = self.store.landed_position() if result.files else landed
        return rows, new_landed

    def _pipelined(self, start: slots.SlotInfo | None, upto: str) -> bool:
        """Read through a consumed copy of the slot (``loader.capture.stream``) when the backlog is
        big enough to pay for the copy and its fetcher process; peek otherwise."""
        src = self.settings.source
        if src.plugin != "wal2json" or src.pipeline_min_lag_mb < 0 or start is None:
            return False
        begin = start.confirmed_flush_lsn
        return begin is not None and parse_lsn(upto) - begin >= src.pipeline_min_lag_mb * 1024 * 1024

    def _fetcher(self, upto: str) -> RoundFetcher | None:
        """The fetcher process of a pipelined read, launched; None if it cannot start here."""
        src = self.settings.source
        fetcher = RoundFetcher(src.conninfo(), src.slot, self.options, parse_lsn(upto), src.pipeline_round_rows)
        try:
            fetcher.launch()
        except OSError as exc:
            log.warning("cannot start the capture's fetcher process (%s); capture peeks instead", exc)
            return None
        return fetcher

    def _stream(
        self, conn: psycopg.Connection, fetcher: RoundFetcher, landed: ChangePosition | None, result: CaptureResult
    ) -> bool:
        """Land everything up to ``upto`` through a pipelined copy of the slot; False when the slot
        cannot be copied here (the caller peeks instead).

        The files are published as they fill, and after each the slot is confirmed to the end of
        the last transaction fed to the decoder: every record written before it is in a published
        file, and a transaction still open has not moved the decoder's confirm position.
        """
        try:
            fetcher.wait_ready()
        except PipelineUnavailable as exc:
            log.warning("%s; capture peeks instead", exc)
            return False
        decoder = Wal2JsonDecoder()
        writer = self._writer()
        lander = _Lander(self, conn, writer, landed, result)
        try:
            try:
                published = len(result.files)
                columnar = writer.format in STREAM_FORMATS and self.settings.source.columnar_decode

                def one_by_one(lines: list[bytes]) -> None:
                    nonlocal published
                    result.pipelined_rows += len(lines)
                    for data in lines:
                        for rec in decoder.records(data):
                            lander.land(rec)
                        if decoder.ddl:
                            self._on_ddl(decoder, result)
                        if len(result.files) != published:
                            published = len(result.files)
                            self._confirm(conn, decoder.confirm_lsn, final=False)

                for block in fetcher.blocks():
                    if isinstance(block, list):
                        one_by_one(block)
                        continue
                    for piece, plain in wal2json_arrow.runs(block) if columnar else [(block, False)]:
                        if plain and decoder.holds_messages:
                            # The open transaction carries a message its commit acts on: row by
                            # row through that commit.
                            end = wal2json_arrow.commit_end(piece)
                            one_by_one(piece[:end].split(b"\n")[:-1])
                            piece = piece[end:]
                        if plain and piece and lander.land_block(piece, decoder):
                            rows = piece.count(b"\n")
                            result.pipelined_rows += rows
                            result.columnar_rows += rows
                            if len(result.files) != published:
                                published = len(result.files)
                                self._confirm(conn, lander.confirmable, final=False)
                            continue
                        one_by_one(piece.split(b"\n")[:-1])
                self._end_read(decoder, writer, result)
            except BaseException:
                writer.abort()
                raise
        finally:
            fetcher.close()  # its copy of the slot goes with it
        result.messages_skipped += decoder.messages_skipped
        self._heartbeats += decoder.heartbeats
        self._confirm(conn, decoder.confirm_lsn)
        return True

    def _end_read(self, decoder: Any, writer: LandingWriter, result: CaptureResult) -> None:
        """The end of a round or a pipelined read: no transaction left open, the last file published."""
        if decoder.in_transaction:
            raise LandingError("slot returned a transaction without its commit; re-run capture")
        writer.close_file()
        self._drain(writer, result)

    def _confirm(self, conn: psycopg.Connection, confirm: int | None, final: bool = True) -> None:
        """Advance the slot to ``confirm``: everything before it is in published files.

        Not ``final`` (a file published in the middle of a pipelined read, whose rounds come from a
        copy of the slot): only once ``source.confirm_interval_s`` has passed since the last advance.
        PostgreSQL decodes an advance from the slot's restart position, which moves only at the
        server's running-transactions records (every 15 s or so): advancing after every file read
        the same WAL again each time, a cost that grew with the square of the backlog. A crash
        re-reads at most that interval's changes, which the landed position skips."""
        if confirm is None or confirm == self._last_confirm:
            return
        src = self.settings.source
        if self._progress is not None and self._begin is not None:
            self._progress.n = max(0, confirm - self._begin)
            self._progress.refresh()
        if not final and time.monotonic() - self._last_advance < src.confirm_interval_s:
            return
        record_confirmed(self.store, src.slot, confirm)
        checkpoint("capture-before-advance")
        slots.advance_slot(conn, src.slot, confirm, settle=final)
        checkpoint("capture-after-advance")
        self._last_confirm = confirm
        self._last_advance = time.monotonic()

    def _to_root(self, conn: psycopg.Connection, rec: ChangeRecord, result: CaptureResult) -> ChangeRecord:
        """A partition's change is its partitioned table's change (source.partitions = root).

        A TRUNCATE of one partition cannot be told as a truncate of the whole table: it parks the
        table at that point and resyncs it.
        """
        if self.settings.source.partitions != "root" or rec.op in (COMMIT, "X"):
            return rec
        qualified = rec.qualified_table
        root = self.roots.get(qualified)
        if root is None and qualified not in self.facts:
            root = self._lookup_root(conn, rec.schema, rec.table)  # a table or partition created during the run
            if root is None:
                # Gone from the catalog (dropped alone or with its partitioned table): the last run knew its root.
                root = self._roots_before.get(qualified)
        if root is None:
            return rec
        schema, table = split_qualified(conn, root)
        if rec.op == "T":
            why = f"partition {rec.qualified_table} was truncated: a partition's rows cannot be told apart downstream"
            earlier = self._pending_resyncs.get(root)
            self._pending_resyncs[root] = f"{earlier}; {why}" if earlier and why not in earlier else (earlier or why)
            result.parked[root] = f"waiting for a resync: {why}"
            return ChangeRecord(
                op="P",
                commit_lsn=rec.commit_lsn,
                seq=rec.seq,
                xid=rec.xid,
                ts=rec.ts,
                schema=schema,
                table=table,
                change_lsn=rec.change_lsn,
                reason=result.parked[root],
            )
        rec.schema, rec.table = schema, table
        return rec

    def _lookup_root(self, conn: psycopg.Connection, schema: str, table: str) -> str | None:
        key = f"{schema}.{table}"
        if key in self._not_partitions:
            return None
        if key not in self.roots:
            row = conn.execute(
                "SELECT rn.nspname || '.' || r.relname FROM pg_class c JOIN pg_class r ON r.oid = pg_partition_root(c.oid)"
                " JOIN pg_namespace rn ON rn.oid = r.relnamespace"
                " WHERE c.oid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) AND c.relispartition",
                (schema, table),
            ).fetchone()
            if not row:
                self._not_partitions.add(key)
                return None
            self.roots[key] = row[0]
        return self.roots[key]

    def _writer(self) -> LandingWriter:
        """A writer of the change stream's landing files, in ``source.stream_format``."""
        src = self.settings.source
        return LandingWriter(self.store, src.max_changes_per_file, format=stream_landing_format(src.stream_format))

    def _flush_controls(self, result: CaptureResult) -> None:
        """Park records of an idle run (no transaction to follow) land in a file of their own."""
        if not self.controls.pending:
            return
        writer = self._writer()
        try:
            self.controls.flush(writer, _now_text())
            writer.close_file()
        except BaseException:
            writer.abort()
            raise
        self._drain(writer, result)

    def _drain(self, writer: LandingWriter, result: CaptureResult) -> None:
        writer.drain(result.files, "capture-after-publish", self.on_published)

    def _complete_key(self, rec: ChangeRecord, qualified: str, result: CaptureResult) -> None:
        """The downstream key of the record's table: its replica identity, when it carries
        updates and deletes (else none: the table gets history only)."""
        if rec.op in ("T", "X"):
            return
        facts = self.facts.get(qualified)
        origin: Any = facts if facts is not None else (self.keys.info(rec.schema, rec.table) if self.keys else None)
        if origin is None:
            return  # dropped since: the stream's own key is all we have
        cached = self._keys_of.get(qualified)
        if cached is None or cached[0] is not origin:
            # Once per table (and again when its catalog facts are re-read): both are immutable.
            info = facts.info if facts is not None else origin
            cached = self._keys_of[qualified] = (origin, info, list(info.key))
        _, info, rec.pk = cached
        if not rec.pk:
            result.limited_tables.setdefault(rec.qualified_table, info.downstream)

    def _wanted(self, conn: psycopg.Connection, rec: ChangeRecord, qualified: str, result: CaptureResult) -> bool:
        """Asked once per table and run (``_Lander.routes``), after the server's own filter: a
        table created or renamed since this run's listing is checked for the role's right here."""
        if rec.op == "X" and not rec.table:
            return True  # its table is unknown: the load must see it to park what may have lost a change
        if not self._captured(qualified):
            return False
        why = None
        if qualified not in self.source_plan.known:
            why = why_not_readable(conn, qualified, self._role or current_role(conn))
        if why:
            self.source_plan.skipped[qualified] = result.skipped[qualified] = why
            return False
        return True


def snapshot(
    settings: LoaderSettings,
    store: LandingStore | None = None,
    *,
    on_published: Callable[[str], None] | None = None,
    **options: Any,
) -> Snapshot:
    """A snapshot (or resync) of tables, wired to this capture: tables added while the slot exists
    first get every change the main slot holds that committed before the snapshot's consistent point."""
    store = store or open_landing(settings)

    def stream_until(lsn: int) -> tuple[int, list[str]]:
        done = Capture(settings, store, on_published=on_published, watch=False).run(
            create_slot=False, upto_lsn=lsn, locked=True
        )
        return done.changes, done.files

    def drain() -> tuple[int, list[str]]:
        # Everything up to the WAL's end now, with a heartbeat when they are on, so the slot is
        # confirmed past WAL that other databases wrote too; the catalog watch waits for the next run.
        done = Capture(
            settings, store, on_published=on_published, watch=False, heartbeat=settings.source.heartbeat_interval_s > 0
        ).run(create_slot=False, locked=True)
        return done.changes, done.files

    return Snapshot(settings, store, on_published=on_published, stream_until=stream_until, drain=drain, **options)


_warned: set[tuple[str, str]] = set()


def _warn_once(key: tuple[str, str], msg: str, *args: Any) -> None:
    """A warning given once per process (a follow-mode process runs capture every few seconds)."""
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


class _RawText(psycopg.adapt.Loader):
    """Load text columns as bytes: decoding (and quarantining invalid UTF-8) is the decoder's job."""

    def load(self, data: Any) -> bytes:
        return bytes(data)


def _now_text() -> str:
    from datetime import datetime

    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")


# Row changes, whose handling depends only on their table: routed once per table and run.
_ROUTED_OPS = frozenset("IUD")
_Route = tuple[str, str, str, "list[str] | None"]  # schema, table, qualified name, key (None: the stream's)


class _Lander:
    """Puts one run's decoded records into landing files: skips what an earlier run landed and
    what the filters exclude, maps partitions to their root, completes keys, writes pending park
    records at transaction boundaries, and counts.

    What a row change needs from the catalog (its root, whether it is wanted, its key) depends only
    on its table, and the catalog picture is fixed for the run: it is worked out for the first
    change of each table and reused (``routes``).
    """

    def __init__(
        self,
        capture: Capture,
        conn: psycopg.Connection,
        writer: LandingWriter,
        landed: ChangePosition | None,
        result: CaptureResult,
    ) -> None:
        self.capture = capture
        self.conn = conn
        self.writer = writer
        self.landed = landed
        self.result = result
        self.txn_has_output = False
        self.routes: dict[tuple[str, str], _Route | None] = {}
        self.checked: set[tuple[str, str]] = set()  # tables whose names were checked (already landed)
        self.confirmable: int | None = None  # see land_block

    def land(self, rec: ChangeRecord) -> None:
        capture, writer, result = self.capture, self.writer, self.result
        if self.landed is not None:
            if rec.position <= self.landed:
                if rec.op != COMMIT:
                    result.skipped_already_landed += 1
                    if rec.op in _ROUTED_OPS and (rec.schema, rec.table) not in self.checked:
                        # Landed by a run that may have stopped before acting on its names.
                        self.checked.add((rec.schema, rec.table))
                        rec = capture._to_root(self.conn, rec, result)
                        capture._check_stream_table(rec, result)
                return
            self.landed = None  # records come in commit order: every later one is past it too
        op = rec.op
        if op == COMMIT:
            if self.txn_has_output:
                writer.write(rec)
                capture.controls.after(rec)
                result.transactions += 1
                capture.controls.flush(writer, rec.ts)
            self.txn_has_output = False
            return
        if op in _ROUTED_OPS:
            where = (rec.schema, rec.table)
            route = self.routes[where] if where in self.routes else self._route(where, rec)
            if route is None:
                return
            rec.schema, rec.table, qualified, pk = route
            if pk is not None:
                rec.pk = pk
            if not self.txn_has_output:
                capture.controls.flush(writer, rec.ts)
        else:
            rec = capture._to_root(self.conn, rec, result)
            qualified = rec.qualified_table
            if not capture._wanted(self.conn, rec, qualified, self.result):
                return
            if not self.txn_has_output:
                capture.controls.flush(writer, rec.ts)
            capture._complete_key(rec, qualified, result)
            if op == "X":
                result.quarantined += 1
        result.tables.add(qualified)
        self.txn_has_output = True
        writer.write(rec, qualified)
        capture.controls.after(rec)
        result.changes += 1
        if writer.published:
            capture._drain(writer, result)

    def land_block(self, data: bytes, decoder: Wal2JsonDecoder) -> bool:
        """Land a block of wal2json rows (whole lines) in columns, as :meth:`land` would each of
        their records, and move ``decoder`` past them; ``confirmable`` is then the slot position
        that the files published meanwhile make safe to confirm. False when the block is not for
        this path (records a run before landed, park records waiting, rows not plain: see
        :mod:`loader.capture.wal2json_arrow`): then nothing was done."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from loader.landing import changefile

        capture, result = self.capture, self.result
        self.confirmable = None
        if capture.controls.pending:
            return False
        block = wal2json_arrow.decode_block(data, decoder)
        if block is None:
            return False
        batch = block.batch
        if self.landed is not None:
            # A run before this one landed records up to ``landed``: the row path skips them (and
            # checks their tables' names). Records come in commit order, so a block whose first
            # record lies past it lies past it whole.
            if not batch.num_rows:
                return False
            first = ChangePosition(batch.column(1)[0].as_py(), batch.column(2)[0].as_py())
            if first <= self.landed:
                return False
            self.landed = None
        is_commit = pc.equal(batch.column(0), COMMIT)
        commit = is_commit.to_numpy(zero_copy_only=False)
        keys = pc.binary_join_element_wise(batch.column(6), batch.column(7), "\x00")
        tables = pc.unique(pc.filter(keys, pc.invert(is_commit))).to_pylist()
        wheres = [(schema, table) for schema, _, table in (key.partition("\x00") for key in tables)]
        for key, where in zip(tables, wheres, strict=True):
            if where not in self.routes:
                first = pc.index(keys, key).as_py()
                self._route(where, next(changefile.batch_records(batch.slice(first, 1))))
        if capture.controls.pending:
            return False  # the first change of a table asked for a park: the row path places it
        routes = [self.routes[where] for where in wheres]
        # Each record's table by its number in ``tables``; commit markers get the number after them.
        which = pc.index_in(keys, value_set=pa.array(tables, pa.string()))
        which = which.fill_null(len(tables)).to_numpy(zero_copy_only=False)
        wanted = np.array([r is not None for r in routes] + [False], bool)
        keep = wanted[which]
        # A transaction's commit marker is landed when the transaction landed something.
        txn = block.txn
        had = np.zeros(block.txns, bool)
        had[txn[keep]] = True
        if block.carried:
            had[0] |= self.txn_has_output
        keep |= commit & had[txn]
        # Partitions land as their root, and a key completed from the catalog replaces the stream's.
        qualified = [r[2] if r is not None else None for r in routes] + [None]
        kept = np.flatnonzero(keep)
        at = pa.array(which[kept])
        names = pa.array(qualified, pa.string()).take(at)
        out = wal2json_arrow.rows_at(batch, kept)
        if any(r is not None and (r[0], r[1]) != where for r, where in zip(routes, wheres, strict=True)):
            schemas = pa.array([r[0] if r else "" for r in routes] + [""], pa.string()).take(at)
            names_only = pa.array([r[1] if r else "" for r in routes] + [""], pa.string()).take(at)
            fields = changefile.arrow_schema()
            out = out.set_column(6, fields.field(6), schemas).set_column(7, fields.field(7), names_only)
        if any(r is not None and r[3] is not None for r in routes):
            pk = changefile.arrow_schema().field("pk")
            override = pa.array([r[3] if r is not None else None for r in routes] + [None], pk.type).take(at)
            out = out.set_column(10, pk, pc.if_else(pc.is_null(override), out.column(10), override))
        before = decoder.confirm_lsn
        closed = self.writer.write_batch(out, names, None if block.shapes is None else block.shapes[kept])
        block.accept(decoder)
        # What the records did to the run's counts and state, as land() keeps them.
        out_commit = commit[kept]
        landed_commits = int(out_commit.sum())
        result.changes += len(kept) - landed_commits
        result.transactions += landed_commits
        result.tables.update(pc.unique(names.drop_null()).to_pylist())
        if len(kept):
            last_commit = np.flatnonzero(out_commit)
            if len(last_commit):
                i = kept[last_commit[-1]]
                capture.controls.boundary = ChangePosition(
                    int(batch.column(1)[i].as_py()), int(batch.column(2)[i].as_py())
                )
            capture.controls.at_boundary = bool(out_commit[-1])
        self.txn_has_output = block.state is not None and bool(had[block.txns - 1])
        if self.writer.published:
            capture._drain(self.writer, result)
        if closed:
            last = closed[-1]
            self.confirmable = before if last < 0 else (int(block.confirm[kept[last]]) or None)
        return True

    def _route(self, where: tuple[str, str], rec: ChangeRecord) -> _Route | None:
        """The general path, for the first row change of a table in this run; remembered."""
        capture = self.capture
        rec = capture._to_root(self.conn, rec, self.result)
        qualified = rec.qualified_table
        route: _Route | None = None
        if capture._wanted(self.conn, rec, qualified, self.result):
            capture._check_stream_table(rec, self.result)
            stream_pk = rec.pk
            capture._complete_key(rec, qualified, self.result)
            capture._note_exposed(qualified, rec, self.result)
            route = (rec.schema, rec.table, qualified, None if rec.pk is stream_pk else rec.pk)
        self.routes[where] = route
        return route
