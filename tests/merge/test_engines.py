"""The two merge engines against each other: the driver merge (Arrow + one RowDelta,
loader.merge.driver / rowdelta) and Spark's MERGE (loader.merge.current) apply the same plain
increments of the same history to two current tables, which must then hold the same rows in the
same partitions, for every key type the driver takes (integer, bigint, text, composite keys).

One lake serves every example: its history is loaded once per increment and merged into two
current namespaces, one through each engine (``merge.driver_max_rows = 0`` sends everything to
Spark). Each table's keys come from a small fixed set of edge values (negative, zero, the type's
limits, empty and non-ASCII text), so increments keep meeting rows earlier examples left; what an
increment leaves for the keys it touches does not depend on them (a write is an insert or an
update as the key is absent or present, a delete of an absent key is left out).
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader.merge.current as current_mod
import loader.merge.rowdelta as rowdelta_mod
from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
from loader.lake.tables import SourceTable, TableNames
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import LandingWriter, open_landing
from loader.load.history import HistoryLoad
from loader.merge.current import CurrentMerge
from tests.harness import TS, lake_settings

INT_EDGES = [-(2**31), -1000, -1, 0, 1, 7, 1000, 2**31 - 1]
BIGINT_EDGES = [-(2**63), -(2**31) - 1, -1, 0, 42, 2**31, 10**15, 2**63 - 1]
TEXT_EDGES = ["", " ", "a", "A", "0", "-1", "é", "日本語", "🙂", "a b", "x" * 40, "ß"]


@dataclass(frozen=True)
class KeyedTable:
    table: SourceTable
    key: tuple[tuple[str, str], ...]  # (column, PostgreSQL type), the first one bucketed
    keys: tuple[tuple[Any, ...], ...]  # the key values its changes use

    def key_columns(self, key: tuple[Any, ...]) -> list[Column]:
        return [Column(name, pg_type, str(v)) for (name, pg_type), v in zip(self.key, key, strict=True)]


TABLES = [
    KeyedTable(SourceTable("public", "k_int"), (("id", "integer"),), tuple((v,) for v in INT_EDGES)),
    KeyedTable(SourceTable("public", "k_bigint"), (("id", "bigint"),), tuple((v,) for v in BIGINT_EDGES)),
    KeyedTable(SourceTable("public", "k_text"), (("id", "text"),), tuple((v,) for v in TEXT_EDGES)),
    KeyedTable(
        SourceTable("public", "k_int_text"),
        (("n", "integer"), ("s", "text")),
        tuple(itertools.product([-1, 0, 2**31 - 1], ["", "é", "b"])),
    ),
    KeyedTable(
        SourceTable("public", "k_text_bigint"),
        (("s", "text"), ("n", "bigint")),
        tuple(itertools.product(["", "日本語", "z"], [-(2**63), 0, 2**63 - 1])),
    ),
]


@dataclass
class Lake:
    """The shared lake: landing area, history, the two current namespaces, and the model."""

    driver: LoaderSettings
    spark_only: LoaderSettings
    lsn: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    live: dict[str, dict[tuple[Any, ...], tuple[str | None, int | None]]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def lake(base_settings: LoaderSettings, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    driver = lake_settings(base_settings, tmp_path_factory.mktemp("engines"))
    c = driver.catalog
    spark_only = driver.model_copy(
        update={
            "catalog": c.model_copy(update={"current_namespace": f"{c.current_namespace}_spark"}),
            "merge": driver.merge.model_copy(update={"driver_max_rows": 0}),
        }
    )
    return Lake(driver, spark_only)


# One change: (key index, write or delete, whether an update carries its old key, the two values).
_change = st.tuples(
    st.integers(0, 11),
    st.sampled_from(["write", "write", "delete"]),
    st.booleans(),
    st.one_of(st.none(), st.text(alphabet="abcé日🙂 ", max_size=6)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
_increment = st.dictionaries(
    st.sampled_from(range(len(TABLES))),
    st.lists(st.lists(_change, min_size=1, max_size=3), min_size=1, max_size=3),  # transactions
    min_size=1,
    max_size=1,  # one table per example: one Spark MERGE, most of an example's time
)


def _records(lake: Lake, spec: KeyedTable, txns: list[list[tuple[Any, ...]]]) -> list[ChangeRecord]:
    """The increment's records for one table, its model updated as the source would be."""
    live = lake.live.setdefault(spec.table.qualified, {})
    pk = [name for name, _ in spec.key]
    out: list[ChangeRecord] = []
    for txn in txns:
        commit_lsn = 0x1000 * next(lake.lsn)
        changes: list[ChangeRecord] = []
        for index, action, with_old_key, v, n in txn:
            key = spec.keys[index % len(spec.keys)]
            if action == "delete" and key not in live:
                continue
            if action == "delete":
                op, columns, identity = "D", [], spec.key_columns(key)
                del live[key]
            else:
                op = "U" if key in live else "I"
                columns = [
                    *spec.key_columns(key),
                    Column("val_text", "text", v),
                    Column("val_num", "bigint", None if n is None else str(n)),
                ]
                identity = spec.key_columns(key) if op == "U" and with_old_key else []
                live[key] = (v, n)
            seq = len(changes) + 1
            changes.append(
                ChangeRecord(
                    op=op,
                    commit_lsn=commit_lsn,
                    seq=seq,
                    xid=commit_lsn,
                    ts=TS,
                    schema=spec.table.schema,
                    table=spec.table.table,
                    change_lsn=commit_lsn - 100 + seq,
                    columns=columns,
                    identity=identity,
                    pk=pk,
                )
            )
        commit = ChangeRecord(op=COMMIT, commit_lsn=commit_lsn, seq=len(changes) + 1, xid=commit_lsn, ts=TS)
        out += [*changes, commit]
    return out


