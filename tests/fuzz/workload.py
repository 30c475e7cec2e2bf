"""The fuzzer's workload generator: a seed becomes a list of steps, deterministically.

Pure: no database, no Spark. A step is either SQL for the source (statements run one after another
on one autocommit session; transactions are spelled out with BEGIN/COMMIT, savepoints included) or a
loader action (a run of the three stages in-process, a capture alone, a stage killed at a fault
point, two overlapping runs of a stage). The generator keeps a model of the source's schema and of
the keys each table holds, so every statement it writes is valid and chooses existing rows by key;
the same seed always produces the same SQL (``script`` prints it as one self-contained file).

Hazards excluded by default (issue 22) are produced only when their flag is in ``gaps``;
``KNOWN_GAPS`` names each one, why, and the issue row it belongs to.
"""

from __future__ import annotations

import copy
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

#: Hazards excluded unless asked for (``FUZZ_GAPS=all`` or a comma list), each with why. Each names
#: the row of issue 22 that tracks it. (Drawn by default since they were fixed: deferrable primary
#: keys, enum RENAME VALUE, ADD COLUMN ... DEFAULT and SET UNLOGGED ... SET LOGGED on a table created
#: since the last capture, columns differing only in case (the table parks alone,
#: which the oracle accepts), TRUNCATE / VACUUM FULL, numeric(p,s) -> numeric, +-infinity and BC dates
#: and timestamps.)
KNOWN_GAPS: dict[str, str] = {
    "nan_infinity": "issue 22, decided (flagged, not fixable): numeric/float NaN and +-Infinity are printed as null by "
    "wal2json 2.5, indistinguishable from NULL; capture flags each table with such columns, pgoutput or wal2json "
    "2.6+ keep them (tests/capture/test_pgoutput.py); drawn, the oracle accepts NULL in the lake exactly where the source "
    "holds them, in a table capture flagged, and a table parked because a resync read a numeric(p,s) NaN, which a "
    "decimal cannot hold (tests/fuzz/nan_gap.py)",
}

# The second schema has a dot in its name: the loader must take ``fz.other.t`` as table ``t`` of
# schema ``fz.other`` everywhere (by the source's catalog or the lake's tables, never the first dot).
SCHEMAS = ("public", "fz.other")
AUDIT_SCHEMA = "fz_audit"
# Settings that change how values print (see generate).
OUTPUT_SETTINGS = [
    ("bytea_output", "escape"),
    ("DateStyle", "SQL, DMY"),
    ("IntervalStyle", "sql_standard"),
    ("TimeZone", "Asia/Kolkata"),
    ("extra_float_digits", "0"),
]
ENUM = "public.fz_mood"
# DDL forms the fuzz may run from a session with session_replication_role = replica (they write no rows).
REPLICA_ROLE_FORMS = frozenset(
    {
        "add_column",
        "add_column_default",
        "add_column_volatile",
        "retype_widen",
        "retype_text",
        "set_default",
        "not_null",
        "vacuum_full",
        "enum_rename",
    }
)

# --- steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sql:
    """Statements for the source, in order, on one autocommit session (COPY: ``FROM STDIN`` + data)."""

    statements: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Loader:
    """A loader action: ``run`` (capture, load, merge in-process, then the oracle), ``capture``
    (in-process, no oracle), ``snapshot`` (what ``loader capture --snapshot`` does: the slot after a
    snapshot of the existing rows), ``kill`` (``stage`` as a process killed at ``point``), ``overlap``
    (``stage`` as a process held at its lock while the same stage runs in-process)."""

    action: str
    stage: str = ""
    point: str = ""


Step = Sql | Loader


@dataclass
class Workload:
    seed: int
    steps: list[Step]
    tracked: dict[str, list[str]]  # tables whose every change the audit trigger logs: key columns
    driver_load: bool  # load.driver_max_bytes on for this seed
    # source.ddl_trigger for this seed: DDL in the stream, or (one seed in three) the catalog
    # comparison alone, which cannot see what a table created since the last capture went through
    # without leaving a trace (SET UNLOGGED ... SET LOGGED, a retype without a rewrite): those
    # forms are not drawn for such tables then.
    ddl_trigger: bool = True
    gaps: frozenset[str] = frozenset()  # the KNOWN_GAPS drawn (the oracle allows for each)
    # Capture's pipelined read (a consumed copy of the slot, decoded in columns) for every capture
    # of this seed, in rounds of this many plugin rows; 0: capture peeks (backlogs this small
    # otherwise always peek). Drawn last, so the rest of a seed's workload does not depend on it.
    pipelined_rounds: int = 0
    # source.plugin for this seed: pgoutput (with its publication, kept by capture) one seed in four,
    # drawn from a generator of its own so every other draw of a seed is the same either way.
    plugin: str = "wal2json"
    # source.stream_format for this seed: landing v2 ("arrow": one stream of records per file) one
    # seed in three, else v3 ("tables", the default); a generator of its own, as for the plugin.
    stream_format: str = "tables"
    # With the driver load on: load.driver_max_bytes (one group a load, or many small groups and
    # transactions streamed file by file) and load.commit_interval_s (the groups committed together,
    # or each on its own); a generator of its own, as for the plugin.
    group_bytes: int = 64 << 20
    commit_interval_s: float = 5.0

    def script(self, upto: int | None = None) -> str:
        """The SQL of steps[:upto+1] as one psql script, loader actions as comments."""
        out = [f"-- fuzz seed {self.seed}: source SQL in order; loader actions as comments", ""]
        if not self.ddl_trigger:
            out.insert(1, "-- (source.ddl_trigger = false: the loader compares catalogs only)")
        if self.pipelined_rounds:
            out.insert(1, f"-- (pipelined capture in rounds of {self.pipelined_rounds} rows)")
        if self.plugin != "wal2json":
            out.insert(1, f"-- (source.plugin = {self.plugin})")
        if self.stream_format != "tables":
            out.insert(1, f"-- (source.stream_format = {self.stream_format})")
        if self.driver_load and (self.group_bytes, self.commit_interval_s) != (64 << 20, 5.0):
            out.insert(
                1, f"-- (load.driver_max_bytes = {self.group_bytes}, load.commit_interval_s = {self.commit_interval_s})"
            )
        for i, step in enumerate(self.steps[: None if upto is None else upto + 1]):
            if isinstance(step, Loader):
                what = " ".join(x for x in (step.action, step.stage, step.point) if x)
                out.append(f"-- [step {i}] loader: {what}")
                continue
            out.append(f"-- [step {i}] {step.note}")
            for s in step.statements:
                if is_copy(s):
                    head, _, data = s.partition("\n")
                    out.append(f"{head};\n{data}")
                else:
                    out.append(s + ";")
        return "\n".join(out) + "\n"


def is_copy(statement: str) -> bool:
    return statement.startswith("COPY ") and " FROM STDIN" in statement.split("\n", 1)[0]


# --- literals -------------------------------------------------------------------------------------


def q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


TEXTS = [
    "",
    "plain",
    "it's 'quoted'",
    'double "quotes"',
    "new\nline\r\nand\ttab",
    "back\\slash",
    "unicode é ß 李 🎉",
    " leading and trailing ",
    "NULL",
    "\\N",
]

