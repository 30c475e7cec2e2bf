"""Pure builders of the SQL the merge runs: key events, the increment reduction, the MERGE statement.

Every column name here is a *lake* name (:func:`loader.names.lake_column`: what the history and
current tables call the column, and what pg_old_key and pg_absent_columns hold). Every alias of the
loader's own is in the reserved ``pg__`` namespace, so no source column can collide with one.
"""

from __future__ import annotations

from loader.lake.types import quote_ident, spark_type, sql_string, typed_expr
from loader.lsn import position_after_sql, position_before_sql
from loader.names import internal

KIND, SUB, FROM, SEG, RN = internal("kind"), internal("sub"), internal("from"), internal("seg"), internal("rn")
EVENT_ORDER = f"pg_lsn, pg_seq, {SUB}"
# Operations that put a row (as opposed to ending one, or control rows, which carry no row).
UPSERT_OPERATIONS = "('insert', 'update', 'read')"
# Operations after which the table's earlier state no longer counts: rows older than them that the
# increment does not rewrite are gone.
BOUNDARY_OPERATIONS = ("truncate", "resync")


def col(name: str) -> str:
    """The quoted identifier of (lake) column ``name``."""
    return quote_ident(name)


def old_key_expr(column: str, pg_type: str) -> str:
    """Typed value of key ``column`` read out of pg_old_key (a JSON object keyed by lake names)."""
    return typed_expr(pg_type, f"from_json(pg_old_key, 'map<string,string>')[{sql_string(column)}]")


def from_key_type(pk: list[str], pk_types: dict[str, str]) -> str:
    """Spark type of ``pg__from``: the old key of a key-changing update, fields k0, k1, ..."""
    return "STRUCT<" + ", ".join(f"k{i}: {spark_type(pk_types[k]).sql}" for i, k in enumerate(pk)) + ">"


def key_events_sql(history_view: str, pk: list[str], pk_types: dict[str, str], columns: list[str]) -> str:
    """One row per key event: deletes (by old key) and upserts (by new key), in commit order.

    An update that changes the primary key is a delete of the old key (``pg__sub`` 0) and an
    upsert of the new one (``pg__sub`` 1) at the same position; the upsert carries the old key in
    ``pg__from`` so values it did not send (unchanged TOAST) can be taken from the old key's row.
    """

    def old(k: str) -> str:
        return old_key_expr(k, pk_types[k])

    old_key = [f"{old(k)} AS {col(k)}" for k in pk]
    old_differs = " OR ".join(f"NOT ({old(k)} <=> {col(k)})" for k in pk)
    key_change = f"pg_operation = 'update' AND pg_old_key IS NOT NULL AND ({old_differs})"
    from_struct = "named_struct(" + ", ".join(f"'k{i}', {old(k)}" for i, k in enumerate(pk)) + ")"
    no_from = f"CAST(NULL AS {from_key_type(pk, pk_types)}) AS {FROM}"
    non_key = [c for c in columns if c not in pk]
    meta = "pg_lsn, pg_seq, pg_txn_timestamp"
    null_cols = [f"NULL AS {col(c)}" for c in non_key]
    del_select = ", ".join(
        old_key
        + null_cols
        + [meta, f"'delete' AS {KIND}", f"0 AS {SUB}", "CAST(array() AS ARRAY<STRING>) AS pg_absent_columns", no_from]
    )
    ups_select = ", ".join(
        [col(c) for c in pk]
        + [col(c) for c in non_key]
        + [
            meta,
            f"'upsert' AS {KIND}",
            f"1 AS {SUB}",
            "pg_absent_columns",
            f"IF({key_change}, {from_struct}, NULL) AS {FROM}",
        ]
    )
    return (
        f"SELECT {del_select} FROM {history_view} WHERE pg_operation = 'delete'\n"
        f"UNION ALL\n"
        f"SELECT {del_select} FROM {history_view} WHERE {key_change}\n"
        f"UNION ALL\n"
        f"SELECT {ups_select} FROM {history_view} WHERE pg_operation IN {UPSERT_OPERATIONS}"
    )


def touched_buckets_sql(bucket_fn: str, key: str, key_type: str) -> tuple[str, str]:
    """Aggregates over history rows: the buckets of the first key column their key events touch
    (new keys of upserts, old keys of deletes and key changes), and how many of those keys are
    NULL (in no bucket). ``bucket_fn`` is a template with ``{col}``; the set may hold more buckets
    than the reduced increment touches, never fewer."""
    new, old = col(key), old_key_expr(key, key_type)
    upsert = f"pg_operation IN {UPSERT_OPERATIONS}"
    ended = "pg_operation IN ('update', 'delete') AND pg_old_key IS NOT NULL"
    deleted = "pg_operation = 'delete'"
    hit = (
        f"array_union(collect_set(IF({upsert}, {bucket_fn.format(col=new)}, NULL)), "
        f"collect_set(IF({ended}, {bucket_fn.format(col=old)}, NULL)))"
    )
    nulls = f"count_if(({upsert} AND {new} IS NULL) OR ({deleted} AND ({old}) IS NULL))"
    return hit, nulls


def carried(i: int) -> str:
    return internal(f"carry_{i}")


def absent(i: int) -> str:
    """Reduced-row flag: no change of the increment sent non-key column number ``i``."""
    return internal(f"absent_{i}")


