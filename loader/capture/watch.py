"""What changes rows without a row change in the WAL: the capture's watch on the source catalog.

Logical decoding shows only what later rows look like. PostgreSQL logs no row changes for an
``ADD COLUMN`` whose default fills existing rows (a "missing value", or a table rewrite for a
volatile default), for ``ALTER COLUMN TYPE ... USING``, for a column or table rename, for a table
dropped and created again, for ``SET LOGGED``; and it stops decoding updates and deletes when a
replica identity is dropped. So every capture run compares the catalog with what the previous run
saw, by relation oid and attribute number (never by name, which a rename changes), and decides:

- *resync* the table (a consistent re-snapshot that replaces its state, placed in the stream):
  after a column added with a default that filled existing rows, a table rewrite (an ALTER TYPE
  ... USING, VACUUM FULL and CLUSTER too: the catalog cannot tell them apart, and a resync is
  always correct), a column rename, a table dropped and re-created or renamed into the name, SET
  LOGGED, a replica identity that can carry updates and deletes again (of a table without a key
  too: its history's state missed what was not decoded), a changed key, and a table included again
  after being excluded;
- *park* the table (its current table stops before anything the stream can no longer express):
  replica identity lost (NOTHING, or DEFAULT without a primary key), a key change (until its
  resync), SET UNLOGGED, dropped, renamed away, or excluded by configuration.

Pure: :func:`plan_watch` takes the facts of two runs and returns decisions; :func:`read_facts` is
the one catalog query.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psycopg

from loader.capture.source_tables import IDENTITY_NAMES, IDENTITY_OK_SQL, SourceTableInfo, index_columns_sql
from loader.lake.types import spark_type


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    has_missing: bool  # ADD COLUMN ... DEFAULT filled existing rows without writing them
    # What of the column's type decides how its stored values read (see _TYPE_SIGNATURE_SQL):
    # {"enum": {label oid: label}} or {"composite": [[attnum, name, type], ...]}; None for other
    # types, and in a picture an older version of the loader saved.
    type_sig: Any = None
    # pg_attribute.attgenerated: '' plain, 's' stored generated; None in a picture an older version
    # of the loader saved.
    generated: str | None = None

    @classmethod
    def from_array(cls, a: list[Any]) -> Column:
        """A column as the picture stores it: [name, type, has_missing, type_sig, generated] (the
        last two missing from pictures older versions saved)."""
        return cls(str(a[0]), str(a[1]), bool(a[2]), a[3] if len(a) > 3 else None, a[4] if len(a) > 4 else None)


@dataclass(frozen=True)
class TableFacts:
    """What the catalog says about one table, as of one capture run."""

    oid: int
    relfilenode: int
    persistence: str  # p permanent, u unlogged
    replica_identity: str  # default / full / nothing / index
    primary_key: list[str]
    identity_index_columns: list[str]
    columns: dict[str, Column]  # attnum (text) -> column
    partitions: list[str] = field(default_factory=list)  # a partitioned table's leaf partitions
    identity_ok: bool = True  # see SourceTableInfo.identity_ok
    # The transaction that created the table (the xmin of its row type's pg_type row, which ADD
    # COLUMN, keys, indexes and grants leave alone; a rename, SET SCHEMA or OWNER TO rewrites it):
    # a change in the stream from an older transaction was a change of another table under this
    # name (see plan_stream_table). None in a picture an older version of the loader saved.
    created_xid: int | None = None

    @property
    def info(self) -> SourceTableInfo:
        return SourceTableInfo(
            "", "", self.replica_identity, self.primary_key, self.identity_index_columns, self.identity_ok
        )

    @property
    def key(self) -> list[str]:
        return self.info.key

    @property
    def decodes_state(self) -> bool:
        """Its rows can be followed from the stream: updates and deletes decoded, logged. A table
        without a key has no current table, but history's state (its rows) is kept exact."""
        return self.info.updates_deletes_captured and self.persistence == "p"

    @property
    def keeps_current(self) -> bool:
        """Its changes can keep a current table exact: keyed, updates and deletes decoded, logged."""
        return bool(self.key) and self.persistence == "p"

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["columns"] = {n: [c.name, c.type, c.has_missing, c.type_sig, c.generated] for n, c in self.columns.items()}
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TableFacts:
        return cls(
            oid=int(doc["oid"]),
            relfilenode=int(doc["relfilenode"]),
            persistence=str(doc["persistence"]),
            replica_identity=str(doc["replica_identity"]),
            primary_key=list(doc["primary_key"]),
            identity_index_columns=list(doc["identity_index_columns"]),
            columns={n: Column.from_array(c) for n, c in doc["columns"].items()},
            partitions=list(doc.get("partitions", [])),
            identity_ok=bool(doc.get("identity_ok", True)),
            created_xid=None if doc.get("created_xid") is None else int(doc["created_xid"]),
        )


