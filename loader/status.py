"""``loader status``: positions, freshness, row counts and parked tables, from pyiceberg only.

Everything comes from table metadata (properties and the current snapshot's summary): no scan, no
Spark, so it answers in seconds however large the tables are, and it keeps answering after any
snapshot expiry or compaction (the watermarks are table properties).

The replication slot is read from the source (one query, ``connect_timeout`` 5 s): the WAL it
retains, its ``wal_status``, the server's ``max_slot_wal_keep_size`` and whether the slot is lost;
and the landing area says when the loader's last heartbeat came back out of it (idle or stuck).
An unreachable source is reported, not fatal.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from loader.capture import heartbeat
from loader.config import LoaderSettings
from loader.lake.catalog import latest_summary, live_rows, open_catalog, row_count, watermark
from loader.lake.tables import (
    LEDGER_NAME,
    PROP_LAST_POSITION,
    PROP_LOADED_THROUGH_TS,
    PROP_MERGED_THROUGH_TS,
    PROP_PARKED,
    PROP_PRIMARY_KEY,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SourceTable,
    consistent_through,
    newest_position,
    table_consistent_at,
)
from loader.landing.state import SLOT_STATE, SOURCE_STATE, VERIFY_STATE
from loader.landing.store import open_landing
from loader.lsn import ChangePosition


def _pos(token: str | None) -> str | None:
    return str(ChangePosition.from_token(token)) if token else None


def commit_time(text: str | None) -> datetime | None:
    """A PostgreSQL timestamptz text (``2026-11-22 19:29:55.01951+00``) as a UTC datetime."""
    if not text:
        return None
    t = text.strip().replace(" ", "T", 1)
    if t[-3] in "+-" and t[-3:].lstrip("+-").isdigit():
        t += ":00"
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


@dataclass
class TableStatus:
    table: str
    primary_key: list[str]
    history_rows: int
    current_rows: int | None
    loaded: str | None
    merged: str | None
    note: str = ""
    parked: str | None = None  # why the table waits for a resync, with the repair
    # Commit time of the newest source transaction the current table reflects, and its age.
    fresh_as_of: str | None = None
    lag_seconds: float | None = None
    # Continuous verification's last verdict on the table (follow mode; see loader.verify.RollingVerifier).
    verified: dict[str, Any] | None = None
    # The counts that are estimates ("history_rows", "current_rows"; see loader.lake.catalog.live_rows),
    # shown with a "~" in text.
    rows_estimated: list[str] = field(default_factory=list)


@dataclass
class Status:
    landed: str | None
    landing_files: int
    loaded: str | None
    consistent: str | None
    rejects: int
    tables: list[TableStatus] = field(default_factory=list)
    loaded_as_of: str | None = None
    lag_seconds: float | None = None  # the oldest table's (overall freshness)
    # Source tables the configuration includes that capture never reads, with why (as of the last capture).
    skipped: dict[str, str] = field(default_factory=dict)
    # Tables capture landed changes of through wal2json before 2.6, whose numeric/float NaN and
    # ±Infinity arrive as NULL: table -> {"columns": [...], "since": first position landed so}.
    lossy_specials: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The replication slot on the source (see SlotStatus), and the last heartbeat (heartbeat.describe).
    slot: SlotStatus | None = None
    heartbeat: dict[str, Any] = field(default_factory=dict)
    # A snapshot or resync not finished yet (copying now, or interrupted): see SnapshotStatus.
    snapshot: SnapshotStatus | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def render(self) -> str:
        lag = f" (freshness lag {self.lag_seconds:.1f} s)" if self.lag_seconds is not None else ""
        lines = [
            *self._slot_lines(),
            f"landed through:     {self.landed or '-'} ({self.landing_files} landing files)",
            f"loaded through:     {self.loaded or '-'}"
            + (f", committed {self.loaded_as_of}" if self.loaded_as_of else ""),
            f"consistent through: {self.consistent or '-'} (every current table merged at least this far){lag}",
            f"rejects:            {self.rejects}",
            "",
            f"{'table':<32} {'key':<16} {'history rows':>12} {'current rows':>12}  {'merged through':<22} {'lag s':>8} note",
        ]
        for t in self.tables:
            approx = {k: "~" if k in t.rows_estimated else "" for k in ("history_rows", "current_rows")}
            hist = f"{approx['history_rows']}{t.history_rows}"
            cur = "-" if t.current_rows is None else f"{approx['current_rows']}{t.current_rows}"
            lag_s = "-" if t.lag_seconds is None else f"{t.lag_seconds:.1f}"
            lines.append(
                f"{t.table:<32} {','.join(t.primary_key) or '-':<16} {hist:>12} {cur:>12}  "
                f"{t.merged or '-':<22} {lag_s:>8} {t.note}"
            )
        parked = [t for t in self.tables if t.parked]
        if parked:
            lines += [
                "",
                f"parked tables ({len(parked)}): their current tables wait for a resync; every other table advances",
            ]
            lines += [f"  {t.table}: {t.parked}" for t in parked]
        differing = [t for t in self.tables if t.verified and t.verified.get("differing_keys")]
        if differing:
            lines += ["", f"tables that differed from the source at their last verification ({len(differing)}):"]
            lines += [
                f"  {t.table}: {t.verified['differing_keys']} keys at {t.verified['at']} (keys in the verify_log table)"
                for t in differing
                if t.verified
            ]
        if self.skipped:
            lines += ["", f"skipped source tables ({len(self.skipped)}): never read from the source, not in the lake"]
            lines += [f"  {table}: {why}" for table, why in sorted(self.skipped.items())]
        if self.lossy_specials:
            lines += [
                "",
                f"tables whose NaN and ±Infinity may have arrived as NULL ({len(self.lossy_specials)}): captured "
                'through wal2json before 2.6; set source.plugin = "pgoutput" or install wal2json 2.6+, then '
                "'loader verify' and 'loader resync --table' repair current tables",
            ]
            lines += [
                f"  {table}: {', '.join(e.get('columns', []))} (changes since {_pos(e.get('since')) or '-'})"
                for table, e in sorted(self.lossy_specials.items())
            ]
        return "\n".join(lines)

    def _snapshot_line(self) -> list[str]:
        snap = self.snapshot
        if snap is None:
            return []
        landed = f"{snap.rows_landed} rows in {snap.files} landing files so far"
        if snap.running:
            what = (
                f"copying {snap.tables} tables at consistent point {snap.consistent_lsn} since {snap.started} "
                f"({snap.holder or 'a capture process'}): {landed}"
            )
        elif snap.running is None:
            what = f"unfinished, {snap.tables} tables at consistent point {snap.consistent_lsn}: {landed}"
        else:
            what = (
                f"interrupted, {snap.tables} tables at consistent point {snap.consistent_lsn}: {landed}; the next "
                "capture resumes it (or 'loader backfill snapshot')"
            )
        return [f"snapshot:           {what}; loading waits for its commit"]

    def _slot_lines(self) -> list[str]:
        s = self.slot
        if s is None:
            return self._snapshot_line()
        lines = self._snapshot_line()
        if s.error:
            lines.append(f"slot:               {s.name}: {s.error}")
        else:
            keep = s.max_slot_wal_keep_size or "?"
            lines.append(
                f"slot:               {s.name}: retains {_mb(s.retained_wal_bytes)} of WAL (wal_status "
                f"{s.wal_status or '-'}), lag {_mb(s.lag_bytes)}; max_slot_wal_keep_size {keep}"
            )
        hb = self.heartbeat
        if hb.get("seen_age_s") is not None:
            lines.append(f"heartbeat:          seen {hb['seen_age_s']:.1f} s ago, lag {hb['lag_s']:.3f} s")
        elif hb.get("emitted_age_s") is not None:
            lines.append(
                f"heartbeat:          emitted {hb['emitted_age_s']:.1f} s ago, never seen back: capture is stuck?"
            )
        else:
            lines.append("heartbeat:          none yet (source.heartbeat_interval_s = 0, or no capture ran)")
        lines += [f"warning:            {w}" for w in s.warnings]
        return [*lines, ""]


@dataclass
class SlotStatus:
    name: str
    retained_wal_bytes: int | None = None
    lag_bytes: int | None = None
    wal_status: str | None = None
    max_slot_wal_keep_size: str | None = None
    lost: bool = False
    error: str | None = None  # the slot could not be read (source unreachable, slot missing)
    warnings: list[str] = field(default_factory=list)


@dataclass
class SnapshotStatus:
    """A snapshot (or resync) whose state in the landing area says it is not done."""

    consistent_lsn: str
    tables: int
    started: str | None
    rows_landed: int  # rows and markers landed so far (the last landed position's seq)
    files: int
    running: bool | None  # a process holds the slot's capture lock (None: the source cannot say)
    holder: str | None = None


def snapshot_status(settings: LoaderSettings, landing: Any, files: list[Any]) -> SnapshotStatus | None:
    """The unfinished snapshot, if any: how far it landed, and whether a process is copying it."""
    from loader.capture import slot as slots
    from loader.landing.state import unfinished_snapshot

    state = unfinished_snapshot(landing)
    if state is None:
        return None
    pos = int(state.get("position_lsn", -1))
    mine = [f for f in files if f.first.commit_lsn == pos]
    out = SnapshotStatus(
        consistent_lsn=str(state.get("consistent_lsn")),
        tables=len(state.get("tables", [])),
        started=state.get("ts"),
        rows_landed=mine[-1].last.seq if mine else 0,
        files=len(mine),
        running=None,
    )
    try:
        with slots.connect(settings.source.conninfo(), connect_timeout=5) as conn:
            holder = slots.capture_lock_holder(conn, settings.source.slot)
    except Exception:  # status answers whatever the source does
        return out
    out.running = holder is not None
    if holder is not None:
        out.holder = f"{holder[1] or 'pid'} (pid {holder[0]})"
    return out


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / (1024 * 1024):.1f} MB"


def slot_status(settings: LoaderSettings, landing: Any, landed: str | None) -> SlotStatus:
    """The slot as the source sees it: retained WAL, wal_status, the server's limit, loss."""
    from loader.capture import slot as slots
    from loader.errors import LoaderError, SlotLostError

    src = settings.source
    out = SlotStatus(src.slot)
    try:
        with slots.connect(src.conninfo(), connect_timeout=5) as conn:
            info = slots.slot_info(conn, src.slot)
            row = conn.execute("SELECT current_setting('max_slot_wal_keep_size')").fetchone()
    except LoaderError as exc:
        out.error = f"source not reachable: {exc.one_line()}"
        return out
    except Exception as exc:  # status answers whatever the source does
        out.error = f"source not readable: {str(exc).strip()}"
        return out
    out.max_slot_wal_keep_size = row[0] if row else None
    if out.max_slot_wal_keep_size == "-1":
        out.warnings.append(
            "max_slot_wal_keep_size is -1 (unlimited): a slot left behind keeps WAL until the source's "
            "disk is full; set a limit and alert on the retained WAL (README 'WAL safety')"
        )
    state = landing.read_state(SLOT_STATE) or {}
    confirmed_by_us = int(state["confirmed"]) if state.get("slot") == src.slot and "confirmed" in state else None
    if info is None and landed is None:
        out.error = "no such replication slot (the first 'loader capture' creates it)"
        return out
    if info is not None:
        out.retained_wal_bytes = info.retained_wal_bytes
        out.lag_bytes = info.lag_bytes
        out.wal_status = info.wal_status
        if info.wal_status == "unreserved":
            out.warnings.append(
                "the slot retains more than max_wal_size and will be invalidated at the next checkpoint past "
                "max_slot_wal_keep_size unless capture catches up"
            )
    try:
        slots.check_not_lost(info, src.slot, landed, confirmed_by_us)
    except SlotLostError as exc:
        out.lost = True
        out.warnings.append(f"slot lost: {exc}; {exc.hint}" if exc.hint else f"slot lost: {exc}")
        if info is None:
            out.error = "replication slot is gone"
    return out


