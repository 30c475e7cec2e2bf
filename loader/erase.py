"""Erasure of a data subject (``loader erase``): every value of it, everywhere the lake keeps bytes.

A subject is a value of one or more key columns: ``--subject customer=123`` resolves through
``dbt.subject_columns`` (``{"customer": ["public.customers.customer_id", "public.orders.customer_id"]}``),
``--table public.customers --key customer_id=123`` names one column directly. For each column:

1. history: every change whose row carries the value, or whose old key does (updates and deletes,
   and REPLICA IDENTITY FULL old rows), is deleted;
2. current: the rows carrying it are deleted;
3. rejects: quarantined changes whose raw text holds the value as a JSON string, of the table or
   of no known table (a line too damaged to say which table it belonged to);
4. dbt's change log and SCD2 tables (``analytics.<model>__changes`` / ``__scd2``), if built;
5. landing files: rewritten without the records that carry it (header counts adjusted), and
   without lines too damaged to parse whose raw text holds it; a landing file that cannot be read
   (damaged gzip) may still hold it, so the erasure names it and fails (``ErasureIncompleteError``,
   after doing everything else) instead of reporting success;
6. Iceberg keeps old bytes in data files of older snapshots: every touched table's files holding
   the value are rewritten, snapshots are expired down to the current one, manifests rewritten,
   and files no snapshot references are removed (so the bytes are gone from storage).

An audit record goes to ``loader.erasures`` (when, which subject type, a salted hash, tables, rows
removed, the loaded-through position): no personal value. The salted hash of each erased value
goes to ``loader.erased_keys``; every later load drops changes that carry one (so a replay, a
resync or a late file cannot bring the subject back), and the dbt audit checks against it.

``--dry-run`` counts what would go and changes nothing. Erasure takes the load and merge locks;
stop a follower first (it holds them). Concurrent writers to the warehouse other than the loader
(dbt) should not run during an erasure: orphan removal deletes every unreferenced file.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loader.config import LoaderSettings
from loader.errors import ConfigError, DecompressedSizeError, ErasureIncompleteError
from loader.lake.catalog import history_source_tables, lake_source_table
from loader.lake.commits import ensure_loader_tables
from loader.lake.erased import ERASED_KEYS_DDL, PROP_SALT, value_hash
from loader.lake.iceberg import (
    delete_orphan_files,
    table_exists,
    table_properties,
    update_properties,
    watermark,
)
from loader.lake.tables import SUMMARY_LOADED_THROUGH, SourceTable, TableNames
from loader.lake.types import quote_ident, sql_string
from loader.landing.records import FileHeader, parse_header
from loader.landing.store import ARROW, CHANGES, GZIP_DAMAGE, TABLES, LandingStore, gunzip_bounded, open_landing
from loader.locks import stage_lock
from loader.names import lake_column

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("loader.erase")

ERASURES_DDL = (
    "erased_at TIMESTAMP, subject_type STRING, subject_hash STRING, tables ARRAY<STRING>,"
    " rows_removed MAP<STRING, BIGINT>, landing_records_removed BIGINT, loaded_through STRING"
)
# A landing file the erasure cannot read: damaged, or decompressing past landing.max_decompressed_mb.
_UNSCRUBBABLE: tuple[type[BaseException], ...] = (*GZIP_DAMAGE, ValueError, DecompressedSizeError)


@dataclass(frozen=True)
class Target:
    table: SourceTable
    column: str  # source column name
    value: str  # PostgreSQL text form of the value

    @property
    def lake(self) -> str:
        return lake_column(self.column)


@dataclass(frozen=True)
class _Place:
    kind: str  # history, current, rejects, dbt change log, dbt scd2
    ident: str
    rows: str  # predicate of the rows holding the value
    files: str  # predicate selecting the data files that can hold it (typed, prunable)


@dataclass
class ErasureReport:
    subject: str
    dry_run: bool
    rows: dict[str, int] = field(default_factory=dict)  # "<kind> <table>" -> rows (to be) removed
    landing_records: int = 0
    landing_files: int = 0
    unreadable: list[str] = field(default_factory=list)  # landing files it could not read (damaged)

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        parts = ", ".join(f"{k}: {n}" for k, n in sorted(self.rows.items()) if n) or "no rows"
        return (
            f"erase {self.subject}: {verb} {parts}; {self.landing_records} landing records in "
            f"{self.landing_files} files" + ("" if self.dry_run else "; old snapshots expired and orphan files removed")
        )


def resolve(
    settings: LoaderSettings, subject: str | None, table: str | None, key: str | None
) -> tuple[str, list[Target]]:
    """(subject type, targets) of a ``--subject type=value`` or a ``--table s.t --key col=value``."""
    if subject:
        kind, sep, value = subject.partition("=")
        refs = settings.dbt.subject_columns.get(kind)
        if not sep or not value:
            raise ConfigError(f"--subject {subject!r} is not type=value", hint="e.g. --subject customer=123")
        if not refs:
            raise ConfigError(
                f"no columns are configured for subject type {kind!r}",
                hint='set dbt.subject_columns, e.g. {"customer": ["public.customers.customer_id"]}',
            )
        known = history_source_tables(settings)
        return kind, [Target(*SourceTable.column_ref(ref, known), value) for ref in refs]
    if table and key:
        column, sep, value = key.partition("=")
        if not sep:
            raise ConfigError(f"--key {key!r} is not column=value", hint="e.g. --key customer_id=123")
        return f"{table}.{column}", [Target(lake_source_table(settings, table), column, value)]
    raise ConfigError("name a subject", hint="use --subject type=value, or --table schema.table --key column=value")


class Erasure:
    def __init__(self, spark: SparkSession, settings: LoaderSettings, store: LandingStore | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.names = TableNames(settings)
        self.store = store or open_landing(settings)

    # --- the erased-keys table and its salt ------------------------------------------------
    @property
    def erased_keys(self) -> str:
        return self.names.loader_table("erased_keys")

    @property
    def erasures(self) -> str:
        return self.names.loader_table("erasures")

    def ensure_tables(self) -> str:
        """Create the erasure tables if needed; the salt (created once, per catalog)."""
        ensure_loader_tables(self.settings)
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self.erased_keys} ({ERASED_KEYS_DDL}) USING iceberg")
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self.erasures} ({ERASURES_DDL}) USING iceberg")
        salt = table_properties(self.spark, self.erased_keys).get(PROP_SALT)
        if salt is None:
            salt = secrets.token_hex(32)
            update_properties(self.spark, self.erased_keys, {PROP_SALT: salt})
        return salt

    # --- the erasure -----------------------------------------------------------------------
    def run(self, subject: str | None, table: str | None, key: str | None, dry_run: bool = False) -> ErasureReport:
        kind, targets = resolve(self.settings, subject, table, key)
        label = subject or f"{table} {key}"
        report = ErasureReport(label.split("=", 1)[0] + "=<value>", dry_run)
        with stage_lock(self.settings, "load"), stage_lock(self.settings, "merge"):
            salt = self.ensure_tables()
            touched: dict[str, set[str]] = {}
            for t in targets:
                for place in self._places(t):
                    n = self.spark.sql(f"SELECT count(*) FROM {place.ident} WHERE {place.rows}").collect()[0][0]
                    label = f"{place.kind} {t.table.qualified}"
                    report.rows[label] = report.rows.get(label, 0) + int(n)
                    if n and not dry_run:
                        self.spark.sql(f"DELETE FROM {place.ident} WHERE {place.rows}")
                    # Purged even without live matches: a merge-on-read delete (the source deleted
                    # the subject, the merge applied it) hides rows whose bytes are still in data files.
                    touched.setdefault(place.ident, set()).add(place.files)
            report.landing_records, report.landing_files = self._scrub_landing(targets, dry_run, report.unreadable)
            if not dry_run:
                self._remember(kind, salt, targets, report)
                for ident, selections in sorted(touched.items()):
                    self._purge_old_bytes(ident, " OR ".join(f"({s})" for s in sorted(selections)))
                for ident in (self.erased_keys, self.erasures):
                    self._purge_old_bytes(ident, None)
        if report.unreadable:
            where = ", ".join(f"{self.store.url}/{n}" for n in report.unreadable)
            raise ErasureIncompleteError(
                f"erasure incomplete: {len(report.unreadable)} landing file(s) could not be read and may still "
                f"hold the subject: {where} ({'counted' if dry_run else 'done'} elsewhere: {report.summary()})",
                hint="these files are damaged: once 'loader load' has taken what it could from them (its "
                "readable changes, the rest parked), delete or move them out of the landing area, then run "
                "the erasure again",
            )
        return report

    def _places(self, t: Target) -> list[_Place]:
        """Every table that may hold the value: which rows to delete, which data files to rewrite.

        The file selection compares the column with a typed literal, so Iceberg prunes on column
        statistics and rewrites only the files that can hold the value.
        """
        v = sql_string(t.value)
        col = quote_ident(t.lake)
        typed = self._typed_literal(t)
        places = []
        hist = self.names.history(t.table)
        if table_exists(self.spark, hist):
            old = f"from_json(pg_old_key, 'map<string,string>')[{sql_string(t.lake)}]"
            # The copy-on-write delete rewrites the files of old-key matches itself.
            places.append(_Place("history", hist, f"CAST({col} AS STRING) = {v} OR {old} = {v}", f"{col} = {typed}"))
        cur = self.names.current(t.table)
        if table_exists(self.spark, cur):
            places.append(_Place("current", cur, f"CAST({col} AS STRING) = {v}", f"{col} = {typed}"))
        # The value as a JSON string inside the raw text, matched literally (LIKE's wildcards escaped).
        spelled = sorted(spellings(t.value))
        raw = " OR ".join(f"raw LIKE {sql_string('%' + like_escape(s) + '%')}" for s in spelled)
        # A reject too damaged to name its table has NULL, '' or a half name ('public.') there.
        same_table = (
            f"(source_table = {sql_string(t.table.qualified)} OR NOT coalesce(source_table RLIKE '^.+[.].+$', false))"
        )
        # Files to rewrite: all of them (the table is small, and which rejects name no table is a
        # pattern Iceberg cannot prune on).
        every_file = "source_table IS NULL OR source_table IS NOT NULL"
        places.append(_Place("rejects", self.names.rejects, f"{same_table} AND ({raw})", every_file))
        # Continuous verification's log of differing keys (loader.verify): a key holding the value as
        # its canonical piece ('<length>:<value>;').
        log_table = self.names.loader_table("verify_log")
        if table_exists(self.spark, log_table):
            piece = like_escape(f"{len(t.value)}:{t.value};")
            rows = f"source_table = {sql_string(t.table.qualified)} AND key LIKE {sql_string('%' + piece + '%')}"
            places.append(_Place("verify log", log_table, rows, "source_table IS NULL OR source_table IS NOT NULL"))
        from loader.dbtgen import model_name

        model = model_name(t.table.iceberg_name)
        ns = f"{quote_ident(self.names.catalog)}.{quote_ident(self.settings.dbt.analytics_namespace)}"
        changes, scd2 = f"{ns}.{quote_ident(model + '__changes')}", f"{ns}.{quote_ident(model + '__scd2')}"
        if table_exists(self.spark, changes):
            before, after = quote_ident(t.lake + "__before"), quote_ident(t.lake + "__after")
            rows = f"CAST({before} AS STRING) = {v} OR CAST({after} AS STRING) = {v}"
            places.append(_Place("dbt change log", changes, rows, f"{before} = {typed} OR {after} = {typed}"))
        if table_exists(self.spark, scd2):
            places.append(_Place("dbt scd2", scd2, f"CAST({col} AS STRING) = {v}", f"{col} = {typed}"))
        return places

    def _typed_literal(self, t: Target) -> str:
        """The value as a literal of the column's type in the lake (Spark folds the cast)."""
        from loader.lake.tables import PROP_PG_TYPES
        from loader.lake.types import spark_type

        hist = self.names.history(t.table)
        pg_type = "text"
        if table_exists(self.spark, hist):
            pg_type = json.loads(table_properties(self.spark, hist).get(PROP_PG_TYPES, "{}")).get(t.column, "text")
        return f"CAST({sql_string(t.value)} AS {spark_type(pg_type).sql})"

    def _scrub_landing(self, targets: list[Target], dry_run: bool, unreadable: list[str]) -> tuple[int, int]:
        """Rewrite every landing file holding a record that carries the value (new or old key), or a
        line too damaged to parse whose raw text holds it. Files it cannot read go to ``unreadable``."""
        by_table: dict[str, list[Target]] = {}
        for t in targets:
            by_table.setdefault(t.table.qualified, []).append(t)
        spelled = {s.encode() for t in targets for s in spellings(t.value)}
        removed = files = 0
        for f in self.store.files():
            data = self.store.open_bytes(f.name)
            if f.format in (ARROW, CHANGES, TABLES):
                scrub = self._scrub_arrow if f.format == ARROW else functools.partial(self._scrub_changes, f.format)
                n = scrub(f.name, data, by_table, spelled, dry_run, unreadable)
                removed += n
                files += 1 if n else 0
                continue
            try:
                lines = gunzip_bounded(data, self.store.max_decompressed, f"landing file {f.name}").split(b"\n")
            except _UNSCRUBBABLE as exc:
                log.error("landing file %s cannot be read (%s): the erasure cannot scrub it", f.name, exc)
                unreadable.append(f.name)
                continue
            kept: list[bytes] = []
            dropped: dict[str | None, int] = {}
            for line in lines:
                found, table = _carries(line, by_table, spelled)
                if found:
                    dropped[table] = dropped.get(table, 0) + 1
                else:
                    kept.append(line)
            if not dropped:
                continue
            removed += sum(dropped.values())
            files += 1
            if dry_run:
                continue
            header = parse_header(kept[0].decode("utf-8")) if kept and kept[0] else None
            body = kept[1:] if header is not None else kept
            tables = dict(header.tables) if header is not None else {}
            for table, n in dropped.items():
                if table is not None:  # a damaged line names no table: the header keeps its count
                    tables[table] = max(0, tables.get(table, 0) - n)
            out = gzip.compress(FileHeader(tables).to_json().encode() + b"\n", mtime=0) + gzip.compress(
                b"\n".join(body), mtime=0
            )
            self._republish(f.name, functools.partial(Path.write_bytes, data=out))
        return removed, files

    def _scrub_changes(
        self,
        format: str,
        name: str,
        data: bytes,
        by_table: dict[str, list[Target]],
        spelled: set[bytes],
        dry_run: bool,
        unreadable: list[str],
    ) -> int:
        """A landing v2 or v3 change file rewritten (in its format) without the records carrying a
        target value (new or old key), as a v1 file is (each record judged by its v1 line); returns
        the records removed."""
        from loader.landing import changefile, tablefile

        module: Any = tablefile if format == TABLES else changefile
        try:
            records = list(module.records(data))
        except ValueError as exc:
            log.error("landing file %s cannot be read (%s): the erasure cannot scrub it", name, exc)
            unreadable.append(name)
            return 0
        kept = [r for r in records if not _carries(r.to_json_bytes(), by_table, spelled)[0]]
        dropped = len(records) - len(kept)
        if not dropped or dry_run:
            return dropped
        self._republish(name, lambda path: module.write_file(path, kept))
        return dropped

    def _scrub_arrow(
        self,
        name: str,
        data: bytes,
        by_table: dict[str, list[Target]],
        spelled: set[bytes],
        dry_run: bool,
        unreadable: list[str],
    ) -> int:
        """A landing v2 file (one table's snapshot rows) rewritten without the rows carrying a target
        value of its table, header counts adjusted; returns the rows removed."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from loader.landing import arrowfile

        got = arrowfile.salvage(data)
        if got.header is None or got.damage is not None:
            log.error("landing file %s cannot be read (%s): the erasure cannot scrub it", name, got.damage)
            unreadable.append(name)
            return 0
        header = got.header
        targets = by_table.get(header.qualified)
        if not targets or not header.rows:
            return 0
        table = pa.Table.from_batches(got.batches, schema=got.batches[0].schema)
        index = {c: j for j, (c, _) in enumerate(header.columns)}
        hit = pa.array([False] * table.num_rows)
        for t in targets:
            j = index.get(t.column)
            if j is not None:
                hit = pc.or_(hit, pc.fill_null(pc.equal(table.column(j + 1), t.value), False))
        dropped = int(pc.sum(hit).as_py() or 0)
        if not dropped or dry_run:
            return dropped
        kept = table.filter(pc.invert(hit))
        header.rows = kept.num_rows
        self._republish(
            name,
            lambda path: arrowfile.write_file(
                path, header, kept.column(0), [kept.column(j + 1) for j in range(len(header.columns))]
            ),
        )
        return dropped

    def _republish(self, name: str, write: Callable[[Path], object]) -> None:
        """Publish the rewritten landing file ``name``: ``write(path)`` fills a private spool file
        (created 0600), which replaces the file atomically, as capture publishes."""
        import os
        import tempfile

        fd, tmp = tempfile.mkstemp(suffix=".landing")
        os.close(fd)
        spool = Path(tmp)
        try:
            write(spool)
            self.store.publish(spool, name)
        finally:
            spool.unlink(missing_ok=True)

    def _remember(self, kind: str, salt: str, targets: list[Target], report: ErasureReport) -> None:
        now = datetime.now(UTC)
        keys = [(t.table.qualified, t.column, value_hash(salt, t.value), now) for t in targets]
        self.spark.createDataFrame(keys, ERASED_KEYS_DDL).writeTo(self.erased_keys).append()
        loaded = watermark(self.spark, self.names.ledger, SUMMARY_LOADED_THROUGH)
        record = [
            (
                now,
                kind,
                value_hash(salt, targets[0].value),
                sorted({t.table.qualified for t in targets}),
                {k: int(n) for k, n in report.rows.items()},
                report.landing_records,
                loaded,
            )
        ]
        self.spark.createDataFrame(record, ERASURES_DDL).writeTo(self.erasures).append()

    def _purge_old_bytes(self, ident: str, files: str | None) -> None:
        """Rewrite the data files that can hold the value (``files``: a predicate on the table), expire
        every older snapshot, drop orphan files: afterwards no file under the table holds the bytes."""
        call = f"{quote_ident(self.names.catalog)}.system"
        prefix = quote_ident(self.names.catalog) + "."
        target = sql_string(ident[len(prefix) :] if ident.startswith(prefix) else ident)
        if files is not None:
            # rewrite-all: compaction thresholds (group sizes) must not leave a file holding the value.
            # The new files take the rewrite's own sequence number (not the starting one), so the
            # delete files just applied are dangling and go (as in maintain's delete rewrite); safe
            # because erasure holds the load and merge locks: no delete commits meanwhile.
            self.spark.sql(
                f"CALL {call}.rewrite_data_files(table => {target}, where => {sql_string(files)},"
                " options => map('rewrite-all', 'true', 'remove-dangling-deletes', 'true',"
                " 'use-starting-sequence-number', 'false'))"
            ).collect()
        self.spark.sql(f"CALL {call}.rewrite_manifests(table => {target})").collect()
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        self.spark.sql(
            f"CALL {call}.expire_snapshots(table => {target}, older_than => TIMESTAMP '{now}', retain_last => 1)"
        ).collect()
        delete_orphan_files(self.spark, ident, datetime.now(UTC))


def spellings(value: str) -> set[str]:
    """How raw text may hold ``value``: a JSON string as landing lines write it and ASCII-escaped as
    other writers may, each also as it reads inside another JSON string (a capture quarantine's raw
    plugin output, a landing line's)."""
    plain = {json.dumps(value, ensure_ascii=False), json.dumps(value)}
    return plain | {json.dumps(p, ensure_ascii=False)[1:-1] for p in plain}


def like_escape(text: str) -> str:
    """``text`` matched literally by a Spark ``LIKE`` (whose escape character is the backslash)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _carries(line: bytes, by_table: dict[str, list[Target]], spelled: set[bytes]) -> tuple[bool, str | None]:
    """(whether the line goes, the table whose header count it was in). A record goes when it carries
    a value of its table's targets (a capture quarantine, when its raw text does); a line that is
    not a record (damaged: the load rejects it with its raw text, naming no table) when its raw
    bytes hold any target value as a JSON string."""
    if not line.strip():
        return False, None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return any(s in line for s in spelled), None
    if isinstance(doc, dict) and doc.get("op") in ("H", "C"):
        return False, None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str) or not isinstance(doc.get("table"), str):
        return any(s in line for s in spelled), None
    table = f"{doc['schema']}.{doc['table']}"
    targets = by_table.get(table)
    if not targets:
        return False, None
    if doc.get("op") == "X":
        return any(s in line for s in spelled), table
    try:
        values = {c[0]: c[2] for c in doc.get("columns") or [] if isinstance(c, list) and len(c) == 3}
        old = {c[0]: c[2] for c in doc.get("identity") or [] if isinstance(c, list) and len(c) == 3}
    except TypeError:  # malformed (an unhashable column name): the load rejects it with its raw text
        return any(s in line for s in spelled), table
    return any(values.get(t.column) == t.value or old.get(t.column) == t.value for t in targets), table
