"""Benchmark: readers for a snapshot's table scan, the same text expressions the snapshot selects.

Readers: psycopg's server-side cursor as the snapshot reads today (one tuple per row), ADBC's
PostgreSQL driver (COPY BINARY into Arrow record batches) and connectorx (its own connections,
so it cannot import an exported snapshot; measured for comparison only). Prints rows/s and
CPU microseconds per row (this process's user+system time; the server's is not counted).

    python -m bench.snapshot_readers postgresql://postgres@127.0.0.1:55441/postgres [rows]
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable

import psycopg

TABLE = "bench_snapshot_accounts"
# What loader.capture.snapshot selects for int4 / char(n) columns (concat calls the output function).
COLS = [("aid", "integer"), ("bid", "integer"), ("abalance", "integer"), ("filler", "character(84)")]
QUERY = (
    "SELECT "
    + ", ".join(f"CASE WHEN _t.{c} IS NULL THEN NULL ELSE concat(_t.{c}) END AS _c{j}" for j, (c, _) in enumerate(COLS))
    + f" FROM public.{TABLE} AS _t ORDER BY _t.aid"
)


def prepare(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{TABLE}",)).fetchone()
        if have and have[0]:
            n = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
            if n and n[0] == rows:
                return
            conn.execute(f"DROP TABLE {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (aid integer PRIMARY KEY, bid integer, abalance integer, filler character(84))"
        )
        conn.execute(
            f"INSERT INTO {TABLE} SELECT g, g / 100000 + 1, (g::bigint * 7919) %% 10000 - 5000, '' FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def psycopg_cursor(url: str) -> int:
    n = 0
    with psycopg.connect(url) as conn, conn.cursor(name="bench") as cur:
        cur.itersize = 5_000
        cur.execute(QUERY)
        for _ in cur:
            n += 1
    return n


def psycopg_arrow(url: str) -> int:
    """The same cursor, its rows turned into Arrow columns per fetch (what a v2 file needs)."""
    import pyarrow as pa

    n = 0
    with psycopg.connect(url) as conn, conn.cursor(name="bench") as cur:
        cur.itersize = 50_000
        cur.execute(QUERY)
        while rows := cur.fetchmany(50_000):
            batch = pa.record_batch(
                [pa.array(c, pa.string()) for c in zip(*rows)], names=[f"c{j}" for j in range(len(COLS))]
            )
            n += batch.num_rows
    return n


def adbc(url: str) -> int:
    import adbc_driver_postgresql.dbapi as pg

    n = 0
    with pg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute(QUERY)
        for batch in cur.fetch_record_batch():
            n += batch.num_rows
        cur.execute("COMMIT")
    return n


def connectorx(url: str) -> int:
    import connectorx as cx

    table = cx.read_sql(url, QUERY, return_type="arrow")
    return int(table.num_rows)


def measure(name: str, fn: Callable[[str], int], url: str) -> None:
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0 = r0.ru_utime + r0.ru_stime
    t0 = time.perf_counter()
    n = fn(url)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime + r1.ru_stime - c0
    print(
        f"{name:16} {n:>9} rows  {wall:6.2f} s  {n / wall:>10,.0f} rows/s  {cpu:6.2f} cpu-s  {cpu / n * 1e6:6.2f} µs/row"
    )


def main() -> None:
    url = sys.argv[1]
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    prepare(url, rows)
    readers: list[tuple[str, Callable[[str], int]]] = [
        ("psycopg cursor", psycopg_cursor),
        ("psycopg -> arrow", psycopg_arrow),
        ("adbc", adbc),
    ]
    try:
        import connectorx as _  # noqa: F401

        readers.append(("connectorx", connectorx))
    except ImportError:
        print("connectorx: not installed")
    for name, fn in readers:
        measure(name, fn, url)


if __name__ == "__main__":
    main()
