"""Incremental merge against real PostgreSQL changes: TOAST, key changes, truncate, replays, rebuild."""

from __future__ import annotations

from loader.lake.tables import SUMMARY_MERGED_THROUGH, SourceTable
from loader.lsn import ChangePosition
from loader.merge.current import CurrentMerge
from tests.harness import Env, assert_frames_equal, settings_env

# Random md5 text does not compress: 300 * 32 bytes is stored out of line (TOASTed).
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
BIG_JSON = "(SELECT jsonb_agg(md5(random()::text)) FROM generate_series(1, 300))"
BIG_ARRAY = "(SELECT array_agg(md5(random()::text)) FROM generate_series(1, 300))"


def _toast_table(env: Env) -> None:
    env.sql("CREATE TABLE public.docs (id int PRIMARY KEY, body text, meta jsonb, tags text[], blob bytea, n int)")


def test_unchanged_toast_survives_updates_and_key_changes(env: Env) -> None:
    _toast_table(env)
    env.capture()
    env.sql(f"INSERT INTO public.docs VALUES (1, {BIG}, {BIG_JSON}, {BIG_ARRAY}, decode({BIG}, 'escape'), 0)")
    env.sql(f"INSERT INTO public.docs VALUES (2, {BIG}, {BIG_JSON}, {BIG_ARRAY}, decode({BIG}, 'escape'), 0)")
    env.run_all()
    env.assert_reconciled()
    # Same increment: an update leaving TOAST unchanged, then a key change of that row, then a chain.
    env.sql("UPDATE public.docs SET n = 1 WHERE id = 1")
    env.sql("UPDATE public.docs SET id = 10 WHERE id = 1")
    env.sql("UPDATE public.docs SET id = 11, n = 2 WHERE id = 10")
    # Key change of a row only the current table knows (its values come from the current row).
    env.sql("UPDATE public.docs SET id = 20 WHERE id = 2")
    env.run_all()
    absent = env.history("public.docs").where("size(pg_absent_columns) > 0").count()
    assert absent >= 4, "the test must exercise omitted TOAST columns"
    env.assert_reconciled()
    # Next increment: key change again (value now only in the current table under key 11).
    env.sql("UPDATE public.docs SET id = 12 WHERE id = 11")
    env.run_all()
    env.assert_reconciled()


def test_key_changes_carry_unsent_toast_beside_dates_python_cannot_hold(env: Env) -> None:
    """The TOAST replay of key changes collects rows into Python: +/-infinity, BC dates and years past
    9999 (kept as the storage types' limits) must travel through it exactly, as keys and as values."""
    env.sql(
        "CREATE TABLE public.spans (id int, since timestamp, PRIMARY KEY (id, since), body text,"
        " valid_to timestamptz, born date, n int)"
    )
    env.capture()
    env.sql(f"INSERT INTO public.spans VALUES (1, 'infinity', {BIG}, 'infinity', '0044-03-15 BC', 0)")
    env.sql(f"INSERT INTO public.spans VALUES (2, '-infinity', {BIG}, '-infinity', '12345-01-01', 0)")
    env.sql(f"INSERT INTO public.spans VALUES (3, '2020-01-01', {BIG}, '2020-01-01 10:00+00', 'infinity', 0)")
    env.run_all()
    env.assert_reconciled()
    # Key changes leaving the TOASTed body unsent: from the increment, then from the current table.
    env.sql("UPDATE public.spans SET n = 1 WHERE id = 1")
    env.sql("UPDATE public.spans SET id = 10 WHERE id = 1")
    env.sql("UPDATE public.spans SET id = 20, since = '-infinity' WHERE id = 3")
    env.run_all()
    assert env.history("public.spans").where("size(pg_absent_columns) > 0").count() >= 2
    env.assert_reconciled()
    env.sql("UPDATE public.spans SET id = 30 WHERE id = 2")
    env.run_all()
    env.assert_reconciled()


def test_delete_and_reinsert_never_carries_old_values(env: Env) -> None:
    _toast_table(env)
    env.capture()
    env.sql(f"INSERT INTO public.docs VALUES (1, {BIG}, NULL, NULL, NULL, 0)")
    env.sql(f"INSERT INTO public.docs VALUES (2, {BIG}, '{{}}', NULL, NULL, 0)")
    env.run_all()
    env.transaction(
        "DELETE FROM public.docs WHERE id = 1",
        "UPDATE public.docs SET id = 1 WHERE id = 2",  # key change onto a key deleted in this increment
        "UPDATE public.docs SET n = 5 WHERE id = 1",
    )
    env.run_all()
    env.assert_reconciled()


