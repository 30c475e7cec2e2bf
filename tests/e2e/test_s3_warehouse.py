"""History and current tables with the warehouse on S3 (moto server over HTTP, Spark through S3A)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from loader.spark import configure_running_session
from tests.harness import Env, s3_bucket

pytestmark = pytest.mark.s3


def test_history_and_current_on_s3_warehouse(env: Env, s3_server: str) -> None:
    if not env.settings.spark.extra_jars:
        pytest.skip("no S3A jars: run 'make s3a-jars' (or set LOADER_SPARK__EXTRA_JARS) before the test session")
    s3, bucket = s3_bucket(s3_server, "wh")
    env.settings = env.settings.model_copy(
        update={
            "catalog": env.settings.catalog.model_copy(
                update={"name": f"s3lake_{env.uid}", "warehouse": f"s3://{bucket}/wh"}
            ),
            "s3": env.settings.s3.model_copy(
                update={
                    "endpoint_url": s3_server,
                    "access_key_id": "testing",
                    "secret_access_key": SecretStr("testing"),
                }
            ),
        }
    )
    configure_running_session(env.spark, env.settings)
    env.sql("CREATE TABLE public.acct (id int PRIMARY KEY, balance numeric(12,2), note text, opened timestamptz)")
    env.capture()
    env.sql("INSERT INTO public.acct SELECT g, g * 1.5, 'n' || g, now() FROM generate_series(1, 30) g")
    env.run_all()
    env.transaction(
        "UPDATE public.acct SET balance = balance + 1 WHERE id <= 10",
        "DELETE FROM public.acct WHERE id = 30",
        "UPDATE public.acct SET id = 100 WHERE id = 29",
    )
    _, load, _ = env.run_all()
    assert load.rejects == 0
    env.assert_reconciled()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, MaxKeys=1000).get("Contents", [])]
    history_ns, current_ns = env.settings.catalog.history_namespace, env.settings.catalog.current_namespace
    assert any(k.startswith(f"wh/{history_ns}/public__acct/data/") and k.endswith(".parquet") for k in keys)
    assert any(k.startswith(f"wh/{current_ns}/public__acct/data/") for k in keys)
    assert any(k.startswith(f"wh/{current_ns}/public__acct/metadata/") for k in keys)
    assert env.history("public.acct").count() == 30 + 10 + 1 + 1
