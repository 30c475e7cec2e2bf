"""PostgreSQL type -> Spark/Iceberg type, and the Spark SQL expression that types a text value.

Pure functions: no Spark session needed. Every landed value is PostgreSQL's text form; the load
types it with an expression that yields NULL for a value that does not fit, so the load can turn
that into a reject instead of a silent NULL. Types Iceberg cannot hold losslessly as a native type
keep their exact PostgreSQL text (see README, "Type mapping").

Mapping (PostgreSQL as wal2json prints it -> Iceberg):
  smallint, integer                      -> int
  bigint, oid                            -> long
  real / double precision                -> float / double
  numeric(p,s), p <= 38                  -> decimal(p,s)
  numeric(p,s), p > 38; numeric          -> string (exact text: unconstrained numeric has up to 131072 digits)
  boolean                                -> boolean
  date                                   -> date
  timestamp[(n)] without time zone       -> timestamp (without zone, Spark TIMESTAMP_NTZ)
  timestamp[(n)] with time zone          -> timestamptz (UTC instant, Spark TIMESTAMP)
    Every value is kept (see ``NON_FINITE``): BC values become astronomical years (1 BC is year 0,
    as in ISO 8601 and Spark), years past 9999 stay as they are, and +/-infinity map to the last /
    first value Spark holds (int32 days and int64 microseconds at their limits).
  bytea                                  -> binary
  1-D arrays of int/bigint/real/double/numeric(p,s)/boolean/date/text/varchar/char/uuid
                                         -> list<element>  (multi-dimensional values are rejected)
  uuid, json, jsonb, text, varchar(n), char(n), time[tz], interval, money, inet, cidr, macaddr,
  enums, domains, ranges, bit, xml, geometric, other arrays
                                         -> string (exact PostgreSQL text)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NUMERIC_RE = re.compile(r"^numeric\((\d+),(\d+)\)\Z")
_NUMERIC_P_RE = re.compile(r"^numeric\((\d+)\)\Z")
_TS_RE = re.compile(r"^timestamp(?:\(\d+\))? (with|without) time zone\Z")
_TEXT_ELEMENT_RE = re.compile(
    r"^(text|character varying(\(\d+\))?|varchar(\(\d+\))?|character(\(\d+\))?|bpchar|uuid|name)\Z"
)

# A PostgreSQL array literal's elements: a double-quoted element (backslash escapes) or a bare one.
ARRAY_ELEMENT_REGEX = r'"(?:[^"\\]|\\.)*"|[^,{}"]+'
# Java regexes used inside Spark SQL string literals (see sql_string).
UNESCAPE_REGEX = r"(?s)\\(.)"
BYTEA_REGEX = r"^(\\x)?([0-9a-fA-F]{2})*$"
_BYTEA_PREFIX_REGEX = r"^\\x"
_TZ_HOURS_REGEX = r"([+-][0-9]{2})$"
_DATE_REGEX = r"^-?[0-9]{4,}-[0-9]{2}-[0-9]{2}$"


def quote_ident(name: str) -> str:
    """Backtick-quote a Spark identifier (names may need quoting at the source too)."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_regex(regex: str) -> str:
    """A Java regex as a Spark SQL string literal."""
    return sql_string(regex)


@dataclass(frozen=True)
class SparkType:
    """How one PostgreSQL type is stored in history/current tables."""

    sql: str  # Spark SQL type for DDL
    cast: str  # template: "{v}" stands for the text value; NULL only for NULL input or a misfit
    lossless_text: bool = False  # stored as its exact PostgreSQL text
    array_of: SparkType | None = None  # element type of a native array


def _text() -> SparkType:
    return SparkType("STRING", "{v}", lossless_text=True)


def _cast(sql: str) -> SparkType:
    return SparkType(sql, f"try_cast({{v}} AS {sql})")


