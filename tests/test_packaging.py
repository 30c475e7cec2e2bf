"""The wheel is what a cluster image or a packed environment ships: it must carry the dbt project and
the landing schemas, and `loader dbt` must find the project inside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.harness import ROOT


def test_wheel_carries_dbt_project_and_schemas(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # A quiet build: no setuptools warnings about data folders or the license field.
    noise = [ln for ln in built.stderr.splitlines() if "Warning" in ln or "deprecated" in ln]
    assert not noise, noise[:5]
    wheel = next(tmp_path.glob("lakehouse_loader-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "loader/_data/dbt_project/dbt_project.yml",
        "loader/_data/dbt_project/macros/loader_change_log.sql",
        "loader/_data/dbt_project/tests/generic/loader_reconciliation.sql",
        "loader/_data/schemas/landing-change.v1.json",
        "loader/cli.py",
        "loader/java/PasswordFileAuthenticator.java",
        "loader/log4j/text.properties",
        "loader/log4j/json.properties",
    ):
        assert required in names, required
    # Capture's compiled parser (setup.py), built for this platform.
    assert any(n.startswith("loader/capture/_wal2json.") and n.endswith(".so") for n in names), sorted(names)
    # Installed (here: unpacked onto sys.path ahead of the checkout), the project is found inside it.
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    probe = "from loader.dbt import shipped_project_dir as f; print(f())"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert out.startswith(str(target)) and (Path(out) / "dbt_project.yml").is_file()
