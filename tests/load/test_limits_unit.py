"""Hostile sizes and shapes: a gzip bomb stops at the configured cap with an error naming the file,
and a line nested far past any recursion limit is a reject (or a quarantined message), not a crash.

No Spark: the executors' decoder (``make_decoder``) is called directly on the landing store, the
driver load's reader and the importers likewise.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pytest

from loader.config import LoaderSettings
from loader.errors import DecompressedSizeError, LandingError
from loader.inputs.importer import import_files
from loader.landing.records import ChangeRecord, FileHeader
from loader.landing.store import LandingFile, open_landing
from loader.load.decode import decode_file, make_decoder
from loader.load.driver import _read_text
from loader.lsn import ChangePosition

NAME = LandingFile.name_for(ChangePosition(100, 1), ChangePosition(100, 9), True)
DEEP = b"[" * 100_000 + b"]" * 100_000  # far past Python's (and msgspec's) recursion limits


def settings(tmp: Path, cap_mb: int) -> LoaderSettings:
    return LoaderSettings.model_validate(
        {"landing": {"url": (tmp / "land").as_uri(), "max_decompressed_mb": cap_mb}, "source": {"slot": "s"}}
    )


def landing_file(body: bytes) -> bytes:
    header = FileHeader({"public.t": 1}).to_json().encode() + b"\n"
    return gzip.compress(header) + gzip.compress(body)


def bomb() -> bytes:
    """3 MiB of zeros in a few KiB, behind a valid header."""
    return landing_file(b"\0" * (3 << 20))


def publish(tmp: Path, s: LoaderSettings, data: bytes) -> None:
    spool = tmp / "spool.gz"
    spool.write_bytes(data)
    open_landing(s).publish(spool, NAME)


def decode_with(s: LoaderSettings) -> list[object]:
    """The executors' decoder, as the Spark load runs it, on one landing file."""
    decode = make_decoder(s.model_dump_json())
    return list(decode(iter([pa.record_batch([pa.array([NAME])], names=["landing_file"])])))


def test_a_gzip_bomb_stops_at_the_configured_cap_naming_the_file(tmp_path: Path) -> None:
    small = settings(tmp_path, 1)
    publish(tmp_path, small, bomb())
    store = open_landing(small)
    assert store.max_decompressed == 1 << 20
    with pytest.raises(DecompressedSizeError, match=f"landing file {NAME} decompresses to more than 1 MiB"):
        decode_with(small)
    with pytest.raises(DecompressedSizeError, match=NAME):  # the driver load's reader
        _read_text(NAME, store.open_bytes(NAME), store.max_decompressed)
    with pytest.raises(DecompressedSizeError, match=NAME):  # capture's and snapshot's reader
        list(store.read_lines(NAME))
    # a damaged bomb (cut short: the salvage path) stops at the cap too
    with pytest.raises(DecompressedSizeError, match=NAME):
        list(decode_file(NAME, bomb()[:-20], 100, max_bytes=1 << 20))
    assert issubclass(DecompressedSizeError, LandingError), "a terminal error: the load fails, nothing marked loaded"
    # the default cap (4 GiB) reads it
    assert LoaderSettings().landing.max_decompressed_mb == 4096
    assert len(decode_with(settings(tmp_path, 4096))) == 1


def test_an_import_file_bomb_stops_at_the_configured_cap(tmp_path: Path) -> None:
    path = tmp_path / "topic.json.gz"
    path.write_bytes(gzip.compress(b" " * (3 << 20)))
    with pytest.raises(DecompressedSizeError, match=f"input {path} decompresses to more than 1 MiB"):
        import_files(settings(tmp_path, 1), "pgkafka", [str(path)])
    res = import_files(settings(tmp_path, 8), "pgkafka", [str(path)])  # within the cap: nothing in it
    assert res.messages == 0


def test_a_line_nested_past_every_recursion_limit_is_a_reject(tmp_path: Path) -> None:
    line = b'{"v":1,"op":"I","lsn":100,"seq":1,"x":' + DEEP + b"}"
    with pytest.raises(ValueError, match="nested too deeply"):
        ChangeRecord.from_json(line)
    rows = list(decode_file(NAME, landing_file(line + b"\n" + DEEP + b"\n"), 100))
    rejects = [r for r in rows if r["reject_reason"] is not None]
    assert len(rejects) == 2 and all("nested too deeply" in r["reject_reason"] for r in rejects), rejects
    assert any(r["op"] == "park" and r["src_table"] == "t" for r in rows), "the table that lost changes is parked"


@pytest.mark.parametrize("fmt", ["pgkafka", "debezium", "wal2json"])
def test_an_import_message_nested_past_every_recursion_limit_is_quarantined(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b'{"deep": ' + DEEP + b"}\n" + b'{"deeper": ' + b"[" * 70 + b"]" * 70 + b"}\n")
    res = import_files(settings(tmp_path, 8), fmt, [str(path)])
    assert res.quarantined == 2, res.summary()
    assert any("nested too deeply" in r for r in res.reasons), res.reasons
    assert any("nested more than 64 levels" in r for r in res.reasons), res.reasons
