"""The canonical form of a row, defined once, computed by PostgreSQL on the source and by Arrow on the lake.

``loader verify`` compares tables by checksums of this form, per bucket of keys, and reads rows
only in the buckets whose checksums differ. Two values compare equal exactly when their canonical
texts are equal, so the form must hold everything the lake keeps and nothing it cannot keep:

- NULL is ``N;``; any other value is ``<length>:<text>;`` (length in characters), so a row's
  columns joined make an unambiguous text: NULL, the empty string and the string "N" all differ.
- integers: decimal digits. booleans: ``true`` / ``false``.
- ``numeric(p,s)`` (p <= 38, a lake decimal): PostgreSQL's text, which has exactly ``s`` decimals,
  as Arrow prints a decimal of scale ``s``. ``NaN`` stays ``NaN`` (the lake holds NULL: a difference).
- ``real`` / ``double precision``: the IEEE bits in hex, big-endian (``float4send``/``float8send``):
  no decimal printing to disagree on; ``-0`` differs from ``0``; every NaN is ``NaN``.
- ``date``: days since 1970-01-01; ``timestamp`` and ``timestamptz``: microseconds since
  1970-01-01 UTC; ``±infinity`` as the lake stores them (:data:`loader.lake.types.NON_FINITE`).
  BC dates and years past 9999 need no special case.
- ``bytea``: lowercase hex, no ``\\x``.
- types the lake keeps as exact text (text, varchar, char(n) with its padding, json, uuid, inet,
  interval, unconstrained numeric, multi-dimensional arrays, ...): the type's output function, as
  wal2json and the snapshot print it (``concat(x)``; ``x::text`` can differ: inet adds ``/32``).
- 1-D arrays the lake keeps natively: their elements' canonical forms in order, each ``N;`` or
  ``<length>:<text>;``.

A row's checksum is the first 8 bytes of the md5 of its canonical text as a signed 64-bit integer;
a bucket's checksum is (row count, sum of its rows' checksums mod 2^64), which does not depend on
order and counts duplicates (keyless tables compare as multisets). A key's bucket is the first 16
bits of the md5 of its columns' canonical text, shifted to the number of buckets (a power of two).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loader.lake.types import NON_FINITE, SparkType, spark_type

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from psycopg import sql

NULL_PIECE = "N;"
MAX_BUCKET_BITS = 16


def bucket_bits(rows: int, per_bucket: int = 4096) -> int:
    """How many key bits make buckets of about ``per_bucket`` rows (0 to 16)."""
    bits = 0
    while bits < MAX_BUCKET_BITS and (rows >> bits) > per_bucket:
        bits += 1
    return bits


def piece(text: str | None) -> str:
    """One value's part of a row's canonical text."""
    return NULL_PIECE if text is None else f"{len(text)}:{text};"


def row_hash(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "big", signed=True)


def key_bucket(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:2], "big") >> (MAX_BUCKET_BITS - bits)


# --- the source side: SQL ---------------------------------------------------------------------------
def _sql_text(expr: sql.Composable, st: SparkType) -> sql.Composable:
    """SQL giving the canonical text of a non-NULL value ``expr`` stored as ``st``."""
    from psycopg import sql

    kind = st.sql
    if st.lossless_text:
        return sql.SQL("concat({})").format(expr)
    if kind in ("INT", "BIGINT") or kind.startswith("DECIMAL("):
        return sql.SQL("({})::text").format(expr)
    if kind == "BOOLEAN":
        return sql.SQL("CASE WHEN {} THEN 'true' ELSE 'false' END").format(expr)
    if kind in ("FLOAT", "DOUBLE"):
        send, cast = ("float4send", "real") if kind == "FLOAT" else ("float8send", "double precision")
        return sql.SQL("CASE WHEN {0} = 'NaN'::{2} THEN 'NaN' ELSE encode({1}({0}), 'hex') END").format(
            expr, sql.SQL(send), sql.SQL(cast)
        )
    if kind in ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"):
        plus, minus = NON_FINITE[kind]
        finite = (
            sql.SQL("({} - DATE '1970-01-01')").format(expr)
            if kind == "DATE"
            else sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint").format(expr)
        )
        return sql.SQL(
            "(CASE WHEN {0} = 'infinity' THEN {1} WHEN {0} = '-infinity' THEN {2} ELSE {3} END)::text"
        ).format(expr, sql.Literal(plus), sql.Literal(minus), finite)
    if kind == "BINARY":
        return sql.SQL("encode({}, 'hex')").format(expr)
    if st.array_of is not None:
        element = _sql_piece(sql.Identifier("_e"), st.array_of)
        return sql.SQL(
            "coalesce((SELECT string_agg({0}, '' ORDER BY _o) FROM unnest({1}) WITH ORDINALITY AS _u(_e, _o)), '')"
        ).format(element, expr)
    raise AssertionError(f"no canonical form for lake type {kind}")  # pragma: no cover - every SparkType is above


def _sql_piece(expr: sql.Composable, st: SparkType) -> sql.Composable:
    from psycopg import sql

    text = _sql_text(expr, st)
    return sql.SQL("CASE WHEN {0} IS NULL THEN 'N;' ELSE length({1})::text || ':' || {1} || ';' END").format(expr, text)


def source_piece(column: str, pg_type: str) -> sql.Composable:
    """SQL of one column's canonical piece (``N;`` or ``<length>:<text>;``)."""
    from psycopg import sql

    return _sql_piece(sql.Identifier(column), spark_type(pg_type))


