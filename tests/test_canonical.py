"""The canonical form (loader/canonical.py): unambiguous, and the same on both sides.

The Arrow side is held to the SQL side value by value: PostgreSQL computes each value's piece, and
the same value, typed for the lake as the load types it (the driver's Arrow typing, which the load's
oracle holds to Spark's), gives the same piece in Arrow. Types the driver does not type (arrays,
bytea) are built as the lake holds them. Every type of the loader's type map is covered; the
end-to-end type tests (tests/load/test_types_coverage.py) then verify every type through Spark.
"""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import canonical
from loader.lake.types import NON_FINITE, spark_type
from loader.load.values import typed

# (PostgreSQL type, literals) — NULL is added to each.
CASES: list[tuple[str, list[str]]] = [
    ("smallint", ["0", "-32768", "32767"]),
    ("integer", ["0", "-2147483648", "2147483647"]),
    ("bigint", ["0", "-9223372036854775808", "9223372036854775807"]),
    ("oid", ["0", "4294967295"]),
    ("real", ["0", "-0", "1.1", "3.4028235e38", "1e-45", "NaN", "Infinity", "-Infinity"]),
    ("double precision", ["0", "-0", "0.1", "1e308", "5e-324", "NaN", "Infinity", "-Infinity", "123456789.125"]),
    ("boolean", ["true", "false"]),
    ("numeric(12,2)", ["0", "-0.5", "1234567890.12", "0.01"]),
    ("numeric(38,0)", ["99999999999999999999999999999999999999", "-1"]),
    ("numeric", ["0.10", "NaN", "1e-20", "-123.4560"]),
    ("date", ["2024-02-29", "1970-01-01", "0044-03-15 BC", "infinity", "-infinity", "5874897-12-31"]),
    (
        "timestamp without time zone",
        ["2024-02-29 12:34:56.789012", "1970-01-01 00:00:00", "0044-03-15 12:00:00 BC", "infinity", "-infinity"],
    ),
    (
        "timestamp with time zone",
        ["2024-02-29 12:34:56.789012+00", "1969-12-31 23:59:59.999999+00", "infinity", "-infinity"],
    ),
    ("text", ["", "N", "N;", "1:a;", "naïve ☃", "line\nbreak"]),
    ("character(4)", ["a", "abcd"]),
    ("jsonb", ['{"b": 1, "a": [1, 2]}']),
    ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("inet", ["10.0.0.1", "10.0.0.0/8"]),
    ("interval", ["1 day 02:03:04", "-1 mons"]),
    ("bytea", ["\\x", "\\x00ff10"]),
    ("integer[]", ["{}", "{1,NULL,3}"]),
    ("text[]", ['{"a,b",NULL,"NULL",""}']),
    ("integer[][]", ["{{1,2},{3,4}}"]),
]


def _lake_values(pg_type: str, texts: list[str | None]) -> pa.Array:
    """The values as the lake holds them (see the module docstring)."""
    stype = spark_type(pg_type)
    if pg_type == "bytea":
        return pa.array([None if t is None else bytes.fromhex(t[2:]) for t in texts], pa.binary())
    if stype.array_of is not None:
        import json

        def parse(t: str | None) -> Any:
            if t is None:
                return None
            if pg_type == "integer[]":
                inner = t.strip("{}")
                return [None if x == "NULL" else int(x) for x in inner.split(",")] if inner else []
            return json.loads('["a,b", null, "NULL", ""]')  # the one text[] literal above

        elem = pa.int32() if pg_type == "integer[]" else pa.string()
        return pa.array([parse(t) for t in texts], pa.list_(elem))
    if stype.sql in ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"):
        raise AssertionError("temporal values come from their epoch numbers")
    return typed(pa.array(texts, pa.string()), pg_type, "public.t.c")


def _temporal(stype: Any, epochs: list[int | None]) -> pa.Array:
    """Dates and timestamps as the lake stores them: days or microseconds since 1970 (NON_FINITE for infinities)."""
    ints = pa.array(epochs, pa.int64())
    if stype.sql == "DATE":
        return ints.cast(pa.int32()).cast(pa.date32())
    return ints.cast(pa.timestamp("us", tz="UTC" if stype.sql == "TIMESTAMP" else None))


