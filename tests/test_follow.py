"""Follow mode as a real process: changes visible within the interval, SIGTERM stops it cleanly,
SIGKILL loses nothing, a second follower is refused; then maintenance and snapshot expiry never
break watermarks or late-file detection. Every test ends with the oracles."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from loader.config import LoaderSettings
from loader.maintain import Maintenance
from loader.verify import reconcile
from loader.workload import BankWorkload
from tests.harness import (
    Cluster,
    Env,
    cluster_env,
    cluster_settings,
    finish,
    hold_back_landing_files,
    landing_names,
    loader_process,
    return_landing_files,
)
from tests.oracle import assert_history_matches, assert_no_duplicate_positions

KEYS = {
    "public.customers": ["customer_id"],
    "public.accounts": ["account_id"],
    "public.transactions": ["transaction_id"],
}
INTERVAL = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def visible(env: Env, table: str, key: int) -> bool:
    from pyiceberg.exceptions import NoSuchTableError

    from loader.lake.catalog import open_catalog
    from loader.lake.tables import SourceTable

    c = env.settings.catalog
    try:
        t = open_catalog(env.settings).load_table((c.current_namespace, SourceTable.parse(table).iceberg_name))
    except NoSuchTableError:
        return False
    return bool(t.scan(row_filter=f"id = {key}", selected_fields=("id",)).to_arrow().num_rows)


def wait_until(predicate: object, timeout: float, process: object = None) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        if process is not None and process.poll() is not None:  # type: ignore[attr-defined]
            raise AssertionError("the follower exited")
        time.sleep(0.2)
    raise AssertionError(f"not true within {timeout}s")


def test_follow_mode_freshness_and_sigterm(env: Env) -> None:
    env.sql("CREATE TABLE public.events (id int PRIMARY KEY, v text)")
    wl = BankWorkload(env.settings.source.dsn, seed=41)
    wl.create_schema()
    env.capture()
    port = free_port()
    follower = loader_process(env, "run", "--follow", "--interval", str(INTERVAL), "--metrics-port", str(port))
    try:
        # The first cycle merges every table (JVM start included); then each change shows up within
        # the interval plus a cycle's work (a margin for a shared 2-core machine).
        env.sql("INSERT INTO public.events VALUES (0, 'first')")
        wait_until(lambda: visible(env, "public.events", 0), 180, follower)
        delays = []
        for i in range(1, 6):
            env.sql(f"INSERT INTO public.events VALUES ({i}, 'x')")
            delays.append(wait_until(lambda i=i: visible(env, "public.events", i), INTERVAL + 30, follower))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'loader_freshness_seconds{table="public.events"}' in metrics
        assert "loader_changes_total" in metrics and "loader_last_success_timestamp_seconds" in metrics
        # One follower per catalog: a second one is refused at once.
        rc, out = finish(loader_process(env, "run", "--follow"), timeout=300)
        assert rc == 75 and "another 'loader load' is running" in out, out
        wl.run(40)
        follower.send_signal(signal.SIGTERM)
        rc, out = finish(follower, timeout=300)
        assert rc == 0, out
        assert "follow:" in out
        # Each working cycle logs what it loaded and merged, and how long each took.
        assert re.search(r"cycle: loaded \d+ changes from \d+ files in [\d.]+s, merged \d+ tables in [\d.]+s", out), out
    except AssertionError as exc:
        follower.kill()
        raise AssertionError(f"{exc}\nfollower output:\n{follower.communicate()[0][-6000:]}") from None
    finally:
        if follower.poll() is None:
            follower.kill()
    env.run_all()
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)
    print(f"follow mode: commit -> visible in current, {len(delays)} changes: {', '.join(f'{d:.1f}s' for d in delays)}")


# Where a follower is killed (LOADER_FAULT, loader.faults): in the capture thread after a run
# landed files, and in a cycle after the load committed and after the merge committed. The second
# time each is reached: the first cycle of a start merges every table.
FOLLOW_KILL_POINTS = ["follow-after-capture@2", "follow-after-load@2", "follow-after-merge@2"]


@pytest.mark.parametrize("point", FOLLOW_KILL_POINTS)
def test_a_follower_killed_at_a_point_restarts_and_converges(env: Env, point: str) -> None:
    """SIGKILL in the middle of a workload at a chosen point; the next follower alone brings
    current and history to the source (nothing lost, nothing doubled)."""
    env.sql("CREATE TABLE public.events (id int PRIMARY KEY, v text)")
    wl = BankWorkload(env.settings.source.dsn, seed=43)
    wl.create_schema()
    env.capture()
    killed = loader_process(env, "run", "--follow", "--interval", str(INTERVAL), LOADER_FAULT=point)
    writing = threading.Event()
    writing.set()

    def write() -> None:  # until the point is reached, however long the JVM takes to start
        while writing.is_set():
            wl.run(5)
            time.sleep(0.3)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        rc, out = finish(killed, timeout=600)
    finally:
        writing.clear()
        writer.join()
        if killed.poll() is None:
            killed.kill()
    assert rc == -signal.SIGKILL, f"{point} was not reached (exit {rc}):\n{out[-4000:]}"
    wl.run(40)
    restarted = loader_process(env, "run", "--follow", "--interval", str(INTERVAL))
    try:
        env.sql("INSERT INTO public.events VALUES (100, 'last')")  # the source's last change
        wait_until(lambda: visible(env, "public.events", 100), 300, restarted)
        restarted.send_signal(signal.SIGTERM)
        rc, out = finish(restarted, timeout=300)
        assert rc == 0, out
    finally:
        if restarted.poll() is None:
            restarted.kill()
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def test_maintenance_and_snapshot_expiry_keep_watermarks_and_late_files(env: Env) -> None:
    """Many cycles, compaction and expiry of every snapshot but the last; then a landing file that
    arrives late (listed after later files were merged) is still detected and merged."""
    env.configure("source", max_changes_per_file=30)
    wl = BankWorkload(env.settings.source.dsn, seed=42)
    wl.create_schema()
    env.capture()
    for _ in range(6):
        wl.run(15)
        env.run_all()
    env.assert_reconciled()
    # Hold one landing file back, as a lagging copy or listing would.
    wl.run(30)
    env.capture()
    held = hold_back_landing_files(env)
    wl.run(20)
    env.run_all()
    assert not all(r.ok for r in env.reconcile()), "the held-back file's changes are missing"
    # Compaction, then expiry of every snapshot but the last (as an operator would do).
    Maintenance(env.spark, env.settings).run(expire=False, orphans=False)
    env.configure("maintenance", snapshot_retention_hours=0, retain_last=1)
    report = Maintenance(env.spark, env.settings).run(orphans=False)
    assert any(t.expired_snapshots for t in report.tables)
    for kind in ("history", "current"):
        for table in KEYS:
            ident = env.names.history(_st(table)) if kind == "history" else env.names.current(_st(table))
            assert env.spark.sql(f"SELECT count(*) FROM {ident}.snapshots").first()[0] == 1
    status = env.status()
    assert status.loaded is not None and all(t.merged for t in status.tables if t.primary_key)
    # The late files arrive: the merge still sees them (a counter property, not a snapshot walk).
    return_landing_files(env, held)
    _, load, merge = env.run_all()
    assert {f.name for f in held} <= set(load.files)
    assert any("late changes" in t.note for t in merge.tables)
    env.assert_reconciled()
    assert_no_duplicate_positions(env)
    for table, key in KEYS.items():
        assert_history_matches(env, wl.log, table, key)


def _st(table: str) -> object:
    from loader.lake.tables import SourceTable

    return SourceTable.parse(table)


def test_a_cycle_first_lands_what_was_committed_before_it(env: Env) -> None:
    """``capture_now`` returns only after a capture run that began after the call: every
    transaction committed before it is landed, though the timed runs pause for an hour."""
    from loader.follow import Follower
    from loader.landing.store import open_landing

    env.sql("CREATE TABLE public.asked (id int PRIMARY KEY)")
    env.capture()
    env.configure("follow", capture_interval_s=3600.0)
    follower = Follower(env.settings, env.spark)
    assert not follower.capture_now(5)  # no capture thread: nothing to ask, no wait
    thread = threading.Thread(target=follower._capture_loop, daemon=True)
    follower._capture_thread = thread
    thread.start()
    store = open_landing(env.settings)

    def landed_ids() -> set[int]:
        return {
            int(c.value)
            for f in store.files()
            for r in store.read_records(f.name)
            if r.table == "asked" and r.op == "I"
            for c in r.columns
            if c.name == "id" and c.value is not None
        }

    try:
        time.sleep(1)  # the thread's first (timed) run is over; the next one is an hour away
        for i in range(3):
            env.sql(f"INSERT INTO public.asked VALUES ({i})")
            assert follower.capture_now(60)
            assert landed_ids() == set(range(i + 1))
        # Stopping (SIGTERM sets both) ends a wait at once, not after its timeout.
        waited: list[float] = []

        def ask() -> None:
            started = time.monotonic()
            follower.capture_now(300)
            waited.append(time.monotonic() - started)

        asker = threading.Thread(target=ask)
        asker.start()
        follower.stop.set()  # as the signal handler does, while the cycle waits
        follower._wake.set()
        asker.join(timeout=120)
        assert waited and waited[0] < 60, waited
    finally:
        follower.stop.set()
        follower._wake.set()
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert not follower.capture_now(5)  # the thread has ended: no wait


def test_follow_rides_through_a_database_restart(tmp_path: Path) -> None:
    """Source and catalog on one PostgreSQL, restarted while a load waits inside a cycle: the capture
    thread meets the source down, the load meets the catalog down inside Spark (the Iceberg JDBC
    catalog's exception through py4j); the follower logs both, keeps cycling, and catches up."""
    cluster = Cluster()
    proc = None
    try:
        settings = cluster_settings(cluster, tmp_path)
        src = settings.source.dsn
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
        env = cluster_env(settings, tmp_path, LOADER_PAUSE="load-locked:4")
        proc = subprocess.Popen(
            [sys.executable, "-m", "loader.cli", "run", "--follow", "--interval", "0.5"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        with psycopg.connect(src, autocommit=True) as conn:
            wait_until(lambda: conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0], 120, proc)
            conn.execute("INSERT INTO public.t SELECT g, 'a' FROM generate_series(1, 20) g")
        wait_until(lambda: visible_in(settings, 20), 180, proc)
        landing = tmp_path / "landing" / settings.source.slot
        before = len(landing_names(landing))
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("INSERT INTO public.t SELECT g, 'b' FROM generate_series(21, 40) g")
        wait_until(lambda: len(landing_names(landing)) > before, 60, proc)
        cluster.stop()  # the next cycle's load is paused at load-locked: it resumes against a stopped catalog
        time.sleep(8)
        cluster.start()
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("INSERT INTO public.t SELECT g, 'c' FROM generate_series(41, 60) g")
            conn.execute("UPDATE public.t SET v = 'd' WHERE id % 7 = 0")
        try:
            wait_until(lambda: visible_in(settings, 60), 180, proc)
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate()[0]) from None
        results = reconcile(settings)
        assert [(r.table, r.ok) for r in results] == [("public.t", True)], [r.line() for r in results]
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, timeout=120)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.close()
    assert code == 0, out
    assert re.search(r"capture will retry: the source database \S+ is unavailable", out), out
    assert re.search(r"cycle will retry: the catalog database \S+ is unavailable", out), out
    assert "Traceback" not in out, out


def visible_in(settings: LoaderSettings, rows: int) -> bool:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from sqlalchemy.exc import OperationalError

    from loader.lake.catalog import open_catalog, row_count

    try:
        t = open_catalog(settings).load_table((settings.catalog.current_namespace, "public__t"))
    except (NoSuchTableError, NoSuchNamespaceError):
        return False
    except OperationalError:  # this test's own pooled connection, cut by the restart: ask again
        return False
    t.refresh()
    return row_count(t) == rows
