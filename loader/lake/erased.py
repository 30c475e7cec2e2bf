"""The erased-keys table: what the lake keeps of an erased value (a salted hash), which the load
consults to keep an erased subject's later changes out, and ``loader erase`` writes."""

from __future__ import annotations

import hashlib

ERASED_KEYS_DDL = "source_table STRING, source_column STRING, value_hash STRING, erased_at TIMESTAMP"
# The per-catalog secret salt, a property of the erased-keys table.
PROP_SALT = "loader.erasure-salt"


def value_hash(salt: str, value: str) -> str:
    """What the lake keeps of an erased value: sha256 of a per-catalog secret salt and the value."""
    return hashlib.sha256((salt + value).encode("utf-8")).hexdigest()


def erased_hashes_sql(salt_literal: str, value_sql: str) -> str:
    """Spark SQL computing :func:`value_hash` of a string expression."""
    return f"sha2(concat({salt_literal}, {value_sql}), 256)"
