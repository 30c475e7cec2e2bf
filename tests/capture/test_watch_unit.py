"""The catalog watch's decisions (pure ``plan_watch``) for what the WAL never shows."""

from __future__ import annotations

from dataclasses import replace

from loader.capture.watch import Column, TableFacts, WatchPlan, first_seen, plan_stream_table, plan_watch, type_change

MOOD = {"enum": {"16390": "sad", "16392": "ok"}}


def facts(oid: int = 100, filenode: int | None = None, pk: tuple[str, ...] = ("id",), **cols: Column) -> TableFacts:
    columns = {"1": Column("id", "integer", False), **{str(i + 2): c for i, c in enumerate(cols.values())}}
    return TableFacts(
        oid=oid,
        relfilenode=oid if filenode is None else filenode,
        persistence="p",
        replica_identity="default",
        primary_key=list(pk),
        identity_index_columns=[],
        columns=columns,
    )


def plan(before: dict[str, TableFacts], now: dict[str, TableFacts]) -> WatchPlan:
    return plan_watch(before, now, lambda t: True, lambda t: True)


def test_a_new_table_with_a_fast_default_or_a_rewrite_is_resynced_and_an_untouched_one_is_not() -> None:
    seen = {"public.old": facts(1)}
    now = {
        **seen,
        "public.filled": facts(2, b=Column("b", "text", True)),
        "public.rewritten": facts(3, filenode=999),
        "public.plain": facts(4, b=Column("b", "text", False)),
        "public.partitioned_empty": facts(5, filenode=0),
        "public.keyless_rewritten": facts(6, filenode=998, pk=()),
    }
    p = plan(seen, now)
    assert "b was added with a default" in p.resync["public.filled"]
    assert "rewritten" in p.resync["public.rewritten"]
    assert "rewritten" in p.resync["public.keyless_rewritten"]
    assert set(p.resync) == {"public.filled", "public.rewritten", "public.keyless_rewritten"}


def test_a_rewritten_table_keyed_or_not_is_resynced_by_the_catalog_alone_and_deferred_with_the_trigger() -> None:
    """A keyless table's history state is its rows: a rewrite may be SET LOGGED after changes the WAL
    never had (make fuzz seed 2). Only the DDL trigger tells that from a TRUNCATE or VACUUM FULL."""
    before = {"public.log": facts(1, pk=()), "public.k": facts(2)}
    now = {
        "public.log": replace(before["public.log"], relfilenode=50),
        "public.k": replace(before["public.k"], relfilenode=51),
    }
    p = plan(before, now)
    assert set(p.resync) == {"public.k", "public.log"}
    p = plan_watch(before, now, lambda t: True, lambda t: True, ddl_in_stream=True)
    assert not p.resync and set(p.deferred) == {"public.k", "public.log"}


def test_an_enum_value_renamed_resyncs_an_added_one_does_not() -> None:
    before = {"public.m": facts(1, m=Column("m", "mood", False, MOOD))}
    added = {"enum": {**MOOD["enum"], "16400": "meh"}}
    renamed = {"enum": {**MOOD["enum"], "16390": "blue"}}
    assert not plan(before, {"public.m": facts(1, m=Column("m", "mood", False, added))}).resync
    p = plan(before, {"public.m": facts(1, m=Column("m", "mood", False, renamed))})
    assert "'sad' -> 'blue'" in p.resync["public.m"]


def test_type_change_needs_both_pictures() -> None:
    assert type_change(None, MOOD) is None  # a picture saved by an older loader: nothing to compare
    assert type_change({"composite": [[1, "a", "integer"]]}, {"composite": [[1, "a", "integer"], [2, "b", "date"]]})
    assert type_change({"composite": [[1, "a", "integer"]]}, {"composite": [[1, "a", "integer"]]}) is None


