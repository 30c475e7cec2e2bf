"""Progress bars (tqdm) for long work: snapshots and resyncs, capture backlogs, loads, rebuilds.

Shown on stderr only when it is a terminal; in pipelines, tests and JSON logging they stay silent
(the logs and ``--json`` summaries say what happened).
"""

from __future__ import annotations

import sys
from typing import Any


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
