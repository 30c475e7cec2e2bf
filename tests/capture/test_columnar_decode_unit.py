"""Capture's columnar decoder (loader.capture.wal2json_arrow) against its oracle, the row decoder.

wal2json rows of every value kind (numbers as printed, booleans, nulls, strings with escapes,
bytea with and without ``\\x``), transactions cut across blocks anywhere, messages and truncates
between them: decoding the blocks in columns (the plain runs) and row by row (the rest) gives
exactly the records, in the same order, and leaves the decoder where feeding every row one by one
leaves it. Capture's writer then writes the same files with the same bytes, whether the records
come one by one or as Arrow batches cut anywhere.

No database and no Spark.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.capture import wal2json_arrow
from loader.capture.wal2json import Wal2JsonDecoder
from loader.landing import changefile
from loader.landing.records import COMMIT, ChangeRecord
from loader.landing.store import CHANGES, TABLES, LandingWriter, LocalLandingStore
from loader.lsn import format_lsn

TS = "2026-11-26 10:00:00.123456+00"
# Values as wal2json prints them: the JSON text after "value":.
_number = st.sampled_from(
    ["0", "-0", "7", "-4231", "12.50", "1.5e+300", "-2.25E-7", "123456789012345678901234567890.1"]
)
_string = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10).map(
    lambda t: json.dumps(t, ensure_ascii=False)
)
_escaped = st.sampled_from(['"a\\"b"', '"back\\\\slash"', '"nl\\ntab\\t"', '"\\u00e9\\u2603"', '"\\"value\\":1}"'])
_value = st.one_of(st.just("null"), st.just("true"), st.just("false"), _number, _string, _escaped)
_TYPES = ["integer", "numeric", "double precision", "text", "boolean", "bytea", "character(4)"]


@st.composite
def _stream(draw: Any) -> list[str]:
    """wal2json format-version 2 rows, as capture asks for them: transactions with their begin and
    commit rows, changes of several tables, messages and truncates among them."""
    rows: list[str] = []
    lsn = 0x16B3748
    for _ in range(draw(st.integers(1, 8))):
        lsn += draw(st.integers(1, 1 << 36))
        xid = draw(st.integers(0, 1 << 31))
        begin, end = lsn, lsn + 0x80
        head = f'"xid":{xid},"timestamp":"{TS}","lsn":"{format_lsn(begin)}","nextlsn":"{format_lsn(end)}"'
        rows.append('{"action":"B",' + head + "}")
        for i in range(draw(st.integers(0, 6))):
            kind = draw(st.sampled_from("IUDIUDMT"))
            at = f'"xid":{xid},"timestamp":"{TS}","lsn":"{format_lsn(begin - 0x40 + i)}"'
            if kind == "M":
                rows.append('{"action":"M",' + at + ',"transactional":true,"prefix":"p","content":"c"}')
                continue
            where = f'"schema":"{draw(st.sampled_from(["public", "s"]))}","table":"{draw(st.sampled_from(["t", "u"]))}"'
            if kind == "T":
                rows.append('{"action":"T",' + at + "," + where + "}")
                continue
            names = draw(st.lists(st.sampled_from(["id", "v", "value", "Value", "b"]), unique=True, max_size=4))
            cols = []
            for name in names:
                typ = draw(st.sampled_from(_TYPES))
                value = draw(_value)
                if value == "-0" and typ != "double precision":
                    value = "0"  # only a float prints a negative zero (int4out, numeric_out never do)
                if typ == "bytea" and value.startswith('"'):
                    value = draw(st.sampled_from(['"00ff"', '"\\\\x00ff"', '""']))
                cols.append(f'{{"name":"{name}","type":"{typ}","value":{value}}}')
            parts = [at, where]
            if kind != "D":
                parts.append('"columns":[' + ",".join(cols) + "]")
            if kind != "I" and draw(st.booleans()):
                key = draw(_number.filter(lambda v: v != "-0"))
                parts.append('"identity":[{"name":"id","type":"integer","value":' + key + "}]")
            pk = draw(st.sampled_from(["", '{"name":"id","type":"integer"}']))
            parts.append('"pk":[' + pk + "]")
            rows.append('{"action":"' + kind + '",' + ",".join(parts) + "}")
        rows.append('{"action":"C",' + head + "}")
    return rows


# The two parsers of plain blocks: the compiled one (loader/capture/_wal2json.c) and Arrow's JSON
# reader after quoting bare values (where the extension is not built).
PARSERS = ["compiled", "arrow"]


@contextlib.contextmanager
def _parser(name: str) -> Iterator[None]:
    """``wal2json_arrow.read_rows`` by the parser ``name``."""
    saved = wal2json_arrow.compiled_parser
    if name == "arrow":
        wal2json_arrow.compiled_parser = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        wal2json_arrow.compiled_parser = saved  # type: ignore[assignment]


def test_the_compiled_parser_is_built() -> None:
    """`make venv` builds the extension (a C compiler is part of the install): without this, the
    tests of the compiled parser below would test Arrow's reader twice."""
    assert wal2json_arrow.compiled_parser() is not None