def _changed_since_created(facts: TableFacts, resync_on_rewrite: bool) -> str | None:
    """What a table first seen now went through since it was created, without row changes in the
    WAL: no earlier picture to compare with, so the catalog's own traces tell. A fast default leaves
    its "missing value" on the column; a rewrite gives the table a relfilenode other than its oid
    (a new table's first relfilenode is its oid). Partitioned tables' filenode is a digest of their
    partitions': only the missing values count there. A table without a key counts as much as one
    with: its history's state is its rows (``loader verify``), and a rewrite may be SET LOGGED after
    changes the WAL never had."""
    filled = [c.name for c in facts.columns.values() if c.has_missing]
    if filled:
        return f"column {', '.join(filled)} was added with a default that filled the existing rows"
    # (A partitioned table without partitions has no storage: relfilenode 0.)
    if (
        resync_on_rewrite
        and facts.persistence == "p"
        and not facts.partitions
        and facts.relfilenode not in (0, facts.oid)
    ):
        return "rewritten (ALTER ... USING, VACUUM FULL, CLUSTER, TRUNCATE): its rows may have changed without row changes in the WAL"
    return None


@dataclass
class WatchPlan:
    resync: dict[str, str] = field(default_factory=dict)  # table -> reason
    park: dict[str, str] = field(default_factory=dict)  # table -> reason
    notes: list[str] = field(default_factory=list)
    # With DDL in the stream (loader.capture.ddl): rewrites the catalog alone shows (a new
    # relfilenode and no column change), not resynced unless the stream's DDL messages turn out to
    # be incomplete this run: a table_rewrite message says when an ALTER rewrote rows; without one
    # it was TRUNCATE (in the stream), VACUUM FULL, CLUSTER or SET TABLESPACE (no value changed).
    deferred: dict[str, str] = field(default_factory=dict)


def column_changes(old: TableFacts, now: TableFacts, rewritten: bool) -> tuple[list[str], list[str]]:
    """Why the stored rows changed between two pictures of one table, column by column (by attnum,
    never by name), and the columns added without a default that filled existing rows."""
    reasons: list[str] = []
    added_plain: list[str] = []
    for attnum, col in sorted(now.columns.items(), key=lambda kv: int(kv[0])):
        prev = old.columns.get(attnum)
        if prev is None:
            if col.has_missing:
                reasons.append(f"column {col.name} was added with a default that filled the existing rows")
            else:
                added_plain.append(col.name)
        elif prev.name != col.name:
            reasons.append(f"column {prev.name} was renamed to {col.name}")
        elif prev.generated is not None and col.generated is not None and prev.generated != col.generated:
            # DROP EXPRESSION keeps the values and rewrites nothing; pgoutput never sent them.
            reasons.append(
                f"column {col.name} is no longer generated (DROP EXPRESSION): its values come from the stream now, and pgoutput never sent them"
                if prev.generated
                else f"column {col.name} became generated"
            )
        elif prev.type != col.type and rewritten:
            reasons.append(f"column {col.name} changed type from {prev.type} to {col.type} with a table rewrite")
        elif prev.type != col.type and not retype_in_place(prev.type, col.type):
            reasons.append(f"column {col.name} changed type from {prev.type} to {col.type}, {RETYPE_NOT_IN_PLACE}")
        else:
            changed = type_change(prev.type_sig, col.type_sig)
            if changed:
                reasons.append(f"column {col.name}'s type {col.type}: {changed}, which every stored value shows")
    return reasons, added_plain


