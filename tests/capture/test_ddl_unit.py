"""DDL in the stream, pure parts: the messages both decoders recognise at their transaction's commit,
what each message means for its tables (``ddl.plan_message``), and the catalog watch with the
trigger in place (``plan_watch(ddl_in_stream=True)``)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from typing import Any

from loader.capture import ddl
from loader.capture.pgoutput import PgOutputDecoder
from loader.capture.wal2json import Wal2JsonDecoder
from loader.capture.watch import Column, TableFacts, plan_watch, retype_in_place
from loader.lsn import parse_lsn

BEGIN = '{"action":"B","xid":9,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/2000000","nextlsn":"0/2000100"}'
COMMIT = '{"action":"C","xid":9,"timestamp":"2026-11-22 13:44:44.482879+00","lsn":"0/2000000","nextlsn":"0/2000100"}'


def picture(
    oid: int = 100, name: str = "t", persistence: str = "p", root: str | None = None, **cols: Any
) -> dict[str, Any]:
    """One table as the trigger's function sends it (watch.FACTS_FIELDS)."""
    columns = [[1, "id", "integer", False, None]] + [
        [i + 2, c[0], c[1], c[2], c[3] if len(c) > 3 else None] for i, c in enumerate(cols.values())
    ]
    return {
        "nspname": "public",
        "relname": name,
        "oid": oid,
        "relfilenode": oid,
        "persistence": persistence,
        "replident": "d",
        "primary_key": ["id"],
        "identity_columns": [],
        "columns": columns,
        "relkind": "r",
        "is_partition": root is not None,
        "root": root,
        "identity_ok": True,
    }


def message(tag: str, *tables: dict[str, Any], event: str = "ddl_command_end", **extra: Any) -> ddl.Message:
    return ddl.Message(0x2000050, {"v": 1, "event": event, "tag": tag, "tables": list(tables), **extra})


def plan(msgs: list[ddl.Message], known: dict[int, TableFacts] | None = None) -> dict[str, str]:
    known = {} if known is None else known
    out: dict[str, str] = {}
    for m in msgs:
        out.update(ddl.plan_message(m, known, lambda t, root, oid: root or t).resync)
    return out


def test_both_decoders_hand_over_ddl_messages_at_their_commit() -> None:
    body = json.dumps({"v": 1, "event": "ddl_command_end", "tag": "ALTER TABLE", "tables": []})
    inside = json.dumps(
        {"action": "M", "lsn": "0/2000050", "transactional": True, "prefix": ddl.PREFIX, "content": body}
    )
    d = Wal2JsonDecoder()
    list(d.feed(BEGIN))
    list(d.feed(inside))
    assert d.ddl == []  # not before its transaction commits
    list(d.feed(COMMIT))
    assert [(m.lsn, m.commit_lsn, m.doc["tag"]) for m in d.ddl] == [
        (parse_lsn("0/2000050"), parse_lsn("0/2000000"), "ALTER TABLE")
    ]
    assert d.messages_skipped == 0
    p = PgOutputDecoder(lambda oid, mod: "integer")
    list(p.feed(b"B" + struct.pack(">QqI", 0x2000000, 0, 9), 0x2000000))
    raw = body.encode()
    msg = b"M" + struct.pack(">bQ", 1, 0x2000050) + ddl.PREFIX.encode() + b"\0" + struct.pack(">i", len(raw)) + raw
    list(p.feed(msg, 0x2000050))
    assert p.ddl == []
    list(p.feed(b"C" + struct.pack(">bQQq", 0, 0x2000000, 0x2000100, 0), 0x2000100))
    assert [(m.lsn, m.commit_lsn, m.doc["tag"]) for m in p.ddl] == [(0x2000050, 0x2000000, "ALTER TABLE")]


def test_an_unreadable_ddl_message_counts_as_the_trigger_failing() -> None:
    assert ddl.parse("other.prefix", "{}", 1) is None
    assert ddl.parse(ddl.PREFIX, "not json", 1).error  # type: ignore[union-attr]
    assert ddl.parse(ddl.PREFIX, '{"v":1,"error":"boom"}', 1).error == "boom"  # type: ignore[union-attr]