#: column type -> its SQL spelling; values come from ``value``.
TYPES = {
    "i2": "smallint",
    "i4": "integer",
    "i8": "bigint",
    "num": "numeric(14,4)",
    "num_free": "numeric",
    "f4": "real",
    "f8": "double precision",
    "txt": "text",
    "vc": "varchar(40)",
    "bytea": "bytea",
    "bool": "boolean",
    "date": "date",
    "ts": "timestamp",
    "tstz": "timestamptz",
    "ival": "interval",
    "uuid": "uuid",
    "jsonb": "jsonb",
    "i4arr": "integer[]",
    "txtarr": "text[]",
    "enum": ENUM,
    "inet": "inet",
    "i4range": "int4range",
    "tstzrange": "tstzrange",
}


def value(rng: random.Random, kind: str, gaps: frozenset[str]) -> str:
    """A SQL literal of ``kind``: edge values often, NULL sometimes."""
    if rng.random() < 0.12:
        return "NULL"
    r = rng.random
    if kind in ("i2", "i4", "i8"):
        bits = {"i2": 15, "i4": 31, "i8": 63}[kind]
        return str(rng.choice([0, -1, 1, -(2**bits), 2**bits - 1, rng.randint(-1000, 1000)]))
    if kind in ("num", "num_free"):
        if "nan_infinity" in gaps and r() < 0.2:
            return q(rng.choice(["NaN", "Infinity", "-Infinity"])) if kind == "num_free" else "'NaN'"
        edge = ["0", "-0.0001", "9999999999.9999", "-9999999999.9999", "1.5", "0.1000"]
        if kind == "num_free":
            edge += ["123456789012345678901234567890.123456789", "1e-20", "-0"]
        return rng.choice([*edge, f"{rng.randint(-(10**6), 10**6)}.{rng.randint(0, 9999):04d}"])
    if kind in ("f4", "f8"):
        if "nan_infinity" in gaps and r() < 0.2:
            return q(rng.choice(["NaN", "Infinity", "-Infinity"]))
        edge = ["0", "'-0'", "1.5", "-2.25", "0.1", "1e-30"]
        edge += ["3.4e38", "1.17549435e-38"] if kind == "f4" else ["1.7976931348623157e308", "5e-324", "2.2e-308"]
        return rng.choice([*edge, repr(round(rng.uniform(-1000000.0, 1000000.0), 3))])
    if kind in ("txt", "vc"):
        return q(rng.choice(TEXTS) + ("" if r() < 0.5 else str(rng.randint(0, 99))))
    if kind == "bytea":
        return rng.choice(["'\\x'", "'\\x00'", "'\\xdeadbeef00ff'", q("\\x" + rng.randbytes(rng.randint(1, 20)).hex())])
    if kind == "bool":
        return rng.choice(["true", "false"])
    if kind == "date":
        if r() < 0.2:
            return q(rng.choice(["infinity", "-infinity"]))
        return q(rng.choice(["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", f"20{rng.randint(10, 30)}-06-15"]))
    if kind == "ts":
        if r() < 0.2:
            return q(rng.choice(["infinity", "-infinity"]))
        return q(
            rng.choice(
                [
                    "2024-02-29 23:59:59.999999",
                    "0001-01-01 00:00:00",
                    "9999-12-31 23:59:59",
                    "1970-01-01 00:00:00.000001",
                    f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} 12:{rng.randint(10, 59)}:00.{rng.randint(0, 999999)}",
                ]
            )
        )
    if kind == "tstz":
        if r() < 0.2:
            return q(rng.choice(["infinity", "-infinity"]))
        return q(
            rng.choice(
                [
                    "2024-03-31 02:30:00+02",
                    "1999-12-31 23:59:59.5-11:30",
                    "2030-01-01 00:00:00+14",
                    "1900-01-01 00:00:00+00",
                    f"2025-05-0{rng.randint(1, 9)} 0{rng.randint(0, 9)}:00:00.123+05:45",
                ]
            )
        )
    if kind == "ival":
        return q(rng.choice(["1 year 2 mons -3 days 04:05:06.789", "-1 day", "0", "P1Y2M3DT4H5M6S", "1000000 hours"]))
    if kind == "uuid":
        return q(str(uuid.UUID(int=rng.getrandbits(128))))
    if kind == "jsonb":
        return q(rng.choice(['{"a": [1, 2.50, null], "b\\"": "x"}', "null", "[]", '"str"', '{"é": {"n": 1e3}}', "{}"]))
    if kind == "i4arr":
        return q(rng.choice(["{1,NULL,3}", "{}", "{-2147483648,2147483647}", "{0}"]))
    if kind == "txtarr":
        return q(rng.choice(['{"a b","c\\"d",NULL}', "{}", '{"",x}', '{"new\nline","é"}']))
    if kind == "enum":
        return q(rng.choice(["sad", "ok", "happy"]))
    if kind == "inet":
        return q(rng.choice(["192.168.0.1/24", "::1", "10.0.0.1", "2001:db8::/32"]))
    if kind == "i4range":
        return q(rng.choice(["[1,5)", "empty", "(,10]", "[3,)"]))
    if kind == "tstzrange":
        return q(rng.choice(["[2024-01-01 00:00+00,2024-02-01 00:00+00)", "empty", "(,2025-01-01 00:00+03]"]))
    raise ValueError(kind)


# --- the model of the source ----------------------------------------------------------------------

KEY_KINDS = ("int", "text", "composite", "uuid")
TABLE_KINDS = ("int", "text", "composite", "uuid", "full", "default", "index", "partitioned")


@dataclass
class Col:
    name: str
    kind: str  # a TYPES key, "big" (TOASTed text, STORAGE EXTERNAL), or "gen" (GENERATED ALWAYS ... STORED)


@dataclass
class Table:
    schema: str
    name: str
    kind: str  # a TABLE_KINDS value, or "deferrable"
    cols: list[Col]
    key: list[str]  # key columns (the replica identity downstream); empty for keyless tables
    keys: list[Any] = field(default_factory=list)  # keys present, in insertion order (keyless: row count)
    rows: int = 0  # keyless tables: number of rows
    next_key: int = 1
    tracked: bool = False
    new_since_capture: bool = True
    unique_col: str | None = None  # int column under a DEFERRABLE UNIQUE constraint (swapped in deferred txns)
    low_partition: tuple[str, str] | None = None  # partitioned: (schema, name) of the partition of keys < 60
    # An inheritance parent or child (INHERITS): no DDL is drawn for it, since PostgreSQL applies a
    # parent's column DDL to its children too (the model would not follow).
    frozen: bool = False

    @property
    def qname(self) -> str:
        return f"{ident(self.schema)}.{ident(self.name)}"

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    @property
    def key_kind(self) -> str:
        return {"deferrable": "int", "partitioned": "int", "index": "text"}.get(self.kind, self.kind)

    def value_cols(self) -> list[Col]:
        """The columns statements write (a generated column is computed by PostgreSQL)."""
        return [c for c in self.cols if c.name not in self.key and c.kind != "gen"]

    def generated_expression(self) -> str:
        """A stored generated column's expression: over the key (never dropped; renames follow
        it), so every key change recomputes it; a constant for a keyless table."""
        if not self.key:
            return "7"
        first = ident(self.key[0])
        kind = self.key_kind
        if kind in ("int", "composite"):
            return f"({first} * 2 + 1)"
        return f"length({first}::text)"


