"""One error hierarchy for everything a user can meet.

Every error says what happened, to which table / LSN / file, and what to do. ``TransientError``
subclasses may succeed on retry (a lock held by another process, a server still starting);
``TerminalError`` subclasses need a change of input or configuration first.
"""

from __future__ import annotations


class LoaderError(Exception):
    """Base class of every error the loader raises on purpose."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def one_line(self) -> str:
        msg = str(self)
        return f"{msg} ({self.hint})" if self.hint else msg


class TerminalError(LoaderError):
    """Retrying alone will not help: change the input or the configuration first."""


class TransientError(LoaderError):
    """The same call may succeed if retried later."""


class UsageError(TerminalError):
    """A name, time or position given on the command line that means nothing here (exit status 2,
    like any other misuse of the command): nothing was done."""


class ConfigError(TerminalError):
    """The configuration is missing a value or holds an invalid one."""


class SourceError(TerminalError):
    """The PostgreSQL source refused or is not set up for logical decoding."""


class SlotMissingError(SourceError):
    """The replication slot does not exist."""


class SlotBusyError(TransientError):
    """Another process holds the replication slot."""


class SlotCreationBlockedError(TransientError):
    """A new replication slot waited ``source.slot_create_timeout_s`` for transactions in progress
    when its creation began (a session idle in a transaction, a forgotten prepared transaction)."""


class LandingError(TerminalError):
    """A landing file or landing-area object is missing or not understood."""


class DecompressedSizeError(LandingError):
    """A landing or import file decompresses past ``landing.max_decompressed_mb`` (a gzip bomb, or a
    file far larger than the loader writes)."""


class LandingUnavailableError(TransientError):
    """The landing area did not answer (S3 throttling, timeouts, resets, I/O errors), even after retries."""


class WarehouseUnavailableError(TransientError):
    """The warehouse (the Iceberg tables' storage) did not answer, even after retries."""


class SourceUnavailableError(TransientError):
    """The source database did not answer (refused, reset, restarting, failing over, full), even after retries."""


class CatalogUnavailableError(TransientError):
    """The catalog database did not answer (refused, reset, restarting, failing over, full), even after retries."""


class MergeConflictError(TransientError):
    """Another writer committed to a current table while its merge ran; nothing was committed."""


class StageBusyError(TransientError):
    """Another loader process holds this stage's lock (a cron overlap, or a second machine)."""


class SlotLostError(SlotMissingError):
    """The replication slot was dropped, invalidated or consumed by someone else: changes were not captured."""


class DecodeError(TerminalError):
    """A change record could not be decoded."""


class ErasureIncompleteError(TerminalError):
    """An erasure could not reach every place the subject may be kept (a damaged landing file)."""


class CatalogError(TerminalError):
    """The Iceberg catalog could not be reached or holds something unexpected."""