def plan_watch(
    before: dict[str, TableFacts] | None,
    now: dict[str, TableFacts],
    included: Callable[[str], bool],
    was_included: Callable[[str], bool],
    resync_on_rewrite: bool = True,
    roots_before: dict[str, str] | None = None,
    roots_now: dict[str, str] | None = None,
    ddl_in_stream: bool = False,
    skipped: dict[str, str] | None = None,
) -> WatchPlan:
    """Decisions for every table, from the catalog as the previous run saw it and as it is now.

    ``roots_*``: leaf partition -> partitioned table, when partitions land as their root.
    ``ddl_in_stream``: the DDL trigger was in place since the previous run, so a rewrite without a
    column change goes to ``plan.deferred`` instead of ``plan.resync``.
    ``skipped``: tables the configuration includes but capture cannot follow, and why (the role
    may not read it; pgoutput: no replica identity): the reason a park shows.
    """
    plan = WatchPlan()
    roots_before, roots_now = roots_before or {}, roots_now or {}
    if before is None:  # first run: nothing to compare with
        return plan
    by_oid_before = {f.oid: t for t, f in before.items()}
    by_oid_now = {f.oid: t for t, f in now.items()}
    for table, facts in sorted(now.items()):
        if not included(table):
            if table in before and was_included(table):
                why = (skipped or {}).get(table, "excluded from capture by configuration")
                plan.park[table] = f"{why}: its changes are no longer captured"
            continue
        old = before.get(table)
        renamed_from = by_oid_before.get(facts.oid)
        if old is None or old.oid != facts.oid:
            if renamed_from is not None and renamed_from != table:
                plan.resync[table] = f"renamed from {renamed_from}: its rows continue under this name"
            elif table in roots_before:
                plan.resync[table] = f"detached from {roots_before[table]}: its rows were captured as that table's"
            elif old is not None:
                plan.resync[table] = "dropped and created again at the source: the old rows are gone"
            elif facts.persistence == "u":
                plan.notes.append(f"{table}: UNLOGGED, its changes are not in the WAL and cannot be captured")
            else:
                reason = _changed_since_created(facts, resync_on_rewrite)
                if reason and ddl_in_stream and reason.startswith("rewritten"):
                    plan.deferred[table] = f"created since the last look, then {reason}"
                elif reason:
                    plan.resync[table] = f"created since the last look, then {reason}"
            continue
        if not was_included(table):
            plan.resync[table] = "included in capture again: changes made while it was excluded were not captured"
            continue
        if old.persistence == "u" and facts.persistence == "p":
            plan.resync[table] = "SET LOGGED: its rows were never in the WAL while it was unlogged"
            continue
        if old.persistence == "p" and facts.persistence == "u":
            plan.park[table] = "SET UNLOGGED: its changes are no longer in the WAL; SET LOGGED to resume"
            continue
        if old.keeps_current and not facts.keeps_current:
            plan.park[table] = (
                f"replica identity is now {facts.replica_identity.upper()}"
                f"{'' if facts.primary_key else ' without a primary key'}: updates and deletes are no longer "
                "decoded, so the current table stops here; set REPLICA IDENTITY DEFAULT (with a primary key), "
                "FULL or USING INDEX to resume (the loader then resyncs it)"
            )
            continue
        if facts.keeps_current and not old.keeps_current and facts.key:
            plan.resync[table] = f"replica identity {facts.replica_identity.upper()} carries updates and deletes again"
            continue
        if facts.decodes_state and not old.decodes_state:
            # No key, so no current table; but updates and deletes made while none was decoded are
            # missing from history's state, which only a resync restores (make fuzz, seed 324: a
            # keyless table's deletes, then REPLICA IDENTITY FULL, kept the deleted rows).
            plan.resync[table] = (
                f"replica identity {facts.replica_identity.upper()} carries updates and deletes now: history's "
                "state restarts from a re-read (those made before were not decoded)"
            )
            continue
        if old.partitions != facts.partitions:
            attached = sorted(set(facts.partitions) - set(old.partitions))
            detached = sorted(set(old.partitions) - set(facts.partitions))
            what = "; ".join(
                part
                for part in (
                    f"partition {', '.join(attached)} attached" if attached else "",
                    f"partition {', '.join(detached)} detached" if detached else "",
                )
                if part
            )
            plan.resync[table] = f"{what}: the table's rows changed without row changes in the WAL"
            continue
        if old.key and facts.key and old.key != facts.key:
            reason = f"key changed from ({', '.join(old.key)}) to ({', '.join(facts.key)})"
            plan.park[table] = reason + "; the current table waits for the resync"
            plan.resync[table] = reason
            continue
        rewritten = old.relfilenode != facts.relfilenode
        reasons, added_plain = column_changes(old, facts, rewritten)
        if rewritten and not reasons:
            if added_plain:
                reasons.append(f"column {', '.join(added_plain)} was added with a table rewrite (volatile default)")
            elif resync_on_rewrite and ddl_in_stream:
                # Keyed or not: a table without a key has no current table, but its history's
                # state is its rows, so it is resynced when the rewrite lost changes (SET UNLOGGED,
                # rows, SET LOGGED), and only the DDL trigger tells that from a TRUNCATE or VACUUM
                # FULL (pgbench_history is not copied again after pgbench's TRUNCATE). Without the
                # trigger the catalog cannot tell them apart: resynced (found by make fuzz, seed 2
                # with 5 rounds over 6 tables: a REPLICA IDENTITY FULL table kept 3 rows deleted
                # while it was unlogged).
                plan.deferred[table] = (
                    "the table was rewritten (ALTER ... USING, VACUUM FULL, CLUSTER, TRUNCATE, SET TABLESPACE): "
                    "its rows may have changed without row changes in the WAL"
                )
            elif resync_on_rewrite:
                reasons.append(
                    "the table was rewritten (ALTER ... USING, VACUUM FULL, CLUSTER, TRUNCATE, SET TABLESPACE): "
                    "its rows may have changed without row changes in the WAL"
                )
        if reasons:
            plan.resync[table] = "; ".join(reasons)
    for table, old in sorted(before.items()):
        if table in now or not was_included(table):
            continue
        moved_to = by_oid_now.get(old.oid)
        if table in roots_now:
            plan.park[table] = f"attached as a partition of {roots_now[table]}: its changes continue there"
        elif moved_to is not None:
            plan.park[table] = f"renamed to {moved_to} at the source: its changes continue there"
        else:
            plan.park[table] = "dropped at the source: the current table keeps its last state"
    return plan


