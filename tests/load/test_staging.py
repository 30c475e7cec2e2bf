"""The driver load's groups are written as they are typed and committed together
(loader.load.staging): one commit per table and one ledger commit for a backlog of groups, the
same history as a commit per group, and the groups written before an error committed."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from loader.config import LoaderSettings, LoadSettings
from loader.lake.catalog import open_catalog
from loader.lake.tables import LEDGER_NAME, TableNames
from loader.load.history import HistoryLoad
from tests.harness import TABLE, generate, history_positions, lake_settings, write_files

# A few hundred bytes of landing text a group: a backlog of 40 transactions makes many groups.
BOUND = 1500


def _commits(settings: LoaderSettings) -> tuple[int, int]:
    """Snapshots of the history table and of the ledger."""
    names = TableNames(settings)
    catalog = open_catalog(settings)
    hist = catalog.load_table((names.history_ns, TABLE.iceberg_name))
    ledger = catalog.load_table((names.loader_ns, LEDGER_NAME))
    return len(hist.metadata.snapshots), len(ledger.metadata.snapshots)


def _ledger_files(spark: Any, settings: LoaderSettings) -> set[str]:
    return {r[0] for r in spark.table(TableNames(settings).ledger).select("file").collect()}


def test_a_backlog_of_groups_is_one_commit_per_table_and_one_ledger_commit(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path
) -> None:
    """Many driver groups, committed once (an interval longer than the load) or each on its own
    (``commit_interval_s = 0``): the same history rows, ledger rows and results; one snapshot per
    table instead of one per group."""
    txns, _ = generate(random.Random(12), 40)
    results, commits, history, ledgers = [], [], [], []
    for interval in (600.0, 0.0):
        s = lake_settings(base_settings, tmp_path / str(interval))
        s = s.model_copy(update={"load": LoadSettings(driver_max_bytes=BOUND, commit_interval_s=interval)})
        write_files(s, txns, 3)
        res = HistoryLoad(spark, s).run()
        assert all(e.startswith("driver") for e in res.engines), res.engines
        results.append((sorted(res.rows_per_table.items()), sorted(res.files), res.loaded_through, len(res.engines)))
        commits.append(_commits(s))
        history.append(sorted(history_positions(spark, s)))
        ledgers.append(_ledger_files(spark, s))
    groups = results[0][3]
    assert groups >= 4, f"too few groups to tell: {groups}"
    assert results[0] == results[1]
    assert history[0] == history[1] and len(set(history[0])) == len(history[0])
    assert ledgers[0] == ledgers[1] == set(results[0][1])
    assert commits[0] == (1, 1), commits
    assert commits[1] == (groups, groups), commits


def test_the_groups_written_before_an_error_are_committed(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load failing while it types a later group commits the groups written whole before it
    (history and ledger), then raises; the next load takes the rest, exactly once, on the driver
    (nothing of the failed group was committed)."""
    txns, _ = generate(random.Random(13), 40)
    load = LoadSettings(driver_max_bytes=BOUND, commit_interval_s=600)
    s = lake_settings(base_settings, tmp_path).model_copy(update={"load": load})
    landed = write_files(s, txns, 3)
    real = HistoryLoad._driver_prepare
    calls = {"n": 0}

    def failing(self: HistoryLoad, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("typing the third group failed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HistoryLoad, "_driver_prepare", failing)
    with pytest.raises(RuntimeError, match="third group"):
        HistoryLoad(spark, s).run()
    monkeypatch.setattr(HistoryLoad, "_driver_prepare", real)
    kept = _ledger_files(spark, s)
    assert kept and len(kept) < len(landed), "the groups before the error were not committed"
    assert _commits(s) == (1, 1)
    before = history_positions(spark, s)
    res = HistoryLoad(spark, s).run()
    assert all(e.startswith("driver") for e in res.engines), res.engines
    assert res.duplicates_skipped == 0
    assert _ledger_files(spark, s) == set(landed)
    after = history_positions(spark, s)
    assert len(set(after)) == len(after) == sum(len(t.changes) for t in txns)
    assert set(before) < set(after)
