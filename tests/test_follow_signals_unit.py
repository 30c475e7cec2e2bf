"""Follow mode's stop on SIGTERM/SIGINT: safe whatever the main thread holds when the signal comes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

# The main thread holds an event's lock (as inside Event.set(), where a SIGTERM once hung a
# follower for good) when the signal arrives; the events are set once it lets go, and the block's
# end restores the handler before it.
_CHILD = textwrap.dedent(
    """
    import os, signal, threading, time
    from loader.follow import stop_on_signals

    stop, wake = threading.Event(), threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(stop, wake):
        with wake._cond:  # what wake.set() holds while it notifies
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler has run by now, inside the lock
        assert stop.wait(5) and wake.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before
    print("stopped")
    """
)


def test_a_signal_while_the_main_thread_holds_an_events_lock_stops_the_follower() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stdout + out.stderr
