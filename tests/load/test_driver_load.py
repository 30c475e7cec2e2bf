"""The driver load (loader.load.driver) writes exactly the history the Spark path writes, or leaves
the batch to the Spark path.

Oracle: the same landing files loaded twice, into two lakes, once with the driver path allowed and
once with it off (``load.driver_max_bytes = 0``); history (every column of every row), rejects,
the ledger and the load results must be equal. The random batches mix plain values with the
forms only Spark reads (or rejects): arrays, bytea, misfits, other zones, infinities, escapes.
"""

from __future__ import annotations

import ast
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader.load.driver as driver
from loader.config import LoaderSettings, LoadSettings
from loader.lake.catalog import open_catalog
from loader.lake.tables import SourceTable, TableNames
from loader.landing import arrowfile
from loader.landing.records import ChangeRecord, Column
from loader.landing.store import LandingFile, LocalLandingStore, open_landing, publish_arrow
from loader.load.history import HistoryLoad
from loader.lsn import ChangePosition
from tests.harness import TS, Txn, lake_settings, write_files

ON = LoadSettings(driver_max_bytes=512 << 20)
ACCT = SourceTable("public", "acct")
CODES = SourceTable("public", "codes")

# type -> (plain values, values only the Spark path takes or rejects)
VALUES: dict[str, tuple[list[str], list[str]]] = {
    "bigint": (["0", "-7", "9223372036854775807", "012"], ["+5", " 7", "1.0", "99999999999999999999"]),
    # integer and smallint without specials: out-of-range text sent whole batches to Spark and doubled
    # this oracle's time (the text-to-integer check is the one bigint's specials exercise)
    "integer": (["0", "-2147483648", "2147483647", "42"], []),
    "smallint": (["-32768", "32767", "5"], []),
    "numeric(10,2)": (["1.50", "-0.01", "12345678.99", "0.00", "7"], ["1.234", "NaN", "123456789.00"]),
    "text": (["x", "", "dü ñ", 'quo"te', "back\\slash", "tab\there"], ["bell\x07", "\x1e"]),
    "timestamp with time zone": (
        [
            "2024-03-01 10:00:00+00",
            "2024-03-01 10:00:00.5+00",
            "1999-12-31 23:59:59.999999+00",
            "infinity",
            "2024-03-01 10:00:00+02",
            "1900-01-01 00:00:00-04:56:02",
            "0044-03-15 12:00:00+00 BC",
        ],
        ["2024-03-01 24:00:00+00", "2024-03-01 10:00:00+19"],
    ),
    "timestamp without time zone": (
        ["2024-03-01 10:00:00", "2000-02-29 00:00:00.25", "-infinity", "12024-01-01 00:00:00"],
        ["2024-02-30 00:00:00"],
    ),
    "date": (["2024-03-01", "1970-01-01", "infinity", "12024-01-01", "0044-03-15 BC"], ["2024-02-30"]),
    "boolean": (["true", "false"], ["t", "yes"]),
    "double precision": (["1.5", "-0", "NaN", "Infinity", "-Infinity", "1e+300", "0.1"], ["abc", "1.5d"]),
    "real": (["3.4028235e+38", "1.1754944e-38", "0.1", "-2.5"], ["1e+50"]),
    "bytea": (["\\x00ff", "00ff", "", "7F"], ["zz"]),
    "integer[]": (["{1,2,NULL}", "{}"], ["{{1}}"]),
    "text[]": (['{"a,b",NULL,x}', "{}"], []),
    "jsonb": (['{"a": 1}', "[]"], []),
}
OPTIONAL = sorted(VALUES)


def _value(rnd: random.Random, pg_type: str, odd: float) -> str | None:
    plain, special = VALUES[pg_type]
    if rnd.random() < 0.15:
        return None
    if special and (not plain or rnd.random() < odd):
        return rnd.choice(special)
    return rnd.choice(plain)


