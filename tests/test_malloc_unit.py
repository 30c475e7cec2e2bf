"""loader/__init__.py's malloc tuning: blocks the load builds and drops group after group are
reused from the heap instead of mapped afresh (page faults are CPU time: 0.11 of 0.67 CPU-s per
1M changes before), and a process whose environment chose glibc's thresholds keeps them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

# 20 blocks of 8 MiB, each written whole then freed: the page faults that costs.
_CODE = """
import resource
import numpy as np
import loader
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    block = np.ones(1 << 20)
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(**env: str) -> int:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run([sys.executable, "-c", _CODE], env=run_env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_blocks_are_reused_not_faulted_in_again() -> None:
    pages = (8 << 20) // os.sysconf("SC_PAGE_SIZE")
    tuned = _faults()
    untuned = _faults(MALLOC_MMAP_THRESHOLD_=str(128 << 10))  # glibc's own default, chosen by the environment
    # Each block mapped and faulted in afresh (20 blocks: 10,320 faults here), against the first
    # block's pages at most, then reused (503 here).
    assert tuned <= 2 * pages and tuned * 5 <= untuned, (tuned, untuned)
