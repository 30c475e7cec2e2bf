"""Follow mode (``loader run --follow``): one long-lived process and Spark session, seconds of freshness.

Two loops:
- a capture thread lands the slot's changes every ``follow.capture_interval_s`` (it keeps
  streaming while Spark loads: nothing waits for the merge), and at once when the main thread asks;
- the main thread cycles: ask the capture thread for a run that starts now and wait for it (at most
  ``follow.capture_wait_s``), so the cycle loads every transaction committed before it started
  rather than those of the last timed run; list the landing area; if files are pending, load a bounded batch
  (``follow.max_batch_files``), then merge the tables that received changes; otherwise sleep.
  An idle cycle lists the landing area and nothing else: no Spark job, no Iceberg commit. A table
  without changes in a cycle costs nothing. Maintenance runs every ``maintenance.every_minutes``.

The follower holds the load and merge locks for its whole life: one follower per catalog (a second
one exits 75 naming the first). SIGTERM or SIGINT lets the current step finish (a load or merge
completes or is abandoned before its commit), stops the capture thread after its run, and exits 0.
After a SIGKILL a restart repairs everything (every step is idempotent): nothing lost or doubled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loader.config import LoaderSettings
from loader.errors import LoaderError, SlotLostError, TerminalError, TransientError
from loader.faults import checkpoint
from loader.locks import stage_lock
from loader.metrics import Metrics
from loader.status import commit_time

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.follow")


@dataclass
class FollowStats:
    cycles: int = 0
    idle_cycles: int = 0
    loaded_changes: int = 0
    captured_changes: int = 0
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def stop_on_signals(*events: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``events`` while the block runs (the handlers before are restored
    after it).

    A signal handler runs in the main thread between two of its bytecodes, possibly while that
    thread holds the very lock ``Event.set`` takes (a follower's main loop sets its capture
    thread's wake-up event): setting an event in the handler then deadlocks the process for good
    (seen: SIGTERM inside ``capture_now``'s ``_wake.set()``, a follower that never stopped). The
    handler only writes the signal's number to a pipe (a system call, no Python lock); a thread of
    its own reads it, logs it and sets the events."""
    read_end, write_end = os.pipe()

    def watch() -> None:
        while got := os.read(read_end, 1):
            log.warning("received %s: finishing the current step, then stopping", signal.Signals(got[0]).name)
            for event in events:
                event.set()

    watcher = threading.Thread(target=watch, name="signals", daemon=True)
    watcher.start()
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: os.write(write_end, bytes([signum])))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_end)  # the watcher reads the pipe's end and returns
        watcher.join(timeout=10)
        os.close(read_end)


