"""The driver merge's Arrow reduction, without a JVM: newest event per key, old keys parsed."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.merge.driver import NotPlainIncrement, _newest_per_key, _old_keys

events_st = st.lists(
    st.tuples(
        st.integers(0, 5),  # key part 1
        st.sampled_from(["a", "b", "ü"]),  # key part 2
        st.integers(0, 50),  # lsn
        st.integers(1, 4),  # seq
        st.integers(0, 1),  # sub
    ),
    max_size=60,
)


@settings(deadline=None)  # the machine is shared: timings say nothing here
@given(events_st)
def test_newest_per_key_is_the_last_event_of_each_key(rows: list[tuple[int, str, int, int, int]]) -> None:
    # Positions are unique per event in history; (lsn, seq, sub) may repeat only across keys.
    seen: set[tuple[int, str, int, int, int]] = set()
    rows = [r for r in rows if not (r in seen or seen.add(r))]
    table = pa.table(
        {
            "k1": pa.array([r[0] for r in rows], pa.int64()),
            "k2": pa.array([r[1] for r in rows], pa.string()),
            "pg_lsn": pa.array([r[2] for r in rows], pa.int64()),
            "pg_seq": pa.array([r[3] for r in rows], pa.int64()),
            "sub": pa.array([r[4] for r in rows], pa.int8()),
            "idx": pa.array(range(len(rows)), pa.int64()),
        }
    )
    got = _newest_per_key(table, ["k1", "k2"]).to_pylist()
    want: dict[tuple[int, str], tuple[int, int, int]] = {}
    for k1, k2, lsn, seq, sub in rows:
        want[(k1, k2)] = max(want.get((k1, k2), (-1, -1, -1)), (lsn, seq, sub))
    assert {(r["k1"], r["k2"]): (r["pg_lsn"], r["pg_seq"], r["sub"]) for r in got} == want
    assert len(got) == len(want)


def test_old_keys_are_typed_like_the_key_columns() -> None:
    texts = [json.dumps({"id": "7", "name": "x\ny", "other": "1"}), json.dumps({"id": "-3", "name": "ü"})]
    out = _old_keys(
        texts, ["id", "name"], {"id": "integer", "name": "text"}, {"id": pa.int32(), "name": pa.large_string()}
    )
    assert out["id"].to_pylist() == [7, -3] and out["id"].type == pa.int32()
    assert out["name"].to_pylist() == ["x\ny", "ü"] and out["name"].type == pa.large_string()


def test_old_keys_are_typed_by_the_loads_rule() -> None:
    """The load's typing (loader.load.values.typed) decides what an old key's text is: a text it
    refuses for a key column's rows is refused for the old key too (Arrow's own cast takes '0x7'
    as 7, a text PostgreSQL never prints for an integer)."""
    for text in (" 7", "+7", "7 ", "0x7"):
        with pytest.raises(NotPlainIncrement):
            _old_keys([json.dumps({"id": text})], ["id"], {"id": "bigint"}, {"id": pa.int64()})
    ok = _old_keys([json.dumps({"id": "-9223372036854775808"})], ["id"], {"id": "int8"}, {"id": pa.int64()})
    assert ok["id"].to_pylist() == [-(2**63)]


@pytest.mark.parametrize(
    "texts",
    [[None], [json.dumps({"id": None})], [json.dumps({"other": "1"})], [json.dumps({"id": "1.5"})]],
)
def test_old_keys_that_do_not_parse_send_the_increment_to_spark(texts: list[str | None]) -> None:
    with pytest.raises(NotPlainIncrement):
        _old_keys(texts, ["id"], {"id": "bigint"}, {"id": pa.int64()})
