"""A real Spark standalone cluster: a master and a worker started from pyspark's own scripts on
127.0.0.1, and ``load`` and ``merge`` of an initial snapshot and a workload submitted with
``spark-submit --master spark://...`` (the driver and the executors in JVMs of their own; executors
decode landing files, v1 and v2, in their Python workers). Ends with the source oracle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loader.sqlserver import spark_home
from loader.workload import BankWorkload
from tests.harness import ROOT, Env, cli_env
from tests.oracle import assert_history_matches

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready within {timeout}s")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, int]]:
    home = spark_home()
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = dict(
        os.environ, SPARK_HOME=str(home), SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_WORKER_DIR=str(tmp_path / "work")
    )
    spark_class = str(home / "bin" / "spark-class")
    logs = open(tmp_path / "cluster.log", "wb")  # noqa: SIM115 - closed below
    master = subprocess.Popen(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=env,
        stdout=logs,
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1), 120, "the master")
        worker = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1200m",
                "--webui-port",
                str(worker_ui),
                f"spark://127.0.0.1:{port}",
            ],
            env=env,
            stdout=logs,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: master_state(ui)["aliveworkers"] == 1, 120, "the worker")
        yield f"spark://127.0.0.1:{port}", ui
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        logs.close()


def master_state(ui: int) -> dict:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5).read())


def submit(env: Env, master: str, command: str, properties: Path) -> subprocess.CompletedProcess[str]:
    # The driver's own load and merge engines off: the executors decode and type every landing
    # file (v1 and v2) and the MERGE joins run on them.
    child = cli_env(
        env,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        LOADER_LOAD__DRIVER_MAX_BYTES="0",
        LOADER_MERGE__DRIVER_MAX_ROWS="0",
    )
    return subprocess.run(
        [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            master,
            "--deploy-mode",
            "client",
            "--properties-file",
            str(properties),
            "--driver-memory",
            "1g",
            "--executor-memory",
            "1g",
            "--total-executor-cores",
            "1",
            str(ROOT / "infra" / "spark_job.py"),
            command,
        ],
        env=child,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_load_and_merge_on_a_standalone_cluster(env: Env, cluster: tuple[str, int], tmp_path: Path) -> None:
    master, ui = cluster
    wl = BankWorkload(env.settings.source.dsn, seed=51)
    wl.create_schema()
    # Rows that exist before the first capture: an initial snapshot (landing v2 Arrow files) that the
    # executors decode and the merge builds a first current state from, on the cluster.
    env.sql("CREATE TABLE public.preloaded (id int PRIMARY KEY, v text, at timestamptz DEFAULT now())")
    env.sql("INSERT INTO public.preloaded (id, v) SELECT g, 'v' || g FROM generate_series(1, 3000) g")
    from loader.capture.capture import snapshot

    snap = snapshot(env.settings).run()
    assert snap.slot_created and snap.rows == 3000, snap.summary()
    env.sql("UPDATE public.preloaded SET v = 'changed' WHERE id % 100 = 0")
    env.sql("DELETE FROM public.preloaded WHERE id > 2990")
    wl.run(80)
    env.capture()
    # The settings spark-submit needs, secrets included, in a file only its owner can read.
    from loader.spark import spark_conf, write_properties_file

    properties = tmp_path / "loader.properties"
    write_properties_file(spark_conf(env.settings), properties)
    for command in ("load", "merge"):
        done = submit(env, master, command, properties)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        assert ("load:" if command == "load" else "merge:") in done.stdout
        assert command != "load" or "engine: spark" in done.stdout, done.stdout[-3000:]
    apps = master_state(ui)["completedapps"]
    assert len(apps) == 2 and all(a["cores"] >= 1 for a in apps), "both ran on the cluster"
    executors = list((tmp_path / "work").rglob("stderr"))
    assert executors, "executors ran in JVMs of the worker"
    env.assert_reconciled()
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)
