"""The load kernel's row rules (loader.load.kernel) on change rows built by hand: lake names,
typing with misfits as data, unchanged TOAST, the old key's JSON."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.load.decode import CHANGE_ROW_DDL
from loader.load.kernel import history_batch, history_ddl, json_string
from loader.load.sql import LINE, RAW, REASON, HistoryColumn
from loader.lsn import ChangePosition

_LIST = pa.list_(pa.string())
_TYPES = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64()}


def _changes(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Change rows (CHANGE_ROW_DDL) with defaults for what a row leaves out."""
    fields = []
    for item in CHANGE_ROW_DDL.split(", "):
        name, sql = item.strip().split(" ", 1)
        fields.append(pa.field(name, _LIST if sql.startswith("ARRAY") else _TYPES[sql]))
    schema = pa.schema(fields)
    base = {"landing_file": "f", "line": 1, "op": "update", "commit_lsn": 10, "seq": 1, "change_lsn": 9, "xid": 7}
    base |= {"ts": "2024-03-01 10:00:00+00", "src_schema": "public", "src_table": "t"}
    base |= {"col_names": [], "col_types": [], "col_values": [], "key_names": [], "key_values": [], "pk": []}
    return pa.RecordBatch.from_pylist([base | r for r in rows], schema=schema)


def test_values_are_typed_under_lake_names_and_misfits_become_reasons() -> None:
    cols = [HistoryColumn("pg_lsn", "integer"), HistoryColumn("note", "text"), HistoryColumn("d", "date")]
    out = history_batch(
        _changes(
            [
                {"op": "insert", "col_names": ["pg_lsn", "note", "d"], "col_values": ["5", "x", "2024-02-29"]},
                {"op": "insert", "col_names": ["pg_lsn", "note", "d"], "col_values": ["five", "y", "2024-02-30"]},
            ]
        ),
        cols,
        {},
    )
    assert out.schema.names[:3] == ["pg__pg_lsn", "note", "d"]
    assert history_ddl(cols).startswith("`pg__pg_lsn` INT, `note` STRING, `d` DATE, pg_lsn BIGINT")
    assert out.column("pg__pg_lsn").to_pylist() == [5, None]
    assert out.column(REASON).to_pylist() == [
        "",
        "column pg_lsn (integer): value five does not fit; column d (date): value 2024-02-30 does not fit",
    ]
    raw = out.column(RAW).to_pylist()
    assert raw[0] is None and raw[1].startswith('{"op":"insert","commit_lsn":10,') and '"five"' in raw[1]
    assert out.column(LINE).to_pylist() == [1, 1]
    assert str(out.column("pg_txn_timestamp").type) == "timestamp[us, tz=UTC]"


def test_absent_columns_are_unsent_varlena_columns_of_updates_not_dropped_ones() -> None:
    cols = [HistoryColumn("id", "integer"), HistoryColumn("body", "text"), HistoryColumn("gone", "jsonb")]
    rows = [
        {"col_names": ["id"], "col_values": ["1"], "commit_lsn": 5, "seq": 1},  # before the drop
        {"col_names": ["id"], "col_values": ["1"], "commit_lsn": 5, "seq": 2},  # at it
        {"op": "insert", "col_names": ["id"], "col_values": ["1"]},
        {"col_names": ["id", "body", "gone"], "col_values": ["1", None, None]},
    ]
    out = history_batch(_changes(rows), cols, {"gone": ChangePosition(5, 2)})
    assert out.column("pg_absent_columns").to_pylist() == [["body", "gone"], ["body"], [], []]
    assert out.column("body").to_pylist() == [None, None, None, None]


def test_old_keys_are_json_of_lake_names_escaped_as_spark_writes_them() -> None:
    cols = [HistoryColumn("id", "text")]
    rows = [
        {"key_names": ["id", "pg_seq"], "key_values": ['a"b\\c\n\x01/é', None]},
        {"key_names": [], "key_values": []},
        {"op": "delete", "key_names": ["id"], "key_values": ["k"]},
    ]
    out = history_batch(_changes(rows), cols, {})
    assert out.column("pg_old_key").to_pylist() == [
        '{"id":"a\\"b\\\\c\\n\\u0001/é","pg__pg_seq":null}',
        None,
        '{"id":"k"}',
    ]
    assert json_string("\x1f\t") == '"\\u001F\\t"'


