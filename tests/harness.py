"""Test harness around one isolated pipeline: source SQL, every stage, and the oracles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from loader.capture.capture import Capture, CaptureResult
from loader.config import LoaderSettings
from loader.load.history import HistoryLoad, LoadResult
from loader.merge.current import CurrentMerge, MergeResult
from loader.tables import SourceTable, TableNames
from loader.verify import Reconciliation, reconcile


@dataclass
class Env:
    settings: LoaderSettings
    spark: Any
    uid: str
    tmp: Path
    _conn: psycopg.Connection | None = field(default=None, repr=False)

    # --- source -------------------------------------------------------------------------
    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.settings.source.dsn, autocommit=True)
        return self._conn

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def transaction(self, *statements: str) -> None:
        """Run statements as one source transaction."""
        with self.conn.transaction():
            for s in statements:
                self.conn.execute(s)

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    # --- stages -------------------------------------------------------------------------
    def capture(self, **kwargs: Any) -> CaptureResult:
        return Capture(self.settings, **kwargs).run()

    def load(self) -> LoadResult:
        return HistoryLoad(self.spark, self.settings).run()

    def merge(self) -> MergeResult:
        return CurrentMerge(self.spark, self.settings).run()

    def run_all(self) -> tuple[CaptureResult, LoadResult, MergeResult]:
        return self.capture(), self.load(), self.merge()

    def resync(self, tables: list[str] | None = None, **kwargs: Any) -> Any:
        """What 'loader resync' does (a consistent re-snapshot that replaces the tables' state)."""
        from loader.capture.snapshot import Snapshot

        return Snapshot(self.settings, tables=tables, reason="requested by the test", **kwargs).run()

    def configure(self, section: str, **values: Any) -> None:
        """Change settings of one section (e.g. configure('source', auto_resync=False))."""
        old = getattr(self.settings, section)
        part = type(old).model_validate({**old.model_dump(), **values})  # validated: secrets become SecretStr
        self.settings = self.settings.model_copy(update={section: part})

    def status(self) -> Any:
        from loader.status import collect_status

        return collect_status(self.settings)

    # --- lakehouse reads ----------------------------------------------------------------
    @property
    def names(self) -> TableNames:
        return TableNames(self.settings)

    def history(self, table: str) -> Any:
        schema, _, name = table.partition(".")
        return self.spark.table(self.names.history(SourceTable(schema, name)))

    def current(self, table: str) -> Any:
        schema, _, name = table.partition(".")
        return self.spark.table(self.names.current(SourceTable(schema, name)))

    # --- oracles ------------------------------------------------------------------------
    def reconcile(self, tables: list[str] | None = None) -> list[Reconciliation]:
        return reconcile(self.settings, tables)

    def assert_reconciled(self, tables: list[str] | None = None) -> list[Reconciliation]:
        """Current tables equal the source, row for row and value for value."""
        results = self.reconcile(tables)
        assert results, "no tables to reconcile"
        bad = [r for r in results if not r.ok]
        assert not bad, "\n".join(r.line() + "\n  " + "\n  ".join(r.examples) for r in bad)
        return results


# --- the loader as a real process (crash, overlap and follow-mode tests) -----------------------


def cli_env(env: Env, **extra: str) -> dict[str, str]:
    """The environment that makes a ``loader`` process use ``env``'s settings."""
    s = env.settings
    out = dict(os.environ)
    out.update(
        {
            "LOADER_SOURCE__DSN": s.source.dsn,
            "LOADER_SOURCE__SLOT": s.source.slot,
            "LOADER_SOURCE__MAX_CHANGES_PER_FILE": str(s.source.max_changes_per_file),
            "LOADER_LANDING__URL": s.landing.url,
            "LOADER_CATALOG__URI": s.catalog.uri,
            "LOADER_CATALOG__WAREHOUSE": s.catalog.warehouse,
            "LOADER_CATALOG__HISTORY_NAMESPACE": s.catalog.history_namespace,
            "LOADER_CATALOG__CURRENT_NAMESPACE": s.catalog.current_namespace,
            "LOADER_CATALOG__LOADER_NAMESPACE": s.catalog.loader_namespace,
            "LOADER_SPARK__SHUFFLE_PARTITIONS": "2",
            "LOADER_SPARK__DRIVER_MEMORY": "1g",
            "LOADER_MERGE__KEY_BUCKETS": str(s.merge.key_buckets),
        }
    )
    out.pop("LOADER_FAULT", None)
    out.pop("LOADER_PAUSE", None)
    out.update(extra)
    return out


def loader_process(env: Env, *args: str, **extra: str) -> subprocess.Popen[str]:
    """``loader <args>`` as a child process (``python -m loader.cli``), output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "loader.cli", *args],
        env=cli_env(env, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_for_holder(env: Env, stage: str, timeout: float = 120) -> None:
    """Until a 'loader <stage>' process holds its lock (its session shows in the catalog database)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(env.settings.catalog.uri, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s",
                (f"lakehouse-loader {stage} %",),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"no 'loader {stage}' took its lock within {timeout}s")


def hold_back_landing_files(env: Env) -> list[Any]:
    """Move the last run of whole-transaction landing files away, as a lagging copy or listing
    would hold them back: it starts a transaction (after a file that ends one) and ends on a
    commit; later files start transactions of their own. Returns them (see return_landing_files)."""
    from loader.capture.landing import open_landing

    files = open_landing(env.settings).files()
    start = next(i for i in range(len(files) - 2, 0, -1) if files[i].first.seq == 1 and files[i - 1].complete)
    end = next(j for j in range(start, len(files)) if files[j].complete)
    held = files[start : end + 1]
    slot_dir = env.tmp / "landing" / env.settings.source.slot
    for f in held:
        shutil.move(slot_dir / f.name, env.tmp / f.name)
    return held


def return_landing_files(env: Env, held: list[Any]) -> None:
    """The held-back files arrive late."""
    slot_dir = env.tmp / "landing" / env.settings.source.slot
    for f in held:
        shutil.move(env.tmp / f.name, slot_dir / f.name)
