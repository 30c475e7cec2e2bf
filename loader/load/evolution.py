"""Schema evolution planning for history/current tables (pure).

Given the PostgreSQL types a table was created with and the ones seen in a new increment, decide
which columns to add and which to widen, or refuse with an error that names table and column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from loader.errors import SchemaEvolutionError
from loader.load.typemap import spark_type

_DEC = re.compile(r"^DECIMAL\((\d+),(\d+)\)$")


@dataclass
class EvolutionPlan:
    add: list[tuple[str, str]] = field(default_factory=list)  # (column, pg type), source order
    widen: list[tuple[str, str]] = field(default_factory=list)  # (column, new pg type)
    retext: list[tuple[str, str]] = field(default_factory=list)  # same storage type, new pg type

    @property
    def empty(self) -> bool:
        return not (self.add or self.widen or self.retext)


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
        if name in seen and seen[name] != pg_type:
            # Two types for one column inside one increment: the later one wins if compatible.
            if not can_widen(spark_type(seen[name]).sql, spark_type(pg_type).sql):
                raise _incompatible(table, name, seen[name], pg_type)
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
            raise _incompatible(table, name, old, pg_type)
    return plan


def _incompatible(table: str, column: str, old: str, new: str) -> SchemaEvolutionError:
    return SchemaEvolutionError(
        f"table {table} column {column!r} changed type from {old} to {new}, "
        f"which Iceberg cannot widen in place",
        hint=(
            f"Iceberg widens only int->bigint, float->double and decimal precision. Either revert the "
            f"column's type at the source, or keep the old history: rename the history and current tables "
            f"of {table} (ALTER TABLE ... RENAME TO ...), re-run 'loader load' to start new ones with the new "
            f"type, and re-snapshot the table"
        ),
    )
