"""The history load has an exactly-once effect: re-runs, crashes, redelivered and late files, rejects."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loader.config import LoaderSettings, LoadSettings
from loader.lake.tables import SourceTable, TableNames
from loader.landing.store import LandingFile, open_landing
from loader.load.history import HistoryLoad
from loader.lsn import ChangePosition
from loader.merge.current import CurrentMerge
from tests.harness import (
    TABLE,
    Txn,
    change,
    current_rows,
    generate,
    history_positions,
    lake_settings,
    load_and_merge,
    settings_env,
    write_files,
)


class Crash(Exception):
    pass


def _two_tables(settings: LoaderSettings) -> list[Txn]:
    """Transactions touching public.acct and public.other."""
    txns, _ = generate(random.Random(4), 6)
    other = Txn(commit_lsn=0x100000)
    for k in range(3):
        change(other, "I", {"id": k, "a": "x", "b": k})
    other.changes = [msgspec.structs.replace(c, table="other") for c in other.changes]
    return [*txns, other]


@pytest.mark.parametrize("path", ["spark", "driver"])
def test_load_twice_crash_midway_and_rerun(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    settings = lake_settings(base_settings, tmp_path)
    on = 0 if path == "spark" else 512 << 20
    settings = settings.model_copy(update={"load": LoadSettings(driver_max_bytes=on)})
    txns = _two_tables(settings)
    write_files(settings, txns, max_changes=3)
    total = sum(len(t.changes) for t in txns)
    names = TableNames(settings)

    # Crash after the first table's history append committed, before the second and the ledger.
    import loader.load.driver as driver

    owner, attr = (HistoryLoad, "_load_table") if path == "spark" else (driver, "commit_files")
    real = getattr(owner, attr)
    calls = {"n": 0}

    def crashing(*args: Any, **kwargs: Any) -> Any:
        if calls["n"] == 1:
            raise Crash("after one table")
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, crashing)
    monkeypatch.setattr(settings.spark, "table_threads", 1)  # one table after the other
    with pytest.raises(Crash):
        HistoryLoad(spark, settings).run()
    monkeypatch.setattr(owner, attr, real)
    assert calls["n"] == 1, "one table was appended before the crash"
    assert spark.table(names.ledger).count() == 0, "the ledger is written last"
    first = HistoryLoad(spark, settings).run()
    assert first.duplicates_skipped > 0, "the re-run saw the rows the crashed run had appended"
    hist = history_positions(spark, settings)
    other = spark.table(names.history(SourceTable("public", "other"))).count()
    assert len(hist) + other == total and len(set(hist)) == len(hist)
    # A second load finds nothing to do and commits nothing.
    snaps = spark.sql(f"SELECT count(*) FROM {names.history(TABLE)}.snapshots").first()[0]
    again = HistoryLoad(spark, settings).run()
    assert again.files == [] and spark.sql(f"SELECT count(*) FROM {names.history(TABLE)}.snapshots").first()[0] == snaps


def test_redelivered_overlapping_and_late_files(spark: Any, base_settings: LoaderSettings, tmp_path: Path) -> None:
    settings = lake_settings(base_settings, tmp_path)
    txns, model = generate(random.Random(9), 12)
    first, late, rest = txns[:5], txns[5:7], txns[7:]
    loaded = set(write_files(settings, first, max_changes=2))
    load_and_merge(spark, settings)
    # The same transactions land again in files with different boundaries (a capture re-run); a
    # file with the same boundaries is the same file (same name, same bytes), loaded already.
    again = [n for n in write_files(settings, first[2:], max_changes=3) if n not in loaded]
    assert again, "the re-run's files overlap the loaded ones"
    store = open_landing(settings)
    redelivered = sum(1 for n in again for r in store.read_records(n) if r.op in "IUD")
    write_files(settings, rest, max_changes=2)
    res = HistoryLoad(spark, settings).run()
    assert res.duplicates_skipped == redelivered
    CurrentMerge(spark, settings).run()
    # Files older than everything loaded arrive late: their changes still land once, and the
    # merge notices changes below its watermark and recomputes the table.
    write_files(settings, late, max_changes=2)
    res = HistoryLoad(spark, settings).run()
    assert res.loaded_through == max(LandingFile.parse(n).last for n in open_landing(settings).names()).token()  # type: ignore[union-attr]
    merge = CurrentMerge(spark, settings).run()
    assert "rebuilt" in merge.tables[0].note
    positions = history_positions(spark, settings)
    assert len(positions) == len(set(positions)) == sum(len(t.changes) for t in txns)
    assert current_rows(spark, settings) == model


def test_bad_landing_lines_and_untypeable_values_are_rejected(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from loader.cli import main

    settings = lake_settings(base_settings, tmp_path)
    good = Txn(commit_lsn=0x1000)
    change(good, "I", {"id": 1, "a": "fine", "b": 1})
    change(good, "I", {"id": 2, "a": "fine", "b": "not a number"})  # untypeable bigint
    write_files(settings, [good], max_changes=100)
    # A hand-written landing file: a truncated JSON line, an unknown version, a good change.
    store = open_landing(settings)
    ok = Txn(commit_lsn=0x2000)
    change(ok, "I", {"id": 3, "a": "ok", "b": 3})
    lines = [
        '{"v":1,"op":"I","lsn":8192,"se',
        '{"v":99,"op":"I","lsn":8192,"seq":2}',
        *[r.to_json() for r in ok.records()],
    ]
    name = LandingFile.name_for(ChangePosition(0x2000, 1), ChangePosition(0x2000, 3), True)
    spool = tmp_path / "hand.jsonl.gz"
    spool.write_bytes(gzip.compress("\n".join(lines).encode()))
    store.publish(spool, name)

    env = settings_env(settings)
    result = CliRunner().invoke(main, ["load"], env=env, catch_exceptions=False)
    # Rejects are quarantined, and the table is parked: a current table built past a lost change
    # would silently disagree with the source.
    assert result.exit_code == 5, result.output
    assert "3 rejected" in result.output and "parked: public.acct" in result.output
    all_rejects = spark.table(TableNames(settings).rejects).collect()
    assert len(all_rejects) == 3
    rejects = {r["line"]: r for r in all_rejects if r["landing_file"] == name}
    assert "undecodable" in rejects[1]["reason"] and rejects[1]["raw"] == lines[0]
    assert "version 99" in rejects[2]["reason"] and rejects[2]["pg_lsn"] == 8192
    typed = [r for r in all_rejects if r["source_table"] == "public.acct"]
    assert typed and "column b (bigint)" in typed[0]["reason"] and typed[0]["pg_lsn"] == 0x1000
    assert "not a number" in typed[0]["raw"]
    # History keeps every decodable change, and a park row at the start of the first bad transaction.
    hist = spark.table(TableNames(settings).history(SourceTable("public", "acct")))
    assert sorted(r["id"] for r in hist.where("pg_operation = 'insert'").collect()) == [1, 3]
    parks = hist.where("pg_operation = 'park'").collect()
    assert parks and min((p["pg_lsn"], p["pg_seq"]) for p in parks) == (0x1000, 0)
    merge = CurrentMerge(spark, settings).run()
    assert "public.acct" in merge.parked and "resync" in merge.parked["public.acct"]
    assert not current_rows(spark, settings), "nothing of the bad transaction or after it is applied"
    # Re-running quarantines nothing twice, and the table stays parked until a resync.
    result = CliRunner().invoke(main, ["load"], env=env, catch_exceptions=False)
    assert result.exit_code == 0 and spark.table(TableNames(settings).rejects).count() == 3
    assert "public.acct" in CurrentMerge(spark, settings).run().parked
