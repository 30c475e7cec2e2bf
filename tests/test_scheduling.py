"""The scheduling examples under infra/scheduling run commands the CLI really has (options included),
and the Kubernetes ones are hardened: image by digest, non-root, read-only root filesystem, no
capabilities or privilege escalation, requests and limits, secrets only from a Secret, metrics not
on 0.0.0.0, a NetworkPolicy around every pod."""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from loader.cli import main
from loader.config import LoaderSettings, redact
from tests.harness import ROOT

SCHEDULING = ROOT / "infra" / "scheduling"
WORKLOADS = ("CronJob", "Deployment")


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
            if doc["kind"] not in WORKLOADS:
                continue
            for container in _containers(doc):
                cmd, args = container.get("command") or [], container.get("args") or []
                if cmd[:2] == ["/bin/sh", "-c"]:
                    add(path.name, args[0])
                else:
                    add(path.name, shlex.join([*cmd, *args]))
    return found


def _pod(doc: dict) -> dict:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"])


def _containers(doc: dict) -> list[dict]:
    return list(_pod(doc)["spec"]["containers"])


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted((SCHEDULING / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


def workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{name}:{doc['metadata']['name']}", doc) for name, doc in k8s_docs() if doc["kind"] in WORKLOADS]


# An environment variable holding one of these must come from a Secret, never be written out.
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL", re.I)


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


def test_every_kind_of_workload_is_there() -> None:
    names = {name for name, _ in workloads()}
    assert len(names) == 4 and sum(1 for _, d in workloads() if d["kind"] == "Deployment") == 1, names
    assert {d["kind"] for _, d in k8s_docs()} == {"CronJob", "Deployment", "ConfigMap", "NetworkPolicy"}


@pytest.mark.parametrize(("name", "doc"), workloads(), ids=[n for n, _ in workloads()])
def test_every_workload_is_hardened(name: str, doc: dict[str, Any]) -> None:
    pod = _pod(doc)["spec"]
    sc = pod.get("securityContext") or {}
    assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, f"{name}: runs as root"
    assert (sc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", name
    assert pod.get("automountServiceAccountToken") is False, f"{name}: mounts a service account token"
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for c in pod["containers"]:
        where = f"{name}/{c['name']}"
        assert re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", c["image"]), f"{where}: image not by digest: {c['image']}"
        csc = c.get("securityContext") or {}
        assert csc.get("allowPrivilegeEscalation") is False, where
        assert csc.get("readOnlyRootFilesystem") is True, where
        assert "ALL" in (csc.get("capabilities") or {}).get("drop", []), where
        assert not (csc.get("capabilities") or {}).get("add"), where
        assert not csc.get("privileged") and csc.get("runAsUser", 1) != 0, where
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(kind) or {}), f"{where}: no {kind}"
        env = {e["name"]: e for e in c.get("env") or []}
        # writable places on a read-only root: emptyDir volumes at TMPDIR and LOADER_HOME
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
        for var in ("TMPDIR", "LOADER_HOME", "HOME"):
            path = env[var]["value"]
            assert path in mounts and "emptyDir" in volumes[mounts[path]], f"{where}: {var}={path} is not writable"
        config = volumes[mounts["/etc/lakehouse-loader"]]
        assert config["configMap"]["name"] == "lakehouse-loader", where
        # secrets: from the Secret (envFrom or secretKeyRef), never a literal value
        assert any((e.get("secretRef") or {}).get("name") == "lakehouse-loader" for e in c.get("envFrom") or []), where
        for var, e in env.items():
            if _SECRET_NAME.search(var):
                assert "value" not in e and "secretKeyRef" in (e.get("valueFrom") or {}), f"{where}: {var} written out"
        # metrics bound as configured: to the pod's IP, never every interface
        text = yaml.safe_dump(c)
        assert "0.0.0.0" not in text, f"{where}: binds every interface"
        if any(p.get("name") == "metrics" for p in c.get("ports") or []):
            host = env["LOADER_FOLLOW__METRICS_HOST"]
            assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", where


def test_a_network_policy_surrounds_every_pod() -> None:
    policies = [d for _, d in k8s_docs() if d["kind"] == "NetworkPolicy"]
    assert len(policies) == 1
    policy = policies[0]["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    selector = policy["podSelector"]["matchLabels"]
    metrics_ports = set()
    for name, doc in workloads():
        labels = _pod(doc)["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{name}: not selected by the NetworkPolicy"
        metrics_ports |= {p["containerPort"] for c in _containers(doc) for p in c.get("ports") or []}
    # ingress: only the metrics port, only from a named namespace (never from everywhere)
    for rule in policy["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= metrics_ports
        assert rule.get("from") and all("namespaceSelector" in f or "podSelector" in f for f in rule["from"])
    egress_ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 5432}


def test_the_configmap_holds_no_secret() -> None:
    maps = [d for _, d in k8s_docs() if d["kind"] == "ConfigMap"]
    assert [m["metadata"]["name"] for m in maps] == ["lakehouse-loader"]
    for key, text in maps[0]["data"].items():
        doc = tomllib.loads(text)
        flat = [(f"{section}.{k}", v) for section, values in doc.items() for k, v in values.items()]
        for setting, value in flat:
            assert not _SECRET_NAME.search(setting), f"{key}: {setting} is a secret"
            if isinstance(value, str):
                assert redact(value) == value, f"{key}: {setting} carries a password"
        settings = LoaderSettings.model_validate(doc)  # the settings are valid as they stand
        assert settings.source.password is None and settings.catalog.password is None
        assert settings.s3.secret_access_key is None and settings.s3.access_key_id is None