def _by_rows(rows: list[str]) -> tuple[Any, Wal2JsonDecoder]:
    decoder = Wal2JsonDecoder()
    batcher = changefile.Batcher()
    for row in rows:
        for rec in decoder.records(row.encode()):
            batcher.add(rec)
    return batcher.take(), decoder


def _cuts(draw: Any, n: int) -> list[int]:
    return sorted(set(draw(st.lists(st.integers(0, n), max_size=5))) | {0, n})


@pytest.mark.parametrize("parser", PARSERS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_blocks_decoded_in_columns_give_the_row_decoders_records(parser: str, data: Any) -> None:
    with _parser(parser):
        _blocks_decoded_in_columns(data)


def _check_shape_numbers(block: Any) -> None:
    """The compiled parser's shape numbers (landing v3's split): records of one number have one
    table and shape, numbers come in order of first appearance (begin rows, not records, have
    numbers too)."""
    if block.shapes is None:
        assert wal2json_arrow.compiled_parser() is None
        return
    seen: dict[int, Any] = {}
    for number, r in zip(block.shapes.tolist(), changefile.batch_records(block.batch), strict=True):
        shape = (r.op, r.schema, r.table, [(c.name, c.type) for c in r.columns], [(c.name, c.type) for c in r.identity])
        assert number in seen or number > max(seen, default=-1)  # a new number comes after the others
        assert seen.setdefault(number, (*shape, r.pk)) == (*shape, r.pk)


def _blocks_decoded_in_columns(data: Any) -> None:
    rows = data.draw(_stream())
    expected, oracle = _by_rows(rows)
    cuts = _cuts(data.draw, len(rows))
    decoder = Wal2JsonDecoder()
    batches = []
    in_columns = 0
    for a, b in itertools.pairwise(cuts):
        block = "".join(r + "\n" for r in rows[a:b]).encode()
        for piece, plain in wal2json_arrow.runs(block):
            if plain and decoder.holds_messages:
                end = wal2json_arrow.commit_end(piece)
                batches.append(_row_path(piece[:end], decoder))
                piece = piece[end:]
            if plain and piece:
                got = wal2json_arrow.decode_block(piece, decoder)
                # Every plain run is decoded in columns: the test would pass vacuously otherwise.
                assert got is not None, piece
                got.accept(decoder)
                batches.append(got.batch)
                in_columns += got.batch.num_rows
                _check_shape_numbers(got)
                continue
            batches.append(_row_path(piece, decoder))
    got_all = pa.Table.from_batches(batches, schema=changefile.arrow_schema()).combine_chunks()
    assert got_all.to_pylist() == pa.Table.from_batches([expected]).to_pylist()
    assert got_all.equals(pa.Table.from_batches([expected]).combine_chunks())
    assert (decoder.txn, decoder.confirm_lsn) == (oracle.txn, oracle.confirm_lsn)
    assert decoder.messages_skipped == oracle.messages_skipped


def _row_path(block: bytes, decoder: Wal2JsonDecoder) -> Any:
    batcher = changefile.Batcher()
    for line in block.split(b"\n")[:-1]:
        for rec in decoder.records(line):
            batcher.add(rec)
    return batcher.take()


@pytest.mark.parametrize("parser", PARSERS)
def test_a_block_that_is_not_plain_is_left_to_the_row_decoder(parser: str) -> None:
    with _parser(parser):
        _not_plain_blocks()


def _not_plain_blocks() -> None:
    begin = f'{{"action":"B","xid":1,"timestamp":"{TS}","lsn":"0/10","nextlsn":"0/20"}}\n'.encode()
    change = b'{"action":"I","xid":1,"lsn":"0/11","schema":"public","table":"t","columns":[%s],"pk":[]}\n'
    ok = begin + change % b'{"name":"a","type":"text","value":"x"}'
    assert wal2json_arrow.decode_block(ok, Wal2JsonDecoder()) is not None
    for bad in (
        change % b'{"name":"j","type":"json","value":{"a":1}}',  # a JSON object as a value
        change % b'{"name":"a","type":"text","value":"\xff"}',  # not UTF-8 (a SQL_ASCII source)
        b'{"action":"I","xid":1,"lsn":"zz","schema":"public","table":"t","pk":[]}\n',  # not an LSN
        b'{"action":"I","xid":1,"lsn":"0/11","table":"t","pk":[]}\n',  # no schema
        b'{"action":"I","xid":1,"lsn":"0/11","schema":"public","table":"t","oid":7,"pk":[]}\n',  # a field more
        b'{"action":"X","xid":1}\n',  # an action of no kind known
        b'{"action":"M","xid":1,"transactional":true,"prefix":"p","content":"c"}\n',
        b'{"action":"C"\n',  # cut short
        begin,  # a begin inside a transaction
    ):
        assert wal2json_arrow.decode_block(begin + bad, Wal2JsonDecoder()) is None, bad
    assert (
        wal2json_arrow.decode_block(b'{"action":"C","xid":1,"lsn":"0/10","nextlsn":"0/20"}\n', Wal2JsonDecoder())
        is None
    )


def test_lsn_texts_parse_as_the_row_decoder_parses_them() -> None:
    from loader.lsn import parse_lsn

    texts = ["0/0", "0/16B3748", "FFFFFFFF/FFFFFFFF", "1/0", "a/b", "12345678/9ABCDEF0"]
    assert list(wal2json_arrow.lsn_array(pa.array(texts))) == [parse_lsn(t) for t in texts]
    for bad in (["0/"], ["/1"], ["123456789/0"], ["0/g"], [None]):
        try:
            wal2json_arrow.lsn_array(pa.array(bad, pa.string()))
        except ValueError:
            continue
        raise AssertionError(f"{bad} parsed")


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), max_changes=st.integers(1, 12))
@pytest.mark.parametrize("fmt", [CHANGES, TABLES])
def test_the_writer_writes_the_same_files_from_records_or_batches(
    tmp_path_factory: Any, data: Any, max_changes: int, fmt: str
) -> None:
    """Landing v2 and v3 alike: the same files, byte for byte, from records or capture's blocks."""
    rows = data.draw(_stream())
    batch, _ = _by_rows(rows)
    records = list(changefile.batch_records(batch))
    if not records:
        return
    by_record = _write(tmp_path_factory.mktemp("r"), max_changes, [records], fmt)
    cuts = _cuts(data.draw, len(records))
    pieces: list[Any] = []
    for a, b in itertools.pairwise(cuts):
        pieces.append(records[a:b] if data.draw(st.booleans()) else batch.slice(a, b - a))
    assert _write(tmp_path_factory.mktemp("b"), max_changes, pieces, fmt) == by_record