# +/-infinity of date, timestamp and timestamptz, as the limits of the storage types: int32 days and
# int64 microseconds since 1970-01-01 (UTC). PostgreSQL's own finite range (4713 BC to 5874897 AD
# for dates, to 294276 AD for timestamps) lies strictly inside for dates and for -infinity, so those
# read back unambiguously; +infinity of a timestamp is Spark's last instant, 294247-01-10
# 04:00:54.775807, which a finite PostgreSQL timestamp could also be (nothing later fits at all).
NON_FINITE = {
    "DATE": (2147483647, -2147483648),
    "TIMESTAMP": (9223372036854775807, -9223372036854775808),
    "TIMESTAMP_NTZ": (9223372036854775807, -9223372036854775808),
}
_NTZ_LIMITS = ("+294247-01-10 04:00:54.775807", "-290308-12-21 19:59:05.224192")


def _astronomical_year(v: str) -> str:
    """SQL: PostgreSQL's text of a BC date or timestamp ('0044-03-15 BC') in the signed,
    astronomical-year form Spark parses ('-0043-03-15'); any other text unchanged."""
    year = f"substring_index({v}, '-', 1)"
    return (
        f"IF(endswith({v}, ' BC'), concat(IF({year} = '0001', '', '-'), "
        f"lpad(CAST(CAST({year} AS INT) - 1 AS STRING), 4, '0'), "
        f"substr({v}, length({year}) + 1, length({v}) - length({year}) - 3)), {v})"
    )


def _temporal(sql_type: str, finite: str, plus: str, minus: str) -> SparkType:
    """A date/time type: +/-infinity to its limits, BC to astronomical years, the rest by ``finite``
    (a template typing ``{v}``, given the value with its BC suffix already rewritten)."""
    return SparkType(
        sql_type,
        f"CASE {{v}} WHEN 'infinity' THEN {plus} WHEN '-infinity' THEN {minus}"
        f" ELSE {finite.replace('{v}', '(' + _astronomical_year('{v}') + ')')} END",
    )


# Timestamps: wal2json prints timestamptz with a '+00' style offset; Spark parses '+00:00'.
# The UTC form capture always prints ('...+00', TimeZone=UTC) takes a faster road with the same
# result: Spark resolves an explicit zone in a timestamp string by compiling two regular
# expressions for every value (SparkDateTimeUtils.getZoneId), ~5% of a load's CPU. Without the
# zone the text parses as a local date-time (no session time zone involved), and its distance from
# the epoch in microseconds is the UTC instant (years of four digits only: near Spark's last
# representable instant, 294247, the difference overflows in some session time zones).
UTC_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?\+00$"
_TSTZ_ANY = "try_cast(regexp_replace({v}, " + sql_regex(_TZ_HOURS_REGEX) + ", '$1:00') AS TIMESTAMP)"
_TSTZ_UTC = (
    "timestamp_micros(timestampdiff(MICROSECOND, TIMESTAMP_NTZ'1970-01-01 00:00:00',"
    " try_cast(substr({v}, 1, length({v}) - 3) AS TIMESTAMP_NTZ)))"
)
_TSTZ = _temporal(
    "TIMESTAMP",
    f"IF({{v}} RLIKE {sql_regex(UTC_TEXT)}, {_TSTZ_UTC}, {_TSTZ_ANY})",
    f"timestamp_micros({NON_FINITE['TIMESTAMP'][0]})",
    f"timestamp_micros({NON_FINITE['TIMESTAMP'][1]})",
)
_TIMESTAMP_NTZ = _temporal(
    "TIMESTAMP_NTZ",
    "try_cast({v} AS TIMESTAMP_NTZ)",
    f"CAST('{_NTZ_LIMITS[0]}' AS TIMESTAMP_NTZ)",
    f"CAST('{_NTZ_LIMITS[1]}' AS TIMESTAMP_NTZ)",
)