def _batch(seed: int, columns: list[str], odd: float, text_keys: bool) -> list[Txn]:
    """Random transactions over public.acct (integer key) and, optionally, public.codes (text key)."""
    rnd = random.Random(seed)
    txns: list[Txn] = []
    live: dict[str, set[str]] = {"acct": set(), "codes": set()}
    for t in range(rnd.randint(2, 6)):
        txn = Txn(commit_lsn=0x1000 * (t + 1))
        for _ in range(rnd.randint(1, 6)):
            table = "codes" if text_keys and rnd.random() < 0.3 else "acct"
            key_type = "text" if table == "codes" else "integer"
            keys = live[table]
            op = rnd.choice(["I", "I", "U", "D"]) if keys else "I"
            if op == "I":
                key = rnd.choice(['k"1', "k\\2", "k-3", "k4", "ü5"]) if table == "codes" else str(rnd.randint(1, 50))
                keys.add(key)
            else:
                key = rnd.choice(sorted(keys))
                if op == "D":
                    keys.discard(key)
            cols = [Column("id", key_type, key)]
            if op != "D":
                for name in columns:
                    # Updates may leave a varlena value out (unchanged TOAST); fixed-length ones never.
                    if op == "U" and name in ("text", "jsonb", "numeric(10,2)") and rnd.random() < 0.4:
                        continue
                    cols.append(
                        Column(
                            name.replace(" ", "_")
                            .replace("(", "")
                            .replace(")", "")
                            .replace(",", "_")
                            .replace("[]", "_arr"),
                            name,
                            _value(rnd, name, odd),
                        )
                    )
            seq = len(txn.changes) + 1
            txn.changes.append(
                ChangeRecord(
                    op=op,
                    commit_lsn=txn.commit_lsn,
                    seq=seq,
                    xid=txn.commit_lsn,
                    ts=TS,
                    schema="public",
                    table=table,
                    change_lsn=txn.commit_lsn - 100 + seq,
                    columns=[] if op == "D" else cols,
                    identity=[Column("id", key_type, key)] if op in ("U", "D") else [],
                    pk=["id"],
                )
            )
        txns.append(txn)
    return txns


def _column_name(pg_type: str) -> str:
    return pg_type.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "_").replace("[]", "_arr")


def _held(rnd: random.Random, texts: list[str | None], pg_type: str) -> Any:
    """A column of a v2 file: text, or (at random) Arrow values for an integer type whose values
    all are integers of its width, or a boolean one whose values are all true/false, as capture
    lands them (landing v2 NATIVE_TYPES)."""
    import pyarrow as pa

    native = arrowfile.NATIVE_TYPES.get(pg_type)
    if native == "bool" and rnd.random() < 0.5 and all(v in (None, "true", "false") for v in texts):
        return pa.array([None if v is None else v == "true" for v in texts], pa.bool_())
    if (
        native not in (None, "bool")
        and rnd.random() < 0.5
        and all(v is None or re.fullmatch(r"-?[0-9]+", v) for v in texts)
    ):
        try:
            return pa.array([None if v is None else int(v) for v in texts], pa.type_for_alias(native))
        except (OverflowError, pa.ArrowInvalid):
            pass
    return pa.array(texts, pa.string())


def _write_snapshot(settings: LoaderSettings, seed: int, columns: list[str], odd: float, chunk: int) -> list[str]:
    """A snapshot of public.acct (integer key) and public.codes (text key, maybe empty) as landing v2
    files of ``chunk`` rows, below every position of ``_batch``'s transactions."""

    rnd = random.Random(seed)
    store = open_landing(settings)
    lsn, seq, names = 0x800, 0, []
    tables = [("acct", "integer", [str(k) for k in range(1, rnd.randint(0, 60) + 1)])]
    tables.append(("codes", "text", ['k"1', "k\\2", "k-3", "k4", "ü5"][: rnd.randint(0, 5)]))
    for t, (table, key_type, keys) in enumerate(tables):
        cols = [("id", key_type)] + [(_column_name(c), c) for c in columns]
        resync: dict[str, Any] | None = {"seq": seq + 1, "reason": f"snapshot of {table}"}
        seq += 1
        starts = list(range(0, len(keys), chunk)) or [0]
        for i, start in enumerate(starts):
            part = keys[start : start + chunk]
            values = [_held(rnd, part, key_type)]
            values += [_held(rnd, [_value(rnd, c, odd) for _ in part], c) for c in columns]
            last = t == len(tables) - 1 and i == len(starts) - 1
            header = arrowfile.SnapshotHeader(
                "public",
                table,
                lsn,
                lsn + 1,
                0,
                TS,
                ["id"],
                cols,
                rows=len(part),
                resync=resync,
                commit={"seq": seq + len(part) + 1} if last else None,
            )
            names.append(publish_arrow(store, header, seq + 1, values))
            seq += len(part)
            resync = None
    return names


