"""What every benchmark shares: the figure registry (one table, JSON, plots), settings for a
throwaway catalog and landing area, synthetic landing files, and timing helpers.

A figure is one measured number with the ceiling or rival measured in the same run, their ratio and
the goal it is held to. ``python -m bench`` prints them all as one table at the end, writes
``bench/out/results.json`` and draws ``bench/out/*.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from loader.config import LoaderSettings
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import LandingWriter, open_landing, stream_landing_format

PG = os.environ.get("LOADER_BENCH_PG", os.environ.get("LOADER_TEST_PG", "postgresql://postgres@127.0.0.1:25433"))
OUT = Path(__file__).resolve().parent / "out"
TS = "2024-01-31 12:00:00.123456+00"


@dataclass
class Figure:
    """One line of the bench table."""

    id: str
    what: str
    value: float
    unit: str
    rival: float | None = None  # the ceiling or rival on the same work, same unit
    rival_what: str = ""
    ratio: float | None = None  # higher is better
    goal: str = ""
    met: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


FIGURES: list[Figure] = []
SERIES: dict[str, Any] = {}  # data for the plots (bench.report)


def record(fig: Figure) -> Figure:
    FIGURES.append(fig)
    ratio = f"  ratio {fig.ratio:.2f}" if fig.ratio is not None else ""
    rival = f"  vs {fig.rival:,.2f} {fig.unit} ({fig.rival_what})" if fig.rival is not None else ""
    print(f"  [{fig.id}] {fig.what}: {fig.value:,.2f} {fig.unit}{rival}{ratio}  goal {fig.goal}", flush=True)
    return fig


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


@contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """A new database on the bench PostgreSQL (dropped after): its DSN."""
    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        # What an interrupted earlier run left behind: its slots (named alike) and databases.
        pattern = prefix.replace("_", "\\_") + "\\_%"
        conn.execute(
            "SELECT pg_drop_replication_slot(s.slot_name) FROM pg_replication_slots s"
            " JOIN pg_database d ON d.oid = s.datoid WHERE d.datname LIKE %s AND NOT s.active",
            (pattern,),
        )
        for (old,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (pattern,)).fetchall():
            conn.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
        conn.execute(f"CREATE DATABASE {db}")
    try:
        yield f"{PG}/{db}"
    finally:
        try:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (db,)
                )
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        except psycopg.Error:
            pass


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if os.environ.get("BENCH_KEEP"):
            print(f"  kept {root} (BENCH_KEEP)")
        else:
            shutil.rmtree(root, ignore_errors=True)


def lake_settings(root: Path, catalog_dsn: str, source_dsn: str | None = None, **extra: Any) -> LoaderSettings:
    """Settings for a fresh lake under ``root`` with its JDBC catalog in ``catalog_dsn``."""
    uid = uuid.uuid4().hex[:6]
    doc: dict[str, Any] = {
        "catalog": {
            "name": "bench",
            "uri": catalog_dsn,
            "warehouse": (root / "warehouse").as_uri(),
            "history_namespace": f"h_{uid}",
            "current_namespace": f"c_{uid}",
            "loader_namespace": f"l_{uid}",
        },
        "landing": {"url": (root / "landing").as_uri()},
        "spark": {"shuffle_partitions": env_int("BENCH_SHUFFLE_PARTITIONS", 4), "driver_memory": "4g"},
    }
    if source_dsn is not None:
        doc["source"] = {"dsn": source_dsn, "slot": f"bench_{uid}"}
    for key, value in extra.items():
        doc.setdefault(key, {}).update(value)
    return LoaderSettings.model_validate(doc)


def loader_env(settings: LoaderSettings, **variables: str) -> dict[str, str]:
    """The environment of a ``loader`` command run as its own process on ``settings``' lake
    (source, landing area, catalog), plus ``variables`` (``LOADER_*`` names)."""
    s = settings
    env = dict(os.environ)
    env.update(
        {
            "LOADER_LANDING__URL": s.landing.url,
            "LOADER_CATALOG__NAME": s.catalog.name,
            "LOADER_CATALOG__URI": s.catalog.uri,
            "LOADER_CATALOG__WAREHOUSE": s.catalog.warehouse,
            "LOADER_CATALOG__HISTORY_NAMESPACE": s.catalog.history_namespace,
            "LOADER_CATALOG__CURRENT_NAMESPACE": s.catalog.current_namespace,
            "LOADER_CATALOG__LOADER_NAMESPACE": s.catalog.loader_namespace,
        }
    )
    if s.source.dsn:
        env.update({"LOADER_SOURCE__DSN": s.source.dsn, "LOADER_SOURCE__SLOT": s.source.slot})
    env.update(variables)
    return env


ACCOUNT_COLUMNS = [
    ("id", "bigint"),
    ("customer_id", "bigint"),
    ("balance", "numeric(18,2)"),
    ("status", "text"),
    ("opened_at", "timestamp with time zone"),
    ("note", "text"),
]


def account_change(op: str, key: int, lsn: int, seq: int, table: str = "accounts") -> ChangeRecord:
    """A change of a six-column keyed table (the shape of the capture benchmarks)."""
    values = [
        str(key),
        str(key * 7 % 1_000_003),
        f"{key % 10_000_000}.{lsn % 100:02d}",
        ("open", "closed", "frozen")[lsn % 3],
        "2023-05-01 08:30:00+00",
        None if lsn % 2 else f"note {lsn % 1000}",
    ]
    identity = [Column("id", "bigint", str(key))] if op in ("U", "D") else []
    columns = [] if op == "D" else [Column(n, t, v) for (n, t), v in zip(ACCOUNT_COLUMNS, values, strict=True)]
    return ChangeRecord(
        op, lsn, seq, lsn, TS, "public", table, lsn * 64 + seq, columns=columns, identity=identity, pk=["id"]
    )


def write_landing(
    settings: LoaderSettings, changes: Iterator[tuple[str, str, int]], txn_rows: int, first_lsn: int
) -> tuple[int, int]:
    """Land synthetic changes ``(op, table, key)`` in transactions of ``txn_rows``, in capture's
    landing format (``source.stream_format``): (changes, next LSN)."""
    writer = LandingWriter(
        open_landing(settings),
        settings.source.max_changes_per_file,
        format=stream_landing_format(settings.source.stream_format),
    )
    lsn, seq, n = first_lsn, 0, 0
    for op, table, key in changes:
        seq += 1
        writer.write(account_change(op, key, lsn, seq, table))
        n += 1
        if seq == txn_rows:
            writer.write(ChangeRecord(COMMIT, lsn, seq + 1, lsn, TS))
            lsn, seq = lsn + 1, 0
    if seq:
        writer.write(ChangeRecord(COMMIT, lsn, seq + 1, lsn, TS))
        lsn += 1
    writer.close_file()
    return n, lsn


def save_module_results(module: str) -> Path:
    """A benchmark process's figures and plot data, for the runner (``python -m bench``) to gather."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{module}.json"
    path.write_text(json.dumps({"figures": [asdict(f) for f in FIGURES], "series": SERIES}, indent=2))
    return path