def collect_status(settings: LoaderSettings, now: datetime | None = None) -> Status:
    now = now or datetime.now(UTC)
    catalog = open_catalog(settings)
    c = settings.catalog
    landing = open_landing(settings)
    verified: dict[str, Any] = dict((landing.read_state(VERIFY_STATE) or {}).get("tables", {}))
    files = landing.files()
    source_state = landing.read_state(SOURCE_STATE) or {}
    this_slot = source_state.get("slot") == settings.source.slot
    skipped = source_state.get("skipped", {}) if this_slot else {}
    lossy = {
        t: {"columns": e.get("columns", []), "since": e.get("since")}
        for t, e in (source_state.get("lossy_specials", {}) if this_slot else {}).items()
    }
    loaded_token: str | None = None
    loaded_ts: str | None = None
    rejects = 0
    try:
        ledger = catalog.load_table((c.loader_namespace, LEDGER_NAME))
        loaded_token = watermark(ledger, SUMMARY_LOADED_THROUGH)
        loaded_ts = ledger.properties.get(PROP_LOADED_THROUGH_TS)
        rejects = row_count(catalog.load_table((c.loader_namespace, "rejects")))
    except Exception:  # nothing loaded yet
        pass
    try:
        idents = sorted(catalog.list_tables(c.history_namespace))
    except Exception:
        idents = []
    current_names: set[str] = set()
    try:
        current_names = {i[-1] for i in catalog.list_tables(c.current_namespace)}
    except Exception:
        pass
    tables: list[TableStatus] = []
    merged_positions: list[str | None] = []  # every keyed table's (None: never merged)
    for ident in idents:
        name = ident[-1]
        hist: Any = catalog.load_table(ident)
        pk = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
        hist_rows = live_rows(hist)
        ts = TableStatus(
            table=SourceTable.from_iceberg_name(name).qualified,
            primary_key=pk,
            history_rows=hist_rows.rows,
            current_rows=None,
            loaded=_pos(
                newest_position(hist.properties.get(PROP_LAST_POSITION), latest_summary(hist, SUMMARY_LOADED_THROUGH))
            ),
            merged=None,
        )
        if not hist_rows.exact:
            ts.rows_estimated.append("history_rows")
        if PROP_PARKED in hist.properties:
            ts.parked = json.loads(hist.properties[PROP_PARKED]).get("reason")
        if not pk:
            ts.note = "no primary key: history only (no current table)"
        elif name in current_names:
            cur = catalog.load_table((c.current_namespace, name))
            if PROP_PARKED in cur.properties and ts.parked is None:
                ts.parked = json.loads(cur.properties[PROP_PARKED]).get("reason")
            cur_rows = live_rows(cur)
            ts.current_rows = cur_rows.rows
            if not cur_rows.exact:
                ts.rows_estimated.append("current_rows")
            merged = watermark(cur, SUMMARY_MERGED_THROUGH)
            fresh = cur.properties.get(PROP_MERGED_THROUGH_TS)
            last = hist.properties.get(PROP_LAST_POSITION)
            token = table_consistent_at(merged, last, loaded_token, ts.parked is not None)
            if token != merged:
                # Nothing appended since its merge: it equals the source as of loaded-through.
                fresh = loaded_ts or fresh
            ts.merged = _pos(token)
            merged_positions.append(token)
            ts.fresh_as_of = fresh
            when = commit_time(fresh)
            ts.lag_seconds = (now - when).total_seconds() if when else None
        else:
            ts.note = "not merged yet"
            merged_positions.append(None)
        ts.verified = verified.get(ts.table)
        tables.append(ts)
    keyed = [t for t in tables if t.primary_key]
    consistent = consistent_through(merged_positions)
    lags = [t.lag_seconds for t in keyed if t.lag_seconds is not None]
    landed = str(files[-1].last) if files else None
    return Status(
        landed=landed,
        landing_files=len(files),
        loaded=_pos(loaded_token),
        consistent=_pos(consistent),
        rejects=rejects,
        tables=tables,
        loaded_as_of=loaded_ts,
        lag_seconds=max(lags) if lags and len(lags) == len(keyed) else None,
        skipped=dict(skipped),
        lossy_specials=lossy,
        slot=slot_status(settings, landing, landed),
        heartbeat=heartbeat.describe(heartbeat.read_state(landing, settings.source.slot), now.timestamp()),
        snapshot=snapshot_status(settings, landing, files),
    )