@pytest.mark.parametrize(("pg_type", "literals"), CASES, ids=[c[0] for c in CASES])
def test_source_and_lake_pieces_agree(pg_admin: str, pg_type: str, literals: list[str]) -> None:
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rows = [(lit,) for lit in literals] + [(None,)]
        values = ", ".join(f"(%s::{pg_type})" for _ in rows)
        text = "c::text" if pg_type == "boolean" else "concat(c)"  # as wal2json and the snapshot print it
        epoch = (
            "CASE WHEN c = 'infinity' THEN {plus} WHEN c = '-infinity' THEN {minus} ELSE "
            + ("c - DATE '1970-01-01'" if pg_type == "date" else "(extract(epoch FROM c) * 1000000)::bigint")
            + " END"
            if spark_type(pg_type).sql in NON_FINITE
            else "NULL::bigint"
        )
        if spark_type(pg_type).sql in NON_FINITE:
            plus, minus = NON_FINITE[spark_type(pg_type).sql]
            epoch = epoch.format(plus=plus, minus=minus)
        query = psycopg.sql.SQL(
            "SELECT {}, CASE WHEN c IS NULL THEN NULL ELSE " + text + " END, " + epoch + " FROM (VALUES {}) AS v(c)"
        )
        got = conn.execute(
            query.format(canonical.source_piece("c", pg_type), psycopg.sql.SQL(values)),  # type: ignore[arg-type]
            [r[0] for r in rows],
        ).fetchall()
        # Each piece's checksum and bucket as PostgreSQL computes them (hashtextextended in SQL).
        piece = canonical.source_piece("c", pg_type)
        sums = conn.execute(
            psycopg.sql.SQL("SELECT {}, {}, {}, {} FROM (VALUES {}) AS v(c)").format(
                canonical.source_hash_sql(piece),
                canonical.source_bucket_sql(piece, 16),
                canonical.pieces_text([canonical.source_text("c", pg_type)]),  # the text first, then its piece
                canonical.source_row_hash_sql([canonical.source_text("c", pg_type)]),
                psycopg.sql.SQL(values),  # type: ignore[arg-type]
            ),
            [r[0] for r in rows],
        ).fetchall()
    source = [g[0] for g in got]
    texts = [g[1] for g in got]
    stype = spark_type(pg_type)
    values = _temporal(stype, [g[2] for g in got]) if stype.sql in NON_FINITE else _lake_values(pg_type, texts)
    if stype.sql in NON_FINITE or stype.sql == "BINARY" or stype.array_of is not None:
        # the load's typing of PostgreSQL's text gives the values PostgreSQL's own numbers say
        assert typed(pa.array(texts, pa.string()), pg_type, "public.t.c").equals(values)
    lake_arrow = canonical.lake_pieces(values, stype)
    lake = lake_arrow.to_pylist()
    assert lake == source, list(zip(texts, source, lake))
    assert len(set(source)) == len(source), "distinct values must have distinct pieces"
    hashes, buckets = canonical.hashes(lake_arrow, 16)
    assert hashes.tolist() == [s[0] for s in sums], list(zip(source, sums, hashes.tolist()))
    assert buckets is not None and buckets.tolist() == [s[1] for s in sums]
    assert [s[2] for s in sums] == source
    chained = canonical.lake_row_hashes([canonical.lake_text(values, stype)]).tolist()
    assert chained == [s[3] for s in sums], list(zip(source, sums, chained))


@given(
    st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=4),
    st.lists(st.one_of(st.none(), st.text(max_size=5)), max_size=4),
)
@settings(max_examples=300)
def test_row_texts_are_equal_only_for_equal_rows(a: list[str | None], b: list[str | None]) -> None:
    assume_same_width = len(a) == len(b)
    if not assume_same_width:
        return
    text = canonical.lake_row_text([pa.array([x], pa.string()) for x in a], ["text"] * len(a)) if a else None
    other = canonical.lake_row_text([pa.array([x], pa.string()) for x in b], ["text"] * len(b)) if b else None
    if text is None or other is None:
        return
    assert (text.to_pylist() == other.to_pylist()) == (a == b)
    assert text.to_pylist() == ["".join(canonical.piece(x) for x in a)]


@given(st.floats(allow_nan=False), st.floats(allow_nan=False))
def test_doubles_compare_by_their_bits(x: float, y: float) -> None:
    px, py = canonical.lake_pieces(pa.array([x, y]), spark_type("float8")).to_pylist()
    assert (px == py) == (struct.pack(">d", x) == struct.pack(">d", y))


