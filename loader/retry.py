"""Retries of I/O that may succeed later (S3 throttling, timeouts, connection resets, EIO, and
PostgreSQL outages of the source or the catalog database).

One policy for every store the loader talks to, built on tenacity (exponential backoff with
jitter, bounded attempts). Only failures of the *channel* are retried: a missing object, a denied
request or content that does not parse are answered at once, because waiting cannot change them.
After the last attempt the failure surfaces as :class:`LandingUnavailableError` (a transient
error: exit status 75, nothing marked done), never as bad data.

A PostgreSQL outage (:func:`outage`: connection refused or reset, a server starting up or shutting
down, an administrator's termination, a failover, too many connections; SQLSTATE class 08, 57P01-03,
53300) is recognised wherever it surfaces: a psycopg error, the same through SQLAlchemy (pyiceberg),
or a Java exception chain coming back through py4j from the Iceberg JDBC catalog inside Spark
(``org.postgresql.util.PSQLException`` with those SQLSTATEs, ``java.net.ConnectException``, ...).
Every one-shot command is run through :func:`through_outages` (retried whole: every stage is
restartable) and ends with :class:`SourceUnavailableError` / :class:`CatalogUnavailableError` (exit
75) naming the server; follow mode rides through outages and keeps cycling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from loader.errors import (
    CatalogUnavailableError,
    LandingUnavailableError,
    SourceUnavailableError,
    TransientError,
    WarehouseUnavailableError,
)

if TYPE_CHECKING:
    from loader.config import LoaderSettings

T = TypeVar("T")
log = logging.getLogger("loader.retry")

# S3 error codes that mean "try again" (throttling and server-side failures).
_S3_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "500",
        "502",
        "503",
        "504",
    }
)


# SQLSTATEs of a server that is going away or not there yet (class 08 is matched as a prefix).
OUTAGE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# What libpq says (without a SQLSTATE) when a connection attempt or a connection fails for the same reasons.
_OUTAGE_TEXT = (
    "connection refused",
    "could not connect",
    "no such file or directory",  # the server's Unix socket is gone
    "server closed the connection unexpectedly",
    "connection reset",
    "broken pipe",
    "timeout expired",
    "timed out",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "terminating connection",
    "too many clients",
    "remaining connection slots are reserved",
    "the connection is closed",
    "the connection is lost",
    "consuming input failed",
    "could not receive data",
    "could not send data",
    "ssl syscall error",
    "network is unreachable",
    "no route to host",
)
# Java exceptions of a channel failure anywhere in a chain (the JDBC driver's own or the JDK's).
_JAVA_NETWORK = frozenset(
    {
        "java.net.ConnectException",
        "java.net.SocketException",
        "java.net.NoRouteToHostException",
        "java.net.SocketTimeoutException",
        "java.io.EOFException",
        # Apache HttpClient's (the AWS SDK's transport): subclasses of the above, named apart.
        "org.apache.http.conn.HttpHostConnectException",
        "org.apache.http.conn.ConnectTimeoutException",
        "org.apache.http.NoHttpResponseException",
        # S3A's translations of an object store that is failing or throttling (after its retries).
        "org.apache.hadoop.fs.s3a.AWSStatus500Exception",
        "org.apache.hadoop.fs.s3a.AWSServiceThrottledException",
        "org.apache.hadoop.fs.s3a.AWSNoResponseException",
    }
)
# Where a Java exception chain comes from the object store (S3A, the AWS SDK): the warehouse.
_JAVA_OBJECT_STORE = ("org.apache.hadoop.fs.s3a.", "com.amazonaws.", "software.amazon.awssdk.")


def _sqlstate_outage(state: str | None) -> bool:
    return bool(state) and (str(state).startswith("08") or state in OUTAGE_SQLSTATES)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, what it was raised from or during, and a SQLAlchemy error's DBAPI error."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        orig = getattr(e, "orig", None)
        todo += [orig if isinstance(orig, BaseException) else None, e.__cause__, e.__context__]


def _java_outage(jexc: Any) -> str | None:
    """The message of the first outage in a Java exception chain (a py4j handle), if any."""
    for _ in range(20):
        if jexc is None:
            return None
        try:
            name = str(jexc.getClass().getName())
            if name in _JAVA_NETWORK:
                return f"{name}: {jexc.getMessage()}"
            state = None
            if name.endswith("SQLException"):
                try:  # java.sql.SQLException and its subclasses (not Iceberg's UncheckedSQLException)
                    state = jexc.getSQLState()
                except Exception:
                    state = None
            if _sqlstate_outage(state):
                return f"{jexc.getMessage()} (SQLSTATE {state})"
            jexc = jexc.getCause()
        except Exception:  # the JVM itself is gone: not a database outage
            return None
    return None


def _java_classes(jexc: Any) -> list[str]:
    """The class names along a Java exception chain (a py4j handle)."""
    names: list[str] = []
    for _ in range(20):
        if jexc is None:
            break
        try:
            names.append(str(jexc.getClass().getName()))
            jexc = jexc.getCause()
        except Exception:  # the JVM itself is gone
            break
    return names


def outage(exc: BaseException) -> str | None:
    """What went wrong, when ``exc`` (or what caused it) is an outage of a server the loader needs:
    the source or the catalog database refusing, resetting, restarting, failing over or full, or the
    warehouse's object store not answering inside Spark (S3A); else None."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a dependency
        return None
    for e in _causes(exc):
        if isinstance(e, (SourceUnavailableError, CatalogUnavailableError)):
            if e.__cause__ is None:
                return str(e)
            continue  # what the server said comes next
        if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
            text = str(e).strip()
            if _sqlstate_outage(e.sqlstate) or (e.sqlstate is None and any(t in text.lower() for t in _OUTAGE_TEXT)):
                return text.splitlines()[0] if text else type(e).__name__
        jexc = getattr(e, "java_exception", None) or getattr(e, "_origin", None)  # Py4JJavaError, PySpark's
        if jexc is not None:
            found = _java_outage(jexc)
            if found:
                return found
    return None


