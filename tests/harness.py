"""The tests' shared helpers: the test server, ``Env`` (one isolated pipeline: source SQL, every
stage, the oracles), loader processes to kill, and generated change streams for a lake without a source.

Test modules import helpers from here only (fixtures come from ``conftest.py``), never from each other.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from loader.capture.capture import Capture, CaptureResult
from loader.config import LoaderSettings
from loader.lake.tables import SourceTable, TableNames
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import LandingWriter, open_landing
from loader.load.history import HistoryLoad, LoadResult
from loader.merge.current import CurrentMerge, MergeResult
from loader.verify import Reconciliation, reconcile
from tests.oracle import lake_table

#: The project's root (``schemas/``, ``infra/``, ``dbt_project/``).
ROOT = Path(__file__).resolve().parents[1]

#: The test PostgreSQL server (with wal2json); ``make test`` starts it and sets this.
TEST_PG = os.environ.get("LOADER_TEST_PG", "postgresql://postgres@127.0.0.1:25433")


def create_db(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))


def s3_bucket(endpoint: str, prefix: str) -> tuple[Any, str]:
    """(boto3 client of the test S3 server, a new bucket named ``prefix-<random>``)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


def assert_frames_equal(actual: Any, expected: Any) -> None:
    """``pyspark.testing.assertDataFrameEqual``: same schema and rows, in any order, with a row diff.

    ``expected`` is a DataFrame or a list of Rows (a state collected earlier).
    """
    import numpy as np

    if not hasattr(np, "NaN"):
        # pyspark.testing imports PySpark 3.5's pandas API, which still spells numpy 1's np.NaN.
        np.NaN = np.nan  # type: ignore[attr-defined]
    from pyspark.testing import assertDataFrameEqual

    assertDataFrameEqual(actual, expected)


@dataclass
class Env:
    settings: LoaderSettings
    spark: Any
    uid: str
    tmp: Path
    _conn: psycopg.Connection | None = field(default=None, repr=False)

    # --- source -------------------------------------------------------------------------
    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.settings.source.dsn, autocommit=True)
        return self._conn

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def transaction(self, *statements: str) -> None:
        """Run statements as one source transaction."""
        with self.conn.transaction():
            for s in statements:
                self.conn.execute(s)

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    # --- stages -------------------------------------------------------------------------
    def capture(self, **kwargs: Any) -> CaptureResult:
        return Capture(self.settings, **kwargs).run()

    def load(self) -> LoadResult:
        return HistoryLoad(self.spark, self.settings).run()

    def merge(self) -> MergeResult:
        return CurrentMerge(self.spark, self.settings).run()

    def run_all(self) -> tuple[CaptureResult, LoadResult, MergeResult]:
        return self.capture(), self.load(), self.merge()

    def resync(self, tables: list[str] | None = None, **kwargs: Any) -> Any:
        """What 'loader resync' does (a consistent re-snapshot that replaces the tables' state)."""
        from loader.capture.capture import snapshot

        return snapshot(self.settings, tables=tables, reason="requested by the test", **kwargs).run()

    def configure(self, section: str, **values: Any) -> None:
        """Change settings of one section (e.g. configure('source', auto_resync=False))."""
        old = getattr(self.settings, section)
        part = type(old).model_validate({**old.model_dump(), **values})  # validated: secrets become SecretStr
        self.settings = self.settings.model_copy(update={section: part})

    def status(self) -> Any:
        from loader.status import collect_status

        return collect_status(self.settings)

    # --- lakehouse reads ----------------------------------------------------------------
    @property
    def names(self) -> TableNames:
        return TableNames(self.settings)

    def history(self, table: str) -> Any:
        return self.spark.table(self.names.history(lake_table(self.settings, table)))

    def current(self, table: str) -> Any:
        return self.spark.table(self.names.current(lake_table(self.settings, table)))

    # --- oracles ------------------------------------------------------------------------
    def reconcile(self, tables: list[str] | None = None) -> list[Reconciliation]:
        return reconcile(self.settings, tables, show_values=True)  # a failing test shows the values

    def assert_reconciled(self, tables: list[str] | None = None) -> list[Reconciliation]:
        """Current tables equal the source, row for row and value for value."""
        results = self.reconcile(tables)
        assert results, "no tables to reconcile"
        bad = [r for r in results if not r.ok]
        assert not bad, "\n".join(r.line() + "\n  " + "\n  ".join(r.examples) for r in bad)
        return results


