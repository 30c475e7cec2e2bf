"""Stage locks in the catalog's database: a holder whose process has ended (killed, or just
exited) is waited for while the server ends its session; a live holder is reported at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from loader import locks
from loader.config import LoaderSettings
from loader.errors import StageBusyError


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_holder_gone_only_for_a_loader_label_of_this_host_whose_process_has_ended() -> None:
    host = socket.gethostname()
    dead = _dead_pid()
    assert locks.holder_gone(f"lakehouse-loader load {host}:{dead}")
    assert not locks.holder_gone(f"lakehouse-loader load {host}:{os.getpid()}")  # this process
    assert not locks.holder_gone(f"lakehouse-loader load {host}:{os.getppid()}")  # alive
    assert not locks.holder_gone(f"lakehouse-loader load other-{host}:{dead}")  # another host: unknown
    assert not locks.holder_gone(f"psql {host}:{dead}")  # not a loader's session
    assert not locks.holder_gone("lakehouse-loader load")
    long_host = "h" * 60
    assert not locks.holder_gone(f"lakehouse-loader load {long_host}:{dead}"[:63])  # cut: pid unknown


def _hold(settings: LoaderSettings, stage: str, label: str) -> psycopg.Connection:
    conn = psycopg.connect(settings.catalog.conninfo(), autocommit=True, application_name=label)
    key = locks.advisory_key(conn, locks._lock_name(settings, stage))
    assert locks.try_advisory_lock(conn, key, 0)
    return conn


def test_a_lock_left_by_an_ended_process_is_waited_for_and_a_live_holder_is_reported(
    base_settings: LoaderSettings,
) -> None:
    settings = base_settings.model_copy(update={"locks": base_settings.locks.model_copy(update={"wait_seconds": 0})})
    # A session labelled as a loader of this host whose process is gone; the server ends it 1 s later.
    ended = _hold(settings, "merge", f"lakehouse-loader merge {socket.gethostname()}:{_dead_pid()}")
    closer = threading.Timer(1.0, ended.close)
    closer.start()
    started = time.monotonic()
    with locks.stage_lock(settings, "merge"):
        waited = time.monotonic() - started
    closer.join()
    assert 0.8 < waited < locks.LOCK_GRACE_S, waited
    # A live holder (this host, a running process): no grace, the holder is named.
    live = _hold(settings, "merge", f"lakehouse-loader merge {socket.gethostname()}:{os.getppid()}")
    try:
        started = time.monotonic()
        busy = rf"another 'loader merge' is running .*:{os.getppid()} since"
        with pytest.raises(StageBusyError, match=busy), locks.stage_lock(settings, "merge"):
            pass
        assert time.monotonic() - started < 1.0
    finally:
        live.close()
