"""The load kernel's JSON (loader.load.kernel) against Spark's own ``to_json``: the old key a driver
load writes must be the text a Spark load of the same change would have written."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.lake.types import sql_string
from loader.load.kernel import json_objects
from loader.names import lake_column

# Every control character, quotes, backslashes, '/', DEL and beyond-ASCII text; names too (their
# lake names, reserved ones prefixed, are the kernel's mapping: the JSON is what is compared).
_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.lists(st.tuples(_TEXT, st.none() | _TEXT), max_size=3, unique_by=lambda kv: kv[0]), min_size=1, max_size=5
    )
)
def test_old_key_json_is_what_spark_to_json_writes(spark: Any, rows: list[list[tuple[str, str | None]]]) -> None:
    keys = pa.array([[k for k, _ in r] for r in rows], pa.list_(pa.string()))
    values = pa.array([[v for _, v in r] for r in rows], pa.list_(pa.string()))
    ours = json_objects(keys, values).to_pylist()
    sql = []
    for i, r in enumerate(rows):
        if not r:
            sql.append(f"SELECT {i} AS i, CAST(NULL AS STRING) AS j")
            continue
        names = ", ".join(sql_string(lake_column(k)) for k, _ in r)
        texts = ", ".join("CAST(NULL AS STRING)" if v is None else sql_string(v) for _, v in r)
        sql.append(f"SELECT {i} AS i, to_json(map_from_arrays(array({names}), array({texts}))) AS j")
    theirs = [row.j for row in spark.sql(" UNION ALL ".join(sql) + " ORDER BY i").collect()]
    assert ours == theirs
