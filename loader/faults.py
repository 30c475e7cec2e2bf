"""Fault injection for crash tests: SIGKILL this process at a named point.

``LOADER_FAULT=<point>`` (or ``<point>@<n>`` for the n-th time the point is reached) makes
:func:`checkpoint` kill the process with SIGKILL right there, as the kernel or an operator would:
no cleanup, no finally blocks. ``LOADER_PAUSE=<point>:<seconds>`` holds the process there instead
(overlap tests start a second process while the first holds its locks). Unset (always, outside
tests), a checkpoint is two dict lookups.
The points are named in the code where they matter (between a file's publication and the slot's
advance, between a history append and the ledger, between a MERGE commit and its bookkeeping...).
"""

from __future__ import annotations

import os
import signal
import time

_hits: dict[str, int] = {}


def checkpoint(point: str) -> None:
    pause = os.environ.get("LOADER_PAUSE")
    if pause:
        name, _, seconds = pause.partition(":")
        if name == point:
            time.sleep(float(seconds or 10))
    spec = os.environ.get("LOADER_FAULT")
    if not spec:
        return
    name, _, nth = spec.partition("@")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