def reduce_sql(events_view: str, pk: list[str], columns: list[str]) -> str:
    """Last event per key; unchanged-TOAST columns take the last value sent earlier for the same row.

    A key's events are cut into segments, one per row lifetime: a delete or a key change into the
    key starts a new one, so a value is never carried from a deleted row. ``pg__absent_<i>`` stays
    true when no change in the segment carried the column, so the MERGE keeps the current value.
    """
    part = ", ".join(col(k) for k in pk)
    seg_win = f"PARTITION BY {part} ORDER BY {EVENT_ORDER} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    segmented = (
        f"SELECT *, sum(IF({KIND} = 'delete' OR {FROM} IS NOT NULL, 1, 0)) OVER ({seg_win}) AS {SEG} FROM {events_view}"
    )
    win = f"PARTITION BY {part}, {SEG} ORDER BY {EVENT_ORDER} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    carried_cols = []
    outer_cols = []
    for i, c in enumerate(columns):
        if c in pk:
            carried_cols.append(col(c))
            outer_cols.append(col(c))
            continue
        sent = f"IF({KIND} = 'upsert' AND NOT array_contains(pg_absent_columns, {sql_string(c)}), named_struct('v', {col(c)}), NULL)"
        carried_cols.append(f"last({sent}, true) OVER ({win}) AS {carried(i)}")
        outer_cols.append(f"{carried(i)}.v AS {col(c)}")
        outer_cols.append(f"{carried(i)} IS NULL AS {absent(i)}")
    inner = (
        f"SELECT {', '.join(carried_cols)}, pg_lsn, pg_seq, pg_txn_timestamp, {KIND}, {SUB}, "
        f"row_number() OVER (PARTITION BY {part} ORDER BY pg_lsn DESC, pg_seq DESC, {SUB} DESC) AS {RN} "
        f"FROM ({segmented})"
    )
    return f"SELECT {', '.join(outer_cols)}, pg_lsn, pg_seq, pg_txn_timestamp, {KIND} FROM ({inner}) WHERE {RN} = 1"


def merge_sql(
    current_ident: str,
    source_view: str,
    pk: list[str],
    columns: list[str],
    truncated_before: tuple[int, int] | None = None,
    target_filter: str | None = None,
    insert_after: tuple[int, int] | None = None,
    all_sent: bool = False,
) -> str:
    """MERGE with an LSN guard: a replayed or late event never moves a row backwards.

    ``truncated_before``: a TRUNCATE or a resync at that position is in the increment; every
    current row older than it that the increment does not rewrite is deleted in the same commit.
    ``target_filter``: a predicate on the target alone (the key buckets the increment touches),
    pushed down to the current-table scan so only those partitions' files are read.
    ``insert_after``: the table's merged-through watermark. Only events after it may insert: a
    deleted key leaves no row for the per-row guard to compare with, so without this a replayed
    old increment could bring it back.
    ``all_sent``: no update of the increment left a value out (unchanged TOAST), so every upsert
    carries every column: the update sets them from the source alone, and the target scan reads
    only the key, position and row-id columns instead of every column of the matched files.
    """
    on = " AND ".join(f"t.{col(k)} <=> s.{col(k)}" for k in pk)
    if target_filter and truncated_before is None:
        on += f" AND {target_filter}"
    newer = position_after_sql("s.pg_lsn", "s.pg_seq", ("t.pg_lsn", "t.pg_seq"))
    sets = []
    for i, c in enumerate(columns):
        if c not in pk:
            sets.append(
                f"t.{col(c)} = " + (f"s.{col(c)}" if all_sent else f"IF(s.{absent(i)}, t.{col(c)}, s.{col(c)})")
            )
    sets += ["t.pg_lsn = s.pg_lsn", "t.pg_seq = s.pg_seq", "t.pg_txn_timestamp = s.pg_txn_timestamp"]
    ins_cols = [col(c) for c in columns] + ["pg_lsn", "pg_seq", "pg_txn_timestamp"]
    ins_vals = [f"s.{col(c)}" for c in columns] + ["s.pg_lsn", "s.pg_seq", "s.pg_txn_timestamp"]
    after = f" AND {position_after_sql('s.pg_lsn', 's.pg_seq', insert_after)}" if insert_after is not None else ""
    statement = (
        f"MERGE INTO {current_ident} t USING {source_view} s ON {on}\n"
        f"WHEN MATCHED AND s.{KIND} = 'delete' AND {newer} THEN DELETE\n"
        f"WHEN MATCHED AND s.{KIND} = 'upsert' AND {newer} THEN UPDATE SET {', '.join(sets)}\n"
        f"WHEN NOT MATCHED AND s.{KIND} = 'upsert'{after} THEN INSERT ({', '.join(ins_cols)}) VALUES ({', '.join(ins_vals)})"
    )
    if truncated_before is not None:
        statement += (
            "\nWHEN NOT MATCHED BY SOURCE AND "
            f"{position_before_sql('t.pg_lsn', 't.pg_seq', truncated_before, inclusive=False)} THEN DELETE"
        )
    return statement


def full_recompute_sql(history_ident: str, pk: list[str], pk_types: dict[str, str], columns: list[str]) -> str:
    """What Simple's views did: newest history row per key over the whole history, deletes removed.

    (Deletes carry their key in pg_old_key.) Used by the benchmark as the baseline the incremental
    merge is compared with; it reads every history row on every run.
    """

    def key(k: str) -> str:
        return f"IF(pg_operation = 'delete', {old_key_expr(k, pk_types[k])}, {col(k)})"

    part = ", ".join(key(k) for k in pk)
    cols = ", ".join(col(c) for c in columns)
    return (
        f"SELECT {cols}, pg_lsn, pg_seq, pg_txn_timestamp FROM ("
        f"SELECT *, row_number() OVER (PARTITION BY {part} ORDER BY pg_lsn DESC, pg_seq DESC) AS {RN} "
        f"FROM {history_ident} WHERE pg_operation IN ('insert', 'update', 'read', 'delete')) "
        f"WHERE {RN} = 1 AND pg_operation <> 'delete'"
    )
