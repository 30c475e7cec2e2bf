"""The ``loader`` command. Each subcommand only wires options to the stage that does the work.

Errors reach the user as one line naming what failed and what to do; ``--debug`` shows the
traceback. Exit status: 0 done; 1 error that needs a change of input or configuration; 3 the run
finished but quarantined changes in the rejects table; 2 a misused command (an unknown option, or a table,
time or position that names nothing; nothing was done); 4 ``verify`` found a difference; 5 the run
finished but some tables are parked (waiting for a resync); 75 a transient failure (another
process holds the stage, the landing area or the source did not answer): re-run later.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from loader.config import LoaderSettings, load_settings
from loader.errors import LoaderError, TransientError, UsageError

EXIT_ERROR = 1
EXIT_USAGE = 2  # click's own status for a misused command
EXIT_REJECTS = 3
EXIT_NOT_RECONCILED = 4
EXIT_PARKED = 5
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: try again later


class Context:
    def __init__(self, config: str | None, debug: bool) -> None:
        self.config = config
        self.debug = debug
        self._settings: LoaderSettings | None = None

    @property
    def settings(self) -> LoaderSettings:
        if self._settings is None:
            self._settings = load_settings(self.config)
        return self._settings

    def spark(self) -> Any:
        from loader.spark import get_spark

        return get_spark(self.settings)

    def lazy_spark(self) -> Any:
        """A Spark session started on first use (loader.spark.LazySpark): load and merge do on
        the driver what they can, and a command whose work needed no JVM never starts one."""
        from loader.spark import LazySpark

        return LazySpark(self.settings)


def catch_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        debug = bool(ctx.find_root().params.get("debug"))
        try:
            # A PostgreSQL outage (source or catalog) is retried: the whole command, every stage
            # being restartable; then exit 75 naming the server (loader.retry).
            from loader.retry import through_outages

            obj = ctx.find_object(Context)
            return through_outages(
                lambda: fn(*args, **kwargs), lambda: obj.settings if obj is not None else load_settings()
            )
        except LoaderError as exc:
            if debug:
                raise
            click.echo(f"error: {exc.one_line()}", err=True)
            if isinstance(exc, UsageError):
                sys.exit(EXIT_USAGE)
            sys.exit(EXIT_TRANSIENT if isinstance(exc, TransientError) else EXIT_ERROR)
        except (click.exceptions.Exit, click.ClickException):
            raise
        except Exception as exc:  # unexpected: still one line unless --debug
            if debug:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            click.echo(f"error: {type(exc).__name__}: {first} (re-run with --debug for the traceback)", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper


@click.group()
@click.option("--config", "config", envvar="LOADER_CONFIG", type=click.Path(dir_okay=False), help="TOML settings file.")
@click.option(
    "--log-level",
    envvar="LOADER_LOG_LEVEL",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level (default WARNING; INFO in follow mode).",
)
@click.option(
    "--log-format",
    envvar="LOADER_LOG_FORMAT",
    default="text",
    type=click.Choice(["text", "json"]),
    help="Logs as text or as JSON lines (stderr).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="lakehouse-loader")
@click.pass_context
def main(ctx: click.Context, config: str | None, debug: bool, log_level: str | None, log_format: str) -> None:
    """PostgreSQL change history into Iceberg: capture -> load -> merge, plus status and checks."""
    from loader.logs import setup_logging

    setup_logging(log_level or "WARNING", log_format)
    ctx.obj = Context(config, debug)


def _follow_logs(click_ctx: click.Context, _param: click.Parameter, follow: bool) -> bool:
    """``run --follow`` logs at INFO unless --log-level (or LOADER_LOG_LEVEL) chose a level."""
    root = click_ctx.find_root().params
    if follow and root.get("log_level") is None:
        from loader.logs import setup_logging

        setup_logging("INFO", root.get("log_format") or "text")
    return follow


def emit(result: Any, as_json: bool) -> None:
    """A command's result: its summary, or (``--json``) every field as JSON on stdout."""
    if as_json:
        click.echo(json.dumps(_plain(result), indent=2, sort_keys=True))
    else:
        click.echo(result.summary())