def _rows(settings_: LoaderSettings, table: SourceTable) -> list[tuple[Any, ...]]:
    """Every live row of a current table with the bucket it is filed under, sorted (read through
    pyiceberg, position deletes applied): what any reader sees, and where."""
    from pyiceberg.io.pyarrow import ArrowScan

    names = TableNames(settings_)
    cur = open_catalog(settings_).load_table((names.current_ns, table.iceberg_name))
    scan = cur.scan()
    out = []
    for task in scan.plan_files():
        rows = ArrowScan(cur.metadata, cur.io, scan.projection(), scan.row_filter).to_table([task])
        out += [(task.file.partition[0], *sorted(r.items())) for r in rows.to_pylist()]
    return sorted(out, key=repr)


class _Reasons(logging.Handler):
    """Why the merge sent a table to Spark (its debug line), for the failure message."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _Counting:
    """Which current tables the driver's RowDelta committed to, calling through."""

    def __init__(self) -> None:
        self.tables: list[str] = []
        self.real = rowdelta_mod.commit_rows

    def __call__(self, spark: Any, ident: str, *args: Any, **kwargs: Any) -> Any:
        self.tables.append(ident)
        return self.real(spark, ident, *args, **kwargs)


@settings(
    max_examples=int(os.environ.get("LOADER_ENGINE_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(increment=_increment, max_changes=st.integers(1, 8))
def test_driver_and_spark_merge_the_same_plain_increments_to_the_same_rows(
    spark: Any, lake: Lake, increment: dict[int, list[list[tuple[Any, ...]]]], max_changes: int
) -> None:
    records: list[ChangeRecord] = []
    for i, txns in sorted(increment.items()):
        records += _records(lake, TABLES[i], txns)
    # In commit order, in files of a few changes each.
    records.sort(key=lambda r: (r.commit_lsn, r.seq))
    writer = LandingWriter(open_landing(lake.driver), max_changes=max_changes)
    for rec in records:
        writer.write(rec)
    writer.close_file()
    HistoryLoad(spark, lake.driver).run()
    touched = sorted({f"{r.schema}.{r.table}" for r in records if r.op != COMMIT})
    if not touched:
        return
    driver_commits, spark_commits = _Counting(), _Counting()
    why, merge_log = _Reasons(), logging.getLogger("loader.merge")
    level = merge_log.level
    merge_log.addHandler(why)
    merge_log.setLevel(logging.DEBUG)
    try:
        with mock.patch.object(current_mod, "commit_rows", driver_commits):
            CurrentMerge(spark, lake.driver).run(touched)
    finally:
        merge_log.removeHandler(why)
        merge_log.setLevel(level)
    with mock.patch.object(current_mod, "commit_rows", spark_commits):
        CurrentMerge(spark, lake.spark_only).run(touched)
    by_driver = TableNames(lake.driver)
    # Every increment was merged on the driver (a table's first state too); none by the other
    # engine on the driver.
    assert spark_commits.tables == []
    assert sorted(driver_commits.tables) == sorted(by_driver.current(_spec(t).table) for t in touched), why.messages
    for qualified in touched:
        spec = _spec(qualified)
        a = _rows(lake.driver, spec.table)
        assert a == _rows(lake.spark_only, spec.table), f"{qualified}: the driver's rows differ from Spark's"
        pk = [name for name, _ in spec.key]
        rows = [dict(r[1:]) for r in a]
        assert {tuple(r[k] for k in pk): (r["val_text"], r["val_num"]) for r in rows} == lake.live[qualified]


def _spec(qualified: str) -> KeyedTable:
    return next(t for t in TABLES if t.table.qualified == qualified)


@pytest.mark.parametrize(
    ("spark_type", "values"),
    [
        ("INT", [*INT_EDGES, -(2**15), 2**15 - 1, 123456789]),
        ("BIGINT", [*BIGINT_EDGES, -(2**31), 2**31 - 1, -(2**53) - 1, 2**53 + 1]),
        ("STRING", [*TEXT_EDGES, "\u00e9", "e\u0301", "\x00", "a" * 1000, "\U0001f600" * 3, "\ufeff"]),
    ],
)
def test_the_driver_files_a_key_under_the_bucket_spark_computes(
    spark: Any, base_settings: LoaderSettings, spark_type: str, values: list[Any]
) -> None:
    """A key the current table does not hold yet goes to the bucket pyiceberg's transform gives
    (loader.merge.driver); Spark's MERGE files it under Iceberg's ``bucket`` function: they must agree."""
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import IntegerType, LongType, StringType

    iceberg_type = {"INT": IntegerType(), "BIGINT": LongType(), "STRING": StringType()}[spark_type]
    widths = [1, 2, 3, 4, 16, 1024]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], f"i INT, k {spark_type}")
    catalog = base_settings.catalog.name
    exprs = [f"{catalog}.system.bucket({n}, k) AS b{n}" for n in widths]
    by_spark = {r["i"]: [r[f"b{n}"] for n in widths] for r in df.selectExpr("i", *exprs).collect()}
    for i, v in enumerate(values):
        by_driver = [BucketTransform(n).transform(iceberg_type)(v) for n in widths]
        assert by_driver == by_spark[i], f"{spark_type} {v!r}: driver {by_driver}, Spark {by_spark[i]}"
    # The first-state build's hashes (loader.merge.bulk.key_hashes, partitions of hash modulo a
    # multiple of the bucket count) modulo each width.
    import pyarrow as pa

    from loader.merge.bulk import key_hashes

    arrow_type = {"INT": pa.int32(), "BIGINT": pa.int64(), "STRING": pa.string()}[spark_type]
    hashes = key_hashes(pa.array(values, arrow_type))
    for j, n in enumerate(widths):
        assert (hashes % n).tolist() == [by_spark[i][j] for i in range(len(values))], f"{spark_type} hash % {n}"
    if spark_type != "STRING":
        # The bulk build's whole-column murmur3 (loader.merge.bulk.bucket_ints) on the same values.
        import numpy as np

        from loader.merge.bulk import bucket_ints

        dtype = np.int32 if spark_type == "INT" else np.int64
        for j, n in enumerate(widths):
            got = bucket_ints(np.array(values, dtype=dtype), n).tolist()
            assert got == [by_spark[i][j] for i in range(len(values))], f"{spark_type} bucket({n}) of a column"
