"""The landing area on S3 (moto server over HTTP): capture writes objects, load reads them back."""

from __future__ import annotations

from pydantic import SecretStr

from loader.landing.store import LandingFile, S3LandingStore, open_landing
from loader.workload import BankWorkload
from tests.harness import Env, s3_bucket
from tests.oracle import assert_history_matches


def test_s3_landing_end_to_end(env: Env, s3_server: str) -> None:
    s3, bucket = s3_bucket(s3_server, "landing")
    env.settings = env.settings.model_copy(
        update={
            "landing": env.settings.landing.model_copy(update={"url": f"s3://{bucket}/cdc"}),
            "s3": env.settings.s3.model_copy(
                update={
                    "endpoint_url": s3_server,
                    "access_key_id": "testing",
                    "secret_access_key": SecretStr("testing"),
                }
            ),
        }
    )
    store = open_landing(env.settings)
    assert isinstance(store, S3LandingStore)
    wl = BankWorkload(env.settings.source.dsn, seed=21)
    wl.create_schema()
    env.capture()
    wl.run(50)
    cap, load, _ = env.run_all()
    # Capture keeps small state objects under _state/; everything else is a landing file.
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"] if "/_state/" not in o["Key"]]
    assert keys and all(
        k.startswith(f"cdc/{env.settings.source.slot}/") and LandingFile.parse(k.rsplit("/", 1)[-1]) is not None
        for k in keys
    )
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == sorted(cap.files) == sorted(load.files)
    env.assert_reconciled()
    for table, key in {"public.accounts": ["account_id"], "public.transactions": ["transaction_id"]}.items():
        assert_history_matches(env, wl.log, table, key)
    # A second capture with nothing new writes nothing.
    assert env.capture().files == []
