"""Resyncs built in bulk: the snapshot's rows overwrite the current table once, then the changes
after them are merged; a kill between the two commits re-runs to the same end."""

from __future__ import annotations

import signal

from loader.capture import slot as slots
from loader.capture.capture import snapshot
from loader.lake.tables import SUMMARY_MERGED_THROUGH, SourceTable
from loader.lsn import ChangePosition
from tests.harness import Env, run_killed

BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"


def _methods(merge: object) -> dict[str, str]:
    return {t.table: t.method for t in merge.tables}  # type: ignore[attr-defined]


def _engines(merge: object) -> dict[str, str]:
    return {t.table: t.bulk_engine for t in merge.tables if t.bulk_engine}  # type: ignore[attr-defined]


def _merged_through(env: Env, table: str) -> ChangePosition:
    from loader.lake.iceberg import watermark

    ident = env.names.current(SourceTable(*table.split(".")))
    token = watermark(env.spark, ident, SUMMARY_MERGED_THROUGH)
    assert token is not None
    return ChangePosition.from_token(token)


def test_resync_replaces_rows_the_snapshot_no_longer_has(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, body text, n int)")
    env.sql("CREATE TABLE public.u (id int PRIMARY KEY, v text)")
    env.sql(f"INSERT INTO public.t SELECT g, {BIG}, 0 FROM generate_series(1, 60) g")
    env.sql("INSERT INTO public.u SELECT g, 'v' FROM generate_series(1, 40) g")
    snapshot(env.settings).run()  # the slot and the initial snapshot ('loader capture --snapshot')
    env.sql("INSERT INTO public.u VALUES (41, 'v')")
    _, _, merge = env.run_all()
    # The first current states: created and written once, then the changes after the snapshot.
    assert _methods(merge) == {"public.t": "bulk", "public.u": "bulk+driver"}, merge.summary()
    assert _engines(merge) == {"public.t": "driver", "public.u": "driver"}
    env.assert_reconciled()
    # Rows vanish where no slot sees it: only the resync can tell the current table.
    with slots.connect(env.settings.source.dsn) as conn:
        slots.drop_slot(conn, env.settings.source.slot)
    env.sql("DELETE FROM public.t WHERE id > 3")  # every bucket but those of keys 1-3 left empty
    env.sql("DELETE FROM public.u WHERE id % 2 = 0")
    env.resync(recover=True)
    # Changes after the snapshot, in the same increment: an insert, a delete, an update that leaves
    # the TOASTed body out (its value is the one the bulk commit wrote).
    env.sql(f"INSERT INTO public.t VALUES (100, {BIG}, 1)")
    env.sql("DELETE FROM public.t WHERE id = 2")
    env.sql("UPDATE public.t SET n = 5 WHERE id = 1")
    env.sql("INSERT INTO public.u VALUES (100, 'after')")  # plain: merged on the driver
    _, _, merge = env.run_all()
    assert env.history("public.t").where("size(pg_absent_columns) > 0").count() >= 1
    methods = _methods(merge)
    assert methods == {"public.t": "bulk+merge", "public.u": "bulk+driver"}, merge.summary()
    assert "by bulk" in merge.summary()
    env.assert_reconciled()
    assert sorted(r[0] for r in env.current("public.t").select("id").collect()) == [1, 3, 100]
    # Again with the changes after the snapshot merged by Spark's MERGE.
    env.configure("merge", driver_max_rows=0)
    env.sql("INSERT INTO public.t SELECT g, 'x', 0 FROM generate_series(200, 230) g")
    env.capture()
    env.sql("DELETE FROM public.t WHERE id BETWEEN 200 AND 210")
    env.resync(["public.t"])
    env.sql("UPDATE public.t SET n = 7 WHERE id = 100")
    env.sql("DELETE FROM public.t WHERE id = 220")
    _, _, merge = env.run_all()
    assert _methods(merge)["public.t"] == "bulk+merge", merge.summary()
    assert _engines(merge)["public.t"] == "spark"  # merge.driver_max_rows = 0: no driver bulk either
    env.assert_reconciled()
    assert env.current("public.t").count() == 3 + 19
    # A later plain increment is merged as usual.
    env.sql("UPDATE public.t SET n = 9 WHERE id = 3")
    _, _, merge = env.run_all()
    assert _methods(merge)["public.t"] == "merge", merge.summary()
    env.assert_reconciled()


def test_kill_between_the_bulk_commit_and_the_changes_after_it(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, body text, n int)")
    env.sql("CREATE TABLE public.quiet (id int PRIMARY KEY)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 'b' || g, 0 FROM generate_series(1, 50) g")
    env.sql("INSERT INTO public.quiet VALUES (1)")
    env.run_all()
    env.sql("DELETE FROM public.t WHERE id > 40")
    env.resync(["public.t"])
    env.sql("UPDATE public.t SET n = 1 WHERE id <= 5")
    env.sql("DELETE FROM public.t WHERE id = 6")
    env.sql("INSERT INTO public.t VALUES (99, 'new', 2)")
    env.capture()
    env.load()
    before = _merged_through(env, "public.t")
    # Killed with the bulk's files written but not committed: nothing changed.
    rc, out = run_killed(env, "merge", "merge-before-bulk")
    assert rc == -signal.SIGKILL, f"merge-before-bulk was not reached (exit {rc}):\n{out}"
    assert _merged_through(env, "public.t") == before
    assert env.current("public.t").count() == 50
    rc, out = run_killed(env, "merge", "merge-after-bulk")
    assert rc == -signal.SIGKILL, f"merge-after-bulk was not reached (exit {rc}):\n{out}"
    # The bulk commit stands alone: the table equals the source as of the snapshot.
    mid = _merged_through(env, "public.t")
    assert before < mid
    assert env.current("public.t").count() == 40
    assert env.current("public.t").where("n <> 0").count() == 0
    merge = env.merge()
    assert _methods(merge)["public.t"] == "driver", merge.summary()
    assert _merged_through(env, "public.t") > mid
    env.assert_reconciled()
    # And once more, killed again, with the Spark MERGE doing the re-run (a TOASTed value unsent).
    env.sql(f"UPDATE public.t SET body = {BIG} WHERE id = 1")
    env.sql("DELETE FROM public.t WHERE id > 30")
    env.resync(["public.t"])
    env.sql("UPDATE public.t SET n = 3 WHERE id = 1")
    env.capture()
    env.load()
    rc, out = run_killed(env, "merge", "merge-after-bulk")
    assert rc == -signal.SIGKILL, out
    env.configure("merge", driver_max_rows=0)
    merge = env.merge()
    assert _methods(merge)["public.t"] == "merge", merge.summary()
    env.assert_reconciled()
