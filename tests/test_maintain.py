"""Landing retention in 'loader maintain': loaded files older than landing.retention_hours are
retired, nothing unloaded is, replay refuses what is gone, and the summary stays one short line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loader.backfill import Backfill
from loader.errors import UsageError
from loader.landing.state import RETENTION_STATE
from loader.landing.store import open_landing
from loader.maintain import Maintenance
from tests.harness import Env


def test_loaded_landing_files_past_retention_are_retired(env: Env) -> None:
    env.sql("CREATE TABLE public.r (id int PRIMARY KEY, v text)")
    env.capture()
    for i in range(3):
        env.transaction(f"INSERT INTO public.r VALUES ({i}, 'v')")
        env.capture()
    env.load()
    env.merge()
    env.transaction("INSERT INTO public.r VALUES (10, 'not loaded yet')")
    env.capture()
    store = open_landing(env.settings)
    before = store.files()
    assert len(before) >= 4

    kept = Maintenance(env.spark, env.settings).run(expire=False, orphans=False)  # nothing is old enough
    assert kept.landing_retired == 0 and store.files() == before

    later = Maintenance(env.spark, env.settings, now=datetime.now(UTC) + timedelta(hours=200))
    report = later.run(expire=False, orphans=False)
    left = store.files()
    assert report.landing_retired == len(before) - 1 and len(left) == 1, (report, left)
    assert left[0] == before[-1]  # the file not loaded yet stays
    assert len(report.summary()) < 300 and "landing files retired" in report.summary()
    horizon = store.read_state(RETENTION_STATE)
    assert horizon is not None and horizon["retired_through"] == before[-2].last.token()

    with pytest.raises(UsageError, match="retired"):
        Backfill(env.spark, env.settings).replay(before[0].first.commit_lsn, before[-1].last.commit_lsn)
    env.run_all()
    env.assert_reconciled()


def test_snapshots_beyond_max_snapshots_are_expired_but_never_young_ones(env: Env) -> None:
    """A table follow mode commits every cycle gathers about 1,800 snapshots an hour, each listed in
    every later metadata file: ``maintenance.max_snapshots`` caps them whatever their age, except
    those younger than ``snapshot_min_age_minutes``."""
    from loader.lake.tables import SourceTable, TableNames

    env.sql("CREATE TABLE public.s (id int PRIMARY KEY, v text)")
    env.capture()
    for i in range(8):  # a history commit each
        env.transaction(f"INSERT INTO public.s VALUES ({i}, 'v')")
        env.capture()
        env.load()
    env.merge()
    history = TableNames(env.settings).history(SourceTable("public", "s"))

    def snapshots() -> int:
        return int(env.spark.sql(f"SELECT count(*) FROM {history}.snapshots").collect()[0][0])

    assert snapshots() >= 8
    env.configure("maintenance", snapshot_retention_hours=24, retain_last=1, max_snapshots=3)
    young = Maintenance(env.spark, env.settings).run(tables=["public.s"], orphans=False)  # all younger than 30 min
    assert not any(t.expired_snapshots for t in young.tables), young
    assert snapshots() >= 8
    # Follow mode's expiry between maintenance runs asks no Spark job of a table none of whose
    # snapshots is old enough (it stalled a cycle for a second or more a table).
    spark = _Recording(env.spark)
    asked = Maintenance(spark, env.settings).expire(["public.s"], ledger=True)  # type: ignore[arg-type]
    assert not any(t.expired_snapshots for t in asked.tables) and len(asked.tables) == 3, asked
    assert not [q for q in spark.queries if "expire_snapshots" in q or ".snapshots" in q], spark.queries
    env.configure("maintenance", snapshot_min_age_minutes=0)
    capped = Maintenance(env.spark, env.settings).run(tables=["public.s"], orphans=False)
    assert snapshots() == 3, capped
    assert sum(t.expired_snapshots for t in capped.tables) >= 5
    env.configure("maintenance", max_snapshots=None)
    uncapped = Maintenance(env.spark, env.settings).run(tables=["public.s"], orphans=False)  # 24 h: none so old
    assert not any(t.expired_snapshots for t in uncapped.tables) and snapshots() >= 3, uncapped
    env.transaction("INSERT INTO public.s VALUES (100, 'after')")
    env.run_all()
    env.assert_reconciled()


def test_follow_mode_expires_a_busy_tables_snapshots_between_maintenance_runs(env: Env) -> None:
    """Follow mode commits a changed table (history, current) and the ledger every cycle: after a
    quarter of ``max_snapshots`` commits to a table it expires that table's snapshots, so the cap
    holds between its hourly maintenance runs instead of only at them. The schema's name holds a
    dot: results name tables as ``schema.table``, which must not be split at the wrong dot."""
    from loader.follow import Follower
    from loader.lake.tables import SourceTable, TableNames

    env.sql('CREATE SCHEMA "app.v2"')
    env.sql('CREATE TABLE "app.v2".busy (id int PRIMARY KEY, v text)')
    env.capture()
    env.configure("maintenance", max_snapshots=4, snapshot_min_age_minutes=0, retain_last=1)
    names = TableNames(env.settings)
    busy = SourceTable("app.v2", "busy")
    idents = [names.history(busy), names.current(busy), names.ledger]

    def snapshots(ident: str) -> int:
        return int(env.spark.sql(f"SELECT count(*) FROM {ident}.snapshots").collect()[0][0])

    follower = Follower(env.settings, env.spark)
    for i in range(10):
        env.transaction(f"""INSERT INTO "app.v2".busy VALUES ({i}, 'v')""")
        env.capture()
        assert follower.cycle()
        follower._expire_crowded()  # what the main loop runs after each cycle
        counts = {ident: snapshots(ident) for ident in idents}
        assert all(n <= 4 for n in counts.values()), (i, counts)
    env.transaction("""UPDATE "app.v2".busy SET v = 'w' WHERE id < 5""")
    env.capture()
    assert follower.cycle()
    env.assert_reconciled()
    # No cap: follow mode leaves expiry to maintenance (the count grows with the cycles).
    env.configure("maintenance", max_snapshots=None)
    follower = Follower(env.settings, env.spark)
    before = snapshots(idents[0])
    for i in range(3):
        env.transaction(f"""INSERT INTO "app.v2".busy VALUES ({100 + i}, 'v')""")
        env.capture()
        assert follower.cycle()
        follower._expire_crowded()
    assert snapshots(idents[0]) == before + 3


class _Recording:
    """A Spark session that records the SQL it is asked to run."""

    def __init__(self, spark: object) -> None:
        self._spark = spark
        self.queries: list[str] = []

    def sql(self, query: str, *args: object, **kwargs: object) -> object:
        self.queries.append(query)
        return self._spark.sql(query, *args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._spark, name)
