"""End to end on real PostgreSQL + wal2json, Spark and Iceberg: the foundation's guarantees."""

from __future__ import annotations

import pytest

from loader.capture.capture import Capture
from loader.workload import BankWorkload
from tests.harness import Env, landing_names
from tests.oracle import assert_history_matches

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}


def _snapshot_ids(env: Env) -> dict[str, list[int]]:
    out = {}
    for t in KEYS:
        for kind in ("history", "current"):
            ident = env.names.history if kind == "history" else env.names.current
            schema, _, name = t.partition(".")
            from loader.lake.tables import SourceTable

            rows = env.spark.sql(f"SELECT snapshot_id FROM {ident(SourceTable(schema, name))}.snapshots").collect()
            out[f"{kind}:{t}"] = sorted(r[0] for r in rows)
    return out


def test_workload_end_to_end_matches_source_and_history(env: Env) -> None:
    wl = BankWorkload(env.settings.source.dsn, seed=11)
    wl.create_schema()
    env.capture()  # creates the slot
    wl.run(120)  # several transactions land in each batch
    cap, load, _ = env.run_all()
    assert cap.transactions == 120 and load.rejects == 0
    env.assert_reconciled()
    wl.run(80)  # a second increment: updates/deletes of rows merged earlier
    env.run_all()
    env.assert_reconciled()
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def test_every_command_is_idempotent(env: Env) -> None:
    wl = BankWorkload(env.settings.source.dsn, seed=3)
    wl.create_schema()
    env.capture()
    wl.run(40)
    env.run_all()
    before = _snapshot_ids(env)
    files_before = landing_names(env.tmp / "landing")
    cap, load, merge = env.run_all()
    assert cap.changes == 0 and cap.files == []
    assert load.files == [] and load.rejects == 0
    assert all(t.increment_rows == 0 for t in merge.tables)
    assert _snapshot_ids(env) == before, "a re-run committed new snapshots"
    assert landing_names(env.tmp / "landing") == files_before
    env.assert_reconciled()
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


class Crash(Exception):
    pass


def test_crash_between_landing_write_and_slot_advance(env: Env) -> None:
    """The landing file is durable but the slot was never advanced: the re-run must not double anything."""
    wl = BankWorkload(env.settings.source.dsn, seed=5)
    wl.create_schema()
    env.capture()
    wl.run(60)

    def crash(name: str) -> None:
        raise Crash(name)

    with pytest.raises(Crash):
        Capture(env.settings, on_published=crash).run()
    landed = landing_names(env.tmp / "landing")
    assert len(landed) == 1, "the file was published before the crash"
    from loader.capture import slot as slots

    with slots.connect(env.settings.source.dsn) as conn:
        info = slots.slot_info(conn, env.settings.source.slot)
    assert info is not None and info.lag_bytes > 0, "the slot must not have moved"
    # Load what landed before the crash too, then re-run everything: nothing may double.
    env.load()
    wl.run(20)
    cap, _, _ = env.run_all()
    assert cap.skipped_already_landed > 0
    env.assert_reconciled()
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def test_crash_after_some_files_of_a_round(env: Env) -> None:
    """A round that publishes several files and dies after the second: re-run continues from the landed position."""
    env.sql("CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.capture()
    for i in range(6):
        env.transaction(*[f"INSERT INTO items VALUES ({i * 300 + j}, 'v{j}')" for j in range(300)])
    env.transaction("UPDATE items SET v = 'changed' WHERE id % 7 = 0", "DELETE FROM items WHERE id % 11 = 0")
    published: list[str] = []

    def crash_on_second(name: str) -> None:
        published.append(name)
        if len(published) == 2:
            raise Crash(name)

    with pytest.raises(Crash):
        Capture(env.settings, on_published=crash_on_second).run()
    env.run_all()
    env.assert_reconciled()
    hist = env.history("public.items")
    assert hist.count() == hist.select("pg_lsn", "pg_seq").distinct().count() == 1800 + 258 + 164


def test_oracle_catches_a_corrupted_current_row(env: Env) -> None:
    env.sql("CREATE TABLE t (id int PRIMARY KEY, amount numeric(10,2), note text)")
    env.capture()
    env.transaction("INSERT INTO t VALUES (1, 10.50, 'a'), (2, 20.00, 'b'), (3, 30.25, NULL)")
    env.run_all()
    env.assert_reconciled()
    cur = env.names.current(__import__("loader.lake.tables", fromlist=["SourceTable"]).SourceTable("public", "t"))
    env.spark.sql(f"UPDATE {cur} SET amount = 99.99 WHERE id = 2")
    results = env.reconcile()
    assert results[0].different == 1 and not results[0].ok
    env.spark.sql(f"DELETE FROM {cur} WHERE id = 3")
    env.spark.sql(f"INSERT INTO {cur} VALUES (7, 1.00, 'x', 1, 1, current_timestamp())")
    r = env.reconcile()[0]
    assert (r.missing, r.extra, r.different) == (1, 1, 1)
    with pytest.raises(AssertionError):
        env.assert_reconciled()


def test_common_types_round_trip(env: Env) -> None:
    env.sql(
        """CREATE TABLE "Typed Table" (
            id bigint PRIMARY KEY, s smallint, i integer, n numeric(20,6), t text, v varchar(10), b boolean,
            d date, ts timestamp, tz timestamptz, u uuid, j jsonb, "Mixed Case" text)"""
    )
    env.capture()
    env.transaction(
        """INSERT INTO "Typed Table" VALUES
           (1, -32768, 2147483647, 12345678901234.123456, 'it''s', 'ünï', true, '2024-02-29',
            '2024-01-01 12:34:56.789012', '2024-06-30 23:59:59.999999+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
            '{"k": [1, 2.50, null], "s": "x"}', 'M'),
           (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
           (9223372036854775807, 1, 1, -0.000001, '', '', false, '0001-01-01', '1999-12-31 23:59:59', '1970-01-01 00:00:00+00',
            '00000000-0000-0000-0000-000000000000', '[]', '')"""
    )
    env.transaction("""UPDATE "Typed Table" SET n = n * 2, j = j || '{"u": 1}' WHERE id = 1""")
    env.run_all()
    env.assert_reconciled()