def _write(root: Path, max_changes: int, pieces: list[Any], fmt: str = CHANGES) -> dict[str, bytes]:
    writer = LandingWriter(LocalLandingStore(root), max_changes, format=fmt)
    for piece in pieces:
        if isinstance(piece, list):
            for rec in piece:
                writer.write(rec)
        else:
            names = [
                None if op == COMMIT else f"{s}.{t}"
                for op, s, t in zip(*(piece.column(i).to_pylist() for i in (0, 6, 7)))
            ]
            writer.write_batch(piece, pa.array(names, pa.string()))
    writer.close_file()
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_spooled_bytes_do_not_depend_on_how_records_arrived() -> None:
    """Batches cut every BATCH_RECORDS records from the file's start, whatever the pieces."""
    rec = [
        ChangeRecord("I", 0x10, i + 1, 5, TS, "public", "t", 0x10, [], [], ["id"])
        for i in range(changefile.BATCH_RECORDS + 10)
    ]
    whole = changefile.Batcher()
    for r in rec:
        whole.add(r)
    batch = whole.take()

    def spool(pieces: list[Any]) -> bytes:
        import io

        out = io.BytesIO()
        sp = changefile.Spool(out)
        for piece in pieces:
            if isinstance(piece, list):
                for r in piece:
                    sp.add(r)
            else:
                sp.add_batch(piece)
        sp.close()
        return out.getvalue()

    ref = spool([rec])
    assert spool([batch]) == ref
    assert spool([rec[:100], batch.slice(100, 4000), rec[4100:]]) == ref
    assert spool([batch.slice(0, 7), batch.slice(7)]) == ref


