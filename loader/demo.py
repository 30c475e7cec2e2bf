"""``loader demo`` / ``make demo``: the whole pipeline on the embedded defaults, reconciled."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

from loader.config import LoaderSettings
from loader.errors import ConfigError


def _local_path(url: str) -> Path | None:
    u = urlparse(url)
    return Path(u.path) if u.scheme in ("", "file") else None


def reset_embedded(settings: LoaderSettings) -> None:
    """Start from nothing: drop the slot, the source and catalog databases, local landing/warehouse.

    Refuses anything that is not local, so the demo can never wipe a real deployment.
    """
    landing, warehouse = _local_path(settings.landing.url), _local_path(settings.catalog.warehouse)
    src, cat = urlparse(settings.source.dsn), urlparse(settings.catalog.uri)
    if (
        landing is None
        or warehouse is None
        or src.hostname not in ("127.0.0.1", "localhost")
        or (cat.scheme.startswith("postgres") and cat.hostname not in ("127.0.0.1", "localhost"))
    ):
        raise ConfigError("the demo resets its databases and directories, so it only runs on local embedded settings")
    admin = urlunparse(src._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (settings.source.slot,),
        )
        databases = {src.path.lstrip("/")} | ({cat.path.lstrip("/")} if cat.scheme.startswith("postgres") else set())
        for db in databases:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(db)))
    for p in (landing, warehouse):
        shutil.rmtree(p, ignore_errors=True)


def run_demo(
    settings: LoaderSettings,
    transactions: int = 1500,
    seed: int = 7,
    with_dbt: bool = True,
    echo: Callable[[str], None] = print,
) -> bool:
    from loader.capture.capture import Capture
    from loader.embedded import ensure_embedded
    from loader.load.history import HistoryLoad
    from loader.merge.current import CurrentMerge
    from loader.spark import get_spark
    from loader.verify import reconcile
    from loader.workload import BankWorkload

    t0 = time.monotonic()
    echo("== resetting the embedded source, catalog, landing area and warehouse")
    reset_embedded(settings)
    ensure_embedded(settings)
    workload = BankWorkload(settings.source.dsn, seed=seed)
    workload.create_schema()
    capture = Capture(settings)
    capture.run()  # creates the slot: changes from here on are captured
    spark = get_spark(settings, "lakehouse-demo")
    half = transactions // 2
    for phase, n in (("first", half), ("second", transactions - half)):
        echo(f"== {phase} workload: {n} source transactions")
        workload.run(n)
        echo("   " + Capture(settings).run().summary())
        echo("   " + HistoryLoad(spark, settings).run().summary())
        echo("   " + CurrentMerge(spark, settings).run().summary())
    echo(f"   source changes made: {workload.log.changes} in {len(workload.log.transactions)} transactions")
    dbt_ok = True
    if with_dbt:
        from loader.dbt import run_dbt

        echo("== dbt build (session target)")
        dbt_ok = run_dbt(settings, ["build"], echo=echo)
    echo("== reconciliation: current tables vs SELECT * FROM the source")
    results = reconcile(settings)
    for r in results:
        echo("   " + r.line())
        for e in r.examples:
            echo("         " + e)
    echo("== sample query: top accounts by balance with their owner (Spark SQL on the current tables)")
    c = settings.catalog
    spark.sql(
        f"SELECT a.account_id, c.name, a.currency, a.balance FROM {c.name}.{c.current_namespace}.public__accounts a "
        f"JOIN {c.name}.{c.current_namespace}.public__customers c USING (customer_id) ORDER BY a.balance DESC LIMIT 5"
    ).show(truncate=False)
    echo("== sample query: changes per table and operation (history)")
    spark.sql(
        f"SELECT 'accounts' AS tbl, pg_operation, count(*) AS changes FROM {c.name}.{c.history_namespace}.public__accounts GROUP BY 2 "
        f"UNION ALL SELECT 'transactions', pg_operation, count(*) FROM {c.name}.{c.history_namespace}.public__transactions GROUP BY 2 "
        f"ORDER BY 1, 2"
    ).show(truncate=False)
    ok = bool(results) and all(r.ok for r in results) and dbt_ok
    missing = sum(r.missing for r in results)
    extra = sum(r.extra for r in results)
    diff = sum(r.different for r in results)
    echo(
        f"== {'RECONCILED' if ok else 'NOT RECONCILED'}: {len(results)} tables, "
        f"{missing} missing, {extra} extra, {diff} different rows; dbt {'passed' if dbt_ok else 'FAILED'}; "
        f"{time.monotonic() - t0:.0f}s"
    )
    return ok