def _plain(value: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for extra in ("parked", "consistent_through"):
            if extra not in out and hasattr(type(value), extra):
                out[extra] = _plain(getattr(value, extra))
        return out
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        from loader.lsn import show_token

        return show_token(value)  # one spelling of a position everywhere a user reads one
    return value


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


pass_ctx = click.make_pass_decorator(Context)


def check_tables(ctx: Context, tables: tuple[str, ...] | list[str], option: str = "--table") -> None:
    """Every table named must be in the lake (a history table): checked before any work, and
    before Spark starts. An unknown one is a usage error listing the known tables, close matches first."""
    if not tables:
        return
    from loader.lake.catalog import lake_tables
    from loader.lake.tables import unknown_tables

    problem = unknown_tables(list(tables), lake_tables(ctx.settings), "table")
    if problem:
        raise UsageError(f"{option}: {problem}", hint="name tables as schema.table, as 'loader status' lists them")


def time_option(value: str | None, option: str) -> Any:
    """A source commit time as the user typed it (ISO 8601, with or without a zone; UTC if none)."""
    if value is None:
        return None
    from loader.backfill import parse_time

    try:
        return parse_time(value)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}", hint="e.g. '2026-01-31 12:00:00+00' or 2026-01-31T12:00Z") from None


@main.command()
@click.option("--no-create-slot", is_flag=True, help="Fail instead of creating a missing slot.")
@click.option(
    "--snapshot",
    "with_snapshot",
    is_flag=True,
    help="When the slot is created, first land a consistent snapshot of the tables' existing rows.",
)
@json_option
@pass_ctx
@catch_errors
def capture(ctx: Context, no_create_slot: bool, with_snapshot: bool, as_json: bool) -> None:
    """Decode the replication slot into landing files; advance the slot once they are durable."""
    from loader.capture import slot as slots
    from loader.capture.capture import Capture

    if with_snapshot and not no_create_slot:
        from loader.capture.capture import snapshot

        with slots.connect(ctx.settings.source.conninfo()) as conn:
            missing = slots.slot_info(conn, ctx.settings.source.slot) is None
        if missing:
            snap = snapshot(ctx.settings).run()
            if not as_json:
                click.echo(snap.summary())
    res = Capture(ctx.settings).run(create_slot=not no_create_slot)
    emit(res, as_json)


@main.command()
@json_option
@pass_ctx
@catch_errors
def load(ctx: Context, as_json: bool) -> None:
    """Append pending landing files to the Iceberg history tables (exactly once)."""
    from loader.load.history import HistoryLoad

    # Spark starts only if the batch needs it: a load the driver does whole needs no JVM.
    res = HistoryLoad(ctx.lazy_spark(), ctx.settings).run()
    emit(res, as_json)
    sys.exit(_load_exit(ctx, res))


def _load_exit(ctx: Context, res: Any) -> int:
    if res.rejects:
        click.echo(f"{res.rejects} changes quarantined in {ctx.settings.catalog.loader_namespace}.rejects", err=True)
    if res.parked:
        click.echo(f"{len(res.parked)} tables parked: {', '.join(sorted(res.parked))} (see 'loader status')", err=True)
        return EXIT_PARKED
    return EXIT_REJECTS if res.rejects else 0


def _merge_exit(res: Any) -> int:
    if res.parked:
        click.echo(
            f"{len(res.parked)} tables parked, their current tables wait for a resync: {', '.join(sorted(res.parked))}",
            err=True,
        )
        return EXIT_PARKED
    return 0


@main.command()
@click.option("--table", "tables", multiple=True, help="schema.table to merge (default: all).")
@json_option
@pass_ctx
@catch_errors
def merge(ctx: Context, tables: tuple[str, ...], as_json: bool) -> None:
    """Apply the history increment since the last merge to the current tables (MERGE INTO)."""
    from loader.merge.current import CurrentMerge

    check_tables(ctx, tables)
    res = CurrentMerge(ctx.lazy_spark(), ctx.settings).run(list(tables) or None)
    emit(res, as_json)
    sys.exit(_merge_exit(res))