def test_what_each_ddl_means_for_a_table_created_since_the_last_capture() -> None:
    create = message("CREATE TABLE", picture(n=("n", "numeric(10,2)", False)))
    # numeric(10,2) -> numeric: no rewrite, and the lake cannot apply it in place
    retyped = message("ALTER TABLE", picture(n=("n", "numeric", False)))
    assert "numeric(10,2) to numeric" in plan([create, retyped])["public.t"]
    # a fast default over the rows that existed, then nothing more for a plain ADD COLUMN
    filled = message("ALTER TABLE", picture(n=("n", "numeric(10,2)", False), d=("d", "text", True)))
    assert "d was added with a default" in plan([create, filled])["public.t"]
    plain = message("ALTER TABLE", picture(n=("n", "numeric(10,2)", False), d=("d", "text", False)))
    assert plan([create, plain]) == {}
    # a widening the lake takes in place; a rename
    assert plan([create, message("ALTER TABLE", picture(n=("n", "numeric(12,2)", False)))]) == {}
    assert (
        "n was renamed to m"
        in plan([create, message("ALTER TABLE", picture(n=("m", "numeric(10,2)", False)))])["public.t"]
    )
    # table_rewrite: SET LOGGED (its picture is from before: still unlogged), a volatile default, a retype
    logged = message("ALTER TABLE", picture(persistence="u"), event="table_rewrite", rewrite_reason=1)
    assert "SET LOGGED" in plan([logged])["public.t"]
    unlogged = message("ALTER TABLE", picture(persistence="p"), event="table_rewrite", rewrite_reason=1)
    assert plan([unlogged]) == {}
    assert (
        "volatile default"
        in plan([message("ALTER TABLE", picture(), event="table_rewrite", rewrite_reason=2)])["public.t"]
    )
    assert "rewritten" in plan([message("ALTER TABLE", picture(), event="table_rewrite", rewrite_reason=4)])["public.t"]
    assert plan([message("ALTER TABLE", picture(), event="table_rewrite", rewrite_reason=8)]) == {}  # access method
    # a partition's DDL resyncs the table its changes land as
    assert set(
        plan([message("ALTER TABLE", picture(root="public.parent"), event="table_rewrite", rewrite_reason=4)])
    ) == {"public.parent"}


def test_type_level_ddl_compares_each_table_with_its_last_picture() -> None:
    mood = {"enum": {"1": "sad", "2": "ok"}}
    create = message("CREATE TABLE", picture(m=("m", "mood[]", False, mood)))
    renamed = message("ALTER TYPE", picture(m=("m", "mood[]", False, {"enum": {"1": "blue", "2": "ok"}})))
    added = message("ALTER TYPE", picture(m=("m", "mood[]", False, {"enum": {"1": "sad", "2": "ok", "3": "meh"}})))
    assert "'sad' -> 'blue'" in plan([create, renamed])["public.t"]
    assert plan([create, added]) == {}
    # No earlier picture at all (created before the trigger existed, never seen): resynced to be safe.
    assert "type level" in plan([added])["public.t"]


def test_a_retype_without_a_rewrite_that_the_lake_cannot_take_in_place() -> None:
    assert retype_in_place("numeric(10,2)", "numeric(14,2)") and retype_in_place("character varying(5)", "text")
    assert retype_in_place("integer", "bigint") and retype_in_place("real", "double precision")
    assert not retype_in_place("numeric(10,2)", "numeric") and not retype_in_place("numeric(10,2)", "numeric(12,3)")
    assert not retype_in_place("timestamp without time zone", "timestamp with time zone")
    before = TableFacts(
        1,
        1,
        "p",
        "default",
        ["id"],
        [],
        {"1": Column("id", "integer", False), "2": Column("n", "numeric(10,2)", False)},
    )
    now = replace(before, columns={**before.columns, "2": Column("n", "numeric", False)})
    p = plan_watch({"public.t": before}, {"public.t": now}, lambda t: True, lambda t: True)
    assert "numeric(10,2) to numeric" in p.resync["public.t"]