# The plain text forms: the text of each native storage type that Spark's casts above and Arrow's
# casts (the driver load) read to the same value. A column whose values all match its form may be
# typed by either engine; anything else (infinity, BC, years past 9999, other offsets than UTC,
# exponents in numerics, `t`/`f`) only by the casts above. RE2 and Java read these alike.
_PLAIN_TEXT = {
    "INT": r"^-?[0-9]+$",
    "BIGINT": r"^-?[0-9]+$",
    "DECIMAL": r"^-?[0-9]+(\.[0-9]+)?$",
    "FLOAT": r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|-?Infinity)$",
    "DOUBLE": r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|-?Infinity)$",
    "BOOLEAN": r"^(true|false)$",
    "DATE": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
    "TIMESTAMP_NTZ": r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?$",
    "TIMESTAMP": UTC_TEXT,
}


def plain_text(sql: str) -> str | None:
    """The plain text form (a regex) of Spark SQL type ``sql``; None for a type only Spark types."""
    return _PLAIN_TEXT.get("DECIMAL" if sql.startswith("DECIMAL(") else sql)


_SIMPLE: dict[str, SparkType] = {
    "smallint": _cast("INT"),
    "int2": _cast("INT"),
    "integer": _cast("INT"),
    "int4": _cast("INT"),
    "int": _cast("INT"),
    "bigint": _cast("BIGINT"),
    "int8": _cast("BIGINT"),
    "oid": _cast("BIGINT"),
    "real": _cast("FLOAT"),
    "float4": _cast("FLOAT"),
    "double precision": _cast("DOUBLE"),
    "float8": _cast("DOUBLE"),
    "boolean": _cast("BOOLEAN"),
    "bool": _cast("BOOLEAN"),
    "date": _temporal(
        "DATE",
        "IF({v} RLIKE " + sql_regex(_DATE_REGEX) + ", try_cast({v} AS DATE), NULL)",
        f"date_from_unix_date({NON_FINITE['DATE'][0]})",
        f"date_from_unix_date({NON_FINITE['DATE'][1]})",
    ),
    "timestamp": _TIMESTAMP_NTZ,
    "timestamptz": _TSTZ,
    # wal2json renders bytea as hex without the leading \x (PostgreSQL's own text form has it).
    "bytea": SparkType(
        "BINARY",
        "IF({v} RLIKE "
        + sql_regex(BYTEA_REGEX)
        + ", unhex(regexp_replace({v}, "
        + sql_regex(_BYTEA_PREFIX_REGEX)
        + ", '')), NULL)",
    ),
}

# Array element types that become native Spark arrays (only 1-D values; see _array_type).
_ARRAY_ELEMENT_TYPES = {
    "smallint",
    "int2",
    "integer",
    "int4",
    "int",
    "bigint",
    "int8",
    "real",
    "float4",
    "double precision",
    "float8",
    "boolean",
    "bool",
    "date",
}


def _scalar_type(t: str) -> SparkType:
    if t in _SIMPLE:
        return _SIMPLE[t]
    m = _TS_RE.match(t)
    if m:
        return _TSTZ if m.group(1) == "with" else _TIMESTAMP_NTZ
    m = _NUMERIC_RE.match(t) or _NUMERIC_P_RE.match(t)
    if m:
        precision = int(m.group(1))
        scale = int(m.group(2)) if m.lastindex and m.lastindex >= 2 else 0
        if precision <= 38:
            return _cast(f"DECIMAL({precision},{scale})")
    return _text()


