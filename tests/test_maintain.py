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