class Generator:
    def __init__(self, seed: int, rounds: int, gaps: frozenset[str], tables: int) -> None:
        self.seed = seed
        self.n_tables = tables
        self.rng = random.Random(seed)
        self.rounds = rounds
        self.gaps = gaps
        self.ddl_trigger = seed % 3 != 2
        self.plugin = "pgoutput" if random.Random(f"plugin {seed}").random() < 0.25 else "wal2json"
        self.stream_format = "arrow" if random.Random(f"stream format {seed}").random() < 1 / 3 else "tables"
        groups = random.Random(f"load groups {seed}")
        self.group_bytes = groups.choice((64 << 20, 64 << 20, 16 << 10, 4 << 10))
        self.commit_interval_s = groups.choice((5.0, 0.0))
        self.tables: dict[str, Table] = {}
        self.steps: list[Step] = []
        self.tracked: dict[str, list[str]] = {}
        self.enum_labels = ["sad", "ok", "happy"]
        self.n = 0  # names
        self.big = 0

    # --- helpers ----------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def sql(self, note: str, *statements: str) -> None:
        if statements:
            self.steps.append(Sql(tuple(statements), note))

    def key_literal(self, t: Table, k: Any) -> str:
        kk = t.key_kind
        if kk == "int":
            return str(k)
        if kk == "text":
            return q(k)
        if kk == "uuid":
            return q(k) + "::uuid"
        return f"({k[0]}, {q(k[1])})"

    def new_key(self, t: Table) -> Any:
        n = t.next_key
        t.next_key += 1
        kk = t.key_kind
        if kk == "int":
            return n * 3 if t.kind != "partitioned" else n * 7
        if kk == "text":
            return self.rng.choice(["k", "K é", "k'q", "k\n", "🎉"]) + f"-{n}"
        if kk == "uuid":
            return str(uuid.UUID(int=self.rng.getrandbits(128)))
        return (n % 4, f"c{n}")

    def key_cols_sql(self, t: Table) -> str:
        return ", ".join(ident(c) for c in t.key)

    def where_keys(self, t: Table, keys: list[Any]) -> str:
        lits = ", ".join(self.key_literal(t, k) for k in keys)
        if len(t.key) == 1:
            return f"{ident(t.key[0])} IN ({lits})"
        return f"({self.key_cols_sql(t)}) IN ({lits})"

    def key_values(self, t: Table, k: Any) -> list[str]:
        """The key's column literals in key-column order."""
        if t.key_kind == "composite":
            return [str(k[0]), q(k[1])]
        return [self.key_literal(t, k)]

    def row_values(self, t: Table, k: Any | None) -> tuple[list[str], list[str]]:
        cols, vals = [], []
        if k is not None:
            cols += [ident(c) for c in t.key]
            vals += self.key_values(t, k)
        for c in t.value_cols():
            if c.kind == "big":
                cols.append(ident(c.name))
                vals.append(self.big_value())
            elif c.name == t.unique_col:
                continue  # insert() gives it a unique value
            elif self.rng.random() < 0.85:
                cols.append(ident(c.name))
                vals.append(self.value_of(c))
        return cols, vals

    def value_of(self, c: Col) -> str:
        if c.kind == "big":
            return self.big_value()
        if c.kind == "enum":
            return "NULL" if self.rng.random() < 0.1 else q(self.rng.choice(self.enum_labels))
        return value(self.rng, c.kind, self.gaps)

    def big_value(self) -> str:
        """A TOASTed value: > 2 kB, stored out of line uncompressed (the column is STORAGE EXTERNAL)."""
        self.big += 1
        return f"repeat({q(f'big{self.big}-' + self.rng.choice(['x', 'é', 'ab']))}, {self.rng.randint(900, 3000)})"

    # --- tables -----------------------------------------------------------------------------
    def create_table(self, kind: str, schema: str = "public", name: str | None = None, tracked: bool = False) -> None:
        rng = self.rng
        name = name or self.fresh(
            {"partitioned": "part", "full": "kl_full", "default": "kl_def"}.get(kind, "t_" + kind)
        )
        kinds = rng.sample(sorted(TYPES), rng.randint(3, 6))
        cols = [Col(f"c_{k}", k) for k in kinds]
        if rng.random() < 0.5:
            cols.append(Col("big", "big"))
        key_defs: list[str]
        key: list[str]
        if kind in ("int", "deferrable", "partitioned"):
            key, key_defs = ["id"], ["id bigint NOT NULL"]
        elif kind == "text":
            key, key_defs = ["k"], ["k text NOT NULL"]
        elif kind == "composite":
            key, key_defs = ["a", "b"], ["a integer NOT NULL", "b text NOT NULL"]
        elif kind == "uuid":
            key, key_defs = ["u"], ["u uuid NOT NULL"]
        elif kind == "index":
            key, key_defs = ["code"], ["code text NOT NULL"]
        else:
            key, key_defs = [], []
        t = Table(schema, name, kind, [Col(k, "key") for k in key] + cols, key, tracked=tracked)
        defs = key_defs + [f"{ident(c.name)} {'text' if c.kind == 'big' else TYPES[c.kind]}" for c in cols]
        # A stored generated column, some of the time (a draw of its own: every seed's other draws
        # stay as they were).
        if random.Random(f"{self.seed} generated {name}").random() < 0.25:
            t.cols.append(Col("g0", "gen"))
            defs.append(f"g0 bigint GENERATED ALWAYS AS ({t.generated_expression()}) STORED")
        if kind == "int" and rng.random() < 0.5:
            t.unique_col = "uq"
            t.cols.append(Col("uq", "i8"))
            defs.append("uq bigint UNIQUE DEFERRABLE INITIALLY IMMEDIATE")
        if kind in ("int", "text", "composite", "uuid", "partitioned"):
            defs.append(f"PRIMARY KEY ({self.key_cols_sql(t)})")
        elif kind == "deferrable":
            defs.append("PRIMARY KEY (id) DEFERRABLE INITIALLY IMMEDIATE")
        stmts = [
            f"CREATE TABLE {t.qname} ({', '.join(defs)})"
            + (" PARTITION BY RANGE (id)" if kind == "partitioned" else "")
        ]
        if kind == "partitioned":
            tag = self.fresh("")  # partitions outlive a dropped parent when detached: names never reused
            t.low_partition = (schema, f"{name}_{tag}p60")
            for lo, hi in ((None, 60), (60, 200)):
                p = ident(f"{name}_{tag}p{hi}")
                bound = f"FROM ({'MINVALUE' if lo is None else lo}) TO ({hi})"
                stmts.append(f"CREATE TABLE {ident(schema)}.{p} PARTITION OF {t.qname} FOR VALUES {bound}")
            stmts.append(f"CREATE TABLE {ident(schema)}.{ident(f'{name}_{tag}pdef')} PARTITION OF {t.qname} DEFAULT")
        if "big" in [c.name for c in cols] and kind != "partitioned":
            stmts.append(f"ALTER TABLE {t.qname} ALTER COLUMN big SET STORAGE EXTERNAL")
        if kind == "full":
            stmts.append(f"ALTER TABLE {t.qname} REPLICA IDENTITY FULL")
        if kind == "index":
            stmts.append(f"CREATE UNIQUE INDEX {ident(name + '_code')} ON {t.qname} (code)")
            stmts.append(f"ALTER TABLE {t.qname} REPLICA IDENTITY USING INDEX {ident(name + '_code')}")
        if tracked:
            args = ", ".join(q(k) for k in key)
            stmts.append(
                f"CREATE TRIGGER fz_audit AFTER INSERT OR UPDATE OR DELETE ON {t.qname}"
                f" FOR EACH ROW EXECUTE FUNCTION {AUDIT_SCHEMA}.log_row({args})"
            )
            stmts.append(
                f"CREATE TRIGGER fz_audit_truncate AFTER TRUNCATE ON {t.qname}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION {AUDIT_SCHEMA}.log_truncate()"
            )
            self.tracked[t.qualified] = list(key)
        self.tables[t.qualified] = t
        self.sql(f"create {kind} table {t.qualified}", *stmts)

    def inherit(self, parent: Table) -> None:
        """A child of ``parent`` (``INHERITS``, the partitioning before PostgreSQL 10) with the
        parent's columns and a key of its own, its keys from a range the parent's never reach: a
        plain SELECT of the parent returns the child's rows too, the WAL gives them to the child."""
        name = self.fresh("kid")
        child = Table(parent.schema, name, "int", copy.deepcopy(parent.cols), ["id"], next_key=1_000_000)
        # The parent's deferrable UNIQUE column is inherited as a plain column (constraints are not).
        parent.frozen = child.frozen = True
        self.tables[child.qualified] = child
        self.sql(
            f"inheritance child {child.qualified} of {parent.qualified}",
            f"CREATE TABLE {child.qname} () INHERITS ({parent.qname})",
            f"ALTER TABLE {child.qname} ADD PRIMARY KEY (id)",
        )

    # --- DML ------------------------------------------------------------------------------
    def insert(self, t: Table, n: int) -> list[str]:
        stmts = []
        for _ in range(n):
            k = self.new_key(t) if t.keyed else None
            cols, vals = self.row_values(t, k)
            if t.unique_col and k is not None:
                cols.append(ident(t.unique_col))
                vals.append(str(t.next_key * 13))
            if not cols:
                stmts.append(f"INSERT INTO {t.qname} DEFAULT VALUES")
            else:
                stmts.append(f"INSERT INTO {t.qname} ({', '.join(cols)}) VALUES ({', '.join(vals)})")
            if k is not None:
                t.keys.append(k)
            else:
                t.rows += 1
        return stmts

    def insert_many(self, t: Table, n: int) -> str:
        """One multi-row INSERT (keyed tables)."""
        rows = []
        cols = [ident(c) for c in t.key] + [ident(c.name) for c in t.value_cols()]
        for _ in range(n):
            k = self.new_key(t)
            vals = self.key_values(t, k)
            for c in t.value_cols():
                vals.append(str(t.next_key * 13) if c.name == t.unique_col else self.value_of(c))
            rows.append(f"({', '.join(vals)})")
            t.keys.append(k)
        return f"INSERT INTO {t.qname} ({', '.join(cols)}) VALUES {', '.join(rows)}"

    def copy_rows(self, t: Table, n: int) -> str:
        """COPY ... FROM STDIN of fresh keys with a few text-safe columns (psql's format)."""
        simple = [
            c
            for c in t.value_cols()
            if c.kind in ("i2", "i4", "txt", "bool", "date", "uuid") and c.name != t.unique_col
        ]
        cols = [ident(c) for c in t.key] + [ident(c.name) for c in simple]
        if not cols:
            return ""

        def esc(text: str) -> str:
            return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")

        lines = []
        for _ in range(n):
            k = self.new_key(t) if t.keyed else None
            vals: list[str] = []
            if k is not None:
                vals += [esc(str(x)) for x in (k if isinstance(k, tuple) else (k,))]
            for c in simple:
                lit = value(self.rng, c.kind, frozenset())
                if lit == "NULL":
                    vals.append("\\N")
                else:
                    txt = lit[1:-1].replace("''", "'") if lit.startswith("'") else lit
                    vals.append(esc(txt))
            lines.append("\t".join(vals))
            if k is not None:
                t.keys.append(k)
            else:
                t.rows += 1
        return f"COPY {t.qname} ({', '.join(cols)}) FROM STDIN\n" + "\n".join(lines) + "\n\\."

    def pick_keys(self, t: Table, n: int) -> list[Any]:
        return self.rng.sample(t.keys, min(n, len(t.keys)))

    def update(self, t: Table, n: int) -> list[str]:
        vcols = [c for c in t.value_cols() if c.name != t.unique_col]
        if not vcols:
            return []
        # Leave a TOASTed column out most of the time: its value is not in the WAL then.
        choices = [c for c in vcols if c.kind != "big" or self.rng.random() < 0.3]
        if not choices:
            choices = vcols
        sets = self.rng.sample(choices, self.rng.randint(1, min(2, len(choices))))
        assign = ", ".join(f"{ident(c.name)} = {self.value_of(c)}" for c in sets)
        if t.keyed:
            keys = self.pick_keys(t, n)
            if not keys:
                return []
            return [f"UPDATE {t.qname} SET {assign} WHERE {self.where_keys(t, keys)}"]
        if not t.rows:
            return []
        return [
            f"UPDATE {t.qname} SET {assign} WHERE ctid IN (SELECT ctid FROM {t.qname} x ORDER BY x::text LIMIT {n})"
        ]

    def delete(self, t: Table, n: int) -> list[str]:
        if t.keyed:
            keys = self.pick_keys(t, n)
            if not keys:
                return []
            for k in keys:
                t.keys.remove(k)
            return [f"DELETE FROM {t.qname} WHERE {self.where_keys(t, keys)}"]
        if not t.rows:
            return []
        m = min(n, t.rows)
        t.rows -= m
        return [f"DELETE FROM {t.qname} WHERE ctid IN (SELECT ctid FROM {t.qname} x ORDER BY x::text LIMIT {m})"]

    def change_key(self, t: Table) -> list[str]:
        """A key moved to a fresh value (an update of the primary key)."""
        if not t.keys:
            return []
        old = self.rng.choice(t.keys)
        new = self.new_key(t)
        t.keys[t.keys.index(old)] = new
        sets = ", ".join(f"{ident(c)} = {v}" for c, v in zip(t.key, self.key_values(t, new)))
        return [f"UPDATE {t.qname} SET {sets} WHERE {self.where_keys(t, [old])}"]

    def rotate_keys(self, t: Table) -> list[str]:
        """Keys rotated among existing rows inside one deferred transaction: a deferrable key is
        swapped in one statement; any other through a parked temporary key."""
        if len(t.keys) < 2:
            return []
        ks = self.pick_keys(t, self.rng.randint(2, 3))
        out = ["BEGIN", "SET CONSTRAINTS ALL DEFERRED"]
        if t.kind == "deferrable":
            case = " ".join(f"WHEN {a} THEN {b}" for a, b in zip(ks, ks[1:] + ks[:1]))
            id_ = ident(t.key[0])
            out.append(f"UPDATE {t.qname} SET {id_} = CASE {id_} {case} END WHERE {self.where_keys(t, ks)}")
        else:
            tmp = self.new_key(t)

            def move(a: Any, b: Any) -> str:
                sets = ", ".join(f"{ident(c)} = {v}" for c, v in zip(t.key, self.key_values(t, b)))
                return f"UPDATE {t.qname} SET {sets} WHERE {self.where_keys(t, [a])}"

            out.append(move(ks[0], tmp))
            for a, b in zip(ks[1:], ks[:-1]):
                out.append(move(a, b))
            out.append(move(tmp, ks[-1]))
        out.append("COMMIT")
        return out

    def swap_unique(self, t: Table) -> list[str]:
        """Two rows swap their DEFERRABLE UNIQUE values in a deferred transaction."""
        if not t.unique_col or len(t.keys) < 2:
            return []
        a, b = self.pick_keys(t, 2)
        u, id_ = ident(t.unique_col), ident(t.key[0])
        return [
            "BEGIN",
            "SET CONSTRAINTS ALL DEFERRED",
            f"UPDATE {t.qname} SET {u} = CASE {id_} WHEN {a} THEN (SELECT {u} FROM {t.qname} WHERE {id_} = {b})"
            f" ELSE (SELECT {u} FROM {t.qname} WHERE {id_} = {a}) END WHERE {id_} IN ({a}, {b})",
            "COMMIT",
        ]

    def upsert(self, t: Table) -> list[str]:
        """INSERT ... ON CONFLICT on a mix of existing and fresh keys."""
        if not t.keyed or t.kind == "deferrable":  # ON CONFLICT takes no deferrable arbiter
            return []
        keys = [*self.pick_keys(t, 2), self.new_key(t)]
        vcols = [c for c in t.value_cols() if c.name != t.unique_col]
        cols = [ident(c) for c in t.key] + [ident(c.name) for c in vcols]
        rows = [f"({', '.join(self.key_values(t, k) + [self.value_of(c) for c in vcols])})" for k in keys]
        target = self.key_cols_sql(t)
        if vcols and self.rng.random() < 0.7:
            c = self.rng.choice(vcols)
            action = f"DO UPDATE SET {ident(c.name)} = EXCLUDED.{ident(c.name)}"
        else:
            action = "DO NOTHING"
        for k in keys:
            if k not in t.keys:
                t.keys.append(k)
        return [f"INSERT INTO {t.qname} ({', '.join(cols)}) VALUES {', '.join(rows)} ON CONFLICT ({target}) {action}"]

    def merge(self, t: Table) -> list[str]:
        """MERGE from a VALUES list: matched rows updated or deleted, unmatched ones inserted."""
        if not t.keyed:
            return []
        vcols = [c for c in t.value_cols() if c.name != t.unique_col and c.kind != "big"][:2]
        if not vcols:
            return []
        existing = self.pick_keys(t, 3)
        fresh = [self.new_key(t) for _ in range(2)]
        src_rows, names = [], [f"k{i}" for i in range(len(t.key))]
        for k in existing + fresh:
            act = "d" if k in existing and self.rng.random() < 0.4 else "u"
            lits = [*self.key_values(t, k), q(act)] + [f"CAST({self.value_of(c)} AS {TYPES[c.kind]})" for c in vcols]
            src_rows.append(f"({', '.join(lits)})")
            if act == "d":
                t.keys.remove(k)
            elif k not in t.keys:
                t.keys.append(k)
        vnames = [f"v{i}" for i in range(len(vcols))]
        on = " AND ".join(f"t.{ident(c)} = s.{n}" for c, n in zip(t.key, names))
        upd = ", ".join(f"{ident(c.name)} = s.{v}" for c, v in zip(vcols, vnames))
        ins_cols = ", ".join([ident(c) for c in t.key] + [ident(c.name) for c in vcols])
        ins_vals = ", ".join([f"s.{n}" for n in names] + [f"s.{v}" for v in vnames])
        return [
            f"MERGE INTO {t.qname} t USING (VALUES {', '.join(src_rows)}) AS s({', '.join([*names, 'act', *vnames])})"
            f" ON {on} WHEN MATCHED AND s.act = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET {upd}"
            f" WHEN NOT MATCHED THEN INSERT ({ins_cols}) VALUES ({ins_vals})"
        ]

    def dml(self, t: Table) -> list[str]:
        rng = self.rng
        r = rng.random()
        if r < 0.25 or (not t.keys and not t.rows):
            return (
                self.insert(t, rng.randint(1, 4))
                if rng.random() < 0.5 or not t.keyed
                else [self.insert_many(t, rng.randint(2, 8))]
            )
        if r < 0.5:
            return self.update(t, rng.randint(1, 5))
        if r < 0.6:
            return self.delete(t, rng.randint(1, 3))
        if r < 0.68 and t.keyed and t.kind != "partitioned":
            return self.change_key(t)
        if r < 0.74:
            return self.upsert(t)
        if r < 0.8:
            return self.merge(t)
        if r < 0.86:
            c = self.copy_rows(t, rng.randint(1, 5))
            return [c] if c else []
        return self.update(t, 1)

    def transaction(self) -> None:
        """One source transaction over a few tables, sometimes with savepoints rolled back or
        released, sometimes rolled back whole; key rotations are transactions of their own."""
        rng = self.rng
        live = list(self.tables.values())
        if not live:
            return
        t = rng.choice(live)
        if t.keyed and rng.random() < 0.12:
            self.sql(f"key rotation on {t.qualified}", *self.rotate_keys(t))
            return
        if t.unique_col and rng.random() < 0.1:
            self.sql(f"deferred unique swap on {t.qualified}", *self.swap_unique(t))
            return
        stmts = ["BEGIN"]
        start = copy.deepcopy(self.tables)
        saved = None
        for _ in range(rng.randint(1, 4)):
            t = rng.choice(live)
            roll = rng.random()
            if roll < 0.12 and saved is None:
                stmts.append("SAVEPOINT sp")
                saved = copy.deepcopy(self.tables)
                continue
            stmts += self.dml(t)
            if saved is not None and rng.random() < 0.5:
                if rng.random() < 0.5:
                    stmts.append("ROLLBACK TO SAVEPOINT sp")
                    self.restore(saved)
                else:
                    stmts.append("RELEASE SAVEPOINT sp")
                saved = None
        if rng.random() < 0.05:
            stmts.append("ROLLBACK")
            self.restore(start)
        else:
            stmts.append("COMMIT")
        if len(stmts) > 2:
            self.sql("transaction", *stmts)

    def restore(self, saved: dict[str, Table]) -> None:
        """Row state back to ``saved`` (DML only: savepoints never span DDL here)."""
        for name, t in self.tables.items():
            if name in saved:
                t.keys, t.rows, t.next_key = saved[name].keys, saved[name].rows, max(t.next_key, saved[name].next_key)

    # --- DDL ------------------------------------------------------------------------------
    def ddl(self) -> None:
        rng = self.rng
        open_to_ddl = [u for u in self.tables.values() if not u.frozen]
        if not open_to_ddl:
            return
        t = rng.choice(open_to_ddl)
        fresh = [u for u in open_to_ddl if u.new_since_capture and not u.tracked]
        if fresh and rng.random() < 0.3:
            t = rng.choice(fresh)  # DDL on a table created since the last capture: no earlier picture of it
        forms = [
            "add_column",
            "add_column_default",
            "add_column_volatile",
            "drop_column",
            "retype_widen",
            "retype_text",
            "set_default",
            "not_null",
            "rename_column",
            "rename_table",
            "set_schema",
            "identity",
            "drop_recreate",
            "enum_add",
            "unlogged",
            "partition",
            "truncate",
            "vacuum_full",
            "enum_rename",
            "case_column",
            "storage",
            "constraint",
            "detach",
        ]
        form = rng.choice(forms)
        # A tracked table keeps its name and key, and every change in the WAL (its audit log is the history oracle).
        moves = form in (
            "rename_column",
            "rename_table",
            "set_schema",
            "drop_recreate",
            "identity",
            "unlogged",
            "detach",
        )
        if t.tracked and (moves or form == "case_column"):
            # (a table with columns differing only in case parks, its changes quarantined)
            form = "add_column"
        if form == "unlogged" and t.new_since_capture and not self.ddl_trigger:
            form = "add_column"  # what the catalog comparison alone cannot see (Workload.ddl_trigger)
        if form == "unlogged" and self.plugin == "pgoutput":
            # PostgreSQL refuses SET UNLOGGED for a table in a publication (found by make fuzz, seed
            # 1726); one outside it (no replica identity) is not followed under pgoutput anyway.
            form = "add_column"
        before = len(self.steps)
        getattr(self, f"ddl_{form}")(t)
        # Some DDL from a session with session_replication_role = replica (pg_restore
        # --disable-triggers, migration tools), for which only event triggers enabled ALWAYS fire.
        # Only forms that write no rows: the audit log's row triggers do not fire there either. A
        # draw of its own, so the workload's other draws (and every seed's workload) stay the same.
        replica = random.Random(f"{self.seed} replica {before}").random() < 0.2
        if replica and form in REPLICA_ROLE_FORMS:
            for i in range(before, len(self.steps)):
                step = self.steps[i]
                if isinstance(step, Sql):
                    self.steps[i] = Sql(
                        ("SET session_replication_role = replica", *step.statements, "RESET session_replication_role"),
                        f"{step.note} (session_replication_role = replica)",
                    )

        self.ddl_generated(t, before)

    def ddl_generated(self, t: Table, at: int) -> None:
        """Sometimes, after a DDL step, DDL of stored generated columns on the same table (a draw
        of its own, so every seed's other draws stay as they were): ``ADD COLUMN ... GENERATED
        ALWAYS AS (...) STORED`` (PostgreSQL rewrites the table to fill it: no row change in the
        WAL), or ``ALTER COLUMN ... DROP EXPRESSION`` (a plain column from then on, keeping its
        values: no rewrite, no row change)."""
        draw = random.Random(f"{self.seed} generated ddl {at}")
        if draw.random() >= 0.12 or self.tables.get(t.qualified) is not t or t.frozen:
            return
        generated = [c for c in t.cols if c.kind == "gen"]
        if generated and draw.random() < 0.5:
            c = draw.choice(generated)
            c.kind = "i8"
            self.sql(
                f"generated column {c.name} of {t.qualified} made plain (DROP EXPRESSION)",
                f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} DROP EXPRESSION",
            )
            return
        if t.new_since_capture and not self.ddl_trigger:
            return  # a rewrite of a table with no earlier picture: no trace (Workload.ddl_trigger)
        c = Col(self.fresh("g_"), "gen")
        t.cols.append(c)
        self.sql(
            f"stored generated column added to {t.qualified} (a rewrite)",
            f"ALTER TABLE {t.qname} ADD COLUMN {ident(c.name)} bigint"
            f" GENERATED ALWAYS AS ({t.generated_expression()}) STORED",
        )

    def _value_cols(self, t: Table, kinds: tuple[str, ...] | None = None) -> list[Col]:
        return [c for c in t.value_cols() if c.name != t.unique_col and (kinds is None or c.kind in kinds)]

    def ddl_add_column(self, t: Table) -> None:
        kind = self.rng.choice(sorted(TYPES))
        c = Col(self.fresh("n_"), kind)
        t.cols.append(c)
        self.sql(f"add column to {t.qualified}", f"ALTER TABLE {t.qname} ADD COLUMN {ident(c.name)} {TYPES[kind]}")

    def ddl_add_column_default(self, t: Table) -> None:
        kind = self.rng.choice(["i4", "txt", "bool", "date", "jsonb", "num"])
        c = Col(self.fresh("d_"), kind)
        lit = value(self.rng, kind, frozenset())
        lit = "'fill'" if lit == "NULL" and kind == "txt" else lit
        t.cols.append(c)
        self.sql(
            f"add column with a default to {t.qualified}",
            f"ALTER TABLE {t.qname} ADD COLUMN {ident(c.name)} {TYPES[kind]} DEFAULT {lit}",
        )

    def ddl_add_column_volatile(self, t: Table) -> None:
        c = Col(self.fresh("v_"), "tstz")
        t.cols.append(c)
        self.sql(
            f"add column with a volatile default to {t.qualified} (a rewrite)",
            f"ALTER TABLE {t.qname} ADD COLUMN {ident(c.name)} timestamptz DEFAULT clock_timestamp()",
        )

    def ddl_drop_column(self, t: Table) -> None:
        cols = self._value_cols(t)
        if len(cols) < 2:
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        t.cols.remove(c)
        self.sql(f"drop column of {t.qualified}", f"ALTER TABLE {t.qname} DROP COLUMN {ident(c.name)}")

    def ddl_retype_widen(self, t: Table) -> None:
        cols = self._value_cols(t, ("i2", "i4", "vc", "num", "f4"))
        if not cols:
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        to = {"i2": "i4", "i4": "i8", "vc": "txt", "num": "num_free", "f4": "f8"}[c.kind]
        if to == "num_free" and t.new_since_capture and not self.ddl_trigger:
            return self.ddl_add_column(t)  # no rewrite, no trace (Workload.ddl_trigger)
        c.kind = to
        self.sql(
            f"widen a column of {t.qualified}", f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} TYPE {TYPES[to]}"
        )

    def ddl_retype_text(self, t: Table) -> None:
        cols = self._value_cols(t, ("i2", "i4", "i8", "bool", "date", "num", "uuid", "inet"))
        if not cols:
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        c.kind = "txt"
        self.sql(
            f"retype a column of {t.qualified} to text USING",
            f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} TYPE text USING 'was ' || {ident(c.name)}::text",
        )

    def ddl_set_default(self, t: Table) -> None:
        cols = self._value_cols(t, ("i4", "i8", "txt", "bool"))
        if not cols:
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        stmt = f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} SET DEFAULT {value(self.rng, c.kind, frozenset())}"
        if self.rng.random() < 0.3:
            stmt = f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} DROP DEFAULT"
        self.sql(f"column default of {t.qualified}", stmt)

    def ddl_not_null(self, t: Table) -> None:
        cols = self._value_cols(t)
        if not cols:
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        fill = "NULL"
        while fill == "NULL":
            fill = self.value_of(c)
        name = ident(c.name)
        self.sql(
            f"NOT NULL set and dropped on {t.qualified}",
            f"UPDATE {t.qname} SET {name} = {fill} WHERE {name} IS NULL",
            f"ALTER TABLE {t.qname} ALTER COLUMN {name} SET NOT NULL",
            f"ALTER TABLE {t.qname} ALTER COLUMN {name} DROP NOT NULL",
        )

    def ddl_rename_column(self, t: Table) -> None:
        cols = [c for c in t.cols if c.name != t.unique_col]
        c = self.rng.choice(cols)
        new = self.fresh("r_")
        old = c.name
        c.name = new
        if old in t.key:
            t.key[t.key.index(old)] = new
        self.sql(f"rename column of {t.qualified}", f"ALTER TABLE {t.qname} RENAME COLUMN {ident(old)} TO {ident(new)}")

    def _rekey(self, t: Table, schema: str, name: str) -> None:
        del self.tables[t.qualified]
        t.schema, t.name = schema, name
        self.tables[t.qualified] = t

    def ddl_rename_table(self, t: Table) -> None:
        new = self.fresh("rn_")
        old = t.qname
        self._rekey(t, t.schema, new)
        self.sql(f"rename table {old}", f"ALTER TABLE {old} RENAME TO {ident(new)}")

    def ddl_set_schema(self, t: Table) -> None:
        other = SCHEMAS[1] if t.schema == SCHEMAS[0] else SCHEMAS[0]
        if f"{other}.{t.name}" in self.tables:
            return self.ddl_rename_table(t)
        old = t.qname
        self._rekey(t, other, t.name)
        self.sql(f"move {old} to schema {other}", f"ALTER TABLE {old} SET SCHEMA {ident(other)}")

    def ddl_identity(self, t: Table) -> None:
        if t.kind == "default":
            t.kind = "full"
            self.sql(f"identity of {t.qualified}", f"ALTER TABLE {t.qname} REPLICA IDENTITY FULL")
        elif t.kind == "full":
            t.kind = "default"
            self.sql(f"identity of {t.qualified}", f"ALTER TABLE {t.qname} REPLICA IDENTITY DEFAULT")
        elif t.kind in ("int", "text", "composite", "uuid"):
            self.sql(
                f"identity of {t.qualified}",
                f"ALTER TABLE {t.qname} REPLICA IDENTITY {self.rng.choice(['FULL', 'DEFAULT'])}",
            )
        else:
            self.ddl_add_column(t)

    def ddl_drop_recreate(self, t: Table) -> None:
        del self.tables[t.qualified]
        self.sql(f"drop {t.qualified}", f"DROP TABLE {t.qname}")
        self.create_table(t.kind, t.schema, t.name)
        t2 = self.tables[t.qualified]
        self.sql(f"refill {t.qualified}", *self.insert(t2, self.rng.randint(0, 5)))

    def ddl_enum_add(self, t: Table) -> None:
        label = self.fresh("mood")
        self.enum_labels.append(label)
        self.sql("enum label added", f"ALTER TYPE {ENUM} ADD VALUE {q(label)}")

    def ddl_enum_rename(self, t: Table) -> None:
        old = self.rng.choice(self.enum_labels)
        new = self.fresh("renamed")
        self.enum_labels[self.enum_labels.index(old)] = new
        self.sql("enum label renamed", f"ALTER TYPE {ENUM} RENAME VALUE {q(old)} TO {q(new)}")

    def ddl_unlogged(self, t: Table) -> None:
        if t.kind == "partitioned":
            return self.ddl_add_column(t)
        self.sql(
            f"{t.qualified} UNLOGGED and LOGGED again",
            f"ALTER TABLE {t.qname} SET UNLOGGED",
            *self.dml(t),
            f"ALTER TABLE {t.qname} SET LOGGED",
        )

    def ddl_partition(self, t: Table) -> None:
        if t.kind != "partitioned":
            partitioned = [u for u in self.tables.values() if u.kind == "partitioned"]
            return self.ddl_partition(partitioned[0]) if partitioned else self.ddl_retype_widen(t)
        p = ident(f"{t.name}_p{self.fresh('x')}")
        lo, hi = 1000 * self.n, 1000 * self.n + 500
        self.sql(
            f"partition added to {t.qualified}",
            f"CREATE TABLE {ident(t.schema)}.{p} (LIKE {t.qname} INCLUDING ALL)",
            f"ALTER TABLE {t.qname} ATTACH PARTITION {ident(t.schema)}.{p} FOR VALUES FROM ({lo}) TO ({hi})",
        )
        k = lo + 1
        cols, vals = self.row_values(t, k)
        t.keys.append(k)
        self.sql(
            f"row into the new partition of {t.qualified}",
            f"INSERT INTO {t.qname} ({', '.join(cols)}) VALUES ({', '.join(vals)})",
        )

    def ddl_constraint(self, t: Table) -> None:
        cols = self._value_cols(t)
        if not cols:
            return self.ddl_add_column(t)
        c, name = self.rng.choice(cols), ident(self.fresh("ck_"))
        self.sql(
            f"a CHECK constraint added to {t.qualified} (and dropped)",
            f"ALTER TABLE {t.qname} ADD CONSTRAINT {name} CHECK ({ident(c.name)} IS NULL OR {ident(c.name)} IS NOT NULL)",
            *([f"ALTER TABLE {t.qname} DROP CONSTRAINT {name}"] if self.rng.random() < 0.5 else []),
        )

    def ddl_detach(self, t: Table) -> None:
        """The partition of keys below 60 detached: its rows leave the partitioned table (no DELETEs in
        the WAL) and it goes on as a table of its own, with its primary key."""
        if t.low_partition is None:
            return self.ddl_constraint(t)
        schema, name = t.low_partition
        t.low_partition = None
        moved = [k for k in t.keys if k < 60]
        t.keys = [k for k in t.keys if k >= 60]
        part = Table(schema, name, "int", copy.deepcopy(t.cols), list(t.key), keys=moved, next_key=100)
        part.new_since_capture = False
        self.tables[part.qualified] = part
        self.sql(
            f"partition {schema}.{name} detached from {t.qualified}",
            f"ALTER TABLE {t.qname} DETACH PARTITION {ident(schema)}.{ident(name)}",
        )

    def ddl_truncate(self, t: Table) -> None:
        t.keys, t.rows = [], 0
        self.sql(f"truncate {t.qualified}", f"TRUNCATE {t.qname}")

    def ddl_vacuum_full(self, t: Table) -> None:
        self.sql(f"vacuum full {t.qualified}", f"VACUUM FULL {t.qname}")

    def ddl_case_column(self, t: Table) -> None:
        base = self.fresh("ci_")
        cols = [Col(base, "txt"), Col(base.upper(), "txt")]
        t.cols += cols
        self.sql(
            f"columns differing only in case on {t.qualified}",
            *(f"ALTER TABLE {t.qname} ADD COLUMN {ident(c.name)} text" for c in cols),
        )

    def ddl_storage(self, t: Table) -> None:
        cols = self._value_cols(t, ("txt", "big", "jsonb"))
        if not cols or t.kind == "partitioned":
            return self.ddl_add_column(t)
        c = self.rng.choice(cols)
        self.sql(
            f"storage of a column of {t.qualified}",
            f"ALTER TABLE {t.qname} ALTER COLUMN {ident(c.name)} SET STORAGE {self.rng.choice(['EXTENDED', 'EXTERNAL', 'MAIN'])}",
        )

    # --- loader actions ------------------------------------------------------------------
    def loader(self, action: str, stage: str = "", point: str = "") -> None:
        self.steps.append(Loader(action, stage, point))
        if action in ("run", "capture", "snapshot"):
            for t in self.tables.values():
                t.new_since_capture = False

    def loader_action(self, heavy: bool) -> None:
        """What runs after a round: mostly a whole run (then the oracle); sometimes a capture alone,
        a capture killed at a point or overlapping another, rarely a load or merge process killed or overlapped."""
        rng = self.rng
        r = rng.random()
        if r < 0.12:
            self.loader("capture")
        elif r < 0.27:
            point = rng.choice(
                ["capture-after-publish", "capture-before-advance", "capture-after-advance", "capture-before-resync"]
            )
            self.loader("kill", "capture", point)
            self.loader("run")
        elif r < 0.35:
            self.loader("overlap", "capture")
            self.loader("run")
        elif heavy and r < 0.45:
            stage = rng.choice(["load", "merge"])
            point = rng.choice(
                {
                    "load": ["load-after-table", "load-before-ledger", "load-after-ledger"],
                    "merge": ["merge-before-commit", "merge-after-commit"],
                }[stage]
            )
            self.loader("kill", stage, point)
            self.loader("run")
        elif heavy and r < 0.5:
            self.loader("overlap", rng.choice(["load", "merge"]))
            self.loader("run")
        else:
            self.loader("run")

    # --- the whole workload ----------------------------------------------------------------
    def generate(self, heavy: bool) -> Workload:
        rng = self.rng
        self.sql(
            "setup: schemas, the enum, the audit log (excluded from capture)",
            f"CREATE SCHEMA {ident(SCHEMAS[1])}",
            f"CREATE TYPE {ENUM} AS ENUM ('sad', 'ok', 'happy')",
            f"CREATE SCHEMA {AUDIT_SCHEMA}",
            f"CREATE TABLE {AUDIT_SCHEMA}.changes (n bigserial PRIMARY KEY, xid bigint NOT NULL DEFAULT"
            " pg_current_xact_id()::text::bigint, tbl text NOT NULL, op text NOT NULL, key jsonb)",
            f"CREATE FUNCTION {AUDIT_SCHEMA}.log_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" INSERT INTO {AUDIT_SCHEMA}.changes (tbl, op, key) SELECT TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME,"
            " lower(TG_OP), jsonb_agg(to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END) ->> a ORDER BY o)"
            " FROM unnest(TG_ARGV) WITH ORDINALITY AS u(a, o); RETURN NULL; END $$",
            f"CREATE FUNCTION {AUDIT_SCHEMA}.log_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" INSERT INTO {AUDIT_SCHEMA}.changes (tbl, op) VALUES (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, 'truncate');"
            " RETURN NULL; END $$",
        )
        if rng.random() < 0.4:
            # A DBA's defaults for every new session, the loader's and its walsender's included:
            # the text the plugin prints for values changes, no row does.
            picked = rng.sample(OUTPUT_SETTINGS, rng.randint(1, len(OUTPUT_SETTINGS)))
            self.sql(
                "the database's own output settings (ALTER DATABASE ... SET)",
                "DO $$ BEGIN "
                + " ".join(
                    f"EXECUTE format('ALTER DATABASE %I SET {k} = %L', current_database(), '{v}');" for k, v in picked
                )
                + " END $$",
            )
        kinds = [*TABLE_KINDS, "deferrable"]
        rng.shuffle(kinds)
        kinds = kinds[: self.n_tables]
        for i, kind in enumerate(kinds):
            self.create_table(kind, tracked=kind in KEY_KINDS and i % 2 == 0)
        parents = [t for t in self.tables.values() if t.kind == "int" and not t.tracked]
        if parents and rng.random() < 0.3:
            self.inherit(rng.choice(parents))
        for t in list(self.tables.values()):
            self.sql(f"initial rows of {t.qualified}", *self.insert(t, rng.randint(0, 2)))
        self.loader("snapshot")  # creates the slot after a consistent snapshot of the rows so far
        for t in list(self.tables.values()):
            if t.keyed:
                self.sql(f"rows of {t.qualified}", self.insert_many(t, rng.randint(5, 25)))
            else:
                self.sql(f"rows of {t.qualified}", *self.insert(t, rng.randint(3, 10)))
        self.loader("run")
        for _ in range(self.rounds):
            for _ in range(rng.randint(2, 6)):
                self.transaction()
            if rng.random() < 0.15:
                self.create_table(rng.choice(TABLE_KINDS))
                self.transaction()
            if rng.random() < 0.6:
                for _ in range(rng.randint(1, 2)):
                    self.ddl()
            self.loader_action(heavy)
        if not isinstance(self.steps[-1], Loader) or self.steps[-1].action != "run":
            self.loader("run")
        return Workload(
            self.seed,
            self.steps,
            self.tracked,
            driver_load=rng.random() < 0.5,
            ddl_trigger=self.ddl_trigger,
            gaps=self.gaps,
            pipelined_rounds=rng.choice((0, 0, 7, 100_000)),
            plugin=self.plugin,
            stream_format=self.stream_format,
            group_bytes=self.group_bytes,
            commit_interval_s=self.commit_interval_s,
        )


def generate(
    seed: int, rounds: int = 5, gaps: frozenset[str] = frozenset(), heavy: bool = True, tables: int = 6
) -> Workload:
    """The workload of ``seed``: ``tables`` tables of different kinds, then ``rounds`` rounds of
    transactions, DDL and a loader action.

    ``heavy``: loader processes that start a JVM (a killed or overlapping load/merge) may be drawn.
    """
    unknown = gaps - set(KNOWN_GAPS)
    if unknown:
        raise ValueError(f"unknown gap flags {sorted(unknown)}; known: {sorted(KNOWN_GAPS)}")
    return Generator(seed, rounds, gaps, tables).generate(heavy)


def parse_gaps(text: str) -> frozenset[str]:
    """``FUZZ_GAPS``: empty (none), ``all``, or a comma-separated list of ``KNOWN_GAPS`` names."""
    text = text.strip()
    if not text:
        return frozenset()
    if text == "all":
        return frozenset(KNOWN_GAPS)
    return frozenset(p.strip() for p in text.split(",") if p.strip())
