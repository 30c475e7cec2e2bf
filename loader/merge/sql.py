"""Pure builders of the SQL the merge runs: the increment reduction and the MERGE statement."""

from __future__ import annotations

from loader.load.typemap import quote_ident, sql_string, typed_expr

POS_GT = "(s.pg_lsn > t.pg_lsn OR (s.pg_lsn = t.pg_lsn AND s.pg_seq > t.pg_seq))"


def key_events_sql(history_view: str, pk: list[str], pk_types: dict[str, str], columns: list[str]) -> str:
    """One row per key event: deletes (by old key) and upserts (by new key), in commit order.

    An update that changes the primary key is a delete of the old key and an upsert of the new
    one at the same position; ``_sub`` orders them (delete first).
    """
    q = quote_ident
    def old(k: str) -> str:
        return typed_expr(pk_types[k], f"from_json(pg_old_key, 'map<string,string>')[{sql_string(k)}]")

    old_key = [f"{old(k)} AS {q(k)}" for k in pk]
    old_differs = " OR ".join(f"NOT ({old(k)} <=> {q(k)})" for k in pk)
    non_key = [c for c in columns if c not in pk]
    meta = "pg_lsn, pg_seq, pg_txn_timestamp"
    null_cols = [f"NULL AS {q(c)}" for c in non_key]
    del_select = ", ".join(old_key + null_cols + [meta, "'delete' AS _kind", "0 AS _sub", "array() AS pg_absent_columns"])
    ups_select = ", ".join([q(c) for c in pk] + [q(c) for c in non_key] + [meta, "'upsert' AS _kind", "1 AS _sub", "pg_absent_columns"])
    return (
        f"SELECT {del_select} FROM {history_view} WHERE pg_operation = 'delete'\n"
        f"UNION ALL\n"
        f"SELECT {del_select} FROM {history_view} WHERE pg_operation = 'update' AND pg_old_key IS NOT NULL AND ({old_differs})\n"
        f"UNION ALL\n"
        f"SELECT {ups_select} FROM {history_view} WHERE pg_operation IN ('insert', 'update', 'read')"
    )


def reduce_sql(events_view: str, pk: list[str], columns: list[str]) -> str:
    """Last event per key; unchanged-TOAST columns take the last value sent earlier in the increment.

    ``<col>__absent`` stays true when no earlier change in the increment carried the column, so
    the MERGE keeps the current table's value.
    """
    q = quote_ident
    part = ", ".join(q(k) for k in pk)
    order = "pg_lsn, pg_seq, _sub"
    win = f"PARTITION BY {part} ORDER BY {order} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    carried = []
    for c in columns:
        if c in pk:
            carried.append(q(c))
            continue
        sent = f"IF(_kind = 'upsert' AND NOT array_contains(pg_absent_columns, {sql_string(c)}), named_struct('v', {q(c)}), NULL)"
        carried.append(f"last({sent}, true) OVER ({win}) AS {q('__' + c)}")
    inner = f"SELECT {', '.join(carried)}, pg_lsn, pg_seq, pg_txn_timestamp, _kind, _sub, row_number() OVER (PARTITION BY {part} ORDER BY pg_lsn DESC, pg_seq DESC, _sub DESC) AS _rn FROM {events_view}"
    outer_cols = []
    for c in columns:
        if c in pk:
            outer_cols.append(q(c))
        else:
            outer_cols.append(f"{q('__' + c)}.v AS {q(c)}")
            outer_cols.append(f"{q('__' + c)} IS NULL AS {q(c + '__absent')}")
    return f"SELECT {', '.join(outer_cols)}, pg_lsn, pg_seq, pg_txn_timestamp, _kind FROM ({inner}) WHERE _rn = 1"


def merge_sql(current_ident: str, source_view: str, pk: list[str], columns: list[str]) -> str:
    """MERGE with an LSN guard: a replayed or late event never moves a row backwards."""
    q = quote_ident
    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in pk)
    non_key = [c for c in columns if c not in pk]
    sets = [f"t.{q(c)} = IF(s.{q(c + '__absent')}, t.{q(c)}, s.{q(c)})" for c in non_key]
    sets += ["t.pg_lsn = s.pg_lsn", "t.pg_seq = s.pg_seq", "t.pg_txn_timestamp = s.pg_txn_timestamp"]
    ins_cols = [q(c) for c in columns] + ["pg_lsn", "pg_seq", "pg_txn_timestamp"]
    ins_vals = [f"s.{q(c)}" for c in columns] + ["s.pg_lsn", "s.pg_seq", "s.pg_txn_timestamp"]
    return (
        f"MERGE INTO {current_ident} t USING {source_view} s ON {on}\n"
        f"WHEN MATCHED AND s._kind = 'delete' AND {POS_GT} THEN DELETE\n"
        f"WHEN MATCHED AND s._kind = 'upsert' AND {POS_GT} THEN UPDATE SET {', '.join(sets)}\n"
        f"WHEN NOT MATCHED AND s._kind = 'upsert' THEN INSERT ({', '.join(ins_cols)}) VALUES ({', '.join(ins_vals)})"
    )
