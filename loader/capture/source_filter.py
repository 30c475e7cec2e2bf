"""What the source sends: ``source.include`` / ``source.exclude`` and the role's SELECT right,
applied by the server's decoding instead of after it.

wal2json is given ``add-tables`` (built from the include globs, widened to whole-part ``*``
wildcards where a glob says more than wal2json can, so it never sends *less* than the globs ask
for) and ``filter-tables`` (exclude globs wal2json can say exactly, and by name every other table
that must not be sent: excluded by a glob wal2json cannot say, or not readable by the role).
pgoutput is given a publication ``FOR TABLE`` exactly the captured tables, kept in step
(:func:`loader.capture.pgoutput.sync_publication`). Capture still filters what arrives (defence
in depth: a table created or renamed while a run decodes is decided by the loader until the next
run names it).

A table the role may not ``SELECT`` (``has_table_privilege``) is never captured, whatever the
globs say: it is *skipped*, with the reason, in capture's result, its log and ``loader status``.
With partitions landing as their root (``source.partitions = root``) a partition follows its
partitioned table's globs and right (reading the root reads every partition).

Order matters: capture takes the round's upper bound (``pg_current_wal_lsn()``) *before* it
lists the tables here, so a table created after the listing can only have changes past the
bound, which the next run decodes with a list that names it. Where the globs map onto wal2json's
wildcards (the default ``*.*``, ``schema.*``, ``*.table``, literal names) no list is involved at
all and a table created at any moment is sent.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psycopg

from loader.capture.source_tables import HAS_IDENTITY_SQL, split_qualified
from loader.config import LoaderSettings

# A wal2json table pattern: (schema or None for every schema, table or None for every table).
Pattern = tuple[str | None, str | None]

_GLOB_CHARS = frozenset("*?[")


def escape_name(name: str) -> str:
    """A schema or table name as wal2json's add-tables/filter-tables parser reads it literally:
    backslash before the list separator, whitespace, the schema separator, the wildcard, the
    quote and the backslash itself."""
    return "".join("\\" + ch if ch in " ,.*'\\" or ch.isspace() else ch for ch in name)


def render(patterns: Iterable[Pattern]) -> str:
    """The option value: comma-separated ``schema.table``, ``*`` for a whole part."""
    out = []
    for schema, table in patterns:
        out.append(
            ("*" if schema is None else escape_name(schema)) + "." + ("*" if table is None else escape_name(table))
        )
    return ",".join(out)


def matches(pattern: Pattern, schema: str, table: str) -> bool:
    """wal2json's own test: each part equal, or ``*``."""
    return (pattern[0] is None or pattern[0] == schema) and (pattern[1] is None or pattern[1] == table)


def glob_patterns(glob: str) -> tuple[list[Pattern], bool]:
    """wal2json patterns covering everything ``fnmatch``'s ``glob`` matches as ``schema.table``, and
    whether they match exactly that (for names without dots: see :func:`plan_source`).

    ``public.*``, ``*.orders``, ``billing.invoices`` are exact; ``public.tmp_*`` becomes
    ``public.*`` (a superset: capture narrows it); a literal with several dots, which could split
    into schema and table at any of them, becomes every such split.
    """
    if not any(ch in _GLOB_CHARS for ch in glob):
        splits = [(glob[:i], glob[i + 1 :]) for i, ch in enumerate(glob) if ch == "."]
        return [(s, t) for s, t in splits], bool(splits)
    if glob.count(".") != 1:
        return [(None, None)], False
    schema, table = glob.split(".")
    exact = True
    parts: list[str | None] = []
    for part in (schema, table):
        if part == "*":
            parts.append(None)
        elif any(ch in _GLOB_CHARS for ch in part):
            parts.append(None)
            exact = False
        else:
            parts.append(part)
    return [(parts[0], parts[1])], exact


