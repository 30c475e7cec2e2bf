"""Progress bars (tqdm) for long work: snapshots and resyncs, capture backlogs, loads, rebuilds.

Shown on stderr only when it is a terminal; in pipelines, tests and JSON logging they stay silent
(the logs and ``--json`` summaries say what happened).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

T = TypeVar("T")


def bar(total: float | None, desc: str, unit: str = "it", **kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        leave=False,
        dynamic_ncols=True,
        disable=not sys.stderr.isatty(),
        file=sys.stderr,
        **kwargs,
    )


def each_table(items: list[Any], fn: Callable[[Any], T], threads: int, desc: str, unit: str = "tables") -> list[T]:
    """``fn`` over ``items`` (one table each), ``threads`` at a time, results in input order.

    Each table's work is a few small Spark jobs and an Iceberg commit, mostly scheduling and commit
    latency, so several tables at once keep the cores busy (PySpark pins each Python thread to its
    own JVM thread: jobs, thread-local commit properties and callbacks stay per table). The first
    failure cancels the tables not started, waits for the running ones (each commits whole or not
    at all), and is raised; nothing after the loop (the load's ledger) runs.
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in bar(len(items), desc, unit, iterable=items)]
    results: dict[int, T] = {}
    with bar(len(items), desc, unit) as progress, ThreadPoolExecutor(threads, thread_name_prefix=desc) as pool:
        futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
        try:
            for done in as_completed(futures):
                results[futures[done]] = done.result()
                progress.update(1)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] for i in range(len(items))]
