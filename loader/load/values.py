"""The load's typing of values, in Arrow: a column of PostgreSQL's text (or of a snapshot file's
native Arrow values, landing v2 ``NATIVE_TYPES``) into its storage type (:mod:`loader.lake.types`).

This is the Arrow implementation of the type map, the one the load kernel runs. It gives a value
exactly what the type map's Spark SQL expressions give it, for every text PostgreSQL prints, and
raises :class:`Misfit` for a value that does not fit (where the SQL yields NULL, which the load
makes a reject): the engine decides what a misfit means.

Most values take a vectorized road: a column whose texts all have their storage type's plain form
(``lake.types.plain_text``) is cast by Arrow. Values outside it that PostgreSQL does print are
typed one by one here, by the same rules as the SQL: +/-infinity of dates and timestamps to
``NON_FINITE``, BC to astronomical years, years past 9999, offsets other than UTC. bytea (hex,
with or without ``\\x``) and one-dimensional arrays (their elements parsed with the SQL's own
regular expressions, then typed as a column of the element type) are typed here too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from loader.lake.types import (
    ARRAY_ELEMENT_REGEX,
    BYTEA_REGEX,
    DECIMAL_SQL_RE,
    NON_FINITE,
    UNESCAPE_REGEX,
    plain_text,
    spark_type,
)

if TYPE_CHECKING:
    import numpy as np


class Misfit(ValueError):
    """A value that does not fit its column's storage type (the SQL types it NULL: a reject)."""


def typed(values: Any, pg_type: str, where: str) -> Any:
    """``values`` (an Arrow string array, or a snapshot file's native integers or booleans) as
    PostgreSQL type ``pg_type``'s storage type; :class:`Misfit` naming ``where`` (table.column)
    for a value that does not fit."""
    import pyarrow as pa

    st = spark_type(pg_type)
    sql = st.sql
    if pa.types.is_boolean(values.type):
        # Booleans as the snapshot file held them (landing v2 NATIVE_TYPES): no text to check.
        if sql != "BOOLEAN":
            raise Misfit(f"{where}: booleans landed for a {pg_type} column")
        return values
    if pa.types.is_integer(values.type):
        # Integers as the snapshot file held them (landing v2 NATIVE_TYPES): no text to check.
        if sql not in ("INT", "BIGINT"):
            raise Misfit(f"{where}: integers landed for a {pg_type} column")
        try:
            return values.cast(pa.int32() if sql == "INT" else pa.int64())
        except pa.ArrowInvalid:
            raise Misfit(f"{where}: a {pg_type} value that does not fit") from None
    if st.lossless_text:
        return values
    if st.array_of is not None:
        return _array(values, pg_type.strip().lower()[:-2], where)
    if sql == "BINARY":
        return _bytea(values, where)
    if sql in NON_FINITE:
        return _temporal(values, sql, pg_type, where)
    if plain_text(sql) is None:  # pragma: no cover - every storage type is handled above or has a plain form
        raise Misfit(f"{where}: no typing for {pg_type}")
    if sql.startswith("DECIMAL("):
        fast = _plain_decimal(values, arrow_type(sql))
        if fast is not None:
            return fast
    if not plain(values, sql).all():
        raise Misfit(f"{where}: a {pg_type} value outside its plain form")
    try:
        return values.cast(arrow_type(sql))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise Misfit(f"{where}: a {pg_type} value that does not fit") from None


