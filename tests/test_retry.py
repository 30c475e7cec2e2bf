"""Outages of the source or the catalog database, through the ``loader`` command: retried with
backoff, then exit 75 naming the (redacted) server; a server back mid-retry lets the run finish."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from loader.cli import main
from loader.verify import reconcile
from tests.harness import Cluster, cluster_env, cluster_settings, create_db


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


def test_a_stopped_source_exits_75_after_retries(cluster: Cluster, tmp_path: Path) -> None:
    create_db(cluster.dsn(), "app")
    cluster.stop()
    env = {
        "LOADER_HOME": str(tmp_path),
        "LOADER_SOURCE__DSN": cluster.dsn("app", password="s3cret-pw"),
        "LOADER_RETRY__ATTEMPTS": "3",
        "LOADER_RETRY__MAX_WAIT_S": "0.5",
    }
    started = time.monotonic()
    res = CliRunner().invoke(main, ["run"], env=env)
    assert res.exit_code == 75, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    where = f"postgresql://postgres:***@127.0.0.1:{cluster.port}/app"
    assert f"the source database {where} is unavailable" in errors[0], errors[0]
    assert "Connection refused" in errors[0] and "after 3 attempts" in errors[0] and "re-run" in errors[0]
    assert res.output.count("retrying") == 2, res.output  # two retries, each logged
    assert "s3cret-pw" not in res.output and "Traceback" not in res.output
    assert time.monotonic() - started < 30


def test_a_source_back_mid_retry_lets_the_run_finish(cluster: Cluster, tmp_path: Path) -> None:
    settings = cluster_settings(cluster, tmp_path)
    with psycopg.connect(settings.source.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env = cluster_env(settings, tmp_path, LOADER_RETRY__ATTEMPTS="30", LOADER_RETRY__MAX_WAIT_S="1")
    assert CliRunner().invoke(main, ["capture"], env=env).exit_code == 0  # the slot
    with psycopg.connect(settings.source.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    cluster.stop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loader.cli", "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        seen = []
        while "retrying" not in "".join(seen):
            line = proc.stderr.readline()
            assert line, f"exited before retrying: {''.join(seen)}"
            seen.append(line)
        cluster.start()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(seen) + err
    assert "the source database" in seen[-1] and "attempt 1 of 30" in seen[-1], seen
    results = reconcile(settings)
    assert [(r.table, r.ok) for r in results] == [("public.t", True)], [r.line() for r in results]