# The type behind a column's type ``t0`` whose DDL can change stored values: an array's element, a
# domain's base, else the type itself. One spelling for the catalog picture (below) and for the DDL
# trigger's "tables using a type" (loader.capture.ddl).
TYPE_BEHIND_SQL = (
    "CASE WHEN t0.typcategory = 'A' THEN t0.typelem WHEN t0.typtype = 'd' THEN t0.typbasetype ELSE t0.oid END"
)

# Type-level DDL changes stored values without a row change in the WAL: ALTER TYPE ... RENAME
# VALUE changes every stored enum value's text; adding, dropping or retyping an attribute of a
# composite type changes every stored value's text. The column's type (an array's element, a
# domain's base) is described by what those statements change; ADD VALUE changes no stored value.
_TYPE_SIGNATURE_SQL = f"""(SELECT CASE et.typtype
      WHEN 'e' THEN json_build_object('enum', (SELECT json_object_agg(e.oid, e.enumlabel) FROM pg_enum e
                                               WHERE e.enumtypid = et.oid))
      WHEN 'c' THEN json_build_object('composite', (SELECT json_agg(json_build_array(ca.attnum, ca.attname,
                                                        format_type(ca.atttypid, ca.atttypmod)) ORDER BY ca.attnum)
                                                    FROM pg_attribute ca WHERE ca.attrelid = et.typrelid
                                                      AND ca.attnum > 0 AND NOT ca.attisdropped))
      END
    FROM pg_type t0 JOIN pg_type et ON et.oid = {TYPE_BEHIND_SQL}
    WHERE t0.oid = a.atttypid)"""


# For tables first seen in a run (no earlier picture to compare their type signatures with): per
# column whose type (an array's element, a domain's base) is an enum or a composite, the newest
# transaction that wrote one of the catalog rows its DDL changes (pg_enum's labels, the composite's
# attributes), by age. ``%s``: the tables' oids.
TYPES_CHANGED_SQL = f"""
SELECT c.oid::bigint, a.attname, format_type(a.atttypid, a.atttypmod),
       (SELECT x::text::bigint
          FROM (SELECT e.xmin AS x FROM pg_enum e WHERE e.enumtypid = et.oid
                UNION ALL
                SELECT ca.xmin FROM pg_attribute ca WHERE ca.attrelid = et.typrelid AND ca.attnum > 0) s
         ORDER BY age(x) LIMIT 1) AS changed_xid
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t0 ON t0.oid = a.atttypid
JOIN pg_type et ON et.oid = {TYPE_BEHIND_SQL}
WHERE c.oid = ANY(%s) AND et.typtype IN ('e', 'c')
ORDER BY 1, a.attnum"""


