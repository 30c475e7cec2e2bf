"""The driver merge (loader.merge.driver + loader.merge.rowdelta): plain increments merged with
Arrow on the driver and committed in one RowDelta, checked against a model through Spark and
through pyiceberg (an independent reader of the position deletes it writes)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader.merge.current as current_mod
import loader.merge.rowdelta as rowdelta_mod
from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
from loader.lake.iceberg import watermark
from loader.lake.tables import SUMMARY_MERGED_THROUGH, TableNames
from loader.load.history import HistoryLoad
from loader.merge.current import CurrentMerge
from tests.harness import (
    TABLE,
    Env,
    Txn,
    change,
    current_rows,
    generate,
    lake_settings,
    load_and_merge,
    write_files,
)


class _Counting:
    """Counts the driver's commits (the RowDelta path) while calling through."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = rowdelta_mod.commit_rows

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kwargs)


def _pyiceberg_rows(settings_: LoaderSettings) -> dict[int, tuple[str | None, int | None]]:
    names = TableNames(settings_)
    table = open_catalog(settings_).load_table((names.current_ns, TABLE.iceberg_name))
    rows = table.scan(selected_fields=("id", "a", "b")).to_arrow().to_pylist()
    return {r["id"]: (r["a"], r["b"]) for r in rows}