# Text around and inside values: keys, strings holding "value": and colons, malformed bare tokens.
_fragment = st.sampled_from(
    [
        '{"value":',
        '"value":',
        '"xvalue":',
        ",",
        "}",
        '"',
        ":",
        "-",
        "tru",
        "true",
        "falsey",
        "1ae",
        "--1",
        '\\"value\\":1',
        "e+5",
        " ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_fragment, _value, st.just("\n")), max_size=40), st.sampled_from([1 << 20, 1, 16, 64]))
def test_bare_values_are_quoted_as_the_pattern_says(parts: list[str], piece: int) -> None:
    """quote_bare_values against its specification, the regular expression (RE2's replacement),
    on any text: rows as wal2json prints them and bytes it never prints, in pieces of any size."""
    import pyarrow.compute as pc

    data = "".join(parts).encode()
    expected = pc.replace_substring_regex(
        pa.array([data], pa.binary()), pattern=wal2json_arrow.BARE_VALUE, replacement=wal2json_arrow.QUOTED_VALUE
    )
    default, wal2json_arrow._QUOTE_PIECE = wal2json_arrow._QUOTE_PIECE, piece
    try:
        assert wal2json_arrow.quote_bare_values(data).to_pybytes() == expected[0].as_py()
    finally:
        wal2json_arrow._QUOTE_PIECE = default


# Bytes a mutation puts into a row: JSON's punctuation and literals' letters, digits and number
# signs, escapes, bytes that are not UTF-8 (a lone continuation byte, an encoded surrogate), tabs.
_MUTATION_BYTES = b'{}[]":,\\ -+0123456789.eEtruefalsnu\t\n\xff\x80\xc3\xa9\xed\xa0\x80'


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    edits=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from("sdi"), st.sampled_from(list(_MUTATION_BYTES))),
        min_size=1,
        max_size=4,
    ),
)
def test_the_compiled_parser_accepts_only_what_the_row_decoder_reads_the_same(data: Any, edits: Any) -> None:
    """Rows with bytes changed, dropped or put in anywhere (text wal2json never prints: numbers of
    no JSON form, keys cut, escapes broken, invalid UTF-8, two rows on a line): the compiled parser
    either leaves the block to the row decoder or gives exactly the row decoder's records (an
    invalid number is quarantined there, never kept as text); it never reads out of its input."""
    rows = data.draw(_stream())
    block = bytearray("".join(r + "\n" for r in rows).encode())
    for where, how, byte in edits:
        at = int(where * len(block))
        if how == "s":
            block[at] = byte
        elif how == "d":
            del block[at]
        else:
            block.insert(at, byte)
    raw = bytes(block) if block.endswith(b"\n") else bytes(block) + b"\n"
    # Plain runs only, as capture feeds them (messages and truncates go row by row first).
    decoder = Wal2JsonDecoder()
    for piece, plain in wal2json_arrow.runs(raw):
        if not plain or decoder.holds_messages:
            _row_path(piece, decoder)
            continue
        got = wal2json_arrow.decode_block(piece, decoder)
        if got is None:
            return  # the row decoder's: it reads, quarantines or refuses the block (its own tests)
        expected = _row_path(piece, decoder)  # the row decoder takes any block the parser took
        assert got.batch.to_pylist() == expected.to_pylist(), piece
        assert (got.state, got.confirm_lsn) == (decoder.txn, decoder.confirm_lsn)