def plan_types_changed(rows: list[tuple[int, str, str, int | None]], facts: dict[str, TableFacts]) -> dict[str, str]:
    """Tables first seen in a run (``facts``) whose column's enum or composite type was changed
    after the table was created (``rows``: :data:`TYPES_CHANGED_SQL`'s): ALTER TYPE ... RENAME
    VALUE, or an attribute added, dropped, renamed or retyped, changes the text of every value
    stored before it without a row change in the WAL, and with no earlier picture of the table
    only the catalog rows' transactions tell (found by make fuzz, seed 2084: a table created, filled
    and its enum's label renamed between two runs kept the old label). ADD VALUE writes a label row
    too and changes no stored value: such a table is resynced all the same (correct, and new)."""
    by_oid = {f.oid: (t, f) for t, f in facts.items()}
    out: dict[str, list[str]] = {}
    for oid, column, typ, changed in rows:
        table, f = by_oid.get(int(oid), (None, None))
        created = f.created_xid if f is not None else None
        if table is None or created is None or changed is None:
            continue
        if min(created, changed) < FIRST_NORMAL_XID or not xid_precedes(created, changed):
            continue
        out.setdefault(table, []).append(f"{column} ({typ})")
    return {
        t: f"created since the last look, then the type of column {', '.join(cols)} changed (ALTER TYPE), "
        "which may have changed the text of every value stored before"
        for t, cols in out.items()
    }


RETYPE_NOT_IN_PLACE = (
    "a retype the lake cannot apply in place (the load keeps the old values under pg__r<k>_<column>): "
    "resynced to fill the new column"
)
_DECIMAL = re.compile(r"^DECIMAL\((\d+),(\d+)\)\Z")


def retype_in_place(old: str, new: str) -> bool:
    """Whether the lake takes a column's retype without a rewrite in place (the same lake type, an
    integer or float widening, or a decimal's precision widened at the same scale): a retype
    PostgreSQL makes without rewriting the table (``numeric(10,2)`` to ``numeric``, ``varchar(5)``
    to ``text``, ``timestamp`` to ``timestamptz`` in UTC) sends no row changes, and if the lake
    cannot apply it in place the history load retires the column and the current table needs a
    resync."""
    a, b = spark_type(old).sql, spark_type(new).sql
    if a == b or (a, b) in {("SMALLINT", "INT"), ("INT", "BIGINT"), ("SMALLINT", "BIGINT"), ("FLOAT", "DOUBLE")}:
        return True
    da, db = _DECIMAL.match(a), _DECIMAL.match(b)
    return bool(da and db and da.group(2) == db.group(2) and int(db.group(1)) >= int(da.group(1)))


def type_change(before: Any, after: Any) -> str | None:
    """How a column's type changed the text of values already stored, if it did (None also when
    either picture has no signature: an older picture, or a type whose values DDL cannot change)."""
    if not before or not after:
        return None
    if "enum" in before and "enum" in after:
        old, new = before["enum"] or {}, after["enum"] or {}
        renamed = [f"{old[k]!r} -> {new[k]!r}" for k in sorted(old) if k in new and new[k] != old[k]]
        return f"enum value renamed ({', '.join(renamed)})" if renamed else None
    if before != after:
        return "composite type's attributes changed"
    return None


# One table's catalog picture (a row per table ``c``), named so the DDL trigger can send it as JSON
# (loader.capture.ddl) and :func:`facts_from_rows` reads both forms the same way.
FACTS_SELECT = f"""
SELECT n.nspname AS nspname, c.relname AS relname, c.oid::bigint AS oid, c.relfilenode::bigint AS relfilenode,
       c.relpersistence AS persistence, c.relreplident AS replident,
       {index_columns_sql("primary")} AS primary_key,
       {index_columns_sql("identity")} AS identity_columns,
       COALESCE((SELECT json_agg(json_build_array(a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.atthasmissing,
                                                  {_TYPE_SIGNATURE_SQL}, a.attgenerated)
                         ORDER BY a.attnum)
                 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '[]') AS columns,
       c.relkind AS relkind, c.relispartition AS is_partition,
       (SELECT rn.nspname || '.' || r.relname FROM pg_class r JOIN pg_namespace rn ON rn.oid = r.relnamespace
         WHERE c.relispartition AND r.oid = pg_partition_root(c.oid)) AS root,
       {IDENTITY_OK_SQL} AS identity_ok,
       (SELECT ct.xmin::text::bigint FROM pg_type ct WHERE ct.oid = c.reltype) AS created_xid
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence IN ('p', 'u')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_'"""
FACTS_FIELDS = (
    "nspname",
    "relname",
    "oid",
    "relfilenode",
    "persistence",
    "replident",
    "primary_key",
    "identity_columns",
    "columns",
    "relkind",
    "is_partition",
    "root",
    "identity_ok",
    "created_xid",
)
_FACTS_SQL = FACTS_SELECT


