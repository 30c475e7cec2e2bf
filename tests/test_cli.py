"""The loader command as a user meets it: one-line errors, exit codes, status without Spark."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner

from loader.cli import main
from loader.lake.tables import SourceTable
from tests.harness import Env, cli_env, settings_env


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
        env={
            "LOADER_SOURCE__DSN": "postgresql://postgres@127.0.0.1:1/nothing",
            "LOADER_HOME": str(tmp_path),
            "LOADER_RETRY__ATTEMPTS": "1",
        },
    )
    assert res.exit_code == 75  # refused: perhaps restarting (tests/test_retry.py)
    assert "the source database postgresql://postgres@127.0.0.1:1/nothing is unavailable" in res.output
    assert "LOADER_SOURCE__DSN" in res.output


def test_bad_config_file_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[source]\nmax_changes_per_file = "many"\n')
    res = CliRunner().invoke(main, ["--config", str(cfg), "status"])
    assert res.exit_code == 1 and "invalid configuration" in res.output and "max_changes_per_file" in res.output


def test_a_commit_interval_orphan_cleanup_could_overtake_is_refused(tmp_path: Path) -> None:
    """Data files a load wrote wait up to load.commit_interval_s for their commit; orphan cleanup
    must not be able to delete them first."""
    cfg = tmp_path / "slow.toml"
    cfg.write_text("[load]\ncommit_interval_s = 7200\n[maintenance]\norphan_older_than_hours = 1\n")
    res = CliRunner().invoke(main, ["--config", str(cfg), "status"], env={"LOADER_HOME": str(tmp_path)})
    assert res.exit_code == 1 and "load.commit_interval_s (7200)" in res.output, res.output
    assert "orphan_older_than_hours" in res.output


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


def test_run_and_status_print_the_same_consistent_position(env: Env) -> None:
    """One rule for 'consistent through' (issue 26 point 3): a table with no change since its last
    merge equals the source as of loaded-through, in run's summary as in status."""
    env.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE b (id int PRIMARY KEY, v text)")
    env.capture()
    env.transaction("INSERT INTO a VALUES (1, 'x')", "INSERT INTO b VALUES (1, 'y')")
    env.run_all()
    env.transaction("INSERT INTO a VALUES (2, 'x')")  # b has nothing new: its merged-through stays behind
    runner = CliRunner()
    ran = runner.invoke(main, ["run"], env=cli_env(env))
    assert ran.exit_code == 0, ran.output
    status = runner.invoke(main, ["status"], env=cli_env(env))
    assert status.exit_code == 0, status.output
    in_run = re.findall(r"^consistent through: +(\S+)", ran.output, re.M)
    in_status = re.findall(r"^consistent through: +(\S+)", status.output, re.M)
    loaded = re.findall(r"^loaded through: +([^\s,]+)", status.output, re.M)
    assert in_run and in_run == in_status == loaded, (ran.output, status.output)


def test_verify_exit_status(env: Env) -> None:
    env.sql("CREATE TABLE a (id int PRIMARY KEY, v text)")
    env.capture()
    env.transaction("INSERT INTO a VALUES (1, 'one'), (2, 'two')")
    env.run_all()
    runner = CliRunner()
    ok = runner.invoke(main, ["verify"], env=settings_env(env.settings))
    assert ok.exit_code == 0 and "OK " in ok.output
    # A change behind the loader's back: in the lake itself (a source change not captured yet is lag,
    # which verify lands and counts as in flight: tests/test_verify.py).
    current = env.names.current(SourceTable("public", "a"))
    env.spark.sql(f"UPDATE {current} SET v = 'changed behind the loader' WHERE id = 2")
    bad = runner.invoke(main, ["verify"], env=settings_env(env.settings))
    assert bad.exit_code == 4 and "different=1" in bad.output
    # the key and the column, not the values (personal data as a rule) unless asked for
    assert "key (2,) differs in: v" in bad.output, bad.output
    assert "changed behind the loader" not in bad.output and "'two'" not in bad.output
    shown = runner.invoke(main, ["verify", "--show-values"], env=settings_env(env.settings))
    assert shown.exit_code == 4 and "'changed behind the loader'" in shown.output and "'two'" in shown.output