def _lookup3(data: bytes, seed: int = 0) -> int:
    """PostgreSQL's hash_bytes_extended (src/common/hashfn.c, little-endian), byte by byte in plain
    Python: the reference the vectorized numpy version is held to."""
    m = 0xFFFFFFFF

    def rot(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & m

    def mix(a: int, b: int, c: int) -> tuple[int, int, int]:
        a = (a - c) & m ^ rot(c, 4)
        c = (c + b) & m
        b = (b - a) & m ^ rot(a, 6)
        a = (a + c) & m
        c = (c - b) & m ^ rot(b, 8)
        b = (b + a) & m
        a = (a - c) & m ^ rot(c, 16)
        c = (c + b) & m
        b = (b - a) & m ^ rot(a, 19)
        a = (a + c) & m
        c = (c - b) & m ^ rot(b, 4)
        b = (b + a) & m
        return a, b, c

    a = b = c = (0x9E3779B9 + len(data) + 3923095) & m
    if seed:
        a, b = (a + (seed >> 32)) & m, (b + (seed & m)) & m
        a, b, c = mix(a, b, c)
    rest = data
    while len(rest) >= 12:
        a = (a + int.from_bytes(rest[0:4], "little")) & m
        b = (b + int.from_bytes(rest[4:8], "little")) & m
        c = (c + int.from_bytes(rest[8:12], "little")) & m
        a, b, c = mix(a, b, c)
        rest = rest[12:]
    tail = rest + bytes(12 - len(rest))
    a = (a + int.from_bytes(tail[0:4], "little")) & m
    b = (b + int.from_bytes(tail[4:8], "little")) & m
    c = (c + (int.from_bytes(tail[8:12], "little") << 8)) & m  # c's lowest byte is the length's
    for x, y, k in ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24)):
        s = [a, b, c]
        s[x] = ((s[x] ^ s[y]) - rot(s[y], k)) & m
        a, b, c = s
    value = (b << 32) | c
    return value - (1 << 64) if value >= 1 << 63 else value


# Every tail length of lookup3 (0 to 11 bytes after whole 12-byte blocks), multibyte UTF-8, the
# canonical form's own characters.
HASH_TEXTS = [
    "",
    "N;",
    "1:a;",
    "0:;",
    "naïve ☃",
    "line\nbreak\t",
    "\u00e9" * 7,
    "\U0001f600" * 5,
    *("abcdefghijklmnopqrstuvwxyz0123456789"[:n] for n in range(37)),
]


def test_hashes_and_buckets_match_the_scalar_definitions() -> None:
    texts = ["", "1:a;", "N;", "naïve ☃" * 50]
    arr = pa.array(texts).slice(1)  # a sliced array: offsets must be honoured
    hashes, buckets = canonical.hashes(arr, 5)
    assert hashes.tolist() == [_lookup3(t.encode()) for t in texts[1:]]
    assert hashes.tolist() == [canonical.row_hash(t) for t in texts[1:]]
    assert buckets is not None and buckets.tolist() == [canonical.key_bucket(t, 5) for t in texts[1:]]
    assert buckets.tolist() == [_lookup3(t.encode()) & 31 for t in texts[1:]]
    assert canonical.bucket_bits(0) == 0 and canonical.bucket_bits(10_000_000) == 12
    assert canonical.as_signed64((1 << 64) + 5) == 5 and canonical.as_signed64(1 << 63) == -(1 << 63)


@given(st.lists(st.text(max_size=40), max_size=30), st.integers(0, 29), st.sampled_from([0, 1, (1 << 64) - 1]))
def test_text_hashes_equal_the_reference_lookup3(texts: list[str], skip: int, seed: int) -> None:
    arr = pa.array(["x" * 13, *texts], pa.string()).slice(1 + min(skip, len(texts)))
    expected = [_lookup3(t.encode(), seed) for t in texts[min(skip, len(texts)) :]]
    assert canonical.text_hashes(arr, seed).tolist() == expected
    assert canonical.text_hashes(pa.chunked_array([arr, arr], pa.string()), seed).tolist() == expected * 2
    assert canonical.text_hashes(arr.cast(pa.large_string()), seed).tolist() == expected


@given(st.lists(st.tuples(st.text(max_size=30), st.integers(-(1 << 63), (1 << 63) - 1)), max_size=20))
def test_text_hashes_take_a_seed_per_text(pairs: list[tuple[str, int]]) -> None:
    import numpy as np

    texts = pa.array([t for t, _ in pairs], pa.string())
    seeds = np.array([s for _, s in pairs], np.int64)
    assert canonical.text_hashes(texts, seeds).tolist() == [_lookup3(t.encode(), s % (1 << 64)) for t, s in pairs]
    some_zero = seeds.copy()
    some_zero[::2] = 0  # a zero seed is no seed: mixed per text with seeded ones
    assert canonical.text_hashes(texts, some_zero).tolist() == [
        _lookup3(t.encode(), s % (1 << 64)) for (t, _), s in zip(pairs, some_zero.tolist())
    ]


