"""What a production source throws at the loader, one test per hazard, each ending with the oracle.

Every test runs the real pipeline (PostgreSQL 15 + wal2json or pgoutput, Spark, Iceberg) and ends
with ``assert_reconciled``: each current table equals ``SELECT * FROM`` its source table, row for row
and value for value (or, for a parked table, says so with its repair).
"""

from __future__ import annotations

import json

import pytest

from loader.capture import slot as slots
from loader.errors import SlotLostError
from loader.lake.catalog import open_catalog
from tests.harness import Env, settings_env


def ops(env: Env, table: str) -> list[str]:
    return [r.pg_operation for r in env.history(table).orderBy("pg_lsn", "pg_seq").select("pg_operation").collect()]


def parked(env: Env) -> dict[str, str]:
    return {t.table: t.parked for t in env.status().tables if t.parked}


# --- rows changed without row changes in the WAL ----------------------------------------------


def test_add_column_with_a_default_that_fills_existing_rows(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 50) g")
    env.run_all()
    env.assert_reconciled()
    env.sql(
        "ALTER TABLE public.t ADD COLUMN status text NOT NULL DEFAULT 'active'"
    )  # a "missing value": no rows written
    env.sql("ALTER TABLE public.t ADD COLUMN seen_at timestamptz DEFAULT clock_timestamp()")  # volatile: a rewrite
    env.sql("UPDATE public.t SET v = 'w' WHERE id = 1")
    cap, _, merge = env.run_all()
    assert "status was added with a default" in cap.resynced["public.t"] or "rewrite" in cap.resynced["public.t"]
    env.assert_reconciled()
    assert {r["status"] for r in env.current("public.t").collect()} == {"active"}
    assert not merge.parked and not parked(env)
    # History records what happened: the park before the stream's changes, the resync after them.
    history_ops = ops(env, "public.t")
    assert history_ops.count("park") == 1 and history_ops.count("resync") == 1
    assert history_ops.index("park") < history_ops.index("update") < history_ops.index("resync")
    note = env.history("public.t").where("pg_operation = 'resync'").first()["pg_note"]
    assert "added with a default" in note or "rewrite" in note


def test_a_table_created_and_altered_between_two_captures(env: Env) -> None:
    """The catalog watch never saw these tables before their DDL: the catalog's own traces (a
    column's "missing value", a relfilenode other than the oid) say rows changed outside the WAL."""
    env.sql("CREATE TABLE public.seen (id int PRIMARY KEY)")
    env.capture()
    env.sql("CREATE TABLE public.fresh (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.fresh SELECT g, 'v' FROM generate_series(1, 20) g")
    env.sql("ALTER TABLE public.fresh ADD COLUMN b text DEFAULT 'dflt'")  # fills the 20 rows, no WAL rows
    env.sql("INSERT INTO public.fresh VALUES (21, 'w', 'own')")
    env.sql("CREATE TABLE public.retyped (id int PRIMARY KEY, n int)")
    env.sql("INSERT INTO public.retyped SELECT g, g FROM generate_series(1, 20) g")
    env.sql("ALTER TABLE public.retyped ALTER COLUMN n TYPE bigint USING n * 1000")  # a rewrite
    env.sql("CREATE TABLE public.untouched (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.untouched VALUES (1, 'a')")
    cap, _, _ = env.run_all()
    assert "b was added with a default" in cap.resynced["public.fresh"], cap.resynced
    assert "rewritten" in cap.resynced["public.retyped"], cap.resynced
    assert "public.untouched" not in cap.resynced  # nothing happened outside the WAL: no resync
    env.assert_reconciled()
    assert {r["b"] for r in env.current("public.fresh").where("id <= 20").collect()} == {"dflt"}


