"""Shared fixtures: one Spark session per test session, a private PostgreSQL, a moto S3 server.

Each test gets its own source database, replication slot, landing directory and catalog
namespaces (``env`` fixture), so tests never see each other's tables while sharing one JVM.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loader.config import LoaderSettings
from tests.harness import ROOT, TEST_PG, Env, create_db


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if {"env", "spark", "s3_server", "pg_admin"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pg_admin() -> str:
    """DSN of the test server's maintenance database; skips nothing, fails loudly if absent."""
    dsn = f"{TEST_PG}/postgres"
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            level = conn.execute("SHOW wal_level").fetchone()
    except psycopg.OperationalError as exc:
        pytest.exit(f"PostgreSQL test server not reachable at {TEST_PG} ({exc}); run the suite with 'make test'", 2)
    assert level and level[0] == "logical", "the test server needs wal_level=logical"
    return dsn


def s3a_jars() -> list[str]:
    """S3A jars for the one Spark session (jars cannot be added later): LOADER_SPARK__EXTRA_JARS,
    else what 'make s3a-jars' put in .state/jars. Without them the S3 warehouse test skips."""
    configured = os.environ.get("LOADER_SPARK__EXTRA_JARS")
    if configured:
        return [p.strip() for p in configured.strip("[]").replace('"', "").split(",") if p.strip()]
    jars = ROOT / ".state" / "jars"
    return sorted(str(p) for p in jars.glob("*.jar")) if jars.is_dir() else []


@pytest.fixture(scope="session")
def base_settings(pg_admin: str, tmp_path_factory: pytest.TempPathFactory) -> LoaderSettings:
    catalog_db = f"iceberg_test_{os.getpid()}"
    create_db(pg_admin, catalog_db)
    root = tmp_path_factory.mktemp("lake")
    return LoaderSettings(
        source={"dsn": f"{TEST_PG}/postgres", "slot": "unused", "max_changes_per_file": 500},
        landing={"url": (root / "landing").as_uri()},
        catalog={"name": "lakehouse", "uri": f"{TEST_PG}/{catalog_db}", "warehouse": (root / "warehouse").as_uri()},
        spark={"shuffle_partitions": 2, "driver_memory": "3g", "extra_jars": s3a_jars()},
        merge={"key_buckets": 4},
    )


@pytest.fixture(scope="session")
def spark(base_settings: LoaderSettings) -> Iterator[Any]:
    from loader.spark import get_spark

    session = get_spark(base_settings, "lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture
def env(pg_admin: str, base_settings: LoaderSettings, spark: Any, tmp_path: Path) -> Iterator[Env]:
    """A fresh source database + slot + landing dir + catalog namespaces for one test."""
    uid = uuid.uuid4().hex[:8]
    db = f"src_{uid}"
    create_db(pg_admin, db)
    settings = base_settings.model_copy(
        update={
            "source": base_settings.source.model_copy(update={"dsn": f"{TEST_PG}/{db}", "slot": f"slot_{uid}"}),
            "landing": base_settings.landing.model_copy(update={"url": (tmp_path / "landing").as_uri()}),
            "catalog": base_settings.catalog.model_copy(
                update={
                    "history_namespace": f"h_{uid}",
                    "current_namespace": f"c_{uid}",
                    "loader_namespace": f"l_{uid}",
                }
            ),
        }
    )
    e = Env(settings=settings, spark=spark, uid=uid, tmp=tmp_path)
    try:
        yield e
    finally:
        e.close()
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s AND NOT active",
                (settings.source.slot,),
            )
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(db)))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto in server mode on 127.0.0.1, reached over HTTP like any S3 endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def other_db(pg_admin: str) -> Iterator[str]:
    """Another database of the same cluster, written by someone else."""
    name = f"other_{uuid.uuid4().hex[:8]}"
    create_db(pg_admin, name)
    try:
        yield f"{TEST_PG}/{name}"
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
            )