def source_row_text(columns: dict[str, str]) -> sql.Composable:
    """SQL of a row's canonical text over ``columns`` (name -> PostgreSQL type), in that order."""
    from psycopg import sql

    if not columns:
        return sql.SQL("''")
    return sql.SQL(" || ").join(source_piece(c, t) for c, t in columns.items())


def source_bucket_sql(key_text: sql.Composable, bits: int) -> sql.Composable:
    from psycopg import sql

    return sql.SQL("(('x' || substr(md5({}), 1, 4))::bit(16)::int >> {})").format(
        key_text, sql.Literal(MAX_BUCKET_BITS - bits)
    )


def source_hash_sql(row_text: sql.Composable) -> sql.Composable:
    from psycopg import sql

    return sql.SQL("('x' || substr(md5({}), 1, 16))::bit(64)::bigint").format(row_text)


# --- the lake side: Arrow ---------------------------------------------------------------------------
def _fixed_hex(values: np.ndarray, width: int) -> pa.Array:
    """Big-endian hex of each element of a numpy array of ``width``-byte items, as one Arrow string array."""
    import numpy as np
    import pyarrow as pa

    data = values.tobytes().hex().encode()
    offsets = np.arange(0, 2 * width * (len(values) + 1), 2 * width, dtype=np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def lake_text(values: pa.Array, st: SparkType) -> pa.Array:
    """The canonical text of each value of a lake column (NULL stays NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    kind = st.sql
    if st.lossless_text:
        return values.cast(pa.string())
    if kind in ("INT", "BIGINT", "BOOLEAN") or kind.startswith("DECIMAL("):
        return values.cast(pa.string())
    if kind in ("FLOAT", "DOUBLE"):
        width, dtype = (4, ">f4") if kind == "FLOAT" else (8, ">f8")
        floats = values.cast(pa.float32() if kind == "FLOAT" else pa.float64())
        hexed = _fixed_hex(floats.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype), width)
        text = pc.if_else(pc.is_nan(floats.fill_null(0)), pa.scalar("NaN"), hexed)
        return pc.if_else(pc.is_null(values), pa.scalar(None, pa.string()), text)
    if kind == "DATE":
        return values.cast(pa.int32()).cast(pa.string())
    if kind in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return values.cast(pa.int64()).cast(pa.string())
    if kind == "BINARY":
        return pa.array([None if v is None else v.hex() for v in values.to_pylist()], pa.string())
    if st.array_of is not None:
        flat = lake_pieces(values.flatten(), st.array_of).to_pylist()
        offsets = values.offsets.to_numpy()
        starts = offsets[:-1] - offsets[0]
        ends = offsets[1:] - offsets[0]
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        out = ["".join(flat[s:e]) if ok else None for s, e, ok in zip(starts, ends, valid)]
        return pa.array(out, pa.string())
    raise AssertionError(f"no canonical form for lake type {kind}")  # pragma: no cover


def lake_pieces(values: pa.Array, st: SparkType) -> pa.Array:
    """Each value's canonical piece (``N;`` or ``<length>:<text>;``); never NULL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = lake_text(values, st)
    lengths = pc.utf8_length(text).cast(pa.string())
    colon, semicolon = pa.scalar(":", pa.string()), pa.scalar(";", pa.string())
    return pc.fill_null(pc.binary_join_element_wise(lengths, colon, text, semicolon, ""), NULL_PIECE)


def lake_row_text(columns: Sequence[pa.Array], types: Sequence[str]) -> pa.Array:
    """Each row's canonical text over ``columns`` (lake arrays) of PostgreSQL ``types``, in order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not columns:
        return pa.array([""] * 0, pa.string())
    pieces = [lake_pieces(c, spark_type(t)) for c, t in zip(columns, types)]
    return pieces[0] if len(pieces) == 1 else pc.binary_join_element_wise(*pieces, "")


def hashes(texts: pa.Array, bits: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Row checksums (int64) of canonical texts, and their buckets when ``bits`` is given."""
    import numpy as np
    import pyarrow as pa

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * texts.offset)
    data = memoryview(texts.buffers()[2] or b"")
    digests = bytearray(8 * n)
    buckets = np.zeros(n, np.int64) if bits is not None else None
    md5 = hashlib.md5
    shift = MAX_BUCKET_BITS - (bits or 0)
    for i in range(n):
        d = md5(data[offsets[i] : offsets[i + 1]]).digest()
        digests[8 * i : 8 * i + 8] = d[:8]
        if buckets is not None:
            buckets[i] = ((d[0] << 8) | d[1]) >> shift
    return np.frombuffer(bytes(digests), dtype=">i8").astype(np.int64), buckets


