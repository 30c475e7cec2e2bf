"""Secrets never reach output, errors, command lines or executor closures; a least-privilege role works."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest
from click.testing import CliRunner

from loader.cli import main
from loader.config import LoaderSettings, executor_settings_json, load_settings, redact
from loader.errors import ConfigError, SourceUnavailableError
from loader.load.decode import make_decoder
from loader.spark import executor_environment, spark_conf
from loader.sqlserver import server_command
from tests.harness import TEST_PG, create_db

SECRET = "S3cr3t-" + uuid.uuid4().hex[:8]


def secret_settings() -> LoaderSettings:
    return LoaderSettings(
        source={"dsn": f"postgresql://cdc:{SECRET}@db.example:5432/app"},
        catalog={"uri": f"postgresql://iceberg:{SECRET}@catalog.example:5432/iceberg", "warehouse": "s3://lake/wh"},
        s3={"access_key_id": "AKIAEXAMPLE", "secret_access_key": SECRET, "endpoint_url": "http://s3.example"},
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"postgresql://u:{SECRET}@h:5432/db", "postgresql://u:***@h:5432/db"),
        (f"host=h user=u password={SECRET} dbname=x", "host=h user=u password=*** dbname=x"),
        (f"host=h password='{SECRET} with space' dbname=x", "host=h password=*** dbname=x"),
        (f"jdbc:postgresql://u:{SECRET}@h/db", "jdbc:postgresql://u:***@h/db"),
    ],
)
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_settings_never_show_secrets() -> None:
    s = secret_settings()
    for shown in (repr(s), str(s), repr(s.source), repr(s.catalog), repr(s.s3)):
        assert SECRET not in shown
    assert SECRET in s.source.conninfo() and s.catalog.secret() == SECRET


def test_invalid_configuration_errors_do_not_echo_values(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[source]\ndsn = "postgresql://u:{SECRET}@h/db"\nmax_changes_per_file = "{SECRET}"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert SECRET not in err.value.one_line() and "max_changes_per_file" in err.value.one_line()


def test_spark_conf_output_references_secrets_and_the_properties_file_holds_them(tmp_path: Path) -> None:
    s = secret_settings()
    shown = spark_conf(s, reveal=False)
    assert SECRET not in "".join(f"{k}={v}" for k, v in shown.items())
    assert shown["spark.hadoop.fs.s3a.secret.key"] == "${LOADER_S3__SECRET_ACCESS_KEY}"
    assert shown["spark.sql.catalog.lakehouse.jdbc.password"] == "${LOADER_CATALOG__PASSWORD}"
    props = tmp_path / "spark.properties"
    env = {
        "LOADER_CATALOG__URI": s.catalog.uri,
        "LOADER_CATALOG__WAREHOUSE": "s3://lake/wh",
        "LOADER_S3__SECRET_ACCESS_KEY": SECRET,
        "LOADER_S3__ACCESS_KEY_ID": "AKIAEXAMPLE",
        "LOADER_SPARK__JDBC_DRIVER_JAR": "/x/postgresql.jar",
    }
    out = CliRunner().invoke(main, ["spark-conf"], env=env)
    assert out.exit_code == 0 and SECRET not in out.output and "--conf spark.sql.extensions=" in out.output, out.output
    out = CliRunner().invoke(main, ["spark-conf", "--properties-file", str(props)], env=env)
    assert out.exit_code == 0 and SECRET not in out.output
    assert stat.S_IMODE(props.stat().st_mode) == 0o600 and SECRET in props.read_text()


def test_thrift_server_command_line_carries_no_secret() -> None:
    s = secret_settings().model_copy(
        update={"spark": secret_settings().spark.model_copy(update={"jdbc_driver_jar": "/x/postgresql.jar"})}
    )
    cmd = server_command(s)
    assert SECRET not in " ".join(cmd) and "--properties-file" in cmd


def test_executor_closures_carry_no_secret() -> None:
    from pyspark import cloudpickle

    s = secret_settings()
    blob = cloudpickle.dumps(make_decoder(executor_settings_json(s)))
    assert SECRET.encode() not in blob and b"AKIAEXAMPLE" not in blob
    assert executor_environment(s) == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET}


# --- a least-privilege source role (REPLICATION + SELECT) --------------------------------------


@pytest.fixture
def restricted(pg_admin: str, tmp_path: Path) -> Any:
    uid = uuid.uuid4().hex[:8]
    db, role = f"lp_{uid}", f"cdc_{uid}"
    create_db(pg_admin, db)
    with psycopg.connect(f"{TEST_PG}/{db}", autocommit=True) as admin:
        admin.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
        admin.execute("INSERT INTO public.t VALUES (1, 'a')")
        admin.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{SECRET}'")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        admin.execute(f"CREATE ROLE {role}_noreplication LOGIN PASSWORD '{SECRET}'")
    u = TEST_PG.split("://", 1)[1].split("@", 1)[1]
    yield (
        {
            "LOADER_SOURCE__DSN": f"postgresql://{role}:{SECRET}@{u}/{db}",
            "LOADER_SOURCE__SLOT": f"slot_{uid}",
            "LOADER_LANDING__URL": (tmp_path / "landing").as_uri(),
            "LOADER_CATALOG__URI": f"postgresql://postgres:{SECRET}@{u}/{db}",
        },
        f"postgresql://{role}_noreplication:{SECRET}@{u}/{db}",
        f"{TEST_PG}/{db}",
        role,
    )
    with psycopg.connect(pg_admin, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE %s",
            (f"%{uid}%",),
        )
        admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(db)))
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"DROP ROLE IF EXISTS {role}_noreplication")


def test_a_replication_and_select_role_captures_and_resyncs_without_showing_its_password(restricted: Any) -> None:
    env, no_replication_dsn, admin_dsn, role = restricted
    runner = CliRunner()
    outputs = []
    for args in (["capture"], ["slot", "info"], ["slot", "tables"], ["resync", "--table", "public.t"], ["capture"]):
        res = runner.invoke(main, args, env=env)
        outputs.append(res.output)
        assert res.exit_code == 0, res.output
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute("INSERT INTO public.t VALUES (2, 'b')")
    res = runner.invoke(main, ["capture"], env=env)
    assert res.exit_code == 0 and "captured 1 changes" in res.output, res.output
    outputs.append(res.output)
    # Without REPLICATION: one clear line saying what the role lacks, still no password.
    res = runner.invoke(
        main, ["capture"], env={**env, "LOADER_SOURCE__DSN": no_replication_dsn, "LOADER_SOURCE__SLOT": "other"}
    )
    assert res.exit_code == 1 and "REPLICATION" in res.output, res.output
    outputs.append(res.output)
    # Unreachable source: the error names the server, not the password.
    res = runner.invoke(
        main,
        ["capture"],
        env={**env, "LOADER_SOURCE__DSN": f"postgresql://{role}:{SECRET}@127.0.0.1:1/x", "LOADER_RETRY__ATTEMPTS": "1"},
    )
    assert res.exit_code == 75 and "127.0.0.1" in res.output, res.output  # an outage: re-run later
    outputs.append(res.output)
    assert all(SECRET not in o for o in outputs)


def test_errors_from_deep_inside_redact_dsns() -> None:
    from loader.capture import slot as slots

    with pytest.raises(SourceUnavailableError) as err:
        slots.connect(f"host=127.0.0.1 port=1 user=x password={SECRET} dbname=x connect_timeout=2")
    assert SECRET not in err.value.one_line()


def _command_lines() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # the process ended meanwhile
    return found


def test_spark_starting_commands_put_no_secret_on_any_command_line(env: Any) -> None:
    """`ps` shows every process's arguments to every local user: the catalog password given to a
    command that starts Spark must reach the JVM through a private file, never as an argument."""
    import time

    from tests.harness import finish, loader_process

    env.capture()  # the slot
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    uri = urlparse(env.settings.catalog.uri)
    with_password = uri._replace(netloc=f"{uri.username}:{SECRET}@{uri.hostname}:{uri.port}").geturl()
    seen_jvm = False
    proc = loader_process(env, "run", LOADER_CATALOG__URI=with_password)
    while proc.poll() is None:
        lines = _command_lines()
        leaked = [line for line in lines if SECRET in line]
        assert not leaked, f"secret on a command line: {leaked[0][:300]}"
        seen_jvm = seen_jvm or any("org.apache.spark.deploy.SparkSubmit" in line for line in lines)
        time.sleep(0.05)
    code, out = finish(proc)
    assert code == 0, out
    assert seen_jvm, "the command never started Spark: the test proved nothing"
    assert SECRET not in out
    env.assert_reconciled(["public.t"])


def test_a_bad_catalog_uri_is_reported_without_its_password() -> None:
    s = LoaderSettings(catalog={"uri": f"mysql://iceberg:{SECRET}@catalog.example/iceberg"})
    with pytest.raises(ConfigError) as err:
        spark_conf(s)
    assert SECRET not in err.value.one_line() and "catalog.example" in err.value.one_line()


def test_tls_options_of_the_catalog_uri_reach_the_jdbc_url() -> None:
    s = LoaderSettings(
        catalog={"uri": "postgresql://iceberg@catalog.example:5432/iceberg?sslmode=verify-full&sslrootcert=/ca.pem"}
    )
    assert (
        spark_conf(s)["spark.sql.catalog.lakehouse.uri"]
        == "jdbc:postgresql://catalog.example:5432/iceberg?sslmode=verify-full&sslrootcert=/ca.pem"
    )
