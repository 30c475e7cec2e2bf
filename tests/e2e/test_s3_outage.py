"""S3 stops answering in the middle of a capture and of a load: a clear failure, nothing marked done,
and the re-run completes with nothing lost or doubled (the landing area is on moto's S3 server,
reached over HTTP through a proxy that cuts requests off)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
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


@contextmanager
def warehouse_behind_proxy(env: Env, s3_server: str, name: str) -> Iterator[tuple[FlakyProxy, str]]:
    """The env's warehouse on moto's S3 behind a proxy that can cut requests off (a catalog of its
    own): (the proxy, the bucket). The caller applies its settings to the session
    (``configure_running_session``) once it has set the rest."""
    if not env.settings.spark.extra_jars:
        pytest.skip("no S3A jars: run 'make s3a-jars' (or set LOADER_SPARK__EXTRA_JARS) before the test session")
    u = urlparse(s3_server)
    proxy = FlakyProxy(u.hostname or "127.0.0.1", int(u.port or 80))
    try:
        _, bucket = s3_bucket(s3_server, name)
        env.settings = env.settings.model_copy(
            update={"catalog": env.settings.catalog.model_copy(update={"name": f"{name}_{env.uid}"})}
        )
        env.configure("catalog", warehouse=f"s3://{bucket}/wh")
        env.configure("s3", endpoint_url=proxy.endpoint, access_key_id="testing", secret_access_key="testing")
        yield proxy, bucket
    finally:
        proxy.up()
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
    with warehouse_behind_proxy(env, s3_server, "whout") as (proxy, _):
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


@pytest.mark.skipif(not os.environ.get("LOADER_SOAK"), reason="minutes of Iceberg's own retries: run with make soak")
def test_warehouse_outage_inside_spark_is_a_bounded_transient_outage(env: Env, s3_server: str) -> None:
    """The warehouse on S3 stops answering while Spark loads batches (``load.driver_max_bytes = 0``)
    and while follow mode's snapshot expiry runs Iceberg's procedure: each fails within a bounded
    time and is named a warehouse outage, which commands retry and report as transient (exit 75)
    and follow mode rides through; nothing is marked loaded, and once S3 answers the load completes
    exactly once. Measured: S3A's default retries held an expiry for over 20 minutes; with
    ``s3.jvm_*`` it failed after 237 s (3 attempts), a Spark-path load after 345 s (1 attempt;
    Iceberg's own commit and metadata retries, which no setting bounds, take most of it). The
    classification alone is in make test (``test_an_s3a_exception_chain_is_a_warehouse_outage``)."""
    import time

    from loader.config import LoadSettings
    from loader.errors import TransientError
    from loader.maintain import Maintenance
    from loader.retry import outage, outage_server, unavailable

    with warehouse_behind_proxy(env, s3_server, "sparkout") as (proxy, bucket):
        env.settings = env.settings.model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
        env.configure("s3", jvm_request_attempts=1, jvm_connect_timeout_s=2.0, jvm_read_timeout_s=10.0)
        configure_running_session(env.spark, env.settings)
        wl = BankWorkload(env.settings.source.dsn, seed=43)
        wl.create_schema()
        env.capture()
        wl.run(30)
        env.run_all()  # the tables exist
        # Requests a whole load makes, measured on one: the outages below begin part-way through.
        wl.run(30)
        env.capture()
        before = proxy.requests
        env.load()
        per_load = proxy.requests - before
        java_side = 0
        for share in (0.5, 0.7, 0.85, 0.95):
            wl.run(30)
            env.capture()
            ledger_before = env.spark.table(env.names.ledger).count()
            proxy.fail_after(int(per_load * share))
            started = time.monotonic()
            try:
                env.load()
                continue
            except WarehouseUnavailableError:  # pyiceberg's reads on the driver: named so already
                pass
            except Exception as exc:
                took = time.monotonic() - started
                assert outage(exc) is not None, exc
                assert outage_server(exc, env.settings)[0] == "warehouse", exc
                final = unavailable(exc, env.settings, 1, took)
                assert isinstance(final, TransientError) and f"the warehouse s3://{bucket}/wh is unavailable" in str(
                    final
                )
                assert took < 600, f"the outage took {took:.0f} s to surface"
                java_side += 1
            finally:
                proxy.up()
            assert env.spark.table(env.names.ledger).count() == ledger_before, "nothing is marked loaded"
        assert java_side, f"no outage hit Spark's side of a load ({per_load} requests a load)"
        proxy.fail_after(0)
        with pytest.raises(Exception) as err:
            Maintenance(env.spark, env.settings).expire(["public.accounts"], ledger=True)
        assert outage_server(err.value, env.settings)[0] == "warehouse", err.value
        proxy.up()
        env.run_all()
        env.assert_reconciled(list(KEYS))
        assert_no_duplicate_positions(env)
        for table, key in KEYS.items():
            assert_history_matches(env, wl.log, table, key)


def test_an_s3a_exception_chain_is_a_warehouse_outage(spark: Any) -> None:
    """What Spark raises when S3 stops answering (seen in the soak test above: Iceberg's
    RuntimeIOException <- S3A's AWSClientIOException <- the SDK's SdkClientException <- a socket
    reset), built from the JVM's own classes: an outage of the warehouse, reported as the transient
    WarehouseUnavailableError naming it; S3A's server-side failures after its retries (HTTP 5xx,
    throttling) are outages too; a missing object is not."""
    from py4j.protocol import Py4JJavaError

    from loader.config import LoaderSettings
    from loader.retry import outage, outage_server, unavailable

    if not s3a_on(spark):
        pytest.skip("no S3A jars: run 'make s3a-jars' (or set LOADER_SPARK__EXTRA_JARS) before the test session")
    jvm = spark.sparkContext._jvm
    settings = LoaderSettings().model_copy(
        update={"catalog": LoaderSettings().catalog.model_copy(update={"warehouse": "s3://lake/wh"})}
    )

    def raised(jexc: Any) -> Py4JJavaError:
        return Py4JJavaError("An error occurred while calling o46.sql.", jexc)

    reset = jvm.java.net.SocketException("Connection reset")
    sdk = jvm.com.amazonaws.SdkClientException("Unable to execute HTTP request: Connection reset", reset)
    s3a = jvm.org.apache.hadoop.fs.s3a.AWSClientIOException("getFileStatus on s3a://lake/wh/t/metadata/1.json", sdk)
    top = jvm.org.apache.iceberg.exceptions.RuntimeIOException(s3a)
    err = raised(top)
    assert outage(err) is not None
    assert outage_server(err, settings) == ("warehouse", "s3://lake/wh")
    final = unavailable(err, settings, 3, 12.0)
    assert isinstance(final, WarehouseUnavailableError) and "the warehouse s3://lake/wh is unavailable" in str(final)
    assert "LOADER_S3__ENDPOINT_URL" in (final.hint or "")

    amazon = jvm.com.amazonaws.services.s3.model.AmazonS3Exception("We encountered an internal error")
    failing = jvm.org.apache.hadoop.fs.s3a.AWSStatus500Exception("PUT s3a://lake/wh/t/data/f.parquet", amazon)
    assert outage(raised(failing)) is not None
    assert outage_server(raised(failing), settings)[0] == "warehouse"
    missing = jvm.java.io.FileNotFoundException("No such file or directory: s3a://lake/wh/t/metadata/1.json")
    assert outage(raised(missing)) is None


def s3a_on(spark: Any) -> bool:
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(
            "org.apache.hadoop.fs.s3a.S3AFileSystem",
            False,
            spark.sparkContext._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader(),
        )
        return True
    except Exception:
        return False


def test_s3a_retries_and_timeouts_come_from_the_settings_and_spark_conf_overrides_them() -> None:
    from loader.config import LoaderSettings
    from loader.spark import hadoop_s3a_conf

    base = LoaderSettings()
    settings = base.model_copy(
        update={
            "catalog": base.catalog.model_copy(update={"warehouse": "s3://lake/wh"}),
            "s3": base.s3.model_copy(update={"jvm_request_attempts": 2, "jvm_read_timeout_s": 30.0}),
        }
    )
    conf = hadoop_s3a_conf(settings)
    assert (conf["fs.s3a.attempts.maximum"], conf["fs.s3a.retry.limit"]) == ("1", "2")
    assert (conf["fs.s3a.connection.timeout"], conf["fs.s3a.connection.establish.timeout"]) == ("30000", "5000")
    override = settings.model_copy(
        update={"spark": settings.spark.model_copy(update={"conf": {"spark.hadoop.fs.s3a.retry.limit": "9"}})}
    )
    assert hadoop_s3a_conf(override)["fs.s3a.retry.limit"] == "9"
