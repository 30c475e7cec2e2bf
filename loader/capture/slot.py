"""Replication slot lifecycle on the source: create, inspect, advance, drop."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from loader import locks
from loader.config import redact
from loader.errors import (
    LoaderError,
    SlotBusyError,
    SlotCreationBlockedError,
    SlotLostError,
    SlotMissingError,
    SourceError,
    SourceUnavailableError,
)
from loader.landing.state import SLOT_STATE
from loader.landing.store import LandingFile, LandingStore
from loader.lsn import format_lsn, parse_lsn

# Session settings that make the text output of values deterministic (UTC offsets, ISO dates,
# shortest-exact floats, hex bytea, money in the C locale's form, UTF-8 text), whatever the
# server's, the database's or the role's defaults are: decoding runs in the loader's session (or
# its walsender), so a DBA's ALTER DATABASE ... SET bytea_output = 'escape' would otherwise change
# every bytea the plugin prints. row_security = off (as pg_dump runs): a read that row-level security would filter
# fails instead of returning fewer rows (capture skips such tables: source_filter.unreadable). No
# timeouts (as pg_dump): a database-wide statement_timeout or idle_in_transaction_session_timeout
# meant for applications cancelled a snapshot's long reads and killed the sessions that hold its
# exported snapshot between chunks.
SESSION_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO,YMD",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
    "client_encoding": "UTF8",
    "row_security": "off",
    "statement_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "lock_timeout": "0",
}
SESSION_OPTIONS = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())


def session_label() -> str:
    """How the loader's source sessions name themselves to a DBA (``application_name`` in
    ``pg_stat_activity``, unless the DSN sets one): ``lakehouse-loader source <host>:<pid>``, as
    its catalog sessions name the stage they hold."""
    return locks.holder_label("source")[:63]


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    kwargs.setdefault("fallback_application_name", session_label())
    try:
        return psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS, **kwargs)
    except psycopg.OperationalError as exc:
        from loader.retry import outage

        if outage(exc) is not None:
            raise SourceUnavailableError(
                f"cannot connect to the source database {redact(dsn)}: {str(exc).strip().splitlines()[0]}",
                hint="check LOADER_SOURCE__DSN and that PostgreSQL is running",
            ) from exc
        raise SourceError(
            f"cannot connect to the source database {redact(dsn)}: {str(exc).strip()}",
            hint="check LOADER_SOURCE__DSN and that PostgreSQL is running",
        ) from exc


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str
    active_pid: int | None
    restart_lsn: int | None
    confirmed_flush_lsn: int | None
    current_wal_lsn: int
    wal_status: str | None = None  # reserved / extended / unreserved / lost (PostgreSQL 13+)

    @property
    def retained_wal_bytes(self) -> int:
        """WAL the server keeps for this slot: from the lesser of restart_lsn and confirmed_flush_lsn
        to the current position (what max_slot_wal_keep_size is measured against)."""
        held = [p for p in (self.restart_lsn, self.confirmed_flush_lsn) if p is not None]
        if not held:
            return 0
        return max(0, self.current_wal_lsn - min(held))

    @property
    def lag_bytes(self) -> int:
        if self.confirmed_flush_lsn is None:
            return 0
        return max(0, self.current_wal_lsn - self.confirmed_flush_lsn)


def check_wal_level(conn: psycopg.Connection) -> None:
    level = conn.execute("SHOW wal_level").fetchone()
    if not level or level[0] != "logical":
        raise SourceError(
            f"source wal_level is {level[0] if level else '?'}, logical decoding needs 'logical'",
            hint="set wal_level=logical in postgresql.conf and restart the server",
        )


def slot_info(conn: psycopg.Connection, slot: str) -> SlotInfo | None:
    row = conn.execute(
        "SELECT slot_name, plugin, active_pid, restart_lsn::text, confirmed_flush_lsn::text,"
        " pg_current_wal_lsn()::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    return SlotInfo(
        name=row[0],
        plugin=row[1],
        active_pid=row[2],
        restart_lsn=parse_lsn(row[3]) if row[3] else None,
        confirmed_flush_lsn=parse_lsn(row[4]) if row[4] else None,
        current_wal_lsn=parse_lsn(row[5]),
        wal_status=row[6],
    )


def check_not_lost(info: SlotInfo | None, slot: str, landed: str | None, confirmed_by_us: int | None) -> None:
    """Fail with SlotLostError when changes were not (or can no longer be) captured by this slot.

    - the slot is gone while the landing area holds changes (dropped by someone);
    - PostgreSQL invalidated it (``wal_status = 'lost'``: it fell behind ``max_slot_wal_keep_size``);
    - it confirms more than this loader ever confirmed (another consumer read it, or it was dropped
      and created again): the changes in between were never landed.
    """
    hint = (
        "run 'loader resync' (re-creates the slot and resyncs every captured table), or set source.on_slot_loss=resync"
    )
    since = f" after {landed}" if landed else ""
    if info is None:
        raise SlotLostError(f"replication slot {slot!r} is gone: changes committed{since} were not captured", hint=hint)
    if info.wal_status == "lost":
        raise SlotLostError(
            f"replication slot {slot!r} was invalidated by the server (it fell more than max_slot_wal_keep_size "
            f"behind): changes committed{since} can no longer be decoded",
            hint=hint,
        )
    if (
        confirmed_by_us is not None
        and info.confirmed_flush_lsn is not None
        and info.confirmed_flush_lsn > confirmed_by_us
    ):
        raise SlotLostError(
            f"replication slot {slot!r} confirms {format_lsn(info.confirmed_flush_lsn)}, but this loader only ever "
            f"confirmed {format_lsn(confirmed_by_us)}: another consumer read it, or it was dropped and created again; "
            "the changes in between were not captured",
            hint=hint,
        )


def check_landed(info: SlotInfo | None, slot: str, store: LandingStore, files: Sequence[LandingFile]) -> None:
    """:func:`check_not_lost` against what the landing area ``store`` says: the last position landed
    (``files``, its listing) and the last one this loader confirmed on ``slot`` (the slot state
    :func:`loader.landing.state.record_confirmed` keeps)."""
    state = store.read_state(SLOT_STATE) or {}
    confirmed_by_us = int(state["confirmed"]) if state.get("slot") == slot and "confirmed" in state else None
    check_not_lost(info, slot, str(files[-1].last) if files else None, confirmed_by_us)


log = logging.getLogger("loader.capture.slot")

# Transactions a slot being created waits for: those that held a transaction id when it began
# (sessions, walsenders) and prepared transactions (which outlive their sessions).
_BLOCKERS_SQL = """
SELECT 'pid ' || a.pid || ' (' || coalesce(a.usename, '?') || coalesce(', ' || nullif(a.application_name, ''), '')
       || ', ' || coalesce(a.state, '?') || ', in a transaction since '
       || to_char(a.xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC)'