def facts_from_rows(rows: Any) -> list[tuple[str, TableFacts, str, bool, str | None]]:
    """(table, facts, relkind, is a partition, its root) of each row of :data:`FACTS_SELECT`: tuples
    as a query returns them, or objects keyed by :data:`FACTS_FIELDS` as the DDL trigger sends them."""
    out = []
    for row in rows:
        # (A message of an older trigger function has no created_xid.)
        r: list[Any] = [row.get(k) for k in FACTS_FIELDS] if isinstance(row, dict) else list(row)
        schema, name, oid, filenode, persistence, ident, pk, idx, cols, kind, is_partition, root, ident_ok, xid = r
        f = TableFacts(
            oid=int(oid),
            relfilenode=int(filenode),
            persistence=str(persistence),
            replica_identity=IDENTITY_NAMES.get(ident, ident),
            primary_key=list(pk or []),
            identity_index_columns=list(idx or []),
            columns={str(a[0]): Column.from_array(a[1:]) for a in cols},  # [attnum, *the stored array]
            identity_ok=bool(ident_ok),
            created_xid=None if xid is None else int(xid),
        )
        out.append((f"{schema}.{name}", f, str(kind), bool(is_partition), root))
    return out


@dataclass
class CatalogView:
    """The tables capture treats as tables, and where each leaf partition's changes belong."""

    facts: dict[str, TableFacts]
    roots: dict[str, str]  # leaf partition -> its partitioned table (partitions="root" only)


def read_facts(conn: psycopg.Connection, partitions: str = "root") -> CatalogView:
    """Facts of every table of the source, in one query.

    With ``partitions="root"`` a partitioned table stands for its partitions: its facts aggregate
    theirs (a rewrite or a "missing value" in any partition counts; the partition list is kept, so
    ATTACH and DETACH, which change its rows without row changes, are seen), and the leaves are not
    tables of their own. With ``"leaf"`` every partition is a table and partitioned tables are not.
    """
    rows = conn.execute(_FACTS_SQL).fetchall()
    facts: dict[str, TableFacts] = {}
    roots: dict[str, str] = {}
    leaves: dict[str, list[tuple[str, TableFacts]]] = {}
    for table, f, kind, is_partition, root in facts_from_rows(rows):
        if partitions == "leaf":
            if kind == "r":
                facts[table] = f
        elif is_partition:
            if kind == "r" and root:
                roots[table] = root
                leaves.setdefault(root, []).append((table, f))
        else:
            facts[table] = f
    for root, parts in leaves.items():
        base = facts.get(root)
        if base is None:
            continue
        missing = {c.name for _, leaf in parts for c in leaf.columns.values() if c.has_missing}
        digest = hashlib.sha1(repr(sorted((leaf.oid, leaf.relfilenode) for _, leaf in parts)).encode()).hexdigest()
        facts[root] = replace(
            base,
            relfilenode=int(digest[:15], 16),
            persistence="u" if any(leaf.persistence == "u" for _, leaf in parts) else "p",
            columns={n: replace(c, has_missing=c.name in missing) for n, c in base.columns.items()},
            partitions=sorted(t for t, _ in parts),
            # Each partition's changes are decoded with its own identity: the weakest one decides.
            identity_ok=base.identity_ok and all(leaf.info.updates_deletes_captured for _, leaf in parts),
        )
    return CatalogView(facts, roots)


def first_seen(before: dict[str, TableFacts] | None, now: dict[str, TableFacts]) -> set[str]:
    """Tables of the catalog now that the previous run's picture did not have (by oid): created,
    or renamed into the catalog, since; every table on a first run."""
    if before is None:
        return set(now)
    oids = {f.oid for f in before.values()}
    return {t for t, f in now.items() if f.oid not in oids}


