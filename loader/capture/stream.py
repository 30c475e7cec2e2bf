"""Pipelined reading of a slot: a temporary copy of it, consumed in rounds by a fetcher process.

Why: a peek materialises a whole round on the server before it sends the first row, and the server
then sits idle while this process lands the round. A temporary copy of the slot
(``pg_copy_logical_replication_slot``, PostgreSQL 12+) can be *consumed* round after round without
moving the real slot, so the server decodes the next round while this process lands the last. The
real slot is still advanced only to the end of transactions whose files are published; the copy
belongs to the fetcher's session and disappears with it, so a crash anywhere leaves the real slot
where the last durable file put it, exactly as with peeks.

The fetcher is a child process (``python -m loader.capture.stream``), not a thread: COPY delivers
one message per row, and receiving 200,000 of them costs a Python loop about 2.5 us each, which a
thread would spend holding the GIL the landing loop needs. The child spools each round to a file in
a directory of the parent's and names it on its stdout; the parent acknowledges each round it has
landed on the child's stdin, and the child runs at most ``depth`` rounds ahead (bounded disk). When
the parent dies the child meets a closed pipe and exits, and its copy of the slot goes with it.

Rounds come back through ``COPY ... TO STDOUT`` in CSV form, with delimiter and quote bytes (0x01,
0x02) that wal2json never emits raw (it escapes every control character in its JSON), so each line
is one row's data exactly as the plugin wrote it and no per-row unescaping is needed. A round that
holds the quote byte anyway is read with the csv module, which undoes the quoting.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg

from loader.errors import SourceError, TransientError
from loader.landing.private import open_private
from loader.lsn import format_lsn
from loader.spills import private_dir

log = logging.getLogger("loader.capture")

DELIMITER, QUOTE = b"\x01", b"\x02"
_COPY_OPTIONS = "FORMAT csv, DELIMITER E'\\x01', QUOTE E'\\x02'"
_READ_CHUNK = 4 << 20
_QUOTED_LIST = 10_000
SPOOL_PREFIX = "loader-rounds-"
# What makes the copy impossible here rather than broken (the caller peeks either way).
_UNAVAILABLE = {
    "42883",  # undefined_function: PostgreSQL before 12
    "53400",  # configuration_limit_exceeded: no free replication slot
    "42501",  # insufficient_privilege: the peek says what the role lacks
    "55000",  # object_not_in_prerequisite_state: an invalidated slot, which the peek reports
    "0A000",  # feature_not_supported
}


# A round that came back full makes the next one twice as large, up to this many times the first
# (``source.pipeline_round_rows``): the spool holds at most ``depth + 1`` rounds on disk.
ROUND_GROWTH_LIMIT = 16


class PipelineUnavailable(SourceError):
    """The slot cannot be copied here (no free replication slot, PostgreSQL before 12): peek instead."""


class FetcherError(TransientError):
    """The capture's fetcher process failed; nothing was confirmed past what is landed: re-run."""


