"""The Spark Thrift Server on the loader's catalog: a HiveServer2 client queries it, dbt builds on it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loader.dbt import invoke_dbt
from loader.sqlserver import jdbc_url, start_server
from loader.workload import BankWorkload
from tests.harness import Env

pytestmark = [pytest.mark.integration, pytest.mark.dbt]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_thrift_server_query_and_dbt_build(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_HOME", str(tmp_path / "state"))  # the server's working dir and log
    workload = BankWorkload(env.settings.source.dsn, seed=5)
    workload.create_schema()
    env.capture()
    workload.run(15)
    env.run_all()
    env.assert_reconciled()
    port = free_port()
    settings = env.settings.model_copy(
        update={
            "sql_server": env.settings.sql_server.model_copy(update={"port": port}),
            "dbt": env.settings.dbt.model_copy(
                update={"analytics_namespace": f"t_{env.uid}", "work_dir": str(tmp_path / "dbt-work")}
            ),
        }
    )
    assert jdbc_url(settings) == f"jdbc:hive2://127.0.0.1:{port}/default"
    server = start_server(settings, background=True)
    try:
        from pyhive import hive

        conn = hive.connect(host="127.0.0.1", port=port, username="loader")
        cur = conn.cursor()
        c = settings.catalog
        cur.execute(f"SELECT count(*), sum(balance) FROM {c.current_namespace}.public__accounts")
        count, total = cur.fetchone()
        expected = env.current("public.accounts").selectExpr("count(*)", "sum(balance)").first()
        assert (count, total) == (expected[0], expected[1])

        # one table's models and audits keep the test short (the session test builds everything)
        select = ["--select", "source:history.public__accounts+", "source:current.public__accounts+"]
        res = invoke_dbt(settings, ["build", "--target", "thrift", *select])
        bad = {r.node.name: str(r.status) for r in res.result.results if str(r.status) not in ("pass", "success")}
        assert res.success, bad
        assert any("reconciliation" in r.node.name for r in res.result.results)
        # the models dbt made through the server are Iceberg views in the same catalog
        cur.execute(f"SELECT count(*) FROM t_{env.uid}.public__accounts")
        assert cur.fetchone()[0] == count
        cur.execute(f"SELECT count(*) FROM t_{env.uid}.public__accounts__from_history")
        assert cur.fetchone()[0] == count
        conn.close()
        # The README's beeline command, as written (SPARK_HOME set first: beeline's launcher would
        # otherwise look for Spark with whatever python3 is on the PATH).
        command = (
            "export SPARK_HOME=$(.venv/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')"
            f' && "$SPARK_HOME/bin/beeline" -u jdbc:hive2://127.0.0.1:{port}/default -n loader'
            f" -e 'SELECT count(*) FROM {c.current_namespace}.public__accounts'"
        )
        out = subprocess.run(
            ["bash", "-c", command.replace(".venv/bin/python", sys.executable)],
            capture_output=True,
            text=True,
            timeout=300,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        assert out.returncode == 0 and f"| {count} " in out.stdout, out.stdout + out.stderr
    finally:
        server.stop()
    assert server.process.poll() is not None
