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

Checksums are PostgreSQL's ``hashtextextended`` (UTF-8 bytes): Jenkins' lookup3 as
``hash_bytes_extended`` computes it, 64 bits; hash partitioning places rows by it, so PostgreSQL
keeps it stable across versions. PostgreSQL computes it in C for a fraction of md5's cost, and
:func:`text_hashes` computes it here for whole Arrow arrays at once in numpy (no Python call per
row); verify refuses a server whose lookup3 differs (:func:`source_hash_agrees`: a big-endian one
reads the bytes the other way).

- A row's checksum chains its columns' canonical texts, in column order, without building the
  row's text: ``h = 0``, then for each column ``h = hashtextextended(text, h)``, a NULL hashing
  as ``''`` with ``h``'s lowest bit flipped (:func:`source_row_hash_sql`, :func:`lake_row_hashes`).
  A keyless table's row, rebuilt from history as its canonical text, checksums as the hash of
  that text (:func:`source_hash_sql`, :func:`hashes`).
- A bucket's checksum is (row count, sum of its rows' checksums mod 2^64), which does not depend
  on order and counts duplicates (keyless tables compare as multisets).
- A key's bucket is the low ``bits`` bits (at most 16) of the hash of its columns' canonical text.
"""

from __future__ import annotations

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
    """The checksum of one canonical text (``hashtextextended(text, 0)``, signed)."""
    import pyarrow as pa

    return int(text_hashes(pa.array([text], pa.string()))[0])


def key_bucket(text: str, bits: int) -> int:
    return row_hash(text) & ((1 << bits) - 1)


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


def source_text(column: str, pg_type: str) -> sql.Composable:
    """SQL of one column's canonical text, NULL for NULL (:func:`text_piece` makes it its piece)."""
    from psycopg import sql

    ident, st = sql.Identifier(column), spark_type(pg_type)
    text = _sql_text(ident, st)
    if st.sql in ("INT", "BIGINT") or st.sql.startswith("DECIMAL("):
        return text  # a cast: NULL stays NULL
    return sql.SQL("CASE WHEN {} IS NULL THEN NULL ELSE {} END").format(ident, text)


def text_piece(text: sql.Composable) -> sql.Composable:
    """SQL of the piece of a canonical text (``text``: SQL, NULL for NULL), as :func:`source_piece`."""
    from psycopg import sql

    return sql.SQL("CASE WHEN {0} IS NULL THEN 'N;' ELSE length({0})::text || ':' || {0} || ';' END").format(text)


def pieces_text(texts: Sequence[sql.Composable]) -> sql.Composable:
    """SQL of a row's canonical text from its columns' canonical texts (SQL), in order: so that a
    query computes each column's text once, and the key's and the row's texts from them."""
    from psycopg import sql

    if not texts:
        return sql.SQL("''")
    return sql.SQL(" || ").join(text_piece(t) for t in texts)


def source_row_text(columns: dict[str, str]) -> sql.Composable:
    """SQL of a row's canonical text over ``columns`` (name -> PostgreSQL type), in that order."""
    from psycopg import sql

    if not columns:
        return sql.SQL("''")
    return sql.SQL(" || ").join(source_piece(c, t) for c, t in columns.items())


def _source_hash(text: sql.Composable) -> sql.Composable:
    from psycopg import sql

    # Under "C" the hash is of the bytes (a nondeterministic collation would hash its sort key).
    return sql.SQL('hashtextextended(({}) COLLATE "C", 0)').format(text)


def source_bucket_sql(key_text: sql.Composable, bits: int) -> sql.Composable:
    from psycopg import sql

    return sql.SQL("({} & {})::int").format(_source_hash(key_text), sql.Literal((1 << bits) - 1))


def source_hash_sql(row_text: sql.Composable) -> sql.Composable:
    return _source_hash(row_text)


def source_row_hash_sql(texts: Sequence[sql.Composable]) -> sql.Composable:
    """SQL of a row's checksum from its columns' canonical texts (SQL, NULL for NULL), in order:
    a chain of ``hashtextextended``, each column's text hashed with the previous column's hash as
    its seed, flipped in its lowest bit for a NULL (which hashes as ``''``). No row text is built."""
    from psycopg import sql

    chain: sql.Composable = sql.SQL("0::bigint")
    for text in texts:
        chain = sql.SQL("hashtextextended(coalesce({0}, '') COLLATE \"C\", ({1}) # ({0} IS NULL)::int::bigint)").format(
            text, chain
        )
    return chain


