"""Names of the Iceberg tables the loader owns, and the metadata columns it adds.

history.<name> and current.<name> in the configured catalog, ``name`` from :mod:`loader.names`
(``schema__table`` for plain names, reversible and collision-free for any other); the loader's own
state (landing-file ledger, rejects) lives in the ``loader`` namespace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loader.config import LoaderSettings
from loader.lake.types import quote_ident, spark_type
from loader.names import lake_column, parse_table_name, table_name

# Metadata columns of history tables, in order, with their Spark types.
HISTORY_METADATA: tuple[tuple[str, str], ...] = (
    ("pg_lsn", "BIGINT"),  # commit LSN of the change's transaction
    ("pg_seq", "BIGINT"),  # position of the change within its transaction (1-based)
    ("pg_txn_id", "BIGINT"),
    ("pg_operation", "STRING"),  # insert / update / delete / read
    ("pg_txn_timestamp", "TIMESTAMP"),
    ("pg_change_lsn", "BIGINT"),  # WAL position of the change record itself
    ("pg_old_key", "STRING"),  # JSON object of the replica identity before update/delete
    ("pg_absent_columns", "ARRAY<STRING>"),  # columns not sent (unchanged TOAST)
    ("pg_landing_file", "STRING"),
    ("pg_note", "STRING"),  # why, on control rows (resync, park); NULL on changes
)
METADATA_NAMES = frozenset(n for n, _ in HISTORY_METADATA)

# The loader's own tables, as Spark DDL column lists.
REJECTS_DDL = (
    "landing_file STRING, line INT, source_table STRING, pg_lsn BIGINT, pg_seq BIGINT,"
    " reason STRING, raw STRING, rejected_at TIMESTAMP"
)
LEDGER_NAME = "landing_files"  # the ledger's table name, in the loader's namespace
LEDGER_DDL = (
    "file STRING, first_position STRING, last_position STRING, changes BIGINT, rejects BIGINT, loaded_at TIMESTAMP"
)


def source_columns(pg_types: dict[str, str], metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A history or current table's columns as (lake name, Spark SQL type): the source columns
    (lossless storage types, ``lake.types.spark_type``), then the loader's ``metadata`` columns."""
    return [(lake_column(n), spark_type(t).sql) for n, t in pg_types.items()] + list(metadata)


# Metadata columns kept on current tables.
CURRENT_METADATA: tuple[tuple[str, str], ...] = (
    ("pg_lsn", "BIGINT"),
    ("pg_seq", "BIGINT"),
    ("pg_txn_timestamp", "TIMESTAMP"),
)

# Table properties the loader reads and writes.
PROP_SOURCE_TABLE = "loader.source-table"
PROP_PRIMARY_KEY = "loader.primary-key"
PROP_PG_TYPES = "loader.pg-types"
SUMMARY_LOADED_THROUGH = "loader.loaded-through"
SUMMARY_MERGED_THROUGH = "loader.merged-through"
# Columns dropped at the source: {column: position token where the drop was first seen}.
PROP_DROPPED_COLUMNS = "loader.dropped-columns"
# Smallest change position a history append added (a late file shows up below merged-through).
SUMMARY_MIN_POSITION = "loader.min-position"
# Why a table waits for a resync: {"since": position token, "reason": text}. On history tables it is
# kept by the load (display: status, verify); merges find parks from history's park rows themselves.
PROP_PARKED = "loader.parked"
# Columns retired by an incompatible retype: {retired lake name: {"column": source name, "type": old pg type}}.
PROP_RETIRED_COLUMNS = "loader.retired-columns"
# The history snapshot a MERGE read its increment from.
SUMMARY_HISTORY_SNAPSHOT = "loader.history-snapshot-id"
# Commit time (PostgreSQL text) of the newest transaction at loaded-through / merged-through:
# what freshness is measured from.
PROP_LOADED_THROUGH_TS = "loader.loaded-through-ts"
PROP_MERGED_THROUGH_TS = "loader.merged-through-ts"
# History tables: the newest position appended (set before each append, so never behind it); a
# table whose last position is at or before its current table's merged-through has nothing to merge.
PROP_LAST_POSITION = "loader.last-position"
# History tables: how many appends added changes at or below the current table's merged-through
# (late files); current tables: how many of those a rebuild has covered.
PROP_LATE_APPENDS = "loader.late-appends"
PROP_LATE_APPENDS_SEEN = "loader.late-appends-seen"
# Current tables: merges committed since the table was last compacted (merge.compact_every).
PROP_MERGES_SINCE_COMPACTION = "loader.merges-since-compaction"


def newest_position(*tokens: str | None) -> str | None:
    """The latest of some position tokens (fixed width, so they sort like positions)."""
    present = [t for t in tokens if t]
    return max(present) if present else None


def table_consistent_at(merged: str | None, appended: str | None, loaded: str | None, parked: bool) -> str | None:
    """The position a current table equals the source at (a position token, or None if never merged).

    Its merged-through watermark; or, when nothing was appended to its history after that
    (``appended``: the history's last position) and it is not parked, the load's loaded-through:
    the source table had no change in between. ``loader status`` and the merge's summary both
    use this rule (and :func:`consistent_through`), so they print the same position.
    """
    if merged and loaded and appended and appended <= merged and not parked:
        return max(merged, loaded)
    return merged


