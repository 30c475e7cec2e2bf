"""Reversible, collision-free names: PostgreSQL schema/table/column names -> Iceberg, Spark and dbt names.

Tables. ``history.<name>`` / ``current.<name>`` where ``name = part(schema) + "__" + part(table)``.
A part is the PostgreSQL name itself when it is "plain": lower-case ASCII letters and digits in
runs joined by single underscores (``public``, ``order_items``, ``v2``), which is what almost every
schema uses. Any other name (upper case, a double or edge underscore, a dot, a quote, a space,
Unicode) is written ``_<slug>_<base32>``: a readable slug, then the exact UTF-8 bytes in
lower-case base32. Plain parts never start with ``_`` and never contain ``__``; encoded parts start
with ``_`` and contain no ``__`` either, so the first ``__`` of a table name always separates schema
from table and every name decodes back to exactly one (schema, table): ``a__b.c`` and ``a.b__c`` get
different names. Names stay within [a-z0-9_], so no client needs to quote them for case, and stay
under the catalog's 255-character limit for PostgreSQL's 63-byte names.

Columns. A source column keeps its own name in history and current tables unless it would collide
with the loader's columns: a name equal (ignoring case) to a metadata column, or starting (ignoring
case) with the reserved prefix ``pg__``, is stored as ``pg__`` + name. Every internal alias the loader
uses in its SQL is ``pg__`` followed by a word that does not start with ``pg``, so no source column
can ever meet one (``_reason``, ``_kind``, ``pg_lsn`` are all safe as source column names).
"""

from __future__ import annotations

import base64
import re

# Metadata columns of history and current tables (see loader.lake.tables); reserved for the loader.
METADATA_COLUMNS = frozenset(
    {
        "pg_lsn",
        "pg_seq",
        "pg_txn_id",
        "pg_operation",
        "pg_txn_timestamp",
        "pg_change_lsn",
        "pg_old_key",
        "pg_absent_columns",
        "pg_landing_file",
        "pg_note",
    }
)
RESERVED_PREFIX = "pg__"
TABLE_SEPARATOR = "__"

_PLAIN_PART = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*\Z")
_SLUG_BREAK = re.compile(r"[^a-z0-9]+")
# Longest readable slug kept before the exact base32 form; the slug is dropped when the whole part
# would pass _MAX_PART, so that two parts and the separator fit the JDBC catalog's VARCHAR(255).
_MAX_SLUG = 24
_MAX_PART = 120


def encode_part(name: str) -> str:
    """One schema or table name -> its Iceberg form (identity for plain names)."""
    if not name:
        raise ValueError("an empty name cannot be encoded")
    if _PLAIN_PART.fullmatch(name):
        return name
    exact = base64.b32encode(name.encode("utf-8")).decode("ascii").rstrip("=").lower()
    slug = _SLUG_BREAK.sub("_", name.lower()).strip("_")[:_MAX_SLUG].strip("_")
    encoded = f"_{slug}_{exact}" if slug else f"_{exact}"
    if len(encoded) > _MAX_PART:
        encoded = f"_{exact}"
    return encoded


def decode_part(encoded: str) -> str:
    """Inverse of :func:`encode_part`."""
    if not encoded.startswith("_"):
        if not _PLAIN_PART.fullmatch(encoded):
            raise ValueError(f"{encoded!r} is not a loader table name part")
        return encoded
    exact = encoded.rsplit("_", 1)[1].upper()
    padded = exact + "=" * (-len(exact) % 8)
    try:
        return base64.b32decode(padded).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{encoded!r} is not a loader table name part") from exc


def table_name(schema: str, table: str) -> str:
    """Iceberg table name of source table ``schema.table`` (in the history/current namespaces)."""
    return encode_part(schema) + TABLE_SEPARATOR + encode_part(table)


def parse_table_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`table_name`: (schema, table)."""
    schema, sep, table = name.partition(TABLE_SEPARATOR)
    if not sep or not schema or not table:
        raise ValueError(f"{name!r} is not a loader table name (schema__table)")
    return decode_part(schema), decode_part(table)


def is_reserved_column(name: str) -> bool:
    low = name.lower()
    return low in METADATA_COLUMNS or low.startswith(RESERVED_PREFIX)


def lake_column(source_column: str) -> str:
    """Name of a source column in history and current tables."""
    return RESERVED_PREFIX + source_column if is_reserved_column(source_column) else source_column


def source_column(lake: str) -> str:
    """Inverse of :func:`lake_column`."""
    if lake.lower().startswith(RESERVED_PREFIX):
        rest = lake[len(RESERVED_PREFIX) :]
        if is_reserved_column(rest):
            return rest
        raise ValueError(f"{lake!r} is a loader column, not a source column")
    return lake


def internal(word: str) -> str:
    """An alias for the loader's own SQL: can never equal a source column's lake name."""
    if word.lower().startswith("pg"):
        raise ValueError(f"internal alias words must not start with 'pg': {word!r}")
    return RESERVED_PREFIX + word
