"""The commits of a load's driver groups: written as they are typed, committed together.

A backlog loads on the driver in groups of at most ``load.driver_max_bytes`` (bounded memory).
Each group's rows are written to data files as soon as they are typed, on a thread of their own
(:class:`Committer`), while the next group is typed; what a group adds to each table's metadata
(its data files, its first and last positions, its park and resync rows) and to the ledger is
kept here (:class:`Pending`) and committed for all the groups kept so far at once, one commit
per history table and then one ledger commit, at the latest ``load.commit_interval_s`` after the
first of them was written, and always before the catalog changes (a table created or evolved),
before a batch the Spark path loads, and when the load ends. A commit costs metadata reads and
writes that do not grow with the rows, so a backlog of many groups pays them once per interval,
not once per group; and its tables gather one snapshot per interval.

Exactly once, as before: the data files of groups not committed are visible to nothing (no
snapshot names them); a load killed before the commit leaves them as orphans (``loader maintain``
removes orphan files) and nothing in the ledger, so the next load loads the same files again.
The commit keeps the order of a load without this stage: each table's append, then the ledger,
so a load killed during it leaves what the Spark path's anti-join repairs (for every group of that
commit: the reason the interval is a few seconds by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loader.faults import checkpoint
from loader.lsn import ChangePosition

if TYPE_CHECKING:
    from loader.lake.tables import SourceTable
    from loader.landing.store import LandingFile
    from loader.load.result import LoadResult

log = logging.getLogger("loader.load")


@dataclass
class Staged:
    """One history table's rows of one or more groups, written to data files and not committed:
    the files (pyiceberg's DataFile), their rows, the first and last position they hold (parks
    included), their park and resync rows ((lsn, seq, operation, note)) and the loaded-through
    position of the last group's last file (the snapshot summary)."""

    table: SourceTable
    ident: str
    files: list[Any]
    rows: int
    first: ChangePosition
    last: ChangePosition
    markers: list[tuple[int, int, str, str | None]]
    loaded_through: str

    def then(self, later: Staged) -> Staged:
        """This table's rows followed by those of a later group."""
        return Staged(
            self.table,
            self.ident,
            self.files + later.files,
            self.rows + later.rows,
            min(self.first, later.first),
            max(self.last, later.last),
            self.markers + later.markers,
            later.loaded_through,
        )


@dataclass
class Pending:
    """Groups written and not committed: per history table its :class:`Staged` rows, the groups'
    landing files and ledger rows (in group order), the newest commit time of an accepted change,
    and each group's results (handed to the load's once committed)."""

    tables: dict[str, Staged] = field(default_factory=dict)
    files: list[LandingFile] = field(default_factory=list)
    ledger_rows: list[tuple[Any, ...]] = field(default_factory=list)
    newest_ts: str | None = None
    parts: list[LoadResult] = field(default_factory=list)
    since: float | None = None

    def add(
        self,
        files: list[LandingFile],
        staged: list[Staged],
        ledger_rows: list[tuple[Any, ...]],
        newest_ts: str | None,
        part: LoadResult,
    ) -> None:
        if self.since is None:
            self.since = time.monotonic()
        for s in staged:
            kept = self.tables.get(s.ident)
            self.tables[s.ident] = s if kept is None else kept.then(s)
        self.files += files
        self.ledger_rows += ledger_rows
        if newest_ts is not None:
            # capture's UTC form (checked before a group is staged) orders as text
            self.newest_ts = max(self.newest_ts or newest_ts, newest_ts)
        self.parts.append(part)

    def __bool__(self) -> bool:
        return bool(self.parts)


class Committer:
    """The commits of a load's driver groups, on a thread of their own: a group's rows written
    (``submit``) while the load types the next group, one group at a time and in group order, then
    kept (:meth:`stage`) and committed with the groups kept before it (:meth:`commit_pending`), so
    a load killed anywhere leaves what a load without this stage leaves: a prefix of the groups
    committed, each table's append before its ledger rows. :meth:`settle` waits for the group
    submitted before, adds its results to the load's once they are committed, or raises its error
    (nothing after it is committed then). A load that fails while a group is written waits for it,
    whatever its outcome, then commits the groups kept before it raises (should that commit fail
    too, its error is logged and the load's raised).

    ``commit``: commits a :class:`Pending` (each table's append, then the ledger).
    ``interval_s``: the longest a written group waits for its commit (0: every group at once).

    Memory: a group written, one typed and one read ahead (loader.load.driver.checked_ahead), plus
    the data files' metadata of the groups kept.
    """

    def __init__(self, result: LoadResult, commit: Callable[[Pending], None], interval_s: float) -> None:
        self.result = result
        self._commit = commit
        self._interval_s = interval_s
        self._pending = Pending()
        self._pool: ThreadPoolExecutor | None = None
        self._running: tuple[Future[bool], LoadResult] | None = None

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is None:
                self.flush()
                return
            if self._running is not None:
                running, self._running = self._running[0], None
                wait([running])  # its writing finishes (or fails) before the load's error is raised
                if running.exception() is not None:
                    log.warning("load: a group's commit failed too: %s", running.exception())
            if isinstance(exc, Exception) and self._pending:
                try:
                    self.commit_pending()  # the groups written whole before the error
                except Exception as also:
                    log.warning("load: committing the groups written before the error failed too: %s", also)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def submit(self, write: Callable[[], bool], part: LoadResult) -> None:
        """``write`` on the commit thread: True when it kept its group (:meth:`stage`), False when
        it committed it itself (the Spark path's load of a group found not plain)."""
        assert self._running is None, "settle() before the next submit()"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="load-commit")
        self._running = (self._pool.submit(write), part)

    def settle(self) -> None:
        """The group submitted before is written and kept, or committed (its error raised here)."""
        if self._running is None:
            return
        (future, part), self._running = self._running, None
        if not future.result():
            self.add(part)

    def flush(self) -> None:
        """Every group submitted so far committed: before the catalog changes, before a batch the
        Spark path loads, and when the load ends."""
        self.settle()
        self.commit_pending()

    def stage(
        self,
        files: list[LandingFile],
        staged: list[Staged],
        ledger_rows: list[tuple[Any, ...]],
        newest_ts: str | None,
        part: LoadResult,
    ) -> None:
        """Keep a group written (on the commit thread); commit what is kept once the oldest of it
        has waited ``interval_s``."""
        self._pending.add(files, staged, ledger_rows, newest_ts, part)
        checkpoint("load-group-written")
        assert self._pending.since is not None
        if time.monotonic() - self._pending.since >= self._interval_s:
            self.commit_pending()

    def commit_pending(self) -> None:
        """Commit the groups kept (taken first: a failed commit is never tried twice, its files
        then orphans at worst), then their results join the load's."""
        if not self._pending:
            return
        pending, self._pending = self._pending, Pending()
        self._commit(pending)
        for part in pending.parts:
            self.add(part)

    def add(self, part: LoadResult) -> None:
        """A group's results, once committed, in the load's."""
        result = self.result
        result.files += part.files
        for t, n in part.rows_per_table.items():
            result.rows_per_table[t] = result.rows_per_table.get(t, 0) + n
        part.rows_per_table = {}
        result.absorb(part)
        result.loaded_through = part.loaded_through or result.loaded_through