def consistent_through(positions: list[str | None]) -> str | None:
    """The position every current table has reached (the lowest of :func:`table_consistent_at` over
    every table with a key); None when there is none, or when one of them was never merged."""
    if not positions or any(p is None for p in positions):
        return None
    return min(p for p in positions if p is not None)


@dataclass(frozen=True, order=True)
class SourceTable:
    schema: str
    table: str

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def iceberg_name(self) -> str:
        return table_name(self.schema, self.table)

    @classmethod
    def from_iceberg_name(cls, name: str) -> SourceTable:
        return cls(*parse_table_name(name))

    @classmethod
    def among(cls, qualified: str, known: list[SourceTable]) -> SourceTable:
        """The table of ``known`` named ``qualified`` (``schema.table``, where a dot inside a name
        makes the first dot the wrong split: ``app.v2.t`` is table ``t`` of schema ``app.v2`` when
        the lake holds that one); none: :meth:`parse`. Two (``"a.b".c`` and ``a."b.c"``): UsageError."""
        from loader.errors import UsageError

        matches = [t for t in known if t.qualified == qualified]
        if len(matches) > 1:
            named = " and ".join(f'"{t.schema}"."{t.table}"' for t in matches)
            raise UsageError(
                f"{qualified!r} names {len(matches)} tables ({named})",
                hint="rename one at the source so that no two tables spell the same schema.table",
            )
        return matches[0] if matches else cls.parse(qualified)

    @classmethod
    def column_ref(cls, ref: str, known: list[SourceTable]) -> tuple[SourceTable, str]:
        """(table, column) of a ``schema.table.column`` reference (``dbt.subject_columns``): the
        table is the one of ``known`` whose name the reference starts with, so a dot inside a schema's,
        table's or column's name does not move the split; none: the last dot splits. Two: UsageError."""
        from loader.errors import UsageError

        splits = [(t, ref[len(t.qualified) + 1 :]) for t in known if ref.startswith(t.qualified + ".")]
        splits = [(t, c) for t, c in splits if c]
        if len(splits) > 1:
            named = " and ".join(f'column "{c}" of "{t.schema}"."{t.table}"' for t, c in splits)
            raise UsageError(
                f"{ref!r} names {len(splits)} columns ({named})",
                hint="rename one at the source so that no two columns spell the same schema.table.column",
            )
        if splits:
            return splits[0]
        qualified, _, column = ref.rpartition(".")
        return cls.parse(qualified), column

    @classmethod
    def parse(cls, qualified: str) -> SourceTable:
        """``schema.table`` as users type it (the first dot separates; quote-free)."""
        schema, dot, table = qualified.partition(".")
        if not dot or not schema or not table:
            raise ValueError(f"{qualified!r} is not schema.table")
        return cls(schema, table)


def unknown_tables(given: list[str] | tuple[str, ...], known: list[str], what: str = "table") -> str | None:
    """None when every ``schema.table`` in ``given`` is in ``known``; else a message naming the first
    unknown one with the known tables, close matches (difflib) first."""
    import difflib

    for name in given:
        if name in known:
            continue
        if not known:
            return f"unknown {what} {name!r}: there are none yet"
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        bare = [k for k in known if k.partition(".")[2] == name and k not in close]  # the schema left out
        first = bare + close
        rest = [k for k in sorted(known) if k not in first]
        shown = first + rest[: max(0, 10 - len(first))]
        more = f" and {len(known) - len(shown)} more" if len(known) > len(shown) else ""
        hint = f"did you mean {first[0]}? " if first else ""
        return f"unknown {what} {name!r}: {hint}known: {', '.join(shown)}{more}"
    return None


class TableNames:
    """Fully qualified, quoted Spark identifiers for one catalog's loader tables."""

    def __init__(self, settings: LoaderSettings) -> None:
        c = settings.catalog
        self.catalog = c.name
        self.history_ns = c.history_namespace
        self.current_ns = c.current_namespace
        self.loader_ns = c.loader_namespace

    def _q(self, ns: str, name: str) -> str:
        return ".".join(quote_ident(p) for p in (self.catalog, ns, name))

    def parts(self, ident: str) -> tuple[str, str] | None:
        """(namespace, table) of an identifier of this catalog as the methods here quote it
        (pyiceberg's form), else None."""
        import re

        found = re.fullmatch(r"`((?:[^`]|``)*)`\.`((?:[^`]|``)*)`\.`((?:[^`]|``)*)`", ident)
        if found is None:
            return None
        catalog, ns, name = (p.replace("``", "`") for p in found.groups())
        return (ns, name) if catalog == self.catalog else None

    def history(self, t: SourceTable) -> str:
        return self._q(self.history_ns, t.iceberg_name)

    def current(self, t: SourceTable) -> str:
        return self._q(self.current_ns, t.iceberg_name)

    @property
    def ledger(self) -> str:
        return self._q(self.loader_ns, LEDGER_NAME)

    def loader_table(self, name: str) -> str:
        """One of the loader's own tables (ledger, rejects, erasures, ...)."""
        return self._q(self.loader_ns, name)

    @property
    def rejects(self) -> str:
        return self._q(self.loader_ns, "rejects")
