"""DDL in the stream: an event trigger on the source that puts every table DDL into the WAL.

Why: PostgreSQL logs no row changes for a fast default, a retype, a rename or a type-level change,
and the catalog comparison (``loader.capture.watch``) only sees the catalog as it is at each run.
It cannot tell a TRUNCATE, VACUUM FULL or CLUSTER (nothing to do: the stream carries the truncate,
the others change no value) from an ``ALTER ... USING`` (every value may have changed), and it has
no earlier picture of a table created since the last run. So, where the role may, capture installs
an event trigger (``ddl_command_end`` and ``table_rewrite``) whose function emits a transactional
logical message, ``pg_logical_emit_message(true, 'loader.ddl', json)``, carrying the command tag,
the objects, the rewrite reason and the catalog picture of every table the command touched (the
same picture the catalog comparison reads: ``watch.FACTS_SELECT``): columns by attnum with their
types, "missing value" flags and type signatures, replica identity, keys, relfilenode. A type-level
command (``ALTER TYPE``, ``ALTER DOMAIN``) names the tables using the type, through arrays and
domains (``watch.TYPE_BEHIND_SQL``). The message commits with the DDL, so it lands in the stream
at the DDL's exact position, in both plugins.

What capture does with them (pure: :func:`plan_message`): compares each table's picture with the
last one it knew (the previous run's catalog picture, then each message's) and resyncs the table,
parked right after the DDL's transaction, when its stored rows changed outside the WAL: a fast
default on existing rows, a ``table_rewrite`` of a column (``ALTER ... TYPE ... USING``) or for a
volatile default, ``SET LOGGED`` (rows written while unlogged were never in the WAL), a rename, a
retype the lake cannot apply in place (``numeric(10,2)`` to ``numeric``), a type-level change of
stored values. And with the trigger in place since the last run, a rewrite the catalog shows with
no ``table_rewrite`` message is a TRUNCATE (in the stream), VACUUM FULL, CLUSTER or SET TABLESPACE:
no resync.

Safety on the source: the function runs inside other people's DDL, so it catches its own errors
(a warning, and a message saying capture must fall back to the catalog comparison), pins
``search_path = pg_catalog``, lives in the ``loader`` schema, emits nothing for DDL that touches no
table, and is ``SECURITY DEFINER`` (its owner, who installed it, may emit messages even where the
role running the DDL may not). Switch it off without a restart with ``ALTER EVENT TRIGGER
loader_ddl_end DISABLE; ALTER EVENT TRIGGER loader_ddl_rewrite DISABLE`` (capture leaves disabled
triggers alone and compares catalogs only). There is no per-session switch: a session whose DDL
emitted nothing would leave capture trusting a stream that misses it.
``loader slot drop`` removes it (:func:`uninstall`).

Rights: ``CREATE EVENT TRIGGER`` needs a superuser (on RDS and Aurora: a member of
``rds_superuser``). Otherwise capture logs once what an administrator can run (:func:`install_sql`,
printed by ``loader slot ddl-trigger``) and keeps to the catalog comparison.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from loader.capture.watch import (
    FACTS_SELECT,
    TYPE_BEHIND_SQL,
    TableFacts,
    column_changes,
    facts_from_rows,
)

log = logging.getLogger("loader.capture")

PREFIX = "loader.ddl"
SCHEMA = "loader"
FUNCTION = "loader.ddl_message()"
TRIGGERS = {"loader_ddl_end": "ddl_command_end", "loader_ddl_rewrite": "table_rewrite"}
# The function's comment: which version of it is installed (capture replaces an older one).
VERSION = "lakehouse-loader ddl trigger v3"

# table_rewrite reasons (PostgreSQL's AT_REWRITE_* bits).
REWRITE_PERSISTENCE = 1
REWRITE_DEFAULT = 2
REWRITE_COLUMN = 4
REWRITE_ACCESS_METHOD = 8

_FUNCTION_SQL = f"""
CREATE OR REPLACE FUNCTION loader.ddl_message() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $loader$
DECLARE
  rels oid[];
  types oid[];
  doc jsonb;
