"""The load's pure parts: type mapping, evolution plans, and decoding (damaged) landing files."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.lake.types import never_toasted, quote_ident, spark_type
from loader.landing.records import ChangeRecord, Column
from loader.landing.store import LandingWriter, LocalLandingStore
from loader.load.decode import decode_file, gunzip_salvage
from loader.load.evolution import plan_evolution, retired_name


@pytest.mark.parametrize(
    ("pg", "sql", "text"),
    [
        ("numeric(12,4)", "DECIMAL(12,4)", False),
        ("numeric(50,10)", "STRING", True),
        ("numeric", "STRING", True),
        ("timestamp(3) with time zone", "TIMESTAMP", False),
        ("timestamp(6) without time zone", "TIMESTAMP_NTZ", False),
        ("integer[]", "ARRAY<INT>", False),
        ("character varying(20)[]", "ARRAY<STRING>", False),
        ("numeric(6,2)[]", "ARRAY<DECIMAL(6,2)>", False),
        ("numeric[]", "STRING", True),
        ("timestamp with time zone[]", "STRING", True),
        ("jsonb[]", "STRING", True),
        ("bytea", "BINARY", False),
        ("mood", "STRING", True),
        ("interval", "STRING", True),
        ("money", "STRING", True),
        ("time without time zone", "STRING", True),
        ("uuid", "STRING", True),
    ],
)
def test_type_mapping(pg: str, sql: str, text: bool) -> None:
    st = spark_type(pg)
    assert (st.sql, st.lossless_text) == (sql, text)


def test_fixed_length_types_are_never_toasted() -> None:
    assert never_toasted("integer") and never_toasted("timestamp(3) with time zone") and never_toasted("uuid")
    assert not never_toasted("text") and not never_toasted("numeric(10,2)") and not never_toasted("integer[]")
    assert quote_ident("we`ird") == "`we``ird`"


def test_evolution_adds_widens_and_retires_incompatible_retypes() -> None:
    plan = plan_evolution(
        "public.t",
        {"a": "integer", "d": "numeric(10,2)", "x": "date"},
        [("a", "bigint"), ("d", "numeric(12,2)"), ("n", "text"), ("x", "integer")],
    )
    assert plan.widen == [("a", "bigint"), ("d", "numeric(12,2)")] and plan.add == [("n", "text")]
    assert plan.retire == [("x", "integer")]
    assert plan_evolution(
        "public.t", {"a": "bigint"}, [("a", "integer")]
    ).empty  # narrowed: the wider type still holds it
    assert plan_evolution("public.t", {"a": "numeric(10,2)"}, [("a", "numeric(10,4)")]).retire == [
        ("a", "numeric(10,4)")
    ]
    assert retired_name("amount", 2) == "pg__r2_amount"


# --- decoding landing files, damaged ones included ---------------------------------------------


def landing_bytes(tmp_path: Path, recs: list[ChangeRecord]) -> tuple[str, bytes]:
    store = LocalLandingStore(tmp_path / "land")
    w = LandingWriter(store, max_changes=10_000)
    for r in recs:
        w.write(r)
    w.close_file()
    f = store.files()[0]
    return f.name, (tmp_path / "land" / f.name).read_bytes()


def workload(n: int = 300) -> list[ChangeRecord]:
    recs = []
    for s in range(1, n + 1):
        table = "a" if s % 3 else "b"
        recs.append(
            ChangeRecord(
                "I",
                500,
                s,
                9,
                "2026-01-01 00:00:00+00",
                "public",
                table,
                columns=[Column("id", "integer", str(s)), Column("v", "text", "x" * (s % 50))],
                pk=["id"],
            )
        )
    recs.append(ChangeRecord("C", 500, n + 1, 9, "2026-01-01 00:00:00+00"))
    return recs


def test_an_intact_file_decodes_every_record_and_no_header_row(tmp_path: Path) -> None:
    name, data = landing_bytes(tmp_path, workload())
    rows = list(decode_file(name, data, 500))
    assert len(rows) == 300 and all(r["reject_reason"] is None for r in rows)
    assert {r["op"] for r in rows} == {"insert"}


def test_a_truncated_file_keeps_every_complete_line_and_parks_exactly_the_tables_that_lost_changes(
    tmp_path: Path,
) -> None:
    name, data = landing_bytes(tmp_path, workload(3000))
    for cut in (len(data) // 2, len(data) * 9 // 10, 2000):
        rows = list(decode_file(name, data[:cut], 500))
        good = [r for r in rows if r["op"] == "insert"]
        parks = [r for r in rows if r["op"] == "park"]
        rejects = [r for r in rows if r["reject_reason"]]
        assert [r["seq"] for r in good] == list(range(1, len(good) + 1)), "a readable prefix, in order"
        assert len(good) > 0
        assert len(rejects) <= 1 and all("cut off" in r["reject_reason"] for r in rejects)
        lost_tables = {r["src_table"] for r in parks}
        assert lost_tables and lost_tables <= {"a", "b"}
        assert all(r["seq"] == 0 and r["commit_lsn"] == 500 and "damaged" in r["note"] for r in parks)


def test_a_damaged_file_parks_a_table_whose_schema_name_holds_a_dot_by_its_records_split(tmp_path: Path) -> None:
    """The header names tables ``schema.table``; for ``"app.v2".t`` the records read say where the
    name splits (a park of table ``"v2.t"`` in schema ``app`` would leave the real one unparked).
    A table all of whose records are lost leaves the split unknown: every table is parked."""
    recs = []
    for s in range(1, 3001):
        schema, table = ("app.v2", "t") if s <= 2900 else ("x.y", "z")
        recs.append(
            ChangeRecord(
                "I", 500, s, 9, "2026-01-01 00:00:00+00", schema, table, columns=[Column("id", "integer", str(s))]
            )
        )
    recs.append(ChangeRecord("C", 500, 3001, 9, "2026-01-01 00:00:00+00"))
    name, data = landing_bytes(tmp_path, recs)
    parks = [r for r in decode_file(name, data[: len(data) // 2], 500) if r["op"] == "park"]
    assert len(parks) == 1 and parks[0]["src_table"] is None and "every table" in parks[0]["note"], parks
    only_first = [*recs[:2900], ChangeRecord("C", 500, 2901, 9, "2026-01-01 00:00:00+00")]
    name, data = landing_bytes(tmp_path / "first", only_first)
    parks = [r for r in decode_file(name, data[: len(data) // 2], 500) if r["op"] == "park"]
    assert [(r["src_schema"], r["src_table"]) for r in parks] == [("app.v2", "t")], parks


def test_corrupt_gzip_data_is_damage_not_an_exception(tmp_path: Path) -> None:
    name, data = landing_bytes(tmp_path, workload(3000))
    broken = bytearray(data)
    for i in range(len(broken) // 2, len(broken) // 2 + 64):
        broken[i] ^= 0xFF
    rows = list(decode_file(name, bytes(broken), 500))
    assert any(r["op"] == "park" for r in rows)
    assert sum(1 for r in rows if r["op"] == "insert") > 0


def test_a_file_without_a_readable_header_parks_every_table(tmp_path: Path) -> None:
    _, data = landing_bytes(tmp_path, workload())
    rows = list(decode_file("x.jsonl.gz", data[:10], 500))
    parks = [r for r in rows if r["op"] == "park"]
    assert len(parks) == 1 and parks[0]["src_table"] is None and "every table" in parks[0]["note"]


def test_gunzip_salvage_reads_concatenated_members_and_reports_truncation() -> None:
    data = gzip.compress(b"a\n") + gzip.compress(b"b\nc\n")
    assert gunzip_salvage(data) == (b"a\nb\nc\n", None)
    text, damage = gunzip_salvage(data[:-5])
    assert text.startswith(b"a\n") and damage and "cut off" in damage


def hostile_file(lines: list[bytes]) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        gz.write(b"\n".join(lines) + b"\n")
    return buf.getvalue()


def test_bad_lines_become_rejects_with_their_raw_text_and_table_when_known() -> None:
    good = b'{"v":1,"op":"I","lsn":9,"seq":1,"xid":1,"ts":"2026-01-01 00:00:00+00","change_lsn":1,"schema":"s","table":"t","columns":[["id","integer","1"]],"pk":["id"]}'
    lines = [
        good,
        b'{"v":1,"op":"I","lsn":9,"seq":2,"xid":1,"ts":"2026-01-01 00:00:00+00","schema":"s","table":"t","columns":[["id","integer","\xff"]]}',
        b"not json at all",
        b'{"v":1,"op":"I","lsn":9,"seq":3,"xid":1,"ts":"2026-01-01 00:00:00+00","schema":"s","table":"u","columns":[["a","int","1"],["a","int","2"]]}',
        b'{"v":1,"op":"D","lsn":9,"seq":4,"xid":1,"ts":"2026-01-01 00:00:00+00","schema":"s","table":"u","columns":[]}',
        b'{"v":1,"op":"X","lsn":9,"seq":5,"xid":1,"ts":"2026-01-01 00:00:00+00","schema":"s","table":"w","columns":[],"reason":"not UTF-8","raw":"caf\\\\xe9"}',
    ]
    rows = list(decode_file("f.jsonl.gz", hostile_file(lines), 9))
    assert rows[0]["reject_reason"] is None
    # "not json at all" names no table and the file has no header: every table may have lost it.
    assert rows[-1]["op"] == "park" and rows[-1]["src_table"] is None and "every table" in rows[-1]["note"]
    rejects = rows[1:-1]
    assert [r["line"] for r in rejects] == [2, 3, 4, 5, 6]
    assert all(r["reject_reason"] and r["raw"] for r in rejects)
    assert "not UTF-8" in rejects[0]["reject_reason"] and "\\xff" in rejects[0]["raw"]
    assert "twice" in rejects[2]["reject_reason"] and rejects[2]["src_table"] == "u"
    assert "old key" in rejects[3]["reject_reason"]
    assert rejects[4]["src_table"] == "w" and "quarantined before landing" in rejects[4]["reject_reason"]


def test_a_header_says_which_table_an_unreadable_line_belonged_to(tmp_path: Path) -> None:
    name, data = landing_bytes(tmp_path, workload(30))
    text = gzip.decompress(data).split(b"\n")
    text[5] = b'{"v":1,"op":"I","lsn":500,"se'  # line 6, which held seq 5 (line 1 is the header)
    lost_table = "b" if 5 % 3 == 0 else "a"  # the workload puts seq s in table b when s % 3 == 0
    rows = list(decode_file(name, gzip.compress(b"\n".join(text)), 500))
    parks = [r for r in rows if r["op"] == "park"]
    assert [(p["src_table"], p["seq"]) for p in parks] == [(lost_table, 0)]


def test_a_file_continuing_a_transaction_waits_for_the_earlier_part(tmp_path: Path) -> None:
    from loader.config import LoaderSettings
    from loader.load.history import HistoryLoad

    store = LocalLandingStore(tmp_path / "land")
    w = LandingWriter(store, max_changes=4)
    for s in range(1, 7):  # one transaction split over two files, then a second transaction
        w.write(
            ChangeRecord("I", 100, s, 9, "2026-01-01 00:00:00+00", "public", "t", columns=[Column("id", "int", str(s))])
        )
    w.write(ChangeRecord("C", 100, 7, 9, "2026-01-01 00:00:00+00"))
    w.close_file()
    w.write(ChangeRecord("I", 200, 1, 9, "2026-01-01 00:00:00+00", "public", "t", columns=[Column("id", "int", "9")]))
    w.write(ChangeRecord("C", 200, 2, 9, "2026-01-01 00:00:00+00"))
    w.close_file()
    first, second, third = store.files()
    load = HistoryLoad(None, LoaderSettings(), store)  # type: ignore[arg-type]  # no Spark: the ledger is given
    batch, _ = load.pending_files(known_loaded=set())
    assert [f.name for f in batch] == [first.name, second.name, third.name] and load.gap is None
    (tmp_path / "land" / first.name).rename(tmp_path / first.name)  # the earlier part goes missing
    batch, waiting = load.pending_files(known_loaded=set())
    assert batch == [] and waiting == 0 and load.gap is not None and second.name in load.gap
    batch, _ = HistoryLoad(None, LoaderSettings(), store).pending_files(known_loaded={first.name})  # type: ignore[arg-type]
    assert [f.name for f in batch] == [second.name, third.name]


_NAMES = ["id", "a", "b", "select", "x" * 64]


@st.composite
def _records(draw: st.DrawFn) -> list[ChangeRecord]:
    """Records whose shapes (operation, table, names, types, old key, primary key) repeat and
    differ by one detail, valid or not, and commit times that are or are not timestamps."""
    out = []
    for seq in range(1, draw(st.integers(1, 25)) + 1):
        names = draw(st.lists(st.sampled_from(_NAMES), max_size=4))
        key = draw(st.lists(st.sampled_from(_NAMES), max_size=2))
        out.append(
            ChangeRecord(
                draw(st.sampled_from("IUDRSPX")),
                500,
                seq,
                9,
                draw(st.sampled_from(["2026-01-01 00:00:00+00", "2026-01-01 00:00:00.5+00", "yesterday"])),
                draw(st.sampled_from(["public", ""])),
                draw(st.sampled_from(["t", "u"])),
                columns=[Column(n, draw(st.sampled_from(["integer", "text"])), str(i)) for i, n in enumerate(names)],
                identity=[Column(n, "integer", "1") for n in key],
                pk=draw(st.lists(st.sampled_from(_NAMES[:3]), max_size=2)),
            )
        )
    return out


@given(_records())
@settings(max_examples=150, deadline=None)
def test_verdicts_checked_once_per_shape_equal_verdicts_checked_afresh(records: list[ChangeRecord]) -> None:
    """The decoder checks names, keys and commit times once per shape; a verdict (and the name
    lists of a row) must be exactly what checking that record alone, with nothing cached, gives."""
    import loader.load.decode as decode

    def lines(recs: list[ChangeRecord]) -> bytes:
        return gzip.compress(b"".join(r.to_json_bytes() + b"\n" for r in recs))

    together = list(decode_file("f.jsonl.gz", lines(records), 500))
    alone = []
    for rec in records:
        decode._SHAPES.clear()
        decode._TS_SEEN.clear()
        alone += [r for r in decode_file("f.jsonl.gz", lines([rec]), 500) if r["op"] != "park"]
    together = [r for r in together if r["op"] != "park"]
    assert [{**r, "line": 0} for r in together] == [{**r, "line": 0} for r in alone]


_LIST_A, _LIST_B = ["id", "a"], ["b"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([_LIST_A, _LIST_B, None, "fresh"]),
            st.one_of(st.none(), st.text(max_size=5)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        ),
        max_size=40,
    )
)
@settings(max_examples=100, deadline=None)
def test_rows_to_batch_equals_arrow_row_by_row(specs: list[tuple[Any, str | None, int | None]]) -> None:
    """Shared name lists converted once and repeated, and the transposition in C, give exactly the
    batch Arrow builds row by row."""
    import pyarrow as pa

    from loader.load.decode import _arrow_schema, rows_to_batch

    schema = _arrow_schema()
    rows = []
    for names, text, number in specs:
        row: dict[str, Any] = {f.name: None for f in schema}
        listed = ["fresh", text or ""] if names == "fresh" else names
        row.update(col_names=listed, pk=listed, col_values=[text], ts=text, commit_lsn=number, src_table=text)
        rows.append(row)
    assert rows_to_batch(rows, schema).equals(pa.RecordBatch.from_pylist(rows, schema=schema))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 2),
            st.lists(st.integers(0, 1 << 40), max_size=5),
            st.lists(st.integers(0, 4), max_size=3),
        ),
        min_size=0,
        max_size=60,
    )
)
def test_rows_share_a_shape_number_exactly_when_their_codes_are_equal(rows: list[Any]) -> None:
    """The driver load's shape numbers (loader.load.columns.shape_ids), against tuples compared
    in Python; codes large enough to force the renumbering the mixed radix needs."""
    import numpy as np

    from loader.load.columns import first_rows, shape_ids

    def lists(which: int) -> tuple[Any, Any]:
        lengths = [len(r[which]) for r in rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.array([x for r in rows for x in r[which]], np.int64)
        return offsets, items

    ids, count = shape_ids(
        [np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64)], [lists(2), lists(3)]
    )
    assert count == len({(a, b, tuple(c), tuple(d)) for a, b, c, d in rows})
    assert sorted(set(ids.tolist())) == list(range(count))
    # Numbered in order of first appearance, which first_rows reads back.
    assert list(dict.fromkeys(ids.tolist())) == list(range(count))
    assert first_rows(ids).tolist() == [ids.tolist().index(k) for k in range(count)]
    for i, ri in enumerate(rows):
        for j, rj in enumerate(rows):
            assert (ids[i] == ids[j]) == (
                (ri[0], ri[1], tuple(ri[2]), tuple(ri[3])) == (rj[0], rj[1], tuple(rj[2]), tuple(rj[3]))
            )


@settings(max_examples=100, deadline=None)
@given(
    value=st.one_of(st.text(max_size=40), st.just([]), st.integers(-(2**63), 2**63 - 1)),
    n=st.integers(0, 3000),
)
def test_constant_arrays_are_the_value_repeated(value: Any, n: int) -> None:
    """The driver load's constant columns (operation, landing file, commit time, empty lists) built
    from buffers equal the value repeated, whatever the text (multi-byte, empty) and count."""
    import pyarrow as pa

    from loader.load.driver import constant_array

    t = pa.string() if isinstance(value, str) else pa.list_(pa.string()) if value == [] else pa.int64()
    got = constant_array(value, t, n)
    got.validate(full=True)
    assert got.equals(pa.array([value] * n, t))


# --- the plain-form test (values.plain) against the regex it stands for ------------------------

_NUMBER_TEXT = st.text(alphabet="0123456789-.+eE x\u0663\n", max_size=8)
_PLAIN_FORMS = ["INT", "BIGINT", "DECIMAL(18,2)", "DECIMAL(38,10)", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "DOUBLE"]


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.one_of(st.none(), _NUMBER_TEXT, st.from_regex(r"-?[0-9]{1,5}(\.[0-9]{1,3})?", fullmatch=True))),
    sql=st.sampled_from(_PLAIN_FORMS),
    sliced=st.integers(0, 3),
)
def test_plain_is_exactly_the_plain_forms_regex(texts: list[str | None], sql: str, sliced: int) -> None:
    """The fast tests only ever accept what the regex accepts, and the regex decides the rest: the
    answer is RE2's for every text (a slice too: offsets not starting at 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from loader.lake.types import plain_text
    from loader.load.values import plain

    values = pa.array(["5", "x", None, *texts], pa.string()).slice(min(sliced, len(texts)))
    want = pc.fill_null(pc.match_substring_regex(values, plain_text(sql)), True).to_pylist()
    assert plain(values, sql).tolist() == want


