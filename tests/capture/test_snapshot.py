"""Initial snapshot end to end: consistent under concurrent writes, resumable, handed over to streaming.

Oracle: the current tables equal the source (``env.assert_reconciled``), and every snapshot row
is landed once.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from loader.capture.capture import Capture, snapshot
from loader.landing.records import COMMIT
from loader.landing.store import open_landing
from tests.harness import Env


class Writer(threading.Thread):
    """Keeps changing the source from its own connection: inserts, updates, key changes, deletes."""

    def __init__(self, dsn: str, tables: list[str], seed: int, first_id: int = 1_000_000) -> None:
        super().__init__(daemon=True)
        self.first_id = first_id
        self.dsn = dsn
        self.tables = tables
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None
        self.progress = threading.Condition()

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_id = self.first_id
                while not self.stop.is_set():
                    t = self.rng.choice(self.tables)
                    k = self.rng.randrange(1, 2000)
                    with conn.transaction():
                        op = self.rng.random()
                        if op < 0.45:
                            conn.execute(
                                f"UPDATE {t} SET balance = balance + 1, note = md5(random()::text) WHERE id = %s", (k,)
                            )
                        elif op < 0.7:
                            next_id += 1
                            conn.execute(f"INSERT INTO {t} VALUES (%s, 0, 'new')", (next_id,))
                        elif op < 0.85:
                            conn.execute(f"DELETE FROM {t} WHERE id = %s", (k,))
                        else:
                            next_id += 1
                            conn.execute(f"UPDATE {t} SET id = %s WHERE id = %s", (next_id, k))
                    with self.progress:
                        self.commits += 1
                        self.progress.notify_all()
                    self.stop.wait(0.01)  # a steady OLTP source, not a benchmark
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def wait_for(self, more: int) -> None:
        with self.progress:
            target = self.commits + more
            self.progress.wait_for(lambda: self.commits >= target or self.error is not None, timeout=30)

    def finish(self) -> int:
        self.stop.set()
        self.join(30)
        if self.error:
            raise self.error
        return self.commits


def make_table(env: Env, name: str, rows: int = 2000) -> None:
    env.sql(f"CREATE TABLE {name} (id bigint PRIMARY KEY, balance numeric(20,2) NOT NULL, note text)")
    env.sql(f"INSERT INTO {name} SELECT g, g * 10, md5(g::text) FROM generate_series(1, {rows}) g")


def snapshot_reads(env: Env) -> list[Any]:
    store = open_landing(env.settings)
    return [r for f in store.files() for r in store.read_records(f.name) if r.op == "R"]


def assert_no_duplicate_reads(env: Env) -> None:
    reads = snapshot_reads(env)
    keys = Counter((r.table, next(c.value for c in r.columns if c.name == "id")) for r in reads)
    dup = [k for k, n in keys.items() if n > 1]
    assert not dup, f"snapshot landed {len(dup)} rows twice, e.g. {dup[:3]}"


def test_initial_snapshot_under_concurrent_writes_hands_over_to_streaming(env: Env) -> None:
    make_table(env, "accounts")
    make_table(env, "ledger")
    writer = Writer(env.settings.source.dsn, ["accounts", "ledger"], seed=1)
    writer.start()
    # Every published chunk waits for more concurrent commits: the snapshot truly overlaps writes.
    res = snapshot(env.settings, chunk_rows=300, on_published=lambda _n: writer.wait_for(5)).run()
    assert res.slot_created and res.exact and res.rows > 3900  # the writer was already running
    assert len(res.files) >= 10
    writer.wait_for(20)
    writer.finish()
    assert env.capture().changes > 0
    env.load()
    env.merge()
    env.assert_reconciled()
    assert_no_duplicate_reads(env)
    hist = env.history("public.accounts")
    landed_reads = sum(1 for r in snapshot_reads(env) if r.table == "accounts")
    assert hist.where("pg_operation = 'read'").count() == landed_reads
    # Every read sorts before every streamed change.
    agg = hist.selectExpr(
        "max(IF(pg_operation = 'read', pg_lsn, NULL)) AS last_read",
        "min(IF(pg_operation NOT IN ('read', 'resync'), pg_lsn, NULL)) AS first_change",
    ).collect()[0]
    assert agg.last_read < agg.first_change


def test_table_added_later_is_snapshotted_consistently_while_streaming(env: Env) -> None:
    make_table(env, "accounts")
    make_table(env, "late")
    only_accounts = env.settings.model_copy(
        update={"source": env.settings.source.model_copy(update={"include": ["public.accounts"]})}
    )
    writer = Writer(env.settings.source.dsn, ["accounts", "late"], seed=2)
    writer.start()
    snapshot(only_accounts, chunk_rows=500).run()
    writer.wait_for(30)
    writer.finish()
    Capture(only_accounts).run()
    env.load()
    env.merge()
    writer = Writer(env.settings.source.dsn, ["accounts", "late"], seed=4, first_id=2_000_000)
    writer.start()
    writer.wait_for(30)  # changes to both tables wait in the slot when "late" gets included
    # Now include "late": the snapshot first lands what the slot holds, then reads at a new consistent point.
    res = snapshot(
        env.settings, tables=["public.late"], chunk_rows=400, on_published=lambda _n: writer.wait_for(3)
    ).run()
    assert not res.slot_created and res.exact and res.rows > 0
    writer.wait_for(30)
    writer.finish()
    env.capture()
    env.load()
    env.merge()
    env.assert_reconciled()
    assert_no_duplicate_reads(env)


class Crash(Exception):
    pass


def test_snapshot_killed_mid_way_resumes_without_duplicates(env: Env) -> None:
    make_table(env, "accounts")
    env.sql("CREATE TABLE events (id bigint, balance numeric(20,2), note text)")  # no key: restarts whole
    env.sql("INSERT INTO events SELECT g, g, 'e' FROM generate_series(1, 700) g")
    writer = Writer(env.settings.source.dsn, ["accounts"], seed=3)
    writer.start()
    published: list[str] = []

    def crash_on(n: int) -> Any:
        def hook(name: str) -> None:
            published.append(name)
            writer.wait_for(3)
            if len(published) == n:
                raise Crash()

        return hook

    with pytest.raises(Crash):
        snapshot(env.settings, chunk_rows=250, on_published=crash_on(3)).run()
    store = open_landing(env.settings)

    def crash_in_events(name: str) -> None:
        writer.wait_for(3)
        if next(iter(store.read_records(name))).table == "events":
            raise Crash()

    # A capture run first finishes the interrupted snapshot (streaming before it would land changes
    # ahead of the rest of it); it crashes again, inside the keyless table.
    with pytest.raises(Crash):
        Capture(env.settings, on_published=crash_in_events).run()
    assert not store.read_state("snapshot.state.json")["done"]  # type: ignore[index]
    writer.wait_for(20)
    writer.finish()
    env.capture()
    # The keyed table resumed after its last key from a newer snapshot (it converges by key); the
    # keyless one was read again, after that, at a consistent point of its own (a temporary slot's).
    state = store.read_state("snapshot.state.json")
    assert state is not None and state["done"] and state["exact"] and state["tables"] == ["public.events"], state
    env.load()
    env.merge()
    env.assert_reconciled()
    assert_no_duplicate_reads(env)
    ev = [r for f in store.files() for r in store.read_records(f.name) if r.table == "events" and r.op != "S"]
    assert sorted(int(r.columns[0].value or 0) for r in ev) == list(range(1, 701))
    markers = [r for f in store.files() for r in store.read_records(f.name) if r.op == "S"]
    assert sorted(r.table for r in markers) == ["accounts", "events"], (
        "one resync marker per table, also after the crash"
    )
    commits = [r for f in store.files() for r in store.read_records(f.name) if r.op == COMMIT and r.xid == 0]
    assert len(commits) == 2, "the snapshot and the keyless table's own, each one unit with one commit marker"


def test_table_empty_at_snapshot_gets_its_current_table(env: Env) -> None:
    # An empty table's snapshot lands only its resync marker: no row names a column. History must
    # still get the table's columns, and the merge its current table, before any row arrives.
    env.sql("CREATE TABLE public.empty (id int PRIMARY KEY, v text, n numeric(10,2))")
    env.sql("CREATE TABLE public.full (id int PRIMARY KEY)")
    env.sql("INSERT INTO public.full VALUES (1)")
    snapshot(env.settings).run()
    env.load()
    env.merge()
    env.assert_reconciled()
    assert [f.name for f in env.current("public.empty").schema.fields][:3] == ["id", "v", "n"]
    env.sql("INSERT INTO public.empty VALUES (1, 'a', 1.5)")
    env.run_all()
    env.assert_reconciled()