def plan_stream_table(
    table: str,
    stream_columns: list[tuple[str, str]],
    before: dict[str, TableFacts] | None,
    now: dict[str, TableFacts],
    new: set[str],
    included: Callable[[str], bool],
    ddl_in_stream: bool = False,
    xid: int | None = None,
) -> WatchPlan:
    """What the stream's own names say where the catalog's pictures cannot explain them, for the
    first change of ``table`` (its name, and its columns' names and types, as the stream carries
    them) in a run.

    The catalog is read once per run, and a table created since the last run has no earlier
    picture: between two runs it may have been created, filled and then renamed (or moved by SET
    SCHEMA), dropped, or had a column renamed, and the stream's changes carry the names of the time.
    ``new``: the tables first seen in this run (:func:`first_seen`).

    - a table in the stream that the catalog now does not have, and that the previous picture does
      not explain (plan_watch parks and resyncs a known table renamed away by its oid): its changes
      stop here (parked); and unless the DDL trigger's messages name every rename since the last
      run (``ddl_in_stream``: ``ddl.plan_message`` resyncs the renamed table then), every table
      first seen in this run may be it under its new name, holding rows the stream gave the old
      one: each is resynced;
    - a table first seen in this run whose change carries a column the catalog no longer has
      (renamed or dropped since), or one retyped since in a way the lake cannot apply in place
      (``numeric(10,2)`` to ``numeric`` rewrites nothing, so no other trace tells): resynced,
      without the DDL trigger (its messages compare the pictures themselves);
    - a table first seen in this run whose change (of transaction ``xid``) is older than the table
      under its name now (``TableFacts.created_xid``): a table created, filled, dropped and created
      again under the name since the last run, its columns the same or not (fuzz seed 159 with the
      trigger; :func:`loader.capture.ddl.plan_message` sees the second CREATE there): resynced,
      without the DDL trigger. A table first seen after a rename, SET SCHEMA or OWNER TO of it is
      resynced too (they rewrite the row type's catalog row; ADD/DROP/RENAME COLUMN, ALTER TYPE,
      keys, indexes, grants, REPLICA IDENTITY, TRUNCATE, VACUUM FULL, SET (UN)LOGGED do not:
      checked on PostgreSQL 15), as is one whose first change comes from a transaction that began
      before the one that created it (or created it in a subtransaction): correct, and rare.
    """
    plan = WatchPlan()
    facts = now.get(table)
    if facts is None:
        old = (before or {}).get(table)
        if old is not None and any(f.oid == old.oid for f in now.values()):
            return plan  # renamed away: plan_watch parked it and resyncs the new name
        if old is None:
            plan.park[table] = (
                "not in the source catalog: created since the last capture, then renamed or dropped; its "
                "changes in the stream carry this name, its rows continue (if renamed) under the new one"
            )
        if not ddl_in_stream:
            for t in sorted(new):
                if included(t) and now[t].persistence == "p":
                    plan.resync[t] = (
                        f"first seen in this run while the stream carries changes of {table}, a table the catalog "
                        "does not have: this may be that table renamed, with rows landed under the old name"
                    )
        return plan
    if ddl_in_stream or table not in new:
        return plan
    types = {c.name: c.type for c in facts.columns.values()}
    whys = []
    gone = [name for name, _ in stream_columns if name not in types]
    if gone:
        whys.append(
            f"first seen in this run with changes carrying column {', '.join(gone)}, which the catalog no longer "
            "has (renamed or dropped since the table was created): its rows may differ from the stream's"
        )
    for name, typ in stream_columns:
        now_type = types.get(name)
        if now_type is not None and now_type != typ and not retype_in_place(typ, now_type):
            whys.append(
                f"column {name} changed type from {typ} to {now_type} since it was created, {RETYPE_NOT_IN_PLACE}"
            )
    created = facts.created_xid
    if xid is not None and created is not None and created >= FIRST_NORMAL_XID and xid_precedes(xid, created):
        whys.append(
            f"first seen in this run with a change of transaction {xid}, older than the table under this name "
            f"now (created by transaction {created}): a table dropped (or renamed away) since had the name"
        )
    if whys:
        plan.resync[table] = "; ".join(whys)
    return plan


FIRST_NORMAL_XID = 3  # below it: invalid, bootstrap and frozen transaction ids


def xid_precedes(a: int, b: int) -> bool:
    """PostgreSQL's TransactionIdPrecedes for two normal 32-bit transaction ids (modulo 2^32)."""
    return ((a - b) & 0xFFFFFFFF) >= 0x80000000