def gather(modules: list[str]) -> None:
    """Load the figures the benchmark processes saved (in run order) into FIGURES and SERIES."""
    FIGURES.clear()
    SERIES.clear()
    for module in modules:
        path = OUT / f"{module}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        FIGURES.extend(Figure(**f) for f in doc["figures"])
        for key, value in doc["series"].items():
            if isinstance(value, dict) and isinstance(SERIES.get(key), dict):
                SERIES[key].update(value)
            else:
                SERIES[key] = value


def save_results() -> Path:
    OUT.mkdir(exist_ok=True)
    path = OUT / "results.json"
    path.write_text(json.dumps({"figures": [asdict(f) for f in FIGURES], "series": SERIES}, indent=2))
    return path


def stop_follower(follower: subprocess.Popen[bytes], log: IO[str]) -> None:
    """Stop a ``loader run --follow`` process as a service manager would (SIGTERM, SIGKILL after
    300 s) and close its log."""
    follower.send_signal(signal.SIGTERM)
    try:
        follower.wait(timeout=300)
    except subprocess.TimeoutExpired:
        follower.kill()
    log.close()


class Probes:
    """Rows inserted into ``public.probe`` (P4, P10) and how long after its commit each became
    visible in the probe's current table, read through pyiceberg as a BI tool would."""

    def __init__(self, settings: LoaderSettings) -> None:
        from loader.lake.catalog import open_catalog
        from loader.lake.tables import SourceTable

        self.catalog = open_catalog(settings)
        self.ident = (settings.catalog.current_namespace, SourceTable("public", "probe").iceberg_name)
        self.committed: dict[int, float] = {}
        self.latency: dict[int, float] = {}
        self._last_scan: dict[str, Any] = {}

    def seen(self, low: int) -> set[int]:
        """The probe ids from ``low`` on that the current table holds (none before it exists)."""
        try:
            t = self.catalog.load_table(self.ident)
        except Exception:  # not created yet
            return set()
        # A row becomes visible only with a new snapshot: scan only when there is one (the
        # prober's own CPU would otherwise compete with the follower on 2 cores).
        snap = t.current_snapshot()
        key = (snap.snapshot_id if snap else None, low)
        if self._last_scan.get("key") != key:
            got = t.scan(row_filter=f"id >= {low}", selected_fields=("id",)).to_arrow()
            self._last_scan.update(key=key, ids=set(got["id"].to_pylist()))
        return self._last_scan["ids"]  # type: ignore[no-any-return]

    def insert(self, conn: psycopg.Connection, probe: int) -> None:
        conn.execute("INSERT INTO probe (id) VALUES (%s)", (probe,))
        self.committed[probe] = time.monotonic()

    def waiting(self) -> list[int]:
        """The probes committed and not yet seen visible."""
        return sorted(self.committed.keys() - self.latency.keys())

    def check(self) -> list[int]:
        """Record when each waiting probe is visible; the probes that were waiting before."""
        waiting = self.waiting()
        if waiting:
            seen = self.seen(waiting[0])
            at = time.monotonic()
            for p in waiting:
                if p in seen:
                    self.latency[p] = at - self.committed[p]
        return waiting