@main.command()
@click.option(
    "--follow",
    is_flag=True,
    callback=_follow_logs,
    help="Keep running: capture continuously, load and merge every interval (logs at INFO by default).",
)
@click.option("--interval", type=float, default=None, help="Follow mode: seconds between cycles (follow.interval_s).")
@click.option(
    "--max-batch-files", type=int, default=None, help="Follow mode: landing files per load (follow.max_batch_files)."
)
@click.option("--metrics-port", type=int, default=None, help="Follow mode: serve Prometheus metrics on this port.")
@click.option("--max-cycles", type=int, default=None, hidden=True)
@json_option
@pass_ctx
@catch_errors
def run(
    ctx: Context,
    follow: bool,
    interval: float | None,
    max_batch_files: int | None,
    metrics_port: int | None,
    max_cycles: int | None,
    as_json: bool,
) -> None:
    """All stages once, in order: capture, load, merge; or, with --follow, continuously.

    Follow mode keeps one process and Spark session: capture streams in a thread while Spark loads,
    a cycle without changes starts no Spark job, SIGTERM/SIGINT stop it cleanly (exit 0), and a
    restart after a kill repairs everything. One follower runs per catalog (a second exits 75).
    """
    from loader.capture.capture import Capture
    from loader.load.history import HistoryLoad
    from loader.merge.current import CurrentMerge

    if follow:
        from loader.follow import Follower
        from loader.metrics import Metrics

        f = ctx.settings.follow
        updates = {
            k: v
            for k, v in (("interval_s", interval), ("max_batch_files", max_batch_files), ("metrics_port", metrics_port))
            if v is not None
        }
        settings = ctx.settings.model_copy(update={"follow": f.model_copy(update=updates)})
        metrics = Metrics()
        if settings.follow.metrics_port is not None:
            metrics.serve(settings.follow.metrics_port, settings.follow.metrics_host)
        follower = Follower(settings, ctx.spark(), metrics, max_cycles=max_cycles)
        code = follower.run()
        st = follower.stats
        click.echo(
            f"follow: {st.cycles} cycles ({st.idle_cycles} idle), {st.captured_changes} changes captured, "
            f"{st.loaded_changes} loaded" + (f"; {len(st.errors)} cycles retried" if st.errors else "")
        )
        sys.exit(code)
    cap = Capture(ctx.settings).run()
    spark = ctx.lazy_spark()
    res = HistoryLoad(spark, ctx.settings).run()
    merged = CurrentMerge(spark, ctx.settings).run()
    if as_json:
        click.echo(
            json.dumps({"capture": _plain(cap), "load": _plain(res), "merge": _plain(merged)}, indent=2, sort_keys=True)
        )
    else:
        for part in (cap, res, merged):
            click.echo(part.summary())
    sys.exit(max(_load_exit(ctx, res), _merge_exit(merged)))


@main.command()
@click.option(
    "--table", "tables", multiple=True, help="schema.table to maintain (default: all, and the loader's tables)."
)
@click.option("--no-expire", is_flag=True, help="Do not expire snapshots.")
@click.option("--no-orphans", is_flag=True, help="Do not remove orphan files.")
@json_option
@pass_ctx
@catch_errors
def maintain(ctx: Context, tables: tuple[str, ...], no_expire: bool, no_orphans: bool, as_json: bool) -> None:
    """Compact history (keeping LSN order) and current tables (applying deletes), expire snapshots
    beyond maintenance.snapshot_retention_hours, rewrite manifests, remove orphan files.

    Watermarks, late-file detection, status and the dbt audits keep working after it, and after
    the same procedures run by anyone else.
    """
    from loader.maintain import Maintenance

    check_tables(ctx, tables)
    emit(Maintenance(ctx.spark(), ctx.settings).run(list(tables) or None, not no_expire, not no_orphans), as_json)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@catch_errors
def status(ctx: Context, as_json: bool) -> None:
    """Landed, loaded and merged positions and row counts (pyiceberg only, no Spark)."""
    from loader.status import collect_status

    st = collect_status(ctx.settings)
    click.echo(st.to_json() if as_json else st.render())


@main.command()
@click.option("--table", "tables", multiple=True, help="schema.table to check (default: all).")
@click.option(
    "--show-values",
    is_flag=True,
    help="Print the differing values (personal data, as a rule); by default only keys and column names.",
)
@click.option("--sample", type=click.IntRange(min=1), help="Check only this many tables, picked at random.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: every table's result and the totals.")
@pass_ctx
@catch_errors
def verify(ctx: Context, tables: tuple[str, ...], show_values: bool, sample: int | None, as_json: bool) -> None:
    """Reconcile tables with the source at a consistent cut, by checksums; exit 4 if any differs.

    The source is read in a snapshot whose place in the stream is known; keys changed between the
    lake's position and that cut are lag (in flight), not differences. Differences name the key
    and the columns that differ, not their values (--show-values). Tables without a key compare
    as multisets of rows.
    """
    import json as json_lib
    import random
    import time

    from loader.verify import reconcile

    check_tables(ctx, tables)
    chosen = list(tables) or None
    if sample is not None:
        from loader.lake.catalog import open_catalog
        from loader.lake.tables import SourceTable

        every = chosen or [
            SourceTable.from_iceberg_name(i[-1]).qualified
            for i in open_catalog(ctx.settings).list_tables(ctx.settings.catalog.history_namespace)
        ]
        chosen = sorted(random.sample(every, min(sample, len(every))))
    started = time.monotonic()
    results = reconcile(ctx.settings, chosen, show_values=show_values)
    elapsed = max(time.monotonic() - started, 1e-9)
    rows = sum(r.source_rows for r in results)
    if as_json:
        doc = {
            "tables": [r.to_doc() for r in results],
            "rows": rows,
            "seconds": round(elapsed, 3),
            "rows_per_second": round(rows / elapsed),
            "ok": all(r.ok for r in results),
        }
        click.echo(json_lib.dumps(doc, indent=2))
    else:
        for r in results:
            click.echo(r.line())
            for e in r.examples:
                click.echo(f"      {e}")
        click.echo(
            f"verified {len(results)} tables, {rows} source rows in {elapsed:.1f} s ({rows / elapsed:,.0f} rows/s)"
        )
    if any(not r.ok and r.parked is None for r in results):
        sys.exit(EXIT_NOT_RECONCILED)
    if any(r.parked for r in results):
        sys.exit(EXIT_PARKED)


