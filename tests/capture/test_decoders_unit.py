"""Capture's pure parts: the wal2json decoder, landing records, the landing writer, table filters."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loader.capture.source_filter import TableFilter
from loader.capture.wal2json import Wal2JsonDecoder
from loader.errors import DecodeError
from loader.landing.records import ChangeRecord, Column, FileHeader, parse_header
from loader.landing.store import LandingFile, LandingWriter, LocalLandingStore
from loader.lsn import ChangePosition, parse_lsn

BEGIN = '{"action":"B","xid":727,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/1928650","nextlsn":"0/1928680"}'
COMMIT = '{"action":"C","xid":727,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/1928650","nextlsn":"0/1928680"}'
INSERT = (
    '{"action":"I","xid":727,"lsn":"0/1928490","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":1},'
    '{"name":"n","type":"numeric(38,20)","value":123456789012345678.12345678901234567890},{"name":"b","type":"boolean","value":true},'
    '{"name":"x","type":"text","value":null}],"pk":[{"name":"id","type":"integer"}]}'
)
UPDATE = (
    '{"action":"U","xid":727,"lsn":"0/1928500","schema":"public","table":"t","columns":[{"name":"id","type":"integer","value":2}],'
    '"identity":[{"name":"id","type":"integer","value":1}],"pk":[{"name":"id","type":"integer"}]}'
)


def feed_all(d: Wal2JsonDecoder, rows: list[str | bytes]) -> list[ChangeRecord]:
    return [r for row in rows for r in d.feed(row)]


def test_wal2json_decoder_keeps_exact_text_and_order() -> None:
    d = Wal2JsonDecoder()
    recs = feed_all(d, [BEGIN, INSERT, UPDATE, COMMIT])
    assert [r.op for r in recs] == ["I", "U", "C"]
    assert [r.seq for r in recs] == [1, 2, 3]
    assert all(r.commit_lsn == parse_lsn("0/1928650") for r in recs)
    assert recs[0].columns == [
        Column("id", "integer", "1"),
        Column("n", "numeric(38,20)", "123456789012345678.12345678901234567890"),
        Column("b", "boolean", "true"),
        Column("x", "text", None),
    ]
    assert recs[1].identity == [Column("id", "integer", "1")]
    assert d.confirm_lsn == parse_lsn("0/1928680") and not d.in_transaction
    for r in recs:  # the landing JSON form round-trips
        assert ChangeRecord.from_json(r.to_json()) == r


def test_messages_inside_and_outside_transactions_never_stop_the_stream() -> None:
    d = Wal2JsonDecoder()
    outside = '{"action":"M","lsn":"0/1928948","transactional":false,"prefix":"hb","content":"nontx"}'
    inside = '{"action":"M","lsn":"0/1928980","transactional":true,"prefix":"sig","content":"tx"}'
    assert feed_all(d, [outside]) == []
    # Confirming past a non-transactional message is what stops every peek returning it again.
    assert d.confirm_lsn == parse_lsn("0/1928948") + 1
    recs = feed_all(d, [BEGIN, inside, INSERT, COMMIT])
    assert [r.op for r in recs] == ["I", "C"] and d.messages_skipped == 2


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (
            b'{"action":"I","schema":"public","table":"t","columns":[{"name":"v","type":"text","value":"caf\xe9"}]}',
            "not UTF-8",
        ),
        ('{"action":"I","schema":"public","table":"t","columns":[', "unreadable"),
        ('{"action":"Q","schema":"public","table":"t"}', "unknown wal2json action"),
        ('{"action":"U","table":"t"}', "not understood"),
    ],
)
def test_undecodable_rows_inside_a_transaction_are_quarantined_in_place(row: str | bytes, why: str) -> None:
    d = Wal2JsonDecoder()
    recs = feed_all(d, [BEGIN, INSERT, row, UPDATE, COMMIT])
    assert [r.op for r in recs] == ["I", "X", "U", "C"]
    assert [r.seq for r in recs] == [1, 2, 3, 4]
    x = recs[1]
    assert why in x.reason and x.raw and x.commit_lsn == parse_lsn("0/1928650")
    assert ChangeRecord.from_json(x.to_json()) == x


def test_a_change_after_an_unreadable_begin_stops_capture_instead_of_losing_the_transaction() -> None:
    d = Wal2JsonDecoder()
    assert feed_all(d, ['{"action":"B","xid":7,"lsn":']) == []
    assert d.quarantined_outside_transaction == 1
    with pytest.raises(DecodeError):
        feed_all(d, [INSERT])
    assert d.confirm_lsn is None


def test_landing_records_validate_their_fields() -> None:
    base = {"v": 1, "op": "I", "lsn": 1, "seq": 1, "xid": 1, "ts": "x", "schema": "s", "table": "t"}
    for bad in (
        {**base, "columns": [["a", "int", 5]]},
        {**base, "columns": [["a", "int"]]},
        {**base, "lsn": "1"},
        {**base, "lsn": True},
        {**base, "op": "Z"},
        {**base, "v": 2},
        {**base, "pk": "id"},
        {**base, "raw": 5},
    ):
        with pytest.raises(ValueError):
            ChangeRecord.from_json(json.dumps(bad))
    with pytest.raises(ValueError):
        ChangeRecord.from_json("[1, 2]")


def test_control_records_round_trip() -> None:
    for rec in (
        ChangeRecord("S", 10, 1, 0, "ts", "public", "t", reason="column added with a default"),
        ChangeRecord("P", 10, 2, 0, "ts", "public", "t", reason="replica identity lost"),
        ChangeRecord("X", 10, 3, 0, "ts", "public", "t", reason="not UTF-8", raw="caf\\xe9"),
    ):
        assert ChangeRecord.from_json(rec.to_json()) == rec


def test_landing_writer_splits_names_by_range_and_heads_each_file(tmp_path: Path) -> None:
    store = LocalLandingStore(tmp_path / "land")
    w = LandingWriter(store, max_changes=3)
    recs = [
        ChangeRecord("I", 100, s, 9, "ts", "public", "t" if s % 2 else "u", columns=[Column("a", "int", str(s))])
        for s in range(1, 8)
    ]
    recs.append(ChangeRecord("C", 100, 8, 9, "ts"))
    for r in recs:
        w.write(r)
    w.close_file()
    files = store.files()
    assert [(f.first.seq, f.last.seq, f.complete) for f in files] == [(1, 3, False), (4, 6, False), (7, 8, True)]
    assert store.landed_position() == ChangePosition(100, 8)
    lines = gzip.decompress((tmp_path / "land" / files[0].name).read_bytes()).decode().splitlines()
    assert parse_header(lines[0]) == FileHeader({"public.t": 2, "public.u": 1})
    assert [ChangeRecord.from_json(line).seq for line in lines[1:]] == [1, 2, 3]
    assert [r.seq for r in store.read_records(files[0].name)] == [1, 2, 3]
    assert LandingFile.parse("not-a-landing-file.txt") is None
    assert not list((tmp_path / "land").glob(".*")), "no temp files left behind"


def test_landing_files_are_byte_identical_when_written_again(tmp_path: Path) -> None:
    recs = [
        ChangeRecord("I", 100, 1, 9, "ts", "public", "t", columns=[Column("a", "int", "1")]),
        ChangeRecord("C", 100, 2, 9, "ts"),
    ]
    out = []
    for d in ("a", "b"):
        store = LocalLandingStore(tmp_path / d)
        w = LandingWriter(store, max_changes=10)
        for r in recs:
            w.write(r)
        w.close_file()
        out.append((tmp_path / d / store.files()[0].name).read_bytes())
    assert out[0] == out[1]


def test_local_landing_files_and_directories_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Landing files hold the source's personal data: 0600 files in 0700 directories, spool and
    temporary files included, even under a umask that would leave them world-readable."""
    import os
    import stat

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    seen: dict[str, int] = {}

    class Observed(LocalLandingStore):  # the real store, noting the mode of what it is handed
        def publish(self, local_path: Path, name: str) -> None:
            seen[name] = mode(local_path)
            super().publish(local_path, name)

    old = os.umask(0)
    try:
        spool = tmp_path / "spool"
        spool.mkdir()
        store = Observed(tmp_path / "root" / "land")
        w = LandingWriter(store, max_changes=10, spool_dir=spool)
        w.write(ChangeRecord("I", 100, 1, 9, "ts", "public", "t", columns=[Column("a", "text", "secret")]))
        assert [mode(p) for p in spool.iterdir()] == [0o600], "the spool file"
        w.write(ChangeRecord("C", 100, 2, 9, "ts"))
        name = w.close_file()
        store.write_state("x.state.json", {"a": 1})
        wide = tmp_path / "wide"
        wide.mkdir(mode=0o777)
        LocalLandingStore(wide).write_state("y.state.json", {})
    finally:
        os.umask(old)
    assert name is not None and seen == {name: 0o600, "_state/x.state.json": 0o600}
    land = tmp_path / "root" / "land"
    assert mode(land / name) == 0o600
    assert mode(land / "_state" / "x.state.json") == 0o600
    assert mode(tmp_path / "root") == mode(land) == mode(land / "_state") == 0o700
    assert mode(wide) == mode(wide / "_state") == 0o700, "a directory of its own found wider is narrowed"
    assert mode(wide / "_state" / "y.state.json") == 0o600


