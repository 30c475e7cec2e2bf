"""The scheduling examples under infra/scheduling run commands the CLI really has (options included)."""

from __future__ import annotations

import ast
import re
import shlex

import pytest
import yaml
from click.testing import CliRunner

from loader.cli import main
from tests.harness import ROOT

SCHEDULING = ROOT / "infra" / "scheduling"


def loader_commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []

    def add(origin: str, text: str) -> None:
        for part in re.split(r"&&|;|>>|\|", text):
            words = shlex.split(part.strip())
            if words and words[0] == "loader":
                found.append((origin, words[1:]))

    for line in (SCHEDULING / "crontab.example").read_text().splitlines():
        if line.strip() and not line.startswith("#") and "=" not in line.split()[0]:
            add("crontab", " ".join(line.split()[5:]))
    tree = ast.parse((SCHEDULING / "airflow_dag.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "bash_command" and isinstance(node.value, ast.Constant):
            add("airflow", str(node.value.value))
    for path in sorted((SCHEDULING / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for container in _containers(doc):
                cmd, args = container.get("command") or [], container.get("args") or []
                if cmd[:2] == ["/bin/sh", "-c"]:
                    add(path.name, args[0])
                else:
                    add(path.name, shlex.join([*cmd, *args]))
    return found


def _containers(doc: dict) -> list[dict]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return list(spec["template"]["spec"]["containers"])


def test_every_example_is_found() -> None:
    origins = {o for o, _ in loader_commands()}
    assert origins == {"crontab", "airflow", "follow-deployment.yaml", "cronjob.yaml"}


@pytest.mark.parametrize(("origin", "args"), loader_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_example_commands_parse(origin: str, args: list[str]) -> None:
    if "dbt" in args:  # passes its arguments to dbt itself
        assert args[args.index("dbt") + 1] in ("build", "run", "test")
        return
    # --help is eager: click still rejects an unknown command or option before printing help.
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, f"{origin}: loader {' '.join(args)}\n{result.output}"


def test_follow_deployment_never_runs_two_followers() -> None:
    doc = yaml.safe_load((SCHEDULING / "k8s" / "follow-deployment.yaml").read_text())
    assert doc["spec"]["replicas"] == 1 and doc["spec"]["strategy"]["type"] == "Recreate"
    assert doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 120
