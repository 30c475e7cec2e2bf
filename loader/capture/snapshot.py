"""Consistent snapshot of tables that already hold data, landed as read ('R') changes.

How it stays consistent with the stream:
- First snapshot (no slot yet): the slot is created over a replication connection with
  ``EXPORT_SNAPSHOT``. That snapshot sees exactly the transactions committed before the slot's
  consistent point ``cp``; the slot decodes every later commit.
- Tables added later (slot exists): a TEMPORARY slot is created the same way, which gives a new
  ``cp`` and its exported snapshot; capture first lands every change the main slot holds that
  committed before ``cp``, then the snapshot is landed, then streaming continues from ``cp``.
- Rows are landed at position ``(cp - 1, 1..N)``: after every landed change (all committed before
  ``cp``) and before every change committed at or after ``cp`` (a commit record cannot start
  inside the WAL record that ends at ``cp``). A final commit marker closes the snapshot, so the
  history load takes it whole, like one transaction.

Chunked and resumable: the rows are read in key order and landed in files of
``source.snapshot_chunk_rows`` rows (files never mix tables). With ``source.snapshot_format =
"arrow"`` (the default) ADBC reads each table as Arrow batches (COPY BINARY) in a transaction that
imports the reader's snapshot, and each chunk is one landing v2 file (loader.landing.arrowfile); with
``"jsonl"`` a server-side cursor's rows become v1 lines. A state object in the
landing area (``_state/snapshot.state.json``) marks the snapshot unfinished; capture refuses to stream
until it is done. After a crash, ``loader backfill snapshot`` resumes after the last landed key
of a keyed table. The exported snapshot died with the crash, so the remaining rows are read from
a fresh snapshot: they may already contain changes committed after ``cp``; the stream replays
those changes after them, and since every change is a whole-row upsert or delete by key, the
current tables converge to the same state (``state.exact`` turns false and the summary says so).
A keyless table cannot be resumed by key: its files are removed (they were never loadable, the
snapshot having no commit yet) and the table is read again.

The stream keeps draining while the copy goes on (``_between_chunks``): every
``source.snapshot_drain_interval_s`` a nested capture run lands what the main slot holds and
confirms it, so the slot does not hold the WAL of the whole copy. Those changes sort after every
snapshot row; the load waits for the snapshot's commit before it loads them.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from loader.capture import slot as slots
from loader.capture.source_filter import TableFilter, captured_plan
from loader.capture.source_tables import column_types, list_tables, split_qualified, stored_rows, table_info
from loader.config import LoaderSettings
from loader.errors import ConfigError, LandingError, LoaderError, UsageError
from loader.lake.tables import unknown_tables
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.state import SNAPSHOT_STATE, unfinished_snapshot
from loader.landing.store import LandingFile, LandingStore, LandingWriter, open_landing
from loader.lsn import ChangePosition, format_lsn
from loader.progress import bar

# Character types as format_type spells them: ADBC reads them as utf8 text.
_CHARACTER_TYPE = re.compile(r"^(text|character varying(\(\d+\))?|character(\(\d+\))?)$")

log = logging.getLogger("loader.capture")


@dataclass
class SnapshotResult:
    tables: list[str] = field(default_factory=list)
    rows: int = 0
    files: list[str] = field(default_factory=list)
    consistent_lsn: int | None = None
    slot_created: bool = False
    resumed: bool = False
    exact: bool = True
    streamed_before: int = 0  # changes the main slot landed first (tables added later)
    streamed_during: int = 0  # changes the main slot landed between chunks, while the copy went on
    drains: int = 0
    last_seq: int = 0  # the position (seq) of the snapshot's last row or marker

    def summary(self) -> str:
        lsn = format_lsn(self.consistent_lsn) if self.consistent_lsn is not None else "-"
        text = (
            f"snapshot of {len(self.tables)} tables at consistent point {lsn}: {self.rows} rows in "
            f"{len(self.files)} landing files"
            + (" (slot created)" if self.slot_created else "")
            + (f"; {self.streamed_before} streamed changes landed first" if self.streamed_before else "")
            + (
                f"; the stream drained {self.drains} times meanwhile ({self.streamed_during} changes)"
                if self.drains
                else ""
            )
        )
        if self.resumed:
            text += "; resumed after an interruption" + (
                ""
                if self.exact
                else " (rows after the resume point read from a newer snapshot; the stream reconciles them)"
            )
        return text


class Snapshot:
    """Land a consistent snapshot of the selected tables for the configured slot."""

    def __init__(
        self,
        settings: LoaderSettings,
        store: LandingStore | None = None,
        *,
        tables: list[str] | None = None,
        on_published: Callable[[str], None] | None = None,
        chunk_rows: int | None = None,
        reason: str = "",
        reasons: dict[str, str] | None = None,
        recover: bool = False,
        stream_until: Callable[[int], tuple[int, list[str]]] | None = None,
        drain: Callable[[], tuple[int, list[str]]] | None = None,
    ) -> None:
        # recover: the slot is lost; drop what is left of it, create it again, resync every table.
        self.recover = recover
        # Lands every change the main slot holds that committed before a given LSN, returning
        # (changes, files): the capture run (loader.capture.capture.snapshot wires it).
        self.stream_until = stream_until
        # Lands every change the main slot holds now and confirms the slot past them (the capture
        # run, without a bound): called between chunks while the copy goes on (see _between_chunks).
        self.drain = drain
        self._drained_at = time.monotonic()
        self._drain_off: str | None = None
        self.reason = reason
        self.reasons = reasons or {}
        self.settings = settings
        self.store = store or open_landing(settings)
        self.requested = tables
        # A stored generated column is computed by PostgreSQL: wal2json prints it with every row,
        # pgoutput never sends it (PostgreSQL 15-17, and 18 unless the publication asks), so an
        # update of its base column would leave the lake's copy stale. With pgoutput the lake holds
        # no generated column at all (dbt computes them where wanted), the snapshot's rows neither.
        self._generated = settings.source.plugin != "pgoutput"
        self.on_published = on_published
        self.chunk_rows = chunk_rows or settings.source.snapshot_chunk_rows
        self.filter = TableFilter(settings.source.include, settings.source.exclude)

    # --- entry point ---------------------------------------------------------------------
    def run(self, *, locked: bool = False) -> SnapshotResult:
        """``locked``: the caller (a capture run) already holds the slot's capture lock."""
        src = self.settings.source
        result = SnapshotResult()
        with slots.connect(src.conninfo()) as conn, slots.owning(conn, src.slot, held=locked):
            slots.check_wal_level(conn)
            state = unfinished_snapshot(self.store)
            if state is not None:
                return self._resume(state, result)
            tables = self._select_tables(conn)
            info = slots.slot_info(conn, src.slot)
            landing_files = self.store.files()
            if self.recover or info is None:
                if landing_files and not self.recover:
                    # Landed data but no slot: changes were lost; only a full resync repairs that.
                    slots.check_not_lost(None, src.slot, str(landing_files[-1].last), None)
                if info is not None:
                    if info.active_pid is not None:
                        raise slots.SlotBusyError(
                            f"replication slot {src.slot!r} is in use by process {info.active_pid}",
                            hint="stop the other consumer before recovering the slot",
                        )
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
                if src.plugin == "pgoutput":
                    from loader.capture import pgoutput
                    from loader.capture.source_filter import publication_plan

                    plan = publication_plan(conn, self.settings)
                    pgoutput.ensure_publication(conn, src.publication, tables=sorted(plan.wanted))
                exported = slots.create_slot_exporting_snapshot(
                    src.conninfo(), src.slot, plugin=src.plugin, timeout_s=src.slot_create_timeout_s
                )
                from loader.landing.state import record_confirmed

                record_confirmed(self.store, src.slot, exported.consistent_lsn)
                result.slot_created = True
                if self.recover and landing_files:
                    lost = (
                        f"replication slot lost: changes committed after {landing_files[-1].last} and before "
                        f"{format_lsn(exported.consistent_lsn)} were not captured"
                    )
                    self.reasons = {t: lost for t in tables}
            else:
                slots.require_slot(conn, src.slot, src.plugin)
                temp = f"{src.slot[:40]}_snap_{os.getpid()}"
                exported = slots.create_slot_exporting_snapshot(
                    src.conninfo(), temp, temporary=True, plugin=src.plugin, timeout_s=src.slot_create_timeout_s
                )
                try:
                    if self.stream_until is None:
                        raise RuntimeError("a snapshot beside an existing slot needs stream_until")
                    changes, files = self.stream_until(exported.consistent_lsn)
                except BaseException:
                    exported.close()
                    raise
                result.streamed_before = changes
                result.files += files
            with exported, slots.connect(src.conninfo()) as reader:
                reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported.snapshot_name)))
                exported.close()  # the importing transaction holds the snapshot now; drops a temporary slot
                row = reader.execute("SELECT now()::text").fetchone()
                assert row is not None
                cp = exported.consistent_lsn
                landed = self.store.landed_position()
                if landed is not None and landed >= ChangePosition(cp - 1, 1):
                    raise LandingError(
                        f"landing area {self.store.url} already holds changes at or after the snapshot point {format_lsn(cp)}",
                        hint="another capture ran concurrently; re-run 'loader backfill snapshot'",
                    )
                state = {
                    "slot": src.slot,
                    "consistent_lsn": format_lsn(cp),
                    "position_lsn": cp - 1,
                    "tables": tables,
                    "ts": row[0],
                    "exact": True,
                    "done": False,
                    "reasons": {
                        t: self.reasons.get(t) or self.reason for t in tables if self.reasons.get(t) or self.reason
                    },
                }
                self.store.write_state(SNAPSHOT_STATE, state)
                result.consistent_lsn = cp
                result.tables = tables
                self._copy(reader, state, tables, seq=0, after_key=None, result=result)
                reader.execute("COMMIT")
        return result

    def plan(self) -> list[tuple[str, int]]:
        """The tables a run would snapshot, with the catalog's row estimate (a dry run)."""
        with slots.connect(self.settings.source.conninfo()) as conn:
            out = []
            for t in self._select_tables(conn):
                schema, name = split_qualified(conn, t)
                qualified = f"{sql.Identifier(schema).as_string(conn)}.{sql.Identifier(name).as_string(conn)}"
                row = conn.execute(
                    "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)", (qualified,)
                ).fetchone()
                out.append((t, int(row[0]) if row else 0))
            return out

    # --- pieces --------------------------------------------------------------------------
    def reason_for(self, qualified: str, state: dict[str, Any]) -> str:
        """Why this table is (re)snapshotted, as history's resync row will say."""
        reasons = state.get("reasons") or {}
        return str(reasons.get(qualified) or self.reason or f"snapshot at consistent point {state['consistent_lsn']}")

    def _select_tables(self, conn: psycopg.Connection) -> list[str]:
        available = [t.qualified for t in list_tables(conn, partitions=self.settings.source.partitions)]
        # A snapshot takes what capture captures, by the same rule (loader.capture.source_filter):
        # never a table the role may not read, nor (pgoutput) one the publication cannot list. A
        # table snapshotted but not captured would keep a history that never moves again, and the
        # catalog watch would not see it renamed or dropped (make fuzz, seed 1729).
        skipped = captured_plan(conn, self.settings).skipped
        if self.requested and not self.recover:  # a lost slot lost changes of every table
            problem = unknown_tables(self.requested, available, "source table")
            if problem:
                raise UsageError(f"--table: {problem}", hint="name tables as schema.table")
            refused = [t for t in self.requested if not self.filter(t)]
            if refused:
                raise ConfigError(
                    f"cannot snapshot {', '.join(refused)}: excluded by source.include/exclude, so capture would drop its changes",
                    hint="adjust LOADER_SOURCE__INCLUDE / LOADER_SOURCE__EXCLUDE first",
                )
            unreadable = [t for t in self.requested if t in skipped]
            if unreadable:
                raise ConfigError(
                    f"cannot snapshot {', '.join(unreadable)}: {skipped[unreadable[0]]}",
                    hint="make it capturable first (the reason says how), then snapshot it",
                )
            return list(self.requested)
        return [t for t in available if self.filter(t) and t not in skipped]

    def _copy(
        self,
        reader: psycopg.Connection,
        state: dict[str, Any],
        tables: list[str],
        seq: int,
        after_key: list[str | None] | None,
        result: SnapshotResult,
        marker_written: bool = False,
    ) -> None:
        if self.settings.source.snapshot_format == "arrow":
            self._copy_arrow(reader, state, tables, seq, after_key, result, marker_written)
        else:
            self._copy_jsonl(reader, state, tables, seq, after_key, result, marker_written)
        self.store.write_state(SNAPSHOT_STATE, {**state, "done": True, "rows": result.last_seq})
        self._note_in_catalog_state(reader, list(state["tables"]))

    def _query(
        self,
        conn: psycopg.Connection,
        schema: str,
        name: str,
        cols: list[tuple[str, str]],
        key: list[str],
        after_key: list[str | None] | None,
        inline: bool = False,
        native: bool = False,
    ) -> tuple[sql.Composed, list[Any]]:
        """The table's SELECT: every value as its type's output function prints it, in key order,
        after ``after_key`` when given (``inline``: its values as literals, for a reader without
        psycopg's parameters; ``native``: the columns of landing v2's ``NATIVE_TYPES`` (integers,
        booleans) as they are, for a reader that receives them as Arrow values, and character
        columns as they are: COPY BINARY sends their text, padding included, as the output function
        prints it, without the server formatting each value a second time)."""
        from loader.landing.arrowfile import NATIVE_TYPES

        def as_is(t: str) -> bool:
            return native and (t in NATIVE_TYPES or _CHARACTER_TYPE.match(t) is not None)

        types = dict(cols)
        # wal2json prints each value with its type's output function (booleans as true/false).
        # format('%s') calls that output function; ::text can differ (char(n) trims its padding,
        # inet adds /32). Output columns are aliased so ORDER BY / WHERE see the typed columns.
        select = sql.SQL(", ").join(
            sql.SQL(
                "_t.{0} AS {1}"
                if as_is(t)
                else "_t.{0}::text AS {1}"
                if t == "boolean"
                else "CASE WHEN _t.{0} IS NULL THEN NULL ELSE concat(_t.{0}) END AS {1}"
            ).format(sql.Identifier(c), sql.Identifier(f"_c{j}"))
            for j, (c, t) in enumerate(cols)
        )
        query = sql.SQL("SELECT {} FROM {} AS _t").format(select, stored_rows(conn, schema, name))
        params: list[Any] = []
        if key:
            if after_key is not None:
                lhs = sql.SQL(", ").join(sql.SQL("_t.{}").format(sql.Identifier(k)) for k in key)
                rhs = sql.SQL(", ").join(
                    sql.SQL("{}::{}").format(sql.Literal(v) if inline else sql.Placeholder(), sql.SQL(types[k]))
                    for k, v in zip(key, after_key)
                )
                query += sql.SQL(" WHERE ({}) > ({})").format(lhs, rhs)
                params = [] if inline else list(after_key)
            query += sql.SQL(" ORDER BY {}").format(
                sql.SQL(", ").join(sql.SQL("_t.{}").format(sql.Identifier(k)) for k in key)
            )
        return query, params

    def _estimate(self, reader: psycopg.Connection, schema: str, name: str) -> int | None:
        estimate = reader.execute(
            "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            (f"{sql.Identifier(schema).as_string(reader)}.{sql.Identifier(name).as_string(reader)}",),
        ).fetchone()
        return int(estimate[0]) if estimate else None

    def _copy_jsonl(
        self,
        reader: psycopg.Connection,
        state: dict[str, Any],
        tables: list[str],
        seq: int,
        after_key: list[str | None] | None,
        result: SnapshotResult,
        marker_written: bool,
    ) -> None:
        pos = int(state["position_lsn"])
        cp = pos + 1
        writer = LandingWriter(self.store, self.chunk_rows)
        try:
            for i, qualified, schema, name, cols, key in _readable(reader, tables, self._generated):
                # Every record of this table in the snapshot's one transaction, just before the consistent point.
                record = partial(
                    ChangeRecord,
                    commit_lsn=pos,
                    xid=0,
                    ts=state["ts"],
                    schema=schema,
                    table=name,
                    change_lsn=cp,
                    pk=list(key),
                )
                query, params = self._query(reader, schema, name, cols, key, after_key if i == 0 else None)
                if not (marker_written and i == 0):
                    # The table's state is replaced here: keys missing from the rows below are gone.
                    seq += 1
                    # It carries the table's columns (values null): an empty table still gets its shape.
                    writer.write(
                        record(
                            op="S",
                            seq=seq,
                            columns=[Column(c, t, None) for c, t in cols],
                            reason=self.reason_for(qualified, state),
                        )
                    )
                with (
                    reader.cursor(name=f"loader_snapshot_{i}") as cur,
                    bar(self._estimate(reader, schema, name), f"snapshot {qualified}", "rows") as progress,
                ):
                    cur.itersize = self.settings.source.fetch_size
                    cur.execute(query, params or None)
                    for values in cur:
                        progress.update()
                        seq += 1
                        writer.write(
                            record(op="R", seq=seq, columns=[Column(c, t, v) for (c, t), v in zip(cols, values)])
                        )
                        result.rows += 1
                        self._drain(writer, result)
                if i < len(tables) - 1:
                    writer.close_file()  # files never mix tables, so a keyless table restarts cleanly
                    self._drain(writer, result)
            writer.write(ChangeRecord(op=COMMIT, commit_lsn=pos, seq=seq + 1, xid=0, ts=state["ts"]))
            writer.close_file()
            self._drain(writer, result, last=True)
        except BaseException:
            writer.abort()
            raise
        result.last_seq = seq

    def _copy_arrow(
        self,
        reader: psycopg.Connection,
        state: dict[str, Any],
        tables: list[str],
        seq: int,
        after_key: list[str | None] | None,
        result: SnapshotResult,
        marker_written: bool,
    ) -> None:
        """The same records as ``_copy_jsonl``, landed as v2 files (loader.landing.arrowfile): each
        table read by ADBC (COPY BINARY into Arrow batches) in a transaction importing ``reader``'s
        snapshot, cut into chunks of ``chunk_rows`` rows, one file each; the table's resync marker
        goes in its first file's header, the snapshot's commit marker in the last file's."""
        from loader.landing.arrowfile import SnapshotHeader

        pos = int(state["position_lsn"])
        cp = pos + 1
        snapshot_name = reader.execute("SELECT pg_export_snapshot()").fetchone()
        assert snapshot_name is not None
        commit_seq: int | None = None
        last_table = len(tables) - 1
        with _adbc_reader(self.settings.source.conninfo(), str(snapshot_name[0])) as cur:
            for i, qualified, schema, name, cols, key in _readable(reader, tables, self._generated):
                query, _ = self._query(
                    reader, schema, name, cols, key, after_key if i == 0 else None, inline=True, native=True
                )
                resync: dict[str, Any] | None = None
                if not (marker_written and i == 0):
                    # The table's state is replaced here: keys missing from the rows below are gone.
                    seq += 1
                    resync = {"seq": seq, "reason": self.reason_for(qualified, state)}
                with bar(self._estimate(reader, schema, name), f"snapshot {qualified}", "rows") as progress:
                    cur.execute(query.as_string(reader))
                    for chunk, last in _chunks(cur.fetch_record_batch(), self.chunk_rows):
                        n = chunk.num_rows if chunk is not None else 0
                        if n == 0 and resync is None and not (last and i == last_table):
                            continue
                        header = SnapshotHeader(
                            schema=schema,
                            table=name,
                            commit_lsn=pos,
                            change_lsn=cp,
                            xid=0,
                            ts=state["ts"],
                            pk=list(key),
                            columns=list(cols),
                            rows=n,
                            resync=resync,
                        )
                        first = seq + 1
                        seq += n
                        if last and i == last_table:
                            commit_seq = seq + 1
                            header.commit = {"seq": commit_seq}
                        self._publish_arrow(
                            header, first, [chunk.column(j) for j in range(len(cols))] if n else [], result
                        )
                        result.rows += n
                        progress.update(n)
                        resync = None
                        if commit_seq is None:
                            self._between_chunks(result)
        if commit_seq is None:  # the last table was dropped meanwhile: the commit marker alone
            header = SnapshotHeader("", "", pos, cp, 0, state["ts"], [], [], commit={"seq": seq + 1})
            self._publish_arrow(header, seq + 1, [], result)
        result.last_seq = seq

    def _publish_arrow(self, header: Any, first_seq: int, columns: list[Any], result: SnapshotResult) -> None:
        """One v2 file published atomically (0600 spool, ``store.publish``), then handed on like v1's."""
        from loader.faults import checkpoint
        from loader.landing.store import publish_arrow as publish

        name = publish(self.store, header, first_seq, columns)
        result.files.append(name)
        checkpoint("snapshot-after-publish")
        if self.on_published is not None:
            self.on_published(name)

    def _note_in_catalog_state(self, conn: psycopg.Connection, tables: list[str]) -> None:
        """Tell the capture's catalog watch that these tables are resynced as of now.

        Otherwise the next capture would compare against what it saw before the resync and resync
        the tables again (a table included again, a rewrite it already covered).
        """
        from loader.capture.watch import read_facts
        from loader.landing.state import CATALOG_STATE

        state = self.store.read_state(CATALOG_STATE)
        if state is None:
            return  # no capture ran yet: its first run records the catalog as it is
        facts = read_facts(conn, self.settings.source.partitions).facts
        known = dict(state.get("tables", {}))
        included = set(state.get("included", []))
        pending = dict(state.get("pending_resyncs", {}))
        for t in tables:
            if t in facts:
                known[t] = facts[t].to_doc()
                included.add(t)
            pending.pop(t, None)
        self.store.write_state(
            CATALOG_STATE, {**state, "tables": known, "included": sorted(included), "pending_resyncs": pending}
        )

    def _resume(self, state: dict[str, Any], result: SnapshotResult) -> SnapshotResult:
        pos = int(state["position_lsn"])
        tables: list[str] = list(state["tables"])
        result.resumed = True
        result.consistent_lsn = pos + 1
        result.tables = tables
        mine = [f for f in self.store.files() if f.first.commit_lsn == pos]
        if any(f.complete for f in mine):  # crashed after the last file, before the state update
            self.store.write_state(SNAPSHOT_STATE, {**state, "done": True})
            return result
        after_key: list[str | None] | None = None
        start = 0
        seq = 0
        marker_written = False
        with slots.connect(self.settings.source.conninfo()) as reader:
            if mine:
                last = self._last_record(mine[-1])
                start = tables.index(f"{last.schema}.{last.table}")
                key = self._key(reader, f"{last.schema}.{last.table}")
                if not key and self.stream_until is not None:
                    # Its files go; it is read again below, at a consistent point of its own.
                    seq = self._drop_table_files(mine, last.schema, last.table)
                elif last.op == "S":
                    # Only the table's resync marker landed: copy all of it, without a second marker.
                    seq, marker_written = last.seq, True
                elif key:
                    values = {c.name: c.value for c in last.columns}
                    after_key = [values[k] for k in key]
                    seq, marker_written = last.seq, True
                else:
                    seq = self._drop_table_files(mine, last.schema, last.table)
            # The rest is read from a newer snapshot than the consistent point, so rows already hold
            # changes the stream lands again after them. A keyed table converges (every change is a
            # whole-row upsert or delete by key); a keyless one would hold those rows twice. So the
            # keyless tables left are read at a consistent point of their own, right after (a
            # temporary slot's, with the stream landed up to it first, as for a table added later).
            later = [t for t in tables[start:] if self.stream_until is not None and not self._key(reader, t)]
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            state = {**state, "exact": False}
            result.exact = False
            self.store.write_state(SNAPSHOT_STATE, state)
            self._copy(
                reader,
                state,
                [t for t in tables[start:] if t not in later],
                seq=seq,
                after_key=after_key,
                result=result,
                marker_written=marker_written,
            )
            reader.execute("COMMIT")
        if later:
            self._read_again(later, state, result)
        return result

    def _key(self, conn: psycopg.Connection, qualified: str) -> list[str]:
        schema, name = split_qualified(conn, qualified)
        info = table_info(conn, schema, name)
        return list(info.key) if info is not None else []

    def _read_again(self, tables: list[str], state: dict[str, Any], result: SnapshotResult) -> None:
        """Snapshot ``tables`` again, exactly, through a temporary slot (see ``run``)."""
        why = "the snapshot was interrupted and resumed: a table without a key is read at a consistent point of its own"
        again = Snapshot(
            self.settings,
            self.store,
            tables=tables,
            reasons={t: self.reason_for(t, state) + f"; {why}" for t in tables},
            on_published=self.on_published,
            stream_until=self.stream_until,
            drain=self.drain,
        ).run(locked=True)
        result.files += again.files
        result.rows += again.rows
        result.streamed_before += again.streamed_before
        result.drains += again.drains
        result.streamed_during += again.streamed_during

    def _last_record(self, f: LandingFile) -> ChangeRecord:
        last: ChangeRecord | None = None
        for rec in self.store.read_records(f.name):
            last = rec
        if last is None or last.op == COMMIT:
            raise LandingError(f"snapshot landing file {self.store.url}/{f.name} is empty", hint="delete it and re-run")
        return last

    def _drop_table_files(self, mine: list[LandingFile], schema: str, table: str) -> int:
        """Remove the (never loadable) files of an interrupted keyless table; returns the seq before them."""
        keep_seq = 0
        for f in reversed(mine):
            first = next(iter(self.store.read_records(f.name)))
            if (first.schema, first.table) != (schema, table):
                keep_seq = f.last.seq
                break
            self.store.delete(f.name)
        return keep_seq

    def _drain(self, writer: LandingWriter, result: SnapshotResult, last: bool = False) -> None:
        published = len(result.files)
        writer.drain(result.files, "snapshot-after-publish", self.on_published)
        if len(result.files) != published and not last:
            self._between_chunks(result)

    def _between_chunks(self, result: SnapshotResult) -> None:
        """Capture the stream while the copy goes on, at most every ``source.snapshot_drain_interval_s``.

        The copy's transaction keeps its snapshot whatever the slot does, and every change the
        stream lands now is at or after the consistent point, so it sorts after every row of the
        snapshot (landed or still to land); the load stops before the snapshot's files until its
        commit lands (loader.load.history.HistoryLoad.pending_files). Without this, the slot would
        hold all the WAL written during the copy (hours of it for a big table). A drain that fails
        is reported and not tried again in this snapshot: the copy goes on, the next capture
        lands the rest.
        """
        interval = self.settings.source.snapshot_drain_interval_s
        if self.drain is None or interval < 0 or self._drain_off is not None:
            return
        if time.monotonic() - self._drained_at < interval:
            return
        try:
            changes, files = self.drain()
        except LoaderError as exc:
            self._drain_off = str(exc)
            log.warning(
                "the stream could not be captured while the snapshot copies (%s); the slot holds the WAL "
                "written until the snapshot ends, and the next capture lands it",
                exc,
            )
            return
        finally:
            self._drained_at = time.monotonic()
        result.drains += 1
        result.streamed_during += changes
        result.files += files