def _array_type(element: str) -> SparkType | None:
    """Native array for a 1-D PostgreSQL array of a scalar type, else None (kept as text).

    The expression parses PostgreSQL's array literal: quoted elements (with backslash escapes),
    bare elements and the bare NULL marker (a quoted "NULL" is the string NULL). A value with more
    than one dimension or explicit bounds ('[0:1]={..}') does not fit and yields NULL -> reject.
    """
    if _TEXT_ELEMENT_RE.match(element):
        elem = _text()
    elif element in _ARRAY_ELEMENT_TYPES or _NUMERIC_RE.match(element):
        elem = _scalar_type(element)
        if elem.lossless_text:
            return None
    else:
        return None
    items = "regexp_extract_all({v}, " + sql_regex(ARRAY_ELEMENT_REGEX) + ", 0)"
    raw_elem = (
        "IF(substr(_e, 1, 1) = '\"', regexp_replace(substr(_e, 2, length(_e) - 2), "
        + sql_regex(UNESCAPE_REGEX)
        + ", '$1'), IF(_e = 'NULL', NULL, _e))"
    )
    typed_elem = elem.cast.replace("{v}", "_x")
    # Elements are parsed into text first, then typed; any element that fails to type
    # makes the whole value NULL (a reject), never a silently NULL element.
    parsed = f"transform({items}, _e -> {raw_elem})"
    well_formed = "(startswith({v}, '{') AND NOT startswith({v}, '{{') AND endswith({v}, '}'))"
    cast = (
        f"IF({well_formed}, "
        f"IF(exists({parsed}, _x -> _x IS NOT NULL AND ({typed_elem}) IS NULL), NULL, "
        f"transform({parsed}, _x -> {typed_elem})), NULL)"
    )
    return SparkType(f"ARRAY<{elem.sql}>", cast, array_of=elem)


def spark_type(pg_type: str) -> SparkType:
    """Map a PostgreSQL type name (as wal2json prints it) to its storage type."""
    t = pg_type.strip().lower()
    if t.endswith("[]"):
        return _array_type(t[:-2]) or _text()
    return _scalar_type(t)


def typed_expr(pg_type: str, value_sql: str) -> str:
    return spark_type(pg_type).cast.replace("{v}", value_sql)


# Fixed-length types are never TOASTed: such a column missing from an update was dropped at
# the source, not left unchanged (see loader.load.history: dropped columns).
_FIXED_LENGTH_RE = re.compile(
    r"^(smallint|int2|integer|int4|int|bigint|int8|oid|real|float4|double precision|float8|boolean|bool|date"
    r"|timestamp(\(\d+\))? with(out)? time zone|timestamp|timestamptz|time(\(\d+\))? with(out)? time zone"
    r"|uuid|money|interval(\(\d+\))?|macaddr|macaddr8|\"char\")$"
)


def never_toasted(pg_type: str) -> bool:
    """True for fixed-length PostgreSQL types, which wal2json always sends on an update."""
    return bool(_FIXED_LENGTH_RE.match(pg_type.strip().lower()))


DECIMAL_SQL_RE = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")


def iceberg_type(sql: str) -> Any:
    """The Iceberg type Spark's Iceberg catalog gives a column of Spark SQL type ``sql`` (the
    storage types of :func:`spark_type` and the metadata columns), as pyiceberg writes it: what a
    table created without Spark must hold to be the table Spark would have created. Element ids of
    lists are placeholders (a new table's ids are assigned afresh)."""
    from pyiceberg import types as it

    t = sql.strip().upper()
    simple = {
        "INT": it.IntegerType(),
        "BIGINT": it.LongType(),
        "FLOAT": it.FloatType(),
        "DOUBLE": it.DoubleType(),
        "BOOLEAN": it.BooleanType(),
        "DATE": it.DateType(),
        "TIMESTAMP": it.TimestamptzType(),
        "TIMESTAMP_NTZ": it.TimestampType(),
        "STRING": it.StringType(),
        "BINARY": it.BinaryType(),
    }
    if t in simple:
        return simple[t]
    m = DECIMAL_SQL_RE.match(t)
    if m:
        return it.DecimalType(int(m.group(1)), int(m.group(2)))
    if t.startswith("ARRAY<") and t.endswith(">"):
        return it.ListType(element_id=0, element_type=iceberg_type(sql.strip()[6:-1]), element_required=False)
    raise ValueError(f"no Iceberg type for Spark SQL type {sql!r}")