@dataclass(frozen=True)
class SourceRelation:
    """A table whose changes decoding names (``schema.table``), and the table they count as."""

    schema: str
    table: str
    logical: str  # the captured table: itself, or its partitioned root (source.partitions = root)
    selectable: bool  # the role may SELECT the captured table
    carries_changes: bool = True  # False: a partitioned table (its partitions carry the changes)
    has_identity: bool = True  # updates/deletes can be published (pgoutput refuses to publish otherwise)
    # Row-level security would filter the role's reads of the captured table (PostgreSQL's own
    # rule: row_security_active): a snapshot would read fewer rows than the stream describes.
    row_security: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class SourcePlan:
    """This round's source-side filter and what it leaves out."""

    add_tables: list[Pattern] | None = None  # None: every table (no add-tables option)
    filter_tables: list[Pattern] = field(default_factory=list)
    wanted: set[str] = field(default_factory=set)  # captured tables (the names landing files use)
    skipped: dict[str, str] = field(default_factory=dict)  # included by the globs, not captured: why
    known: set[str] = field(default_factory=set)  # every captured-table name the listing saw

    def wal2json_options(self) -> tuple[str, ...]:
        options: tuple[str, ...] = ()
        if self.add_tables is not None:
            options += ("add-tables", render(self.add_tables))
        if self.filter_tables:
            options += ("filter-tables", render(self.filter_tables))
        return options


def plan_source(
    relations: list[SourceRelation],
    included: Callable[[str], bool],
    include: list[str],
    exclude: list[str],
    role: str,
) -> SourcePlan:
    """The wal2json options and the captured set, from the catalog listing (pure).

    ``included``: the configuration's verdict on a captured-table name (globs, exclusions win).
    Never sends less than the loader would land: every table wanted now is covered by
    ``add-tables`` (a table the globs cover only through a name with dots, or a partition of a
    wanted root under another name, adds its schema with ``*``), and exclude globs go to
    ``filter-tables`` only when they are exact and hit no wanted table.
    """
    plan = SourcePlan()
    for rel in relations:
        plan.known.add(rel.logical)
        if not included(rel.logical):
            continue
        why = unreadable(role, rel.selectable, rel.row_security)
        if why:
            plan.skipped[rel.logical] = why
        else:
            plan.wanted.add(rel.logical)
    senders = [r for r in relations if r.carries_changes]
    wanted = [r for r in senders if r.logical in plan.wanted]
    unwanted = [r for r in senders if r.logical not in plan.wanted]
    add: list[Pattern] = []
    everything = False
    for glob in include or ["*.*"]:
        pats, _ = glob_patterns(glob)
        if (None, None) in pats:
            everything = True
        add += [p for p in pats if p not in add]
    if not everything:
        for rel in wanted:
            if not any(matches(p, rel.schema, rel.table) for p in add):
                add.append((rel.schema, None))
        plan.add_tables = add
    deny: list[Pattern] = []
    for glob in exclude:
        pats, exact = glob_patterns(glob)
        if exact and not any(matches(p, r.schema, r.table) for p in pats for r in wanted):
            deny += [p for p in pats if p not in deny]
    for rel in unwanted:
        sent = plan.add_tables is None or any(matches(p, rel.schema, rel.table) for p in plan.add_tables)
        if sent and not any(matches(p, rel.schema, rel.table) for p in deny):
            deny.append((rel.schema, rel.table))
    plan.filter_tables = deny
    return plan


_RELATIONS_SQL = f"""
SELECT n.nspname, c.relname, c.relkind = 'r', c.relispartition,
       rn.nspname, r.relname,
       has_table_privilege(COALESCE(r.oid, c.oid), 'SELECT'),
       has_table_privilege(c.oid, 'SELECT'),
       {HAS_IDENTITY_SQL},
       row_security_active(COALESCE(r.oid, c.oid))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_class r ON c.relispartition AND r.oid = pg_partition_root(c.oid)
LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
ORDER BY 1, 2
"""