def test_typing_distinct_texts_once_gives_what_typing_each_gives() -> None:
    from loader.load.values import typed, typed_distinct

    texts = pa.array(
        ["2024-03-01 10:00:00+00", None, "infinity", "2024-03-01 10:00:00+00", "0044-03-15 10:00:00+01 BC"]
    )
    for pg_type in ("timestamp with time zone", "text"):
        assert typed_distinct(texts, pg_type, "t.c").equals(typed(texts, pg_type, "t.c"))


_TEXTS = {
    "integer": ["1", "-7", "x", "99999999999", None, "+3"],
    "date": ["2024-02-29", "2024-02-30", "infinity", "0044-03-15 BC", None, "tomorrow"],
    "numeric(5,2)": ["1.50", "NaN", "123456.00", "-0.01", None],
    "integer[]": ["{1,2}", "{{1}}", "{1,x}", "{}", None],
}


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(_TEXTS)).flatmap(
        lambda t: st.tuples(st.just(t), st.lists(st.sampled_from(_TEXTS[t]), max_size=40))
    )
)
def test_misfits_as_data_are_the_values_typing_one_by_one_refuses(case: tuple[str, list[str | None]]) -> None:
    from loader.load.values import Misfit, typed, typed_or_misfits

    def numbers(values: pa.Array) -> list[Any]:  # dates as day numbers (infinity is past Python's)
        return (values.cast(pa.int32()) if pa.types.is_date32(values.type) else values).to_pylist()

    pg_type, texts = case
    got, misfit = typed_or_misfits(pa.array(texts, pa.string()), pg_type)
    expected, refused = [], []
    for text in texts:
        try:
            expected.append(numbers(typed(pa.array([text], pa.string()), pg_type, "t.c"))[0])
            refused.append(False)
        except Misfit:
            expected.append(None)
            refused.append(True)
    assert numbers(got) == expected
    assert (misfit.to_pylist() if misfit is not None else [False] * len(texts)) == refused


# Every control character, quotes, backslashes, '/', DEL and beyond-ASCII text.
_JSON_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(_JSON_TEXT, min_size=1, max_size=4, unique=True),
    rows=st.lists(st.tuples(st.booleans(), st.lists(st.none() | _JSON_TEXT, min_size=4, max_size=4)), max_size=40),
    every=st.booleans(),
    skip=st.integers(0, 3),
)
def test_the_compiled_old_keys_are_the_arrow_joined_ones(
    names: list[str], rows: list[tuple[bool, list[str | None]]], every: bool, skip: int
) -> None:
    """``keyed_objects`` (one pass in C) writes what ``json_objects`` (Arrow's joins, checked
    against Spark's ``to_json`` in tests/load/test_kernel.py) writes for the keyed rows, NULL for
    the others; on sliced columns (a segment's rows start inside their buffers) too."""
    import numpy as np

    from loader.load.kernel import json_objects, keyed_objects
    from loader.load.values import _typing_c
    from loader.names import lake_column

    assert _typing_c is not None, "the compiled typing module is built wherever the tests run"
    padded = [(True, [None, "x", "y", "z"])] * skip + rows
    columns = [pa.array([r[1][j] for r in padded], pa.string()).slice(skip) for j in range(len(names))]
    keyed = None if every else np.array([k for k, _ in rows], bool)
    prefixes = [("{" if j == 0 else ",") + json_string(lake_column(n)) + ":" for j, n in enumerate(names)]
    got = keyed_objects(prefixes, columns, keyed)
    assert got is not None
    got.validate(full=True)
    keys = pa.array([names] * len(rows), pa.list_(pa.string()))
    values = pa.array([[r[1][j] for j in range(len(names))] for r in rows], pa.list_(pa.string()))
    want = json_objects(keys, values).to_pylist()
    assert got.to_pylist() == [w if every or k else None for w, (k, _) in zip(want, rows, strict=True)]