@main.group()
def slot() -> None:
    """Replication slot lifecycle."""


@slot.command("create")
@pass_ctx
@catch_errors
def slot_create(ctx: Context) -> None:
    """Create the slot as the first 'loader capture' would (source.plugin; pgoutput: its publication)."""
    from loader.capture.capture import Capture
    from loader.lsn import format_lsn

    src = ctx.settings.source
    lsn = Capture(ctx.settings).create_slot()
    click.echo(f"slot {src.slot} ({src.plugin}) created at {format_lsn(lsn)}")


@slot.command("drop")
@click.confirmation_option(prompt="Dropping the slot loses every change not yet captured. Continue?")
@pass_ctx
@catch_errors
def slot_drop(ctx: Context) -> None:
    """Drop the slot (changes not yet captured are lost)."""
    from loader.capture import ddl
    from loader.capture import slot as slots

    with slots.connect(ctx.settings.source.conninfo()) as conn:
        slots.drop_slot(conn, ctx.settings.source.slot)
        # The DDL trigger goes with the slot (another loader's next capture installs it again).
        removed = ddl.uninstall(conn)
    click.echo(
        f"slot {ctx.settings.source.slot} dropped" + ("" if removed else "; the DDL trigger stays (see the log)")
    )


@slot.command("ddl-trigger")
def slot_ddl_trigger() -> None:
    """Print the SQL that installs the DDL trigger, for an administrator to run where the loader's
    role may not (it needs superuser or rds_superuser); see README 'DDL capture'."""
    from loader.capture import ddl

    click.echo(ddl.install_sql())


@slot.command("info")
@pass_ctx
@catch_errors
def slot_info(ctx: Context) -> None:
    """Position of the slot and the WAL it retains (how far behind capture is)."""
    from loader.capture import slot as slots
    from loader.lsn import format_lsn

    with slots.connect(ctx.settings.source.conninfo()) as conn:
        info = slots.slot_info(conn, ctx.settings.source.slot)
    if info is None:
        raise slots.SlotMissingError(f"replication slot {ctx.settings.source.slot!r} does not exist")
    click.echo(
        json.dumps(
            {
                "slot": info.name,
                "plugin": info.plugin,
                "active_pid": info.active_pid,
                "restart_lsn": format_lsn(info.restart_lsn) if info.restart_lsn else None,
                "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn) if info.confirmed_flush_lsn else None,
                "current_wal_lsn": format_lsn(info.current_wal_lsn),
                "retained_wal_bytes": info.retained_wal_bytes,
                "lag_bytes": info.lag_bytes,
                "wal_status": info.wal_status,
                "snapshot": _snapshot_state(ctx.settings),
            },
            indent=2,
        )
    )


def _snapshot_state(settings: LoaderSettings) -> dict[str, Any] | None:
    """The landing area's snapshot state (consistent point, tables, done), if a snapshot was taken."""
    from loader.landing.state import SNAPSHOT_STATE
    from loader.landing.store import open_landing

    return open_landing(settings).read_state(SNAPSHOT_STATE)