def _as_text(df: Any) -> Any:
    """Every column as Spark's text of it (binary as hex): values such as infinity dates are out of
    Python's range, and Spark's text is exact for every type the history holds."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    return df.select(
        *[
            (
                F.hex(F.col(f"`{f.name}`"))
                if isinstance(f.dataType, BinaryType)
                else F.col(f"`{f.name}`").cast("string")
            ).alias(f.name)
            for f in df.schema.fields
        ]
    )


def _snapshot(spark: Any, settings: LoaderSettings) -> dict[str, Any]:
    names = TableNames(settings)
    out: dict[str, Any] = {}
    for table in (ACCT, CODES):
        ident = names.history(table)
        if spark.catalog.tableExists(ident):
            df = _as_text(spark.table(ident))
            out[table.qualified] = (df.columns, sorted(repr(tuple(r)) for r in df.collect()))
    out["rejects"] = sorted(repr(tuple(r)) for r in spark.table(names.rejects).drop("rejected_at").collect())
    out["ledger"] = sorted(
        repr(tuple(r)) for r in spark.table(names.ledger).select("file", "changes", "rejects").collect()
    )
    return out


def _first_parks(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` with each history table's park rows reduced to the position of its first."""
    out = dict(snapshot)
    for table in (ACCT, CODES):
        if table.qualified not in out:
            continue
        columns, rows = out[table.qualified]
        op, lsn, seq = columns.index("pg_operation"), columns.index("pg_lsn"), columns.index("pg_seq")
        parsed = [ast.literal_eval(r) for r in rows]  # the repr of a tuple of str/None
        parks = sorted((int(r[lsn]), int(r[seq])) for r in parsed if r[op] == "park")
        out[table.qualified] = (columns, [r for r, p in zip(rows, parsed, strict=True) if p[op] != "park"], parks[:1])
    return out


def _acct_insert(commit_lsn: int, seq: int, xid: int, key: int) -> ChangeRecord:
    """An insert of row ``key`` into public.acct (id, n)."""
    return ChangeRecord(
        op="I",
        commit_lsn=commit_lsn,
        seq=seq,
        xid=xid,
        ts=TS,
        schema="public",
        table="acct",
        columns=[Column("id", "integer", str(key)), Column("n", "text", f"v{key}")],
        pk=["id"],
    )


