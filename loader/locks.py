"""One process per stage: the load and the merge each hold a lock in the catalog's database.

Two ``loader load`` (a cron overlap, or two machines sharing the catalog) would both compute the
same anti-join against history before either commits, and both append: every change twice.
Iceberg's optimistic commits do not catch that (appends never conflict), so the stages take a
lock where every writer of the catalog meets: a PostgreSQL session advisory lock in the JDBC
catalog's database (released by the server when the holder dies, even by SIGKILL), or, for a
SQLite catalog, an OS file lock beside the database file. Capture has its own lock on the source
(``loader.capture.slot.capture_lock``).

The second process waits up to ``locks.wait_seconds`` (0: not at all), then fails with
``StageBusyError`` naming the holder (host, pid, since when); exit status 75 (try again later).
A holder that was a process of this host which no longer exists (killed, or just ended) is not
a running stage: the server ends its session asynchronously after the client has gone, so the
next run waits up to ``LOCK_GRACE_S`` for that instead of failing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from loader.config import LoaderSettings
from loader.errors import StageBusyError

log = logging.getLogger(__name__)

STAGES = ("load", "merge")
#: How long a lock whose holder is gone may take to be released by the server (the backend of a
#: killed client exits when it notices the closed socket, usually within milliseconds, later on
#: a loaded machine). A live holder keeps its lock past it and is reported.
LOCK_GRACE_S = 5.0
# Stages this process holds (a follower holds its stages for its whole life; the stages it runs
# take them again): a lock taken twice by one process is taken once.
_held: dict[str, int] = {}


def _lock_name(settings: LoaderSettings, stage: str) -> str:
    c = settings.catalog
    return f"lakehouse-loader:{c.name}:{c.loader_namespace}:{stage}"


def holder_label(stage: str) -> str:
    return f"lakehouse-loader {stage} {socket.gethostname()}:{os.getpid()}"


def holder_gone(application_name: str) -> bool:
    """Whether a lock holder's ``application_name`` (a loader's label, ``... <host>:<pid>``) names
    a process of this host that no longer runs. Labels of other hosts, truncated ones and foreign
    sessions say nothing: False."""
    host, sep, pid = application_name.rpartition(" ")[2].rpartition(":")
    if not sep or not pid.isdigit() or not application_name.startswith("lakehouse-loader "):
        return False
    if len(application_name) >= 63:  # cut to PostgreSQL's NAMEDATALEN: the pid may be cut too
        return False
    if host != socket.gethostname() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


@contextmanager
def stage_lock(settings: LoaderSettings, stage: str, wait_seconds: float | None = None) -> Iterator[None]:
    """Hold ``stage``'s lock for the catalog of ``settings`` while the body runs."""
    name = _lock_name(settings, stage)
    if _held.get(name):
        _held[name] += 1
        try:
            yield
        finally:
            _held[name] -= 1
        return
    wait = settings.locks.wait_seconds if wait_seconds is None else wait_seconds
    u = urlparse(settings.catalog.uri)
    lock = (
        _pg_lock(settings, stage, wait)
        if u.scheme.startswith("postgres")
        else _file_lock(Path(u.path), settings, stage, wait)
    )
    with lock:
        _held[name] = 1
        try:
            yield
        finally:
            _held.pop(name, None)


@contextmanager
def _pg_lock(settings: LoaderSettings, stage: str, wait: float) -> Iterator[None]:
    import psycopg

    from loader.config import redact

    name = _lock_name(settings, stage)
    try:
        conn = psycopg.connect(settings.catalog.conninfo(), autocommit=True, application_name=holder_label(stage)[:63])
    except psycopg.OperationalError as exc:
        from loader.errors import CatalogError, CatalogUnavailableError
        from loader.retry import outage

        raise (CatalogUnavailableError if outage(exc) is not None else CatalogError)(
            f"cannot reach the catalog database {redact(settings.catalog.uri)} to take the {stage} lock: {str(exc).strip()}",
            hint="check LOADER_CATALOG__URI and that its database is reachable",
        ) from exc
    try:
        key = advisory_key(conn, name)
        got = try_advisory_lock(conn, key, wait)
        if not got:
            holder = advisory_holder(conn, key)
            if holder and holder_gone(holder[1]):
                log.info("the %s lock's holder %s has ended; waiting for the server to release it", stage, holder[1])
                got = try_advisory_lock(conn, key, LOCK_GRACE_S)
                holder = None if got else advisory_holder(conn, key)
        if not got:
            who = (
                f"{holder[1] or f'pid {holder[0]}'} since {holder[2]:%Y-%m-%d %H:%M:%S %Z}"
                if holder and holder[2] is not None
                else "another process"
            )
            raise StageBusyError(
                f"another 'loader {stage}' is running on this catalog ({who})",
                hint="it finishes on its own; re-run later, or wait for it with LOADER_LOCKS__WAIT_SECONDS",
            )
        try:
            yield
        finally:
            release_advisory_lock(conn, key)
    finally:
        conn.close()


# --- PostgreSQL session advisory locks (the stage locks here, the capture lock on the source) ----


def advisory_key(conn: Any, name: str) -> int:
    """The 64-bit advisory lock key of ``name`` (the same in every process and on every server)."""
    row = conn.execute("SELECT hashtextextended(%s, 0)", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def try_advisory_lock(conn: Any, key: int, wait: float) -> bool:
    """Take the session lock ``key`` on ``conn``, trying again until ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if got and got[0]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


def advisory_holder(conn: Any, key: int) -> tuple[int, str, Any] | None:
    """(pid, application_name, backend_start) of the session holding lock ``key``, if any."""
    row = conn.execute(
        "SELECT l.pid, a.application_name, a.backend_start FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid)"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        " AND l.classid = ((%s::bigint >> 32) & 4294967295)::oid AND l.objid = (%s::bigint & 4294967295)::oid",
        (key, key),
    ).fetchone()
    return (int(row[0]), row[1] or "", row[2]) if row else None


def release_advisory_lock(conn: Any, key: int) -> None:
    """Give lock ``key`` back now, not when the backend exits after the client has gone."""
    import psycopg

    if conn.closed or conn.broken:
        return  # the session is gone, and its lock with it
    try:
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    except psycopg.Error:
        pass  # same: a failed session holds nothing once its backend ends


@contextmanager
def _file_lock(db_path: Path, settings: LoaderSettings, stage: str, wait: float) -> Iterator[None]:
    from filelock import FileLock, Timeout

    path = db_path.with_name(f"{db_path.name}.{settings.catalog.loader_namespace}.{stage}.lock")
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=wait)
    except Timeout as exc:
        raise StageBusyError(
            f"another 'loader {stage}' is running on this catalog (lock file {path})",
            hint="it finishes on its own; re-run later, or wait for it with LOADER_LOCKS__WAIT_SECONDS",
        ) from exc
    try:
        yield
    finally:
        lock.release()