def test_stream_names_the_catalog_cannot_explain() -> None:
    """Found by make fuzz (seed 28): a table created, filled and renamed between two runs; its changes
    carry the old name, which neither catalog picture has."""
    before = {"public.k": facts(1), "public.away": facts(2)}
    now = {
        "public.k": facts(1),
        "public.moved": facts(2),  # renamed from public.away: plan_watch's (by oid)
        "public.rn": facts(3),  # created since, maybe public.t renamed
        "public.new": facts(4, a=Column("a", "text", False)),  # created since
    }
    every = lambda t: True  # noqa: E731
    new = first_seen(before, now)
    assert new == {"public.rn", "public.new"}
    # Without the DDL trigger: parked, and every table first seen is resynced (it may be the one).
    p = plan_stream_table("public.t", [("id", "integer")], before, now, new, every)
    assert "renamed or dropped" in p.park["public.t"]
    assert set(p.resync) == {"public.rn", "public.new"}
    # With it, the rename's message resyncs the right table (ddl.plan_message): parked only.
    p = plan_stream_table("public.t", [("id", "integer")], before, now, new, every, ddl_in_stream=True)
    assert set(p.park) == {"public.t"} and not p.resync
    # A known table renamed away is plan_watch's; tables the catalog has are explained.
    for table in ("public.away", "public.k", "public.rn"):
        p = plan_stream_table(table, [("id", "integer")], before, now, new, every)
        assert not p.park and not p.resync, table
    # A table first seen whose change carries a column the catalog no longer has (renamed since).
    p = plan_stream_table("public.new", [("id", "integer"), ("b", "text")], before, now, new, every)
    assert "column b" in p.resync["public.new"] and not p.park
    assert not plan_stream_table(
        "public.new", [("id", "integer"), ("b", "text")], before, now, new, every, ddl_in_stream=True
    ).resync
    # A column retyped since in a way the lake cannot take in place (no rewrite: no other trace).
    now["public.num"] = facts(5, n=Column("n", "numeric", False))
    new.add("public.num")
    p = plan_stream_table("public.num", [("id", "integer"), ("n", "numeric(10,2)")], before, now, new, every)
    assert "numeric(10,2) to numeric" in p.resync["public.num"]
    now["public.wide"] = facts(6, n=Column("n", "bigint", False))
    new.add("public.wide")
    assert not plan_stream_table("public.wide", [("id", "integer"), ("n", "integer")], before, now, new, every).resync
    # ... but not a table seen before (plan_watch compares its pictures).
    assert not plan_stream_table("public.k", [("id", "integer"), ("b", "text")], before, now, new, every).resync


def test_a_first_change_older_than_the_table_under_its_name_resyncs_it() -> None:
    """Without the DDL trigger: a table created, filled, dropped and created again with the same
    columns between two runs leaves one trace, the first incarnation's changes in the stream from
    transactions older than the one that created the table under the name now (fuzz seed 159)."""
    from loader.capture.watch import xid_precedes

    before = {"public.k": facts(1)}
    now = {"public.k": facts(1), "public.t": replace(facts(2), created_xid=1000)}
    new = first_seen(before, now)
    every = lambda t: True  # noqa: E731
    assert (
        "older than the table"
        in plan_stream_table("public.t", [("id", "integer")], before, now, new, every, xid=999).resync["public.t"]
    )
    for xid in (1000, 1001, None):
        assert not plan_stream_table("public.t", [("id", "integer")], before, now, new, every, xid=xid).resync
    # A table seen before is plan_watch's (by oid); a picture without the xid (older loader) says nothing.
    now["public.k"] = replace(facts(1), created_xid=1000)
    assert not plan_stream_table("public.k", [("id", "integer")], before, now, new, every, xid=5).resync
    now["public.t"] = facts(2)
    assert not plan_stream_table("public.t", [("id", "integer")], before, now, new, every, xid=5).resync
    # Modulo 2^32, as PostgreSQL compares them: just before a wraparound precedes just after it.
    assert xid_precedes(2**32 - 10, 5) and not xid_precedes(5, 2**32 - 10)
    assert xid_precedes(3, 4) and not xid_precedes(4, 4)


def test_a_table_without_a_key_whose_identity_starts_carrying_deletes_is_resynced_once() -> None:
    """Deletes of a keyless table without a usable identity are not decoded: history's state keeps
    the deleted rows until a resync re-reads the table, which REPLICA IDENTITY FULL calls for."""
    nothing = replace(facts(pk=()), replica_identity="default")
    full = replace(nothing, replica_identity="full")
    got = plan({"public.t": nothing}, {"public.t": full})
    assert "history's state restarts" in got.resync["public.t"] and not got.park
    assert not plan({"public.t": full}, {"public.t": full}).resync  # once, not on every look
    # A keyed table regaining its identity keeps its own reason (its current table is rebuilt).
    keyed = replace(facts(), replica_identity="nothing")
    assert "again" in plan({"public.k": keyed}, {"public.k": facts()}).resync["public.k"]


def test_a_new_tables_type_changed_after_it_was_created_is_resynced_by_transaction_order() -> None:
    """plan_types_changed: the newest catalog row of a column's enum or composite type written by a
    transaction after the one that created the table (modulo 2^32, as PostgreSQL orders them) means
    stored values may read differently now; before or by the same transaction, frozen or unknown
    transaction ids: nothing to tell."""
    from loader.capture.watch import plan_types_changed

    new = {
        "public.a": replace(facts(1), created_xid=1000),
        "public.b": replace(facts(2), created_xid=1000),
        "public.w": replace(facts(3), created_xid=0xFFFFFF00),  # near the wraparound
        "public.u": replace(facts(4), created_xid=None),
    }
    rows = [
        (1, "m", "mood", 1001),  # renamed after the table was created
        (1, "p", "pair", 999),
        (2, "m", "mood", 1000),  # the same transaction
        (2, "ms", "mood[]", 2),  # frozen
        (3, "m", "mood", 5),  # after the wraparound: later
        (4, "m", "mood", 5000),
        (9, "m", "mood", 5000),  # not a new table
    ]
    got = plan_types_changed(rows, new)
    assert set(got) == {"public.a", "public.w"}, got
    assert "column m (mood)" in got["public.a"] and "pair" not in got["public.a"]
