"""Schema evolution planning for history/current tables (pure).

Given the PostgreSQL types a table was created with and the ones seen in a new increment, decide
which columns to add, to widen in place, to relabel (same storage type), and to *retire*: a retype
Iceberg cannot apply in place (int -> text, timestamp -> timestamptz, a numeric scale change). A
retired column keeps every old value under a reserved name (``pg__r<k>_<column>``, see
:func:`retired_name`) and the source name starts over with the new type, so history stays
lossless and no manual Iceberg surgery is needed; the table's current table waits for a resync.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from loader.lake.types import spark_type
from loader.names import internal

_DEC = re.compile(r"^DECIMAL\((\d+),(\d+)\)\Z")


@dataclass
class EvolutionPlan:
    add: list[tuple[str, str]] = field(default_factory=list)  # (column, pg type), source order
    widen: list[tuple[str, str]] = field(default_factory=list)  # (column, new pg type)
    retext: list[tuple[str, str]] = field(default_factory=list)  # same storage type, new pg type
    retire: list[tuple[str, str]] = field(default_factory=list)  # (column, new pg type): incompatible retype

    @property
    def empty(self) -> bool:
        return not (self.add or self.widen or self.retext or self.retire)


def retired_name(lake_column: str, version: int) -> str:
    """Where the values of a column retired by an incompatible retype are kept (reserved namespace)."""
    return internal(f"r{version}_{lake_column}")


def can_widen(old_sql: str, new_sql: str) -> bool:
    """Type promotions Iceberg allows in place."""
    if old_sql == new_sql:
        return True
    if (old_sql, new_sql) in {("INT", "BIGINT"), ("FLOAT", "DOUBLE")}:
        return True
    a, b = _DEC.match(old_sql), _DEC.match(new_sql)
    if a and b:
        return a.group(2) == b.group(2) and int(b.group(1)) >= int(a.group(1))
    return False


def plan_evolution(table: str, existing: dict[str, str], incoming: list[tuple[str, str]]) -> EvolutionPlan:
    """``existing``: column -> pg type; ``incoming``: (column, pg type) in source order."""
    plan = EvolutionPlan()
    seen: dict[str, str] = {}
    for name, pg_type in incoming:
        # Two types for one column inside one increment: the later one wins.
        seen[name] = pg_type
    for name, pg_type in seen.items():
        if name not in existing:
            plan.add.append((name, pg_type))
            continue
        old = existing[name]
        if old == pg_type:
            continue
        old_sql, new_sql = spark_type(old).sql, spark_type(pg_type).sql
        if old_sql == new_sql:
            plan.retext.append((name, pg_type))
        elif can_widen(old_sql, new_sql):
            plan.widen.append((name, pg_type))
        elif can_widen(new_sql, old_sql):
            # Narrowed at the source: the wider storage type still holds every value.
            continue
        else:
            plan.retire.append((name, pg_type))
    return plan
