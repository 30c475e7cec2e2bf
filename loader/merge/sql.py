"""Pure builders of the SQL the merge runs: key events, the increment reduction, the MERGE statement."""

from __future__ import annotations

from loader.load.typemap import quote_ident, spark_type, sql_string, typed_expr

POS_GT = "(s.pg_lsn > t.pg_lsn OR (s.pg_lsn = t.pg_lsn AND s.pg_seq > t.pg_seq))"
EVENT_ORDER = "pg_lsn, pg_seq, _sub"


def from_key_type(pk: list[str], pk_types: dict[str, str]) -> str:
    """Spark type of ``_from``: the old key of a key-changing update, fields k0, k1, ..."""
    return "STRUCT<" + ", ".join(f"k{i}: {spark_type(pk_types[k]).sql}" for i, k in enumerate(pk)) + ">"


def key_events_sql(history_view: str, pk: list[str], pk_types: dict[str, str], columns: list[str]) -> str:
    """One row per key event: deletes (by old key) and upserts (by new key), in commit order.

    An update that changes the primary key is a delete of the old key (``_sub`` 0) and an upsert
    of the new one (``_sub`` 1) at the same position; the upsert carries the old key in ``_from``
    so values it did not send (unchanged TOAST) can be taken from the old key's row.
    """
    q = quote_ident

    def old(k: str) -> str:
        return typed_expr(pk_types[k], f"from_json(pg_old_key, 'map<string,string>')[{sql_string(k)}]")

    old_key = [f"{old(k)} AS {q(k)}" for k in pk]
    old_differs = " OR ".join(f"NOT ({old(k)} <=> {q(k)})" for k in pk)
    key_change = f"pg_operation = 'update' AND pg_old_key IS NOT NULL AND ({old_differs})"
    from_struct = "named_struct(" + ", ".join(f"'k{i}', {old(k)}" for i, k in enumerate(pk)) + ")"
    no_from = f"CAST(NULL AS {from_key_type(pk, pk_types)}) AS _from"
    non_key = [c for c in columns if c not in pk]
    meta = "pg_lsn, pg_seq, pg_txn_timestamp"
    null_cols = [f"NULL AS {q(c)}" for c in non_key]
    del_select = ", ".join(
        old_key + null_cols + [meta, "'delete' AS _kind", "0 AS _sub", "CAST(array() AS ARRAY<STRING>) AS pg_absent_columns", no_from]
    )
    ups_select = ", ".join(
        [q(c) for c in pk] + [q(c) for c in non_key]
        + [meta, "'upsert' AS _kind", "1 AS _sub", "pg_absent_columns", f"IF({key_change}, {from_struct}, NULL) AS _from"]
    )
    return (
        f"SELECT {del_select} FROM {history_view} WHERE pg_operation = 'delete'\n"
        f"UNION ALL\n"
        f"SELECT {del_select} FROM {history_view} WHERE {key_change}\n"
        f"UNION ALL\n"
        f"SELECT {ups_select} FROM {history_view} WHERE pg_operation IN ('insert', 'update', 'read')"
    )


def reduce_sql(events_view: str, pk: list[str], columns: list[str]) -> str:
    """Last event per key; unchanged-TOAST columns take the last value sent earlier for the same row.

    A key's events are cut into segments, one per row lifetime: a delete or a key change into the
    key starts a new one, so a value is never carried from a deleted row. ``<col>__absent`` stays
    true when no change in the segment carried the column, so the MERGE keeps the current value.
    """
    q = quote_ident
    part = ", ".join(q(k) for k in pk)
    seg_win = f"PARTITION BY {part} ORDER BY {EVENT_ORDER} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    segmented = (
        f"SELECT *, sum(IF(_kind = 'delete' OR _from IS NOT NULL, 1, 0)) OVER ({seg_win}) AS _seg FROM {events_view}"
    )
    win = f"PARTITION BY {part}, _seg ORDER BY {EVENT_ORDER} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    carried = []
    for c in columns:
        if c in pk:
            carried.append(q(c))
            continue
        sent = f"IF(_kind = 'upsert' AND NOT array_contains(pg_absent_columns, {sql_string(c)}), named_struct('v', {q(c)}), NULL)"
        carried.append(f"last({sent}, true) OVER ({win}) AS {q('__' + c)}")
    inner = (
        f"SELECT {', '.join(carried)}, pg_lsn, pg_seq, pg_txn_timestamp, _kind, _sub, "
        f"row_number() OVER (PARTITION BY {part} ORDER BY pg_lsn DESC, pg_seq DESC, _sub DESC) AS _rn "
        f"FROM ({segmented})"
    )
    outer_cols = []
    for c in columns:
        if c in pk:
            outer_cols.append(q(c))
        else:
            outer_cols.append(f"{q('__' + c)}.v AS {q(c)}")
            outer_cols.append(f"{q('__' + c)} IS NULL AS {q(c + '__absent')}")
    return f"SELECT {', '.join(outer_cols)}, pg_lsn, pg_seq, pg_txn_timestamp, _kind FROM ({inner}) WHERE _rn = 1"


