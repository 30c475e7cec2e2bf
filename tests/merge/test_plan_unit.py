"""The merge's pure parts: SQL builders, the marker plan (resync / park / truncate), the TOAST replay."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader.lsn import ChangePosition
from loader.merge.plan import Marker, plan_compaction, plan_markers, replay_key_changes
from loader.merge.sql import full_recompute_sql, key_events_sql, merge_sql, reduce_sql

P = ChangePosition


def test_merge_sql_guards_positions_and_handles_boundaries() -> None:
    sql = merge_sql("cur", "src", ["id"], ["id", "v"])
    assert "s.pg_lsn > t.pg_lsn" in sql and "NOT MATCHED BY SOURCE" not in sql
    sql = merge_sql("cur", "src", ["id"], ["id", "v"], truncated_before=(10, 3))
    assert "WHEN NOT MATCHED BY SOURCE AND (t.pg_lsn < 10 OR (t.pg_lsn = 10 AND t.pg_seq < 3)) THEN DELETE" in sql


def test_sql_uses_reserved_aliases_so_source_columns_named_like_them_are_safe() -> None:
    cols = ["id", "_kind", "_sub", "__absent", "pg__pg_lsn"]  # lake names: pg_lsn is escaped
    events = key_events_sql("inc", ["id"], {"id": "integer"}, cols)
    assert "'delete' AS pg__kind" in events and "`_kind`" in events and "`pg__pg_lsn`" in events
    reduced = reduce_sql("ev", ["id"], cols)
    assert "pg__kind = 'delete' OR pg__from IS NOT NULL" in reduced and "PARTITION BY `id`, pg__seg" in reduced
    assert "AS `_kind`" in reduced and "pg__absent_1" in reduced
    full = full_recompute_sql("hist", ["id"], {"id": "integer"}, ["id", "v"])
    assert "row_number() OVER (PARTITION BY IF(pg_operation = 'delete'" in full


def test_plan_without_markers_applies_everything() -> None:
    plan = plan_markers([], P(50, 3))
    assert plan.cut == P(50, 3) and plan.boundary is None and plan.parked is None


def test_a_park_stops_the_table_just_before_it() -> None:
    plan = plan_markers([Marker(P(30, 0), "park", "identity lost")], P(50, 3))
    assert plan.cut == P(29, 9_999_999_999) and plan.parked is not None and plan.parked.note == "identity lost"


def test_a_later_resync_lifts_the_park_and_replaces_state() -> None:
    plan = plan_markers([Marker(P(30, 0), "park"), Marker(P(40, 1), "resync")], P(50, 3))
    assert plan.cut == P(50, 3) and plan.parked is None and plan.boundary == P(40, 1) and plan.resynced


def test_a_park_after_the_resync_stops_again() -> None:
    plan = plan_markers([Marker(P(30, 0), "park"), Marker(P(40, 1), "resync"), Marker(P(45, 2), "park", "b")], P(50, 3))
    assert plan.cut == P(45, 1) and plan.parked is not None and plan.parked.note == "b" and plan.boundary == P(40, 1)


def test_markers_beyond_the_cut_do_not_count() -> None:
    plan = plan_markers([Marker(P(60, 0), "park"), Marker(P(20, 1), "truncate")], P(50, 3))
    assert plan.cut == P(50, 3) and plan.parked is None and plan.boundary == P(20, 1) and not plan.resynced


markers = st.lists(
    st.builds(
        Marker, st.builds(P, st.integers(1, 100), st.integers(0, 5)), st.sampled_from(["park", "resync", "truncate"])
    ),
    max_size=8,
)


@given(markers, st.builds(P, st.integers(1, 100), st.integers(0, 5)))
def test_plan_never_skips_a_park_and_is_stable(ms: list[Marker], cut: ChangePosition) -> None:
    plan = plan_markers(ms, cut)
    assert plan.cut <= cut
    applied = sorted(m for m in ms if m.position <= plan.cut)
    last_resync = max((m.position for m in applied if m.op == "resync"), default=None)
    # No park is applied after the last applied resync.
    assert not any(m.op == "park" and (last_resync is None or m.position > last_resync) for m in applied)
    # Re-planning from the merged position sees the same park again (it was not consumed).
    if plan.parked is not None:
        again = plan_markers([m for m in ms if m.position > plan.cut], cut)
        assert again.parked == plan.parked and again.cut == plan.cut


def test_toast_replay_takes_unsent_values_from_the_old_key() -> None:
    events = [
        {"id": 1, "body": None, "pg_lsn": 10, "pg_seq": 1, "kind": "delete", "absent": [], "from": None},
        {"id": 2, "body": None, "pg_lsn": 10, "pg_seq": 1, "kind": "upsert", "absent": ["body"], "from": (1,)},
    ]
    state: dict = {(1,): {"body": "big"}}
    patches = replay_key_changes(events, state, ["id"], ["body"])
    assert len(patches) == 1 and patches[0].values == {"body": "big"} and patches[0].columns == ["body"]
    assert state[(2,)] == {"body": "big"} and state[(1,)] is None


def _totals(records: int, deletes: int, size: int) -> dict[str, str]:
    return {"total-records": str(records), "total-position-deletes": str(deletes), "total-files-size": str(size)}


def test_a_compaction_rewrites_everything_only_once_enough_rows_are_deleted() -> None:
    mib = 1 << 20
    small = plan_compaction(_totals(10_000_000, 999_999, 80 * mib), 2, 0.1, 128 * mib)
    assert not small.full
    assert small.small_file_bytes == int(2.5 * mib)  # a sixteenth of a bucket's 40 MiB
    assert plan_compaction(_totals(10_000_000, 1_000_000, 80 * mib), 2, 0.1, 128 * mib).full
    # Bounds: at least 1 MiB, at most three quarters of the target size.
    assert plan_compaction(_totals(1_000, 0, 50_000), 2, 0.1, 128 * mib).small_file_bytes == mib
    assert plan_compaction(_totals(10**9, 0, 10**12), 2, 0.1, 128 * mib).small_file_bytes == 96 * mib
    # Equality deletes count as deleted rows too.
    eq = {**_totals(100, 5, mib), "total-equality-deletes": "5"}
    assert plan_compaction(eq, 2, 0.1, 128 * mib).full


@pytest.mark.parametrize(
    "summary",
    [{}, {"total-records": "10"}, {"total-records": "x", "total-position-deletes": "0", "total-files-size": "1"}],
)
def test_a_compaction_without_the_snapshot_totals_is_a_full_rewrite(summary: dict[str, str]) -> None:
    assert plan_compaction(summary, 2, 0.1, 128 << 20).full


def test_a_zero_ratio_or_an_empty_table_means_a_full_rewrite() -> None:
    assert plan_compaction(_totals(1000, 0, 1 << 20), 2, 0.0, 128 << 20).full
    assert plan_compaction(_totals(0, 0, 0), 2, 0.1, 128 << 20).full
