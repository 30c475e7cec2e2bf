"""The ``src`` fixture of the capture tests: a fresh source database, slot name and landing directory."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loader.capture import slot as slots
from loader.capture.capture import Capture
from loader.config import LoaderSettings
from loader.landing.records import COMMIT, ChangeRecord
from loader.landing.store import LandingStore, open_landing
from tests.harness import TEST_PG, create_db


@dataclass
class Src:
    settings: LoaderSettings
    conn: psycopg.Connection
    tmp: Path

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def capture(self, **kwargs: Any) -> Any:
        return Capture(self.settings, **kwargs).run()

    @property
    def store(self) -> LandingStore:
        return open_landing(self.settings)

    def records(self, store: LandingStore | None = None) -> list[ChangeRecord]:
        st = store or self.store
        return [r for f in st.files() for r in st.read_records(f.name)]

    def changes(self, table: str | None = None) -> list[ChangeRecord]:
        return [r for r in self.records() if r.op != COMMIT and (table is None or r.table == table)]

    def with_slot(self, slot: str, landing: Path) -> LoaderSettings:
        return self.settings.model_copy(
            update={
                "source": self.settings.source.model_copy(update={"slot": slot}),
                "landing": self.settings.landing.model_copy(update={"url": landing.as_uri()}),
            }
        )


@pytest.fixture
def src(pg_admin: str, tmp_path: Path) -> Iterator[Src]:
    uid = uuid.uuid4().hex[:8]
    db = f"cap_{uid}"
    create_db(pg_admin, db)
    settings = LoaderSettings(
        source={"dsn": f"{TEST_PG}/{db}", "slot": f"cap_{uid}", "max_changes_per_file": 50},
        landing={"url": (tmp_path / "landing").as_uri()},
    )
    conn = psycopg.connect(settings.source.dsn, autocommit=True, options=slots.SESSION_OPTIONS)
    try:
        yield Src(settings, conn, tmp_path)
    finally:
        conn.close()
        with psycopg.connect(pg_admin, autocommit=True) as admin:
            # A consumer a test stopped (pg_recvlogical) leaves its walsender holding the slot for
            # a moment after it exits, and an active slot keeps the database from being dropped.
            for _ in range(100):
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name LIKE %s AND NOT active",
                    (f"%{uid}%",),
                )
                left = admin.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s", (f"%{uid}%",))
                if not left.fetchone()[0]:  # type: ignore[index]
                    break
                time.sleep(0.1)
            admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(db)))


class Crash(Exception):
    """Raised by a test's hook to stop a capture where a kill would."""


def landing_snapshot(path: Path) -> dict[str, bytes]:
    """Every landing file under ``path`` by name: v1 files decompressed, v2 files (Arrow) as they are."""
    import gzip

    from loader.landing.store import LandingFile

    return {
        p.name: gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        for p in sorted(path.iterdir())
        if LandingFile.parse(p.name) is not None
    }


def crash_after_each_file(settings: LoaderSettings, files: int, after_crash: Callable[[], None] | None = None) -> int:
    """Run capture again and again, each run stopped right after its k-th published file (before
    the slot moves), k = 1, 2, ... until a run finishes; returns how many runs were stopped."""
    crashes = 0
    for k in range(1, files + 1):
        count = 0

        def boom(_name: str, k: int = k) -> None:
            nonlocal count
            count += 1
            if count == k:
                raise Crash()

        try:
            Capture(settings, on_published=boom).run()
        except Crash:
            crashes += 1
            if after_crash is not None:
                after_crash()
        else:
            break
    return crashes


def cli(settings: LoaderSettings, tmp: Path, *args: str, **extra: str) -> Any:
    """``loader <args>`` in-process with ``settings`` as a scheduler would pass them (a SQLite catalog
    under ``tmp``: capture tests start no Spark), ``extra`` variables on top."""
    import json

    from click.testing import CliRunner

    from loader.cli import main
    from tests.harness import settings_env

    env = settings_env(settings)
    env["LOADER_CATALOG__URI"] = f"sqlite:///{tmp}/catalog.db"
    env["LOADER_CATALOG__WAREHOUSE"] = (tmp / "warehouse").as_uri()
    s = settings.source
    env.update(
        {
            "LOADER_SOURCE__PLUGIN": s.plugin,
            "LOADER_SOURCE__PUBLICATION": s.publication,
            "LOADER_SOURCE__INCLUDE": json.dumps(s.include),
            "LOADER_SOURCE__EXCLUDE": json.dumps(s.exclude),
            "LOADER_SOURCE__HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
        }
    )
    env.update(extra)
    return CliRunner().invoke(main, list(args), env=env)