# --- dates and timestamps typed in C (values._plain_temporal) against RE2 and Arrow's cast ---------

_TEMPORAL_TEXT = st.one_of(
    st.text(alphabet="0123456789-: .+", max_size=30),
    st.builds(
        lambda y, mo, d, h, mi, s, frac, tail: f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}{frac}{tail}",
        st.integers(0, 9999),
        st.integers(0, 13),
        st.integers(0, 32),
        st.integers(0, 24),
        st.integers(0, 60),
        st.integers(0, 60),
        st.sampled_from(["", ".5", ".123456", ".1234567", ".", ".000001"]),
        st.sampled_from(["", "+00", "+01", "-00", "+00:00", " BC", "+0"]),
    ),
    st.builds(
        lambda y, mo, d, tail: f"{y:04d}-{mo:02d}-{d:02d}{tail}",
        st.integers(0, 9999),
        st.integers(0, 13),
        st.integers(0, 32),
        st.sampled_from(["", " BC", " ", "0"]),
    ),
    st.sampled_from(["infinity", "-infinity", "2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29 00:00:00+00"]),
)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.one_of(st.none(), _TEMPORAL_TEXT), max_size=30),
    sql=st.sampled_from(["DATE", "TIMESTAMP", "TIMESTAMP_NTZ"]),
    start=st.integers(0, 3),
)
def test_compiled_temporal_typing_equals_the_regex_and_casts(texts: list[str | None], sql: str, start: int) -> None:
    """The compiled parser (loader/load/_typing.c) gives every date and timestamp text exactly
    what the RE2 plain-form test, Arrow's cast and temporal_number give it: the same value, or
    the same Misfit; on a sliced array too (an offset into the buffers)."""
    import pyarrow as pa

    pg_type = {"DATE": "date", "TIMESTAMP": "timestamp with time zone", "TIMESTAMP_NTZ": "timestamp"}[sql]
    _compiled_and_not_alike(pa.array(["2020-01-01"] * start + texts, pa.string()).slice(start), pg_type)