FROM pg_stat_activity a
WHERE a.backend_xid IS NOT NULL AND a.pid <> %(creator)s AND a.xact_start <= %(since)s
UNION ALL
SELECT 'prepared transaction ' || quote_literal(p.gid) || ' (' || p.owner || ', prepared '
       || to_char(p.prepared AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC)'
FROM pg_prepared_xacts p WHERE p.prepared <= %(since)s
ORDER BY 1
"""
_BLOCKERS_HINT = (
    "a new logical slot waits until every transaction in progress when it began has ended: end them "
    "(COMMIT or ROLLBACK in that session, ROLLBACK PREPARED 'gid' for a forgotten prepared transaction, or "
    "SELECT pg_terminate_backend(pid)), or raise source.slot_create_timeout_s"
)


@dataclass
class _SlotWait:
    """Watches a slot's creation from a connection of its own: names the transactions it waits
    for (a warning after ``first_report_s``, then every ``report_every_s``) and cancels it after
    ``timeout_s``, keeping the names for the error."""

    dsn: str
    creator: int
    slot: str
    timeout_s: float | None
    first_report_s: float = 10.0
    report_every_s: float = 60.0
    timed_out: list[str] | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.monotonic()
        try:
            with connect(self.dsn) as conn:
                since = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
                report_at = self.first_report_s
                while not self.stop.wait(0.5):
                    waited = time.monotonic() - started
                    if self.timeout_s is not None and waited >= self.timeout_s:
                        self.timed_out = self._blockers(conn, since)
                        conn.execute("SELECT pg_cancel_backend(%s)", (self.creator,))
                        return
                    if waited >= report_at:
                        report_at += self.report_every_s
                        blockers = self._blockers(conn, since)
                        if blockers:
                            log.warning(
                                "creating replication slot %s has waited %.0f s for %d transaction(s) in progress "
                                "when it began: %s; %s",
                                self.slot,
                                waited,
                                len(blockers),
                                "; ".join(blockers),
                                _BLOCKERS_HINT,
                            )
        except (psycopg.Error, LoaderError) as exc:  # the watch is advice: the creation goes on regardless
            log.debug("slot creation watch ended: %s", exc)

    def _blockers(self, conn: psycopg.Connection, since: Any) -> list[str]:
        return [str(r[0]) for r in conn.execute(_BLOCKERS_SQL, {"creator": self.creator, "since": since}).fetchall()]


@contextmanager
def _watched_creation(conn: psycopg.Connection, dsn: str | None, slot: str, timeout_s: float | None) -> Iterator[None]:
    """Run a slot's creation on ``conn`` watched by :class:`_SlotWait` (``dsn``: how to open its
    connection; None: unwatched). A creation cancelled by the watch raises SourceError naming the
    transactions it waited for."""
    if dsn is None:
        yield
        return
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    wait = _SlotWait(dsn, int(row[0]), slot, timeout_s)
    watcher = threading.Thread(target=wait.run, name=f"slot-create-{slot}", daemon=True)
    watcher.start()
    try:
        yield
    except psycopg.errors.QueryCanceled as exc:
        if wait.timed_out is None:
            raise
        named = "; ".join(wait.timed_out) or "none named (they ended as it gave up)"
        raise SlotCreationBlockedError(
            f"creating replication slot {slot!r} waited {timeout_s:.0f} s for transactions in progress when it "
            f"began, and gave up: {named}",
            hint=_BLOCKERS_HINT,
        ) from exc
    finally:
        wait.stop.set()
        watcher.join(timeout=10)


def create_slot(
    conn: psycopg.Connection,
    slot: str,
    plugin: str = "wal2json",
    dsn: str | None = None,
    timeout_s: float | None = None,
) -> int:
    """Create a logical slot with ``plugin``; returns its consistent point LSN. With ``dsn``, the
    transactions it waits for are named, and it gives up after ``timeout_s`` (see _SlotWait)."""
    try:
        with _watched_creation(conn, dsn, slot, timeout_s):
            row = conn.execute(
                "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)", (slot, plugin)
            ).fetchone()
    except psycopg.errors.DuplicateObject as exc:
        raise SourceError(f"replication slot {slot!r} already exists") from exc
    except psycopg.Error as exc:
        raise SourceError(
            f"cannot create replication slot {slot!r}: {str(exc).strip()}",
            hint="the loader's role needs REPLICATION (or an administrator creates the slot for it); the source "
            "needs wal_level=logical, a free max_replication_slots entry and the plugin installed",
        ) from exc
    assert row is not None
    return parse_lsn(row[0])


def drop_slot(conn: psycopg.Connection, slot: str) -> None:
    info = slot_info(conn, slot)
    if info is None:
        raise SlotMissingError(f"replication slot {slot!r} does not exist")
    if info.active_pid is not None:
        raise SlotBusyError(
            f"replication slot {slot!r} is in use by process {info.active_pid}",
            hint="stop the other capture process first",
        )
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def require_slot(conn: psycopg.Connection, slot: str, plugin: str = "wal2json") -> SlotInfo:
    info = slot_info(conn, slot)
    if info is None:
        raise SlotMissingError(
            f"replication slot {slot!r} does not exist on the source",
            hint="create it with 'loader slot create' (and backfill, since changes before it were not captured)",
        )
    if info.plugin != plugin:
        raise SourceError(
            f"replication slot {slot!r} uses plugin {info.plugin!r}, but source.plugin is {plugin!r}",
            hint="set source.plugin to the slot's plugin, or use another slot name",
        )
    if info.active_pid is not None:
        raise SlotBusyError(
            f"replication slot {slot!r} is held by another process (pid {info.active_pid})",
            hint="another capture is running; wait for it or stop it",
        )
    return info


def create_slot_exporting_snapshot(
    dsn: str, slot: str, *, temporary: bool = False, plugin: str = "wal2json", timeout_s: float | None = None
) -> ExportedSnapshot:
    """Create a logical slot over a replication connection and keep its exported snapshot alive.

    The snapshot sees exactly the transactions committed before the slot's consistent point;
    every later commit is decoded by the slot. It stays importable (``SET TRANSACTION
    SNAPSHOT``) until the returned object is closed, which also drops a temporary slot.
    """
    try:
        repl = psycopg.connect(
            dsn,
            autocommit=True,
            replication="database",
            options=SESSION_OPTIONS,
            fallback_application_name=session_label(),
        )
    except psycopg.OperationalError as exc:
        raise SourceError(
            f"cannot open a replication connection to {redact(dsn)}: {str(exc).strip()}",
            hint="the loader's role needs the REPLICATION attribute and a pg_hba.conf 'replication' entry",
        ) from exc
    kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
    try:
        # Replication commands take no bind parameters; the slot name is validated below.
        if not _SLOT_NAME_RE.match(slot):
            raise SourceError(f"invalid replication slot name {slot!r}", hint="use lower-case letters, digits and _")
        if plugin not in ("wal2json", "pgoutput"):
            raise SourceError(f"unsupported logical decoding plugin {plugin!r}", hint="use wal2json or pgoutput")
        with _watched_creation(repl, dsn, slot, timeout_s):
            row = repl.execute(f"CREATE_REPLICATION_SLOT {slot} {kind} {plugin} EXPORT_SNAPSHOT").fetchone()
    except psycopg.errors.DuplicateObject as exc:
        repl.close()
        raise SourceError(f"replication slot {slot!r} already exists") from exc
    except psycopg.Error as exc:
        repl.close()
        raise SourceError(
            f"cannot create replication slot {slot!r}: {str(exc).strip()}",
            hint="the source needs wal_level=logical, free max_replication_slots and wal2json installed",
        ) from exc
    except BaseException:
        repl.close()
        raise
    assert row is not None
    return ExportedSnapshot(repl, slot, parse_lsn(row[1]), row[2])


_SLOT_NAME_RE = re.compile(r"^[a-z0-9_]{1,63}\Z")


@dataclass
class ExportedSnapshot:
    """A slot's consistent point and the snapshot exported with it (valid while open)."""

    connection: psycopg.Connection
    slot: str
    consistent_lsn: int
    snapshot_name: str

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> ExportedSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How long a capture or snapshot waits for the slot's capture lock. A loader process that has
#: just ended (or was killed) releases its session lock only when its server backend exits, which
#: PostgreSQL does asynchronously after the client is gone; the next scheduled run must not fail
#: on that window. A live holder keeps the lock past the grace and is reported.
CAPTURE_LOCK_GRACE_S = locks.LOCK_GRACE_S  # the stage locks' grace, for the same reason