def read_relations(conn: psycopg.Connection, partitions: str = "root") -> list[SourceRelation]:
    """Every logged table of the source, with the captured table it counts as and the role's right."""
    out = []
    for (
        schema,
        name,
        is_table,
        is_partition,
        root_schema,
        root_name,
        root_select,
        own_select,
        ident,
        rls,
    ) in conn.execute(_RELATIONS_SQL).fetchall():
        if partitions == "root" and is_partition and root_name is not None:
            logical, selectable = f"{root_schema}.{root_name}", bool(root_select)
        elif partitions == "leaf" and not is_table:
            continue  # a partitioned table: its partitions are the tables
        else:
            logical, selectable = f"{schema}.{name}", bool(own_select)
        out.append(SourceRelation(schema, name, logical, selectable, bool(is_table), bool(ident), bool(rls)))
    return out


def unreadable(role: str, selectable: bool, row_security: bool) -> str | None:
    """Why a table is not captured although the globs include it (None: it is). A role that
    lacks SELECT cannot snapshot or verify it; one that row-level security filters would read
    fewer rows than the stream describes (decoding ignores policies), silently: PostgreSQL's own
    rule (``row_security_active``) decides, and every source session runs with ``row_security =
    off``, so a read the policies would filter fails instead of returning less."""
    if not selectable:
        return f"skipped: role {role} lacks SELECT"
    if row_security:
        return (
            f"skipped: row-level security hides rows from role {role} (give it BYPASSRLS, or capture as the "
            "table's owner without FORCE ROW LEVEL SECURITY)"
        )
    return None


def current_role(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT current_user").fetchone()
    return str(row[0]) if row else "?"


def why_not_readable(conn: psycopg.Connection, qualified: str, role: str) -> str | None:
    """:func:`unreadable` of a table named now (``schema.table``); None too if no such table."""
    schema, table = split_qualified(conn, qualified)
    row = conn.execute(
        "SELECT has_table_privilege(c.oid, 'SELECT'), row_security_active(c.oid) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s"
        " AND c.relkind IN ('r', 'p')",
        (schema, table),
    ).fetchone()
    return None if row is None else unreadable(role, bool(row[0]), bool(row[1]))


class TableFilter:
    """Include/exclude ``schema.table`` glob patterns; exclusions win."""

    def __init__(self, include: list[str], exclude: list[str]) -> None:
        self.include = include or ["*.*"]
        self.exclude = exclude
        self._verdicts: dict[str, bool] = {}  # asked once per change: remember per table

    def __call__(self, qualified: str) -> bool:
        verdict = self._verdicts.get(qualified)
        if verdict is None:
            verdict = not any(fnmatch.fnmatchcase(qualified, p) for p in self.exclude) and any(
                fnmatch.fnmatchcase(qualified, p) for p in self.include
            )
            if len(self._verdicts) < 100_000:
                self._verdicts[qualified] = verdict
        return verdict


def captured_plan(conn: psycopg.Connection, settings: LoaderSettings, role: str | None = None) -> SourcePlan:
    """The captured set for ``source.plugin``: the publication's (:func:`publication_plan`) for
    pgoutput, else wal2json's filter (:func:`plan_source`)."""
    src = settings.source
    role = role or current_role(conn)
    if src.plugin == "pgoutput":
        return publication_plan(conn, settings, role)
    relations = read_relations(conn, src.partitions)
    return plan_source(relations, TableFilter(src.include, src.exclude), src.include, src.exclude, role)


def publication_plan(conn: psycopg.Connection, settings: LoaderSettings, role: str | None = None) -> SourcePlan:
    """The captured set for pgoutput: what the publication lists. A table without a replica
    identity stays out of it (publishing it would make PostgreSQL reject its UPDATE and DELETE)."""
    src = settings.source
    relations = read_relations(conn, src.partitions)
    plan = plan_source(
        relations,
        TableFilter(src.include, src.exclude),
        src.include,
        src.exclude,
        role or current_role(conn),
    )
    for rel in relations:
        if rel.qualified == rel.logical and rel.logical in plan.wanted and not rel.has_identity:
            plan.wanted.discard(rel.logical)
            plan.skipped[rel.logical] = (
                "skipped: no replica identity, and a publication listing it would make PostgreSQL reject its "
                "UPDATE and DELETE (add a primary key or REPLICA IDENTITY FULL)"
            )
    plan.add_tables, plan.filter_tables = None, []  # wal2json's options: not used with pgoutput
    return plan
