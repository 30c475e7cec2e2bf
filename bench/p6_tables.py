"""P6 many tables: a follow-mode cycle over 200 tables with 5 changed vs a cycle over the 5 alone;
and the idle cycle over 200 tables (no change anywhere).

Both lakes are built from synthetic landing files (twenty rows per table), brought up to date by a
first cycle, then each timed cycle lands ``BENCH_P6_CHANGES`` changes in each of 5 tables (inserts
and updates) and runs ``Follower.cycle()`` (load + merge, in one Spark session, as follow mode
does). Medians of ``BENCH_REPEATS`` cycles. Goal: the 200-table cycle costs <= 2x the 5-table one;
an idle 200-table cycle < 1 s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    Figure,
    env_int,
    lake_settings,
    median_time,
    record,
    scratch_database,
    scratch_dir,
    write_landing,
)


def _initial(tables: int) -> Iterator[tuple[str, str, int]]:
    for t in range(tables):
        for k in range(20):
            yield "I", f"t{t:03d}", k


def _changes(changed: int, per_table: int, round_: int) -> Iterator[tuple[str, str, int]]:
    for t in range(changed):
        for i in range(per_table):
            if i % 2:
                yield "U", f"t{t:03d}", i % 20
            else:
                yield "I", f"t{t:03d}", 1000 + round_ * per_table + i


class _Lake:
    def __init__(self, spark: Any, root: Path, catalog: str, name: str, tables: int) -> None:
        from loader.follow import Follower

        self.settings = lake_settings(root, catalog, landing={"url": (root / f"landing-{name}").as_uri()})
        self.follower = Follower(self.settings, spark)
        self.tables = tables
        _, self.lsn = write_landing(self.settings, _initial(tables), 20 * tables, 1000)
        assert self.follower.cycle()  # the first cycle merges every table

    def changed_cycle(self, changed: int, per_table: int, round_: int) -> float:
        _, self.lsn = write_landing(self.settings, _changes(changed, per_table, round_), per_table, self.lsn)
        started = time.perf_counter()
        assert self.follower.cycle()
        return time.perf_counter() - started

    def idle_cycle(self) -> None:
        assert not self.follower.cycle()


def run() -> None:
    from loader.spark import get_spark

    many, changed = env_int("BENCH_P6_TABLES", 200), 5
    per_table = env_int("BENCH_P6_CHANGES", 1000)
    repeats = env_int("BENCH_REPEATS", 3)
    with scratch_database("bench_tables") as catalog, scratch_dir("bench-tables-") as root:
        spark = get_spark(lake_settings(root, catalog), "bench-tables")
        started = time.perf_counter()
        wide = _Lake(spark, root, catalog, "wide", many)
        print(f"  first cycle over {many} tables: {time.perf_counter() - started:.1f}s")
        narrow = _Lake(spark, root, catalog, "narrow", changed)
        t_wide, t_narrow = [], []
        for r in range(repeats):  # interleaved, so drift on a shared machine hits both alike
            t_wide.append(wide.changed_cycle(changed, per_table, r))
            t_narrow.append(narrow.changed_cycle(changed, per_table, r))
        w, n = statistics.median(t_wide), statistics.median(t_narrow)
        idle = median_time(wide.idle_cycle, max(5, repeats))
        print(f"  cycle, {changed} of {many} tables changed: {w:.2f}s; {changed} tables alone: {n:.2f}s")
        record(
            Figure(
                "P6",
                f"cycle over {many} tables, {changed} changed ({per_table} changes each)",
                w,
                "s",
                n,
                f"the same cycle over the {changed} tables alone",
                n / w,
                "cost <= 2x (ratio >= 0.5)",
                w <= 2 * n,
            )
        )
        record(Figure("P6i", f"idle cycle over {many} tables", idle, "s", goal="< 1 s", met=idle < 1.0))


if __name__ == "__main__":
    run()