def capture_lock(conn: psycopg.Connection, slot: str, grace: float = CAPTURE_LOCK_GRACE_S) -> None:
    """Take the session-level advisory lock that makes one loader process own ``slot``.

    SQL-level decoding marks the slot active only during each call, so two capture or snapshot
    processes could interleave; this lock serialises them for the connection's lifetime (or until
    :func:`release_capture_lock`).
    """
    key = _lock_key(conn, slot)
    if locks.try_advisory_lock(conn, key, grace):
        return
    holder = locks.advisory_holder(conn, key)
    raise SlotBusyError(
        f"replication slot {slot!r} is held by another loader process (pid {holder[0] if holder else '?'})",
        hint="another capture or snapshot is running; wait for it or stop that process",
    )


@contextmanager
def owning(conn: psycopg.Connection, slot: str, *, held: bool = False) -> Iterator[None]:
    """Hold the slot's capture lock on ``conn`` for the block (``held``: the caller already does)."""
    if held:
        yield
        return
    capture_lock(conn, slot)
    try:
        yield
    finally:
        release_capture_lock(conn, slot)


def release_capture_lock(conn: psycopg.Connection, slot: str) -> None:
    """Give the capture lock back at once, not when the backend exits after ``conn`` closes."""
    if not (conn.closed or conn.broken):
        locks.release_advisory_lock(conn, _lock_key(conn, slot))


