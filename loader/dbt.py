"""Run the dbt project in-process on the loader's Iceberg catalog.

``run_dbt`` prepares a working copy of ``dbt_project/`` (static macros and audits plus sources and
per-table models generated from the catalog, see ``loader.dbtgen``), points the profile at the
loader's settings through ``DBT_LAKEHOUSE_*`` environment variables, and calls
``dbtRunner().invoke``. On the ``session`` target the loader's own SparkSession is created first:
dbt-spark's ``method: session`` calls ``SparkSession.builder...getOrCreate()``, which returns it,
so dbt sees the same catalog, jars and settings as the loader. The ``thrift`` target talks to the
Spark Thrift Server (``loader sql-server``) instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from loader.config import LoaderSettings, redact, secret_text, state_dir
from loader.dbtgen import GENERATED_DIR, project_vars, read_catalog, read_comments, render_generated
from loader.errors import ConfigError

TARGETS = ("session", "thrift")
# dbt commands that take --project-dir/--profiles-dir.
_PROJECT_COMMANDS = {
    "build",
    "clean",
    "compile",
    "debug",
    "deps",
    "docs",
    "list",
    "ls",
    "parse",
    "retry",
    "run",
    "run-operation",
    "seed",
    "show",
    "snapshot",
    "source",
    "test",
}
_SKIP_COPY = {"target", "logs", "dbt_packages", "generated", ".user.yml", "package-lock.yml"}


def shipped_project_dir() -> Path:
    """The dbt project shipped with the loader: inside an installed wheel (``loader/_data``), or
    next to the package in a checkout (editable install)."""
    import importlib.resources

    try:
        # files() of a data-only (namespace) package is a MultiplexedPath: go through a file in it.
        marker = importlib.resources.files("loader._data.dbt_project").joinpath("dbt_project.yml")
        if marker.is_file():
            return Path(str(marker)).parent
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    return Path(__file__).resolve().parent.parent / "dbt_project"


def project_dir(settings: LoaderSettings) -> Path:
    path = Path(settings.dbt.project_dir) if settings.dbt.project_dir else shipped_project_dir()
    if not (path / "dbt_project.yml").is_file():
        raise ConfigError(
            f"no dbt project at {path} (dbt_project.yml missing)",
            hint="set LOADER_DBT__PROJECT_DIR to the dbt_project directory of the loader",
        )
    return path


def work_dir(settings: LoaderSettings) -> Path:
    """Where the runnable copy lives: one per catalog + namespaces, so runs never mix catalogs."""
    if settings.dbt.work_dir:
        return Path(settings.dbt.work_dir)
    c = settings.catalog
    ident = "|".join(
        (redact(c.uri), c.name, c.history_namespace, c.current_namespace, settings.dbt.analytics_namespace)
    )
    return state_dir() / "dbt" / f"{c.name}-{hashlib.sha1(ident.encode()).hexdigest()[:10]}"


def _write_if_changed(path: Path, text: str) -> None:
    # Unchanged files keep their mtime, so dbt's partial parsing stays valid between runs.
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _sync_static(src: Path, dst: Path) -> set[Path]:
    written: set[Path] = set()
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if any(part in _SKIP_COPY for part in rel.parts) or p.is_dir():
            continue
        target = dst / rel
        if rel.as_posix() == "dbt_project.yml":
            continue  # rewritten with the settings' vars
        data = p.read_bytes()
        if not (target.is_file() and target.read_bytes() == data):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        written.add(target)
    return written


def prepare_project(settings: LoaderSettings, echo: Callable[[str], None] = print) -> Path:
    """Working copy of the project with sources and models generated from the catalog."""
    src, dst = project_dir(settings), work_dir(settings)
    dst.mkdir(parents=True, exist_ok=True)
    _sync_static(src, dst)
    conf = yaml.safe_load((src / "dbt_project.yml").read_text())
    conf.setdefault("vars", {}).update(project_vars(settings))
    _write_if_changed(dst / "dbt_project.yml", yaml.safe_dump(conf, sort_keys=False))
    catalog = read_catalog(settings)
    comments = read_comments(settings.source.conninfo(), [s.table for s in catalog.specs])
    files = render_generated(settings, catalog, comments)
    generated = dst / GENERATED_DIR
    keep = {dst / rel for rel in files}
    if generated.exists():
        for p in sorted(generated.rglob("*"), reverse=True):
            if p.is_file() and p not in keep:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    for rel, text in files.items():
        _write_if_changed(dst / rel, text)
    keyed = sum(1 for s in catalog.specs if s.keyed)
    echo(
        f"dbt: project {dst} with {len(catalog.specs)} history and {len(catalog.current_names)} current "
        f"sources, models for {keyed} keyed tables"
    )
    return dst


def write_sources(settings: LoaderSettings, project: Path) -> list[str]:
    """Write the generated sources and models into ``project`` (for a project kept under version control)."""
    catalog = read_catalog(settings)
    comments = read_comments(settings.source.conninfo(), [s.table for s in catalog.specs])
    files = render_generated(settings, catalog, comments)
    generated = project / GENERATED_DIR
    if generated.exists():
        shutil.rmtree(generated)
    for rel, text in files.items():
        _write_if_changed(project / rel, text)
    return sorted(files)


def profile_env(settings: LoaderSettings, target: str | None = None) -> dict[str, str]:
    """Values of the DBT_LAKEHOUSE_* variables dbt_project/profiles.yml reads."""
    target = target or settings.dbt.target
    if target not in TARGETS:
        raise ConfigError(f"unknown dbt target {target!r}", hint=f"use one of {', '.join(TARGETS)}")
    s = settings.sql_server
    return {
        "DBT_LAKEHOUSE_TARGET": target,
        "DBT_LAKEHOUSE_SCHEMA": settings.dbt.analytics_namespace,
        "DBT_LAKEHOUSE_THREADS": str(settings.dbt.threads),
        "DBT_LAKEHOUSE_THRIFT_HOST": s.host,
        "DBT_LAKEHOUSE_THRIFT_PORT": str(s.port),
        "DBT_LAKEHOUSE_THRIFT_USER": s.user,
        "DBT_LAKEHOUSE_THRIFT_PASSWORD": secret_text(s.client_password) or "",
    }


def _target_in_args(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a in ("--target", "-t") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--target="):
            return a.split("=", 1)[1]
    return None


def dbt_args(args: list[str], project: Path) -> list[str]:
    """The user's dbt arguments plus the working copy's project and profiles directories."""
    out = list(args)
    command = next((a for a in args if not a.startswith("-")), None)
    if command in _PROJECT_COMMANDS:
        if "--project-dir" not in args:
            out += ["--project-dir", str(project)]
        if "--profiles-dir" not in args:
            out += ["--profiles-dir", str(project)]
    return out


def colour_args(args: list[str], stream: Any = None) -> list[str]:
    """``--no-use-colors`` when dbt's output is not a terminal (dbt colours it anyway, and the codes
    land in redirected logs), unless the arguments or ``DBT_USE_COLORS`` choose."""
    stream = sys.stdout if stream is None else stream
    if any(a in ("--use-colors", "--no-use-colors") for a in args) or "DBT_USE_COLORS" in os.environ:
        return []
    isatty = getattr(stream, "isatty", None)
    return [] if isatty is not None and isatty() else ["--no-use-colors"]


def invoke_dbt(settings: LoaderSettings, args: list[str], echo: Callable[[str], None] = print) -> Any:
    """Run dbt in-process; returns dbt's ``dbtRunnerResult`` (``.success``, ``.result``, ``.exception``)."""
    from dbt.cli.main import dbtRunner

    target = _target_in_args(args) or settings.dbt.target
    env = profile_env(settings, target)
    colours = colour_args(args)
    if next((a for a in args if not a.startswith("-")), None) not in _PROJECT_COMMANDS:
        return dbtRunner().invoke([*colours, *args])  # --help, --version, init: no project, no Spark
    if target == "session":
        from loader.spark import get_spark

        # Created before dbt so that dbt-spark's getOrCreate() returns this configured session.
        get_spark(settings, "lakehouse-dbt")
    if target == "thrift":
        from loader.sqlserver import use_verified_tls_in_dbt

        use_verified_tls_in_dbt(settings.sql_server.tls_ca_file)
    project = prepare_project(settings, echo)
    os.environ.update(env)
    return dbtRunner().invoke([*colours, *dbt_args(args, project)])


def run_dbt(settings: LoaderSettings, args: list[str], echo: Callable[[str], None] = print) -> bool:
    """``dbt <args>`` on the loader's catalog; True when dbt succeeded."""
    res = invoke_dbt(settings, args, echo)
    if res.exception is not None:
        echo(f"dbt: {type(res.exception).__name__}: {res.exception}")
    return bool(res.success)
