"""Benchmark: capture one 1,000,000-row transaction and report the capture process's peak RSS.

Needs a PostgreSQL with wal2json (default: the test server, ``LOADER_BENCH_PG`` or
``LOADER_TEST_PG``, e.g. postgresql://postgres@127.0.0.1:55433). The capture runs in a child
process so its peak RSS is its own (``ru_maxrss`` of RUSAGE_CHILDREN).

    python -m bench.capture_memory            # 1,000,000 rows
    BENCH_ROWS=200000 python -m bench.capture_memory
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

PG = os.environ.get("LOADER_BENCH_PG", os.environ.get("LOADER_TEST_PG", "postgresql://postgres@127.0.0.1:55433"))

_CHILD = """
import sys, time, json
from loader.capture.capture import Capture
from loader.config import LoaderSettings
s = LoaderSettings(source={"dsn": sys.argv[1], "slot": sys.argv[2], "max_changes_per_file": 100000},
                   landing={"url": sys.argv[3]})
t = time.monotonic()
r = Capture(s).run()
print(json.dumps({"seconds": time.monotonic() - t, "changes": r.changes, "files": len(r.files)}))
"""


def run() -> None:
    rows = int(os.environ.get("BENCH_ROWS", "1000000"))
    db = f"bench_{uuid.uuid4().hex[:8]}"
    slot = db
    admin = f"{PG}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = f"{PG}/{db}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, payload text NOT NULL, amount numeric(18,2))")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
            t = time.monotonic()
            conn.execute(
                "INSERT INTO big SELECT g, repeat(md5(g::text), 4), g / 100.0 FROM generate_series(1, %s) g", (rows,)
            )
            write_s = time.monotonic() - t
        with tempfile.TemporaryDirectory() as tmp:
            landing = Path(tmp).as_uri()
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, dsn, slot, landing],
                check=True,
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            import json

            res = json.loads(out.stdout.strip().splitlines()[-1])
            peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            size = sum(p.stat().st_size for p in (Path(tmp) / slot).glob("*.gz"))
        print(f"capture_memory: one transaction of {rows:,} rows (source insert {write_s:.1f}s)")
        print(f"  captured {res['changes']:,} changes into {res['files']} landing files, {size / 1e6:.1f} MB gzip")
        print(f"  capture time {res['seconds']:.1f}s ({res['changes'] / max(res['seconds'], 1e-9):,.0f} changes/s)")
        print(f"  capture process peak RSS {peak_mb:.0f} MB")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


if __name__ == "__main__":
    run()