# The ADBC reader sets what every psycopg source connection gets as options (slot.SESSION_SETTINGS):
# the text form of timestamps, dates, intervals, floats and bytea, row security and timeouts.
_ADBC_SESSION = tuple(f"SET {name} = '{value}'" for name, value in slots.SESSION_SETTINGS.items())


@contextmanager
def _adbc_reader(conninfo: str, snapshot_name: str) -> Iterator[Any]:
    """An ADBC cursor in a read-only repeatable-read transaction that imports ``snapshot_name``."""
    import adbc_driver_postgresql.dbapi as adbc

    try:
        conn = adbc.connect(conninfo, autocommit=True)
    except Exception as exc:  # the driver's own error types; psycopg connected a moment ago
        from loader.errors import SourceError

        raise SourceError(f"the snapshot's ADBC reader cannot connect: {str(exc).strip().splitlines()[0]}") from exc
    try:
        cur = conn.cursor()
        for statement in _ADBC_SESSION:
            cur.execute(statement)
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot_name}'")
        yield cur
        cur.execute("COMMIT")
        cur.close()
    finally:
        conn.close()


def _readable(
    reader: psycopg.Connection, tables: list[str], generated: bool
) -> Iterator[tuple[int, str, str, str, list[tuple[str, str]], list[str]]]:
    """The snapshot's tables as the reader sees them: (index, qualified name, schema, name,
    columns, key); a table dropped since the snapshot was planned is left out. Generated columns
    only when ``generated`` (see ``Snapshot._generated``)."""
    for i, qualified in enumerate(tables):
        schema, name = split_qualified(reader, qualified)
        info = table_info(reader, schema, name)
        if info is not None:
            yield i, qualified, schema, name, column_types(reader, schema, name, generated), info.key


def _chunks(batches: Any, rows: int) -> Iterator[tuple[Any, bool]]:
    """``batches`` (an Arrow RecordBatchReader) cut into tables of ``rows`` rows, each with whether
    it is the last; at least one (possibly empty, then None) is yielded. Holds one finished chunk
    (until it is known whether more follow) and less than one more chunk of read batches."""
    import pyarrow as pa

    schema = batches.schema
    buf: list[Any] = []
    have = 0
    pending: Any = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        buf.append(batch)
        have += batch.num_rows
        while have >= rows:
            table = pa.Table.from_batches(buf, schema=schema)
            if pending is not None:
                yield pending, False
            pending = table.slice(0, rows).combine_chunks()
            buf = table.slice(rows).to_batches()
            have -= rows
    if have:
        if pending is not None:
            yield pending, False
        pending = pa.Table.from_batches(buf, schema=schema).combine_chunks()
    yield pending, True