@slot.command("tables")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
@catch_errors
def slot_tables(ctx: Context, as_json: bool) -> None:
    """Captured tables, their key and replica identity, and what downstream can build from each."""
    from loader.capture import slot as slots
    from loader.capture.source_filter import TableFilter
    from loader.capture.source_tables import list_tables

    src = ctx.settings.source
    wanted = TableFilter(src.include, src.exclude)
    with slots.connect(src.conninfo()) as conn:
        tables = [t for t in list_tables(conn, partitions=src.partitions) if wanted(t.qualified)]
    if as_json:
        click.echo(json.dumps([t.as_dict() for t in tables], indent=2))
        return
    for t in tables:
        click.echo(f"{t.qualified:<40} identity={t.replica_identity:<8} {t.downstream}")


@main.command()
@click.option("--table", "tables", multiple=True, help="schema.table to resync (default: every captured table).")
@click.option(
    "--chunk-rows", type=int, default=None, help="Rows per landing file (default: source.snapshot_chunk_rows)."
)
@pass_ctx
@catch_errors
def resync(ctx: Context, tables: tuple[str, ...], chunk_rows: int | None) -> None:
    """Re-snapshot tables consistently and replace their current state (keys gone from the source go).

    The repair for a parked table, a table included again, a damaged landing file, and a lost slot:
    when the slot is gone or invalidated it is created again and every captured table is resynced.
    Placed in the stream: from the resync on, current equals the source. Then run 'loader load' and
    'loader merge' (or 'loader run').
    """
    from loader.capture import slot as slots
    from loader.capture.capture import snapshot
    from loader.errors import SlotLostError
    from loader.landing.store import open_landing

    src = ctx.settings.source
    store = open_landing(ctx.settings)
    files = store.files()
    with slots.connect(src.conninfo()) as conn:
        info = slots.slot_info(conn, src.slot)
    try:
        slots.check_landed(info, src.slot, store, files)
        lost = False
    except SlotLostError:
        lost = bool(files)  # nothing landed yet: no change was lost, the snapshot creates the slot
    if lost and tables:
        click.echo("the replication slot is lost, so every captured table is resynced (not only --table)", err=True)
    snap = snapshot(
        ctx.settings,
        store,
        tables=None if lost else (list(tables) or None),
        chunk_rows=chunk_rows,
        reason="requested with 'loader resync'",
        recover=lost,
    )
    click.echo(snap.run().summary())


@main.command()
@click.option("--subject", default=None, help="type=value, resolved through dbt.subject_columns (e.g. customer=123).")
@click.option("--table", default=None, help="schema.table holding the subject (with --key).")
@click.option("--key", default=None, help="column=value identifying the subject in --table.")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; change nothing.")
@json_option
@pass_ctx
@catch_errors
def erase(ctx: Context, subject: str | None, table: str | None, key: str | None, dry_run: bool, as_json: bool) -> None:
    """Erase a data subject: every value of it from history (old keys included), current, rejects,
    the dbt change log and SCD2, the landing files, and every Iceberg snapshot and file holding it.

    An audit record without personal values goes to the erasures table, and the subject's salted
    hash to erased_keys: later loads, replays, resyncs and rebuilds never bring it back. Takes the
    load and merge locks (stop a follower first).
    """
    from loader.erase import Erasure

    if table:
        check_tables(ctx, [table])
    emit(Erasure(ctx.spark(), ctx.settings).run(subject, table, key, dry_run=dry_run), as_json)


@main.group()
def backfill() -> None:
    """Re-snapshot a table, replay an LSN range, rebuild current from history."""


@backfill.command("snapshot")
@click.option("--table", "tables", multiple=True, help="schema.table to snapshot (default: every captured table).")
@click.option(
    "--chunk-rows", type=int, default=None, help="Rows per landing file (default: source.snapshot_chunk_rows)."
)
@click.option("--dry-run", is_flag=True, help="List the tables and their estimated rows; snapshot nothing.")
@pass_ctx
@catch_errors
def backfill_snapshot(ctx: Context, tables: tuple[str, ...], chunk_rows: int | None, dry_run: bool) -> None:
    """Land a consistent snapshot of existing rows as 'read' changes (creates the slot if missing).

    Resumes an interrupted snapshot. With the slot already streaming, it first lands the changes
    the slot holds, then reads the tables at a new consistent point (tables added later). Each
    table's snapshot replaces its current state, like 'loader resync'. Then 'loader load' and
    'loader merge'.
    """
    from loader.capture.capture import snapshot

    snap = snapshot(ctx.settings, tables=list(tables) or None, chunk_rows=chunk_rows)
    if dry_run:
        for table, rows in snap.plan():
            click.echo(f"{table}: about {rows} rows")
        return
    click.echo(snap.run().summary())