def _compiled_and_not_alike(array: Any, pg_type: str) -> Any:
    """``array`` typed as ``pg_type`` with the compiled parser and without it: the same values,
    or the same Misfit (naming the same text). Returns the typing without it (a Misfit's text)."""
    from loader.load import values

    if values._typing_c is None:
        pytest.skip("the compiled parser is not built here")

    def typed() -> Any:
        try:
            return values.typed(array, pg_type, "t.c")
        except values.Misfit as exc:
            return str(exc)

    fast = typed()
    built, values._typing_c = values._typing_c, None
    try:
        slow = typed()
    finally:
        values._typing_c = built
    if isinstance(slow, str):
        assert fast == slow, array
    else:
        assert not isinstance(fast, str), (array, fast)
        fast.validate(full=True)
        assert fast.equals(slow), (array, fast, slow)
    return slow


_NUMERIC_TEXT = st.one_of(
    st.text(alphabet="0123456789-.", max_size=14),
    st.builds(
        lambda sign, whole, frac: f"{sign}{whole}{frac}",
        st.sampled_from(["", "-", "+"]),
        st.text(alphabet="0123456789", min_size=0, max_size=40),
        st.one_of(st.just(""), st.text(alphabet="0123456789", max_size=12).map(lambda f: "." + f)),
    ),
    st.sampled_from(["0", "-0", "-0.00", "00012.50", "NaN", "Infinity", "1e5", " 1", "1.", ".5"]),
)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.one_of(st.none(), _NUMERIC_TEXT), max_size=25),
    pg_type=st.sampled_from(["numeric(14,4)", "numeric(38,10)", "numeric(5,0)", "numeric(38,38)", "numeric(18,2)"]),
    start=st.integers(0, 3),
)
def test_compiled_decimal_typing_equals_the_regex_and_cast(texts: list[str | None], pg_type: str, start: int) -> None:
    """Numerics typed by the compiled parser (loader/load/_typing.c) where every text is plain and
    fits are exactly what the plain-form test and Arrow's cast give; anything else is left to them
    (the same Misfit), on sliced arrays and with nulls."""
    import pyarrow as pa

    from loader.load import values

    array = pa.array(["1"] * start + texts, pa.string()).slice(start)
    slow = _compiled_and_not_alike(array, pg_type)
    storage = values.arrow_type(values.spark_type(pg_type).sql)
    # The compiled path answers exactly the all-plain, in-range columns (None otherwise).
    assert (values._plain_decimal(array, storage) is not None) <= (not isinstance(slow, str))


