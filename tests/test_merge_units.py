"""Pure logic of the load and merge stages (no JVM): type mapping, absent columns, SQL builders."""

from __future__ import annotations

import pytest

from loader.errors import SchemaEvolutionError
from loader.load.evolution import plan_evolution
from loader.load.history import absent_columns_sql
from loader.load.typemap import never_toasted, spark_type
from loader.lsn import ChangePosition
from loader.merge.sql import full_recompute_sql, key_events_sql, merge_sql, reduce_sql


@pytest.mark.parametrize(
    ("pg", "sql", "text"),
    [
        ("numeric(12,4)", "DECIMAL(12,4)", False),
        ("numeric(50,10)", "STRING", True),
        ("numeric", "STRING", True),
        ("timestamp(3) with time zone", "TIMESTAMP", False),
        ("timestamp(6) without time zone", "TIMESTAMP_NTZ", False),
        ("integer[]", "ARRAY<INT>", False),
        ("character varying(20)[]", "ARRAY<STRING>", False),
        ("numeric(6,2)[]", "ARRAY<DECIMAL(6,2)>", False),
        ("numeric[]", "STRING", True),
        ("timestamp with time zone[]", "STRING", True),
        ("jsonb[]", "STRING", True),
        ("bytea", "BINARY", False),
        ("mood", "STRING", True),
        ("interval", "STRING", True),
        ("money", "STRING", True),
        ("time without time zone", "STRING", True),
    ],
)
def test_type_mapping(pg: str, sql: str, text: bool) -> None:
    st = spark_type(pg)
    assert (st.sql, st.lossless_text) == (sql, text)


def test_fixed_length_types_are_never_toasted() -> None:
    assert never_toasted("integer") and never_toasted("timestamp(3) with time zone") and never_toasted("uuid")
    assert not never_toasted("text") and not never_toasted("numeric(10,2)") and not never_toasted("integer[]")


def test_absent_columns_exclude_fixed_length_and_dropped() -> None:
    sql = absent_columns_sql({"id": "integer", "body": "text", "gone": "jsonb"}, {"gone": ChangePosition(5, 2)})
    assert "'id'" not in sql and "'body'" in sql
    assert "struct(commit_lsn, seq) < struct(CAST(5 AS BIGINT) AS commit_lsn, CAST(2 AS BIGINT) AS seq)" in sql


def test_evolution_widens_or_refuses_with_table_and_column() -> None:
    plan = plan_evolution("public.t", {"a": "integer", "d": "numeric(10,2)"}, [("a", "bigint"), ("d", "numeric(12,2)"), ("n", "text")])
    assert plan.widen == [("a", "bigint"), ("d", "numeric(12,2)")] and plan.add == [("n", "text")]
    with pytest.raises(SchemaEvolutionError) as err:
        plan_evolution("public.t", {"a": "integer"}, [("a", "text")])
    assert "public.t" in str(err.value) and "'a'" in str(err.value) and err.value.hint


def test_merge_sql_guards_positions_and_handles_truncate() -> None:
    sql = merge_sql("cur", "src", ["id"], ["id", "v"])
    assert "s.pg_lsn > t.pg_lsn" in sql and "NOT MATCHED BY SOURCE" not in sql
    sql = merge_sql("cur", "src", ["id"], ["id", "v"], truncated_before=(10, 3))
    assert "WHEN NOT MATCHED BY SOURCE AND (t.pg_lsn < 10 OR (t.pg_lsn = 10 AND t.pg_seq < 3)) THEN DELETE" in sql


def test_reduction_segments_rows_at_deletes_and_key_changes() -> None:
    events = key_events_sql("inc", ["id"], {"id": "integer"}, ["id", "v"])
    assert "_from" in events and "'delete' AS _kind" in events
    reduced = reduce_sql("ev", ["id"], ["id", "v"])
    assert "_kind = 'delete' OR _from IS NOT NULL" in reduced and "PARTITION BY `id`, _seg" in reduced
    full = full_recompute_sql("hist", ["id"], {"id": "integer"}, ["id", "v"])
    assert "row_number() OVER (PARTITION BY IF(pg_operation = 'delete'" in full
