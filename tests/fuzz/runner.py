"""The fuzzer's runner: a generated workload applied to a real source, the real loader run between
steps (in-process on the test session's Spark, or as processes killed or overlapping), and the
oracles after every run:

- each current table equals ``SELECT * FROM`` its source table, row for row (``loader.verify``); a
  table the source no longer has (renamed away, dropped) is parked with its reason, and a source
  table holding rows has a history table; a table that had columns whose names differ only in case
  may be parked for that reason alone (decided: the lake cannot hold both names);
- no position appears twice in any history table;
- for tables the audit trigger logs, history holds exactly the logged changes: per transaction, in
  commit order, the same operations on the same keys.

With the known gap ``nan_infinity`` drawn, a table verify finds different is read again on both
sides (its current table, or a keyless table's history state) and passes only if every difference is
a NULL in the lake where the source holds a numeric/float NaN or +-Infinity (``tests/fuzz/nan_gap.py``),
and capture flagged the table for it (a note in a capture's summary; not checked once a capture
process was killed, whose summary never printed). A table parked because a snapshot or resync read a
NaN its numeric(p,s) column (a lake decimal) cannot hold, every reject of it such a NaN, is accepted
too: the loader's documented answer to a value that does not fit.

A failure names the seed and the step and writes the SQL that reproduces it (``Workload.script``).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from loader.capture.capture import CaptureResult, snapshot
from loader.cli import EXIT_PARKED
from loader.errors import SlotBusyError, StageBusyError
from loader.names import lake_column
from loader.verify import Reconciliation
from tests.fuzz import nan_gap
from tests.fuzz.workload import AUDIT_SCHEMA, SCHEMAS, Loader, Sql, Workload, is_copy
from tests.harness import Env, overlap, run_killed
from tests.oracle import assert_unique_positions, history_rows

#: Exit statuses of a loader process that did its work: 0, or EXIT_PARKED when some table is parked
#: (load and merge say so whenever one is: a table renamed away or dropped at the source, or with
#: columns differing only in case). Whether each park is right is the oracle's to judge, after the
#: next run (found by make fuzz, seed 37: a held merge exited 5 for a table moved by SET SCHEMA).
SUCCEEDED = (0, EXIT_PARKED)


class FuzzFailure(AssertionError):
    pass


class FuzzRun:
    def __init__(self, env: Env, workload: Workload, out_dir: Path) -> None:
        self.env = env
        self.w = workload
        self.out_dir = out_dir
        self.audit_from = 0  # audit rows after this one are changes the stream carries
        self.timings: Counter[str] = Counter()
        self.captured: Counter[str] = Counter()  # rows of in-process captures: pipelined, in columns
        self.case_clashes: set[str] = set()  # tables that had columns differing only in case
        # The known gap nan_infinity: tables capture flagged for it, whether a capture ended unseen
        # (killed: its summary never printed), and how many lake values the oracle accepted as NULL.
        self.nan_gap = "nan_infinity" in workload.gaps
        self.nan_flagged: set[str] = set()
        self.capture_unseen = False
        self.nan_accepted: Counter[str] = Counter()
        self.nan_parked: set[str] = set()  # tables accepted as parked for NaN in a numeric(p,s) column
        env.configure("source", exclude=["pg_catalog.*", "information_schema.*", f"{AUDIT_SCHEMA}.*"])
        env.configure(
            "load",
            driver_max_bytes=workload.group_bytes if workload.driver_load else 0,
            commit_interval_s=workload.commit_interval_s,
        )
        env.configure(
            "source",
            ddl_trigger=workload.ddl_trigger,
            plugin=workload.plugin,
            publication="fuzz_pub",
            stream_format=workload.stream_format,
        )
        pipelined = workload.pipelined_rounds > 0
        env.configure(
            "source",
            pipeline_min_lag_mb=0 if pipelined else -1,
            pipeline_round_rows=workload.pipelined_rounds or 100_000,
        )
        # What a loader process needs beside the harness's settings.
        self.proc_env = {
            "LOADER_SOURCE__EXCLUDE": json.dumps(env.settings.source.exclude),
            "LOADER_SOURCE__DDL_TRIGGER": json.dumps(workload.ddl_trigger),
            "LOADER_SOURCE__PLUGIN": workload.plugin,
            "LOADER_SOURCE__STREAM_FORMAT": workload.stream_format,
            "LOADER_SOURCE__PUBLICATION": "fuzz_pub",
            "LOADER_LOAD__DRIVER_MAX_BYTES": str(env.settings.load.driver_max_bytes),
            "LOADER_LOAD__COMMIT_INTERVAL_S": str(env.settings.load.commit_interval_s),
            "LOADER_SOURCE__PIPELINE_MIN_LAG_MB": str(env.settings.source.pipeline_min_lag_mb),
            "LOADER_SOURCE__PIPELINE_ROUND_ROWS": str(env.settings.source.pipeline_round_rows),
        }

    # --- the run ---------------------------------------------------------------------------
    def run(self) -> None:
        for i, step in enumerate(self.w.steps):
            started = time.monotonic()
            try:
                if isinstance(step, Sql):
                    self.apply(step)
                else:
                    self.loader(step)
            except Exception as exc:
                raise self.failure(i, exc) from exc
        # The pipelined dimension must reach the path it is for: a pipelined read decoded in columns
        # (wal2json's: pgoutput always peeks).
        if self.w.pipelined_rounds and self.w.plugin == "wal2json":
            assert self.captured["in columns"] > 0, (
                f"seed {self.w.seed}: no capture decoded rows in columns ({dict(self.captured)})"
            )
        else:
            assert self.captured["pipelined"] == 0, f"seed {self.w.seed}: a capture pipelined"
            kind = "sql" if isinstance(step, Sql) else f"{step.action} {step.stage}".strip()
            self.timings[kind] += time.monotonic() - started

    def failure(self, step: int, exc: Exception) -> FuzzFailure:
        path = self.out_dir / f"fuzz-seed-{self.w.seed}.sql"
        script = self.w.script(upto=step)
        path.write_text(script)
        print(script)
        what = self.w.steps[step]
        return FuzzFailure(
            f"fuzz seed {self.w.seed} failed at step {step} ({what}): {type(exc).__name__}: {exc}\n"
            f"reproduce: psql -v ON_ERROR_STOP=1 -f {path} (loader actions are comments in it);"
            f" rerun: make fuzz SEEDS=1 FUZZ_START={self.w.seed}"
        )

    def apply(self, step: Sql) -> None:
        apply_sql(self.env.conn, step)
        if any("ALTER TABLE" in s for s in step.statements):
            self.case_clashes |= self.tables_with_case_clashes()

    def loader(self, step: Loader) -> None:
        env = self.env
        if step.action == "snapshot":
            self.audit_from = int(env.sql(f"SELECT coalesce(max(n), 0) FROM {AUDIT_SCHEMA}.changes")[0][0])
            snapshot(env.settings).run()
            self.capture()
        elif step.action == "capture":
            self.capture()
        elif step.action == "run":
            t0 = time.monotonic()
            self.capture()
            t1 = time.monotonic()
            env.load()
            t2 = time.monotonic()
            env.merge()
            t3 = time.monotonic()
            self.oracle()
            self.timings["run: capture"] += t1 - t0
            self.timings["run: load"] += t2 - t1
            self.timings["run: merge"] += t3 - t2
            self.timings["run: oracle"] += time.monotonic() - t3
        elif step.action == "kill":
            self.before(step.stage)
            rc, out = run_killed(env, step.stage, step.point, **self.proc_env)
            self.seen(out)
            if step.stage == "capture" and rc == -signal.SIGKILL:
                self.capture_unseen = True
            # The point may not be reached (nothing to publish, no resync): then the run must succeed
            # (parked tables included: the oracle after the next run judges each park).
            assert rc in (-signal.SIGKILL, *SUCCEEDED), f"loader {step.stage} with {step.point} ended {rc}:\n{out}"
        elif step.action == "overlap":
            self.before(step.stage)
            raised, rc, out = overlap(env, step.stage, **self.proc_env)
            self.seen(out)
            assert isinstance(raised, (SlotBusyError, StageBusyError)), (
                f"the second {step.stage} was not refused: {raised!r}"
            )
            assert rc in SUCCEEDED, f"the held loader {step.stage} ended {rc}:\n{out}"
        else:
            raise ValueError(step.action)

    def before(self, stage: str) -> None:
        """What must have run so that ``stage`` has work: capture before load, load before merge."""
        if stage in ("load", "merge"):
            self.capture()
        if stage == "merge":
            self.env.load()

    def capture(self) -> CaptureResult:
        """An in-process capture, its notes seen."""
        result = self.env.capture()
        self.seen("\n".join(result.notes))
        self.captured["pipelined"] += result.pipelined_rows
        self.captured["in columns"] += result.columnar_rows
        return result

    def seen(self, output: str) -> None:
        """A capture's notes (or a loader process's output): the tables flagged for NaN/+-Infinity."""
        self.nan_flagged |= nan_gap.flagged_tables(output)

    # --- the oracles ---------------------------------------------------------------------
    def oracle(self) -> None:
        env = self.env
        source = self.source_tables()
        results = env.reconcile()
        seen = set()
        bad = []
        self.case_clashes |= self.tables_with_case_clashes()
        for r in results:
            seen.add(r.table)
            if r.table in source:
                if r.parked and r.table in self.case_clashes:
                    # Decided: a name the lake cannot hold parks that table alone, until an operator
                    # renames and resyncs it (a later park, such as one waiting for a resync after
                    # more DDL, may be the reason shown).
                    continue
                if r.parked and self.nan_gap and self.parked_for_nan(r):
                    continue  # decided: a decimal cannot hold NaN; the table waits for a resync
                if not r.ok:
                    if self.nan_gap and r.parked is None:
                        problems = self.nan_gap_problems(r)
                        if not problems:
                            continue
                        r.examples.append("read again, allowing NULL for NaN/±Infinity: " + "; ".join(problems[:5]))
                    bad.append(r.line() + "\n  " + "\n  ".join(r.examples))
            elif r.parked is None:
                bad.append(f"{r.table}: gone from the source but not parked ({r.line()})")
        for table, rows in source.items():
            if rows and table not in seen:
                bad.append(f"{table}: {rows} rows in the source, no history table")
        assert not bad, "current tables differ from the source:\n" + "\n".join(bad)
        assert_unique_positions(env.settings)
        for table, key in self.w.tracked.items():
            self.assert_history_is_the_audit(table, key)

    def parked_for_nan(self, r: Reconciliation) -> bool:
        """Whether ``r``'s table is parked for NaN in a numeric(p,s) column alone (``nan_gap.parked_for_nan``)."""
        from pyiceberg.expressions import EqualTo

        from loader.lake.catalog import open_catalog

        settings = self.env.settings
        rejects = open_catalog(settings).load_table((settings.catalog.loader_namespace, "rejects"))
        rows = rejects.scan(row_filter=EqualTo("source_table", r.table), selected_fields=("reason",)).to_arrow()
        if not nan_gap.parked_for_nan(r.parked or "", rows.column("reason").to_pylist()):
            return False
        self.nan_parked.add(r.table)
        return True

    def nan_gap_problems(self, r: Reconciliation) -> list[str]:
        """The differences of ``r``'s table that the gap nan_infinity does not explain, both sides read
        again (see ``tests/fuzz/nan_gap.py``); empty if every one is a lake NULL for a NaN/±Infinity
        of a numeric/float column (at least one), in a table capture flagged for it."""
        from psycopg import sql

        from loader import canonical
        from loader.lake.catalog import open_catalog
        from loader.lake.tables import PROP_PG_TYPES, PROP_PRIMARY_KEY, SourceTable
        from loader.lake.types import spark_type
        from loader.verify import _history_state

        env, c = self.env, self.env.settings.catalog
        table = r.source or SourceTable.parse(r.table)
        catalog = open_catalog(env.settings)
        hist = catalog.load_table((c.history_namespace, table.iceberg_name))
        pk: list[str] = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
        lake_table = catalog.load_table((c.current_namespace, table.iceberg_name)) if pk else hist
        # As verify compares: the lake's types, the columns the source still has.
        source_types = dict(
            env.sql(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
                " AND attnum > 0 AND NOT attisdropped",
                (sql.Identifier(table.schema, table.table).as_string(env.conn),),
            )
        )
        lake_types: dict[str, str] = json.loads(lake_table.properties.get(PROP_PG_TYPES, "{}"))
        columns = {name: t for name, t in lake_types.items() if name in source_types}
        names = list(columns)
        # A value is the gap's only where the source's column is numeric/float too.
        types = [t if nan_gap.special_texts(source_types[n]) else "" for n, t in columns.items()]
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(canonical.source_piece(n, t) for n, t in columns.items()),
            sql.Identifier(table.schema, table.table),
        )
        source = [tuple(row) for row in env.sql(query.as_string(env.conn))]
        if pk:
            at = [names.index(k) for k in pk]
            arrow = lake_table.scan(selected_fields=tuple(lake_column(n) for n in names)).to_arrow()
            pieces = [
                canonical.lake_pieces(arrow.column(lake_column(n)), spark_type(t)).to_pylist()
                for n, t in columns.items()
            ]
            lake: dict[nan_gap.Row, nan_gap.Row] = {}
            problems = []
            for row in zip(*pieces):
                k = tuple(row[i] for i in at)
                if k in lake:
                    problems.append(f"duplicate key {k} in the lake")
                lake[k] = row
            more, accepted = nan_gap.judge_keyed(names, types, {tuple(row[i] for i in at): row for row in source}, lake)
            problems += more
        else:
            state = [
                (nan_gap.split_pieces(text), sign)
                for texts, sign in _history_state(hist, columns, None)
                for text in texts.to_pylist()
            ]
            problems, accepted = nan_gap.judge_keyless(names, types, source, state)
        if not problems and not accepted:
            problems.append("verify found differences that reading both sides again does not")
        if accepted and r.table not in self.nan_flagged and not self.capture_unseen:
            problems.append(f"{accepted} NaN/±Infinity values are NULL, but no capture flagged the table for it")
        if not problems:
            self.nan_accepted[r.table] += accepted
        return problems

    def tables_with_case_clashes(self) -> set[str]:
        """Source tables with two columns whose names differ only in case (the lake cannot hold both)."""
        rows = self.env.sql(
            "SELECT n.nspname || '.' || c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE a.attnum > 0 AND NOT a.attisdropped AND n.nspname = ANY(%s) AND c.relkind IN ('r', 'p')"
            " GROUP BY 1, lower(a.attname) HAVING count(*) > 1",
            (list(SCHEMAS),),
        )
        return {r[0] for r in rows}

    def source_tables(self) -> dict[str, int]:
        """Captured source tables (partitioned tables as their root) and their row counts.

        pgoutput: a table without a replica identity by PostgreSQL's own rule (FULL, or an index
        ``pg_get_replica_identity_index`` names) cannot be published without making its UPDATE and
        DELETE fail, so it is not captured (and not snapshotted): left out here."""
        followed = (
            " AND (c.relkind <> 'r' OR c.relreplident = 'f' OR pg_get_replica_identity_index(c.oid) IS NOT NULL)"
            if self.w.plugin == "pgoutput"
            else ""
        )
        rows = self.env.sql(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname = ANY(%s)" + followed,
            (list(SCHEMAS),),
        )
        out = {}
        for schema, name, kind in rows:
            only = "" if kind == "p" else "ONLY "  # an inheritance parent's own rows, a partitioned table's all
            count = self.env.sql(f'SELECT count(*) FROM {only}"{schema}"."{name}"')[0][0]
            out[f"{schema}.{name}"] = int(count)
        return out

    def assert_history_is_the_audit(self, table: str, key: list[str]) -> None:
        """History's changes of ``table``, transaction by transaction, are the audit log's."""
        audit: dict[int, Counter[tuple[str, tuple[str, ...]]]] = {}
        for xid, op, k in self.env.sql(
            f"SELECT xid, op, key FROM {AUDIT_SCHEMA}.changes WHERE tbl = %s AND n > %s ORDER BY n",
            (table, self.audit_from),
        ):
            audit.setdefault(int(xid), Counter())[(op, tuple(k or ()))] += 1
        hist: dict[int, Counter[tuple[str, tuple[str, ...]]]] = {}
        cols = [lake_column(c) for c in key]
        rows = [
            r
            for r in history_rows(self.env.settings, table, ["pg_txn_id", "pg_operation", "pg_old_key", *cols])
            if r["pg_operation"] in ("insert", "update", "delete", "truncate")
        ]
        for r in rows:
            op = r["pg_operation"]
            if op == "truncate":
                k: tuple[str, ...] = ()
            elif op == "delete":
                old = json.loads(r["pg_old_key"])
                k = tuple(_text(old[c]) for c in key)
            else:
                k = tuple(_text(r[c]) for c in cols)
            hist.setdefault(int(r["pg_txn_id"]), Counter())[(op, k)] += 1
        assert list(hist) == list(audit), (
            f"{table}: history has transactions {list(hist)}, the source committed {list(audit)} (in commit order)"
        )
        for xid, made in audit.items():
            got = hist[xid]
            assert got == made, f"{table}: transaction {xid} differs: history {dict(got)} vs made {dict(made)}"


def apply_sql(conn: Any, step: Sql) -> None:
    """A step's statements on an autocommit connection, in order (COPY's data through the protocol)."""
    for statement in step.statements:
        if is_copy(statement):
            head, _, data = statement.partition("\n")
            body = data[: -len("\\.")] if data.endswith("\\.") else data
            with conn.cursor() as cur, cur.copy(head) as copy:
                copy.write(body.encode())
        else:
            conn.execute(statement)


def _text(v: Any) -> str:
    return str(v)