def plain(values: Any, sql: str) -> np.ndarray:
    """Per value, whether it has Spark SQL type ``sql``'s plain text form (``lake.types.plain_text``;
    a NULL counts as plain: nothing to check), as RE2 matching the form's regex says.

    RE2 costs 50-70 ns a value, several times the cast it guards. Numbers are first tested by
    Arrow's ASCII classes (:data:`_FAST`, 5-10 ns), which accept only texts of the form; the regex
    decides the rest (negative numbers, anything malformed), so the answer is the regex's. (Fixed
    byte positions for dates and timestamps, tried, cost as much as the regex.)"""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    form = plain_text(sql)
    if form is None:
        raise ValueError(f"no plain text form for {sql}")
    key = "DECIMAL" if sql.startswith("DECIMAL(") else sql
    fast = _FAST.get(key)
    if fast is not None and pa.types.is_string(values.type):
        ok = fast(values)
    else:
        ok = np.zeros(len(values), bool)
    if values.null_count:
        ok |= values.is_null().to_numpy(zero_copy_only=False)
    rest = np.flatnonzero(~ok)
    if len(rest):
        ok[rest] = pc.match_substring_regex(values.take(pa.array(rest)), form).to_numpy(zero_copy_only=False)
    return ok


def _ascii_digits(values: Any) -> np.ndarray:
    """Non-empty texts of ASCII digits only (``[0-9]+``)."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.ascii_is_decimal(values), False).to_numpy(zero_copy_only=False)


def _ascii_decimal(values: Any) -> np.ndarray:
    r"""``[0-9]+(\.[0-9]+)?``: digits with at most one point, which neither starts nor ends the text."""
    import pyarrow.compute as pc

    digits = pc.ascii_is_decimal(pc.replace_substring(values, ".", "", max_replacements=1))
    inner = pc.invert(pc.or_(pc.starts_with(values, "."), pc.ends_with(values, ".")))
    return pc.fill_null(pc.and_(digits, inner), False).to_numpy(zero_copy_only=False)


_FAST: dict[str, Any] = {
    "INT": _ascii_digits,
    "BIGINT": _ascii_digits,
    "DECIMAL": _ascii_decimal,
}


def typed_distinct(values: Any, pg_type: str, where: str) -> Any:
    """:func:`typed` for a column of few distinct texts (a commit time repeats on every change of
    its transaction): each distinct text typed once, then spread (a seventh of the time for a
    million commit times of a hundred transactions)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    return typed(encoded.dictionary, pg_type, where).take(encoded.indices)


def typed_or_misfits(values: Any, pg_type: str) -> tuple[Any, Any]:
    """``values`` typed as :func:`typed` types them, with the misfits as data: (typed values with
    NULL where a value does not fit, a boolean mask of those values, or None when every value
    fits). The vectorized typing runs first; a column it refuses is halved until each misfit is
    alone (typing is per value, so a part types alike on its own), at a cost of about
    ``misfits x log2(rows)`` typings instead of one per row."""
    import pyarrow as pa

    try:
        return typed(values, pg_type, ""), None
    except Misfit:
        pass
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    parts: list[Any] = []
    misfit: list[Any] = []
    pending = [values]
    while pending:
        part = pending.pop()
        try:
            parts.append(typed(part, pg_type, ""))
            misfit.append(pa.array([False] * len(part), pa.bool_()))
            continue
        except Misfit:
            if len(part) > 1:
                half = len(part) // 2
                pending += [part.slice(half), part.slice(0, half)]  # the first half is typed first
                continue
        parts.append(None)
        misfit.append(pa.array([True], pa.bool_()))
    storage = next((p.type for p in parts if p is not None), None) or typed(values.slice(0, 0), pg_type, "").type
    typed_parts = [p if p is not None else pa.nulls(1, storage) for p in parts]
    return pa.concat_arrays(typed_parts), pa.concat_arrays(misfit)


def arrow_type(sql: str) -> Any:
    """The Arrow type of Spark SQL storage type ``sql`` (scalars)."""
    import pyarrow as pa

    m = DECIMAL_SQL_RE.match(sql)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    return {
        "INT": pa.int32(),
        "BIGINT": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "BOOLEAN": pa.bool_(),
        "DATE": pa.date32(),
        "TIMESTAMP_NTZ": pa.timestamp("us"),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "BINARY": pa.binary(),
    }[sql]