def capture_lock_holder(conn: psycopg.Connection, slot: str) -> tuple[int, str, Any] | None:
    """(pid, application_name, backend_start) of the session holding ``slot``'s capture lock, if any."""
    return locks.advisory_holder(conn, _lock_key(conn, slot))


def _lock_key(conn: psycopg.Connection, slot: str) -> int:
    return locks.advisory_key(conn, f"lakehouse-loader:{slot}")


def plugin_supports(conn: psycopg.Connection, slot: str, option: str, value: str = "1") -> bool:
    """Whether the slot's wal2json accepts ``option`` (checked by its startup callback, no data read)."""
    try:
        with conn.transaction():
            conn.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_changes(%s, '0/1'::pg_lsn, NULL, %s, %s)",
                (slot, option, value),
            )
        return True
    except psycopg.errors.InvalidParameterValue:
        return False


# The restart point a confirmation may leave behind before advance_slot(settle=True) advances again:
# the server removes WAL a segment (16 MB by default) at a time.
SETTLE_SLACK_BYTES = 16 * 1024 * 1024


def advance_slot(conn: psycopg.Connection, slot: str, lsn: int, settle: bool = False) -> None:
    """Confirm everything up to ``lsn``; call only once those changes are durable.

    ``settle`` (the end of a run): also bring the slot's restart point as close to ``lsn`` as the
    server allows. PostgreSQL takes one new restart candidate per confirmation, the first
    running-transactions record decoded past the slot's previous confirmed position (every one
    before that position is taken at once), so one advance leaves the restart point near where the
    last run ended: a slot confirmed once per scheduled run kept a whole interval of WAL, whatever
    else the server wrote meanwhile. A second advance to the same position decodes again
    (fast-forward: no output) from the new restart point, now before the confirmed position, and
    takes the last such record. Done only when it can move: the first advance took a record past
    the previous confirmed position (else there is none after it) and left more than
    ``SETTLE_SLACK_BYTES`` behind. So it reads at most the WAL this run covered, never again and
    again the WAL of a busy server's 15 s between such records on every follow-mode cycle.
    """
    before = slot_info(conn, slot) if settle else None
    advance, position = "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(lsn))
    try:
        conn.execute(advance, position)
    except psycopg.errors.ObjectInUse as exc:
        raise SlotBusyError(f"replication slot {slot!r} is held by another process") from exc
    if before is None or before.confirmed_flush_lsn is None:
        return
    info = slot_info(conn, slot)
    if (
        info is None
        or info.restart_lsn is None
        or info.restart_lsn < before.confirmed_flush_lsn
        or lsn - info.restart_lsn <= SETTLE_SLACK_BYTES
    ):
        return
    try:  # everything is confirmed already: a slot taken meanwhile only keeps this WAL a run longer
        conn.execute(advance, position)
    except psycopg.errors.ObjectInUse:
        log.warning("replication slot %r was taken by another process before its restart point moved", slot)
