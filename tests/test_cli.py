"""The loader command as a user meets it: one-line errors, exit codes, status without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from loader.cli import main
from tests.harness import Env, settings_env


def test_help_for_every_command() -> None:
    runner = CliRunner()
    for args in (
        ["--help"],
        ["capture", "--help"],
        ["load", "--help"],
        ["merge", "--help"],
        ["run", "--help"],
        ["status", "--help"],
        ["verify", "--help"],
        ["slot", "--help"],
        ["demo", "--help"],
    ):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, (args, res.output)
        assert "Usage:" in res.output


def test_missing_slot_is_one_clear_line(env: Env) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["capture", "--no-create-slot"], env=settings_env(env.settings))
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert env.settings.source.slot in lines[0] and "does not exist" in lines[0] and "loader slot create" in lines[0]
    assert "Traceback" not in res.output


def test_unreachable_source_names_what_to_do(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["capture"],
        env={"LOADER_SOURCE__DSN": "postgresql://postgres@127.0.0.1:1/nothing", "LOADER_HOME": str(tmp_path)},
    )
    assert res.exit_code == 1
    assert "cannot connect to the source database" in res.output and "LOADER_SOURCE__DSN" in res.output


def test_bad_config_file_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[source]\nmax_changes_per_file = "many"\n')
    res = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert res.exit_code == 1 and "invalid configuration" in res.output and "max_changes_per_file" in res.output


def test_status_answers_from_the_catalog_without_spark(env: Env) -> None:
    env.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE nokey (v text)")
    env.capture()
    env.transaction("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 25) g", "INSERT INTO nokey VALUES ('y')")
    env.transaction("DELETE FROM a WHERE id <= 5")
    env.run_all()
    code = (
        "import sys, json\n"
        "from loader.cli import main\n"
        "try:\n"
        "    main(['status', '--json'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'pyspark' not in sys.modules, 'status imported pyspark'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **settings_env(env.settings)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    tables = {t["table"]: t for t in st["tables"]}
    assert tables["public.a"]["history_rows"] == 30 and tables["public.a"]["current_rows"] == 20
    assert tables["public.a"]["merged"] == st["loaded"] == st["consistent"] == st["landed"]
    assert tables["public.nokey"]["current_rows"] is None and "history only" in tables["public.nokey"]["note"]


def test_verify_exit_status(env: Env) -> None:
    env.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    env.capture()
    env.transaction("INSERT INTO a VALUES (1, 'one'), (2, 'two')")
    env.run_all()
    runner = CliRunner()
    ok = runner.invoke(main, ["verify"], env=settings_env(env.settings))
    assert ok.exit_code == 0 and "OK " in ok.output
    env.sql("UPDATE a SET v = 'changed behind the loader' WHERE id = 2")  # not yet captured
    bad = runner.invoke(main, ["verify"], env=settings_env(env.settings))
    assert bad.exit_code == 4 and "different=1" in bad.output
    # the key and the column, not the values (personal data as a rule) unless asked for
    assert "key (2,) differs in: v" in bad.output, bad.output
    assert "changed behind the loader" not in bad.output and "'two'" not in bad.output
    shown = runner.invoke(main, ["verify", "--show-values"], env=settings_env(env.settings))
    assert shown.exit_code == 4 and "'changed behind the loader'" in shown.output and "'two'" in shown.output
