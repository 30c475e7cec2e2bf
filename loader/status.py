"""``loader status``: landed, loaded and merged positions and row counts, from pyiceberg only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from loader.capture.landing import open_landing
from loader.catalog import latest_summary, open_catalog, row_count
from loader.config import LoaderSettings
from loader.lsn import ChangePosition
from loader.tables import PROP_PARKED, PROP_PRIMARY_KEY, SUMMARY_LOADED_THROUGH, SUMMARY_MERGED_THROUGH, SourceTable


def _pos(token: str | None) -> str | None:
    return str(ChangePosition.from_token(token)) if token else None


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


@dataclass
class Status:
    landed: str | None
    landing_files: int
    loaded: str | None
    consistent: str | None
    rejects: int
    tables: list[TableStatus] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def render(self) -> str:
        lines = [
            f"landed through:   {self.landed or '-'} ({self.landing_files} landing files)",
            f"loaded through:   {self.loaded or '-'}",
            f"consistent at:    {self.consistent or '-'} (every current table merged at least this far)",
            f"rejects:          {self.rejects}",
            "",
            f"{'table':<32} {'key':<16} {'history rows':>12} {'current rows':>12}  {'merged through':<22} note",
        ]
        for t in self.tables:
            cur = "-" if t.current_rows is None else str(t.current_rows)
            lines.append(
                f"{t.table:<32} {','.join(t.primary_key) or '-':<16} {t.history_rows:>12} {cur:>12}  {t.merged or '-':<22} {t.note}"
            )
        parked = [t for t in self.tables if t.parked]
        if parked:
            lines += [
                "",
                f"parked tables ({len(parked)}): their current tables wait for a resync; every other table advances",
            ]
            lines += [f"  {t.table}: {t.parked}" for t in parked]
        return "\n".join(lines)


def collect_status(settings: LoaderSettings) -> Status:
    catalog = open_catalog(settings)
    c = settings.catalog
    store = open_landing(settings)
    files = store.files()
    landed = str(files[-1].last) if files else None
    loaded_token = None
    rejects = 0
    try:
        ledger = catalog.load_table((c.loader_namespace, "landing_files"))
        loaded_token = latest_summary(ledger, SUMMARY_LOADED_THROUGH)
        rejects = row_count(catalog.load_table((c.loader_namespace, "rejects")))
    except Exception:  # nothing loaded yet
        pass
    tables: list[TableStatus] = []
    merged_positions: list[ChangePosition] = []
    try:
        idents = sorted(catalog.list_tables(c.history_namespace))
    except Exception:
        idents = []
    current_names: set[str] = set()
    try:
        current_names = {i[-1] for i in catalog.list_tables(c.current_namespace)}
    except Exception:
        pass
    for ident in idents:
        name = ident[-1]
        hist: Any = catalog.load_table(ident)
        pk = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
        src = SourceTable.from_iceberg_name(name)
        ts = TableStatus(
            table=src.qualified,
            primary_key=pk,
            history_rows=row_count(hist),
            current_rows=None,
            loaded=_pos(latest_summary(hist, SUMMARY_LOADED_THROUGH)),
            merged=None,
        )
        if PROP_PARKED in hist.properties:
            ts.parked = json.loads(hist.properties[PROP_PARKED]).get("reason")
        if not pk:
            ts.note = "no primary key: history only (no current table)"
        elif name in current_names:
            cur = catalog.load_table((c.current_namespace, name))
            if PROP_PARKED in cur.properties and ts.parked is None:
                ts.parked = json.loads(cur.properties[PROP_PARKED]).get("reason")
            ts.current_rows = row_count(cur)
            token = latest_summary(cur, SUMMARY_MERGED_THROUGH)
            ts.merged = _pos(token)
            if token:
                merged_positions.append(ChangePosition.from_token(token))
        else:
            ts.note = "not merged yet"
        tables.append(ts)
    consistent = (
        str(min(merged_positions))
        if merged_positions and len(merged_positions) == sum(1 for t in tables if t.primary_key)
        else None
    )
    return Status(
        landed=landed,
        landing_files=len(files),
        loaded=_pos(loaded_token),
        consistent=consistent,
        rejects=rejects,
        tables=tables,
    )