# Texts whose hashes a server must agree on (lengths 0 to 25: every tail case of lookup3, one and
# two 12-byte blocks).
_PROBES = ("", "N;", "1:a;", "5:12345;", "11:hello world;", "24:abcdefghijklmnopqrstuvwx;")


def source_hash_agrees(conn: Any) -> bool:
    """Whether the server's ``hashtextextended`` is the one :func:`text_hashes` computes (not on a
    big-endian server, where every checksum would differ)."""
    import pyarrow as pa
    from psycopg import sql

    query = sql.SQL("SELECT {}").format(sql.SQL(", ").join(source_hash_sql(sql.Literal(p)) for p in _PROBES))
    row = conn.execute(query).fetchone()
    return row is not None and list(row) == text_hashes(pa.array(_PROBES, pa.string())).tolist()


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

    return text_pieces(lake_text(values, st))


def text_pieces(text: pa.Array) -> pa.Array:
    """The piece of each canonical text (:func:`lake_text`, NULL for NULL)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.utf8_length(text).cast(pa.string())
    colon, semicolon = pa.scalar(":", pa.string()), pa.scalar(";", pa.string())
    return pc.fill_null(pc.binary_join_element_wise(lengths, colon, text, semicolon, ""), NULL_PIECE)


def lake_row_text(columns: Sequence[pa.Array], types: Sequence[str]) -> pa.Array:
    """Each row's canonical text over ``columns`` (lake arrays) of PostgreSQL ``types``, in order."""
    import pyarrow as pa

    if not columns:
        return pa.array([""] * 0, pa.string())
    return lake_join([lake_pieces(c, spark_type(t)) for c, t in zip(columns, types)])


def lake_join(pieces: Sequence[pa.Array]) -> pa.Array:
    """Each row's canonical text from its columns' pieces (:func:`lake_pieces`), in order."""
    import pyarrow.compute as pc

    return pieces[0] if len(pieces) == 1 else pc.binary_join_element_wise(*pieces, "")


# --- lookup3 (PostgreSQL's hash_bytes_extended) over whole arrays, in numpy ------------------------
_M32 = 0xFFFFFFFF
_LOW_BYTES = (0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF)
# (x, y, z, k) of mix's six lines ``x -= y; x ^= rot(y, k); y += z`` over (a, b, c) = (0, 1, 2)
_MIX = ((0, 2, 1, 4), (1, 0, 2, 6), (2, 1, 0, 8), (0, 2, 1, 16), (1, 0, 2, 19), (2, 1, 0, 4))
# (x, y, k) of final's seven lines ``x ^= y; x -= rot(y, k)``
_FINAL = ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24))
_CHUNK = 1 << 15  # rows hashed at once: the state arrays stay in the CPU's cache


def _rot_into(y: np.ndarray, k: int, t: np.ndarray, u: np.ndarray) -> np.ndarray:
    import numpy as np

    np.left_shift(y, k, out=t)
    np.right_shift(y, 32 - k, out=u)
    return np.bitwise_or(t, u, out=t)


def _mix(s: list[np.ndarray], t: np.ndarray, u: np.ndarray) -> None:
    import numpy as np

    for x, y, z, k in _MIX:
        np.subtract(s[x], s[y], out=s[x])
        np.bitwise_xor(s[x], _rot_into(s[y], k, t, u), out=s[x])
        np.add(s[y], s[z], out=s[y])


def _final(s: list[np.ndarray], t: np.ndarray, u: np.ndarray) -> None:
    import numpy as np

    for x, y, k in _FINAL:
        np.bitwise_xor(s[x], s[y], out=s[x])
        np.subtract(s[x], _rot_into(s[y], k, t, u), out=s[x])