def test_typed_names_and_times_are_checked_before_any_work(env: Env) -> None:
    """Unknown tables (close matches suggested), times that are not times: exit 2 before Spark starts."""
    env.sql("CREATE TABLE public.orders (id int PRIMARY KEY, v text)")
    env.capture()
    env.transaction("INSERT INTO public.orders VALUES (1, 'one')")
    env.run_all()
    cases = [
        ["verify", "--table", "orders"],
        ["merge", "--table", "public.nope"],
        ["maintain", "--table", "public.ordrs"],
        ["backfill", "rebuild-current", "--table", "public.nope"],
        ["backfill", "rebuild-current", "--table", "public.orders", "--as-of", "yesterday"],
        ["backfill", "replay", "--from-lsn", "0/1", "--to-lsn", "0/2", "--table", "public.ordrs"],
        ["backfill", "replay", "--from-lsn", "0/2", "--to-lsn", "0/1"],
        ["backfill", "snapshot", "--table", "public.ordrs", "--dry-run"],
        ["as-of", "--table", "public.orders", "--at", "yesterday"],
        ["as-of", "--table", "orders", "--at", "2026-01-31 12:00"],
        ["erase", "--table", "public.nope", "--key", "id=1"],
        ["as-of", "--table", "public.orders", "--at", "2026-01-31 12:00"],
        ["as-of", "--table", "public.orders", "--at", "2026-01-31T13:00+01:00"],
    ]
    code = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from loader.cli import main\n"
        "out = []\n"
        f"for args in {cases!r}:\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    out.append([r.exit_code, r.output])\n"
        "assert 'pyspark' not in sys.modules, 'a typo started Spark'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **settings_env(env.settings)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = dict(zip((" ".join(c) for c in cases), json.loads(proc.stdout.splitlines()[-1]), strict=True))
    for args, (status, output) in list(results.items())[:-2]:
        lines = [line for line in output.splitlines() if line.strip()]
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, status, output)
    assert "did you mean public.orders?" in results["verify --table orders"][1]
    assert "known: public.orders" in results["merge --table public.nope"][1]
    assert "did you mean public.orders?" in results["backfill snapshot --table public.ordrs --dry-run"][1]
    assert "'yesterday' is not a time" in results["as-of --table public.orders --at yesterday"][1]
    assert "--to-lsn is before --from-lsn" in results["backfill replay --from-lsn 0/2 --to-lsn 0/1"][1]
    # A time without a zone is UTC; one with a zone is converted: the same instant either way.
    for args in (
        "as-of --table public.orders --at 2026-01-31 12:00",
        "as-of --table public.orders --at 2026-01-31T13:00+01:00",
    ):
        status, output = results[args]
        assert status == 0 and "CAST('2026-01-31 12:00:00+00:00' AS TIMESTAMP)" in output, output


def test_config_typos_are_errors_naming_the_key(tmp_path: Path) -> None:
    runner = CliRunner()
    home = {"LOADER_HOME": str(tmp_path)}
    typo = tmp_path / "typo.toml"
    typo.write_text('[source]\nslott = "other"\n')
    res = runner.invoke(main, ["--config", str(typo), "status"], env=home)
    assert res.exit_code == 1 and "unknown key source.slott (did you mean source.slot?)" in res.output, res.output
    assert str(typo) in res.output
    res = runner.invoke(main, ["status"], env={**home, "LOADER_SOURCE__SLOTT": "other"})
    assert res.exit_code == 1 and "LOADER_SOURCE__SLOTT: did you mean LOADER_SOURCE__SLOT?" in res.output, res.output
    res = runner.invoke(main, ["status"], env={**home, "LOADER_SOURCE_DSN": "postgresql://x@h/db"})
    assert res.exit_code == 1 and "LOADER_SOURCE_DSN: did you mean LOADER_SOURCE__DSN?" in res.output, res.output
    assert "x@h" not in res.output  # a variable's value may be a secret: never shown
    broken = tmp_path / "broken.toml"
    broken.write_text('[source]\nslot = "a"\ndsn = \n')
    res = runner.invoke(main, ["--config", str(broken), "status"], env=home)
    assert res.exit_code == 1 and str(broken) in res.output and "line 3" in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output


def test_spark_commands_log_only_zoned_json_lines_under_log_format_json(env: Env) -> None:
    """Spark's JVM keeps quiet unless it fails, and speaks the loader's format when it does: under
    --log-format json every stderr line is a JSON object with a zoned time (log pipelines parse them)."""
    from datetime import datetime

    from tests.harness import cli_env

    env.capture()
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.t VALUES (1, 'a')")
    proc = subprocess.run(
        [sys.executable, "-m", "loader.cli", "--log-format", "json", "--log-level", "INFO", "run"],
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines, "INFO lines expected from the run"
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        when = datetime.fromisoformat(doc["time"])
        assert when.tzinfo is not None and when.utcoffset() is not None, line
    assert not any("WARN Utils" in ln or "NativeCodeLoader" in ln for ln in lines)


def test_follow_mode_logs_at_info_unless_a_level_is_given(monkeypatch: Any) -> None:
    """The level comes from the options click parsed (``run --follow`` raises the default to INFO),
    not from scanning the command line."""
    import logging

    import loader.cli
    import loader.follow

    class Follower:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.stats = SimpleNamespace(cycles=0, idle_cycles=0, captured_changes=0, loaded_changes=0, errors=[])

        def run(self) -> int:
            levels.append(logging.getLogger().level)
            return 0

    levels: list[int] = []
    monkeypatch.setattr(loader.follow, "Follower", Follower)
    monkeypatch.setattr(loader.cli.Context, "spark", lambda self: None)
    monkeypatch.setattr(sys, "argv", ["loader"])  # nothing to find there
    env = {"LOADER_LOG_LEVEL": None}
    for args, level in (
        (["run", "--follow"], logging.INFO),
        (["--log-level", "ERROR", "run", "--follow"], logging.ERROR),
    ):
        levels.clear()
        res = CliRunner().invoke(main, args, env=env)
        assert res.exit_code == 0 and "follow: 0 cycles" in res.output, (args, res.output)
        assert levels == [level], args
    res = CliRunner().invoke(main, ["run", "--follow"], env={"LOADER_LOG_LEVEL": "WARNING"})
    assert res.exit_code == 0 and logging.getLogger().level == logging.WARNING, res.output