def row_hashes_and_buckets(rows: pa.Array, keys: pa.Array, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hashes` of the row texts and the buckets of the key texts, in one pass."""
    import numpy as np
    import pyarrow as pa

    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    n = len(rows)
    r_off = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * rows.offset).tolist()
    k_off = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * keys.offset).tolist()
    r_data = bytes(rows.buffers()[2] or b"")
    k_data = bytes(keys.buffers()[2] or b"")
    digests = bytearray(8 * n)
    heads = bytearray(2 * n)
    md5 = hashlib.md5
    for i in range(n):
        digests[8 * i : 8 * i + 8] = md5(r_data[r_off[i] : r_off[i + 1]]).digest()[:8]
        heads[2 * i : 2 * i + 2] = md5(k_data[k_off[i] : k_off[i + 1]]).digest()[:2]
    buckets = (np.frombuffer(bytes(heads), dtype=">u2").astype(np.int64)) >> (MAX_BUCKET_BITS - bits)
    return np.frombuffer(bytes(digests), dtype=">i8").astype(np.int64), buckets


def key_buckets(texts: pa.Array, bits: int) -> np.ndarray:
    """The bucket of each key's canonical text."""
    _, buckets = hashes(texts, bits)
    assert buckets is not None
    return buckets


def as_signed64(total: Any) -> int:
    """A checksum sum (any integer) mod 2^64, as a signed 64-bit integer."""
    value = int(total) % (1 << 64)
    return value - (1 << 64) if value >= (1 << 63) else value
