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
from psycopg import sql

from loader.lake.tables import SourceTable

IDENTITY_NAMES = {"d": "default", "f": "full", "n": "nothing", "i": "index"}


@dataclass(frozen=True)
class SourceTableInfo:
    schema: str
    table: str
    replica_identity: str  # default / full / nothing / index
    primary_key: list[str] = field(default_factory=list)
    identity_index_columns: list[str] = field(default_factory=list)
    # False when PostgreSQL's own rule finds no row identity where the declared one suggests
    # there is one: a DEFERRABLE (or invalid) primary key under REPLICA IDENTITY DEFAULT, or, for
    # a partitioned table, a partition that cannot identify its rows.
    identity_ok: bool = True

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
        """Whether the WAL carries this table's updates and deletes with an old key.

        PostgreSQL decides (``RelationGetIndexList``): FULL sends the old row; DEFAULT the primary
        key, if it is immediate and valid (a DEFERRABLE key is no identity: wal2json then sends
        nothing for updates and deletes, only a server WARNING); USING INDEX the chosen index while
        it is valid (dropped or invalid, it is NOTHING); NOTHING nothing.
        """
        if not self.identity_ok or self.replica_identity == "nothing":
            return False
        if self.replica_identity == "full":
            return True
        if self.replica_identity == "index":
            return bool(self.identity_index_columns)
        return bool(self.primary_key)

    @property
    def downstream(self) -> str:
        """What the lakehouse can build from this table's changes."""
        if not self.updates_deletes_captured:
            return (
                "history of inserts only, no current table: PostgreSQL does not decode updates/deletes of this "
                f"table (REPLICA IDENTITY {self.replica_identity.upper()}{self._why_no_identity()}); "
                "set REPLICA IDENTITY DEFAULT with an immediate primary key, FULL or USING INDEX "
                "(the loader then resyncs it)"
            )
        if self.key:
            via = "primary key" if self.primary_key else "replica identity index"
            return f"current + history (key {', '.join(self.key)} from the {via})"
        return "history only: no key, so no current table (updates/deletes carry the full old row)"

    def _why_no_identity(self) -> str:
        if self.replica_identity == "index" and not self.identity_index_columns:
            return ", its index dropped or invalid"
        if not self.identity_ok and self.replica_identity == "default" and self.primary_key:
            return ", the primary key is DEFERRABLE or invalid, which PostgreSQL never uses as replica identity"
        if not self.identity_ok:
            return ", a partition without a replica identity"
        return "" if self.primary_key else ", no primary key"

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.qualified,
            "replica_identity": self.replica_identity,
            "primary_key": self.primary_key,
            "identity_index_columns": self.identity_index_columns,
            "identity_ok": self.identity_ok,
            "key": self.key,
            "updates_deletes_captured": self.updates_deletes_captured,
            "downstream": self.downstream,
        }


# PostgreSQL's rule for an index that can identify rows in the WAL (relcache.c,
# RelationGetIndexList): valid, unique, immediate (not DEFERRABLE) and not partial. One spelling
# for every query that asks whether a table has a replica identity.
USABLE_IDENTITY_INDEX = "i.indisvalid AND i.indisunique AND i.indimmediate AND i.indpred IS NULL"


def index_columns_sql(which: str) -> str:
    """SQL: the columns of table ``c``'s primary key (declared: ``"primary"``) or of its replica
    identity index (as PostgreSQL uses it: ``"identity"``), as a text array."""
    cond = "i.indisprimary" if which == "primary" else f"i.indisreplident AND {USABLE_IDENTITY_INDEX}"
    return (
        "COALESCE((SELECT array_agg(a.attname ORDER BY k.ord)"
        " FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord), pg_attribute a"
        f" WHERE i.indrelid = c.oid AND {cond} AND a.attrelid = c.oid AND a.attnum = k.attnum), '{{}}')"
    )


# SQL: whether table ``c`` has the row identity PostgreSQL's rule gives it (see SourceTableInfo).
IDENTITY_OK_SQL = (
    "(c.relreplident IN ('f', 'n')"
    " OR (c.relreplident = 'i' AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid"
    f" AND i.indisreplident AND {USABLE_IDENTITY_INDEX}))"
    " OR (c.relreplident = 'd' AND (NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"
    " OR EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid"
    f" AND i.indisprimary AND {USABLE_IDENTITY_INDEX}))))"
)

# SQL: whether PostgreSQL decodes table ``c``'s updates and deletes with an old key or row
# (SourceTableInfo.updates_deletes_captured, as one expression for queries over many tables).
HAS_IDENTITY_SQL = (
    "(c.relreplident = 'f'"
    " OR (c.relreplident = 'd' AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid"
    f" AND i.indisprimary AND {USABLE_IDENTITY_INDEX}))"
    " OR (c.relreplident = 'i' AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid"
    f" AND i.indisreplident AND {USABLE_IDENTITY_INDEX})))"
)

_TABLES_SQL = f"""
SELECT n.nspname, c.relname, c.relreplident, {index_columns_sql("primary")}, {index_columns_sql("identity")},
       {IDENTITY_OK_SQL}
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
    return [
        SourceTableInfo(r[0], r[1], IDENTITY_NAMES.get(r[2], r[2]), list(r[3]), list(r[4]), bool(r[5])) for r in rows
    ]


def split_qualified(conn: psycopg.Connection, qualified: str) -> tuple[str, str]:
    """(schema, table) of the source table named ``schema.table``. A name with one dot splits
    there; with more (a dot inside a schema's or a table's name: ``"app.v2".t``) PostgreSQL's
    catalog says which split names a relation (:meth:`SourceTable.among` over the relations
    spelled so: none, the table is gone, and the first dot; two, ``"a.b".c`` and ``a."b.c"``, a
    UsageError naming both, never a guess)."""
    schema, _, table = qualified.partition(".")
    if "." not in table:
        return schema, table
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname || '.' || c.relname = %s ORDER BY 1, 2",
        (qualified,),
    ).fetchall()
    found = SourceTable.among(qualified, [SourceTable(str(r[0]), str(r[1])) for r in rows])
    return found.schema, found.table


def table_info(conn: psycopg.Connection, schema: str, table: str) -> SourceTableInfo | None:
    """Facts of one table, a partition included (its changes arrive under its own name)."""
    found = list_tables(conn, schema, table, partitions="leaf") or list_tables(conn, schema, table, partitions="root")
    return found[0] if found else None


def stored_rows(conn: psycopg.Connection, schema: str, table: str) -> sql.Composed:
    """The FROM item that reads exactly the rows the stream counts as ``schema.table``'s: ``ONLY``
    the table, because a plain SELECT of a table with inheritance children (``INHERITS``) also
    returns the children's rows, whose changes the WAL attributes to the children; the whole tree of
    a partitioned table (``ONLY`` would read nothing: its partitions hold its rows)."""
    row = conn.execute(
        "SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (schema, table),
    ).fetchone()
    ident = sql.Identifier(schema, table)
    return sql.SQL("{}").format(ident) if row and row[0] else sql.SQL("ONLY {}").format(ident)


def column_types(conn: psycopg.Connection, schema: str, table: str, generated: bool = True) -> list[tuple[str, str]]:
    """(column, type) in column order, the type spelled as wal2json prints it (with typmod);
    without generated columns unless ``generated`` (the stream of pgoutput never carries them)."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        " WHERE a.attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
        " AND a.attnum > 0 AND NOT a.attisdropped AND (%s OR a.attgenerated = '') ORDER BY a.attnum",
        (schema, table, generated),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


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