# --- dates and timestamps -------------------------------------------------------------------

# A plain value of each temporal type, standing in for the others during the vectorized cast.
_STAND_IN = {"DATE": "1970-01-01", "TIMESTAMP_NTZ": "1970-01-01 00:00:00", "TIMESTAMP": "1970-01-01 00:00:00+00"}

# PostgreSQL's ISO output of date, timestamp and timestamptz (DateStyle ISO): years of four or more
# digits, microseconds without trailing zeros, an offset of hours[:minutes[:seconds]], ' BC'.
_DATE_TEXT = r"(\d{4,})-(\d{2})-(\d{2})"
_TIME_TEXT = r" (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?"
_OFFSET_TEXT = r"([+-])(\d{2})(?::(\d{2})(?::(\d{2}))?)?"
_PG_TEMPORAL = {
    "DATE": re.compile(_DATE_TEXT + r"( BC)?\Z"),
    "TIMESTAMP_NTZ": re.compile(_DATE_TEXT + _TIME_TEXT + r"( BC)?\Z"),
    "TIMESTAMP": re.compile(_DATE_TEXT + _TIME_TEXT + _OFFSET_TEXT + r"( BC)?\Z"),
}
_DAY_US = 86_400_000_000
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_MAX_OFFSET_S = 18 * 3600  # java.time.ZoneOffset's range, which Spark's cast applies


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date of astronomical ``year`` (any year):
    the calendar of PostgreSQL and of Spark (H. Hinnant's algorithm)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def temporal_number(text: str, sql: str) -> int | None:
    """PostgreSQL's text of a date (``sql`` DATE: days since 1970-01-01), a timestamp
    (TIMESTAMP_NTZ: microseconds since 1970-01-01 00:00) or a timestamptz (TIMESTAMP: microseconds
    since the epoch, UTC) as the lake stores it; None if it does not fit."""
    if text in ("infinity", "-infinity"):
        return NON_FINITE[sql][0 if text == "infinity" else 1]
    m = _PG_TEMPORAL[sql].match(text)
    if m is None:
        return None
    g = m.groups()
    year, month, day = int(g[0]), int(g[1]), int(g[2])
    if g[-1]:  # ' BC': 1 BC is year 0
        if year == 0:
            return None
        year = 1 - year
    if not 1 <= month <= 12 or not 1 <= day <= _month_days(year, month):
        return None
    days = days_from_civil(year, month, day)
    if sql == "DATE":
        return days if _INT32[0] <= days <= _INT32[1] else None
    hour, minute, second = int(g[3]), int(g[4]), int(g[5])
    if hour > 23 or minute > 59 or second > 59:
        return None
    us = days * _DAY_US + ((hour * 60 + minute) * 60 + second) * 1_000_000 + int((g[6] or "").ljust(6, "0"))
    if sql == "TIMESTAMP":
        oh, om, os_ = int(g[8]), int(g[9] or 0), int(g[10] or 0)
        if om > 59 or os_ > 59:
            return None
        offset = (oh * 60 + om) * 60 + os_
        if offset > _MAX_OFFSET_S:
            return None
        us -= (offset if g[7] == "+" else -offset) * 1_000_000
    return us if _INT64[0] <= us <= _INT64[1] else None


def _temporal(values: Any, sql: str, pg_type: str, where: str) -> Any:
    """Dates and timestamps: plain texts converted in C (:func:`_plain_temporal`) or cast by
    Arrow, the rest (infinity, BC, long years, offsets) one by one with :func:`temporal_number`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    base, odd_np = _plain_temporal(values, sql) or _cast_temporal(values, sql)
    n_odd = int(odd_np.sum())
    if not n_odd:
        return base
    odd = pa.array(odd_np)
    numbers = []
    for text in values.filter(odd).to_pylist():
        number = temporal_number(text, sql)
        if number is None:
            raise Misfit(f"{where}: a {pg_type} value that does not fit ({text[:40]!r})")
        numbers.append(number)
    storage = pa.int32() if sql == "DATE" else pa.int64()
    return pc.replace_with_mask(base, odd, pa.array(numbers, storage).cast(arrow_type(sql)))


def _cast_temporal(values: Any, sql: str) -> tuple[Any, np.ndarray]:
    """Dates or timestamps (``sql``) whose text has the plain form (RE2) cast by Arrow: (the typed
    values, nulls where a text is NULL or odd; whether each value is odd, for
    :func:`temporal_number` to decide). A plain-looking text Arrow refuses (2024-02-30) makes
    every value odd, so that the one that does not fit is named."""
    import pyarrow as pa
    import pyarrow.compute as pc

    odd_np = ~plain(values, sql)
    stood_in = values
    if odd_np.any():
        stood_in = pc.if_else(pa.array(odd_np), pa.scalar(_STAND_IN[sql], values.type), values)
    try:
        if sql == "TIMESTAMP":  # '...+00': the UTC instant of the local date-time before the offset
            return pc.utf8_slice_codeunits(stood_in, 0, -3).cast(pa.timestamp("us")).cast(arrow_type(sql)), odd_np
        return stood_in.cast(arrow_type(sql)), odd_np
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(values), arrow_type(sql)), values.is_valid().to_numpy(zero_copy_only=False)


_TEMPORAL_KIND = {"DATE": 0, "TIMESTAMP_NTZ": 1, "TIMESTAMP": 2}


def _string_buffers(values: Any) -> tuple[Any, Any] | None:
    """A string array's offsets and character buffers, for the compiled parser (``_typing_c``);
    None where the parser is not built or the array is not a plain string array."""
    import pyarrow as pa

    if _typing_c is None or not pa.types.is_string(values.type):
        return None
    _, offsets, data = values.buffers()
    if offsets is None:
        return None
    return offsets, data if data is not None else b""


def _plain_temporal(values: Any, sql: str) -> tuple[Any, np.ndarray] | None:
    """A string array of dates or timestamps (``sql``) converted by the compiled parser
    (``loader/load/_typing.c``: the plain form, checked and converted in one pass, about 10 ns a
    value against RE2's 50-70 and the cast's as much): (the typed values, with nulls where the
    text is NULL or odd; whether each value is odd: not in its plain form, or no real date and
    time, for :func:`temporal_number` to decide). None where the parser is not built or the array
    is not a plain string array (the regex and Arrow's cast then do the same)."""
    import numpy as np
    import pyarrow as pa

    buffers = _string_buffers(values)
    if buffers is None:
        return None
    n = len(values)
    numbers, odd = _typing_c.temporal(*buffers, values.offset, n, _TEMPORAL_KIND[sql])
    odd_np = np.frombuffer(odd, np.bool_)
    valid = None
    if values.null_count:
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        odd_np = odd_np & valid
    storage = pa.int32() if sql == "DATE" else pa.int64()
    ints = np.frombuffer(numbers, np.int64)
    base = pa.array(ints.astype(np.int32) if sql == "DATE" else ints, storage, mask=None if valid is None else ~valid)
    return base.cast(arrow_type(sql)), odd_np


def _plain_decimal(values: Any, storage: Any) -> Any:
    """A string array of numerics typed as ``storage`` (a decimal128) by the compiled parser
    (``loader/load/_typing.c``) when every text is in the plain form and fits: exactly what the
    plain-form test and Arrow's cast give then, in one pass (about 10 ns a value against their
    60). None when one text is not, or where the parser is not built: the caller's regex and cast
    decide, as before."""
    import numpy as np
    import pyarrow as pa

    buffers = _string_buffers(values)
    if buffers is None:
        return None
    n = len(values)
    nulls = values.is_null().to_numpy(zero_copy_only=False).view(np.uint8) if values.null_count else b""
    numbers = _typing_c.decimal(*buffers, values.offset, n, nulls, storage.precision, storage.scale)
    if numbers is None:
        return None
    # A NULL text is a NULL value: the validity bitmap of is_valid()'s answer (its own offset 0).
    validity = values.is_valid().buffers()[1] if values.null_count else None
    return pa.Array.from_buffers(storage, n, [validity, pa.py_buffer(numbers)])


try:
    from loader.load import _typing as _typing_c  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - built wherever a C compiler is (setup.py)
    _typing_c = None


# --- bytea ----------------------------------------------------------------------------------

_HEX_DIGITS = [0] * 256
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_DIGITS[ord(_c)] = _HEX_DIGITS[ord(_c.upper())] = _i


def _bytea(values: Any, where: str) -> Any:
    """bytea's hex text (wal2json prints it bare, PostgreSQL's own text starts with ``\\x``) as
    its bytes, vectorized: every text checked against the SQL's pattern, then the digits of all
    values decoded at once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    present = values.drop_null()
    if len(present) and not pc.all(pc.match_substring_regex(present, BYTEA_REGEX)).as_py():
        raise Misfit(f"{where}: a bytea value that is not hex")
    digits = pc.replace_substring_regex(pc.fill_null(values, ""), r"^\\x", "").cast(pa.string())
    digits = pa.concat_arrays([digits])  # offset 0, buffers of its own
    offsets = np.frombuffer(digits.buffers()[1], np.int32)[: len(digits) + 1]
    data = np.frombuffer(digits.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    nibbles = np.asarray(_HEX_DIGITS, np.uint8)[data]
    raw = (nibbles[0::2] << 4) | nibbles[1::2]
    out = pa.BinaryArray.from_buffers(
        pa.binary(),
        len(digits),
        [None, pa.py_buffer(((offsets - offsets[0]) // 2).astype(np.int32)), pa.py_buffer(raw)],
    )
    return pc.if_else(values.is_null(), pa.scalar(None, pa.binary()), out)


# --- one-dimensional arrays -----------------------------------------------------------------

_ARRAY_ITEMS = re.compile(ARRAY_ELEMENT_REGEX)
_UNESCAPE = re.compile(UNESCAPE_REGEX)
_ELEMENT_BOOLEANS = {"t": "true", "f": "false"}


def array_elements(text: str) -> list[str | None] | None:
    """The elements of a one-dimensional PostgreSQL array literal as texts (None: a NULL element),
    read with the type map's own patterns; None for a literal that does not fit (more dimensions,
    explicit bounds, not an array)."""
    if not (text.startswith("{") and not text.startswith("{{") and text.endswith("}")):
        return None
    out: list[str | None] = []
    for item in _ARRAY_ITEMS.findall(text):
        if item.startswith('"'):
            out.append(_UNESCAPE.sub(r"\1", item[1:-1]))
        else:
            out.append(None if item == "NULL" else item)
    return out


def _array(values: Any, element_type: str, where: str) -> Any:
    """A 1-D array column: every literal split into its elements, the elements typed as one
    column of ``element_type`` (a misfit element is a misfit value, as in the SQL)."""
    import pyarrow as pa

    flat: list[str | None] = []
    offsets = [0]
    nulls = []
    for text in values.to_pylist():
        if text is not None:
            elements = array_elements(text)
            if elements is None:
                raise Misfit(f"{where}: a {element_type}[] value that is not a one-dimensional array")
            flat.extend(elements)
        offsets.append(len(flat))
        nulls.append(text is None)
    if spark_type(element_type).sql == "BOOLEAN":  # PostgreSQL prints booleans in arrays as t and f
        flat = [_ELEMENT_BOOLEANS.get(e, e) if e is not None else None for e in flat]
    items = typed(pa.array(flat, pa.string()), element_type, where)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, mask=pa.array(nulls, pa.bool_()))