def _lookup3(words: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seed: int | np.ndarray) -> np.ndarray:
    """hash_bytes_extended of the byte strings at ``starts`` of ``lengths`` (``words``: the
    little-endian uint32 at every byte offset of the data, 12 bytes past its end readable), with
    one seed or a seed per string."""
    import numpy as np

    n = len(starts)
    blocks = lengths // 12
    order = None
    if n and blocks.min() != blocks.max():
        order = np.argsort(-blocks, kind="stable")  # rows with more than k blocks are a prefix
        starts, lengths, blocks = starts[order], lengths[order], blocks[order]
    a = ((lengths + (0x9E3779B9 + 3923095)) & _M32).astype(np.uint32)
    s = [a, a.copy(), a.copy()]
    t, u = np.empty_like(a), np.empty_like(a)
    if isinstance(seed, np.ndarray):
        seeds = seed.view(np.uint64) if order is None else seed.view(np.uint64)[order]
        seeded = [s[0] + (seeds >> np.uint64(32)).astype(np.uint32), s[1] + seeds.astype(np.uint32), s[2].copy()]
        _mix(seeded, t, u)
        given = seeds != 0  # a zero seed is no seed
        s = seeded if given.all() else [np.where(given, x, y) for x, y in zip(seeded, s)]
    elif seed:
        s[0] += np.uint32((seed >> 32) & _M32)
        s[1] += np.uint32(seed & _M32)
        _mix(s, t, u)
    ascending = blocks[::-1]
    pos = starts.copy()
    for k in range(int(blocks[0]) if n else 0):
        m = n - int(np.searchsorted(ascending, k, side="right"))
        p = pos[:m]
        head = [x[:m] for x in s]
        head[0] += words[p]
        head[1] += words[p + 4]
        head[2] += words[p + 8]
        _mix(head, t[:m], u[:m])
        p += 12
    # The last 0 to 11 bytes: a, b and c take bytes 0-3, 4-7 and 8-10 (c's lowest byte is not used).
    rest = lengths - 12 * blocks
    low = np.array(_LOW_BYTES, np.uint32)
    s[0] += words[pos] & low[np.minimum(rest, 4)]
    s[1] += words[pos + 4] & low[np.clip(rest - 4, 0, 4)]
    s[2] += (words[pos + 8] & low[np.clip(rest - 8, 0, 3)]) << np.uint32(8)
    _final(s, t, u)
    hashed = (s[1].astype(np.uint64) << np.uint64(32)) | s[2]
    if order is None:
        return hashed.view(np.int64)
    out = np.empty(n, np.uint64)
    out[order] = hashed
    return out.view(np.int64)


def text_hashes(texts: pa.Array, seed: int | np.ndarray = 0) -> np.ndarray:
    """PostgreSQL's ``hashtextextended(t, seed)`` of each text's UTF-8 bytes, as signed int64;
    ``seed``: one (0 to 2^64 - 1) or an int64 array of one per text. Texts must not be NULL."""
    import numpy as np
    import pyarrow as pa

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    n = len(texts)
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * texts.offset).astype(np.int64)
    if n == 0:
        return np.zeros(0, np.int64)
    raw = texts.buffers()[2]
    base = np.frombuffer(raw, np.uint8) if raw is not None else np.zeros(0, np.uint8)
    out = np.empty(n, np.int64)
    for i in range(0, n, _CHUNK):
        first, last = int(offsets[i]), int(offsets[min(i + _CHUNK, n)])
        # The chunk's bytes and 16 zero bytes (lookup3 reads whole words past a text's end, then
        # masks them); the uint32 at every byte offset of them, little-endian, unaligned.
        data = np.empty(last - first + 16, np.uint8)
        data[: last - first] = base[first:last]
        data[last - first :] = 0
        words = np.ndarray(shape=(len(data) - 3,), dtype="<u4", buffer=data, strides=(1,))
        cut = offsets[i : i + _CHUNK + 1]
        seeds = seed[i : i + _CHUNK] if isinstance(seed, np.ndarray) else seed
        out[i : i + _CHUNK] = _lookup3(words, cut[:-1] - first, cut[1:] - cut[:-1], seeds)
    return out


def lake_row_hashes(texts: Sequence[pa.Array]) -> np.ndarray:
    """Each row's checksum from its columns' canonical texts (:func:`lake_text`, NULL for NULL):
    the chain :func:`source_row_hash_sql` computes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not texts:
        return np.zeros(0, np.int64)
    chain = np.zeros(len(texts[0]), np.int64)
    for text in texts:
        if isinstance(text, pa.ChunkedArray):
            text = text.combine_chunks()
        if text.null_count:
            chain ^= text.is_null().to_numpy(zero_copy_only=False).astype(np.int64)
            text = pc.fill_null(text, "")
        chain = text_hashes(text, chain)
    return chain


def hashes(texts: pa.Array, bits: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Row checksums (int64) of canonical texts, and their buckets when ``bits`` is given."""
    import numpy as np

    h = text_hashes(texts)
    return h, (None if bits is None else (h & ((1 << bits) - 1)).astype(np.int64))


def key_buckets(texts: pa.Array, bits: int) -> np.ndarray:
    """The bucket of each key's canonical text."""
    _, buckets = hashes(texts, bits)
    assert buckets is not None
    return buckets


def as_signed64(total: Any) -> int:
    """A checksum sum (any integer) mod 2^64, as a signed 64-bit integer."""
    value = int(total) % (1 << 64)
    return value - (1 << 64) if value >= (1 << 63) else value
