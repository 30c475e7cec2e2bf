"""Retries of I/O that may succeed later (S3 throttling, timeouts, connection resets, EIO).

One policy for every store the loader talks to, built on tenacity (exponential backoff with
jitter, bounded attempts). Only failures of the *channel* are retried: a missing object, a denied
request or content that does not parse are answered at once, because waiting cannot change them.
After the last attempt the failure surfaces as :class:`LandingUnavailableError` (a transient
error: exit status 75, nothing marked done), never as bad data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from loader.errors import LandingUnavailableError

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
    return isinstance(exc, (OSError, TimeoutError, ConnectionError))


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
