"""loader.lake.files.prefetched: order kept, the producer's error raised to the consumer, an early
stop ends the producer; RollingParquet cuts files and row groups by bytes and loses no row."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader.lake.files import RollingParquet, prefetched


def test_order_and_every_part() -> None:
    assert list(prefetched(iter(range(100)), depth=2)) == list(range(100))


def test_the_producers_error_reaches_the_consumer_after_the_parts_before_it() -> None:
    def parts() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("file 3 damaged")

    got = []
    with pytest.raises(ValueError, match="file 3 damaged"):
        for p in prefetched(parts(), depth=1):
            got.append(p)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_stops_the_producer() -> None:
    produced: list[int] = []

    def parts() -> Iterator[int]:
        for i in range(1000):
            produced.append(i)
            yield i

    for p in prefetched(parts(), depth=2):
        if p == 3:
            break
    time.sleep(0.2)
    assert len(produced) < 10
    assert not [t for t in threading.enumerate() if t.name == "prefetch"]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_producer_holds_at_most_depth_parts_beyond_the_consumers(depth: int) -> None:
    """The memory bound the load's read-ahead relies on: while the consumer holds a part, at most
    ``depth`` more have been produced (or are being produced), however slow the consumer."""
    produced: list[int] = []

    def parts() -> Iterator[int]:
        for i in range(20):
            produced.append(i)
            yield i

    for p in prefetched(parts(), depth=depth):
        time.sleep(0.05)  # a slow consumer: the producer runs as far ahead as it may
        assert len(produced) <= p + 1 + depth, (p, produced)
    assert produced == list(range(20))


def test_rolling_parquet_cuts_by_bytes_and_keeps_every_row() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    done: list[tuple[int, bytes]] = []
    roller = RollingParquet(
        schema, lambda key, data: done.append((key, b"".join(data.chunks()))), file_bytes=20_000, group_bytes=5_000
    )
    for i in range(40):
        part = pa.table(
            {"k": pa.array(range(i * 100, i * 100 + 100), pa.int64()), "v": ["x" * 10] * 100}, schema=schema
        )
        roller.add(i % 3, part)
    roller.close()
    assert roller.files == len(done) > 3
    rows = {key: [] for key in range(3)}
    for key, data in done:
        f = pq.ParquetFile(io.BytesIO(data))
        assert f.metadata.num_row_groups >= 1
        rows[key] += f.read().column("k").to_pylist()
    for key in range(3):
        assert rows[key] == [k for i in range(40) if i % 3 == key for k in range(i * 100, i * 100 + 100)]


def test_rolling_parquet_bounds_the_rows_it_buffers_over_all_keys_and_keeps_no_local_file() -> None:
    """Many keys, each under its row-group size: the rows buffered for all of them together stay
    within ``buffer_bytes`` (the fullest key is written as a row group first); the files live on
    local disk until finished, and nothing is left there after close, or after a failure."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    done: dict[int, list[bytes]] = {}

    def finish(key: int, data: Any) -> None:
        assert os.path.exists(data.path) and data.size == os.path.getsize(data.path)
        assert data.footer().num_rows > 0
        done.setdefault(key, []).append(b"".join(data.chunks()))

    roller = RollingParquet(schema, finish, file_bytes=1 << 30, group_bytes=1 << 30, buffer_bytes=30_000)
    spill = str(roller._dir)
    most = 0
    for i in range(200):
        part = pa.table({"k": pa.array(range(i * 50, i * 50 + 50), pa.int64()), "v": ["y" * 20] * 50}, schema=schema)
        roller.add(i % 16, part)
        buffered = sum(f.buffered_bytes for f in roller._open.values())
        assert buffered <= 30_000
        most = max(most, buffered)
        assert len(os.listdir(spill)) == len(roller._open)
    roller.close()
    assert most > 10_000 and not os.path.exists(spill)
    for key in range(16):
        (data,) = done[key]
        f = pq.ParquetFile(io.BytesIO(data))
        assert f.metadata.num_row_groups > 1
        assert f.read().column("k").to_pylist() == [
            k for i in range(200) if i % 16 == key for k in range(i * 50, i * 50 + 50)
        ]
    failing = RollingParquet(schema, finish, file_bytes=1 << 30, group_bytes=1 << 30)
    failing.add(1, pa.table({"k": [1], "v": ["z"]}, schema=schema))
    spill = str(failing._dir)
    failing.discard()
    assert not os.path.exists(spill)


def test_rolling_parquet_buffers_a_slice_without_the_table_it_was_cut_from() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    big = pa.table({"k": pa.array(range(200_000), pa.int64()), "v": ["w" * 30] * 200_000}, schema=schema)
    done: list[Any] = []
    roller = RollingParquet(schema, lambda key, data: done.append(pq.read_table(data.path)), 1 << 30, 1 << 30)
    for key in range(4):
        roller.add(key, big.slice(key * 10, 10))
    held = [t for f in roller._open.values() for t in f.buffered]
    assert len(held) == 4 and all(t.get_total_buffer_size() < 10_000 for t in held)
    roller.close()
    assert [t.column("k").to_pylist() for t in done] == [list(range(k * 10, k * 10 + 10)) for k in range(4)]


def test_spill_directories_of_killed_merges_are_removed_by_the_next_build(tmp_path: Any) -> None:
    import subprocess
    import sys

    from loader.lake.files import SPILL_PREFIX
    from loader.spills import remove_orphans

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{SPILL_PREFIX}{int(gone.stdout)}-abc"
    alive = tmp_path / f"{SPILL_PREFIX}1-def"  # init never exits
    mine = tmp_path / f"{SPILL_PREFIX}{os.getpid()}-ghi"
    other = tmp_path / "loader-rounds-123-x"
    for d in (dead, alive, mine, other):
        d.mkdir()
        (d / "000001.parquet").write_bytes(b"rows")
    schema = pa.schema([("k", pa.int64())])
    roller = RollingParquet(schema, lambda key, data: None, 1 << 30, 1 << 30, spill_dir=str(tmp_path))
    assert not dead.exists() and alive.exists() and mine.exists() and other.exists()
    assert str(roller._dir).startswith(str(tmp_path / f"{SPILL_PREFIX}{os.getpid()}-"))
    roller.close()
    assert not roller._dir.exists()
    remove_orphans(SPILL_PREFIX, tmp_path)
    assert alive.exists()
