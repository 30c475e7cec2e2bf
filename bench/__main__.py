"""``make bench``: every benchmark in its own process (one Spark session each), then one table.

Each module's figures go to ``bench/out/<module>.json``; at the end they are printed as one table
(figure, ceiling or rival from the same run, ratio, goal), gathered in ``bench/out/results.json``
and drawn as ``bench/out/*.png``. ``BENCH_ONLY=p1,p3`` selects modules by name prefix; sizes and
repeats are set by the environment variables each module documents. ``python -m bench --report``
prints the table and redraws the plots from the figures saved by earlier runs (all modules).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

# Cheapest first, so a broken environment shows early; P1 (20M history) last.
MODULES = [
    "p3_capture",
    "p2_load",
    "p2_columnar",
    "p6_tables",
    "p4_freshness",
    "p1_merge",
    "capture_format",
    "p8_snapshot",
    "p7_wal",
    "p9_backlog",
    "p10_resync",
    "v1_verify",
]


def modules() -> list[str]:
    only = os.environ.get("BENCH_ONLY")
    return [n for n in MODULES if not only or n.startswith(tuple(only.split(",")))]


def main() -> int:
    from bench import report
    from bench.common import OUT, gather

    if "--report" in sys.argv[1:]:  # the table again from the saved figures of every module
        gather(MODULES)
        report.finish()
        return 0
    root = Path(__file__).resolve().parents[1]
    failed = []
    chosen = modules()
    for name in chosen:
        (OUT / f"{name}.json").unlink(missing_ok=True)
        print(f"== bench.{name}", flush=True)
        started = time.monotonic()
        code = (
            f"import bench.{name} as m; from bench.common import save_module_results;"
            f" m.run(); save_module_results({name!r})"
        )
        rc = subprocess.run([sys.executable, "-c", code], cwd=root).returncode
        if rc:  # one broken benchmark must not hide the others' figures
            failed.append(name)
        print(f"== bench.{name}: {time.monotonic() - started:.0f}s{'  FAILED' if rc else ''}\n", flush=True)
    gather(chosen)
    report.finish()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