def outage_server(exc: BaseException, settings: LoaderSettings) -> tuple[str, str]:
    """(``source``, ``catalog`` or ``warehouse``, the redacted address) of the server an outage is about."""
    from psycopg.conninfo import conninfo_to_dict

    from loader.config import redact

    for e in _causes(exc):
        jexc = getattr(e, "java_exception", None) or getattr(e, "_origin", None)
        if jexc is not None and any(n.startswith(_JAVA_OBJECT_STORE) for n in _java_classes(jexc)):
            return "warehouse", redact(settings.catalog.warehouse)
    for e in _causes(exc):
        if isinstance(e, SourceUnavailableError):
            return "source", redact(settings.source.dsn)
        if isinstance(e, CatalogUnavailableError):
            return "catalog", redact(settings.catalog.uri)
        pgconn = getattr(e, "pgconn", None)
        if pgconn is not None:
            got = tuple(
                (v or b"").decode() if isinstance(v, bytes) else str(v or "")
                for v in (pgconn.host, pgconn.port, pgconn.db)
            )
            for server, dsn in (("source", settings.source.dsn), ("catalog", settings.catalog.uri)):
                try:
                    want = conninfo_to_dict(dsn)
                except Exception:
                    continue
                if got == (str(want.get("host", "")), str(want.get("port", "5432")), str(want.get("dbname", ""))):
                    return server, redact(dsn)
    # Spark and pyiceberg only ever talk to the catalog database.
    if any(
        getattr(e, "java_exception", None) or getattr(e, "_origin", None) or getattr(e, "orig", None)
        for e in _causes(exc)
    ):
        return "catalog", redact(settings.catalog.uri)
    return "source or catalog", f"{redact(settings.source.dsn)} / {redact(settings.catalog.uri)}"


def unavailable(exc: BaseException, settings: LoaderSettings, attempts: int, seconds: float) -> TransientError:
    """The error a command ends with after an outage outlasted its retries (exit status 75)."""
    server, where = outage_server(exc, settings)
    cls = {"source": SourceUnavailableError, "warehouse": WarehouseUnavailableError}.get(
        server, CatalogUnavailableError
    )
    check = {"source": "LOADER_SOURCE__DSN", "warehouse": "LOADER_CATALOG__WAREHOUSE and LOADER_S3__ENDPOINT_URL"}
    return cls(
        f"{server_phrase(server, where)} is unavailable: {outage(exc)} (after {attempts} attempts over {seconds:.0f} s)",
        hint="nothing was marked done; re-run when it is back (if it persists, check "
        + check.get(server, "LOADER_CATALOG__URI")
        + " and the server)",
    )


def server_phrase(server: str, where: str) -> str:
    """``the source database <dsn>``, ``the warehouse s3://...``: how messages name a server."""
    return f"the warehouse {where}" if server == "warehouse" else f"the {server} database {where}"


def through_outages(fn: Callable[[], T], settings: Callable[[], LoaderSettings]) -> T:
    """``fn()``, retried whole while a PostgreSQL server it needs is out (``retry.attempts`` times
    with exponential backoff up to ``retry.max_wait_s``); then :func:`unavailable`."""
    started = time.monotonic()
    attempts = 0

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        return fn()

    def stop(state: RetryCallState) -> bool:
        return state.attempt_number >= max(1, settings().retry.attempts)

    def wait(state: RetryCallState) -> float:
        return float(wait_random_exponential(multiplier=0.5, max=settings().retry.max_wait_s)(state))

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert exc is not None
        server, where = outage_server(exc, settings())
        log.warning(
            "%s is unavailable (%s), attempt %d of %d; retrying",
            server_phrase(server, where),
            outage(exc),
            state.attempt_number,
            settings().retry.attempts,
            extra={"server": server},
        )

    retrying = Retrying(
        stop=stop,
        wait=wait,
        retry=retry_if_exception(lambda e: outage(e) is not None),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except Exception as exc:
        if outage(exc) is not None:
            raise unavailable(exc, settings(), attempts, time.monotonic() - started) from exc
        raise


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the channel that a later attempt may not meet."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        BotoCoreError = ClientError = ()  # type: ignore[assignment,misc]
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return str(err.get("Code", "")) in _S3_RETRY_CODES or status in _S3_RETRY_CODES
    if isinstance(exc, BotoCoreError):
        # Connection refused/reset, read timeouts, incomplete reads; not parameter validation.
        return type(exc).__name__ not in {"ParamValidationError", "NoCredentialsError", "NoRegionError"}
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) or outage(exc) is not None


def call_with_retry(fn: Callable[[], T], what: str, attempts: int = 5, max_wait: float = 20.0) -> T:
    """``fn()`` with retries of transient failures; ``what`` names the object for the final error."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s failed (%s), attempt %d of %d; retrying", what, exc, state.attempt_number, attempts)

    retrying = Retrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=wait_random_exponential(multiplier=0.2, max=max_wait),
        retry=retry_if_exception(is_transient),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(fn)
    except Exception as exc:
        if is_transient(exc):
            raise LandingUnavailableError(
                f"{what} failed after {attempts} attempts: {exc}",
                hint="the store did not answer; nothing was marked done, re-run when it is reachable",
            ) from exc
        raise