def _lsn_option(value: str | None, name: str) -> int | None:
    """A commit LSN the user typed, in any spelling the loader ever showed (see parse_position):
    the transaction committed there is meant, whole."""
    from loader.lsn import parse_position

    if value is None:
        return None
    try:
        return parse_position(value).commit_lsn
    except ValueError as exc:
        raise UsageError(
            f"{name}: {exc}", hint="give an LSN as X/Y, or a position as 'loader status' shows it"
        ) from None


@backfill.command("replay")
@click.option("--from-lsn", "from_lsn", required=True, help="First commit LSN of the range (X/Y).")
@click.option("--to-lsn", "to_lsn", required=True, help="Last commit LSN of the range (X/Y).")
@click.option("--table", "tables", multiple=True, help="schema.table to replay (default: every table in the range).")
@click.option("--dry-run", is_flag=True, help="Count the changes in the range per table; write nothing.")
@json_option
@pass_ctx
@catch_errors
def backfill_replay(
    ctx: Context, from_lsn: str, to_lsn: str, tables: tuple[str, ...], dry_run: bool, as_json: bool
) -> None:
    """Re-apply the transactions committed in an LSN range from the landing area.

    Exactly once: changes already in history add nothing; missing ones are appended and their
    tables rebuilt from history. Erased subjects stay erased.
    """
    from loader.backfill import Backfill

    start, end = _lsn_option(from_lsn, "--from-lsn"), _lsn_option(to_lsn, "--to-lsn")
    assert start is not None and end is not None
    if end < start:
        raise UsageError("--to-lsn is before --from-lsn", hint="give the range in commit order")
    check_tables(ctx, tables)
    emit(Backfill(ctx.spark(), ctx.settings).replay(start, end, list(tables) or None, dry_run), as_json)


@backfill.command("rebuild-current")
@click.option("--table", "table", required=True, help="schema.table whose current table to recompute.")
@click.option(
    "--upto-lsn", "upto_lsn", default=None, help="Recompute as of this commit LSN (X/Y); default: all loaded."
)
@click.option("--as-of", "as_of", default=None, help="Recompute as of a source commit time ('2026-01-31 12:00:00+00').")
@click.option("--dry-run", is_flag=True, help="Say which position it would rebuild to; write nothing.")
@pass_ctx
@catch_errors
def backfill_rebuild_current(ctx: Context, table: str, upto_lsn: str | None, as_of: str | None, dry_run: bool) -> None:
    """Recompute a current table from its history (as of an LSN or a time), in one atomic commit."""
    from loader.backfill import Backfill
    from loader.lsn import ChangePosition
    from loader.merge.current import CurrentMerge

    if upto_lsn and as_of:
        raise click.UsageError("give --upto-lsn or --as-of, not both")
    lsn = _lsn_option(upto_lsn, "--upto-lsn")
    at = time_option(as_of, "--as-of")
    check_tables(ctx, [table])
    # Every change of every transaction that committed at or before the LSN.
    upto = ChangePosition.end_of(lsn) if lsn is not None else None
    if at is not None:
        upto = Backfill(ctx.spark(), ctx.settings).position_at(table, at)
    if dry_run:
        click.echo(f"would rebuild {table} from history as of {upto or 'everything loaded'}")
        return
    res = CurrentMerge(ctx.spark(), ctx.settings).rebuild(table, upto)
    click.echo(f"rebuilt {res.table}: {res.keys_changed} keys, merged through {res.merged_through or '-'}")


@main.command("as-of")
@click.option("--table", "table", required=True, help="schema.table.")
@click.option("--at", "at", required=True, help="Source commit time, e.g. '2026-01-31 12:00:00+00'.")
@click.option("--run", "run_it", is_flag=True, help="Run the 'current as of' query and print the rows.")
@pass_ctx
@catch_errors
def as_of(ctx: Context, table: str, at: str, run_it: bool) -> None:
    """Time travel in source time: SQL for a table's rows as of a commit time, and its history until then.

    The SQL runs on any engine of the catalog (Spark, the Thrift Server, BI tools); the current
    rows come from dbt's exact SCD2 table ('loader dbt build').
    """
    from loader.backfill import as_of_sql

    when = time_option(at, "--at")
    check_tables(ctx, [table])
    sqls = as_of_sql(ctx.settings, table, when)
    if run_it:
        ctx.spark().sql(sqls["current"]).show(truncate=False)
        return
    click.echo(f"-- {table} as of {at}: current rows\n{sqls['current']};\n")
    click.echo(f"-- {table}: history up to {at}\n{sqls['history']};")