def test_row_checksums_chain_the_column_texts_alike_on_both_sides(pg_admin: str) -> None:
    """The chained checksum of rows (source_row_hash_sql, lake_row_hashes) over columns of several
    types with NULLs anywhere: PostgreSQL's equals numpy's, and NULL, '' and moved NULLs all differ."""
    from psycopg import sql

    cols = {"id": "bigint", "v": "text", "w": "text", "f": "double precision", "d": "date"}
    rows = [
        (1, "a", "b", 1.5, "2024-02-29"),
        (2, None, "", None, None),
        (3, "", None, -0.0, "infinity"),
        (4, "", "", float("nan"), "-infinity"),
        (5, None, None, float("inf"), "0044-03-15 BC"),
        (6, "naïve ☃" * 20, "x" * 13, 5e-324, "1970-01-01"),
    ]
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("CREATE TEMP TABLE r (id bigint, v text, w text, f float8, d date)")
        conn.cursor().executemany("INSERT INTO r VALUES (%s, %s, %s, %s, %s)", rows)
        got = conn.execute(
            sql.SQL("SELECT {}, {} FROM r ORDER BY id").format(
                canonical.source_row_hash_sql([canonical.source_text(c, t) for c, t in cols.items()]),
                canonical.source_text("d", "date"),
            )
        ).fetchall()
    days = [None if g[1] is None else int(g[1]) for g in got]  # as the lake stores dates: epoch days
    lake = [
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1] for r in rows], pa.string()),
        pa.array([r[2] for r in rows], pa.string()),
        pa.array([r[3] for r in rows], pa.float64()),
        pa.array(days, pa.int32()).cast(pa.date32()),
    ]
    texts = [canonical.lake_text(a, spark_type(t)) for a, t in zip(lake, cols.values())]
    mine = canonical.lake_row_hashes(texts).tolist()
    assert mine == [g[0] for g in got]
    # The same rows but the key: NULL and '' in v and w, in every arrangement, all differ.
    vw = [(None, ""), ("", None), ("", ""), (None, None)]
    arrangements = canonical.lake_row_hashes(
        [pa.array([a for a, _ in vw], pa.string()), pa.array([b for _, b in vw], pa.string())]
    ).tolist()
    assert len(set(arrangements)) == len(vw)


def test_text_hashes_equal_postgres_hashtextextended(pg_admin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's lookup3 is PostgreSQL's, for every tail length, multibyte text and seed, across the
    chunks it hashes at once; and the server passes verify's check."""
    texts = HASH_TEXTS * 3
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        assert canonical.source_hash_agrees(conn)
        for seed in (0, 1, 42, (1 << 63) - 1):
            got = conn.execute(
                'SELECT hashtextextended(t COLLATE "C", %s) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, o) ORDER BY o',
                (seed, texts),
            ).fetchall()
            expected = [g[0] for g in got]
            assert canonical.text_hashes(pa.array(texts, pa.string()), seed).tolist() == expected
            monkeypatch.setattr(canonical, "_CHUNK", 7)  # chunk boundaries inside the array
            assert canonical.text_hashes(pa.array(["pad", *texts], pa.string()).slice(1), seed).tolist() == expected
            monkeypatch.undo()
            assert expected == [_lookup3(t.encode(), seed) for t in texts]


def test_source_checksums_equal_lake_checksums(pg_admin: str) -> None:
    """The SQL bucket and hash of a row equal the Arrow ones (lookup3 on both sides, same bits)."""
    from psycopg import sql

    cols = {"id": "bigint", "v": "text"}
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE t (id bigint, v text)")
        conn.execute(
            "INSERT INTO t SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'v' || g END FROM generate_series(1, 500) g"
        )
        got = conn.execute(
            sql.SQL("SELECT {}, {} FROM t ORDER BY id").format(
                canonical.source_bucket_sql(canonical.source_row_text({"id": "bigint"}), 7),
                canonical.source_hash_sql(canonical.source_row_text(cols)),
            )
        ).fetchall()
    ids = pa.array(range(1, 501), pa.int64())
    vs = pa.array([None if g % 3 == 0 else f"v{g}" for g in range(1, 501)])
    hashes, _ = canonical.hashes(canonical.lake_row_text([ids, vs], list(cols.values())))
    buckets = canonical.key_buckets(canonical.lake_row_text([ids], ["bigint"]), 7)
    assert [g[0] for g in got] == buckets.tolist()
    assert [g[1] for g in got] == hashes.tolist()
