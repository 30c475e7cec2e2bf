"""Pipelined reading of a slot: a temporary copy of it, consumed in rounds by a fetcher thread.

Why: a peek materialises a whole round on the server before it sends the first row, and the server
then sits idle while this process lands the round. A temporary copy of the slot
(``pg_copy_logical_replication_slot``, PostgreSQL 12+) can be *consumed* round after round without
moving the real slot, so the server decodes the next round while this process lands the last. The
real slot is still advanced only to the end of transactions whose files are published; the copy
belongs to the fetcher's session and disappears with it, so a crash anywhere leaves the real slot
where the last durable file put it, exactly as with peeks.

Rounds come back through ``COPY ... TO STDOUT`` in CSV form, with delimiter and quote bytes (0x01,
0x02) that wal2json never emits raw (it escapes every control character in its JSON), so each line
is one row's data exactly as the plugin wrote it and no per-row unescaping is needed. A round that
holds the quote byte anyway is read with the csv module, which undoes the quoting.

Memory stays bounded: each round is spooled to a temporary file, and the fetcher runs at most
``depth`` rounds ahead of the consumer.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import queue
import secrets
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from loader.capture import slot as slots
from loader.errors import SourceError
from loader.lsn import format_lsn

log = logging.getLogger("loader.capture")

DELIMITER, QUOTE = b"\x01", b"\x02"
_COPY_OPTIONS = "FORMAT csv, DELIMITER E'\\x01', QUOTE E'\\x02'"
_READ_CHUNK = 1 << 20


class PipelineUnavailable(SourceError):
    """The slot cannot be copied here (no free replication slot, PostgreSQL before 12): peek instead."""


class RoundFetcher:
    """Consumes a temporary copy of ``slot`` in rounds of at least ``round_rows`` plugin rows (whole
    transactions), each spooled to disk, on a thread; :meth:`rows` yields the rows in order."""

    def __init__(
        self,
        conninfo: str,
        slot: str,
        options: tuple[str, ...],
        upto: int,
        round_rows: int,
        *,
        depth: int = 1,
        spool_dir: Path | None = None,
    ) -> None:
        self.slot = slot
        self.options = options
        self.upto = upto
        self.round_rows = round_rows
        self.spool_dir = spool_dir
        self.copy_slot = f"loader_copy_{os.getpid()}_{secrets.token_hex(4)}"
        self._conninfo = conninfo
        self._conn: psycopg.Connection | None = None
        self._queue: queue.Queue[tuple[Path, int, bool] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        """Copy the slot (in the caller's thread, so that a refusal can fall back to peeks), then
        start fetching."""
        conn = slots.connect(self._conninfo)
        try:
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (self.slot, self.copy_slot))
        except (
            psycopg.errors.UndefinedFunction,  # PostgreSQL before 12
            psycopg.errors.ConfigurationLimitExceeded,  # no free replication slot
            psycopg.errors.InsufficientPrivilege,  # the peek says what the role lacks
            psycopg.errors.ObjectNotInPrerequisiteState,  # an invalidated slot: the peek reports it
            psycopg.errors.FeatureNotSupported,
        ) as exc:
            conn.close()
            raise PipelineUnavailable(f"cannot copy replication slot {self.slot!r}: {str(exc).strip()}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name=f"capture-fetch-{self.slot}", daemon=True)
        self._thread.start()

    def rows(self) -> Iterator[bytes]:
        """Every plugin row up to ``upto``, in order; raises what the fetcher met."""
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            path, rows, quoted = item
            try:
                if rows == 0:
                    return
                yield from (_quoted_lines(path) if quoted else _lines(path))
            finally:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop fetching and drop the copy (closing its session drops a temporary slot)."""
        self._stop.set()
        conn = self._conn
        if conn is not None and self._thread is not None and self._thread.is_alive():
            try:
                conn.cancel_safe()
            except Exception:
                pass
        while True:  # unblock a fetcher waiting to hand over a round, and remove spooled rounds
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, BaseException):
                item[0].unlink(missing_ok=True)
        if self._thread is not None:
            self._thread.join(timeout=30)
        if conn is not None:
            conn.close()
        self._conn = None

    # --- the fetcher thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                path, rows, quoted = self._fetch_round()
                self._hand_over((path, rows, quoted))
                self.rounds += 1
                if rows == 0:
                    return
        except BaseException as exc:
            if not self._stop.is_set():
                self._hand_over(exc)

    def _hand_over(self, item: tuple[Path, int, bool] | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
        if not isinstance(item, BaseException):
            item[0].unlink(missing_ok=True)

    def _fetch_round(self) -> tuple[Path, int, bool]:
        assert self._conn is not None
        placeholders = ", ".join(["%s"] * len(self.options))
        sql = (
            f"COPY (SELECT data FROM pg_logical_slot_get_changes(%s, %s::pg_lsn, %s, {placeholders}))"
            f" TO STDOUT ({_COPY_OPTIONS})"
        )
        fd, name = tempfile.mkstemp(prefix="loader-round-", suffix=".csv", dir=self.spool_dir)
        path = Path(name)
        rows = 0
        quoted = False
        try:
            with os.fdopen(fd, "wb") as out, self._conn.cursor() as cur:
                params = (self.copy_slot, format_lsn(self.upto), self.round_rows, *self.options)
                with cur.copy(sql, params) as copy:
                    for block in copy:
                        data = bytes(block)
                        rows += data.count(b"\n")
                        quoted = quoted or QUOTE in data
                        out.write(data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path, rows, quoted


def _lines(path: Path) -> Iterator[bytes]:
    """The lines of an unquoted round (every row ends with a newline)."""
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(_READ_CHUNK):
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            yield from lines
        if tail:
            yield tail


def _quoted_lines(path: Path) -> Iterator[bytes]:
    """The rows of a round in which COPY quoted some (the data held a delimiter, quote or newline)."""
    with open(path, "rb") as f:
        text = io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape", newline="")
        reader: Any = csv.reader(text, delimiter=DELIMITER.decode(), quotechar=QUOTE.decode())
        for fields in reader:
            yield fields[0].encode("utf-8", "surrogateescape")
