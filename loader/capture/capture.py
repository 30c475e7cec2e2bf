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
from loader.capture.wal2json import WAL2JSON_OPTIONS, Wal2JsonDecoder
from loader.config import LoaderSettings
from loader.errors import LandingError
from loader.lsn import ChangePosition, format_lsn


@dataclass
class CaptureResult:
    files: list[str] = field(default_factory=list)
    changes: int = 0
    transactions: int = 0
    skipped_already_landed: int = 0
    confirmed_lsn: int | None = None
    lag_bytes: int = 0
    slot_created: bool = False

    def summary(self) -> str:
        lsn = format_lsn(self.confirmed_lsn) if self.confirmed_lsn is not None else "-"
        return (
            f"captured {self.changes} changes in {self.transactions} transactions into "
            f"{len(self.files)} landing files; slot confirmed at {lsn}; lag {self.lag_bytes} bytes"
            + (f"; skipped {self.skipped_already_landed} already landed" if self.skipped_already_landed else "")
        )


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

    def run(self, create_slot: bool = True) -> CaptureResult:
        src = self.settings.source
        result = CaptureResult()
        with slots.connect(src.dsn) as conn:
            slots.check_wal_level(conn)
            if slots.slot_info(conn, src.slot) is None:
                if not create_slot or self.store.files():
                    slots.require_slot(conn, src.slot)  # raises SlotMissingError with the fix
                slots.create_slot(conn, src.slot)
                result.slot_created = True
            slots.require_slot(conn, src.slot)
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert row is not None
            upto = row[0]
            landed = self.store.landed_position()
            while True:
                rows, landed = self._round(conn, upto, landed, result)
                if rows == 0:
                    break
            info = slots.slot_info(conn, src.slot)
            if info is not None:
                result.confirmed_lsn = info.confirmed_flush_lsn
                result.lag_bytes = info.lag_bytes
        return result

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
        placeholders = ", ".join(["%s"] * len(WAL2JSON_OPTIONS))
        sql = (
            "SELECT data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, %s, "
            + placeholders
            + ")"
        )
        try:
            with conn.transaction():
                with conn.cursor(name="loader_capture") as cur:
                    cur.itersize = src.fetch_size
                    cur.execute(sql, (src.slot, upto, self.round_changes, *WAL2JSON_OPTIONS))
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

    def _wanted(self, rec: ChangeRecord) -> bool:
        return self.filter(rec.qualified_table)