BEGIN
  BEGIN
    IF TG_EVENT = 'table_rewrite' THEN
      rels := ARRAY[pg_event_trigger_table_rewrite_oid()];
      doc := jsonb_build_object('rewrite_reason', pg_event_trigger_table_rewrite_reason());
    ELSE
      SELECT array_agg(DISTINCT c.oid) FILTER (WHERE c.relkind IN ('r', 'p')),
             array_agg(DISTINCT CASE WHEN d.classid = 'pg_type'::regclass THEN d.objid ELSE c.reltype END)
               FILTER (WHERE d.classid = 'pg_type'::regclass OR c.relkind = 'c'),
             jsonb_agg(jsonb_build_array(d.command_tag, d.object_type, d.object_identity))
        INTO rels, types, doc
        FROM pg_event_trigger_ddl_commands() d
        LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid;
      IF types IS NOT NULL THEN
        -- the tables using the type, through arrays and domains
        rels := coalesce(rels, '{{}}') || ARRAY(
          SELECT DISTINCT a.attrelid FROM pg_attribute a JOIN pg_type t0 ON t0.oid = a.atttypid
           WHERE a.attnum > 0 AND NOT a.attisdropped
             AND (t0.oid = ANY(types) OR {TYPE_BEHIND_SQL} = ANY(types)));
      END IF;
      doc := jsonb_build_object('objects', doc);
    END IF;
    IF rels IS NULL OR cardinality(rels) = 0 THEN
      RETURN;  -- no table touched: nothing to say
    END IF;
    doc := doc || jsonb_build_object('v', 1, 'event', TG_EVENT, 'tag', TG_TAG, 'tables',
      (SELECT coalesce(jsonb_agg(to_jsonb(f)), '[]') FROM ({FACTS_SELECT} AND c.oid = ANY(rels)) f));
    PERFORM pg_catalog.pg_logical_emit_message(true, 'loader.ddl', doc::text);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'lakehouse-loader DDL trigger failed (%: %); the loader compares catalogs instead', SQLSTATE, SQLERRM;
    BEGIN
      PERFORM pg_catalog.pg_logical_emit_message(true, 'loader.ddl',
        pg_catalog.jsonb_build_object('v', 1, 'event', TG_EVENT, 'tag', TG_TAG, 'error', SQLERRM)::text);
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'lakehouse-loader DDL trigger could not report its failure (%)', SQLERRM;
    END;
  END;