def test_type_level_ddl_reaches_every_table_using_the_type(env: Env) -> None:
    """ALTER TYPE changes stored values of every table using the type, without a row change in the
    WAL: a renamed enum label, a composite type's new attribute. Adding a label changes nothing."""
    env.sql("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    env.sql("CREATE TYPE pair AS (a int, b text)")
    env.sql("CREATE DOMAIN mood_d AS mood")
    env.sql("CREATE TABLE public.m1 (id int PRIMARY KEY, m mood, ms mood[])")
    env.sql("CREATE TABLE public.m2 (id int PRIMARY KEY, m mood_d)")
    env.sql("CREATE TABLE public.p (id int PRIMARY KEY, p pair)")
    env.sql("CREATE TABLE public.other (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.m1 VALUES (1, 'sad', '{sad,ok}'), (2, 'ok', '{}')")
    env.sql("INSERT INTO public.m2 VALUES (1, 'sad')")
    env.sql("INSERT INTO public.p VALUES (1, ROW(1, 'x'))")
    env.sql("INSERT INTO public.other VALUES (1, 'a')")
    env.run_all()
    env.assert_reconciled()
    env.sql("ALTER TYPE mood ADD VALUE 'meh'")  # no stored value changes: no resync
    cap, _, _ = env.run_all()
    assert not cap.resynced, cap.resynced
    env.sql("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
    env.sql("ALTER TYPE pair ADD ATTRIBUTE c date")  # every stored value now reads (1,x,)
    cap, _, _ = env.run_all()
    assert "'sad' -> 'blue'" in cap.resynced["public.m1"] and "'sad' -> 'blue'" in cap.resynced["public.m2"]
    assert "composite" in cap.resynced["public.p"] and "public.other" not in cap.resynced
    env.assert_reconciled()
    assert {r["m"] for r in env.current("public.m1").collect()} == {"blue", "ok"}


@pytest.mark.parametrize("trigger", [False, True], ids=["catalog-only", "ddl-trigger"])
def test_a_table_first_seen_after_its_types_ddl_is_resynced(env: Env, trigger: bool) -> None:
    """A table created and filled since the last run, then its enum's label renamed and its
    composite type given an attribute: no earlier picture of the table has the old signatures,
    so without the DDL trigger the catalog rows' transactions tell (make fuzz, seed 2084, kept the
    old label); a table created after the type changes is not resynced for them."""
    env.configure("source", ddl_trigger=trigger)
    env.sql("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    env.sql("CREATE TYPE pair AS (a int, b text)")
    env.sql("CREATE TABLE public.other (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("CREATE TABLE public.fresh (id int PRIMARY KEY, m mood, ms mood[])")
    env.sql("CREATE TABLE public.paired (id int PRIMARY KEY, p pair)")
    env.sql("INSERT INTO public.fresh VALUES (1, 'sad', '{sad,ok}'), (2, 'ok', '{}')")
    env.sql("INSERT INTO public.paired VALUES (1, ROW(1, 'x'))")
    env.sql("INSERT INTO public.other VALUES (1, 'a')")
    env.sql("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
    env.sql("ALTER TYPE pair ADD ATTRIBUTE c date")
    env.sql("CREATE TABLE public.later (id int PRIMARY KEY, m mood)")
    env.sql("INSERT INTO public.later VALUES (1, 'blue')")
    cap, _, _ = env.run_all()
    assert {"public.fresh", "public.paired"} <= set(cap.resynced), cap.resynced
    assert "public.later" not in cap.resynced and "public.other" not in cap.resynced, cap.resynced
    env.assert_reconciled()
    assert {r["m"] for r in env.current("public.fresh").collect()} == {"blue", "ok"}


def test_a_keyless_table_truncated_or_rewritten_is_not_copied_again(env: Env) -> None:
    """pgbench starts with TRUNCATE pgbench_history: the stream says what happened, and a keyless
    table has no current table to rebuild, so no resync copies its rows into history again."""
    env.sql("CREATE TABLE public.log (aid int, delta int)")
    env.capture()
    env.sql("INSERT INTO public.log SELECT g, g FROM generate_series(1, 30) g")
    env.run_all()
    env.sql("TRUNCATE public.log")
    env.sql("INSERT INTO public.log VALUES (1, 1)")
    env.sql("VACUUM FULL public.log")
    cap, _, _ = env.run_all()
    assert "public.log" not in cap.resynced, cap.resynced
    history_ops = ops(env, "public.log")
    assert "read" not in history_ops and history_ops.count("insert") == 31 and "truncate" in history_ops


@pytest.mark.parametrize("trigger", [True, False], ids=["ddl-trigger", "catalog-only"])
def test_a_keyless_table_whose_identity_becomes_full_is_resynced(env: Env, trigger: bool) -> None:
    """Deletes of a table without a key or a replica identity are not decoded (a server WARNING
    only): when REPLICA IDENTITY FULL makes its deletes decodable, history's state must lose the
    rows deleted before, which only a re-read gives (make fuzz seed 324)."""
    env.configure("source", ddl_trigger=trigger)
    env.sql("CREATE TABLE public.kl (a int, b text)")
    env.sql("INSERT INTO public.kl SELECT g, 'x' || g FROM generate_series(1, 8) g")
    env.run_all()
    env.sql("DELETE FROM public.kl WHERE a <= 3")  # not decoded: no replica identity
    env.sql("ALTER TABLE public.kl REPLICA IDENTITY FULL")
    env.sql("DELETE FROM public.kl WHERE a = 8")  # decoded: the old row
    cap, _, _ = env.run_all()
    assert "history's state restarts" in cap.resynced.get("public.kl", ""), (cap.resynced, cap.notes)
    env.assert_reconciled()


@pytest.mark.parametrize("trigger", [True, False], ids=["ddl-trigger", "catalog-only"])
def test_a_keyless_table_set_unlogged_then_logged_is_resynced(env: Env, trigger: bool) -> None:
    """A table without a key has no current table, but its history's state is its rows: rows deleted
    while it was unlogged (not in the WAL) must not stay in the lake. With the DDL trigger its SET
    LOGGED message says so; by the catalog alone the rewrite cannot be told from a TRUNCATE or
    VACUUM FULL, so any rewrite resyncs it (make fuzz seed 2, 5 rounds over 6 tables, catalog only)."""
    env.configure("source", ddl_trigger=trigger)
    env.sql("CREATE TABLE public.log (a int, b text)")
    env.sql("ALTER TABLE public.log REPLICA IDENTITY FULL")
    env.capture()
    env.sql("INSERT INTO public.log SELECT g, 'x' || g FROM generate_series(1, 6) g")
    env.run_all()
    env.sql("ALTER TABLE public.log SET UNLOGGED")
    env.sql("DELETE FROM public.log WHERE a <= 3")  # not in the WAL
    env.sql("ALTER TABLE public.log SET LOGGED")
    env.sql("INSERT INTO public.log VALUES (7, 'y')")
    cap, _, _ = env.run_all()
    assert "public.log" in cap.resynced, (cap.resynced, cap.notes)
    env.assert_reconciled()


def test_rename_column_and_rename_table(env: Env) -> None:
    env.sql("CREATE TABLE public.old_name (id int PRIMARY KEY, a text)")
    env.capture()
    env.sql("INSERT INTO public.old_name SELECT g, 'a' || g FROM generate_series(1, 10) g")
    env.run_all()
    env.sql("ALTER TABLE public.old_name RENAME COLUMN a TO b")
    cap, _, _ = env.run_all()
    assert cap.resynced == {"public.old_name": "column a was renamed to b"}
    env.assert_reconciled()
    assert {r["b"] for r in env.current("public.old_name").collect()} == {f"a{g}" for g in range(1, 11)}
    # A table rename: its rows continue under the new name; the old name stops with a reason.
    env.sql("ALTER TABLE public.old_name RENAME TO new_name")
    env.sql("UPDATE public.new_name SET b = 'moved' WHERE id = 1")
    cap, _, _ = env.run_all()
    assert "renamed from public.old_name" in cap.resynced["public.new_name"]
    assert "renamed to public.new_name" in cap.parked["public.old_name"]
    results = {r.table: r for r in env.reconcile()}
    assert results["public.new_name"].ok
    assert results["public.old_name"].parked and "renamed to public.new_name" in results["public.old_name"].parked


def test_table_dropped_and_created_again_under_its_name(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'old' FROM generate_series(1, 20) g")
    env.run_all()
    env.sql("DROP TABLE public.t")  # no DELETEs in the WAL
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.t VALUES (100, 'new')")
    cap, _, _ = env.run_all()
    assert "dropped and created again" in cap.resynced["public.t"]
    env.assert_reconciled()
    assert [r["id"] for r in env.current("public.t").collect()] == [100]


def test_unlogged_tables_and_set_logged(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'x' FROM generate_series(1, 5) g")
    env.run_all()
    env.sql("ALTER TABLE public.t SET UNLOGGED")  # from here its changes are not in the WAL
    env.sql("DELETE FROM public.t WHERE id <= 2")
    cap, _, merge = env.run_all()
    assert "UNLOGGED" in cap.parked["public.t"] and "public.t" in merge.parked
    env.sql("INSERT INTO public.t VALUES (9, 'y')")
    env.sql("ALTER TABLE public.t SET LOGGED")
    cap, _, merge = env.run_all()
    assert "SET LOGGED" in cap.resynced["public.t"] and not merge.parked
    env.assert_reconciled()


# --- what wal2json emits besides row changes ---------------------------------------------------


def test_logical_messages_never_wedge_the_slot(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("SELECT pg_logical_emit_message(false, 'heartbeat', 'beat 1')")
    env.transaction(
        "INSERT INTO public.t VALUES (1, 'a')", "SELECT pg_logical_emit_message(true, 'debezium-signal', '{}')"
    )
    env.sql("SELECT pg_logical_emit_message(false, 'heartbeat', 'beat 2')")
    env.sql("SELECT txid_current()")  # an empty transaction
    env.sql("INSERT INTO public.t VALUES (2, 'b')")  # flushes the WAL past the messages
    cap = env.capture()
    assert cap.changes == 2 and cap.messages_skipped >= 2
    again = env.capture()
    assert again.changes == 0 and again.files == [] and again.messages_skipped == 0, "nothing is read twice"
    with slots.connect(env.settings.source.dsn) as conn:
        info = slots.slot_info(conn, env.settings.source.slot)
    assert info is not None and info.lag_bytes < 1024 * 1024
    env.load()
    env.merge()
    env.assert_reconciled()


# --- replica identity --------------------------------------------------------------------------


def test_replica_identity_nothing_never_builds_a_current_table(env: Env) -> None:
    from click.testing import CliRunner

    from loader.cli import main

    env.sql("CREATE TABLE public.k (id int PRIMARY KEY, v text)")
    env.sql("ALTER TABLE public.k REPLICA IDENTITY NOTHING")
    env.capture()
    env.sql("INSERT INTO public.k SELECT g, 'v' FROM generate_series(1, 5) g")
    env.sql("UPDATE public.k SET v = 'changed' WHERE id = 1")  # not decoded at all
    env.sql("DELETE FROM public.k WHERE id = 2")  # not decoded at all
    cap, _, merge = env.run_all()
    assert "updates/deletes" in cap.limited_tables["public.k"]
    assert {t.table: t.skipped_reason for t in merge.tables}["public.k"] == "no primary key: history only"
    result = {r.table: r for r in env.reconcile()}["public.k"]
    # Verify says so: rows 1 (changed) and 2 (deleted) differ, with why; not a loader fault (exit 0).
    assert result.ok and result.limited_rows == 3 and "no replica identity" in result.note, result.line()
    assert result.line().startswith("NOT FOLLOWED")
    out = CliRunner().invoke(main, ["slot", "tables"], env=settings_env(env.settings))
    assert "public.k" in out.output and "REPLICA IDENTITY NOTHING" in out.output, out.output
    # Identity restored: capture resyncs it, and only now is a current table built, equal to the source.
    env.sql("ALTER TABLE public.k REPLICA IDENTITY DEFAULT")
    cap, _, _ = env.run_all()
    assert "carries updates and deletes again" in cap.resynced["public.k"]
    env.assert_reconciled()


def test_a_deferrable_primary_key_is_no_replica_identity(env: Env) -> None:
    """PostgreSQL never uses a DEFERRABLE key as replica identity: wal2json sends nothing for the
    table's updates and deletes. No current table may be built from its inserts; once the key is
    immediate (or the identity FULL), the table is resynced and then kept exact."""
    from click.testing import CliRunner

    from loader.cli import main

    env.sql("CREATE TABLE public.d (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, v text)")
    env.sql("CREATE TABLE public.u (id int NOT NULL, v text)")
    env.sql("CREATE UNIQUE INDEX u_id ON public.u (id) WHERE id > 0")  # partial: no identity either
    env.capture()
    env.sql("INSERT INTO public.d SELECT g, 'v' FROM generate_series(1, 5) g")
    env.sql("UPDATE public.d SET v = 'changed' WHERE id = 1")  # not decoded
    env.sql("DELETE FROM public.d WHERE id = 2")  # not decoded
    env.transaction("UPDATE public.d SET id = id + 10 WHERE id IN (3, 4)")  # a deferred key move
    env.sql("INSERT INTO public.u VALUES (1, 'a')")
    cap, _, merge = env.run_all()
    assert "DEFERRABLE" in cap.limited_tables["public.d"], cap.limited_tables
    skipped = {t.table: t.skipped_reason for t in merge.tables}
    assert skipped["public.d"] == "no primary key: history only", skipped
    assert {r.table: r for r in env.reconcile()}["public.d"].note.startswith("no primary key")
    out = CliRunner().invoke(main, ["slot", "tables", "--json"], env=settings_env(env.settings))
    assert out.exit_code == 0, out.output
    tables = {t["table"]: t for t in json.loads(out.output)}
    assert tables["public.d"]["key"] == [] and not tables["public.d"]["updates_deletes_captured"]
    assert "DEFERRABLE" in tables["public.d"]["downstream"]
    # The key made immediate: now PostgreSQL decodes updates and deletes, and capture resyncs it.
    env.sql("ALTER TABLE public.d DROP CONSTRAINT d_pkey, ADD PRIMARY KEY (id)")
    env.sql("UPDATE public.d SET v = 'seen' WHERE id = 5")
    cap, _, _ = env.run_all()
    assert "public.d" in cap.resynced, cap.resynced
    env.sql("DELETE FROM public.d WHERE id = 13")
    env.run_all()
    env.assert_reconciled(["public.d"])


def test_replica_identity_changes_mid_stream(env: Env) -> None:
    env.sql("CREATE TABLE public.k (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text)")
    env.capture()
    env.sql("INSERT INTO public.k SELECT g, 'e' || g, 'v' FROM generate_series(1, 20) g")
    env.run_all()
    env.assert_reconciled()
    env.sql("ALTER TABLE public.k REPLICA IDENTITY FULL")  # still keyed by the primary key
    env.sql("UPDATE public.k SET v = 'full' WHERE id = 3")
    env.run_all()
    env.assert_reconciled()
    env.sql("ALTER TABLE public.k REPLICA IDENTITY USING INDEX k_email_key")  # the key becomes email
    env.sql("UPDATE public.k SET v = 'index' WHERE id = 4")
    env.sql("DELETE FROM public.k WHERE id = 5")
    cap, _, _ = env.run_all()
    assert "key changed" in cap.resynced["public.k"]
    env.assert_reconciled()
    env.sql("ALTER TABLE public.k REPLICA IDENTITY NOTHING")
    env.sql("DELETE FROM public.k WHERE id = 6")  # lost to the stream
    env.sql("UPDATE public.k SET v = 'lost' WHERE id = 7")  # lost to the stream
    cap, _, merge = env.run_all()
    assert "no longer decoded" in cap.parked["public.k"] and "public.k" in merge.parked
    result = {r.table: r for r in env.reconcile()}["public.k"]
    assert not result.ok and result.parked and "REPLICA IDENTITY" in result.parked
    env.sql("ALTER TABLE public.k REPLICA IDENTITY DEFAULT")
    env.run_all()
    env.assert_reconciled()


# --- names -------------------------------------------------------------------------------------


def test_columns_differing_only_in_case_park_their_table_alone(env: Env) -> None:
    env.sql('CREATE TABLE public.cased (id int PRIMARY KEY, "Value" text, value text)')
    env.sql("CREATE TABLE public.plain (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.cased VALUES (1, 'upper', 'lower')")
    env.sql("INSERT INTO public.plain VALUES (1, 'a')")
    _, load, merge = env.run_all()
    assert "differ only in case" in load.parked["public.cased"], load.parked
    assert "public.plain" not in load.parked and "public.plain" not in merge.parked
    results = {r.table: r for r in env.reconcile()}
    assert results["public.plain"].ok and results["public.cased"].parked
    # The repair the reason names: rename at the source, resync.
    env.sql('ALTER TABLE public.cased RENAME COLUMN "Value" TO value_upper')
    env.resync(["public.cased"])
    env.load()
    env.merge()
    env.sql("UPDATE public.cased SET value = 'changed' WHERE id = 1")
    env.run_all()
    env.assert_reconciled()


def test_tables_whose_names_hold_dots_are_snapshotted_resynced_and_parked(env: Env) -> None:
    """A dot inside a schema's or a table's name: ``"app.v2".t`` and ``public."x.y"`` are named
    ``app.v2.t`` and ``public.x.y`` inside the loader, and every split of such a name goes by
    PostgreSQL's catalog (the first dot made the snapshot look for table ``"v2.t"`` of schema
    ``app``, find nothing, and land nothing, silently). A name two tables spell is refused."""
    import psycopg

    from loader.capture.source_tables import split_qualified
    from loader.errors import UsageError

    env.sql('CREATE SCHEMA "app.v2"')
    env.sql('CREATE TABLE "app.v2".t (id int PRIMARY KEY, v text)')
    env.sql('CREATE TABLE public."x.y" (id int PRIMARY KEY, v text)')
    env.sql("""INSERT INTO "app.v2".t SELECT g, 'v' FROM generate_series(1, 20) g""")
    env.sql("""INSERT INTO public."x.y" SELECT g, 'w' FROM generate_series(1, 7) g""")
    env.capture()
    env.resync()  # the initial snapshot of every table
    env.load()
    env.merge()
    env.assert_reconciled()
    assert {r.table for r in env.reconcile()} >= {"app.v2.t", "public.x.y"}
    env.transaction("""UPDATE "app.v2".t SET v = 'u' WHERE id < 5""")
    env.resync(["app.v2.t"])
    env.configure("source", auto_resync=False)
    env.sql('ALTER TABLE "app.v2".t ADD COLUMN d int DEFAULT 7')  # a table-level change: a park
    env.transaction("""INSERT INTO public."x.y" VALUES (100, 'after')""")
    cap = env.capture()
    assert "app.v2.t" in cap.parked, cap.parked
    env.load()
    merge = env.merge()
    assert [t.parked for t in merge.tables if t.table == "app.v2.t"] != [None], merge.tables
    env.resync(["app.v2.t"])
    env.run_all()
    env.assert_reconciled()
    # What users name on the command line resolves against the lake's tables the same way.
    from loader.lake.catalog import lake_source_table
    from loader.lake.tables import SourceTable
    from loader.merge.current import CurrentMerge

    rebuilt = CurrentMerge(env.spark, env.settings).rebuild("app.v2.t")
    assert rebuilt.table == "app.v2.t" and not rebuilt.skipped_reason, rebuilt
    # backfill's and erase's --table resolution
    assert lake_source_table(env.settings, "app.v2.t") == SourceTable("app.v2", "t")
    env.assert_reconciled()

    env.sql('CREATE SCHEMA "a.b"')
    env.sql("CREATE SCHEMA a")
    env.sql('CREATE TABLE "a.b".c (id int)')
    env.sql('CREATE TABLE a."b.c" (id int)')
    with psycopg.connect(env.settings.source.conninfo()) as conn:
        with pytest.raises(UsageError, match="names 2 tables"):
            split_qualified(conn, "a.b.c")
        assert split_qualified(conn, "app.v2.t") == ("app.v2", "t")
        assert split_qualified(conn, "public.x.y") == ("public", "x.y")
        assert split_qualified(conn, "gone.x.y") == ("gone", "x.y")  # no such table: the first dot


def test_names_that_need_quoting_or_look_like_ours(env: Env) -> None:
    long_name = "t" + "é" * 31  # 63 bytes
    env.sql('CREATE SCHEMA "a__b"')
    env.sql("CREATE SCHEMA a")
    env.sql('CREATE SCHEMA "Weird.Schema"')
    env.sql('CREATE TABLE "a__b".c (id int PRIMARY KEY, v text)')
    env.sql('CREATE TABLE a."b__c" (id int PRIMARY KEY, v text)')
    env.sql(f'CREATE TABLE "Weird.Schema"."{long_name}" ("Id" int PRIMARY KEY, "we""ird col" text)')
    env.sql(
        'CREATE TABLE public.cols (id int PRIMARY KEY, _reason text, _kind text, pg_lsn bigint, "pg__x" int,'
        ' "PG_SEQ" text, __absent text, _raw text, _line int, _sub int, _from text, _m text, pg_note text)'
    )
    env.capture()
    env.sql("INSERT INTO \"a__b\".c VALUES (1, 'in a__b.c')")
    env.sql("INSERT INTO a.\"b__c\" VALUES (1, 'in a.b__c'), (2, 'second')")
    env.sql(f"INSERT INTO \"Weird.Schema\".\"{long_name}\" VALUES (1, 'x'), (2, '{{{{ config() }}}}')")
    env.sql("INSERT INTO public.cols VALUES (1, 'r', 'k', 42, 7, 's', 'a', 'raw', 3, 4, 'f', 'm', 'n')")
    env.sql("UPDATE public.cols SET _reason = 'r2', pg_lsn = 43, \"pg__x\" = 8 WHERE id = 1")
    env.sql('UPDATE a."b__c" SET id = 3 WHERE id = 2')
    _, load, _ = env.run_all()
    assert load.rejects == 0
    results = env.assert_reconciled()
    assert {r.table for r in results} == {"a__b.c", "a.b__c", f"Weird.Schema.{long_name}", "public.cols"}
    names = {i[-1] for i in open_catalog(env.settings).list_tables(env.settings.catalog.history_namespace)}
    assert len(names) == 4 and all(len(n) <= 255 for n in names)
    cols = env.current("public.cols").first()
    assert cols["_reason"] == "r2" and cols["pg__pg_lsn"] == 43 and cols["pg__pg__x"] == 8 and cols["pg_lsn"] > 0


# --- slot loss, exclusion, resync semantics ----------------------------------------------------


def test_slot_dropped_and_rows_deleted_meanwhile_then_resync(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.u (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 30) g")
    env.sql("INSERT INTO public.u SELECT g, 'v' FROM generate_series(1, 30) g")
    env.run_all()
    with slots.connect(env.settings.source.dsn) as conn:
        slots.drop_slot(conn, env.settings.source.slot)
    env.sql("DELETE FROM public.t WHERE id <= 10")  # never in any slot
    env.sql("UPDATE public.u SET v = 'changed' WHERE id = 1")
    with pytest.raises(SlotLostError) as err:
        env.capture()
    assert "loader resync" in err.value.hint
    # A re-snapshot of one table is refused: every table lost changes.
    with pytest.raises(SlotLostError):
        env.resync(["public.t"])
    snap = env.resync(recover=True)
    assert snap.slot_created and set(snap.tables) == {"public.t", "public.u"}
    env.sql("INSERT INTO public.t VALUES (100, 'after')")
    env.run_all()
    env.assert_reconciled()
    note = env.history("public.t").where("pg_operation = 'resync'").orderBy("pg_lsn").collect()[-1]["pg_note"]
    assert "replication slot lost" in note


def test_slot_invalidated_by_max_slot_wal_keep_size(env: Env, pg_admin: str) -> None:
    import psycopg

    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.configure("source", on_slot_loss="resync")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 10) g")
    env.run_all()
    with psycopg.connect(pg_admin, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            for _ in range(8):  # past the limit, and checkpoints that remove the segments
                env.sql(
                    "INSERT INTO public.t SELECT g, repeat('x', 1000) FROM generate_series(1000, 5000) g ON CONFLICT (id) DO UPDATE SET v = excluded.v"
                )
                admin.execute("SELECT pg_switch_wal()")
                admin.execute("CHECKPOINT")
            with slots.connect(env.settings.source.dsn) as conn:
                info = slots.slot_info(conn, env.settings.source.slot)
            assert info is not None and info.wal_status == "lost"
        finally:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")
    env.sql("DELETE FROM public.t WHERE id <= 5")
    cap = env.capture()  # on_slot_loss=resync: recreated and resynced, unattended
    assert cap.slot_created and "public.t" in cap.resynced
    env.run_all()
    env.assert_reconciled()


def test_table_excluded_then_included_again(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.other (id int PRIMARY KEY)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 20) g")
    env.run_all()
    env.configure("source", exclude=["pg_catalog.*", "information_schema.*", "public.t"])
    env.sql("DELETE FROM public.t WHERE id <= 5")  # not captured while excluded
    env.sql("INSERT INTO public.other VALUES (1)")
    cap, _, merge = env.run_all()
    assert "excluded" in cap.parked["public.t"] and "public.t" in merge.parked
    env.configure("source", exclude=["pg_catalog.*", "information_schema.*"])
    cap, _, merge = env.run_all()
    assert "included in capture again" in cap.resynced["public.t"] and not merge.parked
    env.assert_reconciled()


# --- isolation: one table's failure parks that table only -------------------------------------


def test_incompatible_retype_is_isolated_and_heals_itself(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, n int)")
    env.sql("CREATE TABLE public.other (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, g FROM generate_series(1, 10) g")
    env.run_all()
    env.sql("ALTER TABLE public.t ALTER COLUMN n TYPE text USING 'n' || n")
    env.sql("UPDATE public.t SET n = 'changed' WHERE id = 1")
    env.sql("INSERT INTO public.other VALUES (1, 'advances')")
    cap, load, merge = env.run_all()
    assert "public.t" in cap.resynced and load.retired_columns and not merge.parked
    env.assert_reconciled()
    hist = env.history("public.t")
    assert {r["pg__r1_n"] for r in hist.where("pg_operation = 'insert'").collect()} == set(range(1, 11))
    assert {r["n"] for r in env.current("public.t").collect()} == {"changed", *[f"n{g}" for g in range(2, 11)]}


def test_truncated_landing_file_keeps_readable_changes_and_parks_what_it_lost(env: Env) -> None:
    env.sql("CREATE TABLE public.a (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.b (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.c (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.c VALUES (1, 'own file')")
    env.capture()
    for i in range(40):
        env.transaction(f"INSERT INTO public.a VALUES ({i}, md5({i}::text))", f"INSERT INTO public.b VALUES ({i}, 'b')")
    env.configure("source", stream_format="jsonl")  # v1 keeps every line before the damage (v2: every batch)
    env.capture()
    files = sorted((env.tmp / "landing").rglob("*.jsonl.gz"))
    damaged = files[-1]
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) * 2 // 3])  # torn by a bad copy
    load = env.load()
    assert set(load.parked) <= {"public.a", "public.b"} and load.parked and load.rejects >= 1
    assert all("damaged" in why and "loader resync" in why for why in load.parked.values())
    kept = env.history("public.a").where("pg_operation = 'insert'").count()
    assert 0 < kept < 40, "the readable changes are in history"
    merge = env.merge()
    assert set(merge.parked) == set(load.parked)
    assert {t: r.parked is not None for t, r in ((r.table, r) for r in env.reconcile())} == {
        "public.a": "public.a" in load.parked,
        "public.b": "public.b" in load.parked,
        "public.c": False,
    }
    env.resync(["public.a", "public.b"])
    env.run_all()
    env.assert_reconciled()
    assert not parked(env)


# --- lossless values ---------------------------------------------------------------------------


def test_pgoutput_keeps_nan_and_infinity(env: Env) -> None:
    env.configure("source", plugin="pgoutput", publication=f"pub_{env.uid}")
    env.sql("CREATE TABLE public.f (id int PRIMARY KEY, r real, d double precision, n numeric, b boolean, t text)")
    cap = env.capture()
    assert cap.slot_created and cap.numeric_special_values
    env.sql(
        "INSERT INTO public.f VALUES (1, 'NaN', 'Infinity', 'NaN', true, 'a'), (2, '-Infinity', 'NaN', 'Infinity', false, NULL),"
        " (3, NULL, NULL, NULL, NULL, 'c'), (4, 1.5, -0.0, '-Infinity', true, 'd')"
    )
    env.sql("UPDATE public.f SET d = 'NaN' WHERE id = 4")
    env.run_all()
    env.assert_reconciled()
    rows = {r["id"]: r for r in env.current("public.f").collect()}
    assert rows[1]["n"] == "NaN" and rows[2]["n"] == "Infinity" and rows[3]["n"] is None
    assert rows[1]["d"] == float("inf") and rows[4]["d"] != rows[4]["d"]  # NaN


def test_partitioned_table_lands_as_one_table(env: Env) -> None:
    env.sql(
        "CREATE TABLE public.orders (id int, region text, amount int, PRIMARY KEY (id, region)) PARTITION BY LIST (region)"
    )
    env.sql("CREATE TABLE public.orders_eu PARTITION OF public.orders FOR VALUES IN ('eu')")
    env.sql("CREATE TABLE public.orders_us PARTITION OF public.orders FOR VALUES IN ('us')")
    env.capture()
    env.sql(
        "INSERT INTO public.orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 20) g"
    )
    env.sql("UPDATE public.orders SET region = 'us' WHERE id = 2")  # moves to another partition
    env.sql("DELETE FROM public.orders WHERE id = 3")
    env.run_all()
    assert [r.table for r in env.assert_reconciled()] == ["public.orders"], "partitions are not tables of their own"
    # A table attached with its rows (no row changes in the WAL), and one partition truncated.
    env.sql("CREATE TABLE public.orders_apac (LIKE public.orders INCLUDING ALL)")
    env.sql("INSERT INTO public.orders_apac SELECT g, 'apac', g FROM generate_series(100, 110) g")
    env.run_all()
    env.sql("ALTER TABLE public.orders ATTACH PARTITION public.orders_apac FOR VALUES IN ('apac')")
    env.sql("TRUNCATE public.orders_eu")
    cap, _, _ = env.run_all()
    assert (
        "attached" in cap.resynced["public.orders"] and "partition of public.orders" in cap.parked["public.orders_apac"]
    )
    results = {r.table: r for r in env.reconcile()}
    assert results["public.orders"].ok and results["public.orders"].source_rows == 11 + 10
    # Detached again: its rows become a table of its own, resynced, and leave the partitioned table.
    env.sql("ALTER TABLE public.orders DETACH PARTITION public.orders_apac")
    cap, _, _ = env.run_all()
    assert (
        "detached" in cap.resynced["public.orders"]
        and "detached from public.orders" in cap.resynced["public.orders_apac"]
    )
    env.assert_reconciled()


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_generated_columns_follow_their_base_columns(env: Env, plugin: str) -> None:
    """A stored generated column is computed by PostgreSQL: the stream of wal2json prints it, but
    pgoutput (PostgreSQL < 18) never sends it, so an update of its base column changes it without
    any change to it in the WAL. The lake must never hold a stale or NULL value for one."""
    if plugin == "pgoutput":
        env.configure("source", plugin="pgoutput", publication=f"pub_{env.uid}")
    env.sql("CREATE TABLE public.g (id int PRIMARY KEY, x int, doubled int GENERATED ALWAYS AS (x * 2) STORED)")
    env.sql("INSERT INTO public.g (id, x) SELECT g, g FROM generate_series(1, 5) g")
    env.capture()
    env.resync(["public.g"])
    env.sql("INSERT INTO public.g (id, x) VALUES (6, 6)")
    env.sql("UPDATE public.g SET x = x + 100 WHERE id IN (2, 6)")
    env.run_all()
    env.assert_reconciled()
    # DROP EXPRESSION makes it a plain column holding its values, without a rewrite or a row
    # change: pgoutput sends it from now on, and the rows it never sent must get their values.
    env.sql("ALTER TABLE public.g ALTER COLUMN doubled DROP EXPRESSION")
    env.sql("UPDATE public.g SET x = 0 WHERE id = 1")
    cap, _, _ = env.run_all()
    assert "generated" in cap.resynced.get("public.g", ""), cap.resynced
    env.assert_reconciled()


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_the_database_s_own_output_settings_do_not_change_the_lake_s_values(env: Env, plugin: str) -> None:
    """A DBA's ALTER DATABASE ... SET of an output setting (bytea_output escape, a DateStyle, an
    IntervalStyle) applies to every new session, the loader's and the walsender's: the text form
    of the values changes, no row does. The lake's values stay what they are under the defaults."""
    if plugin == "pgoutput":
        env.configure("source", plugin="pgoutput", publication=f"pub_{env.uid}")
    db = env.sql("SELECT current_database()")[0][0]
    env.sql(
        "CREATE TABLE public.o (id int PRIMARY KEY, b bytea, d date, ts timestamp, tz timestamptz, iv interval, r real)"
    )
    row = (
        "'\\x00ff5c27'::bytea, '2024-01-31', '2024-01-31 12:00:01.5', '2024-01-31 12:00:01.5+02', '1 day 02:00:03', 0.1"
    )
    env.sql(f"INSERT INTO public.o VALUES (1, {row})")
    for setting, value in [
        ("bytea_output", "escape"),
        ("DateStyle", "SQL, DMY"),
        ("IntervalStyle", "sql_standard"),
        ("TimeZone", "America/New_York"),
        ("extra_float_digits", "0"),
    ]:
        env.sql(f'ALTER DATABASE "{db}" SET {setting} = {value!r}')
    try:
        env.capture()
        env.resync(["public.o"])
        env.sql(f"INSERT INTO public.o VALUES (2, {row})")
        env.sql("UPDATE public.o SET b = b || '\\x01'::bytea WHERE id = 1")
        env.run_all()
        env.assert_reconciled()
        rows = {r["id"]: r for r in env.current("public.o").collect()}
        assert bytes(rows[2]["b"]) == b"\x00\xff\x5c\x27" and bytes(rows[1]["b"]) == b"\x00\xff\x5c\x27\x01"
        assert str(rows[2]["d"]) == "2024-01-31" and rows[1]["d"] == rows[2]["d"]
        assert rows[1]["tz"] == rows[2]["tz"] and rows[1]["iv"] == rows[2]["iv"] == "1 day 02:00:03"
    finally:
        env.sql(f'ALTER DATABASE "{db}" RESET ALL')


def test_a_table_with_inheritance_children_holds_only_its_own_rows(env: Env) -> None:
    """A plain SELECT of a table with children (``INHERITS``, the partitioning before PostgreSQL 10)
    returns the children's rows too, while the WAL attributes their changes to the children: the
    snapshot copied a child's rows into the parent, where its updates never reached them, and verify
    (reading the same way) counted them as the parent's. Both read ``ONLY`` the table now."""
    env.sql("CREATE TABLE public.par (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.kid (extra int) INHERITS (public.par)")
    env.sql("ALTER TABLE public.kid ADD PRIMARY KEY (id)")
    env.sql("INSERT INTO public.par VALUES (1, 'p1')")
    env.sql("INSERT INTO public.kid VALUES (2, 'k2', 7)")
    env.capture()
    env.resync(["public.par", "public.kid"])
    env.sql("INSERT INTO public.par VALUES (3, 'p3')")
    env.sql("INSERT INTO public.kid VALUES (4, 'k4', 8)")
    env.sql("UPDATE public.par SET v = v || '!'")  # the kids' rows too, as changes of kid
    env.run_all()
    got = {r.table: r for r in env.assert_reconciled()}
    assert (got["public.par"].source_rows, got["public.kid"].source_rows) == (2, 2)
    assert sorted((r["id"], r["v"]) for r in env.current("public.par").collect()) == [(1, "p1!"), (3, "p3!")]
    assert sorted((r["id"], r["v"]) for r in env.current("public.kid").collect()) == [(2, "k2!"), (4, "k4!")]
