"""Pure logic: no JVM, no database."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader.capture.capture import TableFilter
from loader.capture.landing import LandingFile, LandingWriter, LocalLandingStore
from loader.capture.records import ChangeRecord, Column
from loader.capture.wal2json import Wal2JsonDecoder
from loader.errors import SchemaEvolutionError
from loader.load.evolution import plan_evolution
from loader.load.typemap import quote_ident, spark_type
from loader.lsn import ChangePosition, format_lsn, parse_lsn


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trip(v: int) -> None:
    assert parse_lsn(format_lsn(v)) == v


@given(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, 10**9)), st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, 10**9)))
def test_position_tokens_sort_like_positions(a: tuple[int, int], b: tuple[int, int]) -> None:
    pa, pb = ChangePosition(*a), ChangePosition(*b)
    assert (pa.token() < pb.token()) == (pa < pb)
    assert ChangePosition.from_token(pa.token()) == pa


def test_parse_lsn_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_lsn("16-B374")


ROWS = [
    '{"action":"B","xid":727,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/1928650","nextlsn":"0/1928680"}',
    '{"action":"I","xid":727,"lsn":"0/1928490","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":1},'
    '{"name":"n","type":"numeric(38,20)","value":123456789012345678.12345678901234567890},{"name":"b","type":"boolean","value":true},'
    '{"name":"x","type":"text","value":null}],"pk":[{"name":"id","type":"integer"}]}',
    '{"action":"U","xid":727,"lsn":"0/1928500","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":2}],'
    '"identity":[{"name":"id","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}',
    '{"action":"C","xid":727,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/1928650","nextlsn":"0/1928680"}',
]


def test_wal2json_decoder_keeps_exact_text_and_order() -> None:
    d = Wal2JsonDecoder()
    recs = [r for row in ROWS for r in d.feed(row)]
    assert [r.op for r in recs] == ["I", "U", "C"]
    assert [r.seq for r in recs] == [1, 2, 3]
    assert all(r.commit_lsn == parse_lsn("0/1928650") for r in recs)
    ins = recs[0]
    assert ins.columns == [
        Column("id", "integer", "1"),
        Column("n", "numeric(38,20)", "123456789012345678.12345678901234567890"),
        Column("b", "boolean", "true"),
        Column("x", "text", None),
    ]
    assert recs[1].identity == [Column("id", "integer", "1")]
    assert d.last_commit_end_lsn == parse_lsn("0/1928680") and not d.in_transaction
    # The landing JSON form round-trips.
    for r in recs:
        assert ChangeRecord.from_json(r.to_json()) == r


def test_landing_record_rejects_non_text_values() -> None:
    with pytest.raises(ValueError):
        ChangeRecord.from_json(json.dumps({"v": 1, "op": "I", "lsn": 1, "seq": 1, "xid": 1, "ts": "x", "columns": [["a", "int", 5]]}))


def test_landing_writer_splits_and_names_by_range(tmp_path: Path) -> None:
    store = LocalLandingStore(tmp_path / "land")
    w = LandingWriter(store, max_changes=3)
    recs = [ChangeRecord("I", 100, s, 9, "ts", "public", "t", columns=[Column("a", "int", str(s))]) for s in range(1, 8)]
    recs.append(ChangeRecord("C", 100, 8, 9, "ts"))
    for r in recs:
        w.write(r)
    w.close_file()
    files = store.files()
    assert [(f.first.seq, f.last.seq, f.complete) for f in files] == [(1, 3, False), (4, 6, False), (7, 8, True)]
    assert store.landed_position() == ChangePosition(100, 8)
    lines = gzip.decompress((tmp_path / "land" / files[0].name).read_bytes()).decode().splitlines()
    assert [ChangeRecord.from_json(l).seq for l in lines] == [1, 2, 3]
    assert LandingFile.parse("not-a-landing-file.txt") is None
    assert not list((tmp_path / "land").glob(".*")), "no temp files left behind"


def test_table_filter() -> None:
    f = TableFilter(["public.*", "audit.events"], ["public.tmp_*"])
    assert f("public.orders") and f("audit.events")
    assert not f("public.tmp_x") and not f("audit.other")


def test_type_mapping_basics() -> None:
    assert spark_type("numeric(18,2)").sql == "DECIMAL(18,2)"
    assert spark_type("numeric(60,2)").lossless_text
    assert spark_type("timestamp with time zone").sql == "TIMESTAMP"
    assert spark_type("timestamp without time zone").sql == "TIMESTAMP_NTZ"
    assert spark_type("uuid").lossless_text and spark_type("jsonb").lossless_text
    assert quote_ident("we`ird") == "`we``ird`"


def test_evolution_plans_add_widen_and_refuses_narrowing_conversions() -> None:
    plan = plan_evolution("public.t", {"a": "integer", "b": "text"}, [("a", "bigint"), ("b", "text"), ("c", "date")])
    assert plan.add == [("c", "date")] and plan.widen == [("a", "bigint")]
    with pytest.raises(SchemaEvolutionError) as e:
        plan_evolution("public.t", {"a": "date"}, [("a", "integer")])
    assert "public.t" in str(e.value) and "'a'" in str(e.value)