class RoundFetcher:
    """Consumes a temporary copy of ``slot`` in rounds of at least ``round_rows`` plugin rows (whole
    transactions; a round that comes back full doubles the next, up to ``ROUND_GROWTH_LIMIT`` times),
    each spooled to disk by a child process; :meth:`rows` yields the rows in order."""

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
        self.copy_slot = f"loader_copy_{os.getpid()}_{secrets.token_hex(4)}"
        self._job = {
            "conninfo": conninfo,
            "slot": slot,
            "copy_slot": self.copy_slot,
            "options": list(options),
            "upto": upto,
            "round_rows": round_rows,
            "depth": depth,
        }
        self._spool_parent = spool_dir
        self._spool: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.rounds = 0
        self.fetch_seconds = 0.0  # the fetcher's time in COPY, summed over rounds
        self.asked: list[int] = []  # the rows each round asked for

    def start(self) -> None:
        """Start the fetcher and wait until it holds the copy (so a refusal can fall back to peeks)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the fetcher process; it connects and copies the slot while the caller goes on."""
        # mode 0700; its round files hold the source's rows, each 0600
        self._spool = private_dir(SPOOL_PREFIX, self._spool_parent)
        self._job["spool"] = str(self._spool)
        # Its stderr goes to a file: a pipe nobody reads while rows flow could fill and stall it.
        with open_private(self._spool / "fetcher.log") as log_file:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "loader.capture.stream"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log_file,
                    # It imports this package from wherever this process did (spark-submit
                    # --py-files adds paths at run time, which a new interpreter would not know).
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                )
            except BaseException:
                self.close()
                raise
        assert self._proc.stdin is not None
        try:
            # The connection string (it may hold a password) goes through the pipe, never argv.
            self._proc.stdin.write(json.dumps(self._job).encode() + b"\n")
            self._proc.stdin.flush()
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """Wait until the fetcher holds its copy of the slot; PipelineUnavailable if it cannot."""
        try:
            msg = self._message()
        except FetcherError as exc:
            self.close()
            raise PipelineUnavailable(str(exc)) from exc
        except BaseException:
            self.close()
            raise
        if "error" in msg:
            # Whatever stops the copy (no free slot, an older server, a role without the right, a
            # slot invalidated meanwhile) the peek meets too, and reports in its own terms.
            self.close()
            state = msg.get("sqlstate")
            known = " (expected here)" if state in _UNAVAILABLE else ""
            raise PipelineUnavailable(f"cannot copy replication slot {self.slot!r}{known}: {msg['error']}")

    def rows(self) -> Iterator[bytes]:
        """Every plugin row up to ``upto``, in order; raises what the fetcher met."""
        for block in self.blocks():
            if isinstance(block, list):
                yield from block
            else:
                yield from block.split(b"\n")[:-1]

    def blocks(self) -> Iterator[bytes | list[bytes]]:
        """Every plugin row up to ``upto``, in order, in blocks: the bytes of whole rows, each
        ending with a newline (about ``_READ_CHUNK`` of them), or, from a round COPY had to quote,
        a list of rows. Raises what the fetcher met."""
        assert self._proc is not None and self._proc.stdin is not None
        while True:
            msg = self._message()
            if "error" in msg:
                raise FetcherError(
                    f"reading replication slot {self.slot!r} (through its copy) failed: {msg['error']}",
                    hint="nothing past the landed files was confirmed; re-run capture",
                )
            path, rows = Path(msg["path"]), int(msg["rows"])
            self.fetch_seconds += float(msg.get("seconds", 0.0))
            self.asked.append(int(msg.get("asked", 0)))
            try:
                if rows == 0:
                    return
                if msg["quoted"]:
                    # In lists of at most _QUOTED_LIST rows: rounds grow to 16 times the first.
                    lines = _quoted_lines(path)
                    while chunk := list(itertools.islice(lines, _QUOTED_LIST)):
                        yield chunk
                else:
                    yield from _blocks(path)
            finally:
                path.unlink(missing_ok=True)
            self.rounds += 1
            try:
                self._proc.stdin.write(b"next\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass  # it has sent its last round and ended; what it said is still to be read

    def close(self) -> None:
        """Stop the fetcher (its copy of the slot goes with its session) and remove its spool."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            self._proc = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None

    def _message(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            log_path = self._spool / "fetcher.log" if self._spool is not None else None
            err = log_path.read_bytes().decode("utf-8", "replace").strip() if log_path and log_path.exists() else ""
            raise FetcherError(
                f"the capture's fetcher process for slot {self.slot!r} exited ({code}): {err[-2000:] or 'no message'}",
                hint="nothing past the landed files was confirmed; re-run capture",
            )
        doc: dict[str, Any] = json.loads(line)
        return doc


# --- the fetcher process ------------------------------------------------------------------------


def _fetcher_main(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    from loader.capture import slot as slots

    # The parent decides when this process ends (it terminates it, or closes the pipes by dying):
    # a Ctrl-C in the terminal reaches the whole process group and must not end it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = json.loads(stdin.readline())

    def say(doc: dict[str, Any]) -> None:
        stdout.write(json.dumps(doc).encode() + b"\n")
        stdout.flush()

    try:
        conn = slots.connect(job["conninfo"])
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (job["slot"], job["copy_slot"]))
    except psycopg.Error as exc:
        say({"error": str(exc).strip(), "sqlstate": getattr(exc, "sqlstate", None)})
        return 1
    say({"ready": True})
    from psycopg import sql

    options = tuple(job["options"])

    def query(round_rows: int) -> bytes:
        statement = sql.SQL(
            "COPY (SELECT data FROM pg_logical_slot_get_changes({}, {}::pg_lsn, {}"
            + ", {}" * len(options)
            + ")) TO STDOUT ("
            + _COPY_OPTIONS
            + ")"
        ).format(*[sql.Literal(v) for v in (job["copy_slot"], format_lsn(job["upto"]), round_rows, *options)])
        return statement.as_bytes(conn)

    spool = Path(job["spool"])
    ahead = 0
    n = 0
    round_rows = int(job["round_rows"])
    most = max(round_rows, round_rows * ROUND_GROWTH_LIMIT)
    try:
        while True:
            n += 1
            path = spool / f"round-{n:08d}.csv"
            started = time.perf_counter()
            rows, quoted = _fetch_round(conn.pgconn, query(round_rows), path)
            seconds = time.perf_counter() - started
            say({"path": str(path), "rows": rows, "asked": round_rows, "quoted": quoted, "seconds": seconds})
            if rows == 0:
                return 0
            if rows >= round_rows:
                # Every round decodes the WAL again from the copy's restart_lsn, which moves only
                # at the running-transactions records in the WAL (every 15 s, at checkpoints): a
                # backlog written faster is skipped through again by each round (0.2 us a row
                # here), so rounds of a fixed size cost the square of the backlog (P9: 10M changes
                # in 100 rounds of 100,000 skipped through about 500M rows, half the capture's
                # time). Rounds that came back full double, up to ROUND_GROWTH_LIMIT times the first.
                round_rows = min(most, round_rows * 2)
            ahead += 1
            if ahead > job["depth"]:
                if not stdin.readline():
                    return 0  # the parent is gone
                ahead -= 1
    except _RoundFailed as exc:
        say({"error": str(exc), "sqlstate": exc.sqlstate})
        return 1
    except BrokenPipeError:
        return 0  # the parent is gone
    finally:
        conn.close()


class _RoundFailed(Exception):
    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _fetch_round(pgconn: Any, query: bytes, path: Path) -> tuple[int, bool]:
    """One round into ``path``: (rows, whether COPY quoted any).

    Straight libpq calls, blocking (nothing else runs in this process): psycopg's COPY iterator
    costs about twice as much per row.
    """
    from psycopg import pq

    def failed(res: Any) -> _RoundFailed:
        state = res.error_field(pq.DiagnosticField.SQLSTATE)
        message = (res.error_message or pgconn.error_message or b"").decode("utf-8", "replace").strip()
        return _RoundFailed(message or "COPY failed", state.decode() if state else None)

    rows = 0
    quoted = False
    pgconn.send_query(query)
    res = pgconn.get_result()
    if res is None or res.status != pq.ExecStatus.COPY_OUT:
        error = failed(res) if res is not None else _RoundFailed("no result from COPY", None)
        while pgconn.get_result() is not None:
            pass
        raise error
    with open_private(path) as out:
        blocks: list[bytes] = []
        while True:
            nbytes, data = pgconn.get_copy_data(0)
            if nbytes < 0:
                break
            blocks.append(bytes(data))
            if len(blocks) >= 4096:
                chunk = b"".join(blocks)
                blocks.clear()
                rows += chunk.count(b"\n")
                quoted = quoted or QUOTE in chunk
                out.write(chunk)
        chunk = b"".join(blocks)
        rows += chunk.count(b"\n")
        quoted = quoted or QUOTE in chunk
        out.write(chunk)
    final: _RoundFailed | None = None
    while (res := pgconn.get_result()) is not None:
        if res.status != pq.ExecStatus.COMMAND_OK and final is None:
            final = failed(res)  # an error after the last row (the slot's decoding failed)
    if final is not None:
        raise final
    return rows, quoted


def _blocks(path: Path) -> Iterator[bytes]:
    """The rows of an unquoted round (every row ends with a newline) in blocks of whole rows."""
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(_READ_CHUNK):
            data = tail + chunk
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            if cut:
                yield data[:cut]
        if tail:
            yield tail + b"\n"


def _quoted_lines(path: Path) -> Iterator[bytes]:
    """The rows of a round in which COPY quoted some (the data held a delimiter, quote or newline)."""
    with open(path, "rb") as f:
        text = io.TextIOWrapper(f, encoding="utf-8", errors="surrogateescape", newline="")
        reader: Any = csv.reader(text, delimiter=DELIMITER.decode(), quotechar=QUOTE.decode())
        for fields in reader:
            yield fields[0].encode("utf-8", "surrogateescape")


if __name__ == "__main__":
    sys.exit(_fetcher_main(sys.stdin.buffer, sys.stdout.buffer))