END
$loader$
"""


def install_sql() -> str:
    """The statements that install (or replace) the trigger; what an administrator runs for a role
    that may not (``loader slot ddl-trigger`` prints them)."""
    triggers = "\n".join(
        f"DROP EVENT TRIGGER IF EXISTS {name};\n"
        f"CREATE EVENT TRIGGER {name} ON {event} EXECUTE FUNCTION loader.ddl_message();\n"
        # Also for sessions with session_replication_role = replica (pg_restore --disable-triggers,
        # migration tools): an event trigger enabled the default way does not fire for them.
        f"ALTER EVENT TRIGGER {name} ENABLE ALWAYS;"
        for name, event in TRIGGERS.items()
    )
    return (
        f"CREATE SCHEMA IF NOT EXISTS {SCHEMA};\n"
        f"{_FUNCTION_SQL.strip()};\n"
        f"COMMENT ON FUNCTION {FUNCTION} IS '{VERSION}';\n"
        f"REVOKE ALL ON FUNCTION {FUNCTION} FROM PUBLIC;\n"
        f"{triggers}\n"
    )


@dataclass(frozen=True)
class TriggerState:
    """The trigger as capture finds it: ``token`` identifies one installation (the triggers' oids),
    None when it is missing, disabled or an older version."""

    token: str | None
    why_not: str = ""


def state(conn: psycopg.Connection) -> TriggerState:
    rows = conn.execute(
        "SELECT evtname, oid::bigint, evtenabled FROM pg_event_trigger WHERE evtname = ANY(%s) ORDER BY evtname",
        (list(TRIGGERS),),
    ).fetchall()
    row = conn.execute(
        "SELECT obj_description(p.oid, 'pg_proc'),"
        " has_function_privilege(p.proowner, 'pg_catalog.pg_logical_emit_message(boolean, text, text)', 'EXECUTE')"
        # By the catalog, not to_regprocedure: a role without USAGE on the schema may still look.
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'loader' AND p.proname = 'ddl_message' AND p.pronargs = 0",
    ).fetchone()
    if len(rows) != len(TRIGGERS) or row is None or row[0] != VERSION:
        return TriggerState(None, "not installed")
    disabled = [name for name, _, enabled in rows if enabled == "D"]
    if disabled:
        return TriggerState(None, f"event trigger {', '.join(disabled)} is disabled")
    # 'O' (ALTER EVENT TRIGGER ... ENABLE) fires for ordinary sessions only, 'R' for replica ones
    # only: DDL of the other kind would be missing from a stream capture trusted ('A': always).
    partial = [name for name, _, enabled in rows if enabled != "A"]
    if partial:
        return TriggerState(
            None,
            f"event trigger {', '.join(partial)} is disabled for some sessions (session_replication_role;"
            " the loader installs it ENABLE ALWAYS)",
        )
    if not row[1]:
        # Its messages cannot be emitted: nothing in the stream would say a DDL happened.
        return TriggerState(None, f"the owner of {FUNCTION} may not execute pg_logical_emit_message")
    return TriggerState(",".join(str(oid) for _, oid, _ in rows))


def may_install(conn: psycopg.Connection) -> bool:
    """Superuser, or a member of rds_superuser (RDS, Aurora): who may CREATE EVENT TRIGGER."""
    row = conn.execute(
        "SELECT r.rolsuper OR (EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_superuser')"
        " AND pg_has_role(current_user, 'rds_superuser', 'MEMBER'))"
        " FROM pg_roles r WHERE r.rolname = current_user"
    ).fetchone()
    return bool(row and row[0])


def read_only(conn: psycopg.Connection) -> bool:
    """Whether the session's transactions are read-only (``default_transaction_read_only``, set
    for the role or the database by an administrator who meant it: the loader does not override it)."""
    row = conn.execute("SELECT current_setting('transaction_read_only') = 'on'").fetchone()
    return bool(row and row[0])


_warned: set[str] = set()


def ensure(conn: psycopg.Connection, enabled: bool = True) -> TriggerState:
    """The trigger in place where the role may install it (idempotent: a current, enabled one is left
    alone, a disabled one too); what the caller can count on."""
    if not enabled:
        return TriggerState(None, "source.ddl_trigger is false")
    found = state(conn)
    if found.token is not None or "disabled" in found.why_not or "may not execute" in found.why_not:
        return found
    role = conn.execute("SELECT current_user").fetchone()
    name = role[0] if role else "?"
    if read_only(conn):
        if name not in _warned:
            _warned.add(name)
            log.warning(
                "DDL capture is off: the loader's sessions are read-only (default_transaction_read_only is on for "
                "role %s or its database), so capture compares catalogs between runs only; to enable it, an "
                "administrator runs the SQL 'loader slot ddl-trigger' prints",
                name,
            )
        return found
    if not may_install(conn):
        if name not in _warned:
            _warned.add(name)
            log.warning(
                "DDL capture is off: role %s may not create event triggers (superuser or rds_superuser only), so "
                "capture compares catalogs between runs only (a rewrite is then always resynced, and DDL on a table "
                "created since the last run is seen only by its traces); to enable it, an administrator runs the "
                "SQL 'loader slot ddl-trigger' prints, or on RDS/Aurora: GRANT rds_superuser TO %s",
                name,
                name,
            )
        return found
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('lakehouse-loader ddl trigger'))")
        if state(conn).token is None:
            conn.execute(install_sql())
    log.info("installed the DDL trigger (event triggers %s, function %s)", ", ".join(TRIGGERS), FUNCTION)
    return state(conn)


def uninstall(conn: psycopg.Connection) -> bool:
    """Remove the trigger and its function (``loader slot drop``); False when the role may not."""
    if (
        state(conn).why_not == "not installed"
        and not conn.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = ANY(%s)", (list(TRIGGERS),)).fetchone()
    ):
        return True
    try:
        with conn.transaction():
            for name in TRIGGERS:
                conn.execute(f"DROP EVENT TRIGGER IF EXISTS {name}")
            conn.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}")
    except psycopg.errors.InsufficientPrivilege as exc:
        log.warning(
            "could not remove the DDL trigger (%s); an administrator runs: DROP EVENT TRIGGER %s; DROP FUNCTION %s",
            str(exc).strip(),
            "; DROP EVENT TRIGGER ".join(TRIGGERS),
            FUNCTION,
        )
        return False
    return True


# --- the messages ---------------------------------------------------------------------------


@dataclass
class Message:
    """One DDL message seen in a committed transaction."""

    lsn: int
    doc: dict[str, Any]
    commit_lsn: int = 0

    @property
    def error(self) -> str | None:
        return str(self.doc["error"]) if "error" in self.doc else None


def parse(prefix: Any, text: Any, lsn: int) -> Message | None:
    """A DDL message (None: another prefix). A body that is not a DDL document still counts, as an
    error: capture then falls back to the catalog comparison."""
    if prefix != PREFIX:
        return None
    try:
        doc = json.loads(text if isinstance(text, str) else bytes(text).decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        doc = {"error": f"unreadable DDL message: {exc}"}
    return Message(lsn, doc)


_CREATES = ("CREATE TABLE", "CREATE TABLE AS", "SELECT INTO")


@dataclass
class DdlPlan:
    resync: dict[str, str] = field(default_factory=dict)  # table -> reason
    notes: list[str] = field(default_factory=list)


def plan_message(
    msg: Message,
    known: dict[int, TableFacts],
    landed_as: Callable[[str, str | None, int], str | None],
    names: dict[int, str] | None = None,
    held: dict[str, int] | None = None,
) -> DdlPlan:
    """What one DDL message means for each table it pictures, against the last picture ``known``
    (by oid; updated with the message's). ``landed_as(table, root, oid)``: the table capture lands
    its changes as (a leaf partition's root with ``source.partitions = root``; a table renamed since,
    under its name now), None when it is gone (the catalog comparison speaks for it).

    ``names``: the last name of each table by oid (updated with the message's). A table pictured
    under another name than its last one was renamed (or moved by SET SCHEMA): the stream gave its
    earlier changes the old name, so the table under its name now is resynced. This is the only
    trace of a rename of a table created since the last run (no earlier catalog picture has it).

    ``held``: the oid that last had each name (updated with the message's). A table created under
    a name another table had (dropped or renamed away since) gets a fresh state: the stream gave
    that name the other table's rows, and a DROP emits no message (``ddl_command_end`` lists no
    dropped object), so its CREATE is the only trace where the lake never saw the other table (fuzz
    seed 159: created, filled, dropped and created again between two captures)."""
    plan = DdlPlan()
    names = {} if names is None else names
    held = {} if held is None else held
    doc = msg.doc
    tag = str(doc.get("tag", "?"))
    try:
        tables = facts_from_rows(doc.get("tables") or [])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        plan.notes.append(f"a DDL message ({tag}) could not be read ({exc!r})")
        return plan
    for table, facts, _kind, _is_partition, root in tables:
        target = landed_as(table, root, facts.oid)
        why = _meaning(doc, tag, facts, known.get(facts.oid))
        was = names.get(facts.oid)
        if was is not None and was != table and tag not in _CREATES:
            renamed = f"renamed from {was}: its earlier changes in the stream carry the old name"
            why = f"{renamed}; {why}" if why else renamed
        names[facts.oid] = table
        earlier = held.get(table)
        if earlier is not None and earlier != facts.oid and tag in _CREATES:
            again = "created again under the name of a table dropped or renamed away since: the old rows are gone"
            why = f"{again}; {why}" if why else again
        held[table] = facts.oid
        if doc.get("event") != "table_rewrite":  # its picture is the one before the rewrite
            known[facts.oid] = facts
        if why and target is not None:
            plan.resync[target] = f"{tag}: {why}" if target == table else f"{tag} on partition {table}: {why}"
    return plan


def _meaning(doc: dict[str, Any], tag: str, now: TableFacts, before: TableFacts | None) -> str | None:
    """Why this DDL changed the table's stored rows without row changes in the WAL, if it did."""
    if doc.get("event") == "table_rewrite":
        reason = int(doc.get("rewrite_reason") or 0)
        whys = []
        if reason & REWRITE_PERSISTENCE and now.persistence == "u":
            whys.append("SET LOGGED: its rows were never in the WAL while it was unlogged")
        if reason & REWRITE_DEFAULT:
            whys.append("a column added with a volatile default filled the existing rows")
        if reason & REWRITE_COLUMN:
            whys.append("a column was retyped and the table rewritten (every stored value converted)")
        return "; ".join(whys) or None
    if tag in _CREATES:
        return None  # its first picture (an earlier one by this oid is from before a wraparound)
    if before is None:
        filled = [c.name for c in now.columns.values() if c.has_missing]
        if filled:
            return f"column {', '.join(filled)} was added with a default that filled the existing rows"
        if tag in ("ALTER TYPE", "ALTER DOMAIN"):
            return "its column type changed at the type level (no earlier picture to compare with)"
        return None
    whys, _ = column_changes(before, now, rewritten=False)
    return "; ".join(whys) or None


def known_from(facts: dict[str, TableFacts]) -> dict[int, TableFacts]:
    return {f.oid: replace(f) for f in facts.values()}
