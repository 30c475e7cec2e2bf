"""What the source catalog says about captured tables: keys, replica identity, column types.

wal2json's ``pk`` lists only a PRIMARY KEY. A table whose replica identity is a unique index
(``REPLICA IDENTITY USING INDEX``) still has a usable key, so capture asks the catalog for it.
Tables with neither a primary key nor a usable identity can only get history, and wal2json does
not even decode their updates and deletes under REPLICA IDENTITY DEFAULT or NOTHING: the report
(``loader tables``, the capture summary) says so per table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

IDENTITY_NAMES = {"d": "default", "f": "full", "n": "nothing", "i": "index"}


@dataclass(frozen=True)
class SourceTableInfo:
    schema: str
    table: str
    replica_identity: str  # default / full / nothing / index
    primary_key: list[str] = field(default_factory=list)
    identity_index_columns: list[str] = field(default_factory=list)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def key(self) -> list[str]:
        """Columns that identify a row downstream: what updates and deletes carry as the old key.

        That is the replica identity: the USING INDEX columns when set (even when the table also
        has a primary key), else the primary key (DEFAULT, or FULL, whose old row contains it).
        Empty when updates and deletes are not decoded at all (NOTHING, DEFAULT without a key).
        """
        if not self.updates_deletes_captured:
            return []
        if self.replica_identity == "index":
            return self.identity_index_columns
        return self.primary_key

    @property
    def updates_deletes_captured(self) -> bool:
        """wal2json skips UPDATE/DELETE of tables with no identity to print (verified on 2.5)."""
        if self.replica_identity == "nothing":
            return False
        return bool(self.primary_key) or self.replica_identity in ("full", "index")

    @property
    def downstream(self) -> str:
        """What the lakehouse can build from this table's changes."""
        if not self.updates_deletes_captured:
            return (
                "history of inserts only, no current table: PostgreSQL does not decode updates/deletes of this "
                f"table (REPLICA IDENTITY {self.replica_identity.upper()}{'' if self.primary_key else ', no primary key'}); "
                "set REPLICA IDENTITY DEFAULT with a primary key, FULL or USING INDEX (the loader then resyncs it)"
            )
        if self.key:
            via = "primary key" if self.primary_key else "replica identity index"
            return f"current + history (key {', '.join(self.key)} from the {via})"
        return "history only: no key, so no current table (updates/deletes carry the full old row)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.qualified,
            "replica_identity": self.replica_identity,
            "primary_key": self.primary_key,
            "identity_index_columns": self.identity_index_columns,
            "key": self.key,
            "updates_deletes_captured": self.updates_deletes_captured,
            "downstream": self.downstream,
        }


_TABLES_SQL = """
SELECT n.nspname, c.relname, c.relreplident,
       COALESCE((SELECT array_agg(a.attname ORDER BY k.ord)
                 FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord), pg_attribute a
                 WHERE i.indrelid = c.oid AND i.indisprimary AND a.attrelid = c.oid AND a.attnum = k.attnum), '{}'),
       COALESCE((SELECT array_agg(a.attname ORDER BY k.ord)
                 FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord), pg_attribute a
                 WHERE i.indrelid = c.oid AND i.indisreplident AND a.attrelid = c.oid AND a.attnum = k.attnum), '{}')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
"""
# Which relations are "tables" to capture: with partitions="root", a partitioned table stands for all
# of its partitions (leaf partitions are not tables of their own); with "leaf", every partition is.
_KINDS = {
    "root": " AND ((c.relkind = 'r' AND NOT c.relispartition) OR (c.relkind = 'p' AND NOT c.relispartition))",
    "leaf": " AND c.relkind = 'r'",
}


def list_tables(
    conn: psycopg.Connection, schema: str | None = None, table: str | None = None, partitions: str = "root"
) -> list[SourceTableInfo]:
    """The source's tables as capture sees them (see ``_KINDS``), optionally one; sorted by name."""
    sql = _TABLES_SQL + _KINDS[partitions]
    params: list[Any] = []
    if schema is not None and table is not None:
        sql += " AND n.nspname = %s AND c.relname = %s"
        params = [schema, table]
    rows = conn.execute(sql + " ORDER BY 1, 2", params).fetchall()
    return [SourceTableInfo(r[0], r[1], IDENTITY_NAMES.get(r[2], r[2]), list(r[3]), list(r[4])) for r in rows]


def table_info(conn: psycopg.Connection, schema: str, table: str) -> SourceTableInfo | None:
    """Facts of one table, a partition included (its changes arrive under its own name)."""
    found = list_tables(conn, schema, table, partitions="leaf") or list_tables(conn, schema, table, partitions="root")
    return found[0] if found else None


def column_types(conn: psycopg.Connection, schema: str, table: str) -> list[tuple[str, str]]:
    """(column, type) in column order, the type spelled as wal2json prints it (with typmod)."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        " WHERE a.attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
        " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (schema, table),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def column_numbers(conn: psycopg.Connection, schema: str, table: str) -> dict[str, str]:
    """attnum -> column name of the live columns (attnum survives a RENAME COLUMN)."""
    try:
        rows = conn.execute(
            "SELECT a.attnum, a.attname FROM pg_attribute a"
            " WHERE a.attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
            " AND a.attnum > 0 AND NOT a.attisdropped",
            (schema, table),
        ).fetchall()
    except psycopg.Error:
        return {}  # the table was dropped since
    return {str(r[0]): r[1] for r in rows}


def detect_renames(before: dict[str, str], after: dict[str, str]) -> list[tuple[str, str]]:
    """(old name, new name) for every attnum whose name changed."""
    return [(before[n], after[n]) for n in sorted(before, key=int) if n in after and after[n] != before[n]]


class KeyLookup:
    """Per-run cache of each table's downstream key (catalog read once per table)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self._cache: dict[tuple[str, str], SourceTableInfo | None] = {}

    def info(self, schema: str, table: str) -> SourceTableInfo | None:
        k = (schema, table)
        if k not in self._cache:
            try:
                self._cache[k] = table_info(self.conn, schema, table)
            except psycopg.Error:
                self._cache[k] = None  # dropped since: the stream's own pk is all we have
        return self._cache[k]