@main.command("import")
@click.option(
    "--format",
    "fmt",
    required=True,
    type=click.Choice(["pgkafka", "wal2json", "debezium"]),
    help="Input message format.",
)
@click.option("--pk", "pk", multiple=True, help="schema.table=col1,col2: key of a table the input does not name.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@pass_ctx
@catch_errors
def import_cmd(ctx: Context, fmt: str, pk: tuple[str, ...], paths: tuple[str, ...]) -> None:
    """Convert files of change messages (Kafka S3 sink output, pg_recvlogical files) into landing files.

    They land in the landing area of source.slot (use a slot name of its own, e.g.
    LOADER_SOURCE__SLOT=kafka_accounts), ordered by LSN with duplicates dropped; then run 'loader load'.
    """
    from loader.inputs.importer import import_files

    res = import_files(ctx.settings, fmt, paths, pk)
    click.echo(res.summary())
    if res.quarantined:
        click.echo(
            f"{res.quarantined} messages quarantined: 'loader load' puts them in the rejects table and parks their tables",
            err=True,
        )
        sys.exit(EXIT_REJECTS)


@main.command("spark-conf")
@click.option(
    "--properties-file",
    "properties_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a Spark properties file (secrets included, mode 0600) for 'spark-submit --properties-file'.",
)
@pass_ctx
@catch_errors
def spark_conf_cmd(ctx: Context, properties_file: str | None) -> None:
    """The spark-submit settings for this configuration.

    Printed as '--conf key=value' lines, secrets as ${LOADER_CATALOG__PASSWORD} /
    ${LOADER_S3__SECRET_ACCESS_KEY} references; or, with --properties-file, written to a file only
    the owner can read (secrets included), for 'spark-submit --properties-file FILE'.
    """
    from loader.spark import spark_conf, write_properties_file

    if properties_file:
        write_properties_file(spark_conf(ctx.settings), properties_file)
        click.echo(f"wrote {properties_file} (mode 0600): spark-submit --properties-file {properties_file} ...")
        return
    for k, v in spark_conf(ctx.settings, reveal=False).items():
        click.echo(f"--conf {k}={v}")


@main.command()
@pass_ctx
@catch_errors
def init(ctx: Context) -> None:
    """Create the source and catalog databases of the embedded setup if missing."""
    from loader.embedded import ensure_embedded

    ensure_embedded(ctx.settings)
    click.echo("embedded databases ready")


@main.command()
@click.option("--transactions", default=1500, show_default=True, help="Source transactions to generate.")
@click.option("--seed", default=7, show_default=True)
@click.option("--dbt/--no-dbt", "with_dbt", default=True, help="Also run 'dbt build' on the results.")
@pass_ctx
@catch_errors
def demo(ctx: Context, transactions: int, seed: int, with_dbt: bool) -> None:
    """Generate a workload on the embedded source, run every stage, reconcile, query."""
    from loader.demo import run_demo

    ok = run_demo(ctx.settings, transactions=transactions, seed=seed, with_dbt=with_dbt, echo=click.echo)
    if not ok:
        sys.exit(EXIT_NOT_RECONCILED)


@main.command(
    "dbt",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    short_help="Run dbt (build, test, docs generate, ...) on the loader's catalog.",
)
@click.argument("dbt_args", nargs=-1, type=click.UNPROCESSED)
@pass_ctx
@catch_errors
def dbt_cmd(ctx: Context, dbt_args: tuple[str, ...]) -> None:
    """Run dbt on the loader's catalog, e.g. 'loader dbt build', 'loader dbt docs generate'.

    Sources and per-table models are regenerated from the catalog first. The target is the
    in-process Spark session unless '--target thrift' (the server of 'loader sql-server').
    Exit status 1 when dbt fails (a failing audit included).
    """
    from loader.dbt import run_dbt

    if not run_dbt(ctx.settings, list(dbt_args) or ["--help"], echo=click.echo):
        sys.exit(EXIT_ERROR)


@main.command("dbt-sources")
@click.option(
    "--project-dir",
    "project",
    type=click.Path(file_okay=False),
    default=None,
    help="dbt project to write into or check (default: the shipped dbt_project).",
)
@click.option("--check", is_flag=True, help="Only compare: exit 1 when catalog and declared sources differ.")
@pass_ctx
@catch_errors
def dbt_sources(ctx: Context, project: str | None, check: bool) -> None:
    """Generate dbt sources and per-table models from the catalog, or check them for drift."""
    from pathlib import Path

    from loader.dbt import project_dir, write_sources
    from loader.dbtgen import declared_columns, declared_sources, read_catalog, source_drift

    target = Path(project) if project else project_dir(ctx.settings)
    if check:
        problems = source_drift(read_catalog(ctx.settings), declared_sources(target), declared_columns(target))
        for p in problems:
            click.echo(p)
        if problems:
            click.echo(f"{len(problems)} differences: run 'loader dbt-sources --project-dir {target}'", err=True)
            sys.exit(EXIT_ERROR)
        click.echo("sources in step with the catalog")
        return
    for rel in write_sources(ctx.settings, target):
        click.echo(f"wrote {target / rel}")


@main.group("sql-server", invoke_without_command=True)
@click.option("--port", type=int, default=None, help="Port (default: sql_server.port, 10000).")
@click.option("--host", default=None, help="Bind address (default: sql_server.host, 127.0.0.1).")
@click.option("--background", is_flag=True, help="Start, wait until it accepts connections, return.")
@click.option("--stop", is_flag=True, help="Stop a server started with --background.")
@click.option(
    "--self-signed-tls",
    is_flag=True,
    help="TLS with a self-signed certificate made on first use under the state directory (the "
    "truststore to give clients is printed).",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Start WITHOUT authentication and TLS: anyone who reaches the port reads and changes everything. "
    "A local test only.",
)
@click.pass_context
@catch_errors
def sql_server(
    click_ctx: click.Context,
    port: int | None,
    host: str | None,
    background: bool,
    stop: bool,
    self_signed_tls: bool,
    no_auth: bool,
) -> None:
    """Spark Thrift Server (JDBC/ODBC for BI tools) on the loader's catalog; Ctrl-C stops it.

    It starts only with authentication (users of 'loader sql-server add-user', or LDAP) and TLS
    (sql_server.tls_keystore, or --self-signed-tls), unless --no-auth.
    """
    from loader import sqlserver

    ctx = click_ctx.ensure_object(Context)
    settings = ctx.settings
    updates = {k: v for k, v in (("port", port), ("host", host)) if v is not None}
    if updates:
        settings = settings.model_copy(update={"sql_server": settings.sql_server.model_copy(update=updates)})
    ctx._settings = settings
    if click_ctx.invoked_subcommand is not None:
        return
    if stop:
        click.echo("stopped" if sqlserver.stop_background(settings) else "no background server recorded")
        return
    if self_signed_tls and not no_auth:
        settings = sqlserver.with_self_signed_tls(settings, sqlserver.self_signed_tls(settings.sql_server.host))
    if background:
        server = sqlserver.start_server(settings, background=True, echo=click.echo, no_auth=no_auth)
        click.echo(f"log: {server.log_path}; stop with 'loader sql-server --stop --port {settings.sql_server.port}'")
        return
    sys.exit(sqlserver.run_foreground(settings, echo=click.echo, no_auth=no_auth))


def _read_new_password() -> str:
    if sys.stdin.isatty():
        return str(click.prompt("password", hide_input=True, confirmation_prompt=True))
    return sys.stdin.readline().rstrip("\r\n")


@sql_server.command("add-user")
@click.argument("name")
@pass_ctx
@catch_errors
def sql_server_add_user(ctx: Context, name: str) -> None:
    """Add a user of the SQL server, or change its password.

    The password is read from a prompt, or from the first line of stdin when it is not a terminal
    (never from an argument: command lines are visible to every user of the machine). It is kept
    as a salted PBKDF2-HMAC-SHA256 hash in sql_server.password_file (mode 0600); a running server
    sees the change at the next login.
    """
    from loader import sqlserver

    path = sqlserver.password_file(ctx.settings)
    existed = sqlserver.set_user(path, name, _read_new_password())
    click.echo(f"{'changed the password of' if existed else 'added'} {name} in {path}")


@sql_server.command("remove-user")
@click.argument("name")
@pass_ctx
@catch_errors
def sql_server_remove_user(ctx: Context, name: str) -> None:
    """Remove a user of the SQL server (effective at its next login)."""
    from loader import sqlserver

    path = sqlserver.password_file(ctx.settings)
    if not sqlserver.remove_user(path, name):
        click.echo(f"no user {name} in {path}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(f"removed {name} from {path}")


@sql_server.command("users")
@pass_ctx
@catch_errors
def sql_server_users(ctx: Context) -> None:
    """List the users of the SQL server's password file."""
    from loader import sqlserver

    for name in sorted(sqlserver.read_users(sqlserver.password_file(ctx.settings))):
        click.echo(name)


if __name__ == "__main__":
    main()
