"""DDL in the stream (loader.capture.ddl): the event trigger capture installs where the role may, its
messages acted on at their position in both plugins, and the catalog comparison where it may not.
Each test ends with the oracle (every current table equals its source table)."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest

from loader.capture import ddl
from tests.harness import Env, finish, loader_process


def triggers(env: Env) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in env.sql("SELECT evtname, evtenabled FROM pg_event_trigger ORDER BY evtname")]


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_ddl_in_the_stream_on_tables_created_since_the_last_capture(env: Env, plugin: str) -> None:
    """What the catalog comparison cannot see (no earlier picture of a table created between two
    runs; TRUNCATE and VACUUM FULL look like ALTER ... USING) the stream's DDL messages tell."""
    env.configure("source", plugin=plugin)
    env.sql("CREATE TABLE public.k (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.same (id int PRIMARY KEY, v text)")
    env.capture()  # the slot, and the trigger with it (the test role is a superuser)
    assert triggers(env) == [("loader_ddl_end", "A"), ("loader_ddl_rewrite", "A")]
    env.sql("INSERT INTO public.k SELECT g, 'k' || g FROM generate_series(1, 10) g")
    env.sql("INSERT INTO public.same SELECT g, 's' || g FROM generate_series(1, 10) g")
    env.run_all()
    env.assert_reconciled()
    # Created since the last capture, then changed outside the WAL:
    # numeric(10,2) -> numeric is no rewrite, and the lake cannot take it in place;
    env.sql("CREATE TABLE public.nn (id int PRIMARY KEY, n numeric(10,2))")
    env.sql("INSERT INTO public.nn SELECT g, g + 0.25 FROM generate_series(1, 5) g")
    env.sql("ALTER TABLE public.nn ALTER COLUMN n TYPE numeric")
    env.sql("INSERT INTO public.nn VALUES (6, 1e-20)")
    # rows written while unlogged were never in the WAL (a keyless table: history only);
    env.sql("CREATE TABLE public.un (a int, b text)")
    if plugin == "pgoutput":  # a publication leaves out a table without a replica identity
        env.sql("ALTER TABLE public.un REPLICA IDENTITY FULL")
    env.sql("ALTER TABLE public.un SET UNLOGGED")
    env.sql("INSERT INTO public.un SELECT g, 'u' FROM generate_series(1, 7) g")
    env.sql("ALTER TABLE public.un SET LOGGED")
    env.sql("INSERT INTO public.un VALUES (8, 'logged')")
    # a fast default over existing rows, then the column renamed;
    env.sql("CREATE TABLE public.fd (id int PRIMARY KEY)")
    env.sql("INSERT INTO public.fd SELECT g FROM generate_series(1, 4) g")
    env.sql("ALTER TABLE public.fd ADD COLUMN d text DEFAULT 'dflt'")
    # and a table created and left alone.
    env.sql("CREATE TABLE public.plain (id int PRIMARY KEY, v text)")
    env.sql("INSERT INTO public.plain VALUES (1, 'a')")
    # On tables seen before: TRUNCATE and VACUUM FULL change nothing the stream does not carry;
    # ALTER ... TYPE to the same type USING an expression changes every value.
    env.sql("TRUNCATE public.k")
    env.sql("INSERT INTO public.k VALUES (1, 'again')")
    env.sql("VACUUM FULL public.k")
    env.sql("ALTER TABLE public.same ALTER COLUMN v TYPE text USING upper(v)")
    cap, _, _ = env.run_all()
    if plugin == "wal2json":
        assert set(cap.resynced) == {"public.nn", "public.un", "public.fd", "public.same"}, cap.resynced
        assert "numeric(10,2) to numeric" in cap.resynced["public.nn"]
        assert "SET LOGGED" in cap.resynced["public.un"]
        assert "d was added with a default" in cap.resynced["public.fd"]
    else:
        # pgoutput withholds a table's changes until the publication lists it: every new table is
        # resynced when capture adds it, whatever its DDL.
        assert set(cap.resynced) == {"public.nn", "public.un", "public.fd", "public.plain", "public.same"}
    assert "rewritten" in cap.resynced["public.same"]
    assert any("public.k: rewritten without a rewriting ALTER" in n for n in cap.notes), cap.notes
    env.assert_reconciled()
    ops = [r["pg_operation"] for r in env.history("public.k").collect()]
    assert "read" not in ops and "truncate" in ops  # the stream's TRUNCATE, no copy of the table
    assert {r["v"] for r in env.current("public.same").collect()} == {f"S{g}" for g in range(1, 11)}
    # An enum label renamed on a table created since the last capture: named by the type-level message.
    env.sql("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    env.sql("CREATE TABLE public.moods (id int PRIMARY KEY, m mood[])")
    env.sql("INSERT INTO public.moods VALUES (1, '{sad,ok}')")
    env.sql("ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'")
    cap, _, _ = env.run_all()
    assert "public.moods" in cap.resynced, cap.resynced
    if plugin == "wal2json":
        assert "'sad' -> 'blue'" in cap.resynced["public.moods"], cap.resynced
    env.assert_reconciled()
    # 'loader slot drop' takes the trigger with it.
    rc, out = finish(loader_process(env, "slot", "drop", "--yes"))
    assert rc == 0, out
    assert triggers(env) == []


def test_a_role_that_may_not_install_the_trigger_keeps_the_catalog_comparison(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"cdc_{uuid.uuid4().hex[:8]}"
    admin_dsn = env.settings.source.dsn
    admin = psycopg.connect(admin_dsn, autocommit=True)
    admin.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
    admin.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    admin.execute(f"GRANT SELECT ON public.t TO {role}")
    env.configure("source", dsn=admin_dsn.replace("postgres@", f"{role}@", 1))
    try:
        with caplog.at_level(logging.WARNING, logger="loader.capture"):
            env.capture()
        assert admin.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
        said = [r.getMessage() for r in caplog.records if "DDL capture is off" in r.getMessage()]
        assert said and f"GRANT rds_superuser TO {role}" in said[0] and "loader slot ddl-trigger" in said[0]
        admin.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 5) g")
        env.run_all()
        admin.execute("ALTER TABLE public.t ADD COLUMN d int DEFAULT 7")  # the catalog comparison sees it
        cap, _, _ = env.run_all()
        assert "d was added with a default" in cap.resynced["public.t"], cap.resynced
        env.assert_reconciled()
        assert {r["d"] for r in env.current("public.t").collect()} == {7}
        # An administrator installs the trigger with what 'loader slot ddl-trigger' prints; the role
        # then uses it: from the next run on, a VACUUM FULL is told apart from an ALTER ... USING.
        rc, printed = finish(loader_process(env, "slot", "ddl-trigger"))
        assert rc == 0, printed
        admin.execute(printed)
        env.capture()
        admin.execute("VACUUM FULL public.t")
        cap, _, _ = env.run_all()
        assert "public.t" not in cap.resynced, cap.resynced
        admin.execute("ALTER TABLE public.t ALTER COLUMN v TYPE text USING v || '!'")
        cap, _, _ = env.run_all()
        assert "rewritten" in cap.resynced["public.t"], cap.resynced
        env.assert_reconciled()
    finally:
        env.close()
        env.configure("source", dsn=admin_dsn)
        for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s", (role,)).fetchall():
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()


def test_a_broken_trigger_never_stops_the_ddl_and_capture_falls_back(env: Env) -> None:
    """The trigger's function fails (a function it calls is shadowed by one that raises): the
    application's DDL still commits, the message says the trigger failed, and capture resyncs a
    rewrite as it does without the trigger."""
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 5) g")
    env.run_all()
    env.sql("CREATE SCHEMA broken")
    env.sql(
        "CREATE FUNCTION broken.cardinality(anyarray) RETURNS int LANGUAGE plpgsql"
        " AS $$BEGIN RAISE EXCEPTION 'broken on purpose'; END$$"
    )
    env.sql("ALTER FUNCTION loader.ddl_message() SET search_path = broken, pg_catalog")
    with psycopg.connect(env.settings.source.dsn, autocommit=True) as conn:
        warned: list[str] = []
        conn.add_notice_handler(lambda d: warned.append(d.message_primary or ""))
        conn.execute("ALTER TABLE public.t ALTER COLUMN v TYPE text USING upper(v)")
    assert any("DDL trigger failed" in w for w in warned), warned
    assert {r[0] for r in env.sql("SELECT v FROM public.t")} == {f"V{g}" for g in range(1, 6)}  # committed
    cap, _, _ = env.run_all()
    assert any("could not describe" in n for n in cap.notes), cap.notes
    assert "rewritten" in cap.resynced["public.t"], cap.resynced
    env.assert_reconciled()
    assert ddl.state(env.conn).token is not None  # left as found: capture does not replace it


