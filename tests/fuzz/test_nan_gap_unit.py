"""The fuzz oracle's allowance for the known gap nan_infinity (pure): a lake NULL is accepted exactly
where the source holds a numeric/float NaN or +-Infinity, and nowhere else."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from loader import canonical
from loader.capture.capture import Capture, CaptureResult
from loader.lake.types import spark_type
from tests.fuzz.nan_gap import (
    SPECIAL_TEXTS,
    flagged_tables,
    judge_keyed,
    judge_keyless,
    lost,
    parked_for_nan,
    special_texts,
    split_pieces,
)
from tests.fuzz.workload import generate, parse_gaps

N = canonical.NULL_PIECE


def p(text: str) -> str:
    return canonical.piece(text)


def test_gap_columns_are_scalar_numeric_and_floats() -> None:
    for t in ("numeric", "numeric(14,4)", "numeric(10, 2)"):
        assert special_texts(t) == {"NaN", "Infinity", "-Infinity"}
    assert special_texts("real") == SPECIAL_TEXTS["real"]
    assert special_texts("double precision") == SPECIAL_TEXTS["double precision"]
    for t in ("text", "integer", "bigint", "numeric[]", "real[]", "jsonb", "character varying(40)", ""):
        assert special_texts(t) == frozenset(), t


def test_special_texts_are_the_lakes_canonical_texts_of_nan_and_infinities() -> None:
    """The float texts are what loader.canonical makes of NaN and +-Infinity (the source's SQL prints
    the same IEEE bits: float4send / float8send)."""
    specials = [float("nan"), float("inf"), float("-inf")]
    for pg_type, arrow_type in (("real", pa.float32()), ("double precision", pa.float64())):
        texts = canonical.lake_text(pa.array(specials, arrow_type), spark_type(pg_type)).to_pylist()
        assert set(texts) == SPECIAL_TEXTS[pg_type]
        finite = canonical.lake_text(pa.array([0.0, 1.5, -2.25], arrow_type), spark_type(pg_type)).to_pylist()
        assert not set(finite) & SPECIAL_TEXTS[pg_type]


@pytest.mark.parametrize(
    "pieces",
    [
        (p("1"), N, p(""), p("N;"), p("3:x;"), p("a;b:c"), p("NaN"), p("é 🎉")),
        (N,),
        (p(""),),
        (),
    ],
)
def test_row_texts_split_back_into_pieces(pieces: tuple[str, ...]) -> None:
    assert split_pieces("".join(pieces)) == pieces


def test_split_refuses_what_is_not_a_row_text() -> None:
    with pytest.raises(ValueError):
        split_pieces("3:ab;")


TYPES = ["integer", "numeric(14,4)", "double precision", "text"]
NAMES = ["id", "amount", "ratio", "note"]


def test_only_a_null_for_nan_or_infinity_in_a_numeric_or_float_column_is_lost() -> None:
    src = (p("1"), p("NaN"), p("7ff0000000000000"), p("NaN"))
    assert lost(TYPES, src, src) == []
    assert lost(TYPES, src, (p("1"), N, N, p("NaN"))) == [1, 2]
    # NULL where the text column holds the text 'NaN': a difference.
    assert lost(TYPES, src, (p("1"), N, N, N)) is None
    # NULL for a finite value: a difference.
    assert lost(TYPES, (p("1"), p("1.5000"), N, N), (p("1"), N, N, N)) is None
    assert lost(TYPES, (p("1"), N, p("3ff8000000000000"), N), (p("1"), N, N, N)) is None
    # The other way round (the lake holds NaN where the source holds NULL), or another value: differences.
    assert lost(TYPES, (p("1"), N, N, N), (p("1"), p("NaN"), N, N)) is None
    assert lost(TYPES, src, (p("1"), p("Infinity"), N, p("NaN"))) is None
    assert lost(TYPES, src, (p("2"), N, N, p("NaN"))) is None
    assert lost(TYPES, src, src[:3]) is None


def test_keyed_tables_accept_nulls_for_nan_and_nothing_else() -> None:
    source = {
        (p("1"),): (p("1"), p("NaN"), p("fff0000000000000"), p("a")),
        (p("2"),): (p("2"), p("2.0000"), p("NaN"), N),
    }
    lake = {
        (p("1"),): (p("1"), N, N, p("a")),
        (p("2"),): (p("2"), p("2.0000"), p("NaN"), N),  # a snapshot's row keeps NaN
    }
    assert judge_keyed(NAMES, TYPES, source, lake) == ([], 2)

    finite_null = {**lake, (p("2"),): (p("2"), N, p("NaN"), N)}
    problems, _ = judge_keyed(NAMES, TYPES, source, finite_null)
    assert problems == ["key ('1:2;',) differs (source, lakehouse): {'amount': ('2.0000', None)}"]

    other = {**lake, (p("1"),): (p("1"), N, N, p("b"))}
    assert len(judge_keyed(NAMES, TYPES, source, other)[0]) == 1

    missing = {(p("1"),): lake[(p("1"),)]}
    assert judge_keyed(NAMES, TYPES, source, missing)[0] == ["missing key ('1:2;',)"]
    extra = {**lake, (p("3"),): (p("3"), N, N, N)}
    assert judge_keyed(NAMES, TYPES, source, extra)[0] == ["extra key ('1:3;',)"]


KL_TYPES = ["real", "text"]
KL_NAMES = ["r", "t"]


def test_keyless_state_matches_the_source_but_for_nulls_for_nan() -> None:
    nan, inf, ninf = p("NaN"), p("7f800000"), p("ff800000")
    source = [(nan, p("a")), (inf, p("b")), (p("3fc00000"), p("c"))]
    state = [((N, p("a")), 1), ((inf, p("b")), 1), ((p("3fc00000"), p("c")), 1)]
    assert judge_keyless(KL_NAMES, KL_TYPES, source, state) == ([], 1)
    # A finite value NULL in the lake is a difference.
    bad = [((N, p("a")), 1), ((inf, p("b")), 1), ((N, p("c")), 1)]
    problems, _ = judge_keyless(KL_NAMES, KL_TYPES, source, bad)
    assert sorted(problems) == [
        "a row in history's state, not in the source: {'r': None, 't': 'c'}",
        "a row in the source, not in history's state: {'r': '3fc00000', 't': 'c'}",
    ]
    # A row too many, or too few.
    assert judge_keyless(KL_NAMES, KL_TYPES, source, [*state, ((N, p("a")), 1)])[0] == [
        "a row in history's state, not in the source: {'r': None, 't': 'a'}"
    ]
    assert judge_keyless(KL_NAMES, KL_TYPES, source, state[1:])[0] == [
        "a row in the source, not in history's state: {'r': 'NaN', 't': 'a'}"
    ]
    # Duplicates count: two source rows need two lake rows.
    assert judge_keyless(KL_NAMES, KL_TYPES, [source[0], source[0]], [((N, p("a")), 2)]) == ([], 2)
    assert len(judge_keyless(KL_NAMES, KL_TYPES, [source[0], source[0]], [((N, p("a")), 1)])[0]) == 1
    assert judge_keyless(KL_NAMES, KL_TYPES, [(ninf, p("d"))], [((N, p("d")), 1)]) == ([], 1)


def test_keyless_old_images_that_lost_nan_take_away_the_row_a_snapshot_stored() -> None:
    """A snapshot stored the row with NaN; an update's old image (wal2json) has NULL there."""
    nan = p("NaN")
    stored = (nan, p("a"))
    image = (N, p("a"))
    updated = (N, p("z"))  # the update's new row, NaN lost again
    state = [(stored, 1), (image, -1), (updated, 1)]
    assert judge_keyless(KL_NAMES, KL_TYPES, [(nan, p("z"))], state) == ([], 2)
    # An image that takes away a row that never was: a difference.
    state = [((p("3fc00000"), p("a")), 1), (image, -1), (updated, 1)]
    problems, _ = judge_keyless(KL_NAMES, KL_TYPES, [(nan, p("z"))], state)
    assert "a row history's state takes away but never held: {'r': None, 't': 'a'}" in problems


