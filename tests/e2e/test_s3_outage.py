"""S3 stops answering in the middle of a capture and of a load: a clear failure, nothing marked done,
and the re-run completes with nothing lost or doubled (the landing area is on moto's S3 server,
reached over HTTP through a proxy that cuts requests off)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from loader.errors import LandingUnavailableError, WarehouseUnavailableError
from loader.landing.store import open_landing
from loader.spark import configure_running_session
from loader.workload import BankWorkload
from tests.harness import Env, s3_bucket
from tests.oracle import assert_history_matches, assert_no_duplicate_positions
from tests.s3proxy import FlakyProxy

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


@pytest.fixture
def s3_env(env: Env, s3_server: str) -> Iterator[tuple[Env, FlakyProxy]]:

    u = urlparse(s3_server)
    proxy = FlakyProxy(u.hostname or "127.0.0.1", int(u.port or 80))
    _, bucket = s3_bucket(s3_server, "outage")
    env.configure("landing", url=f"s3://{bucket}/cdc", retry_attempts=3, retry_max_wait_s=0.2)
    env.configure("s3", endpoint_url=proxy.endpoint, access_key_id="testing", secret_access_key="testing")
    env.configure("source", max_changes_per_file=60)
    try:
        yield env, proxy
    finally:
        proxy.close()


def test_s3_outage_during_capture_then_rerun(s3_env: tuple[Env, FlakyProxy]) -> None:
    env, proxy = s3_env
    wl = BankWorkload(env.settings.source.dsn, seed=31)
    wl.create_schema()
    env.capture()
    wl.run(80)
    published: list[str] = []

    def cut_after_two(name: str) -> None:
        published.append(name)
        if len(published) == 2:
            proxy.fail_after(0)

    with pytest.raises(LandingUnavailableError) as err:
        env.capture(on_published=cut_after_two)
    assert "failed after 3 attempts" in str(err.value) and "re-run" in err.value.hint
    proxy.up()
    cap = env.capture()
    assert cap.changes > 0
    env.load()
    env.merge()
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def test_s3_outage_during_load_marks_nothing_loaded(s3_env: tuple[Env, FlakyProxy]) -> None:
    env, proxy = s3_env
    wl = BankWorkload(env.settings.source.dsn, seed=32)
    wl.create_schema()
    env.capture()
    wl.run(120)
    env.capture()
    files = open_landing(env.settings).files()
    assert len(files) >= 6
    ledger_before = env.spark.table(env.names.ledger).count() if env.spark.catalog.tableExists(env.names.ledger) else 0
    proxy.fail_after(len(files) // 2)  # part of the files read, then S3 stops answering
    with pytest.raises(LandingUnavailableError) as err:
        env.load()
    assert "nothing was marked loaded" in err.value.hint
    assert proxy.refused > 0
    assert env.spark.table(env.names.ledger).count() == ledger_before
    assert env.spark.table(env.names.rejects).count() == 0, "an outage is not bad data"
    proxy.up()
    load = env.load()
    assert len(load.files) == len(files) and load.rejects == 0
    env.merge()
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def test_warehouse_outage_during_a_driver_load_marks_nothing_loaded(env: Env, s3_server: str) -> None:
    """The warehouse (history, ledger, rejects) on S3 stops answering at several points of loads the
    driver does with pyiceberg: each fails as the transient WarehouseUnavailableError, never as bad
    data or a half-marked batch; once it answers, the load completes with nothing lost or doubled.
    Every batch also holds a value that does not fit (a 2-d array): its reject, written before the
    history commit, is written once however the outage cut the load, and its table parks."""
    if not env.settings.spark.extra_jars:
        pytest.skip("no S3A jars: run 'make s3a-jars' (or set LOADER_SPARK__EXTRA_JARS) before the test session")
    u = urlparse(s3_server)
    proxy = FlakyProxy(u.hostname or "127.0.0.1", int(u.port or 80))
    try:
        _, bucket = s3_bucket(s3_server, "whout")
        env.settings = env.settings.model_copy(
            update={"catalog": env.settings.catalog.model_copy(update={"name": f"whout_{env.uid}"})}
        )
        env.configure("catalog", warehouse=f"s3://{bucket}/wh")
        env.configure("s3", endpoint_url=proxy.endpoint, access_key_id="testing", secret_access_key="testing")
        env.configure("source", max_changes_per_file=60)
        configure_running_session(env.spark, env.settings)
        wl = BankWorkload(env.settings.source.dsn, seed=41)
        wl.create_schema()
        env.sql("CREATE TABLE public.arr (id int PRIMARY KEY, a integer[])")
        env.capture()
        wl.run(40)
        env.sql("INSERT INTO public.arr VALUES (0, '{0}')")
        env.run_all()  # the tables exist: later loads need no DDL
        failures = 0
        # Requests each load gets before the outage: seen to cut the file listing, the batch's
        # preparation, the rejects' append, a history data file's write and the commit.
        for k, budget in enumerate((0, 14, 22, 26, 30, 44), start=1):
            wl.run(25)
            env.sql(f"INSERT INTO public.arr VALUES ({2 * k}, '{{{k}}}'), ({2 * k + 1}, '{{{{1,2}},{{3,{k}}}}}')")
            env.capture()
            proxy.fail_after(budget)
            try:
                res = env.load()
            except WarehouseUnavailableError as exc:
                failures += 1
                assert "re-run 'loader load'" in (exc.hint or ""), exc.hint
                proxy.up()
                reasons = [r["reason"] for r in env.spark.table(env.names.rejects).collect()]
                assert len(reasons) <= k and all("column a (integer[])" in r for r in reasons), reasons
            else:
                assert all(e.startswith("driver") for e in res.engines), res.engines
            proxy.up()
        assert failures >= 2, "the outage never hit a load"
        _, _, merge = env.run_all()
        env.assert_reconciled(list(KEYS))
        assert_no_duplicate_positions(env)
        for table, key in KEYS.items():
            assert_history_matches(env, wl.log, table, key)
        rejects = env.spark.table(env.names.rejects).where("source_table = 'public.arr'").collect()
        seen = [(r["landing_file"], r["line"]) for r in rejects]
        assert len(set(seen)) == len(seen) == 6, [(*key, r["reason"]) for key, r in zip(seen, rejects, strict=True)]
        assert "public.arr" in merge.parked, merge.parked
    finally:
        proxy.up()
        proxy.close()
