"""The capture run: decode the slot, write landing files, advance the slot only after publishing.

Crash safety: the slot's confirmed position is advanced only to the end of transactions whose
changes are all published. After a crash, decoding restarts from the slot, and every change at
or before the last landed position (read back from the landing file names) is skipped, so the
landing area holds each change exactly once.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field

from loader.capture import slot as slots
from loader.capture.landing import LandingStore, LandingWriter, open_landing
from loader.capture.records import COMMIT, ChangeRecord
from loader.capture.source_tables import KeyLookup, column_numbers, detect_renames
from loader.capture.wal2json import NUMERIC_AS_STRING_OPTION, WAL2JSON_OPTIONS, Wal2JsonDecoder
from loader.config import LoaderSettings
from loader.errors import LandingError, TransientError
from loader.lsn import ChangePosition, format_lsn

# Name of the state object an unfinished snapshot leaves in the landing area (see snapshot.py).
SNAPSHOT_STATE = "snapshot.state.json"
# attnum -> name of the columns of every captured table, as of the last capture (rename detection).
COLUMNS_STATE = "columns.state.json"


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
    slot_created: bool = False
    # Tables seen in this run whose changes cannot give a current table, with the reason.
    limited_tables: dict[str, str] = field(default_factory=dict)
    numeric_special_values: bool = False  # wal2json keeps NaN/Infinity (numeric-data-types-as-string)
    tables: set[str] = field(default_factory=set)  # tables with changes landed in this run
    renamed_columns: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lsn = format_lsn(self.confirmed_lsn) if self.confirmed_lsn is not None else "-"
        text = (
            f"captured {self.changes} changes in {self.transactions} transactions into "
            f"{len(self.files)} landing files; slot confirmed at {lsn}; lag {self.lag_bytes} bytes, "
            f"retained WAL {self.retained_wal_bytes} bytes"
            + (f"; skipped {self.skipped_already_landed} already landed" if self.skipped_already_landed else "")
        )
        for table, what in sorted(self.limited_tables.items()):
            text += f"\n  note: {table}: {what}"
        for rename in self.renamed_columns:
            text += f"\n  note: {rename}"
        return text


class TableFilter:
    """Include/exclude ``schema.table`` glob patterns; exclusions win."""

    def __init__(self, include: list[str], exclude: list[str]) -> None:
        self.include = include or ["*.*"]
        self.exclude = exclude

    def __call__(self, qualified: str) -> bool:
        if any(fnmatch.fnmatchcase(qualified, p) for p in self.exclude):
            return False
        return any(fnmatch.fnmatchcase(qualified, p) for p in self.include)


class Capture:
    """One capture run against the configured slot."""

    def __init__(
        self,
        settings: LoaderSettings,
        store: LandingStore | None = None,
        *,
        on_published: Callable[[str], None] | None = None,
        round_changes: int | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or open_landing(settings)
        self.filter = TableFilter(settings.source.include, settings.source.exclude)
        # Test seam and hook: called after each file is durable, before the slot moves.
        self.on_published = on_published
        self.round_changes = round_changes or max(settings.source.max_changes_per_file * 4, 10_000)
        self.options: tuple[str, ...] = WAL2JSON_OPTIONS  # extended in run() by what the plugin supports
        self.keys: KeyLookup | None = None

    def run(self, create_slot: bool = True, *, upto_lsn: int | None = None, locked: bool = False) -> CaptureResult:
        """Capture every transaction committed before ``upto_lsn`` (default: the WAL end now).

        ``locked``: the caller already holds the slot's capture lock (snapshot does).
        """
        src = self.settings.source
        result = CaptureResult()
        with slots.connect(src.dsn) as conn:
            slots.check_wal_level(conn)
            if not locked:
                slots.capture_lock(conn, src.slot)
                self.check_no_snapshot_in_progress()
            if slots.slot_info(conn, src.slot) is None:
                if not create_slot or self.store.files():
                    slots.require_slot(conn, src.slot)  # raises SlotMissingError with the fix
                slots.create_slot(conn, src.slot)
                result.slot_created = True
            slots.require_slot(conn, src.slot)
            self.options = WAL2JSON_OPTIONS
            if slots.plugin_supports(conn, src.slot, *NUMERIC_AS_STRING_OPTION):
                self.options = WAL2JSON_OPTIONS + NUMERIC_AS_STRING_OPTION
                result.numeric_special_values = True
            self.keys = KeyLookup(conn)
            if upto_lsn is None:
                row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                assert row is not None
                upto = row[0]
            else:
                upto = format_lsn(upto_lsn)
            landed = self.store.landed_position()
            while True:
                rows, landed = self._round(conn, upto, landed, result)
                if rows == 0:
                    break
            self._note_renames(conn, result)
            info = slots.slot_info(conn, src.slot)
            if info is not None:
                result.confirmed_lsn = info.confirmed_flush_lsn
                result.lag_bytes = info.lag_bytes
                result.retained_wal_bytes = info.retained_wal_bytes
        return result

    def _note_renames(self, conn: "slots.psycopg.Connection", result: CaptureResult) -> None:
        """Report columns renamed since the last capture (same attnum, new name).

        wal2json only prints names, so downstream sees a rename as a new column; this note tells the
        operator which new column continues which old one.
        """
        if not result.tables:
            return
        state = self.store.read_state(COLUMNS_STATE) or {}
        for qualified in sorted(result.tables):
            schema, _, table = qualified.partition(".")
            now = column_numbers(conn, schema, table)
            for old, new in detect_renames(state.get(qualified, {}), now):
                result.renamed_columns.append(
                    f"{qualified}: column {old!r} was renamed to {new!r} (same attnum); history holds it as a new column"
                )
            if now:
                state[qualified] = now
        self.store.write_state(COLUMNS_STATE, state)

    def check_no_snapshot_in_progress(self) -> None:
        state = self.store.read_state(SNAPSHOT_STATE)
        if state is not None and not state.get("done"):
            raise SnapshotInProgressError(
                f"a snapshot of {len(state.get('tables', []))} tables at LSN {state.get('consistent_lsn')} is unfinished "
                f"in {self.store.url}; streaming now would land changes before the rest of it",
                hint="finish it with 'loader backfill snapshot' (it resumes where it stopped)",
            )

    def _round(
        self,
        conn: "slots.psycopg.Connection",
        upto: str,
        landed: ChangePosition | None,
        result: CaptureResult,
    ) -> tuple[int, ChangePosition | None]:
        src = self.settings.source
        decoder = Wal2JsonDecoder()
        writer = LandingWriter(self.store, src.max_changes_per_file)
        rows = 0
        txn_has_output = False
        options = self.options
        placeholders = ", ".join(["%s"] * len(options))
        sql = (
            "SELECT data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, %s, "
            + placeholders
            + ")"
        )
        try:
            with conn.transaction():
                with conn.cursor(name="loader_capture") as cur:
                    cur.itersize = src.fetch_size
                    cur.execute(sql, (src.slot, upto, self.round_changes, *options))
                    for (data,) in cur:
                        rows += 1
                        for rec in decoder.feed(data):
                            if landed is not None and rec.position <= landed:
                                if rec.op != COMMIT:
                                    result.skipped_already_landed += 1
                                continue
                            if rec.op == COMMIT:
                                if txn_has_output:
                                    writer.write(rec)
                                    result.transactions += 1
                                txn_has_output = False
                                continue
                            if not self._wanted(rec):
                                continue
                            self._complete_key(rec, result)
                            result.tables.add(rec.qualified_table)
                            txn_has_output = True
                            writer.write(rec)
                            result.changes += 1
                            self._drain(writer, result)
            if decoder.in_transaction:
                raise LandingError("slot returned a transaction without its commit; re-run capture")
            writer.close_file()
            self._drain(writer, result)
        except BaseException:
            writer.abort()
            raise
        if rows and decoder.last_commit_end_lsn is not None:
            slots.advance_slot(conn, src.slot, decoder.last_commit_end_lsn)
        new_landed = self.store.landed_position() if result.files else landed
        return rows, new_landed

    def _drain(self, writer: LandingWriter, result: CaptureResult) -> None:
        while writer.published:
            name = writer.published.pop(0)
            result.files.append(name)
            if self.on_published is not None:
                self.on_published(name)

    def _complete_key(self, rec: ChangeRecord, result: CaptureResult) -> None:
        """Give changes of a table keyed by a replica identity index that key (wal2json sends none),
        and note tables whose changes cannot build a current table."""
        if rec.op == "T":
            return
        info = self.keys.info(rec.schema, rec.table) if self.keys is not None else None
        if info is None:
            return
        if not rec.pk:
            rec.pk = list(info.key)
        if not info.key or not info.updates_deletes_captured:
            result.limited_tables.setdefault(rec.qualified_table, info.downstream)

    def _wanted(self, rec: ChangeRecord) -> bool:
        return self.filter(rec.qualified_table)
