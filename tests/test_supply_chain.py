"""What the loader runs comes from where it was reviewed: every dependency bounded above, the S3A
jars checked against known SHA-256 hashes, no jar fetched over plain http."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from loader.config import load_settings
from loader.errors import ConfigError
from tests.harness import ROOT


def requirements() -> list[str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = list(doc["build-system"]["requires"]) + list(doc["project"]["dependencies"])
    for extra in doc["project"]["optional-dependencies"].values():
        out += extra
    return out


@pytest.mark.parametrize("text", requirements())
def test_every_dependency_is_bounded_above(text: str) -> None:
    req = Requirement(text)
    assert any(s.operator in ("<", "<=", "==", "~=", "===") for s in req.specifier), (
        f"{text}: no upper bound; exclude the next major version"
    )


def test_the_s3a_jars_and_their_sdist_are_checked_against_known_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    jars = re.search(r"^S3A_JARS := (.*)$", makefile, re.M)
    assert jars is not None
    names = sorted(Path(j.replace("$(S3A_JARS_DIR)/", "")).name for j in jars.group(1).split())
    sums = dict(
        reversed(line.split()) for line in (ROOT / "infra/s3a-jars.sha256").read_text().splitlines() if line.strip()
    )
    assert sorted(sums) == names and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in sums.values())
    pinned = (ROOT / "infra/s3a-jars.requirements.txt").read_text()
    assert re.search(r"^sagemaker-pyspark==1\.4\.5 --hash=sha256:[0-9a-f]{64}$", pinned, re.M)
    # The recipe: the sdist downloaded with --require-hashes, every jar checked before it is put in
    # place, and the jars in place checked again on every run.
    recipe = subprocess.run(
        ["make", "-n", "--always-make", "s3a-jars", "STAMP=/dev/null"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    download = recipe.index("--require-hashes -r infra/s3a-jars.requirements.txt")
    check = recipe.index("sha256sum --strict -c", download)
    assert download < check < recipe.index("mv $tmp/jars/*.jar", check)
    assert "sha256sum --strict --quiet -c" in recipe[recipe.index("ls .state/jars") :]
    # jars already fetched (make s3a-jars) match
    for name, digest in sums.items():
        jar = ROOT / ".state/jars" / name
        if jar.is_file():
            out = subprocess.run(["sha256sum", str(jar)], capture_output=True, text=True, check=True).stdout
            assert out.split()[0] == digest, f"{jar} differs from its known hash"


@pytest.mark.parametrize(
    "setting",
    ["LOADER_SPARK__EXTRA_JARS", "LOADER_SPARK__ICEBERG_JAR", "LOADER_SPARK__JDBC_DRIVER_JAR"],
)
def test_jars_over_plain_http_are_refused(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(setting, "/opt/jars/a.jar")
    assert load_settings()
    url = "http://user:hunter2@repo.example/x.jar"
    monkeypatch.setenv(setting, f"/opt/jars/a.jar,{url}" if setting.endswith("EXTRA_JARS") else url)
    with pytest.raises(ConfigError, match="http:// URL is refused") as err:
        load_settings()
    assert "hunter2" not in str(err.value)
    monkeypatch.setenv(setting, "https://repo.example/x.jar")
    assert load_settings()