@settings(
    max_examples=int(os.environ.get("LOADER_PROPERTY_EXAMPLES", "5")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_txns=st.integers(3, 16),
    n_batches=st.integers(2, 4),
    max_changes=st.integers(1, 4),
)
def test_plain_increments_merged_on_the_driver_end_in_the_model(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, seed: int, n_txns: int, n_batches: int, max_changes: int
) -> None:
    rnd = random.Random(seed)
    settings_ = lake_settings(base_settings, tmp_path)
    txns, model = generate(rnd, n_txns, keys=6, plain=True)
    cuts = sorted(rnd.sample(range(1, len(txns)), min(n_batches - 1, len(txns) - 1))) if len(txns) > 1 else []
    batches = [txns[i:j] for i, j in zip([0, *cuts], [*cuts, len(txns)])]
    counting = _Counting()
    with mock.patch.object(current_mod, "commit_rows", counting):
        for i, batch in enumerate(batches):
            to_write = list(batch)
            if i > 0 and rnd.random() < 0.5:
                to_write = [batches[i - 1][-1], *to_write]  # redelivered: loaded once
            write_files(settings_, to_write, max_changes)
            load_and_merge(spark, settings_)
            if rnd.random() < 0.3:
                load_and_merge(spark, settings_)  # nothing new: no commit at all
    assert current_rows(spark, settings_) == model
    assert _pyiceberg_rows(settings_) == model
    # Every increment is plain, the first too (the current table's first state, built on the driver).
    assert counting.calls == len(batches)


@settings(
    max_examples=int(os.environ.get("LOADER_PROPERTY_EXAMPLES", "5")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), n_txns=st.integers(2, 30), partition_rows=st.sampled_from([1, 3, 1000]))
def test_a_first_state_above_the_driver_bound_is_built_in_partitions(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, seed: int, n_txns: int, partition_rows: int
) -> None:
    """A table's first state from more changes than merge.driver_max_rows (no snapshot among them)
    is reduced on the driver partition by partition (loader.merge.bulk.first_state_rows) and written
    in one commit: the model's rows, each in the bucket Iceberg gives its key; later increments
    merge onto it as onto any current table."""
    import pyarrow.parquet as pq
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import IntegerType

    import loader.merge.bulk as bulk_mod

    rnd = random.Random(seed)
    base = lake_settings(base_settings, tmp_path)
    settings_ = base.model_copy(update={"merge": base.merge.model_copy(update={"driver_max_rows": 1})})
    txns, model = generate(rnd, n_txns, keys=12, plain=True)
    with mock.patch.object(bulk_mod, "FIRST_STATE_PARTITION_ROWS", partition_rows):
        write_files(settings_, txns, 3)
        HistoryLoad(spark, settings_).run()
        first = CurrentMerge(spark, settings_).run().tables[0]
    if first.increment_rows > 1:
        assert (first.method, first.bulk_engine) == ("bulk", "driver"), first
    assert current_rows(spark, settings_) == model
    assert _pyiceberg_rows(settings_) == model
    names = TableNames(settings_)
    table = open_catalog(settings_).load_table((names.current_ns, TABLE.iceberg_name))
    n = table.spec().fields[0].transform.num_buckets
    for task in table.scan().plan_files():  # every row in its key's bucket
        with table.io.new_input(task.file.file_path).open() as f:
            keys = pq.read_table(f).column("id").to_pylist()
        assert {BucketTransform(n).transform(IntegerType())(k) for k in keys} <= {int(task.file.partition[0])}
    # A later increment merges onto it as onto any current table.
    txn = Txn(commit_lsn=0x1000 * (n_txns + 2))
    for k in range(1, 13):
        if k in model and k % 2:
            change(txn, "D", None, old_id=k)
            del model[k]
        elif k not in model:
            change(txn, "I", {"id": k, "a": "late", "b": k})
            model[k] = ("late", k)
    write_files(settings_, [txn], 100)
    load_and_merge(spark, settings_)
    assert current_rows(spark, settings_) == model


def _plain_lake(spark: Any, base_settings: LoaderSettings, tmp_path: Path) -> tuple[LoaderSettings, dict[int, Any]]:
    """A lake whose current table holds keys 1..5 after one merge."""
    settings_ = lake_settings(base_settings, tmp_path)
    txn = Txn(commit_lsn=0x1000)
    model: dict[int, Any] = {}
    for k in range(1, 6):
        change(txn, "I", {"id": k, "a": f"v{k}", "b": k})
        model[k] = (f"v{k}", k)
    write_files(settings_, [txn], 100)
    load_and_merge(spark, settings_)
    return settings_, model


def test_a_commit_by_another_writer_makes_the_driver_merge_start_again(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path
) -> None:
    settings_, model = _plain_lake(spark, base_settings, tmp_path)
    cur = TableNames(settings_).current(TABLE)
    txn = Txn(commit_lsn=0x2000)
    change(txn, "U", {"id": 1, "a": "new", "b": 10}, old_id=1)
    change(txn, "D", None, old_id=2)
    change(txn, "I", {"id": 7, "a": "seven", "b": 7})
    model.update({1: ("new", 10), 7: ("seven", 7)})
    del model[2]
    write_files(settings_, [txn], 100)
    HistoryLoad(spark, settings_).run()
    hits: list[str] = []

    def other_writer(point: str) -> None:
        if point == "merge-before-commit":
            hits.append(point)
            if len(hits) == 1:  # between the driver's reads and its commit
                spark.sql(
                    f"INSERT INTO {cur} (id, a, b, pg_lsn, pg_seq, pg_txn_timestamp) "
                    "VALUES (99, 'other', 0, 1, 1, current_timestamp())"
                )

    counting = _Counting()
    with (
        mock.patch.object(rowdelta_mod, "checkpoint", other_writer),
        mock.patch.object(current_mod, "commit_rows", counting),
    ):
        CurrentMerge(spark, settings_).run()
    assert len(hits) == 2, "the first commit must have been refused and the merge redone"
    assert counting.calls == 2
    assert current_rows(spark, settings_) == {**model, 99: ("other", 0)}
    assert _pyiceberg_rows(settings_) == {**model, 99: ("other", 0)}


def test_an_increment_that_changes_no_row_still_moves_the_watermark(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path
) -> None:
    settings_, model = _plain_lake(spark, base_settings, tmp_path)
    cur = TableNames(settings_).current(TABLE)
    before = watermark(spark, cur, SUMMARY_MERGED_THROUGH)
    txn = Txn(commit_lsn=0x3000)
    change(txn, "I", {"id": 40, "a": "brief", "b": 1})
    change(txn, "D", None, old_id=40)  # inserted and deleted in the increment: nothing to write
    write_files(settings_, [txn], 100)
    counting = _Counting()
    with mock.patch.object(current_mod, "commit_rows", counting):
        load_and_merge(spark, settings_)
    assert counting.calls == 1
    after = watermark(spark, cur, SUMMARY_MERGED_THROUGH)
    assert after is not None and before is not None and after > before
    assert after.startswith(f"{0x3000:016X}")
    assert current_rows(spark, settings_) == model


def test_increments_that_are_not_plain_go_to_spark(spark: Any, base_settings: LoaderSettings, tmp_path: Path) -> None:
    settings_, model = _plain_lake(spark, base_settings, tmp_path)
    counting = _Counting()
    steps: list[list[tuple[str, dict[str, Any] | None, int | None]]] = [
        [("U", {"id": 1, "b": 11}, 1)],  # 'a' not sent: unchanged TOAST
        [("U", {"id": 30, "a": "moved", "b": 3}, 3)],  # key change 3 -> 30
    ]
    expected = dict(model)
    expected[1] = ("v1", 11)
    expected[30] = ("moved", 3)
    del expected[3]
    with mock.patch.object(current_mod, "commit_rows", counting):
        for n, step in enumerate(steps):
            txn = Txn(commit_lsn=0x4000 + 0x1000 * n)
            for op, cols, old in step:
                change(txn, op, cols, old_id=old)
            write_files(settings_, [txn], 100)
            load_and_merge(spark, settings_)
    assert counting.calls == 0
    assert current_rows(spark, settings_) == expected


def test_a_widened_key_column_is_read_from_older_files(env: Env) -> None:
    env.sql("CREATE TABLE public.w (id int PRIMARY KEY, v text)")
    env.capture()
    env.sql("INSERT INTO public.w SELECT g, 'v' || g FROM generate_series(1, 50) g")
    env.run_all()
    env.sql("ALTER TABLE public.w ALTER COLUMN id TYPE bigint")  # a rewrite: the table is resynced
    env.sql("UPDATE public.w SET v = 'x' WHERE id <= 10")
    env.run_all()
    env.assert_reconciled()
    # Current files from before the widening hold the key as int, later ones as bigint.
    env.sql("UPDATE public.w SET v = 'y' WHERE id BETWEEN 5 AND 20")
    env.sql("DELETE FROM public.w WHERE id = 30")
    env.sql("INSERT INTO public.w VALUES (3000000000, 'big')")
    counting = _Counting()
    with mock.patch.object(current_mod, "commit_rows", counting):
        env.run_all()
    assert counting.calls == 1, "a plain increment after the widening must be merged on the driver"
    env.assert_reconciled()
