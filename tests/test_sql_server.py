"""The Spark Thrift Server on the loader's catalog: authenticated, over TLS, on a read-only catalog
login; a HiveServer2 client (PyHive, beeline) queries it, dbt builds on it.

Two server starts in all (each costs ~30 s of two cores): one module-wide server with a read-only
catalog login serves the security tests, and the dbt test starts one with the loader's own login.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from loader.cli import main
from loader.config import LoaderSettings
from loader.dbt import invoke_dbt
from loader.errors import ConfigError
from loader.sqlserver import (
    SqlServer,
    check_password,
    conf_dir,
    jdbc_url,
    password_file,
    read_users,
    self_signed_tls,
    set_user,
    spark_home,
    start_server,
    tls_transport,
    with_self_signed_tls,
)
from loader.workload import BankWorkload
from tests.harness import TEST_PG, Env

pytestmark = [pytest.mark.integration, pytest.mark.dbt]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect(port: int, user: str, password: str, cafile: str | None) -> Any:
    from pyhive import hive

    return hive.connect(thrift_transport=tls_transport("127.0.0.1", port, user, password, cafile, timeout_ms=60_000))


def beeline(command: str, home: Path) -> subprocess.CompletedProcess[str]:
    """A shell command line of the README, run with SPARK_HOME set as the README says (beeline's
    launcher would otherwise look for Spark with whatever python3 is on the PATH)."""
    setup = "export SPARK_HOME=$(.venv/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')"
    return subprocess.run(
        ["bash", "-c", f"{setup} && {command}".replace(".venv/bin/python", sys.executable)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    )


@dataclass
class Secured:
    settings: LoaderSettings
    server: SqlServer
    port: int
    table: str  # namespace.table with 3 rows
    password: str
    keystore_password: str
    catalog_password: str
    tmp: Path


@pytest.fixture(scope="module")
def secured(
    pg_admin: str, base_settings: LoaderSettings, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secured]:
    """One authenticated TLS server, on a catalog login that can only SELECT the catalog's tables."""
    tmp = tmp_path_factory.mktemp("sqlserver")
    uid = uuid.uuid4().hex[:8]
    role, catalog_password, password = f"ro_{uid}", f"cat-{uuid.uuid4().hex}", f"pw-{uuid.uuid4().hex}"
    namespace = f"ro_{uid}"
    cat = base_settings.catalog.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {cat}.{namespace}")
    spark.sql(f"CREATE TABLE {cat}.{namespace}.t (id int, v string) USING iceberg")
    spark.sql(f"INSERT INTO {cat}.{namespace}.t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    catalog_db = base_settings.catalog.uri.rsplit("/", 1)[1]
    with psycopg.connect(f"{TEST_PG}/{catalog_db}", autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{catalog_password}'")
        admin.execute(f"GRANT SELECT ON iceberg_tables, iceberg_namespace_properties TO {role}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOADER_HOME", str(tmp / "state"))
        port = free_port()
        settings = base_settings.model_copy(
            update={
                "sql_server": base_settings.sql_server.model_copy(
                    update={
                        "port": port,
                        "user": "alice",
                        "catalog_uri": f"{TEST_PG.replace('postgres@', f'{role}@')}/{catalog_db}",
                        "catalog_password": SecretStr(catalog_password),
                    }
                )
            }
        )
        set_user(password_file(settings), "alice", password)
        tls = self_signed_tls("127.0.0.1")
        settings = with_self_signed_tls(settings, tls)
        settings = settings.model_copy(
            update={"sql_server": settings.sql_server.model_copy(update={"tls_ca_file": str(tls.certificate)})}
        )
        server = start_server(settings, background=True)
        try:
            yield Secured(
                settings,
                server,
                port,
                f"{namespace}.t",
                password,
                tls.password_file.read_text().strip(),
                catalog_password,
                tmp,
            )
        finally:
            server.stop()
            with psycopg.connect(f"{TEST_PG}/{catalog_db}", autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


def test_refused_without_tls_without_credentials_or_with_a_wrong_password(secured: Secured) -> None:
    from pyhive import hive

    cafile = secured.settings.sql_server.tls_ca_file
    refused = [
        ("alice", "wrong"),
        ("alice", ""),
        ("mallory", secured.password),  # a user the file does not hold
        ("ALICE", secured.password),
    ]
    for user, password in refused:
        with pytest.raises(Exception, match="Error validating the login"):
            connect(secured.port, user, password, cafile)
    # without TLS, the old way (SASL PLAIN, any user name): the TLS server never answers it
    with pytest.raises(Exception):  # thrift's TTransportException, whatever its text
        conn = hive.connect("127.0.0.1", secured.port, username="alice", password=secured.password, auth="CUSTOM")
        conn.cursor().execute("SELECT 1")
    # a client that does not trust the self-signed certificate (the system's CAs) does not connect
    with pytest.raises(Exception):  # raised by thrift's TSSLSocket after the handshake fails
        connect(secured.port, "alice", secured.password, None)
    # beeline without a password, and with a wrong one
    url = jdbc_url(secured.settings)
    assert ";ssl=true;sslTrustStore=" in url
    for creds in ("-n alice", "-n alice -p wrong"):
        out = beeline(f"\"$SPARK_HOME/bin/beeline\" -u '{url}' {creds} -e 'SELECT 1'", secured.tmp)
        assert out.returncode != 0 and "Error validating the login" in out.stdout + out.stderr, out.stdout + out.stderr


def test_right_password_over_tls_queries_a_table(secured: Secured) -> None:
    conn = connect(secured.port, "alice", secured.password, secured.settings.sql_server.tls_ca_file)
    cur = conn.cursor()
    cur.execute(f"SELECT count(*), max(v) FROM {secured.table}")
    assert cur.fetchone() == (3, "c")
    conn.close()
    # The README's beeline command: truststore in the URL, password from a file (-w), never an argument.
    pw = secured.tmp / "password"
    pw.write_text(secured.password)
    pw.chmod(0o600)
    url = jdbc_url(secured.settings)
    command = f"\"$SPARK_HOME/bin/beeline\" -u '{url}' -n alice -w {pw} -e 'SELECT count(*) FROM {secured.table}'"
    out = beeline(command, secured.tmp)
    assert out.returncode == 0 and "| 3 " in out.stdout, out.stdout + out.stderr


def test_read_only_catalog_login_cannot_drop(secured: Secured, spark: Any) -> None:
    conn = connect(secured.port, "alice", secured.password, secured.settings.sql_server.tls_ca_file)
    cur = conn.cursor()
    with pytest.raises(Exception, match=r"(?i)permission denied"):
        cur.execute(f"DROP TABLE {secured.table}")
    with pytest.raises(Exception, match=r"(?i)permission denied"):
        cur.execute(f"CREATE TABLE {secured.table}_new (id int) USING iceberg")
    conn.close()
    cat = secured.settings.catalog.name
    assert spark.sql(f"SELECT count(*) FROM {cat}.{secured.table}").first()[0] == 3


def test_no_secret_on_any_command_line_or_in_the_log(secured: Secured) -> None:
    assert secured.server.process.poll() is None
    secrets = [secured.password, secured.keystore_password, secured.catalog_password]
    seen = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes()
        except OSError:  # the process ended
            continue
        seen += 1
        for secret in secrets:
            assert secret.encode() not in args, f"a secret on the command line of {cmdline.parent.name}"
    assert seen > 1
    server_args = Path(f"/proc/{secured.server.process.pid}/cmdline").read_bytes().split(b"\0")
    assert b"HiveThriftServer2" in b" ".join(server_args), "the scan covered the server itself"
    log = secured.server.log_path
    assert log is not None
    for secret in secrets:
        assert secret not in log.read_text(errors="replace")
    # where the secrets are: private files in a private directory
    site = conf_dir(secured.settings) / "hive-site.xml"
    assert stat.S_IMODE(conf_dir(secured.settings).stat().st_mode) == 0o700
    assert stat.S_IMODE(site.stat().st_mode) == 0o600 and secured.keystore_password in site.read_text()
    assert stat.S_IMODE(password_file(secured.settings).stat().st_mode) == 0o600


def test_refuses_to_start_without_auth_and_tls(base_settings: LoaderSettings, tmp_path: Path) -> None:
    """No users, or no keystore: the server does not start (and says how to fix it) unless --no-auth."""
    port = free_port()
    env = {
        "LOADER_HOME": str(tmp_path / "state"),
        "LOADER_CATALOG__URI": base_settings.catalog.uri,
        "LOADER_CATALOG__WAREHOUSE": base_settings.catalog.warehouse,
        "LOADER_SQL_SERVER__PORT": str(port),
    }
    runner = CliRunner()
    try:
        out = runner.invoke(main, ["sql-server", "--background"], env=env)
        assert out.exit_code == 1, out.output
        assert "no users" in out.output and "loader sql-server add-user NAME" in out.output
        assert "--no-auth" in out.output
        # a user, but no TLS keystore
        out = runner.invoke(main, ["sql-server", "add-user", "bob"], env=env, input="correct horse\n")
        assert out.exit_code == 0, out.output
        out = runner.invoke(main, ["sql-server", "--background"], env=env)
        assert out.exit_code == 1 and "no TLS keystore" in out.output and "--self-signed-tls" in out.output
    finally:
        runner.invoke(main, ["sql-server", "--stop"], env=env)  # had it started (the old code did)
    assert not socket_listening(port)
    # add-user kept a salted hash, readable by its owner only; the password itself is nowhere
    path = tmp_path / "state" / "sql-server" / "passwords"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "correct horse" not in path.read_text()
    entry = read_users(path)["bob"]
    assert check_password(entry, "correct horse") and not check_password(entry, "correct horse ")
    # the same refusal from the Python API
    settings = base_settings.model_copy(
        update={"sql_server": base_settings.sql_server.model_copy(update={"password_file": str(tmp_path / "none")})}
    )
    with pytest.raises(ConfigError, match="no users"):
        start_server(settings, background=True, wait=False)


def socket_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_thrift_server_query_and_dbt_build(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dbt's thrift target through an authenticated TLS server on the loader's own catalog login."""
    monkeypatch.setenv("LOADER_HOME", str(tmp_path / "state"))  # the server's working dir and log
    workload = BankWorkload(env.settings.source.dsn, seed=5)
    workload.create_schema()
    env.capture()
    workload.run(15)
    env.run_all()
    env.assert_reconciled()
    port = free_port()
    password = f"pw-{uuid.uuid4().hex}"
    tls = self_signed_tls("127.0.0.1")
    settings = env.settings.model_copy(
        update={
            "sql_server": env.settings.sql_server.model_copy(
                update={"port": port, "user": "dbt", "client_password": SecretStr(password)}
            ),
            "dbt": env.settings.dbt.model_copy(
                update={"analytics_namespace": f"t_{env.uid}", "work_dir": str(tmp_path / "dbt-work")}
            ),
        }
    )
    settings = with_self_signed_tls(settings, tls)
    settings = settings.model_copy(
        update={"sql_server": settings.sql_server.model_copy(update={"tls_ca_file": str(tls.certificate)})}
    )
    set_user(password_file(settings), "dbt", password)
    assert jdbc_url(settings) == f"jdbc:hive2://127.0.0.1:{port}/default;ssl=true;sslTrustStore={tls.truststore}"
    printed: list[str] = []
    server = start_server(settings, background=True, echo=printed.append)
    try:
        assert any("warning: the SQL server uses the loader's own catalog login" in p for p in printed)
        beeline_line = next(p for p in printed if "beeline" in p and " -u " in p)
        assert password not in "\n".join(printed) and "-w <file" in beeline_line
        assert str(spark_home() / "bin" / "beeline") in beeline_line
        conn = connect(port, "dbt", password, str(tls.certificate))
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
        assert res.success, (bad, res.exception)
        assert any("reconciliation" in r.node.name for r in res.result.results)
        # the models dbt made through the server are Iceberg views in the same catalog
        cur.execute(f"SELECT count(*) FROM t_{env.uid}.public__accounts")
        assert cur.fetchone()[0] == count
        cur.execute(f"SELECT count(*) FROM t_{env.uid}.public__accounts__from_history")
        assert cur.fetchone()[0] == count
        conn.close()
    finally:
        server.stop()
    assert server.process.poll() is not None