def merge_sql(
    current_ident: str,
    source_view: str,
    pk: list[str],
    columns: list[str],
    truncated_before: tuple[int, int] | None = None,
    target_filter: str | None = None,
    insert_after: tuple[int, int] | None = None,
) -> str:
    """MERGE with an LSN guard: a replayed or late event never moves a row backwards.

    ``truncated_before``: a TRUNCATE at that position is in the increment; every current row
    older than it that the increment does not rewrite is deleted in the same commit.
    ``target_filter``: a predicate on the target alone (the key buckets the increment touches),
    pushed down to the current-table scan so only those partitions' files are read.
    ``insert_after``: the table's merged-through watermark. Only events after it may insert: a
    deleted key leaves no row for the per-row guard to compare with, so without this a replayed
    old increment could bring it back.
    """
    q = quote_ident
    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in pk)
    if target_filter and truncated_before is None:
        on += f" AND {target_filter}"
    non_key = [c for c in columns if c not in pk]
    sets = [f"t.{q(c)} = IF(s.{q(c + '__absent')}, t.{q(c)}, s.{q(c)})" for c in non_key]
    sets += ["t.pg_lsn = s.pg_lsn", "t.pg_seq = s.pg_seq", "t.pg_txn_timestamp = s.pg_txn_timestamp"]
    ins_cols = [q(c) for c in columns] + ["pg_lsn", "pg_seq", "pg_txn_timestamp"]
    ins_vals = [f"s.{q(c)}" for c in columns] + ["s.pg_lsn", "s.pg_seq", "s.pg_txn_timestamp"]
    statement = (
        f"MERGE INTO {current_ident} t USING {source_view} s ON {on}\n"
        f"WHEN MATCHED AND s._kind = 'delete' AND {POS_GT} THEN DELETE\n"
        f"WHEN MATCHED AND s._kind = 'upsert' AND {POS_GT} THEN UPDATE SET {', '.join(sets)}\n"
        f"WHEN NOT MATCHED AND s._kind = 'upsert'{_after(insert_after)} THEN INSERT ({', '.join(ins_cols)}) VALUES ({', '.join(ins_vals)})"
    )
    if truncated_before is not None:
        lsn, seq = truncated_before
        statement += (
            f"\nWHEN NOT MATCHED BY SOURCE AND (t.pg_lsn < {lsn} OR (t.pg_lsn = {lsn} AND t.pg_seq < {seq})) THEN DELETE"
        )
    return statement


def _after(position: tuple[int, int] | None) -> str:
    if position is None:
        return ""
    lsn, seq = position
    return f" AND (s.pg_lsn > {lsn} OR (s.pg_lsn = {lsn} AND s.pg_seq > {seq}))"


def full_recompute_sql(history_ident: str, pk: list[str], pk_types: dict[str, str], columns: list[str]) -> str:
    """What Simple's views did: newest history row per key over the whole history, deletes removed.

    (Deletes carry their key in pg_old_key.) Used by the benchmark as the baseline the incremental
    merge is compared with; it reads every history row on every run.
    """
    q = quote_ident

    def key(k: str) -> str:
        old = typed_expr(pk_types[k], f"from_json(pg_old_key, 'map<string,string>')[{sql_string(k)}]")
        return f"IF(pg_operation = 'delete', {old}, {q(k)})"

    part = ", ".join(key(k) for k in pk)
    cols = ", ".join(q(c) for c in columns)
    return (
        f"SELECT {cols}, pg_lsn, pg_seq, pg_txn_timestamp FROM ("
        f"SELECT *, row_number() OVER (PARTITION BY {part} ORDER BY pg_lsn DESC, pg_seq DESC) AS _rn "
        f"FROM {history_ident}) WHERE _rn = 1 AND pg_operation <> 'delete'"
    )
