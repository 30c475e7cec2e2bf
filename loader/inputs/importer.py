"""``loader import``: convert input files of one format into landing files of the configured slot area."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loader.capture.landing import LandingStore, open_landing
from loader.config import LoaderSettings
from loader.errors import ConfigError
from loader.inputs import debezium, pgkafka, wal2json_files
from loader.inputs.common import ImportResult, import_changes, parse_pk_option

FORMATS = {"pgkafka": pgkafka.read, "wal2json": wal2json_files.read, "debezium": debezium.read}


def expand(paths: Iterable[str]) -> list[Path]:
    """Files, or every file under a directory (sorted, hidden files skipped)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(f"input {p} does not exist")
    return out


def import_files(
    settings: LoaderSettings, fmt: str, paths: Iterable[str], pk: Iterable[str] = (), store: LandingStore | None = None
) -> ImportResult:
    if fmt not in FORMATS:
        raise ConfigError(f"unknown input format {fmt!r}", hint=f"one of {', '.join(sorted(FORMATS))}")
    files = expand(paths)
    changes = FORMATS[fmt](files, parse_pk_option(pk))
    return import_changes(changes, store or open_landing(settings), settings.source.max_changes_per_file, ImportResult())
