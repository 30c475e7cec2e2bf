"""The fuzzer's generator (pure): deterministic by seed, covers every form it claims, and draws a
known gap only when its flag is given."""

from __future__ import annotations

import re

import pytest

from tests.fuzz.workload import KNOWN_GAPS, TABLE_KINDS, TYPES, Loader, Sql, generate, parse_gaps

SEEDS = range(1, 41)


def all_sql(seed: int, **kwargs: object) -> str:
    return generate(seed, **kwargs).script()  # type: ignore[arg-type]


def test_same_seed_same_sql_and_actions() -> None:
    for seed in (1, 2, 99):
        a, b = generate(seed), generate(seed)
        assert a.steps == b.steps and a.script() == b.script() and a.tracked == b.tracked
    assert generate(1).script() != generate(2).script()


def test_seeds_cover_every_table_kind_type_dml_and_ddl_form() -> None:
    text = "\n".join(all_sql(s, rounds=6, tables=8) for s in SEEDS)
    for kind in TABLE_KINDS:
        assert f"create {kind} table" in text, kind
    for spelling in TYPES.values():
        assert f" {spelling}" in text, spelling
    for needle in [
        "ON CONFLICT",
        "MERGE INTO",
        "FROM STDIN",
        "SAVEPOINT sp",
        "ROLLBACK TO SAVEPOINT",
        "RELEASE SAVEPOINT",
        "SET CONSTRAINTS ALL DEFERRED",
        "REPLICA IDENTITY FULL",
        "REPLICA IDENTITY USING INDEX",
        "PARTITION BY RANGE",
        "ATTACH PARTITION",
        "DETACH PARTITION",
        "ADD CONSTRAINT",
        "ADD COLUMN",
        "DEFAULT clock_timestamp()",
        "DROP COLUMN",
        "TYPE text USING",
        "RENAME COLUMN",
        "RENAME TO",
        "SET SCHEMA",
        "DROP TABLE",
        "ADD VALUE",
        "SET UNLOGGED",
        "SET NOT NULL",
        "SET STORAGE",
        "repeat(",
        "loader: kill capture",
        "loader: overlap capture",
    ]:
        assert needle in text, needle
    actions = {(s.action, s.stage) for seed in SEEDS for s in generate(seed).steps if isinstance(s, Loader)}
    assert {("kill", "load"), ("kill", "merge"), ("overlap", "load"), ("overlap", "merge")} & actions


# What each gap looks like in the SQL.
GAP_SQL = {
    "nan_infinity": r"'(NaN|-?Infinity)'",
}

# Hazards once behind a gap flag, drawn by default since they were fixed.
FIXED_SQL = {
    "deferrable_pk": r"PRIMARY KEY \(id\) DEFERRABLE",
    "enum_rename_value": r"RENAME VALUE",
    "case_only_columns": r'ADD COLUMN "CI_\d+"',
    "truncate_resync": r"(?m)^(TRUNCATE|VACUUM FULL) ",
    "retype_numeric_unconstrained": r"(?m)ALTER COLUMN \S+ TYPE numeric;?$",
    "datetime_infinity": r"'-?infinity'",
    "database_output_settings": r"ALTER DATABASE %I SET bytea_output",
    "inheritance_child": r"\(\) INHERITS \(",
}


@pytest.mark.parametrize("gap", sorted(KNOWN_GAPS))
def test_each_known_gap_only_when_asked(gap: str) -> None:
    assert gap in GAP_SQL and "issue 22" in KNOWN_GAPS[gap]
    with_gap = [generate(s, rounds=8, gaps=frozenset({gap})) for s in SEEDS]
    without = [generate(s, rounds=8) for s in SEEDS]
    pattern = re.compile(GAP_SQL[gap])
    assert any(pattern.search(w.script()) for w in with_gap)
    assert not any(pattern.search(w.script()) for w in without)


@pytest.mark.parametrize("hazard", sorted(FIXED_SQL))
def test_fixed_hazards_are_drawn_by_default(hazard: str) -> None:
    assert hazard not in KNOWN_GAPS
    pattern = re.compile(FIXED_SQL[hazard])
    assert any(pattern.search(generate(s, rounds=8).script()) for s in SEEDS)


def test_ddl_on_tables_created_since_the_last_capture_is_drawn_by_default() -> None:
    workloads = [generate(s, rounds=5, tables=6) for s in range(1, 200)]
    assert any(new_table_ddl(w, r"ADD COLUMN \S+ \S+ DEFAULT") for w in workloads)
    assert any(new_table_ddl(w, r"SET UNLOGGED") for w in workloads)


def new_table_ddl(workload: object, ddl: str) -> bool:
    """An ALTER TABLE ``ddl`` on a table created after the last capture or run."""
    created: set[str] = set()
    for step in workload.steps:  # type: ignore[attr-defined]
        if isinstance(step, Loader) and step.action in ("run", "capture", "snapshot"):
            created.clear()
        elif isinstance(step, Sql):
            for s in step.statements:
                m = re.match(r"CREATE TABLE (\S+) \(", s)
                if m:
                    created.add(m.group(1))
                m = re.match(r"ALTER TABLE (\S+) " + ddl, s)
                if m and m.group(1) in created:
                    return True
    return False


def test_gap_flags_parse() -> None:
    assert parse_gaps("") == frozenset()
    assert parse_gaps("all") == frozenset(KNOWN_GAPS)
    assert parse_gaps("nan_infinity, nan_infinity") == {"nan_infinity"}
    with pytest.raises(ValueError, match="unknown gap"):
        generate(1, gaps=frozenset({"nope"}))


def test_seeds_without_the_ddl_trigger_draw_only_what_the_catalog_comparison_can_see() -> None:
    workloads = [generate(s, rounds=5, tables=6) for s in range(1, 200)]
    off = [w for w in workloads if not w.ddl_trigger]
    assert off and len(off) < len(workloads) / 2
    assert not any(new_table_ddl(w, r"SET UNLOGGED") for w in off)
    assert not any(new_table_ddl(w, r"ALTER COLUMN \S+ TYPE numeric$") for w in off)
    assert all("source.ddl_trigger = false" in w.script() for w in off)


def test_seeds_load_in_one_group_or_many_committed_together_or_each() -> None:
    """Seeds with the driver load draw one group a load or many small ones, committed together
    (load.commit_interval_s) or each on its own (drawn from a generator of their own)."""
    seen = set()
    for seed in range(60):
        w = generate(seed, rounds=1)
        if w.driver_load:
            seen.add((w.group_bytes < (64 << 20), w.commit_interval_s == 0))
    assert seen == {(False, False), (False, True), (True, False), (True, True)}, seen
