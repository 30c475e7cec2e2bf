"""The source-side filter: what leaves PostgreSQL is bounded by source.include/exclude and by the
role's SELECT right, for wal2json (add-tables / filter-tables) and pgoutput (a FOR TABLE publication)."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loader.capture.capture import Capture
from loader.capture.source_filter import SourceRelation, escape_name, glob_patterns, plan_source, render
from loader.config import LoaderSettings
from tests.capture.conftest import Src, cli

MARK = "zz-secret-marker-7f3a"


def landing_bytes(src: Src) -> bytes:
    """Every landing file's content as text: v1 files decompressed, v2 files (Arrow, zstd: snapshot
    chunks and change files) as the v1 lines of their records, so a value in any is found."""
    from loader.landing.store import LocalLandingStore

    root = Path(src.settings.landing.url.removeprefix("file://")) / src.settings.source.slot
    v1 = b"".join(gzip.decompress(p.read_bytes()) for p in sorted(root.glob("*.gz")))
    store = LocalLandingStore(root)
    v2 = "\n".join(line for p in sorted(root.glob("*.arrow*")) for line in store.read_lines(p.name))
    return v1 + v2.encode("utf-8")


def cols(rec: Any) -> dict[str, str | None]:
    return {c.name: c.value for c in rec.columns}


def with_source(settings: LoaderSettings, **update: Any) -> LoaderSettings:
    return settings.model_copy(update={"source": settings.source.model_copy(update=update)})


@pytest.fixture
def role(src: Src) -> Iterator[tuple[str, LoaderSettings]]:
    """A REPLICATION role of its own; settings that connect as it (trust auth)."""
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    src.sql(f"CREATE ROLE {name} LOGIN REPLICATION")
    dsn = src.settings.source.dsn.replace("postgres@", f"{name}@", 1)
    try:
        yield name, with_source(src.settings, dsn=dsn)
    finally:
        src.sql(f"DROP OWNED BY {name}")
        with psycopg.connect(src.settings.source.dsn, autocommit=True) as c:
            for pid in c.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s", (name,)).fetchall():
                c.execute("SELECT pg_terminate_backend(%s)", pid)
        src.sql(f"DROP ROLE {name}")


# --- pure: the option syntax ----------------------------------------------------------------------


def test_names_are_escaped_and_globs_widen_to_whole_part_wildcards() -> None:
    assert escape_name("a b,c.d*e'f\\g") == "a\\ b\\,c\\.d\\*e\\'f\\\\g"
    assert render([(None, None), ("public", None), (None, "x.y")]) == "*.*,public.*,*.x\\.y"
    assert glob_patterns("public.*") == ([("public", None)], True)
    assert glob_patterns("*.orders") == ([(None, "orders")], True)
    assert glob_patterns("public.tmp_*") == ([("public", None)], False)
    assert glob_patterns("a.b.c") == ([("a", "b.c"), ("a.b", "c")], True)
    rels = [
        SourceRelation("public", "keep_1", "public.keep_1", True),
        SourceRelation("public", "keep_2", "public.keep_2", False),
        SourceRelation("public", "other", "public.other", True),
        SourceRelation("s", "p_2024", "public.keep_p", True),  # a partition of a wanted root
    ]
    plan = plan_source(rels, lambda t: t.startswith("public.keep"), ["public.keep*"], ["pg_catalog.*"], "cdc")
    assert plan.add_tables == [("public", None), ("s", None)]
    assert plan.filter_tables == [("pg_catalog", None), ("public", "keep_2"), ("public", "other")]
    assert plan.skipped == {"public.keep_2": "skipped: role cdc lacks SELECT"}


# --- wal2json, on the real server -------------------------------------------------------------------


def test_a_table_the_role_may_not_select_never_lands_and_status_names_it(
    src: Src, role: tuple[str, LoaderSettings]
) -> None:
    name, settings = role
    src.sql("CREATE TABLE orders (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE secret_tokens (id int PRIMARY KEY, token text)")
    src.sql(f"GRANT SELECT ON orders TO {name}")
    first = cli(settings, src.tmp, "capture")
    assert first.exit_code == 0, first.output
    src.sql("INSERT INTO orders VALUES (1, 'visible')")
    src.sql("INSERT INTO secret_tokens VALUES (1, %s)", (MARK,))
    src.sql("UPDATE secret_tokens SET token = %s || '2'", (MARK,))
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert "captured 1 changes" in res.output, res.output
    assert f"skipped: role {name} lacks SELECT: public.secret_tokens" in res.output, res.output
    raw = landing_bytes(src)
    assert b"visible" in raw and MARK.encode() not in raw and b"secret_tokens" not in raw
    # The server was told: filter-tables names it on the slot read.
    cap = Capture(settings)
    cap.run()
    assert "filter-tables" in cap.options
    assert "public.secret_tokens" in cap.options[cap.options.index("filter-tables") + 1].split(",")
    st = cli(settings, src.tmp, "status")
    assert st.exit_code == 0, st.output
    assert "skipped source tables (1)" in st.output and "public.secret_tokens" in st.output, st.output
    assert f"role {name} lacks SELECT" in st.output
    # Granted later: the table is captured from then on (resynced, as a table included again).
    src.sql(f"GRANT SELECT ON secret_tokens TO {name}")
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0 and "resynced: public.secret_tokens" in res.output, res.output
    assert "skipped source tables" not in cli(settings, src.tmp, "status").output


def test_a_table_row_level_security_filters_for_the_role_is_skipped_not_half_read(
    src: Src, role: tuple[str, LoaderSettings]
) -> None:
    """Decoding ignores row-level security; a SELECT by a role the policies filter returns fewer
    rows, silently: a snapshot would land part of the table, and verify (reading the same way)
    would agree. PostgreSQL's rule (row_security_active) decides: such a table is skipped with the
    reason, like one the role may not SELECT, and every source session runs with row_security =
    off, so a read the policies would filter fails instead of returning less."""
    name, settings = role
    src.sql("CREATE TABLE orders (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE tenant_rows (id int PRIMARY KEY, tenant text, v text)")
    src.sql("INSERT INTO tenant_rows VALUES (1, 'a', 'one'), (2, 'b', 'two')")
    src.sql("ALTER TABLE tenant_rows ENABLE ROW LEVEL SECURITY")
    src.sql("CREATE POLICY only_a ON tenant_rows USING (tenant = 'a')")
    src.sql(f"GRANT SELECT ON orders, tenant_rows TO {name}")
    first = cli(settings, src.tmp, "capture", "--snapshot")
    assert first.exit_code == 0, first.output
    why = f"skipped: row-level security hides rows from role {name}"
    assert why in first.output and "public.tenant_rows" in first.output, first.output
    src.sql("INSERT INTO tenant_rows VALUES (3, 'b', %s)", (MARK,))
    src.sql("INSERT INTO orders VALUES (1, 'visible')")
    res = Capture(settings).run()
    assert res.skipped.get("public.tenant_rows", "").startswith(why), res.skipped
    assert res.tables == {"public.orders"} and MARK.encode() not in landing_bytes(src)
    with psycopg.connect(settings.source.dsn, options="-c row_security=off") as c, pytest.raises(psycopg.Error):
        c.execute("SELECT count(*) FROM tenant_rows")  # what a read would do: refused, not filtered
    # The role may read every row from now on: captured, resynced as a table included again.
    src.sql(f"ALTER ROLE {name} BYPASSRLS")
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0 and "resynced: public.tenant_rows" in res.output, res.output
    assert MARK.encode() in landing_bytes(src)


def test_excluded_tables_are_not_decoded_for_the_loader(src: Src) -> None:
    src.sql("CREATE TABLE keep_a (id int PRIMARY KEY)")
    src.sql("CREATE TABLE noise (id int PRIMARY KEY, v text)")
    src.sql("CREATE SCHEMA other")
    src.sql("CREATE TABLE other.t (id int PRIMARY KEY, v text)")
    settings = with_source(src.settings, include=["public.*"], exclude=["public.noise"])
    Capture(settings).run()
    # A second slot at the same point: what the server sends with capture's options, row by row.
    probe = f"{settings.source.slot}_probe"
    src.sql("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (probe,))
    src.sql("INSERT INTO keep_a VALUES (1)")
    src.sql("INSERT INTO noise VALUES (1, %s)", (MARK,))
    src.sql("INSERT INTO other.t VALUES (1, %s)", (MARK,))
    cap = Capture(settings)
    res = cap.run()
    assert res.changes == 1 and res.tables == {"public.keep_a"}
    placeholders = ", ".join(["%s"] * len(cap.options))
    rows = src.sql(
        f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {placeholders})", (probe, *cap.options)
    )
    sent = "\n".join(r[0] for r in rows)
    assert '"table":"keep_a"' in sent
    assert MARK not in sent and "noise" not in sent and '"schema":"other"' not in sent
    assert MARK.encode() not in landing_bytes(src)


def test_a_table_created_between_captures_is_captured_whole(src: Src, role: tuple[str, LoaderSettings]) -> None:
    """Created and written after one capture, before the next: nothing of it is lost to a list
    made before it existed; one the role may not read, created at the same time, never lands.
    The second capture reads pipelined (the fetcher's COPY), the third peeks."""
    name, settings = role
    src.sql(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {name}")
    src.sql("CREATE TABLE keep_old (id int PRIMARY KEY)")
    settings = with_source(settings, include=["public.keep_*"], exclude=[])
    Capture(settings).run()
    src.sql("CREATE TABLE keep_new (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE keep_hidden (id int PRIMARY KEY, v text)")
    src.sql(f"REVOKE SELECT ON keep_hidden FROM {name}")
    src.sql("INSERT INTO keep_new SELECT g, 'n' || g FROM generate_series(1, 5) g")
    src.sql("UPDATE keep_new SET v = 'u' WHERE id = 2")
    src.sql("DELETE FROM keep_new WHERE id = 3")
    src.sql("INSERT INTO keep_hidden VALUES (1, %s)", (MARK,))
    res = Capture(with_source(settings, pipeline_min_lag_mb=0)).run()
    src.sql("INSERT INTO keep_new VALUES (6, 'later')")
    Capture(settings).run()
    ops = [
        (r.op, cols(r).get("id") or {c.name: c.value for c in r.identity}.get("id")) for r in src.changes("keep_new")
    ]
    assert ops == [("I", "1"), ("I", "2"), ("I", "3"), ("I", "4"), ("I", "5"), ("U", "2"), ("D", "3"), ("I", "6")]
    assert not src.changes("keep_hidden") and MARK.encode() not in landing_bytes(src)
    assert res.skipped == {"public.keep_hidden": f"skipped: role {name} lacks SELECT"}


# --- pgoutput: the publication lists exactly the captured tables ----------------------------------


def published(src: Src, pub: str) -> set[str]:
    rows = src.sql(
        "SELECT n.nspname || '.' || c.relname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid"
        " JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        (pub,),
    )
    return {r[0] for r in rows}


def test_pgoutput_publication_lists_the_captured_tables_and_follows_the_configuration(
    src: Src, role: tuple[str, LoaderSettings]
) -> None:
    name, settings = role
    db = src.settings.source.dsn.rsplit("/", 1)[1]
    src.sql(f'GRANT CREATE ON DATABASE "{db}" TO {name}')
    for t in ("a", "b"):
        src.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        src.sql(f"ALTER TABLE {t} OWNER TO {name}")  # altering a publication's tables needs ownership
    src.sql("CREATE TABLE secret_tokens (id int PRIMARY KEY, token text)")  # no SELECT for the role
    pub = f"pub_{uuid.uuid4().hex[:8]}"
    settings = with_source(settings, plugin="pgoutput", publication=pub)
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert published(src, pub) == {"public.a", "public.b"}
    assert not src.sql("SELECT puballtables FROM pg_publication WHERE pubname = %s", (pub,))[0][0]
    src.sql("INSERT INTO a VALUES (1, 'x')")
    src.sql("INSERT INTO secret_tokens VALUES (1, %s)", (MARK,))
    res = cli(settings, src.tmp, "capture")
    assert res.exit_code == 0 and "captured 1 changes" in res.output, res.output
    assert "public.secret_tokens" in res.output and "lacks SELECT" in res.output
    # The configuration changes: b leaves the publication.
    narrowed = with_source(settings, exclude=["public.b"])
    assert cli(narrowed, src.tmp, "capture").exit_code == 0
    assert published(src, pub) == {"public.a"}
    # A table created and written between two captures: added to the publication, and resynced
    # because the changes made before it was added were never decoded.
    src.sql("CREATE TABLE c (id int PRIMARY KEY, v text)")
    src.sql(f"ALTER TABLE c OWNER TO {name}")
    src.sql("INSERT INTO c SELECT g, 'c' || g FROM generate_series(1, 3) g")
    res = cli(narrowed, src.tmp, "capture")
    assert res.exit_code == 0, res.output
    assert published(src, pub) == {"public.a", "public.c"}
    assert "resynced: public.c: added to publication" in res.output, res.output
    src.sql("INSERT INTO c VALUES (4, 'streamed')")
    assert cli(narrowed, src.tmp, "capture").exit_code == 0
    rows = {cols(r)["id"]: r.op for r in src.changes("c") if r.op in ("I", "U", "D", "R")}
    assert rows == {"1": "R", "2": "R", "3": "R", "4": "I"}, rows
    assert MARK.encode() not in landing_bytes(src)


def test_pgoutput_snapshots_only_what_it_follows_and_parks_a_table_that_stops_being_followed(src: Src) -> None:
    """A table pgoutput cannot publish (no replica identity: PostgreSQL's rule, a DEFERRABLE key
    is none) is neither captured nor snapshotted: a snapshot capture never follows would keep a
    history that stops at the snapshot, and the catalog watch would not see it renamed or dropped
    (make fuzz, seed 1729). A followed table that loses its identity is parked with the reason."""
    pub = f"pub_{uuid.uuid4().hex[:8]}"
    settings = with_source(src.settings, plugin="pgoutput", publication=pub)
    src.sql("CREATE TABLE keyed (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE deferred (id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text)")
    src.sql("INSERT INTO keyed VALUES (1, 'one')")
    src.sql("INSERT INTO deferred VALUES (1, %s)", (MARK,))
    res = cli(settings, src.tmp, "capture", "--snapshot")
    assert res.exit_code == 0, res.output
    assert "skipped: no replica identity" in res.output and "public.deferred" in res.output, res.output
    assert MARK.encode() not in landing_bytes(src) and b"one" in landing_bytes(src)
    assert published(src, pub) == {"public.keyed"}
    src.sql("ALTER TABLE keyed REPLICA IDENTITY NOTHING")
    out = Capture(settings).run()
    why = out.parked.get("public.keyed", "")
    assert why.startswith("skipped: no replica identity") and why.endswith("no longer captured"), out.parked
    assert published(src, pub) == set()
    asked = cli(settings, src.tmp, "resync", "--table", "public.deferred")
    assert asked.exit_code != 0 and "cannot snapshot public.deferred: skipped: no replica identity" in asked.output


def test_the_every_table_default_warns_once_per_slot(src: Src, caplog: pytest.LogCaptureFixture) -> None:
    src.sql("CREATE TABLE t (id int PRIMARY KEY)")
    with caplog.at_level("WARNING", logger="loader.capture"):
        first = src.capture()
        src.capture()
    notices = [r for r in caplog.records if "every current and future table" in r.getMessage()]
    assert len(notices) == 1 and any("every current and future table" in n for n in first.notes)
    with caplog.at_level("WARNING", logger="loader.capture"):
        Capture(with_source(src.settings, include=["public.*"], slot=src.settings.source.slot + "_b")).run()
    assert len([r for r in caplog.records if "every current and future table" in r.getMessage()]) == 1