class Follower:
    def __init__(
        self,
        settings: LoaderSettings,
        spark: SparkSession,
        metrics: Metrics | None = None,
        max_cycles: int | None = None,
    ) -> None:
        self.settings = settings
        self.spark = spark
        self.metrics = metrics or Metrics()
        self.stop = threading.Event()
        self.max_cycles = max_cycles
        self.stats = FollowStats()
        self._loaded: set[str] | None = None  # landing files known loaded (seeded from the ledger once)
        self._dirty: set[str] | None = None  # tables with changes not merged yet (None: all, on start)
        self._capture_error: BaseException | None = None
        self._last_maintenance = time.monotonic()
        # Commits per table (qualified name; "" the ledger) since its snapshots were last expired.
        self._commits: dict[str, int] = {}
        self._parked: dict[str, bool] = {}  # every keyed table seen by a merge -> parked?
        # Capture runs started and finished (under _capture_cond); _wake ends the capture thread's pause.
        self._capture_cond = threading.Condition()
        self._capture_runs = (0, 0)
        self._wake = threading.Event()
        self._capture_thread: threading.Thread | None = None
        from loader.verify import RollingVerifier

        # Continuous verification: the first round one verify.every_minutes after the start.
        self.verifier = RollingVerifier(settings, self.metrics, land=self._land_until, started=time.monotonic())

    # --- lifecycle -------------------------------------------------------------------------
    def run(self) -> int:
        """Follow until stopped; the exit status (0 after SIGTERM/SIGINT)."""
        with stop_on_signals(self.stop, self._wake):
            return self._run()

    def _run(self) -> int:
        with stage_lock(self.settings, "load"), stage_lock(self.settings, "merge"):
            capture = threading.Thread(target=self._capture_loop, name="capture", daemon=True)
            self._capture_thread = capture
            capture.start()
            try:
                self._main_loop()
            finally:
                self.stop.set()
                self._wake.set()
                capture.join(timeout=600)
        if isinstance(self._capture_error, TerminalError):
            raise self._capture_error
        return 0

    # --- capture thread --------------------------------------------------------------------
    def _capture_loop(self) -> None:
        try:
            self._capture_runs_until_stopped()
        finally:
            with self._capture_cond:  # a cycle waiting in capture_now must not wait for a run that never comes
                self._capture_cond.notify_all()

    def _capture_runs_until_stopped(self) -> None:
        from loader.capture.capture import Capture

        interval = self.settings.follow.capture_interval_s
        beat_every = self.settings.source.heartbeat_interval_s
        last_beat: float | None = None
        while not self.stop.is_set():
            self._wake.clear()
            with self._capture_cond:
                started, finished = self._capture_runs
                self._capture_runs = (started + 1, finished)
            # The heartbeat on its timer: a run emits one when the last is beat_every seconds old.
            beat = beat_every > 0 and (last_beat is None or time.monotonic() - last_beat >= beat_every)
            try:
                if beat:
                    last_beat = time.monotonic()
                try:
                    res = Capture(self.settings, heartbeat=beat).run()
                except Exception as exc:
                    if not self._outage("capture", exc):
                        raise
                else:
                    if res.files:
                        checkpoint("follow-after-capture")  # a round landed, the next cycle not started
                    self.stats.captured_changes += res.changes
                    self.metrics.changes.labels(stage="capture").inc(res.changes)
                    self.metrics.slot_lag.set(res.lag_bytes)
                    self.metrics.note_slot(res.retained_wal_bytes, res.wal_status)
                    if res.heartbeat_seen_at is not None:
                        self.metrics.note_heartbeat(res.heartbeat_seen_at)
                    for table, why in res.parked.items():
                        log.warning("capture parked %s: %s", table, why)
            except SlotLostError as exc:
                log.error("capture stopped: %s", exc.one_line())
                self._capture_error = exc
                self.stop.set()
                return
            except TransientError as exc:
                log.warning("capture will retry: %s", exc.one_line())
            except LoaderError as exc:
                log.error("capture failed: %s", exc.one_line())
                self._capture_error = exc
                self.stop.set()
                return
            except Exception:
                log.exception("capture failed; retrying after the interval")
            finally:
                with self._capture_cond:
                    started, finished = self._capture_runs
                    self._capture_runs = (started, finished + 1)
                    self._capture_cond.notify_all()
            wait = interval
            if beat_every > 0 and last_beat is not None:
                wait = min(interval, max(0.0, beat_every - (time.monotonic() - last_beat)))
            self._wake.wait(wait)

    def _outage(self, step: str, exc: BaseException) -> bool:
        """True when ``exc`` is an outage of the source or the catalog database, or of the warehouse
        inside Spark: logged and counted, and the step is tried again on its next turn (follow mode
        never exits for one)."""
        from loader.retry import outage, outage_server, server_phrase

        what = outage(exc)
        if what is None:
            return False
        server, where = outage_server(exc, self.settings)
        self.metrics.outages.labels(server=server).inc()
        log.warning(
            "%s will retry: %s is unavailable (%s)", step, server_phrase(server, where), what, extra={"server": server}
        )
        return True

    def capture_now(self, timeout: float) -> bool:
        """Ask the capture thread for a run that starts after this call and wait for its end (at
        most ``timeout`` seconds): every transaction committed before the call is then landed.
        False when it did not finish in time (the cycle goes on with what has landed)."""
        thread = self._capture_thread
        if timeout <= 0 or thread is None or not thread.is_alive():
            return False
        with self._capture_cond:
            # A run in progress may have read the slot before the caller's commits: wait for the next.
            need = self._capture_runs[0] + 1
            self._wake.set()
            return (
                self._capture_cond.wait_for(
                    lambda: self._capture_runs[1] >= need or self.stop.is_set() or not thread.is_alive(), timeout
                )
                and self._capture_runs[1] >= need
            )

    # --- load + merge cycles ---------------------------------------------------------------
    def _main_loop(self) -> None:
        interval = self.settings.follow.interval_s
        while not self.stop.is_set():
            started = time.monotonic()
            self.capture_now(self.settings.follow.capture_wait_s)
            try:
                worked = self.cycle()
                self.metrics.cycles.labels(result="work" if worked else "idle").inc()
                self.metrics.last_success.set(time.time())
                if worked:
                    self.metrics.cycle_seconds.observe(time.monotonic() - started)
            except Exception as exc:
                if self._outage("cycle", exc):
                    self.metrics.cycles.labels(result="error").inc()
                    self.stats.errors.append(
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    )
                elif isinstance(exc, TransientError):
                    self.metrics.cycles.labels(result="error").inc()
                    self.stats.errors.append(exc.one_line())
                    log.warning("cycle will be retried: %s", exc.one_line())
                else:
                    raise
            self.stats.cycles += 1
            if self.max_cycles is not None and self.stats.cycles >= self.max_cycles:
                return
            if (
                not self.stop.is_set()
                and time.monotonic() - self._last_maintenance >= self.settings.maintenance.every_minutes * 60
            ):
                self._maintain()
            if not self.stop.is_set():
                self._expire_crowded()
            if not self.stop.is_set() and self.verifier.due(time.monotonic()):
                self._verify()
            self.stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def cycle(self) -> bool:
        """One load + merge; False when there was nothing to do (no Spark job, no commit)."""
        from loader.load.history import HistoryLoad
        from loader.merge.current import CurrentMerge

        load = HistoryLoad(self.spark, self.settings)
        if self._loaded is None:
            from loader.lake.commits import ensure_loader_tables

            ensure_loader_tables(load.settings)
            self._loaded = load.loaded_files(load.store.files())
        batch, _ = load.pending_files(self._loaded, self.settings.follow.max_batch_files)
        if not batch and self._dirty is not None and not self._dirty:
            self.stats.idle_cycles += 1
            return False
        started = time.monotonic()
        changed = 0
        if batch:
            res = load.run(known_loaded=self._loaded, max_files=self.settings.follow.max_batch_files)
            self._loaded.update(res.files)
            checkpoint("follow-after-load")  # history and ledger committed, the merge not begun
            changed = sum(res.rows_per_table.values())
            self._count_commits(["", *(t for t, n in res.rows_per_table.items() if n)])
            self.stats.loaded_changes += changed
            self.metrics.changes.labels(stage="load").inc(changed)
            self.metrics.rejects.inc(res.rejects)
            for engine in res.engines:
                self.metrics.load_batches.labels(engine=engine.split()[0]).inc()
            if self._dirty is not None:
                self._dirty.update(res.rows_per_table)
                self._dirty.update(res.parked)
        if self.stop.is_set() and self._dirty:
            return True  # stopping: the merge runs on the next start
        loaded_at = time.monotonic()
        merge = CurrentMerge(self.spark, self.settings).run(sorted(self._dirty) if self._dirty is not None else None)
        checkpoint("follow-after-merge")  # current tables committed, before the cycle's bookkeeping
        self._dirty = set()
        self._count_commits([t.table for t in merge.tables if not t.skipped_reason])
        log.info(
            "cycle: loaded %d changes from %d files in %.2fs, merged %d tables in %.2fs",
            changed,
            len(batch),
            loaded_at - started,
            sum(1 for t in merge.tables if not t.skipped_reason),
            time.monotonic() - loaded_at,
        )
        self.metrics.changes.labels(stage="merge").inc(sum(t.increment_rows for t in merge.tables))
        self.metrics.parked.set(len(merge.parked))
        self._note_freshness(merge)
        return True

    def _note_freshness(self, merge: Any) -> None:
        from loader.lake.iceberg import table_properties
        from loader.lake.tables import PROP_LOADED_THROUGH_TS, TableNames

        for t in merge.tables:
            if not t.skipped_reason or t.parked:
                self._parked[t.table] = bool(t.parked)
        ts = commit_time(table_properties(self.spark, TableNames(self.settings).ledger).get(PROP_LOADED_THROUGH_TS))
        if ts is None:
            return
        # Every table not parked is merged through loaded-through (the others had nothing to merge).
        for table, parked in self._parked.items():
            if not parked:
                self.metrics.table_fresh_as_of(table, ts)

    def _land_until(self, cut: int) -> None:
        """Continuous verification's cut: the capture thread lands everything committed before it."""
        from loader.capture import slot as slots
        from loader.errors import SourceError

        deadline = time.monotonic() + self.settings.follow.capture_wait_s + 60
        while time.monotonic() < deadline and not self.stop.is_set():
            self.capture_now(self.settings.follow.capture_wait_s)
            with slots.connect(self.settings.source.conninfo()) as conn:
                info = slots.slot_info(conn, self.settings.source.slot)
            if info is not None and info.confirmed_flush_lsn is not None and info.confirmed_flush_lsn >= cut:
                return
        raise SourceError("the capture thread did not reach the verification's cut in time")

    def _verify(self) -> None:
        self._periodic("verify", lambda: self.verifier.round(time.monotonic()).summary())

    def _maintain(self) -> None:
        from loader.maintain import Maintenance

        self._last_maintenance = time.monotonic()
        self._commits.clear()  # maintenance expires every table
        self._periodic("maintenance", lambda: Maintenance(self.spark, self.settings).run().summary())

    def _count_commits(self, tables: list[str]) -> None:
        for t in tables:
            self._commits[t] = self._commits.get(t, 0) + 1

    def _expire_crowded(self) -> None:
        """Expire the snapshots of the tables committed to at least a quarter of
        ``maintenance.max_snapshots`` times since their last expiry (or maintenance): a table
        committed every cycle gathers about 1,800 snapshots an hour, and its commits and every
        reader's table load slow down with each. Between maintenance runs this bounds a table to
        the snapshots younger than ``snapshot_min_age_minutes``, or the cap, plus a quarter of it."""
        from loader.maintain import Maintenance

        cap = self.settings.maintenance.max_snapshots
        if cap is None:
            return
        due = sorted(t for t, n in self._commits.items() if n >= max(1, cap // 4))
        if not due:
            return
        for t in due:
            del self._commits[t]
        tables = [t for t in due if t]
        self._periodic(
            "snapshot expiry",
            lambda: Maintenance(self.spark, self.settings).expire(tables, ledger="" in due).summary(),
        )

    def _periodic(self, step: str, work: Callable[[], str]) -> None:
        """Verification or maintenance between cycles: its summary logged; an outage or a transient
        failure logged and left to the next time it is due; anything else ends follow mode."""
        try:
            log.info("%s", work())
        except Exception as exc:
            if self._outage(step, exc):
                return
            if not isinstance(exc, TransientError):
                raise
            log.warning("%s will be retried: %s", step, exc.one_line())