def test_follow_modes_loaded_set_forgets_files_retired_before_the_landing_area() -> None:
    """The set of loaded files follow mode keeps stays the landing area's size: names of files
    ending before the oldest listed file's commit are dropped once the set holds twice as many
    names as the landing area (retired files, which nothing asks about again)."""
    from loader.landing.store import LandingFile
    from loader.load.history import forget_retired, ledger_bound
    from loader.lsn import ChangePosition

    def file(i: int) -> LandingFile:
        name = LandingFile.name_for(ChangePosition(100 * i, 1), ChangePosition(100 * i + 50, 3), True, "tables")
        parsed = LandingFile.parse(name)
        assert parsed is not None
        return parsed

    every = [file(i) for i in range(1, 30_001)]
    listed = every[-1_000:]
    assert ledger_bound(listed) == ChangePosition(100 * 29_001, 0)
    known = {f.name for f in every[:-10]}
    few = set(list(known)[:12_000])
    forget_retired(few, listed)  # under twice the listing plus 10,000: left alone
    assert len(few) == 12_000
    forget_retired(known, listed)
    assert known == {f.name for f in listed[:-10]}
    # A name not in the landing layout is kept (nothing is known of where it ends).
    odd = {"manual-import.jsonl.gz", *(f.name for f in every)}
    forget_retired(odd, listed)
    assert odd == {"manual-import.jsonl.gz", *(f.name for f in listed)}
