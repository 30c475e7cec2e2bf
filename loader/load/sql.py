"""Pure builders of the SQL the history load runs: typing landing values, absent columns, markers.

Input rows are the decoder's canonical change rows (``loader.load.decode.CHANGE_ROW_DDL``) with a
``pg__m`` map column (source column name -> text value). Output rows are history rows: the source
columns under their lake names, the metadata columns, and three internal columns the load drops
before writing: ``pg__line``, ``pg__reason`` (why a value does not fit, '' if all fit) and ``pg__raw``.
Inside the lake everything speaks lake names: the columns, and the names held in metadata
(pg_old_key's keys, pg_absent_columns); source names appear only in landing records.
"""

from __future__ import annotations

from dataclasses import dataclass

from loader.lake.types import never_toasted, quote_ident, spark_type, sql_string, typed_expr
from loader.lsn import ChangePosition, position_after_sql
from loader.names import internal, lake_column, lake_column_sql

VALUES_MAP = internal("m")
LINE, REASON, RAW = internal("line"), internal("reason"), internal("raw")


@dataclass(frozen=True)
class HistoryColumn:
    """A source column as the history table stores it."""

    source: str
    pg_type: str

    @property
    def lake(self) -> str:
        return lake_column(self.source)


def absent_columns_sql(columns: list[HistoryColumn], dropped: dict[str, ChangePosition]) -> str:
    """pg_absent_columns: the columns an update did not send because their value is unchanged.

    Not sent but not "unchanged": fixed-length columns (never TOASTed) and columns dropped at or
    before the change's position; those read NULL.
    """
    items = []
    for col in columns:
        if never_toasted(col.pg_type):
            continue
        cond = f"NOT array_contains(col_names, {sql_string(col.source)})"
        if col.source in dropped:
            cond += " AND NOT " + position_after_sql("commit_lsn", "seq", dropped[col.source], inclusive=True)
        items.append(f"IF({cond}, array({sql_string(col.lake)}), {_NO_NAMES})")
    if not items:
        return _NO_NAMES
    # concat of one-element arrays rather than array_compact (a lambda, so Spark interprets the
    # whole expression row by row instead of compiling it: 7% of a load's CPU).
    return f"IF(op = 'update', concat({', '.join(items)}), {_NO_NAMES})"


_NO_NAMES = "CAST(array() AS ARRAY<STRING>)"


def typed_select(columns: list[HistoryColumn], dropped: dict[str, ChangePosition]) -> list[str]:
    """Select list turning decoded rows (with ``pg__m``) into history rows plus the internal columns."""
    select = []
    checks = []
    for col in columns:
        raw = f"{VALUES_MAP}[{sql_string(col.source)}]"
        expr = typed_expr(col.pg_type, raw)
        select.append(f"{expr} AS {quote_ident(col.lake)}")
        if not spark_type(col.pg_type).lossless_text:
            label = sql_string(f"column {col.source} ({col.pg_type}): value ")
            checks.append(f"IF({raw} IS NOT NULL AND ({expr}) IS NULL, concat({label}, {raw}, ' does not fit'), NULL)")
    reason = f"concat_ws('; ', {', '.join(checks)})" if checks else "''"
    raw_json = (
        "to_json(struct(op, commit_lsn, seq, xid, ts, src_schema, src_table, col_names, col_values, key_names,"
        " key_values))"
    )
    select += [
        "commit_lsn AS pg_lsn",
        "seq AS pg_seq",
        "xid AS pg_txn_id",
        "op AS pg_operation",
        f"{typed_expr('timestamp with time zone', 'ts')} AS pg_txn_timestamp",
        "change_lsn AS pg_change_lsn",
        "IF(size(key_names) > 0, to_json(map_from_arrays(transform(key_names, k -> "
        + lake_column_sql("k")
        + "), key_values)), NULL) AS pg_old_key",
        f"{absent_columns_sql(columns, dropped)} AS pg_absent_columns",
        "landing_file AS pg_landing_file",
        "note AS pg_note",
        f"line AS {LINE}",
        f"{reason} AS {REASON}",
        # The raw change goes only to the rejects table: built for the rows that do not fit (JSON
        # of every row was a third of the typing job, and the typed batch is cached).
        (f"IF({reason} <> '', {raw_json}, NULL)" if checks else "CAST(NULL AS STRING)") + f" AS {RAW}",
    ]
    return select


def rejects_select(qualified: str) -> list[str]:
    """Typed rows whose values did not fit -> rows of the rejects table (without rejected_at)."""
    return [
        "pg_landing_file AS landing_file",
        f"{LINE} AS line",
        f"{sql_string(qualified)} AS source_table",
        "pg_lsn",
        "pg_seq",
        f"{REASON} AS reason",
        f"{RAW} AS raw",
    ]
