"""LSNs, change positions and their SQL spelling (pure)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.lsn import (
    END_OF_TRANSACTION,
    ChangePosition,
    arrow_positions_after,
    arrow_positions_at_or_before,
    format_lsn,
    parse_lsn,
    parse_position,
    position_after_sql,
    position_before_sql,
    positions_after,
)

positions = st.tuples(st.integers(1, (1 << 63) - 1), st.integers(0, 10**9)).map(lambda t: ChangePosition(*t))


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trip(v: int) -> None:
    assert parse_lsn(format_lsn(v)) == v


@given(positions, positions)
def test_position_tokens_sort_like_positions(a: ChangePosition, b: ChangePosition) -> None:
    assert (a.token() < b.token()) == (a < b)
    assert ChangePosition.from_token(a.token()) == a


@given(positions, positions)
def test_just_before_is_the_greatest_position_below(a: ChangePosition, b: ChangePosition) -> None:
    before = a.just_before()
    assert before < a
    if b < a:
        assert b <= before


def test_end_of_transaction_sorts_after_its_changes_and_before_the_next() -> None:
    end = ChangePosition.end_of(100)
    assert ChangePosition(100, 5_000_000) < end < ChangePosition(101, 0)
    assert end.seq == END_OF_TRANSACTION and ChangePosition.from_token(end.token()) == end


def test_parse_lsn_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_lsn("16-B374")


@settings(deadline=None)  # the first example imports pyarrow.compute
@given(positions, positions)
def test_position_sql_agrees_with_tuple_order(row: ChangePosition, bound: ChangePosition) -> None:
    env = {"l": row.commit_lsn, "s": row.seq}

    def ev(expr: str) -> bool:
        return bool(
            eval(
                expr.replace("OR", "or")
                .replace("AND", "and")
                .replace("=", "==")
                .replace("<==", "<=")
                .replace(">==", ">="),
                {},
                env,
            )
        )

    assert ev(position_after_sql("l", "s", bound)) == (row > bound)
    assert ev(position_after_sql("l", "s", bound, inclusive=True)) == (row >= bound)
    assert ev(position_before_sql("l", "s", bound)) == (row <= bound)
    assert ev(position_before_sql("l", "s", bound, inclusive=False)) == (row < bound)
    # numpy's spelling (the load kernel's): the same order
    lsn, seq = np.array([row[0]], np.int64), np.array([row[1]], np.int64)
    assert bool(positions_after(lsn, seq, ChangePosition(*bound))[0]) == (row > bound)
    assert bool(positions_after(lsn, seq, ChangePosition(*bound), inclusive=True)[0]) == (row >= bound)
    # Arrow's (the merge's and verify's), against one position and against columns of positions
    a_lsn, a_seq = pa.array([row[0]], pa.int64()), pa.array([row[1]], pa.int64())
    for position in (ChangePosition(*bound), (pa.array([bound[0]], pa.int64()), pa.array([bound[1]], pa.int64()))):
        assert arrow_positions_after(a_lsn, a_seq, position).to_pylist() == [row > bound]
        assert arrow_positions_after(a_lsn, a_seq, position, inclusive=True).to_pylist() == [row >= bound]
        assert arrow_positions_at_or_before(a_lsn, a_seq, position).to_pylist() == [row <= bound]


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("0/1F12F38#2", ChangePosition(0x1F12F38, 2)),  # what status prints
        ("16/B374D848", ChangePosition(0x16B374D848, 0)),  # PostgreSQL's LSN
        ("0000000001EDBE78.0000000010", ChangePosition(0x1EDBE78, 10)),  # a token (file names, old JSON)
        ("32357240", ChangePosition(32357240, 0)),  # pg_lsn as history tables hold it
        (" 0/1F12F38#2 ", ChangePosition(0x1F12F38, 2)),
    ],
)
def test_every_spelling_of_a_position_parses_to_the_same_thing(text: str, position: ChangePosition) -> None:
    assert parse_position(text) == position
    assert parse_position(str(position)) == position  # the shown form round-trips


@pytest.mark.parametrize("text", ["", "yesterday", "0/XYZ", "1/2#", "#3", "1/2#-1", str(1 << 64)])
def test_what_is_not_a_position_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match="X/Y#seq"):
        parse_position(text)


def test_json_output_shows_positions_as_status_does() -> None:
    from loader.cli import _plain

    token = ChangePosition(0x1EDBE78, 10).token()
    assert _plain({"merged_through": token, "table": "public.t"}) == {
        "merged_through": "0/1EDBE78#10",
        "table": "public.t",
    }
