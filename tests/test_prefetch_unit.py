"""loader.lake.files.prefetched: order kept, the producer's error raised to the consumer, an early
stop ends the producer; RollingParquet cuts files and row groups by bytes and loses no row."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator

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


def test_rolling_parquet_cuts_by_bytes_and_keeps_every_row() -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    done: list[tuple[int, bytes]] = []
    roller = RollingParquet(schema, lambda key, data: done.append((key, data)), file_bytes=20_000, group_bytes=5_000)
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
