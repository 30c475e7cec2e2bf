"""Test harness around one isolated pipeline: source SQL, every stage, and the oracles."""

from __future__ import annotations

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