def test_with_ddl_in_the_stream_a_bare_rewrite_waits_for_the_stream_to_say_what_it_was() -> None:
    before = TableFacts(1, 1, "p", "default", ["id"], [], {"1": Column("id", "integer", False)})
    now = replace(before, relfilenode=77)
    fresh = TableFacts(2, 99, "p", "default", ["id"], [], {"1": Column("id", "integer", False)})
    without = plan_watch({"public.t": before}, {"public.t": now, "public.n": fresh}, lambda t: True, lambda t: True)
    assert set(without.resync) == {"public.t", "public.n"} and not without.deferred
    with_ddl = plan_watch(
        {"public.t": before}, {"public.t": now, "public.n": fresh}, lambda t: True, lambda t: True, ddl_in_stream=True
    )
    assert not with_ddl.resync and set(with_ddl.deferred) == {"public.t", "public.n"}


def test_the_install_sql_pins_its_search_path_and_catches_its_errors() -> None:
    sql = ddl.install_sql()
    assert "SET search_path = pg_catalog" in sql and "EXCEPTION WHEN OTHERS" in sql
    assert "pg_logical_emit_message(true, 'loader.ddl'" in sql
    assert "ON ddl_command_end" in sql and "ON table_rewrite" in sql and ddl.VERSION in sql


def test_a_table_gone_since_its_ddl_is_left_to_the_catalog_comparison_and_a_renamed_one_keeps_its_new_name() -> None:
    create = message("CREATE TABLE", picture(oid=7))
    filled = message("ALTER TABLE", picture(oid=7, d=("d", "text", True)))
    known: dict[int, TableFacts] = {}
    gone = [ddl.plan_message(m, known, lambda t, root, oid: None).resync for m in (create, filled)]
    assert gone == [{}, {}]
    renamed = ddl.plan_message(filled, {}, lambda t, root, oid: "public.renamed" if oid == 7 else None)
    assert set(renamed.resync) == {"public.renamed"}


def test_a_table_created_then_renamed_is_resynced_under_its_name_now() -> None:
    """Found by make fuzz (seed 28): no catalog picture has the table before its rename, and a rename
    changes no column: only the name in the message differs from the one before."""
    names: dict[int, str] = {}
    known: dict[int, TableFacts] = {}
    now = {7: "public.rn"}

    def landed_as(t: str, root: str | None, oid: int) -> str | None:
        return now.get(oid)

    created = ddl.plan_message(message("CREATE TABLE", picture(oid=7, name="t")), known, landed_as, names)
    assert created.resync == {}
    renamed = ddl.plan_message(message("ALTER TABLE", picture(oid=7, name="rn")), known, landed_as, names)
    assert "renamed from public.t" in renamed.resync["public.rn"]
    # Another ALTER under the same name is no rename; a table moved by SET SCHEMA is one.
    assert ddl.plan_message(message("ALTER TABLE", picture(oid=7, name="rn")), known, landed_as, names).resync == {}
    moved = message("ALTER TABLE", {**picture(oid=7, name="rn"), "nspname": "other"})
    now[7] = "other.rn"
    assert "renamed from public.rn" in ddl.plan_message(moved, known, landed_as, names).resync["other.rn"]


def test_a_table_created_under_a_name_another_table_had_is_resynced() -> None:
    """Found by make fuzz (seed 159): created, filled, dropped and created again between two captures.
    A DROP emits no message; the second CREATE under the name is the trace. A renamed-away table's
    name taken by a new table counts too; the first CREATE of a name, or one ALTERed, does not."""
    names: dict[int, str] = {}
    held: dict[str, int] = {}
    known: dict[int, TableFacts] = {}

    def plan(tag: str, oid: int, name: str) -> dict[str, str]:
        return ddl.plan_message(message(tag, picture(oid=oid, name=name)), known, lambda t, r, o: t, names, held).resync

    assert plan("CREATE TABLE", 7, "t") == {}
    assert plan("ALTER TABLE", 7, "t") == {}
    assert "created again" in plan("CREATE TABLE", 8, "t")["public.t"]  # 7 was dropped
    assert "renamed from public.t" in plan("ALTER TABLE", 8, "moved")["public.moved"]
    assert "created again" in plan("CREATE TABLE AS", 9, "t")["public.t"]  # 8 had it
    assert plan("CREATE TABLE", 10, "fresh") == {}
