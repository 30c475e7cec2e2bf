"""Run every benchmark module's ``run()`` in turn (``BENCH_ONLY=merge_`` selects by name prefix)."""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from pathlib import Path


def modules() -> list[str]:
    here = Path(__file__).resolve().parent
    names = sorted(p.stem for p in here.glob("*.py") if p.stem.startswith(("capture_", "merge_")))
    only = os.environ.get("BENCH_ONLY")
    return [n for n in names if not only or n.startswith(tuple(only.split(",")))]


def main() -> int:
    failed = []
    for name in modules():
        print(f"== bench.{name}", flush=True)
        started = time.monotonic()
        try:
            importlib.import_module(f"bench.{name}").run()
        except Exception:  # one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
        print(f"== bench.{name}: {time.monotonic() - started:.0f}s\n", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
