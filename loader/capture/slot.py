"""Replication slot lifecycle on the source: create, inspect, advance, drop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from loader.errors import SlotBusyError, SlotMissingError, SourceError
from loader.lsn import format_lsn, parse_lsn

# Session settings that make wal2json's text output deterministic (UTC offsets, ISO dates,
# shortest-exact floats), whatever the server defaults are.
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3"


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    try:
        return psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS, **kwargs)
    except psycopg.OperationalError as exc:
        raise SourceError(
            f"cannot connect to the source database {redact(dsn)}: {str(exc).strip()}",
            hint="check LOADER_SOURCE__DSN and that PostgreSQL is running",
        ) from exc


def redact(dsn: str) -> str:
    from urllib.parse import urlparse

    u = urlparse(dsn)
    if u.password:
        return dsn.replace(f":{u.password}@", ":***@")
    return dsn


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str
    active_pid: int | None
    restart_lsn: int | None
    confirmed_flush_lsn: int | None
    current_wal_lsn: int

    @property
    def retained_wal_bytes(self) -> int:
        """WAL the server keeps for this slot: how far behind the consumer is."""
        if self.restart_lsn is None:
            return 0
        return max(0, self.current_wal_lsn - self.restart_lsn)

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
        " pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = %s",
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
    )


def create_slot(conn: psycopg.Connection, slot: str) -> int:
    """Create a wal2json logical slot; returns its consistent point LSN."""
    try:
        row = conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'wal2json')", (slot,)
        ).fetchone()
    except psycopg.errors.DuplicateObject as exc:
        raise SourceError(f"replication slot {slot!r} already exists") from exc
    except psycopg.Error as exc:
        raise SourceError(
            f"cannot create replication slot {slot!r}: {str(exc).strip()}",
            hint="the source needs wal_level=logical, free max_replication_slots and wal2json installed",
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


def require_slot(conn: psycopg.Connection, slot: str) -> SlotInfo:
    info = slot_info(conn, slot)
    if info is None:
        raise SlotMissingError(
            f"replication slot {slot!r} does not exist on the source",
            hint="create it with 'loader slot create' (and backfill, since changes before it were not captured)",
        )
    if info.plugin != "wal2json":
        raise SourceError(f"replication slot {slot!r} uses plugin {info.plugin!r}, not wal2json")
    if info.active_pid is not None:
        raise SlotBusyError(
            f"replication slot {slot!r} is held by another process (pid {info.active_pid})",
            hint="another capture is running; wait for it or stop it",
        )
    return info


def advance_slot(conn: psycopg.Connection, slot: str, lsn: int) -> None:
    """Confirm everything up to ``lsn``; call only once those changes are durable."""
    try:
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(lsn)))
    except psycopg.errors.ObjectInUse as exc:
        raise SlotBusyError(f"replication slot {slot!r} is held by another process") from exc
