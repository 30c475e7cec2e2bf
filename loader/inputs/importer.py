"""``loader import``: convert input files of one format into landing files of the configured slot area.

Bad messages are quarantined and the import goes on (see ``loader.inputs.common``); only an input
that cannot be read at all, or whose transactions collide, fails it, before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from loader.config import LoaderSettings
from loader.errors import ConfigError
from loader.inputs import debezium, pgkafka, wal2json_files
from loader.inputs.common import ImportResult, InputItem, import_changes, parse_pk_option
from loader.landing.store import LandingStore, open_landing, stream_landing_format

Reader = Callable[..., Iterator[InputItem]]  # (paths, keys, ..., max_bytes=)
FORMATS: dict[str, Reader] = {"pgkafka": pgkafka.read, "wal2json": wal2json_files.read, "debezium": debezium.read}


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
    settings: LoaderSettings,
    fmt: str,
    paths: Iterable[str],
    pk: Iterable[str] = (),
    store: LandingStore | None = None,
    *,
    unavailable_placeholder: str = debezium.UNAVAILABLE_VALUE_PLACEHOLDER,
) -> ImportResult:
    """Land the changes of ``paths``; ``unavailable_placeholder`` is Debezium's ``unavailable.value.placeholder``."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown input format {fmt!r}", hint=f"one of {', '.join(sorted(FORMATS))}")
    if not unavailable_placeholder:
        raise ConfigError("the Debezium unavailable-value placeholder cannot be empty")
    files = expand(paths)
    keys = parse_pk_option(pk)
    limit = settings.landing.max_decompressed_mb << 20
    if fmt == "debezium":
        items = debezium.read(files, keys, unavailable_placeholder, max_bytes=limit)
    else:
        items = FORMATS[fmt](files, keys, max_bytes=limit)
    return import_changes(
        items,
        store or open_landing(settings),
        settings.source.max_changes_per_file,
        ImportResult(),
        format=stream_landing_format(settings.source.stream_format),
    )