# --- the loader as a real process (crash, overlap and follow-mode tests) -----------------------


def settings_env(s: LoaderSettings) -> dict[str, str]:
    """The same settings as LOADER_* environment variables (how a scheduler would pass them)."""
    c = s.catalog
    return {
        "LOADER_SOURCE__DSN": s.source.dsn,
        "LOADER_SOURCE__SLOT": s.source.slot,
        "LOADER_LANDING__URL": s.landing.url,
        "LOADER_CATALOG__NAME": c.name,
        "LOADER_CATALOG__URI": c.uri,
        "LOADER_CATALOG__WAREHOUSE": c.warehouse,
        "LOADER_CATALOG__HISTORY_NAMESPACE": c.history_namespace,
        "LOADER_CATALOG__CURRENT_NAMESPACE": c.current_namespace,
        "LOADER_CATALOG__LOADER_NAMESPACE": c.loader_namespace,
    }


def cli_env(env: Env, **extra: str) -> dict[str, str]:
    """The environment that makes a ``loader`` process use ``env``'s settings."""
    s = env.settings
    out = dict(os.environ)
    out.update(settings_env(s))
    out.update(
        {
            "LOADER_SOURCE__MAX_CHANGES_PER_FILE": str(s.source.max_changes_per_file),
            "LOADER_SPARK__SHUFFLE_PARTITIONS": "2",
            "LOADER_SPARK__DRIVER_MEMORY": "1g",
            "LOADER_MERGE__KEY_BUCKETS": str(s.merge.key_buckets),
            "LOADER_LOAD__DRIVER_MAX_BYTES": str(s.load.driver_max_bytes),
            "LOADER_LOAD__COMMIT_INTERVAL_S": str(s.load.commit_interval_s),
        }
    )
    out.pop("LOADER_FAULT", None)
    out.pop("LOADER_PAUSE", None)
    out.update(extra)
    return out


def loader_process(env: Env, *args: str, **extra: str) -> subprocess.Popen[str]:
    """``loader <args>`` as a child process (``python -m loader.cli``), output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "loader.cli", *args],
        env=cli_env(env, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_for_holder(env: Env, stage: str, timeout: float = 120) -> None:
    """Until a 'loader <stage>' process holds its lock (its session shows in the catalog database)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(env.settings.catalog.uri, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s",
                (f"lakehouse-loader {stage} %",),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"no 'loader {stage}' took its lock within {timeout}s")


def hold_back_landing_files(env: Env) -> list[Any]:
    """Move the last run of whole-transaction landing files away, as a lagging copy or listing
    would hold them back: it starts a transaction (after a file that ends one) and ends on a
    commit; later files start transactions of their own. Returns them (see return_landing_files)."""
    from loader.landing.store import open_landing

    files = open_landing(env.settings).files()
    start = next(i for i in range(len(files) - 2, 0, -1) if files[i].first.seq == 1 and files[i - 1].complete)
    end = next(j for j in range(start, len(files)) if files[j].complete)
    held = files[start : end + 1]
    slot_dir = env.tmp / "landing" / env.settings.source.slot
    for f in held:
        shutil.move(slot_dir / f.name, env.tmp / f.name)
    return held


def return_landing_files(env: Env, held: list[Any]) -> None:
    """The held-back files arrive late."""
    slot_dir = env.tmp / "landing" / env.settings.source.slot
    for f in held:
        shutil.move(env.tmp / f.name, slot_dir / f.name)


# --- a PostgreSQL of the test's own, to stop and start (outage tests) -------------------------------