@pytest.fixture
def used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tables the driver path appended (the oracle must not pass by never using it)."""
    count: list[int] = []
    real = driver.commit_files

    def counting(*args: Any, **kwargs: Any) -> None:
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "commit_files", counting)
    return count


@settings(
    max_examples=int(os.environ.get("LOADER_LOAD_EXAMPLES", "9")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    columns=st.lists(st.sampled_from(OPTIONAL), max_size=5, unique=True),
    odd=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    text_keys=st.booleans(),
    max_changes=st.integers(2, 12),
    bound=st.sampled_from([ON.driver_max_bytes, ON.driver_max_bytes, 600, 2500]),
    landing_format=st.sampled_from(["jsonl", "changes", "tables", "tables/rows"]),
)
def test_driver_and_spark_paths_write_the_same_history(
    spark: Any,
    base_settings: LoaderSettings,
    tmp_path: Path,
    used: list[int],
    seed: int,
    columns: list[str],
    odd: float,
    text_keys: bool,
    max_changes: int,
    bound: int,
    landing_format: str,
) -> None:
    """``bound`` (load.driver_max_bytes): small ones cut the batch into several driver batches, and
    send a transaction longer than the bound to the Spark path. ``landing_format``: the files are
    landing v1 (gzip JSON lines), v2 change files (Arrow) or v3 (each table's changes in columns:
    these few changes in the records segments, read as a table's rows by the load's split; with
    "tables/rows" in rows segments of their own), for both paths."""
    from unittest import mock

    from loader.landing import tablefile

    min_rows = 1 if landing_format == "tables/rows" else tablefile.MIN_SEGMENT_ROWS
    landing_format = landing_format.split("/")[0]
    txns = _batch(seed, sorted(columns), odd, text_keys)
    with_driver = lake_settings(base_settings, tmp_path).model_copy(
        update={"load": LoadSettings(driver_max_bytes=bound)}
    )
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    results, batches = [], []
    for s in (with_driver, spark_only):
        with mock.patch.object(tablefile, "MIN_SEGMENT_ROWS", min_rows):
            write_files(s, txns[: len(txns) // 2], max_changes, landing_format)
        first = HistoryLoad(spark, s).run()
        with mock.patch.object(tablefile, "MIN_SEGMENT_ROWS", min_rows):
            write_files(s, txns[len(txns) // 2 :], max_changes, landing_format)  # a second batch onto existing tables
        second = HistoryLoad(spark, s).run()
        results.append(
            [
                (sorted(r.rows_per_table.items()), r.duplicates_skipped, r.rejects, sorted(r.parked))
                for r in (first, second)
            ]
        )
        batches.append(max(len(first.engines), len(second.engines)))
    if batches[0] <= 1:  # one batch per load, as the Spark path: the very same rows
        assert results[0] == results[1]
        assert _snapshot(spark, with_driver) == _snapshot(spark, spark_only)
    else:
        # Several batches where the Spark path had one (a small bound, or groups of files that are
        # not plain, each up to the end of its transaction, between plain ones): each batch with
        # rejects writes its own park row (and counts it), so parks compare by the table's first one.
        assert [r[1:] for r in results[0]] == [r[1:] for r in results[1]]
        assert _first_parks(_snapshot(spark, with_driver)) == _first_parks(_snapshot(spark, spark_only))


@pytest.mark.parametrize("landing_format", ["jsonl", "tables", "tables/rows"])
def test_the_oracle_used_the_driver_path(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, used: list[int], landing_format: str
) -> None:
    """A plain batch of every plain type is appended by the driver, with the Spark path's rows (v3
    files: by their columns, :class:`loader.load.driver.TablesBatch`)."""
    plain_types = [t for t, (plain, _) in VALUES.items() if plain]
    txns = _batch(7, plain_types, 0.0, text_keys=False)
    with_driver = lake_settings(base_settings, tmp_path).model_copy(update={"load": ON})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    from unittest import mock

    from loader.landing import tablefile

    min_rows = 1 if landing_format == "tables/rows" else tablefile.MIN_SEGMENT_ROWS
    for s in (with_driver, spark_only):
        with mock.patch.object(tablefile, "MIN_SEGMENT_ROWS", min_rows):
            write_files(s, txns, 5, landing_format.split("/")[0])
        HistoryLoad(spark, s).run()
    assert used, "the plain batch went to Spark"
    assert _snapshot(spark, with_driver) == _snapshot(spark, spark_only)


def test_a_backlog_above_the_memory_bound_loads_in_driver_batches(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, used: list[int]
) -> None:
    """Landing text beyond load.driver_max_bytes is loaded as several driver batches, each cut after
    a file ending a transaction; a damaged file sends its own transaction's files to the Spark path
    and no more; a transaction longer than the bound is still loaded by the driver, file by file.
    History, rejects and ledger as with the driver path off."""
    txns = []
    for t in range(9):
        txn = Txn(commit_lsn=0x1000 * (t + 1))
        for k in range(4 if t < 8 else 16):  # the last one longer than the bound: read file by file
            key = t * 4 + k
            txn.changes.append(_acct_insert(txn.commit_lsn, k + 1, t + 1, key))
        txns.append(txn)
    # 4 changes a file: each transaction is one file that takes its commit marker (complete).
    bounded = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=2000)})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    res = []
    for s in (bounded, spark_only):
        names = write_files(s, txns, 4)
        assert len(names) == 12 and all(n.endswith("_c.jsonl.gz") for n in names[:8] + names[-1:]), names
        store = open_landing(s)
        assert isinstance(store, LocalLandingStore)
        damaged = store.path / names[5]
        data = damaged.read_bytes()
        damaged.write_bytes(data[: len(data) - 12])  # cut short: the Spark path salvages its prefix
        res.append(HistoryLoad(spark, s).run())
    engines = res[0].engines
    assert sum(e.startswith("driver") for e in engines) >= 3, engines
    assert engines[-1] == "driver (4 files)", engines  # the long transaction, streamed
    assert [e.split(":")[0] for e in engines if e.startswith("spark")] == ["spark (1 files)"], engines
    assert used
    assert sorted(res[0].rows_per_table.items()) == sorted(res[1].rows_per_table.items())
    assert _snapshot(spark, bounded) == _snapshot(spark, spark_only)


def _bigint_txn(values: list[str]) -> Txn:
    """One transaction (at 0x1000) inserting rows 1, 2, ... of public.acct (id integer, n bigint)
    with ``values`` as n's texts."""
    txn = Txn(commit_lsn=0x1000)
    for seq, value in enumerate(values, start=1):
        columns = [Column("id", "integer", str(seq)), Column("n", "bigint", value)]
        txn.changes.append(ChangeRecord("I", 0x1000, seq, 1, TS, "public", "acct", columns=columns, pk=["id"]))
    return txn