def test_ddl_under_session_replication_role_replica_is_in_the_stream(env: Env) -> None:
    """A session with ``session_replication_role = replica`` (pg_restore --disable-triggers,
    migration tools that skip foreign-key triggers) fires only event triggers enabled ALWAYS or
    REPLICA. Its ``ALTER ... TYPE ... USING`` rewrites the table's values without a row change in the
    WAL; had the trigger not fired, the rewrite would look like a ``VACUUM FULL`` and nothing would
    be resynced. The trigger is installed ENABLE ALWAYS; one enabled only for ordinary sessions (a
    plain ``ALTER EVENT TRIGGER ... ENABLE``) is not trusted."""
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 5) g")
    env.run_all()
    assert triggers(env) == [("loader_ddl_end", "A"), ("loader_ddl_rewrite", "A")]
    replica = "SET LOCAL session_replication_role = replica"
    env.transaction(replica, "ALTER TABLE public.t ALTER COLUMN v TYPE text USING upper(v)")
    cap, _, _ = env.run_all()
    assert "public.t" in cap.resynced, cap.resynced
    env.assert_reconciled()
    # Enabled for ordinary sessions only: capture does not trust it (a rewrite is then resynced).
    env.sql("ALTER EVENT TRIGGER loader_ddl_rewrite ENABLE")
    env.transaction(replica, "ALTER TABLE public.t ALTER COLUMN v TYPE text USING lower(v)")
    cap, _, _ = env.run_all()
    assert triggers(env) == [("loader_ddl_end", "A"), ("loader_ddl_rewrite", "O")]
    assert "rewritten" in cap.resynced["public.t"], cap.resynced
    env.assert_reconciled()


def test_a_disabled_trigger_is_left_disabled_and_rewrites_are_resynced(env: Env) -> None:
    """ALTER EVENT TRIGGER ... DISABLE switches DDL capture off without a restart: capture does not
    enable it again, and compares catalogs only (a rewrite is resynced, as it cannot be told apart)."""
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 5) g")
    env.run_all()
    env.sql("ALTER EVENT TRIGGER loader_ddl_end DISABLE")
    env.sql("ALTER EVENT TRIGGER loader_ddl_rewrite DISABLE")
    env.sql("VACUUM FULL public.t")
    cap, _, _ = env.run_all()
    assert triggers(env) == [("loader_ddl_end", "D"), ("loader_ddl_rewrite", "D")]
    assert "rewritten" in cap.resynced["public.t"], cap.resynced
    env.assert_reconciled()