PGBIN = Path(os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin"))


class Cluster:
    """A throwaway PostgreSQL 15 cluster (wal_level=logical, wal2json) on a free port, owned by the
    ``postgres`` user when the tests run as root (initdb refuses root), as ``infra/postgres.sh`` does."""

    def __init__(self) -> None:
        import socket
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="loader-pg-"))  # not under pytest's 0700 tmp: postgres must reach it
        self.data = self.dir / "data"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres")
        self._as_owner(str(PGBIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        self.start()

    def _as_owner(self, *args: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *args] if os.getuid() == 0 else list(args)
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def dsn(self, db: str = "postgres", password: str | None = None) -> str:
        auth = f"postgres:{password}" if password else "postgres"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c wal_level=logical -c fsync=off"
        self._as_owner(
            str(PGBIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start", "-o", options
        )

    def stop(self) -> None:
        self._as_owner(str(PGBIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        subprocess.run(
            (["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else [])
            + [str(PGBIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster_settings(cluster: Cluster, root: Path) -> LoaderSettings:
    """A whole pipeline on ``cluster`` (source database ``app``, catalog database ``cat``) and ``root``."""
    create_db(cluster.dsn(), "app")
    create_db(cluster.dsn(), "cat")
    return LoaderSettings(
        source={"dsn": cluster.dsn("app"), "slot": "outage"},
        landing={"url": (root / "landing").as_uri()},
        catalog={"uri": cluster.dsn("cat"), "warehouse": (root / "warehouse").as_uri()},
    )


def cluster_env(settings: LoaderSettings, root: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``loader`` process on ``cluster_settings`` (a small Spark)."""
    return {
        **os.environ,
        **settings_env(settings),
        "LOADER_HOME": str(root),
        "LOADER_SPARK__DRIVER_MEMORY": "1g",
        "LOADER_SPARK__SHUFFLE_PARTITIONS": "2",
        **extra,
    }


# --- a lake without a source: generated change streams (property and exactly-once tests) ---------

TABLE = SourceTable("public", "acct")
TS = "2024-05-01 10:00:00+00"


def lake_settings(base: LoaderSettings, root: Path) -> LoaderSettings:
    """Fresh landing dir and catalog namespaces on the shared test catalog (no source database)."""
    uid = uuid.uuid4().hex[:8]
    return base.model_copy(
        update={
            "source": base.source.model_copy(update={"slot": f"prop_{uid}"}),
            "landing": base.landing.model_copy(update={"url": (root / uid).as_uri()}),
            "catalog": base.catalog.model_copy(
                update={
                    "history_namespace": f"h_{uid}",
                    "current_namespace": f"c_{uid}",
                    "loader_namespace": f"l_{uid}",
                }
            ),
        }
    )


@dataclass
class Txn:
    commit_lsn: int
    changes: list[ChangeRecord] = field(default_factory=list)

    def records(self) -> list[ChangeRecord]:
        commit = ChangeRecord(
            op=COMMIT, commit_lsn=self.commit_lsn, seq=len(self.changes) + 1, xid=self.commit_lsn, ts=TS
        )
        return [*self.changes, commit]


def change(txn: Txn, op: str, cols: dict[str, Any] | None, old_id: int | None = None) -> None:
    """Append one change; ``cols`` maps name -> value, a missing 'a' on an update = unchanged TOAST."""
    types = {"id": "integer", "a": "text", "b": "bigint"}
    columns = [Column(n, types[n], None if v is None else str(v)) for n, v in (cols or {}).items()]
    identity = [Column("id", "integer", str(old_id))] if old_id is not None else []
    seq = len(txn.changes) + 1
    txn.changes.append(
        ChangeRecord(
            op=op,
            commit_lsn=txn.commit_lsn,
            seq=seq,
            xid=txn.commit_lsn,
            ts=TS,
            schema=TABLE.schema,
            table=TABLE.table,
            change_lsn=txn.commit_lsn - 100 + seq,
            columns=columns,
            identity=identity,
            pk=["id"],
        )
    )


def generate(
    rnd: random.Random, n_txns: int, keys: int = 4, plain: bool = False
) -> tuple[list[Txn], dict[int, tuple[str | None, int | None]]]:
    """Random transactions over a few keys, and the model state after applying them in order.

    ``plain``: no key changes and every update sends every column (what the driver merge takes).
    """
    model: dict[int, tuple[str | None, int | None]] = {}
    txns = []
    for t in range(n_txns):
        txn = Txn(commit_lsn=0x1000 * (t + 1))
        for _ in range(rnd.randint(1, 3)):
            live = sorted(model)
            free = [k for k in range(1, keys + 1) if k not in model]
            kind = rnd.choice(["insert", "update", "update", "delete"] + ([] if plain else ["keychange"]))
            if kind == "insert" or not live:
                if not free:
                    continue
                k = rnd.choice(free)
                a = rnd.choice([None, f"text-{rnd.randint(0, 99)}"])
                b = rnd.choice([None, rnd.randint(-5, 5)])
                change(txn, "I", {"id": k, "a": a, "b": b})
                model[k] = (a, b)
            elif kind == "delete":
                k = rnd.choice(live)
                change(txn, "D", None, old_id=k)
                del model[k]
            else:
                k = rnd.choice(live)
                new_k = rnd.choice(free) if kind == "keychange" and free else k
                a_old, _ = model.pop(k)
                b = rnd.choice([None, rnd.randint(-5, 5)])
                cols: dict[str, Any] = {"id": new_k, "b": b}
                if not plain and rnd.random() < 0.5:  # TOASTed value left unchanged: not sent
                    a = a_old
                else:
                    a = rnd.choice([None, f"upd-{rnd.randint(0, 99)}"])
                    cols["a"] = a
                change(txn, "U", cols, old_id=k)
                model[new_k] = (a, b)
        if txn.changes:
            txns.append(txn)
    return txns, model


def landing_names(root: Path) -> list[str]:
    """The names of every landing file under ``root`` (any format), sorted."""
    from loader.landing.store import LandingFile

    return sorted(p.name for p in root.rglob("*") if LandingFile.parse(p.name) is not None)


def write_files(settings: LoaderSettings, txns: list[Txn], max_changes: int, format: str = "jsonl") -> list[str]:
    """``txns`` landed as capture lands them, in landing ``format`` (``jsonl``: v1, ``changes``: v2)."""
    writer = LandingWriter(open_landing(settings), max_changes=max_changes, format=format)
    for txn in txns:
        for rec in txn.records():
            writer.write(rec)
    writer.close_file()
    return writer.published


def current_rows(spark: Any, settings: LoaderSettings) -> dict[int, tuple[str | None, int | None]]:
    rows = spark.table(TableNames(settings).current(TABLE)).collect()
    return {r["id"]: (r["a"], r["b"]) for r in rows}


def history_positions(spark: Any, settings: LoaderSettings) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in spark.table(TableNames(settings).history(TABLE)).select("pg_lsn", "pg_seq").collect()]


def load_and_merge(spark: Any, settings: LoaderSettings) -> None:
    HistoryLoad(spark, settings).run()
    CurrentMerge(spark, settings).run()


# --- loader processes killed at a fault point or overlapping an in-process run (crash tests, fuzzer) ---


def run_killed(env: Env, stage: str, point: str, timeout: float = 600, **extra: str) -> tuple[int, str]:
    """``loader <stage>`` as a process that SIGKILLs itself at ``point`` (``LOADER_FAULT``).

    Returns (exit status, output): ``-SIGKILL`` when the point was reached, else how the run ended.
    """
    return finish(loader_process(env, stage, LOADER_FAULT=point, **extra), timeout)


def wait_for_capture_holder(env: Env, timeout: float = 60) -> None:
    """Until another session holds an advisory lock on the source (a capture process took its slot's lock)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(env.settings.source.conninfo(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.1)
    raise AssertionError(f"no 'loader capture' took the slot's lock within {timeout}s")


def overlap(env: Env, stage: str, hold_seconds: float | None = None, **extra: str) -> tuple[Exception | None, int, str]:
    """Two runs of ``stage`` at once: a ``loader <stage>`` process held at its lock (``LOADER_PAUSE``)
    while the same stage runs in-process. Returns (what the in-process run raised, or None if it
    ran; the process's exit status; its output).

    The hold must outlast the second run's wait for the lock: capture waits up to
    ``CAPTURE_LOCK_GRACE_S`` for a lock a finished run's backend has not released yet, so a hold no
    longer than that lets the second capture through on a slow machine (seen: 5 s against 5 s)."""
    from loader.capture.slot import CAPTURE_LOCK_GRACE_S

    if hold_seconds is None:
        hold_seconds = CAPTURE_LOCK_GRACE_S + 10 if stage == "capture" else 5
    proc = loader_process(env, stage, LOADER_PAUSE=f"{stage}-locked:{hold_seconds}", **extra)
    try:
        if stage == "capture":
            wait_for_capture_holder(env)
        else:
            wait_for_holder(env, stage)
        raised: Exception | None = None
        try:
            {"capture": env.capture, "load": env.load, "merge": env.merge}[stage]()
        except Exception as exc:  # the caller judges what the second run met
            raised = exc
    except BaseException:
        proc.kill()
        raise
    rc, out = finish(proc)
    return raised, rc, out
