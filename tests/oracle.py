"""History oracle: the history tables hold exactly the changes a test made, once each, in order."""

from __future__ import annotations

from collections import Counter
from typing import Any

from loader.names import lake_column
from loader.workload import WorkloadLog


def history_changes(env: Any, table: str, key: list[str]) -> list[tuple[int, str, tuple[Any, ...]]]:
    """(pg_lsn, op, key) for every history row of ``table`` in commit order.

    Deletes carry their key in pg_old_key; inserts/updates in the key columns.
    """
    import json

    # Snapshot reads and control rows (resync, park) are not changes the workload made.
    rows = (
        env.history(table).where("pg_operation IN ('insert', 'update', 'delete')").orderBy("pg_lsn", "pg_seq").collect()
    )
    out = []
    for r in rows:
        if r["pg_operation"] == "delete":
            old = json.loads(r["pg_old_key"])
            k = tuple(int(old[c]) if old[c] is not None and old[c].lstrip("-").isdigit() else old[c] for c in key)
        else:
            k = tuple(r[lake_column(c)] for c in key)
        out.append((r["pg_lsn"], r["pg_operation"], k))
    return out


def assert_history_matches(env: Any, log: WorkloadLog, table: str, key: list[str]) -> None:
    """Each source transaction's changes to ``table`` appear once, as one commit, in commit order."""
    hist = history_changes(env, table, key)
    # Group history rows by transaction (commit LSN), keeping commit order.
    by_txn: list[Counter[tuple[str, tuple[Any, ...]]]] = []
    last_lsn = None
    for lsn, op, k in hist:
        if lsn != last_lsn:
            by_txn.append(Counter())
            last_lsn = lsn
        by_txn[-1][(op, k)] += 1
    expected = [Counter((c.op, c.key) for c in txn) for txn in log.for_table(table)]
    assert len(by_txn) == len(expected), f"{table}: {len(by_txn)} transactions in history, {len(expected)} made"
    for i, (got, want) in enumerate(zip(by_txn, expected)):
        assert got == want, f"{table}: transaction #{i} differs: history {dict(got)} vs made {dict(want)}"


def assert_no_duplicate_positions(env: Any) -> None:
    """No change is in history twice: (pg_lsn, pg_seq) is unique in every history table."""
    from pyspark.sql import functions as F

    for name in env.spark.sql(f"SHOW TABLES IN {env.names.catalog}.{env.names.history_ns}").collect():
        ident = f"{env.names.catalog}.{env.names.history_ns}.`{name.tableName}`"
        dups = env.spark.table(ident).groupBy("pg_lsn", "pg_seq").count().where(F.col("count") > 1).count()
        assert dups == 0, f"{name.tableName}: {dups} positions appear more than once"


def lake_table(settings: Any, table: str) -> Any:
    """The lake's ``SourceTable`` named ``table`` (``schema.table``; a dot inside a name resolved
    against the lake's tables, as the CLI resolves ``--table``)."""
    from loader.lake.catalog import lake_source_table

    return lake_source_table(settings, table)


def history_rows(settings: Any, table: str, columns: list[str]) -> list[dict[str, Any]]:
    """``columns`` of every history row of ``table`` (schema.table) in (pg_lsn, pg_seq) order, read
    through pyiceberg (no Spark job: an engine apart from the one that wrote them)."""
    from loader.lake.catalog import open_catalog

    hist = open_catalog(settings).load_table(
        (settings.catalog.history_namespace, lake_table(settings, table).iceberg_name)
    )
    fields = list(dict.fromkeys(["pg_lsn", "pg_seq", *columns]))
    rows = (
        hist.scan(selected_fields=tuple(fields)).to_arrow().sort_by([("pg_lsn", "ascending"), ("pg_seq", "ascending")])
    )
    return rows.to_pylist()  # type: ignore[no-any-return]


def assert_unique_positions(settings: Any) -> None:
    """``assert_no_duplicate_positions`` read through pyiceberg: every history table, no Spark job."""
    from loader.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    for ident in catalog.list_tables(settings.catalog.history_namespace):
        arrow = catalog.load_table(ident).scan(selected_fields=("pg_lsn", "pg_seq")).to_arrow()
        counts = arrow.group_by(["pg_lsn", "pg_seq"]).aggregate([([], "count_all")])
        dups = counts.filter(counts["count_all"].to_numpy() > 1)
        assert dups.num_rows == 0, (
            f"{ident[-1]}: {dups.num_rows} positions appear more than once: {dups.to_pylist()[:5]}"
        )
