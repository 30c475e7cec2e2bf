"""PostgreSQL type -> Spark/Iceberg type, and the Spark SQL expression that types a text value.

Pure functions: no Spark session needed. Every landed value is PostgreSQL's text form; the load
casts it with ``try_cast`` so a value that does not fit becomes a reject instead of a NULL.
Types Iceberg cannot hold losslessly as a native type keep their exact text (see README).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMERIC_RE = re.compile(r"^numeric\((\d+),(\d+)\)$")
_NUMERIC_P_RE = re.compile(r"^numeric\((\d+)\)$")


@dataclass(frozen=True)
class SparkType:
    """How one PostgreSQL type is stored in history/current tables."""

    sql: str  # Spark SQL type for DDL
    cast: str  # template with {v} for the text value; must yield NULL only for NULL input
    lossless_text: bool = False  # stored as its exact PostgreSQL text


def _text() -> SparkType:
    return SparkType("STRING", "{v}", lossless_text=True)


_SIMPLE: dict[str, SparkType] = {
    "smallint": SparkType("INT", "try_cast({v} AS INT)"),
    "int2": SparkType("INT", "try_cast({v} AS INT)"),
    "integer": SparkType("INT", "try_cast({v} AS INT)"),
    "int4": SparkType("INT", "try_cast({v} AS INT)"),
    "int": SparkType("INT", "try_cast({v} AS INT)"),
    "bigint": SparkType("BIGINT", "try_cast({v} AS BIGINT)"),
    "int8": SparkType("BIGINT", "try_cast({v} AS BIGINT)"),
    "oid": SparkType("BIGINT", "try_cast({v} AS BIGINT)"),
    "real": SparkType("FLOAT", "try_cast({v} AS FLOAT)"),
    "float4": SparkType("FLOAT", "try_cast({v} AS FLOAT)"),
    "double precision": SparkType("DOUBLE", "try_cast({v} AS DOUBLE)"),
    "float8": SparkType("DOUBLE", "try_cast({v} AS DOUBLE)"),
    "boolean": SparkType("BOOLEAN", "try_cast({v} AS BOOLEAN)"),
    "bool": SparkType("BOOLEAN", "try_cast({v} AS BOOLEAN)"),
    "date": SparkType("DATE", "try_cast({v} AS DATE)"),
    "timestamp without time zone": SparkType("TIMESTAMP_NTZ", "try_cast({v} AS TIMESTAMP_NTZ)"),
    "timestamp": SparkType("TIMESTAMP_NTZ", "try_cast({v} AS TIMESTAMP_NTZ)"),
    "timestamp with time zone": SparkType("TIMESTAMP", "try_cast({v} AS TIMESTAMP)"),
    "timestamptz": SparkType("TIMESTAMP", "try_cast({v} AS TIMESTAMP)"),
    # wal2json renders bytea as hex without the leading \x.
    "bytea": SparkType("BINARY", "unhex(IF(substr({v}, 1, 2) = concat(chr(92), 'x'), substr({v}, 3), {v}))"),
}


def spark_type(pg_type: str) -> SparkType:
    """Map a PostgreSQL type name (as wal2json prints it) to its storage type."""
    t = pg_type.strip().lower()
    if t in _SIMPLE:
        return _SIMPLE[t]
    m = _NUMERIC_RE.match(t) or _NUMERIC_P_RE.match(t)
    if m:
        precision = int(m.group(1))
        scale = int(m.group(2)) if m.lastindex and m.lastindex >= 2 else 0
        if precision <= 38:
            return SparkType(f"DECIMAL({precision},{scale})", f"try_cast({{v}} AS DECIMAL({precision},{scale}))")
        return _text()
    # numeric without a typmod, uuid, json/jsonb, text, varchar, char, time, interval, enums,
    # arrays, network types, money, ranges, domains: exact text keeps every value.
    return _text()


def typed_expr(pg_type: str, value_sql: str) -> str:
    return spark_type(pg_type).cast.format(v=value_sql)


def quote_ident(name: str) -> str:
    """Backtick-quote a Spark identifier (names may need quoting at the source too)."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
