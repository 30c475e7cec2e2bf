"""P7 WAL held by the slot in follow mode while another database of the cluster writes, and at
the end of an initial snapshot taken while pgbench writes (``snapshot_under_load``).

A source database whose captured table (``public.a``) stays idle; ``loader run --follow`` as its
own process (heartbeat every ``BENCH_WAL_HEARTBEAT_S``, default 10 s, the documented default);
meanwhile another database of the same cluster writes ``BENCH_WAL_TOTAL_MB`` (default 1024) of
WAL evenly over ``BENCH_WAL_SECONDS`` (default 600), and the slot's retained WAL
(``pg_current_wal_lsn()`` minus the lesser of restart_lsn and confirmed_flush_lsn) is sampled every
``BENCH_WAL_SAMPLE_S`` (default 10). Without the heartbeat the slot would hold everything written
(the rival figure); with it, the slot holds what was written since the last heartbeat that passed a
running-transactions record (the background writer logs one every 15 s while WAL is written).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

import psycopg

from bench.common import (
    PG,
    Figure,
    env_int,
    lake_settings,
    loader_env,
    record,
    scratch_database,
    scratch_dir,
    stop_follower,
)

MB = 1024 * 1024
ROWS_PER_MB = 1000  # ~1 kB of WAL per row of the filler below


def _env(settings: object, heartbeat_s: float) -> dict[str, str]:
    return loader_env(
        settings,  # type: ignore[arg-type]
        LOADER_SOURCE__INCLUDE='["public.a"]',
        LOADER_SOURCE__HEARTBEAT_INTERVAL_S=str(heartbeat_s),
        LOADER_SPARK__SHUFFLE_PARTITIONS="2",
        LOADER_SPARK__DRIVER_MEMORY="1g",
    )


def _writer(dsn: str, total_mb: int, seconds: int, stop: threading.Event, written: list[int]) -> None:
    """Write ``total_mb`` of WAL evenly over ``seconds`` through a logged table (truncated now and then)."""
    per_second = max(1, total_mb * ROWS_PER_MB // max(1, seconds))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE filler (id int, v text)")
        start = time.monotonic()
        tick = 0
        while not stop.is_set() and tick < seconds:
            conn.execute(
                "INSERT INTO filler SELECT g, repeat(md5(g::text), 30) FROM generate_series(1, %s) g", (per_second,)
            )
            written[0] += per_second
            tick += 1
            if tick % 30 == 0:
                conn.execute("TRUNCATE filler")  # the other database's disk, not its WAL, stays small
            stop.wait(max(0.0, start + tick - time.monotonic()))


def _retained(slot: str) -> tuple[int, str | None]:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT (pg_current_wal_lsn() - least(restart_lsn, confirmed_flush_lsn))::bigint, wal_status"
            " FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"slot {slot} is gone")
    return int(row[0]), row[1]


def _wal_lsn() -> int:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def follow_mode() -> None:
    from loader.capture.heartbeat import HEARTBEAT_STATE
    from loader.landing.store import open_landing

    total_mb = env_int("BENCH_WAL_TOTAL_MB", 1024)
    seconds = env_int("BENCH_WAL_SECONDS", 600)
    sample_s = env_int("BENCH_WAL_SAMPLE_S", 10)
    heartbeat_s = float(os.environ.get("BENCH_WAL_HEARTBEAT_S", "10"))
    with (
        scratch_database("bench_wal_src") as src,
        scratch_database("bench_wal_other") as other,
        scratch_database("bench_wal_cat") as cat,
        scratch_dir("bench-wal-") as root,
    ):
        settings = lake_settings(root, cat, source_dsn=src)
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        env = _env(settings, heartbeat_s)
        cli = [sys.executable, "-m", "loader.cli"]
        subprocess.run([*cli, "capture"], env=env, check=True, capture_output=True)
        log = open(root / "follow.log", "w")  # noqa: SIM115 - closed below
        follower = subprocess.Popen([*cli, "run", "--follow"], env=env, stdout=log, stderr=subprocess.STDOUT)
        landing = open_landing(settings)
        stop = threading.Event()
        written = [0]
        samples: list[tuple[float, int, str | None]] = []
        try:
            deadline = time.monotonic() + 600
            first_seen = (landing.read_state(HEARTBEAT_STATE) or {}).get("seen_at")
            # Follow mode is up once its own first heartbeat came back.
            while (landing.read_state(HEARTBEAT_STATE) or {}).get("seen_at") == first_seen:
                if follower.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"follow mode did not start: see {root / 'follow.log'}")
                time.sleep(0.5)
            wal_start = _wal_lsn()
            writer = threading.Thread(target=_writer, args=(other, total_mb, seconds, stop, written), daemon=True)
            started = time.monotonic()
            writer.start()
            while time.monotonic() - started < seconds:
                time.sleep(max(0.0, started + (len(samples) + 1) * sample_s - time.monotonic()))
                held, status = _retained(settings.source.slot)
                samples.append((time.monotonic() - started, held, status))
                print(f"  t={samples[-1][0]:5.0f}s retained {held / MB:8.1f} MB  wal_status {status}", flush=True)
                if follower.poll() is not None:
                    raise RuntimeError(f"follow mode ended: see {root / 'follow.log'}")
            stop.set()
            writer.join(timeout=60)
            wal_written = _wal_lsn() - wal_start
        finally:
            stop.set()
            stop_follower(follower, log)
        held_values = [h for _, h, _ in samples]
        peak = max(held_values) / MB
        med = statistics.median(held_values) / MB
        print(
            f"  {wal_written / MB:.0f} MB of WAL written in {seconds}s by another database; slot retained: "
            f"median {med:.1f} MB, max {peak:.1f} MB over {len(samples)} samples"
        )
        record(
            Figure(
                "P7",
                f"WAL held by an idle slot in follow mode, {wal_written / MB:.0f} MB written elsewhere in {seconds}s",
                peak,
                "MB",
                rival=wal_written / MB,
                rival_what="held without a heartbeat (everything written)",
                ratio=(wal_written / MB) / peak if peak else None,
                goal="bounded: max <= 64 MB + one sample interval's writes",
                met=peak <= 64 + (wal_written / MB) * sample_s / seconds,
                extra={
                    "median_mb": med,
                    "samples": [(round(t, 1), h, s) for t, h, s in samples],
                    "heartbeat_s": heartbeat_s,
                },
            )
        )


def _snapshot_held(settings: object, env: dict[str, str], sample_s: float) -> tuple[float, int, int, float]:
    """``loader capture --snapshot`` as its own process while pgbench writes: (wall seconds, max
    retained WAL sampled during the copy, retained WAL at its end, WAL written meanwhile in MB)."""
    slot = settings.source.slot  # type: ignore[attr-defined]
    wal_start = _wal_lsn()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loader.cli", "capture", "--snapshot"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = 0
    while proc.poll() is None:
        time.sleep(sample_s)
        try:
            peak = max(peak, _retained(slot)[0])
        except RuntimeError:
            pass  # the slot is created a moment after the process starts
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"capture --snapshot failed:\n{out}")
    wall = time.monotonic() - started
    held = _retained(slot)[0]
    drained = [ln.strip() for ln in out.splitlines() if "snapshot of" in ln]
    print(f"    {drained[-1] if drained else out.strip().splitlines()[-1]}", flush=True)
    return wall, max(peak, held), held, (_wal_lsn() - wal_start) / MB


def snapshot_under_load() -> None:
    """The WAL the slot holds at the end of an initial snapshot of ``pgbench -i -s
    BENCH_WAL_SNAPSHOT_SCALE`` (default 100: 10M rows; 0 skips) taken while ``pgbench`` writes to the
    same tables: with the stream drained between chunks (``source.snapshot_drain_interval_s``, the
    default 10 s) and, as the rival, without (``-1``: the slot holds everything written during the copy)."""
    scale = env_int("BENCH_WAL_SNAPSHOT_SCALE", 100)
    if scale <= 0:
        return
    sample_s = float(os.environ.get("BENCH_WAL_SNAPSHOT_SAMPLE_S", "1"))
    with scratch_database("bench_walsnap_src") as src, scratch_database("bench_walsnap_cat") as cat:
        started = time.monotonic()
        subprocess.run(["pgbench", "-i", "-q", "-s", str(scale), src], check=True, capture_output=True)
        print(f"  pgbench -i -s {scale}: {scale * 100_000:,} accounts in {time.monotonic() - started:.0f}s", flush=True)
        figures: dict[str, tuple[float, int, int, float]] = {}
        for label, interval in (("drained", "10"), ("not drained", "-1")):
            with scratch_dir("bench-walsnap-") as root:
                settings = lake_settings(root, cat, source_dsn=src)
                env = loader_env(
                    settings,
                    LOADER_SOURCE__INCLUDE='["public.pgbench_*"]',
                    LOADER_SOURCE__SNAPSHOT_DRAIN_INTERVAL_S=interval,
                )
                writer = subprocess.Popen(
                    ["pgbench", "-n", "-c", "2", "-T", "3600", src],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    figures[label] = _snapshot_held(settings, env, sample_s)
                finally:
                    writer.terminate()
                    writer.wait(timeout=60)
                    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                        conn.execute(
                            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                            (settings.source.slot,),
                        )
            wall, peak, held, written = figures[label]
            print(
                f"  snapshot {label}: {wall:.1f}s, {written:.0f} MB of WAL written meanwhile; slot retained "
                f"{held / MB:.1f} MB at the end (max {peak / MB:.1f} MB sampled)",
                flush=True,
            )
        # The figure is the most the slot held while the command ran (sampled): at its end,
        # 'capture --snapshot' has also streamed and confirmed everything, drained or not.
        wall, peak, held, written = figures["drained"]
        rival = figures["not drained"][1] / MB
        record(
            Figure(
                "P7",
                f"WAL held during an initial snapshot of pgbench -s {scale} taken while pgbench writes (max sampled)",
                peak / MB,
                "MB",
                rival=rival,
                rival_what="the same snapshot with the stream not drained during the copy",
                ratio=rival / (peak / MB) if peak else None,
                goal="bounded: <= 64 MB plus one drain interval's writes",
                met=peak / MB <= 64 + written * 10 / max(wall, 1.0),
                extra={"wall_s": wall, "end_mb": held / MB, "written_mb": written},
            )
        )


def run() -> None:
    snapshot_under_load()
    follow_mode()


if __name__ == "__main__":
    run()