def test_keyless_matching_is_not_greedy() -> None:
    """Which stored row a NULL image takes away is decided by what the source still holds: the
    matching must find the one assignment that works (a greedy one takes the first row)."""
    nan, inf = p("NaN"), p("7f800000")
    state = [((nan, p("a")), 1), ((inf, p("a")), 1), ((N, p("a")), -1)]
    assert judge_keyless(KL_NAMES, KL_TYPES, [(inf, p("a"))], state) == ([], 1)
    assert judge_keyless(KL_NAMES, KL_TYPES, [(nan, p("a"))], state) == ([], 1)
    types = ["real", "real"]
    names = ["x", "y"]
    # The source row, matched first, takes the first stored row it fits; the image fits only that
    # one, so the source row must move to the other (an augmenting path).
    state = [((N, nan), 1), ((nan, N), 1), ((N, nan), -1)]
    assert judge_keyless(names, types, [(nan, nan)], state) == ([], 1)
    # Two source rows, two stored rows: one assignment works.
    source = [(nan, nan), (nan, inf)]
    lake = [((N, nan), 1), ((N, N), 1)]
    assert judge_keyless(names, types, source, lake) == ([], 3)


def test_the_flag_is_capture_s_note() -> None:
    """The runner finds the tables capture flags in its notes and in its summary (a process's output)."""
    facts = {
        "public.t1": SimpleNamespace(columns={"a": SimpleNamespace(name="a", type="numeric(14,4)")}),
        "fz.other.t2": SimpleNamespace(columns={"b": SimpleNamespace(name="b", type="double precision")}),
        "public.t3": SimpleNamespace(columns={"c": SimpleNamespace(name="c", type="text")}),
    }
    result = CaptureResult(tables={"public.t1", "fz.other.t2", "public.t3"})
    Capture._note_lossy_specials(SimpleNamespace(facts=facts), result)  # type: ignore[arg-type]
    assert flagged_tables("\n".join(result.notes)) == {"public.t1", "fz.other.t2"}
    assert flagged_tables(result.summary()) == {"public.t1", "fz.other.t2"}
    kept = CaptureResult(tables=set(facts), numeric_special_values=True)
    Capture._note_lossy_specials(SimpleNamespace(facts=facts), kept)  # type: ignore[arg-type]
    assert flagged_tables(kept.summary()) == set()


def test_the_workload_says_which_gaps_it_drew() -> None:
    assert generate(3).gaps == frozenset()
    assert generate(3, gaps=parse_gaps("all")).gaps == {"nan_infinity"}


def test_a_park_is_accepted_only_for_nan_in_numeric_p_s_columns() -> None:
    """A decimal cannot hold NaN: a resync that reads one quarantines the row and parks the table."""
    park = "1 changes quarantined in the rejects table (first at LSN 0/1A: column c_num (numeric(14,4)): value NaN does not fit); resync"
    nan = "column c_num (numeric(14,4)): value NaN does not fit"
    assert parked_for_nan(park, [nan, f"{nan}; column d (numeric(10, 2)): value NaN does not fit"])
    assert not parked_for_nan(park, [])  # no reject behind it
    assert not parked_for_nan("renamed to public.x: waits for a resync", [nan])  # another park
    for other in (
        "column c_num (numeric(14,4)): value 1e30 does not fit",  # a finite value
        "column c_f (real): value NaN does not fit",
        "column c_a (integer[]): value {{1}} does not fit",
        f"{nan}; column c_a (integer[]): value {{{{1}}}} does not fit",
    ):
        assert not parked_for_nan(park, [nan, other]), other
