"""The driver's appends write one-partition rows without pyiceberg's split (``lake.commits.data_files``):
the files must be the ones pyiceberg's own ``_dataframe_to_data_files`` writes for the same rows,
partition values, counts, column statistics and rows alike, on a day-partitioned history table and
a bucketed current table, whether the rows fall in one partition or several."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
from loader.lake.commits import create_table, data_files, default_location
from tests.harness import lake_settings

EPOCH = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)

_rows = st.lists(
    st.tuples(
        st.integers(-(2**31), 2**31 - 1),
        st.one_of(st.none(), st.text(max_size=12)),
        # Seconds from a fixed instant: within one day, or spread over a few (and a missing one).
        st.one_of(st.none(), st.integers(0, 86_399), st.integers(-3 * 86_400, 3 * 86_400)),
    ),
    min_size=1,
    max_size=200,
)


def _arrow(table: Any, rows: list[tuple[Any, ...]]) -> pa.Table:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    ts = [None if s is None else EPOCH + dt.timedelta(seconds=s) for _, _, s in rows]
    columns = [pa.array([k for k, _, _ in rows], pa.int32()), pa.array([v for _, v, _ in rows], pa.string())]
    columns.append(pa.array(ts, pa.timestamp("us", tz="UTC")))
    return pa.Table.from_arrays(columns, schema=schema_to_pyarrow(table.schema()))


def _described(table: Any, files: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for f in files:
        with table.io.new_input(f.file_path).open() as stream:
            rows = pq.read_table(stream).to_pylist()
        out.append(
            (
                tuple(f.partition),
                f.record_count,
                dict(f.value_counts),
                dict(f.null_value_counts),
                dict(f.lower_bounds),
                dict(f.upper_bounds),
                rows,
            )
        )
        table.io.delete(f.file_path)
    return sorted(out, key=repr)


def test_one_partition_files_are_the_files_pyiceberg_writes(base_settings: LoaderSettings, tmp_path: Path) -> None:
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    lake = lake_settings(base_settings, tmp_path)
    catalog = open_catalog(lake)
    ns = lake.catalog.history_namespace
    catalog.create_namespace(ns)
    columns = [("k", "INT"), ("v", "STRING"), ("ts", "TIMESTAMP")]
    tables = [
        create_table(
            catalog, (ns, name), columns, {}, day_of, ["k"], default_location(lake.catalog.warehouse, ns, name), bucket
        )
        for name, day_of, bucket in [("by_day", "ts", None), ("by_bucket", None, ("k", 4))]
    ]

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(rows=_rows, table=st.sampled_from(tables))
    def check(rows: list[tuple[Any, ...]], table: Any) -> None:
        arrow = _arrow(table, rows)
        write_uuid = uuid.uuid4()
        ours = list(data_files(table.metadata, arrow, table.io, write_uuid, itertools.count(0)))
        theirs = list(_dataframe_to_data_files(table.metadata, arrow, table.io, uuid.uuid4(), itertools.count(0)))
        assert _described(table, ours) == _described(table, theirs)
        assert sum(f.record_count for f in ours) == len(rows)

    check()
