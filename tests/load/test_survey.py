"""The batch survey (one Spark job) against a plain-Python oracle over the same decoded rows.

The survey replaced several jobs per batch and one per table (tables and columns, dropped
columns, ledger counts, newest commit time, rejects); this checks that its answers are the ones
those jobs gave, row by row, on random batches with retyped, dropped and re-added columns, key
changes, rejects and damaged files.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.lake.tables import SourceTable
from loader.lake.types import never_toasted
from loader.load.decode import CHANGE_ROW_DDL
from loader.load.survey import survey
from loader.lsn import ChangePosition

pytestmark = pytest.mark.filterwarnings("ignore")

COLUMNS = [("id", "integer"), ("name", "text"), ("n", "bigint"), ("note", "character varying")]
TABLES = [("public", "a"), ("public", "b"), ("s", "a")]


@st.composite
def batches(draw: Any) -> list[dict[str, Any]]:
    rows = []
    lsn = 100
    for f in range(draw(st.integers(1, 3))):
        for line in range(draw(st.integers(1, 12))):
            lsn += draw(st.integers(0, 3))
            op = draw(st.sampled_from(["insert", "update", "delete", "read", "truncate", "park", "resync"]))
            schema, table = draw(st.sampled_from(TABLES))
            rejected = draw(st.integers(0, 9)) == 0
            unknown = op == "park" and draw(st.booleans())
            cols = [c for c in COLUMNS if c[0] == "id" or draw(st.booleans())]
            cols = [(n, "numeric" if n == "n" and draw(st.integers(0, 5)) == 0 else t) for n, t in cols]
            if op in ("truncate", "park", "resync", "delete"):
                cols = []
            key = [("id", draw(st.sampled_from(["integer", "bigint"])))] if op == "delete" else []
            if key and draw(st.booleans()):
                key.append(("name", "text"))
            pk = draw(st.sampled_from([[], ["id"], ["id", "name"]]))
            rows.append(
                {
                    "landing_file": f"f{f}",
                    "line": line,
                    "op": None if rejected and draw(st.booleans()) else op,
                    "commit_lsn": lsn,
                    "seq": len(rows) + 1,
                    "ts": draw(st.sampled_from([None, "", f"2026-01-01 00:00:{lsn % 60:02d}+00"])),
                    "src_schema": None if unknown else schema,
                    "src_table": None if unknown else table,
                    "col_names": [n for n, _ in cols],
                    "col_types": [t for _, t in cols],
                    "col_values": ["1"] * len(cols),
                    "key_names": [n for n, _ in key],
                    "key_types": [t for _, t in key],
                    "key_values": ["1"] * len(key),
                    "pk": pk,
                    "reject_reason": "bad" if rejected else None,
                }
            )
    return rows


def oracle(rows: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rows if r["reject_reason"] is None]
    at = {id(r): ChangePosition(r["commit_lsn"], r["seq"]) for r in rows}
    tables: dict[SourceTable, Any] = {}
    for r in good:
        if r["src_table"] is None:
            continue
        t = SourceTable(r["src_schema"], r["src_table"])
        place, typed, keys = tables.setdefault(t, ({}, {}, []))
        for i, (n, ty) in enumerate(zip(r["col_names"], r["col_types"], strict=True)):
            place[n] = min(place.get(n, i), i)
            if n not in typed or at[id(r)] > typed[n][0]:
                typed[n] = (at[id(r)], ty)
        if r["pk"]:
            keys.append((at[id(r)], r["pk"]))
    out_tables = {}
    dropped = {}
    for t, (place, typed, keys) in tables.items():
        cols = sorted(place, key=lambda n: (place[n], n))
        pk = max(keys)[1] if keys else []
        typed_cols = [(n, typed[n][1]) for n in cols]
        for k in pk:  # a key column only deletes named: typed by the newest delete's old key
            deletes = [
                r
                for r in good
                if r["op"] == "delete"
                and (r["src_schema"], r["src_table"]) == (t.schema, t.table)
                and k in r["key_names"]
            ]
            if k not in place and deletes:
                newest = max(deletes, key=lambda r: at[id(r)])
                typed_cols.append((k, newest["key_types"][newest["key_names"].index(k)]))
        out_tables[t] = (typed_cols, pk)
        mine = [r for r in good if (r["src_schema"], r["src_table"]) == (t.schema, t.table)]
        drops = {}
        for n, ty in COLUMNS:
            ops = ("insert", "read", "update") if never_toasted(ty) else ("insert", "read")
            gone = min((at[id(r)] for r in mine if r["op"] in ops and n not in r["col_names"]), default=None)
            seen = max((at[id(r)] for r in mine if n in r["col_names"]), default=None)
            if gone is not None and (seen is None or seen < gone):
                drops[n] = gone
        dropped[t] = drops
    files: dict[str, list[int]] = {}
    for r in rows:
        c = files.setdefault(r["landing_file"], [0, 0])
        c[0 if r["reject_reason"] is None else 1] += 1
    dated = [r for r in good if r["ts"]]
    newest = max(dated, key=lambda r: at[id(r)])["ts"] if dated else None
    return {
        "tables": out_tables,
        "dropped": dropped,
        "files": {f: tuple(c) for f, c in files.items()},
        "newest": newest,
        "rejects": sum(1 for r in rows if r["reject_reason"] is not None),
        "damaged": any(r["op"] == "park" and r["src_table"] is None for r in good),
    }


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=batches())
def test_survey_matches_the_rows(spark: Any, rows: list[dict[str, Any]]) -> None:
    names = [f.split()[0] for f in CHANGE_ROW_DDL.split(",")]
    df = spark.createDataFrame([tuple(r.get(n) for n in names) for r in rows], CHANGE_ROW_DDL)
    got = survey(df)
    want = oracle(rows)
    assert got.tables() == want["tables"]
    for t, drops in want["dropped"].items():
        assert got.dropped_columns(t, {}, COLUMNS)[0] == drops, t
    assert got.file_counts() == want["files"]
    assert got.newest_ts() == want["newest"]
    assert got.rejects == want["rejects"]
    assert got.damaged_unknown == want["damaged"]


def test_a_column_seen_again_after_its_drop_is_live_again(spark: Any) -> None:
    names = [f.split()[0] for f in CHANGE_ROW_DDL.split(",")]

    def row(lsn: int, cols: list[str]) -> tuple[Any, ...]:
        r = {
            "landing_file": "f",
            "line": lsn,
            "op": "insert",
            "commit_lsn": lsn,
            "seq": 1,
            "src_schema": "public",
            "src_table": "t",
            "col_names": cols,
            "col_types": ["text"] * len(cols),
            "pk": [],
        }
        return tuple(r.get(n) for n in names)

    got = survey(spark.createDataFrame([row(10, ["id"]), row(20, ["id", "x"])], CHANGE_ROW_DDL))
    known = {"x": ChangePosition(5, 1)}
    assert got.dropped_columns(SourceTable("public", "t"), known, [("id", "text"), ("x", "text")]) == ({}, True)