def test_table_filter() -> None:
    f = TableFilter(["public.*", "audit.events"], ["public.tmp_*"])
    assert f("public.orders") and f("audit.events")
    assert not f("public.tmp_x") and not f("audit.other")


# --- the msgspec fast paths decide exactly as the field-by-field decoders ------------------------
_JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from(["0", "-0", "1.50", "1e+20", "-1.5E-7", "12345678901234567890.123456789"]),  # number tokens
    st.text(max_size=8),
    st.just({"a": [1, 2.50]}),
)
_TYPES = st.sampled_from(["integer", "bigint", "double precision", "real", "numeric(38,20)", "text", "bytea", "jsonb"])


def _token(value: object) -> str:
    """A wal2json value as JSON text (number tokens written raw, as the plugin prints them)."""
    if isinstance(value, str) and value[:1] in "-0123456789" and value not in ("-",) and value[-1:].isdigit():
        try:
            float(value)
            return value
        except ValueError:
            pass
    return json.dumps(value, ensure_ascii=False)


@settings(max_examples=300, deadline=None)
@given(
    cols=st.lists(st.tuples(st.text(min_size=1, max_size=5), _TYPES, _JSON_VALUES), max_size=5),
    action=st.sampled_from(["I", "U", "D", "M", "Q"]),
    junk=st.sampled_from(["", ",", "}", '"x":1,']),
)
def test_fast_wal2json_decoding_matches_the_exact_decoder(cols: list, action: str, junk: str) -> None:
    # Only a float's output function prints "-0" (integer and numeric print 0): the fast path relies on it.
    assume(not any(v == "-0" and t not in ("double precision", "real") for _, t, v in cols))
    columns = ",".join(f'{{"name":{json.dumps(n)},"type":{json.dumps(t)},"value":{_token(v)}}}' for n, t, v in cols)
    rows = [
        '{"action":"B","xid":7,"lsn":"0/16B374D8","nextlsn":"0/16B37500","timestamp":"2024-01-31 12:00:00+00"}',
        f'{{{junk}"action":"{action}","schema":"public","table":"t","lsn":"0/16B374E0",'
        f'"columns":[{columns}],"identity":[{columns}],"pk":[{{"name":"id","type":"integer"}}]}}',
        '{"action":"C","lsn":"0/16B374D8","nextlsn":"0/16B37500"}',
    ]
    fast, exact = Wal2JsonDecoder(), Wal2JsonDecoder()
    got = [r for row in rows for r in fast.feed(row.encode())]
    want = [r for row in rows for r in exact._feed_exact(row.encode())]
    assert got == want
    assert (fast.confirm_lsn, fast.quarantined, fast.messages_skipped) == (
        exact.confirm_lsn,
        exact.quarantined,
        exact.messages_skipped,
    )


@settings(max_examples=300, deadline=None)
@given(
    op=st.sampled_from(["I", "U", "D", "X", "C", "Q"]),
    lsn=st.one_of(st.integers(min_value=0, max_value=2**64), st.just("0/16"), st.booleans()),
    columns=st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4), _JSON_VALUES), max_size=3),
    extra=st.sampled_from(["", ',"reason":"r"', ',"raw":null', ',"raw":"x"', ',"identity":[]', ',"pk":[1]']),
)
def test_fast_landing_line_decoding_matches_the_exact_decoder(op: str, lsn: object, columns: list, extra: str) -> None:
    line = (
        f'{{"v":1,"op":"{op}","lsn":{json.dumps(lsn)},"seq":1,"xid":2,"ts":"2024-01-01 00:00:00+00",'
        f'"change_lsn":3,"schema":"s","table":"t","columns":{json.dumps([list(c) for c in columns])},"pk":["a"]{extra}}}'
    )

    def verdict(fn: object) -> object:
        try:
            return fn(line)  # type: ignore[operator]
        except (ValueError, KeyError, TypeError) as exc:
            return ("error", str(exc))

    assert verdict(ChangeRecord.from_json) == verdict(ChangeRecord._from_json_checked)