def test_a_misfit_is_rejected_and_parked_by_the_driver(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, used: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value that does not fit: the driver appends the batch without it, writes it to the rejects
    table and parks the table, exactly as the Spark path does (history, rejects, ledger, results).
    A first run stopped between its rejects and its history commit writes no reject twice and
    still parks the table when run again."""
    txn = _bigint_txn(["5", "not a number", "7", "8.5"])
    with_driver = lake_settings(base_settings, tmp_path).model_copy(update={"load": ON})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    counting = driver.commit_files

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stopped before the history commit")

    write_files(with_driver, [txn], 10)
    monkeypatch.setattr(driver, "commit_files", stopped)
    with pytest.raises(RuntimeError, match="stopped"):
        HistoryLoad(spark, with_driver).run()
    monkeypatch.setattr(driver, "commit_files", counting)
    results = []
    for s in (with_driver, spark_only):
        if s is spark_only:
            write_files(s, [txn], 10)
        res = HistoryLoad(spark, s).run()
        results.append((res.rows_per_table, res.parked, [e.split(" ")[0] for e in res.engines]))
    assert used
    assert results[0][:2] == results[1][:2]
    assert results[0][2] == ["driver"] and results[1][2] == ["spark"]
    assert "2 changes quarantined" in results[0][1][ACCT.qualified]
    assert _snapshot(spark, with_driver) == _snapshot(spark, spark_only)
    assert len(_snapshot(spark, with_driver)["rejects"]) == 2
    parked = spark.sql(f"SHOW TBLPROPERTIES {TableNames(with_driver).history(ACCT)} ('loader.parked')").collect()
    assert "quarantined" in parked[0][1]
    # The park (at the transaction's start) is the append's smallest position: the driver learns of
    # it while writing, and its commit's summary says it as the Spark path's does.
    summaries = []
    for s in (with_driver, spark_only):
        names = TableNames(s)
        summary = open_catalog(s).load_table((names.history_ns, ACCT.iceberg_name)).current_snapshot().summary
        summaries.append(summary["loader.min-position"])
    assert summaries[0] == summaries[1] == ChangePosition(0x1000, 0).token()


@pytest.mark.parametrize("landing_format", ["jsonl", "tables"])
def test_a_misfit_in_a_streamed_transaction_keeps_every_data_file_in_position_order(
    spark: Any,
    base_settings: LoaderSettings,
    tmp_path: Path,
    used: list[int],
    landing_format: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transaction longer than load.driver_max_bytes is typed file by file as it is written (v1
    files and v3 files alike); a value that does not fit is found only then, and its park sorts
    first (the transaction's start).
    The park goes into a data file of its own: every data file of the commit is in position order
    inside itself (history is sorted by position), and history equals the Spark path's."""
    import pyarrow.parquet as pq

    txn = _bigint_txn(["not a number" if seq == 11 else str(seq * 3) for seq in range(1, 17)])
    streamed = lake_settings(base_settings, tmp_path)
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    names = write_files(streamed, [txn], 4, landing_format)
    write_files(spark_only, [txn], 4, landing_format)
    # A bound every file fits in and the four files together do not (Arrow columns of v3 files
    # weigh more than v1's text).
    store = open_landing(streamed)
    sizes = [driver._size(driver._read_file(store, LandingFile.parse(n))[0]) for n in names]  # type: ignore[arg-type]
    bound = max(sizes)
    assert sum(sizes) > bound, sizes
    streamed = streamed.model_copy(update={"load": LoadSettings(driver_max_bytes=bound)})
    built: list[int] = []

    class Counted(driver.StreamedPlainBatch):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            built.append(len(self.batch))

    monkeypatch.setattr(driver, "StreamedPlainBatch", Counted)
    engines = [HistoryLoad(spark, s).run().engines for s in (streamed, spark_only)]
    assert built == [4], built
    assert used and engines[0] == ["driver (4 files)"], engines  # streamed, file by file
    assert _snapshot(spark, streamed) == _snapshot(spark, spark_only)
    hist = open_catalog(streamed).load_table((TableNames(streamed).history_ns, ACCT.iceberg_name))
    files = [task.file.file_path for task in hist.scan().plan_files()]
    positions = []
    for path in files:
        with hist.io.new_input(path).open() as f:
            rows = pq.read_table(f, columns=["pg_lsn", "pg_seq"])
        pairs = list(zip(rows.column("pg_lsn").to_pylist(), rows.column("pg_seq").to_pylist(), strict=True))
        assert pairs == sorted(pairs), f"{path} is not in position order: {pairs}"
        positions.append(pairs)
    assert [(0x1000, 0)] in positions, positions  # the park, alone
    assert sum(len(p) for p in positions) == 16  # 15 rows and the park


@settings(
    max_examples=max(3, int(os.environ.get("LOADER_LOAD_EXAMPLES", "9")) * 5 // 9),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    columns=st.lists(st.sampled_from(OPTIONAL), max_size=5, unique=True),
    odd=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    chunk=st.integers(1, 40),
    then_stream=st.booleans(),
)
def test_driver_and_spark_paths_write_the_same_history_for_snapshot_files(
    spark: Any,
    base_settings: LoaderSettings,
    tmp_path: Path,
    used: list[int],
    seed: int,
    columns: list[str],
    odd: float,
    chunk: int,
    then_stream: bool,
) -> None:
    """Landing v2 snapshot chunks (resync markers, read rows, the commit marker), alone or followed
    by v1 streaming files in the same load: the same history, rejects and ledger either way."""
    txns = _batch(seed, sorted(columns), odd, text_keys=True) if then_stream else []
    with_driver = lake_settings(base_settings, tmp_path).model_copy(update={"load": ON})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    results, batches = [], []
    for s in (with_driver, spark_only):
        _write_snapshot(s, seed, sorted(columns), odd, chunk)
        write_files(s, txns, 5)
        r = HistoryLoad(spark, s).run()
        results.append((sorted(r.rows_per_table.items()), r.duplicates_skipped, r.rejects, sorted(r.parked), r.files))
        batches.append(len(r.engines))
    assert sorted(results[0][4]) == sorted(results[1][4])
    if batches[0] == batches[1]:  # the same batches: the very same rows
        assert results[0][:4] == results[1][:4]
        assert _snapshot(spark, with_driver) == _snapshot(spark, spark_only)
    else:
        # The stream's files in more batches than the Spark path's one (groups that are not plain,
        # each up to the end of its transaction, between plain ones): each batch with rejects
        # writes its own park row (and counts it), so parks compare by the table's first one.
        assert results[0][1:4] == results[1][1:4]
        assert _first_parks(_snapshot(spark, with_driver)) == _first_parks(_snapshot(spark, spark_only))


def test_a_plain_snapshot_is_loaded_by_the_driver(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, used: list[int]
) -> None:
    """Snapshot chunks of every plain type go the driver's way, with the Spark path's rows."""
    plain_types = [t for t, (plain, _) in VALUES.items() if plain]
    with_driver = lake_settings(base_settings, tmp_path).model_copy(update={"load": ON})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    for s in (with_driver, spark_only):
        _write_snapshot(s, 11, plain_types, 0.0, 7)
        HistoryLoad(spark, s).run()
    assert used, "the plain snapshot went to Spark"
    assert _snapshot(spark, with_driver) == _snapshot(spark, spark_only)


@pytest.mark.parametrize("odd", [0.0, 0.3], ids=["plain", "misfits"])
def test_a_snapshot_bigger_than_the_memory_bound_is_streamed(
    spark: Any,
    base_settings: LoaderSettings,
    tmp_path: Path,
    used: list[int],
    monkeypatch: pytest.MonkeyPatch,
    odd: float,
) -> None:
    """Snapshot chunks beyond load.driver_max_bytes still go the driver's way, file by file (the
    files not kept are read again), cut into several data files and row groups by their bytes:
    the same history as the Spark path's, in more than one file per table. Values that do not
    fit, found only as the files are typed while the table is written, leave the Spark path's
    rejects and park (after the snapshot's rows) in the same commit."""
    tiny = LoadSettings(driver_max_bytes=3000)
    monkeypatch.setattr(driver, "APPEND_FILE_ARROW_BYTES", 4000)
    columns = [t for t, (plain, _) in VALUES.items() if plain]
    streamed = lake_settings(base_settings, tmp_path).model_copy(update={"load": tiny})
    spark_only = lake_settings(base_settings, tmp_path).model_copy(update={"load": LoadSettings(driver_max_bytes=0)})
    results: list[Any] = []
    for s in (streamed, spark_only):
        _write_snapshot(s, 5, columns, odd, 9)
        r = HistoryLoad(spark, s).run()
        results.append((r.engines, r.rejects, r.parked))
    assert used and all(e.startswith("driver") for e in results[0][0]), f"the snapshot went to Spark: {results[0][0]}"
    assert results[0][1:] == results[1][1:]
    assert bool(results[0][1]) == bool(odd), results[0]  # the misfits case has rejects, the plain none
    assert _snapshot(spark, streamed) == _snapshot(spark, spark_only)
    if odd:  # most rows hold a value that does not fit: too few bytes left to cut
        return
    ident = TableNames(streamed).history(ACCT)
    files = spark.sql(f"SELECT count(*) FROM {ident}.files").collect()[0][0]
    assert files > 1, "one file: nothing was cut by its bytes"


def test_driver_appends_merge_manifests_as_iceberg_appends_do(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, used: list[int]
) -> None:
    """Loads every few seconds (follow mode) must not leave one manifest per commit: the driver's
    pyiceberg appends merge manifests past ``commit.manifest.min-count-to-merge``, as Iceberg's
    Java appends do by default."""
    from loader.lake.catalog import open_catalog

    s = lake_settings(base_settings, tmp_path)
    catalog = open_catalog(s)
    for t in range(12):
        txn = Txn(commit_lsn=0x1000 * (t + 1))
        txn.changes.append(_acct_insert(txn.commit_lsn, 1, t + 1, t))
        write_files(s, [txn], 4)
        HistoryLoad(spark, s).run()
        hist = catalog.load_table((s.catalog.history_namespace, ACCT.iceberg_name))
        if t == 0:
            with hist.transaction() as tx:
                tx.set_properties({"commit.manifest.min-count-to-merge": "4"})
    assert len(used) == 12, "not every load was the driver's"
    hist = catalog.load_table((s.catalog.history_namespace, ACCT.iceberg_name))
    assert hist.properties.get("commit.manifest-merge.enabled") == "true"
    manifests = hist.current_snapshot().manifests(hist.io)
    assert len(manifests) <= 4, f"{len(manifests)} manifests after 12 appends"
    assert hist.scan().to_arrow().num_rows == 12


@pytest.mark.parametrize("engine", ["driver", "spark"])
def test_a_table_whose_first_changes_are_deletes_is_typed_by_their_old_keys(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, engine: str
) -> None:
    """A table whose first loaded changes are deletes (rows from before capture began, or their
    inserts in a file still held back) has no change sending its columns: its key column is typed
    by the deletes' old keys, so history knows it and the merge builds the table's current state
    (empty) instead of skipping it; the columns the later changes send are added then."""
    import json

    from loader.lake.tables import PROP_PG_TYPES
    from loader.merge.current import CurrentMerge
    from tests.harness import TABLE, change, current_rows

    load = ON if engine == "driver" else LoadSettings(driver_max_bytes=0)
    s = lake_settings(base_settings, tmp_path).model_copy(update={"load": load})
    deletes = Txn(5000)
    for k in (1, 2):
        change(deletes, "D", None, old_id=k)
    write_files(s, [deletes], 10, format="changes")
    res = HistoryLoad(spark, s).run()
    assert res.engines and res.engines[0].startswith(engine), res.engines
    hist = open_catalog(s).load_table((s.catalog.history_namespace, TABLE.iceberg_name))
    assert json.loads(hist.properties[PROP_PG_TYPES]) == {"id": "integer"}
    (merged,) = CurrentMerge(spark, s).run().tables
    assert not merged.skipped_reason, merged
    assert current_rows(spark, s) == {}
    inserts = Txn(5001)
    change(inserts, "I", {"id": 3, "a": "x", "b": 7})
    change(inserts, "I", {"id": 1, "a": "y", "b": None})
    write_files(s, [inserts], 10, format="changes")
    HistoryLoad(spark, s).run()
    CurrentMerge(spark, s).run()
    assert current_rows(spark, s) == {3: ("x", 7), 1: ("y", None)}
