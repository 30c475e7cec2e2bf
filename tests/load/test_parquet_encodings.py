"""The loader's Parquet encodings (``lake.files.parquet_encodings``): integer-like columns
DELTA_BINARY_PACKED without a dictionary, the others with one; the values read back are the values
written, whatever the types and nesting; the driver's appends write them (through
``lake.pyiceberg_fixes``), never commit the private writer property, and a table that sets
``loader.write.parquet.delta-integers = false`` gets Arrow's defaults."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
from loader.lake.commits import append_arrow, create_table, default_location
from loader.lake.files import (
    DELTA_INTEGERS_PROPERTY,
    LocalParquet,
    RollingParquet,
    parquet_bytes,
    parquet_encodings,
    table_encodings,
)
from loader.lake.pyiceberg_fixes import WRITER_OPTIONS_PROPERTY
from tests.harness import lake_settings

SCHEMA = pa.schema(
    [
        ("small", pa.int16()),
        ("big", pa.int64()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("clock", pa.time64("us")),
        ("money", pa.decimal128(18, 3)),
        ("wide", pa.decimal128(30, 2)),
        ("name", pa.string()),
        ("flag", pa.bool_()),
        ("ids", pa.list_(pa.int32())),
        ("words", pa.large_list(pa.large_string())),
        ("pair", pa.struct([("n", pa.int64()), ("s", pa.string())])),
        ("attrs", pa.map_(pa.string(), pa.int64())),
    ]
)
DELTA = {
    "small",
    "big",
    "day",
    "at",
    "clock",
    "money",
    "ids.list.element",
    "pair.n",
    "attrs.key_value.value",
}


def _encodings(data: bytes) -> dict[str, set[str]]:
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    out: dict[str, set[str]] = {}
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            chunk = md.row_group(g).column(c)
            out.setdefault(chunk.path_in_schema, set()).update(chunk.encodings)
    return out


def test_the_leaf_columns_are_chosen_by_type() -> None:
    options = parquet_encodings(SCHEMA, decimals_as_integers=True)
    assert set(options["column_encoding"]) == DELTA
    assert set(options["column_encoding"].values()) == {"DELTA_BINARY_PACKED"}
    assert set(options["use_dictionary"]) == {
        "wide",
        "name",
        "flag",
        "words.list.element",
        "pair.s",
        "attrs.key_value.key",
    }
    # Decimals stored as fixed-length bytes cannot be delta-encoded.
    assert "money" not in parquet_encodings(SCHEMA, decimals_as_integers=False)["column_encoding"]
    assert parquet_encodings(pa.schema([("s", pa.string())]), decimals_as_integers=True) == {}


def test_the_merges_writers_take_them_unless_the_table_opts_out(tmp_path: Path) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", pa.string()), ("amount", pa.decimal128(12, 2))])
    rows = pa.table(
        {
            "k": range(5000),
            "v": [f"v{i % 4}" for i in range(5000)],
            "amount": [decimal.Decimal(i) for i in range(5000)],
        },
        schema=schema,
    )
    # Decimals are fixed-length bytes in these writers (no store_decimal_as_integer): dictionary.
    assert set(table_encodings({}, schema)["column_encoding"]) == {"k"}
    assert table_encodings({DELTA_INTEGERS_PROPERTY: "False"}, schema) == {}
    for properties, delta in [({}, {"k"}), ({DELTA_INTEGERS_PROPERTY: "false"}, set())]:
        encodings = table_encodings(properties, schema)
        data = parquet_bytes(rows, encodings)
        assert pq.read_table(io.BytesIO(data)).equals(rows)
        assert {p for p, e in _encodings(data).items() if "DELTA_BINARY_PACKED" in e} == delta
        finished: list[bytes] = []

        def finish(key: int, written: LocalParquet, finished: list[bytes] = finished) -> None:
            finished.append(b"".join(written.chunks()))

        files = RollingParquet(schema, finish, 1 << 30, 1 << 20, spill_dir=str(tmp_path), encodings=encodings)
        for start in range(0, 5000, 1000):
            files.add(start // 1000 % 2, rows.slice(start, 1000))
        files.close()
        assert len(finished) == 2
        assert pa.concat_tables(pq.read_table(io.BytesIO(f)) for f in finished).num_rows == 5000
        for f in finished:
            assert {p for p, e in _encodings(f).items() if "DELTA_BINARY_PACKED" in e} == delta


_ints = st.integers(-(2**63), 2**63 - 1)
_row = st.fixed_dictionaries(
    {
        "small": st.none() | st.integers(-(2**15), 2**15 - 1),
        "big": st.none() | _ints,
        "day": st.none() | st.dates(),
        "at": st.none() | st.datetimes(timezones=st.just(dt.UTC)),
        "clock": st.none() | st.times(),
        "money": st.none()
        | st.decimals(min_value=-(10**15) + 1, max_value=10**15 - 1, places=3, allow_nan=False, allow_infinity=False),
        "wide": st.none()
        | st.decimals(min_value=-(10**27) + 1, max_value=10**27 - 1, places=2, allow_nan=False, allow_infinity=False),
        "name": st.none() | st.text(max_size=8),
        "flag": st.none() | st.booleans(),
        "ids": st.none() | st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=4),
        "words": st.none() | st.lists(st.none() | st.text(max_size=4), max_size=3),
        "pair": st.none() | st.fixed_dictionaries({"n": st.none() | _ints, "s": st.none() | st.text(max_size=4)}),
        "attrs": st.none()
        | st.dictionaries(st.text(max_size=3), st.none() | _ints, max_size=3).map(lambda d: list(d.items())),
    }
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=300), sorted_keys=st.booleans())
def test_values_read_back_are_the_values_written(rows: list[dict[str, Any]], sorted_keys: bool) -> None:
    if sorted_keys:  # history's case: positions that rise
        rows = [dict(r, big=i * 7) for i, r in enumerate(rows)]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        store_decimal_as_integer=True,
        **parquet_encodings(SCHEMA, decimals_as_integers=True),
    )
    assert pq.read_table(io.BytesIO(sink.getvalue())).equals(table)
    for path, encodings in _encodings(sink.getvalue()).items():
        if path in DELTA:
            assert "DELTA_BINARY_PACKED" in encodings and "RLE_DICTIONARY" not in encodings, (path, encodings)
        elif path != "flag":
            assert "DELTA_BINARY_PACKED" not in encodings, (path, encodings)


def test_the_drivers_appends_write_them_and_commit_no_writer_options(
    base_settings: LoaderSettings, tmp_path: Path
) -> None:
    lake = lake_settings(base_settings, tmp_path)
    catalog = open_catalog(lake)
    ns = lake.catalog.history_namespace
    catalog.create_namespace(ns)
    # A name pyiceberg sanitizes in the file ("order-id" is written as order_x2Did).
    columns = [("order-id", "BIGINT"), ("v", "STRING"), ("amount", "DECIMAL(12,2)"), ("ts", "TIMESTAMP")]
    opted_out = {DELTA_INTEGERS_PROPERTY: "false"}
    for name, properties in [("delta", {}), ("plain", opted_out)]:
        location = default_location(lake.catalog.warehouse, ns, name)
        table = create_table(catalog, (ns, name), columns, properties, "ts", ["order-id"], location, None)
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        at = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
        rows = pa.Table.from_pylist(
            [
                {
                    "order-id": i,
                    "v": f"v{i % 3}",
                    "amount": decimal.Decimal(i) / 100,
                    "ts": at + dt.timedelta(seconds=i),
                }
                for i in range(1000)
            ],
            schema=schema_to_pyarrow(table.schema()),
        )
        append_arrow(table, rows, {"loader.test": "1"})
        table = catalog.load_table((ns, name))
        assert WRITER_OPTIONS_PROPERTY not in table.properties
        assert table.scan().to_arrow().sort_by("order-id").equals(rows)
        (path,) = [t.file.file_path for t in table.scan().plan_files()]
        with table.io.new_input(path).open() as stream:
            encodings = _encodings(stream.read())
        delta = {p for p, e in encodings.items() if "DELTA_BINARY_PACKED" in e}
        if name == "delta":
            assert delta == {"order_x2Did", "amount", "ts"}, encodings
            assert "RLE_DICTIONARY" in encodings["v"]
        else:
            assert delta == set(), encodings
