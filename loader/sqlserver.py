"""``loader sql-server``: the Spark Thrift Server (HiveServer2 protocol: JDBC/ODBC) on the loader's catalog.

The server ships in the pyspark package and is started with its ``spark-submit``. Two traps, both
verified with pyspark 3.5 and Iceberg 1.10: the Iceberg runtime and the catalog's JDBC driver go on the driver's system
classpath (``--driver-class-path``), not ``--jars``, or Hive client sessions cannot load Iceberg's
JDBC catalog classes; and clients run ``USE default`` on connect, so the ``default`` namespace must
exist in the Iceberg catalog, which is the default catalog. Port and bind host are Hive settings
(``--hiveconf``); the server binds 127.0.0.1 unless configured otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loader.config import LoaderSettings, state_dir
from loader.errors import ConfigError, TransientError
from loader.spark import iceberg_runtime_jar, jdbc_driver_jar, spark_conf, write_properties_file

THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class SqlServerError(TransientError):
    """The Spark Thrift Server did not start or stopped."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def jdbc_url(settings: LoaderSettings) -> str:
    s = settings.sql_server
    return f"jdbc:hive2://{s.host}:{s.port}/default"


def server_dir(settings: LoaderSettings) -> Path:
    """Working directory of the server (Hive's local metastore_db and logs stay out of the way)."""
    return state_dir() / "sql-server" / str(settings.sql_server.port)


def server_conf(settings: LoaderSettings) -> dict[str, str]:
    """The Thrift Server's Spark settings (secrets included: they go to a 0600 properties file)."""
    conf = spark_conf(settings)
    conf.pop("spark.jars", None)  # on the system classpath instead (trap 1)
    conf["spark.sql.defaultCatalog"] = settings.catalog.name
    conf["spark.sql.warehouse.dir"] = str(server_dir(settings) / "spark-warehouse")
    return conf


def properties_path(settings: LoaderSettings) -> Path:
    return server_dir(settings) / "spark.properties"


def server_command(settings: LoaderSettings) -> list[str]:
    """The spark-submit command line of the Thrift Server for these settings (pure).

    Its Spark settings, secrets among them, are in a properties file only the owner can read:
    a command line is visible to every user of the machine (``ps``).
    """
    jars = [iceberg_runtime_jar(settings), jdbc_driver_jar(settings), *settings.spark.extra_jars]
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        settings.spark.master,
        "--driver-memory",
        settings.sql_server.driver_memory,
        "--driver-class-path",
        os.pathsep.join(j for j in jars if not j.startswith(("http:", "https:"))),
        "--properties-file",
        str(properties_path(settings)),
        "--class",
        THRIFT_SERVER_CLASS,
        "--name",
        "lakehouse-sql-server",
    ]
    s = settings.sql_server
    cmd += [
        "spark-internal",
        "--hiveconf",
        f"hive.server2.thrift.port={s.port}",
        "--hiveconf",
        f"hive.server2.thrift.bind.host={s.host}",
    ]
    return cmd


def ensure_default_namespace(settings: LoaderSettings) -> None:
    """Clients run ``USE default`` on connect; it must resolve in the Iceberg catalog (trap 2)."""
    from loader.catalog import open_catalog

    open_catalog(settings).create_namespace_if_not_exists("default")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class SqlServer:
    """A running Thrift Server process."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path | None

    def wait_ready(self, host: str, port: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SqlServerError(
                    f"the Spark Thrift Server exited with status {self.process.returncode} before listening on {host}:{port}",
                    hint=f"see {self.log_path}" if self.log_path else "see its output above",
                )
            if port_open(host, port):
                return
            time.sleep(1)
        self.stop()
        raise SqlServerError(
            f"the Spark Thrift Server did not listen on {host}:{port} within {timeout:.0f}s",
            hint=f"see {self.log_path}" if self.log_path else "see its output above",
        )

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(
    settings: LoaderSettings,
    background: bool = True,
    wait: bool = True,
    timeout: float = 240.0,
    echo: Callable[[str], None] = print,
) -> SqlServer:
    """Start the Thrift Server; with ``background`` its output goes to a log file under the state dir."""
    s = settings.sql_server
    if port_open(s.host, s.port):
        raise ConfigError(
            f"{s.host}:{s.port} is already in use",
            hint="stop the other server or set LOADER_SQL_SERVER__PORT",
        )
    ensure_default_namespace(settings)
    write_properties_file(server_conf(settings), properties_path(settings))
    workdir = server_dir(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SPARK_HOME=str(spark_home()))
    log_path = None
    if background:
        log_path = workdir / "server.log"
        out = open(log_path, "wb")  # noqa: SIM115 - the server's stdout for its whole life
        proc = subprocess.Popen(
            server_command(settings),
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        (workdir / "server.pid").write_text(str(proc.pid))
    else:
        proc = subprocess.Popen(server_command(settings), cwd=workdir, env=env, stdin=subprocess.DEVNULL)
    server = SqlServer(proc, jdbc_url(settings), log_path)
    echo(f"starting the Spark Thrift Server on {s.host}:{s.port} (catalog {settings.catalog.name}, pid {proc.pid})")
    if wait:
        server.wait_ready(s.host, s.port, timeout)
        echo(f"ready: JDBC URL {server.url}")
        echo(f"  beeline: {spark_home() / 'bin' / 'beeline'} -u {server.url} -n {s.user}")
    return server


def stop_background(settings: LoaderSettings) -> bool:
    """Stop a server started with ``--background`` (its pid file is under the state dir)."""
    pid_file = server_dir(settings) / "server.pid"
    if not pid_file.is_file():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)  # the server was started in its own session/process group
    except ProcessLookupError:
        return False
    return True


def run_foreground(settings: LoaderSettings, echo: Callable[[str], None] = print) -> int:
    """Run until Ctrl-C (or until the server exits); returns the server's exit status."""
    server = start_server(settings, background=False, wait=True, echo=echo)
    echo("press Ctrl-C to stop")
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        return 0