def test_truncate_empties_current_and_keyless_tables_keep_history_only(env: Env) -> None:
    # The merge's own TRUNCATE handling, without the resync capture adds after table rewrites.
    env.settings = env.settings.model_copy(
        update={"source": env.settings.source.model_copy(update={"resync_on_table_rewrite": False})}
    )
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.nokey (a int, b text)")
    env.sql("ALTER TABLE public.nokey REPLICA IDENTITY FULL")
    env.sql("CREATE TABLE public.quiet (id int PRIMARY KEY)")
    env.capture()
    env.sql("INSERT INTO public.quiet VALUES (1)")
    env.sql("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    env.sql("INSERT INTO public.nokey VALUES (1, 'x'), (1, 'x')")
    env.sql("DELETE FROM public.nokey WHERE a = 1")
    _, _, merge = env.run_all()
    assert env.history("public.nokey").count() == 4
    assert {t.table: t.skipped_reason for t in merge.tables}["public.nokey"] == "no primary key: history only"
    from loader.status import collect_status

    st = collect_status(env.settings)
    assert "history only" in {t.table: t.note for t in st.tables}["public.nokey"]
    env.transaction(
        "INSERT INTO public.t VALUES (21, 'x')", "TRUNCATE public.t", "INSERT INTO public.t VALUES (5, 'after')"
    )
    env.sql("INSERT INTO public.t VALUES (6, 'later')")
    _, _, merge = env.run_all()
    assert "truncated at" in {t.table: t.note for t in merge.tables}["public.t"]
    ops = [r[0] for r in env.history("public.t").orderBy("pg_lsn", "pg_seq").select("pg_operation").collect()]
    assert ops.count("truncate") == 1
    env.assert_reconciled(["public.t"])
    assert sorted(r[0] for r in env.current("public.t").select("id").collect()) == [5, 6]
    # Truncate as the very last change of an increment.
    env.sql("TRUNCATE public.t")
    env.run_all()
    env.assert_reconciled(["public.t"])
    assert env.current("public.t").count() == 0
    # A table without changes costs nothing (no commit), yet status shows it at the same position as
    # the others: it has nothing to merge up to loaded-through, so every table agrees on one LSN.
    st = collect_status(env.settings)
    merged = {t.table: t.merged for t in st.tables}
    assert merged["public.quiet"] == merged["public.t"] == st.loaded == st.consistent


def test_merge_is_idempotent_and_monotone_under_replays(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v int)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 0 FROM generate_series(1, 10) g")
    env.run_all()
    first = _merged(env, "public.t")
    env.sql("UPDATE public.t SET v = v + 1 WHERE id <= 5")
    env.sql("DELETE FROM public.t WHERE id = 9")
    env.run_all()
    second = _merged(env, "public.t")
    assert second > first
    state = env.current("public.t").collect()
    # Replay the older increment's MERGE (as a late or repeated merge would): the LSN guard
    # keeps every row where it is.
    from loader.merge.sql import key_events_sql, merge_sql, reduce_sql

    types, cols = {"id": "integer", "v": "integer"}, ["id", "v"]
    env.history("public.t").where(f"pg_lsn <= {first.commit_lsn}").createOrReplaceTempView("replay_inc")
    env.spark.sql(key_events_sql("replay_inc", ["id"], types, cols)).createOrReplaceTempView("replay_events")
    env.spark.sql(reduce_sql("replay_events", ["id"], cols)).createOrReplaceTempView("replay_reduced")
    watermark = (second.commit_lsn, second.seq)  # what CurrentMerge passes: the table's merged-through
    env.spark.sql(
        merge_sql(env.names.current(SourceTable("public", "t")), "replay_reduced", ["id"], cols, insert_after=watermark)
    )
    assert_frames_equal(env.current("public.t"), state)
    merge = CurrentMerge(env.spark, env.settings)
    merge.merge_table(SourceTable("public", "t"), first.token())
    assert_frames_equal(env.current("public.t"), state)
    assert _merged(env, "public.t") == second, "the watermark moved backwards"
    # Merging twice commits nothing the second time.
    snaps = env.spark.sql(f"SELECT count(*) FROM {env.names.current(SourceTable('public', 't'))}.snapshots").first()[0]
    env.merge()
    assert (
        env.spark.sql(f"SELECT count(*) FROM {env.names.current(SourceTable('public', 't'))}.snapshots").first()[0]
        == snaps
    )
    env.assert_reconciled()

    # Rebuild mode: recompute current from history as of the first increment's LSN, via the CLI.
    from click.testing import CliRunner

    from loader.cli import main
    from loader.lsn import format_lsn

    expected_then = sorted((k, 0) for k in range(1, 11))
    result = CliRunner().invoke(
        main,
        ["backfill", "rebuild-current", "--table", "public.t", "--upto-lsn", format_lsn(first.commit_lsn)],
        env=settings_env(env.settings),
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert sorted((r["id"], r["v"]) for r in env.current("public.t").collect()) == expected_then
    assert _merged(env, "public.t").commit_lsn == first.commit_lsn
    # The next merge moves forward from there; a full rebuild gives the source too.
    env.merge()
    env.assert_reconciled()
    merge.rebuild("public.t")
    env.assert_reconciled()


def _merged(env: Env, table: str) -> ChangePosition:
    from loader.lake.iceberg import latest_summary_value

    schema, _, name = table.partition(".")
    token = latest_summary_value(env.spark, env.names.current(SourceTable(schema, name)), SUMMARY_MERGED_THROUGH)
    assert token is not None
    return ChangePosition.from_token(token)


def test_merges_compact_their_current_table_and_keep_it_equal_to_the_source(env: Env) -> None:
    """Every merge.compact_every merges a table's merge rewrites its current table with the deletes
    applied (the files later merges read stop piling up); the rows stay the source's throughout."""
    from loader.lake.iceberg import iceberg_table
    from loader.spark import java_map

    env.configure("merge", compact_every=3)
    env.sql("CREATE TABLE public.hot (id int PRIMARY KEY, v text, n int)")
    env.capture()
    env.sql("INSERT INTO public.hot SELECT g, 'v' || g, 0 FROM generate_series(1, 300) g")
    env.run_all()
    cur = env.names.current(SourceTable("public", "hot"))

    def delete_files(snapshot: object) -> int:
        return int(java_map(env.spark, snapshot.summary())["total-delete-files"])  # type: ignore[attr-defined]

    compactions = 0
    for i in range(7):
        env.transaction(
            f"UPDATE public.hot SET n = n + 1 WHERE id % 7 = {i}",
            f"DELETE FROM public.hot WHERE id = {10 + i}",
            f"INSERT INTO public.hot VALUES ({1000 + i}, 'new', {i})",
        )
        merged = {t.table: t for t in env.run_all()[2].tables}["public.hot"]
        if "compacted" in merged.note:
            compactions += 1
            table = iceberg_table(env.spark, cur)
            rewrite = table.currentSnapshot()
            # A table this small is rewritten on the driver (an overwrite), else by Spark (a replace).
            assert "rewritten on the driver" in merged.note, merged.note
            assert rewrite.operation() == "overwrite", "the compaction is the table's last commit"
            merge_commit = table.snapshot(rewrite.parentId())
            assert delete_files(merge_commit) > 0, "a compaction must have had deletes to apply"
            assert delete_files(rewrite) == 0, "the compaction applies every delete"
        env.assert_reconciled()
    # The first compaction comes within compact_every merges (tables start at different offsets).
    assert compactions >= 2, compactions


def test_a_big_tables_compaction_combines_small_files_until_enough_rows_are_deleted(env: Env) -> None:
    """Below merge.compact_deleted_ratio of deleted rows, a compaction leaves the table's big data
    files alone: it combines the small files the merges wrote and rewrites the delete files into
    one per bucket, so its cost follows the changes, not the table; once the ratio is reached it
    rewrites every file with deletes. The rows stay the source's throughout."""
    # Above merge.driver_max_rows: compacted by Spark's procedures, not rewritten on the driver.
    env.configure("merge", compact_every=2, compact_deleted_ratio=0.1, driver_max_rows=1000)
    env.configure("maintenance", min_input_files=2)
    env.sql("CREATE TABLE public.big (id int PRIMARY KEY, v text, n int)")
    env.capture()
    # Values that do not compress: each bucket's first file well above the 1 MiB a small file is below.
    env.sql(
        "INSERT INTO public.big SELECT g, md5(g::text) || md5((g * 3)::text) || md5((g * 7)::text)"
        " || md5((g * 11)::text) || md5((g * 13)::text) || md5((g * 17)::text) || md5((g * 19)::text)"
        " || md5((g * 23)::text), 0 FROM generate_series(1, 60000) g"
    )
    env.run_all()
    cur = env.names.current(SourceTable("public", "big"))

    def files() -> tuple[set[str], set[str]]:
        rows = env.spark.sql(f"SELECT content, file_path FROM {cur}.files").collect()
        return {r.file_path for r in rows if r.content == 0}, {r.file_path for r in rows if r.content != 0}

    base, _ = files()
    buckets = env.settings.merge.key_buckets
    small_compactions = 0
    for i in range(6):
        env.transaction(
            f"UPDATE public.big SET n = n + 1 WHERE id % 10000 = {i}",
            f"INSERT INTO public.big VALUES ({100_000 + i}, 'new', {i})",
        )
        merged = {t.table: t for t in env.run_all()[2].tables}["public.big"]
        data, deletes = files()
        if "compacted (small data files)" in merged.note:
            small_compactions += 1
            assert base <= data, "the big files stay"
            assert len(data - base) <= buckets, "the merges' small files are combined, at most one per bucket"
            assert len(deletes) <= buckets, "one delete file per bucket at most"
        else:
            assert "compacted" not in merged.note, merged.note
        env.assert_reconciled()
    assert small_compactions >= 2, small_compactions
    env.configure("merge", compact_every=2, compact_deleted_ratio=0.0001, driver_max_rows=1000)
    for i in range(2):
        env.transaction(f"UPDATE public.big SET n = n + 1 WHERE id % 10000 = {10 + i}")
        merged = {t.table: t for t in env.run_all()[2].tables}["public.big"]
        env.assert_reconciled()
        if "compacted (all data files with deletes)" in merged.note:
            break
    else:
        raise AssertionError("no full compaction once the ratio was reached")
    assert not files()[1], "every file with deletes rewritten, the deletes applied"
