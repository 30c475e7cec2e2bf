"""Reconciliation: each current table against its source table, value for value, by checksums.

This is the product's own correctness check (``loader verify``) and the oracle of every
end-to-end test. The lakehouse side is read through pyiceberg, an engine independent of the
Spark jobs that wrote it. Both sides are reduced to the canonical form of :mod:`loader.canonical`:
PostgreSQL computes, per bucket of keys, the row count and the sum of the rows' checksums in one
query; the lake's rows stream through Arrow a batch at a time into the same sums. Only the buckets
whose sums differ are read again, on both sides, and compared row by row and column by column,
a group of buckets at a time, so memory holds one batch or one group, never a table. The source
side of a table is read in one REPEATABLE READ snapshot.

What it prints names tables, keys and columns, never the values of other columns: a difference is
``key (2,) differs in: email``. The values themselves are personal data in most tables and end up
in terminals, CI logs and tickets, so they are shown only on request (``show_values``,
``loader verify --show-values``), as their canonical text.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from psycopg import sql

from loader import canonical
from loader.capture import slot as slots
from loader.capture.source_tables import stored_rows
from loader.config import LoaderSettings
from loader.errors import SourceError
from loader.lake.catalog import open_catalog, row_count, scan_batches, watermark
from loader.lake.tables import (
    LEDGER_NAME,
    PROP_PARKED,
    PROP_PG_TYPES,
    PROP_PRIMARY_KEY,
    SUMMARY_LOADED_THROUGH,
    SUMMARY_MERGED_THROUGH,
    SourceTable,
)
from loader.lake.types import NON_FINITE, spark_type
from loader.lsn import ChangePosition, arrow_positions_after, format_lsn
from loader.names import lake_column


@dataclass(frozen=True)
class Finding:
    """One key that differs, before the cut decides whether it is a difference or a change in flight."""

    key: tuple[str, ...]  # canonical pieces of the key columns
    kind: str  # missing, extra, different
    text: str  # what the report says
    lake_position: ChangePosition | None  # the lake row's (pg_lsn, pg_seq), if it has one
    in_flight: bool = False  # a change of this key lies between the lake's position and the cut
    # A missing row's source values (column -> canonical text): an erased subject is not a difference.
    source_values: dict[str, str | None] | None = None
    erased: bool = False  # the row holds a value 'loader erase' erased: the source still has it


@dataclass
class Reconciliation:
    table: str
    source_rows: int = 0
    lake_rows: int = 0
    missing: int = 0  # in the source, not in the lakehouse
    extra: int = 0  # in the lakehouse, not in the source
    different: int = 0  # same key, some value differs
    examples: list[str] = field(default_factory=list)
    note: str = ""
    parked: str | None = None  # the table waits for a resync: why, and the repair
    buckets: int = 0  # checksum buckets compared
    found: list[Finding] = field(default_factory=list)  # differing keys, before the cut's verdict
    in_flight: int = 0  # differing keys with a change between the lake's position and the cut: lag
    unsettled: str | None = None  # why differing keys could not be told from lag (nothing is BAD then)
    erased: int = 0  # source rows of erased subjects, absent from the lake as they should be
    # Why this table's lake cannot follow the source (a keyless table without REPLICA IDENTITY FULL):
    # rows that differ are reported in the note, not as differences.
    limited: str | None = None
    limited_rows: int = 0
    buckets_differing: int = 0  # buckets whose rows were read and compared
    # The table itself (``table`` is its qualified name, which a dot inside a name makes ambiguous).
    source: SourceTable | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.parked is None and self.missing == 0 and self.extra == 0 and self.different == 0

    def to_doc(self) -> dict[str, Any]:
        """For ``--json``: counts, notes and the examples (keys, never values unless asked for)."""
        return {
            "table": self.table,
            "ok": self.ok,
            "source_rows": self.source_rows,
            "lake_rows": self.lake_rows,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "in_flight": self.in_flight,
            "erased": self.erased,
            "limited": self.limited if self.limited_rows else None,
            "buckets": self.buckets,
            "buckets_differing": self.buckets_differing,
            "parked": self.parked,
            "note": self.note,
            "examples": self.examples,
        }

    def line(self) -> str:
        if self.parked is not None:
            return f"PARKED {self.table:<29} {self.parked}"
        state = ("NOT FOLLOWED" if self.limited_rows else "OK ") if self.ok else "BAD"
        return (
            f"{state} {self.table:<32} source={self.source_rows:<7} lakehouse={self.lake_rows:<7} "
            f"missing={self.missing} extra={self.extra} different={self.different}"
            + (f"  {self.note}" if self.note else "")
        )


# char(n) -> text strips the padding PostgreSQL (and wal2json) print; psycopg reads it padded.
_BPCHAR_RE = re.compile(r"^(character|char|bpchar)(\(\d+\))?\Z")


def normalize(value: Any) -> Any:
    """A comparable form shared by psycopg and pyarrow values."""
    if value is None:
        return None
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, Decimal):
        return value.normalize() if value.is_finite() else str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return tuple(normalize(v) for v in value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def normalize_column(pg_type: str, value: Any) -> Any:
    """``normalize`` plus what depends on the column type: real values compare as 32-bit floats."""
    st = spark_type(pg_type)
    if "FLOAT" in st.sql and value is not None:
        return normalize(_as_float32(value))
    return normalize(value)


def _as_float32(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_as_float32(v) for v in value]
    if isinstance(value, float):
        return struct.unpack("f", struct.pack("f", value))[0]
    return value


# Dates and timestamps compare as integers (days, microseconds since 1970-01-01 UTC): Python's
# datetime cannot hold BC values, years past 9999 or the limits +/-infinity are stored as
# (typemap.NON_FINITE); computed by PostgreSQL on the source side, read from the column's physical
# integers on the lake side.
_EPOCH_UNITS = {"DATE": "days", "TIMESTAMP": "us", "TIMESTAMP_NTZ": "us"}


def _source_epoch_sql(ident: Any, sql_type: str) -> Any:
    from psycopg import sql

    plus, minus = NON_FINITE[sql_type]
    finite = (
        sql.SQL("({} - DATE '1970-01-01')").format(ident)
        if sql_type == "DATE"
        else sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint").format(ident)
    )
    return sql.SQL("CASE WHEN {0} = 'infinity' THEN {1} WHEN {0} = '-infinity' THEN {2} ELSE {3} END AS {0}").format(
        ident, sql.Literal(plus), sql.Literal(minus), finite
    )


def _lake_rows(arrow: Any) -> list[dict[str, Any]]:
    """Rows of a pyarrow table, dates and timestamps as their integers (see _EPOCH_UNITS)."""
    import pyarrow as pa

    columns = {}
    for name in arrow.column_names:
        col = arrow.column(name)
        if pa.types.is_date32(col.type):
            col = col.cast(pa.int32())
        elif pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        columns[name] = col
    return pa.table(columns).to_pylist() if columns else arrow.to_pylist()


def _source_rows(conn: Any, table: SourceTable, pg_types: dict[str, str]) -> list[dict[str, Any]]:
    from psycopg import sql

    cols: list[sql.Composable] = []
    for name, pg_type in pg_types.items():
        ident = sql.Identifier(name)
        st = spark_type(pg_type)
        if st.sql in _EPOCH_UNITS:
            cols.append(_source_epoch_sql(ident, st.sql))
        elif st.lossless_text and not _BPCHAR_RE.match(pg_type):
            # The type's output function, as wal2json and the snapshot print it: concat() calls it,
            # while ::text can differ (inet::text adds /32 to a host address).
            cols.append(sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE concat({0}) END AS {0}").format(ident))
        else:
            cols.append(ident)
    query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(cols), stored_rows(conn, table.schema, table.table))
    cur = conn.cursor()
    cur.execute(query)
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _existing_source_columns(conn: Any, table: SourceTable) -> dict[str, str]:
    """The source table's columns now, each with its type (``format_type``)."""
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass AND attnum > 0 AND NOT attisdropped",
        (table.schema, table.table),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _source_side(columns: dict[str, str], live: dict[str, str]) -> dict[str, str]:
    """The types the source side of a comparison reads ``columns`` (name -> the lake's type) as:
    the lake's, but the source's own where the two map to different lake types: a retype the lake
    has not followed (yet, or at all: a table it cannot follow) must compare as differing values,
    not make the source's SQL apply the old type's expression to the new type (found by make fuzz,
    seed 1706: a date column made text, and "text - date" failed the whole verify)."""
    out = {}
    for c, t in columns.items():
        now = live.get(c, t)
        out[c] = now if spark_type(now) != spark_type(t) else t
    return out


def reconcile_table(
    settings: LoaderSettings,
    conn: Any,
    catalog: Any,
    table: SourceTable,
    show_values: bool = False,
    cut: int | None = None,
    skip: set[str] | None = None,
) -> Reconciliation:
    """One table against its source; differences are recorded as findings for :func:`reconcile`
    to judge. ``cut``: the consistent point the source is read at (keyless tables are rebuilt from
    history as of it). ``skip``: canonical key texts in flight, left out on both sides."""
    c = settings.catalog
    res = Reconciliation(table.qualified, source=table)
    hist = catalog.load_table((c.history_namespace, table.iceberg_name))
    pk: list[str] = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
    if PROP_PARKED in hist.properties:
        res.parked = json.loads(hist.properties[PROP_PARKED]).get("reason", "parked")
        return res
    row = conn.execute(
        "SELECT to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) IS NOT NULL", (table.schema, table.table)
    ).fetchone()
    if not (row and row[0]):
        # Dropped at the source (its history stays), or named by a landing file only.
        res.note = "no such table in the source (dropped?): not compared"
        return res
    if not pk:
        _reconcile_keyless(res, conn, hist, table, cut, show_values)
        return res
    cur_table = catalog.load_table((c.current_namespace, table.iceberg_name))
    if PROP_PARKED in cur_table.properties:
        res.parked = json.loads(cur_table.properties[PROP_PARKED]).get("reason", "parked")
        return res
    pg_types: dict[str, str] = json.loads(cur_table.properties.get(PROP_PG_TYPES, "{}"))
    live = _existing_source_columns(conn, table)
    # Columns dropped at the source stay in the lakehouse (NULL from then on); compare the live ones.
    compared = {k: v for k, v in pg_types.items() if k in live}
    _compare_by_checksums(res, conn, cur_table, table, compared, pk, show_values, skip or set(), live)
    return res


def _compare_by_checksums(
    res: Reconciliation,
    conn: Any,
    lake_table: Any,
    table: SourceTable,
    columns: dict[str, str],
    pk: list[str],
    show_values: bool,
    skip: set[str],
    live: dict[str, str],
) -> None:
    """Checksums per bucket of keys on both sides (see loader.canonical); rows are read, and compared
    column by column, only in the buckets whose checksums differ, a group of buckets at a time.
    Keys in ``skip`` (canonical key texts in flight) are left out on both sides and counted in
    flight. The source's checksums are computed by PostgreSQL while the lake's are here."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    source_columns = _source_side(columns, live)
    key_at = [list(columns).index(k) for k in pk]
    bits = canonical.bucket_bits(max(row_count(lake_table), _source_estimate(conn, table)))
    skipped = pa.array(sorted(skip), pa.string())
    lake_counts = np.zeros(1 << bits, np.int64)
    lake_sums = np.zeros(1 << bits, np.int64)
    lake_skipped = 0
    with ThreadPoolExecutor(1, thread_name_prefix="verify-source") as pool:
        source_keys = {k: source_columns[k] for k in pk}
        source = pool.submit(_source_checksums, conn, table, source_columns, source_keys, bits, skip)
        for batch in _lake_batches(lake_table, columns):
            # Each column's canonical text once: the key's text (its bucket, whether it is in
            # flight) is made of the key columns', the row's checksum chains them all.
            texts = [canonical.lake_text(batch.column(lake_column(c)), spark_type(t)) for c, t in columns.items()]
            key_text = canonical.lake_join([canonical.text_pieces(texts[i]) for i in key_at])
            if len(skipped):
                keep = pc.invert(pc.is_in(key_text, value_set=skipped))
                if not pc.all(keep).as_py():
                    texts, key_text = [t.filter(keep) for t in texts], key_text.filter(keep)
                    lake_skipped += len(keep) - len(key_text)
            row_hashes = canonical.lake_row_hashes(texts)
            buckets = canonical.key_buckets(key_text, bits)
            np.add.at(lake_counts, buckets, 1)
            np.add.at(lake_sums, buckets, row_hashes)
        source_counts, source_sums, source_skipped = source.result()
    res.in_flight += len(skip)
    res.source_rows = int(source_counts.sum()) + source_skipped
    res.lake_rows = int(lake_counts.sum()) + lake_skipped
    differing = np.flatnonzero((source_counts != lake_counts) | (source_sums != lake_sums))
    res.buckets, res.buckets_differing = 1 << bits, len(differing)
    # Drill down a group of buckets at a time: memory holds at most ~DRILL_ROWS rows per side.
    group: list[int] = []
    held = 0
    for b in differing.tolist():
        group.append(b)
        held += int(max(source_counts[b], lake_counts[b]))
        if held >= DRILL_ROWS:
            _drill(res, conn, lake_table, table, columns, source_columns, pk, bits, group, show_values, skipped)
            group, held = [], 0
    if group:
        _drill(res, conn, lake_table, table, columns, source_columns, pk, bits, group, show_values, skipped)


# Rows read per side when drilling into differing buckets (buckets hold ~4096 rows each).
DRILL_ROWS = 200_000


def _source_estimate(conn: Any, table: SourceTable) -> int:
    row = conn.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (table.schema, table.table),
    ).fetchone()
    return int(row[0]) if row else 0


def _skip_sql(keys: dict[str, str], skip: set[str] | Any, key_text: Any = None) -> tuple[Any, list[Any]]:
    """`` WHERE``/`` AND`` tail leaving out the keys whose canonical text is in ``skip`` (a hashed
    ``= ANY`` of one text array), and its parameters. ``key_text``: SQL of the key's canonical text
    when the query has it already."""
    from psycopg import sql

    if not len(skip):
        return sql.SQL(""), []
    texts = skip.to_pylist() if hasattr(skip, "to_pylist") else sorted(skip)
    text = canonical.source_row_text(keys) if key_text is None else key_text
    return sql.SQL("NOT ({} = ANY(%s::text[]))").format(text), [texts]


def _source_checksums(
    conn: Any,
    table: SourceTable,
    columns: dict[str, str],
    keys: dict[str, str],
    bits: int,
    skip: set[str],
    chained: bool = True,
) -> tuple[Any, Any, int]:
    """Per bucket: rows and checksum sum of the rows whose key is not in ``skip``; and how many
    rows were left out. A row's checksum: the chain of its columns' texts
    (:func:`canonical.source_row_hash_sql`), or with ``chained=False`` the hash of its canonical
    text (keyless tables, whose history gives row texts)."""
    import numpy as np
    from psycopg import sql

    # Each column's canonical text is computed once per row, in a subquery (OFFSET 0 keeps it from
    # being inlined, which would compute it again for every use); the key's text, its bucket and
    # whether it is skipped, once per row in the next. Rows of skipped keys are counted apart (the
    # table's row count) and never hashed.
    alias = {c: sql.Identifier(f"_c{i}") for i, c in enumerate(columns)}
    key_text = canonical.pieces_text([alias[k] for k in keys])
    where, params = _skip_sql(keys, skip, key_text)
    kept = where if params else sql.SQL("true")
    query = sql.SQL(
        "SELECT _b, count(*) FILTER (WHERE _k), sum(CASE WHEN _k THEN {} END), count(*) FILTER (WHERE NOT _k)"
        " FROM (SELECT *, {} AS _b, {} AS _k FROM (SELECT {} FROM {} OFFSET 0) AS _r OFFSET 0) AS _s"
        " GROUP BY _b"
    ).format(
        canonical.source_row_hash_sql(list(alias.values()))
        if chained
        else canonical.source_hash_sql(canonical.pieces_text(list(alias.values()))),
        canonical.source_bucket_sql(key_text, bits),
        kept,
        sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(canonical.source_text(c, t), alias[c]) for c, t in columns.items()
        ),
        stored_rows(conn, table.schema, table.table),
    )
    counts = np.zeros(1 << bits, np.int64)
    sums = np.zeros(1 << bits, np.int64)
    skipped = 0
    for bucket, count, total, left_out in conn.execute(query, params):
        counts[bucket] = count
        sums[bucket] = canonical.as_signed64(total or 0)
        skipped += left_out
    return counts, sums, skipped


def _lake_batches(lake_table: Any, columns: dict[str, str], positions: bool = False) -> Any:
    """The current table's rows, a record batch at a time (memory: one batch: scan_batches)."""
    fields = tuple(lake_column(c) for c in columns) + (("pg_lsn", "pg_seq") if positions else ())
    return scan_batches(lake_table.scan(selected_fields=fields))


def _row_text(batch: Any, columns: dict[str, str]) -> Any:
    return canonical.lake_row_text([batch.column(lake_column(c)) for c in columns], list(columns.values()))


def _drill(
    res: Reconciliation,
    conn: Any,
    lake_table: Any,
    table: SourceTable,
    columns: dict[str, str],
    source_columns: dict[str, str],
    pk: list[str],
    bits: int,
    buckets: list[int],
    show_values: bool,
    skipped: Any,
) -> None:
    """Compare, row by row and column by column, the rows of ``buckets`` on both sides, but those
    of the keys in ``skipped`` (canonical key texts in flight). ``source_columns``: the types the
    source is read as (:func:`_source_side`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from psycopg import sql

    keys = {k: columns[k] for k in pk}
    source_keys = {k: source_columns[k] for k in pk}
    names = list(columns)
    where, params = _skip_sql(source_keys, skipped)
    query = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s){}").format(
        sql.SQL(", ").join(canonical.source_piece(c, t) for c, t in source_columns.items()),
        stored_rows(conn, table.schema, table.table),
        canonical.source_bucket_sql(canonical.source_row_text(source_keys), bits),
        sql.SQL(" AND ") + where if params else sql.SQL(""),
    )
    key_at = [names.index(k) for k in pk]

    def key_of(row: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(row[i] for i in key_at)

    source: dict[tuple[str, ...], tuple[str, ...]] = {}
    for row in conn.execute(query, (buckets, *params)):
        source[key_of(row)] = tuple(row)
    # The lake's rows: their values' pieces, and the position (pg_lsn, pg_seq) the loader wrote them at.
    lake: dict[tuple[str, ...], tuple[tuple[str, ...], ChangePosition | None]] = {}
    wanted = np.array(buckets, np.int64)
    for batch in _lake_batches(lake_table, columns, positions=True):
        key_text = _row_text(batch, keys)
        mask = pa.array(np.isin(canonical.key_buckets(key_text, bits), wanted))
        if len(skipped):
            mask = pc.and_(mask, pc.invert(pc.is_in(key_text, value_set=skipped)))
        if not pc.any(mask).as_py():
            continue
        picked = batch.filter(mask)
        pieces = [
            canonical.lake_pieces(picked.column(lake_column(c)), spark_type(t)).to_pylist() for c, t in columns.items()
        ]
        lsns, seqs = picked.column("pg_lsn").to_pylist(), picked.column("pg_seq").to_pylist()
        for row, lsn, seq in zip(zip(*pieces), lsns, seqs):
            k = key_of(row)
            at = ChangePosition(int(lsn), int(seq)) if lsn is not None and seq is not None else None
            if k in lake:
                res.found.append(Finding(k, "extra", f"duplicate key {_shown_key(k, keys)}", at))
            lake[k] = (row, at)
    for k, row in source.items():
        if k not in lake:
            values = {names[i]: _piece_value(row[i]) for i in range(len(names))}
            res.found.append(Finding(k, "missing", f"missing key {_shown_key(k, keys)}", None, source_values=values))
            continue
        other, at = lake[k]
        if other == row:
            continue
        differing = [i for i in range(len(names)) if row[i] != other[i]]
        if show_values:
            diff = {names[i]: (_piece_value(row[i]), _piece_value(other[i])) for i in differing}
            text = f"key {_shown_key(k, keys)} differs (source, lakehouse): {diff}"
        else:
            text = f"key {_shown_key(k, keys)} differs in: {', '.join(names[i] for i in differing)}"
        res.found.append(Finding(k, "different", text, at))
    for k, (_, at) in lake.items():
        if k not in source:
            res.found.append(Finding(k, "extra", f"extra key {_shown_key(k, keys)}", at))


def _reconcile_keyless(
    res: Reconciliation, conn: Any, hist: Any, table: SourceTable, cut: int | None, show_values: bool
) -> None:
    """A table without a key compares as a multiset of rows: the source's rows against history's
    state (rows inserted, read or updated to, minus rows updated from or deleted, after the last
    resync or truncate), by checksums of whole rows per bucket, then row counts in differing buckets."""
    import numpy as np

    types: dict[str, str] = json.loads(hist.properties.get(PROP_PG_TYPES, "{}"))
    live = _existing_source_columns(conn, table)
    columns = {k: v for k, v in types.items() if k in live}
    res.note = "no primary key: compared as a multiset of rows"
    row = conn.execute(
        "SELECT relreplident FROM pg_class WHERE oid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (table.schema, table.table),
    ).fetchone()
    if row is not None and row[0] != "f":
        # PostgreSQL sends no updates or deletes of this table: history can hold only its inserts.
        res.limited = (
            "no replica identity: PostgreSQL sends none of its updates and deletes, so history holds its inserts "
            "only (ALTER TABLE ... REPLICA IDENTITY FULL, or add a primary key, then 'loader resync')"
        )
    bits = canonical.bucket_bits(max(row_count(hist), _source_estimate(conn, table)))
    source_columns = _source_side(columns, live)
    source_counts, source_sums, _ = _source_checksums(
        conn, table, source_columns, source_columns, bits, set(), chained=False
    )
    lake_counts = np.zeros(1 << bits, np.int64)
    lake_sums = np.zeros(1 << bits, np.int64)
    try:
        for texts, sign in _history_state(hist, columns, cut):
            hashes, buckets = canonical.hashes(texts, bits)
            assert buckets is not None
            np.add.at(lake_counts, buckets, sign)
            np.add.at(lake_sums, buckets, hashes * sign)
    except _NotComparable as exc:
        res.note = f"no primary key: not compared ({exc})"
        res.source_rows = int(source_counts.sum())
        return
    res.source_rows, res.lake_rows = int(source_counts.sum()), int(lake_counts.sum())
    differing = np.flatnonzero((source_counts != lake_counts) | (source_sums != lake_sums))
    res.buckets, res.buckets_differing = 1 << bits, len(differing)
    if not len(differing):
        return
    from collections import Counter

    from psycopg import sql as q

    wanted = differing.tolist()
    row_text = canonical.source_row_text(source_columns)
    query = q.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
        row_text, stored_rows(conn, table.schema, table.table), canonical.source_bucket_sql(row_text, bits)
    )
    counts: Counter[str] = Counter(r[0] for r in conn.execute(query, (wanted,)))
    wanted_set = set(wanted)
    for texts, sign in _history_state(hist, columns, cut):
        _, buckets = canonical.hashes(texts, bits)
        assert buckets is not None
        for text, bucket in zip(texts.to_pylist(), buckets.tolist()):
            if bucket in wanted_set:
                counts[text] -= sign
    for text, n in sorted(counts.items()):
        if n == 0:
            continue
        shown = f": {text}" if show_values else ""
        kind, what = (
            ("missing", "in the source, not in history's state")
            if n > 0
            else ("extra", "in history's state, not in the source")
        )
        for _ in range(abs(n)):
            res.found.append(Finding((text,), kind, f"a row {what}{shown}", None))


class _NotComparable(Exception):
    """History's state of a keyless table cannot be rebuilt exactly (the message says why)."""


def _history_state(hist: Any, columns: dict[str, str], cut: int | None) -> Any:
    """History's rows as (canonical row texts, +1 or -1) batches: what the table holds as of ``cut``."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import AlwaysTrue, LessThan

    before_cut = LessThan("pg_lsn", cut) if cut is not None else AlwaysTrue()  # type: ignore[misc,call-arg,arg-type]
    control = ("pg_lsn", "pg_seq", "pg_operation")
    start: tuple[int, int] | None = None
    for batch in scan_batches(hist.scan(row_filter=before_cut, selected_fields=control)):
        resets = batch.filter(pc.is_in(batch.column("pg_operation"), pa.array(["resync", "truncate"])))
        for lsn, seq in zip(resets.column("pg_lsn").to_pylist(), resets.column("pg_seq").to_pylist()):
            start = max(start or (lsn, seq), (lsn, seq))
    names = list(columns)
    fields = (*(lake_column(c) for c in names), *control, "pg_old_key", "pg_absent_columns")
    for batch in scan_batches(hist.scan(row_filter=before_cut, selected_fields=fields)):
        if start is not None:
            lsn, seq = batch.column("pg_lsn"), batch.column("pg_seq")
            batch = batch.filter(arrow_positions_after(lsn, seq, start))
        ops = batch.column("pg_operation")
        added = batch.filter(pc.is_in(ops, pa.array(["insert", "read"])))
        if added.num_rows:
            yield canonical.lake_row_text([added.column(lake_column(c)) for c in names], list(columns.values())), 1
        # Updates and deletes: the old row (the replica identity, every column with FULL) goes; an
        # update's new row comes, its unsent (unchanged TOAST) columns taken from the old row.
        changed = batch.filter(pc.is_in(ops, pa.array(["update", "delete"])))
        if not changed.num_rows:
            continue
        new_pieces = [
            canonical.lake_pieces(changed.column(lake_column(c)), spark_type(t)).to_pylist() for c, t in columns.items()
        ]
        old_texts, new_texts = [], []
        for i, (op, old, absent) in enumerate(
            zip(
                changed.column("pg_operation").to_pylist(),
                changed.column("pg_old_key").to_pylist(),
                changed.column("pg_absent_columns").to_pylist(),
            )
        ):
            old_row: tuple[str, ...] | None = None
            if old is not None:
                doc = json.loads(old)
                old_row = _text_key([doc.get(lake_column(c)) for c in names], columns)
                if old_row is None:
                    raise _NotComparable("a value of its old rows cannot be put in canonical form")
                old_texts.append("".join(old_row))
            if op == "update":
                row = [new_pieces[j][i] for j in range(len(names))]
                for j, c in enumerate(names):
                    if absent and lake_column(c) in absent:
                        if old_row is None:
                            raise _NotComparable("an update left a TOASTed value unsent and no old row holds it")
                        row[j] = old_row[j]
                new_texts.append("".join(row))
        if old_texts:
            yield pa.array(old_texts, pa.string()), -1
        if new_texts:
            yield pa.array(new_texts, pa.string()), 1


def _piece_value(p: str) -> str | None:
    """The canonical text of a piece (None for NULL)."""
    return None if p == canonical.NULL_PIECE else p[p.index(":") + 1 : -1]


def _shown_key(pieces: tuple[str, ...], keys: dict[str, str]) -> tuple[Any, ...]:
    """A key as users read it: integers as numbers, everything else as its canonical text."""
    out: list[Any] = []
    for p, t in zip(pieces, keys.values()):
        v = _piece_value(p)
        out.append(int(v) if v is not None and spark_type(t).sql in ("INT", "BIGINT") else v)
    return tuple(out)


def _example(res: Reconciliation, limit: int, text: str) -> None:
    if len(res.examples) < limit:
        res.examples.append(text)


def reconcile(
    settings: LoaderSettings,
    tables: list[str] | None = None,
    show_values: bool = False,
    *,
    at_cut: bool = True,
    max_examples: int = 5,
    land: Callable[[int], None] | None = None,
) -> list[Reconciliation]:
    """Every (or the named) captured table reconciled; ``show_values`` puts differing values in the examples.

    ``at_cut``: the source is read in the snapshot a temporary slot exports with its consistent
    point (the *cut*): exactly the changes committed before the cut, every table in one snapshot.
    Keys that differ are then judged against the stream: a key with a change between the lake's
    position and the cut (in history not merged yet, in landing files not loaded yet, or a lake row
    written after the cut) is lag, counted as in flight, not as a difference. Changes before the cut
    not landed yet are landed first (a capture up to the cut), so on a quiet source every difference
    is real, and on a busy one only real ones are reported. ``land(cut)`` lands them instead (follow
    mode: its own capture thread, which holds the slot)."""
    from loader.lake.catalog import history_source_tables

    catalog = open_catalog(settings)
    # In the lake's name order, as listed; nothing loaded yet: none.
    known = sorted(history_source_tables(settings), key=lambda t: t.iceberg_name)
    selected = [t for t in known if not tables or t.qualified in tables]
    out: list[Reconciliation] = []
    src = settings.source
    cut: int | None = None
    with slots.connect(src.conninfo()) as conn:
        if selected and not canonical.source_hash_agrees(conn):
            raise SourceError(
                "the source's hashtextextended() is not the lookup3 verify computes on the lake's side "
                "(a big-endian server?): their checksums cannot be compared"
            )
        exported = None
        if at_cut and selected:
            name = f"{src.slot[:36]}_verify_{os.getpid()}_{secrets.token_hex(2)}"
            exported = slots.create_slot_exporting_snapshot(
                src.conninfo(), name, temporary=True, plugin="pgoutput", timeout_s=src.slot_create_timeout_s
            )
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if exported is not None:
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported.snapshot_name)))
                cut = exported.consistent_lsn
                exported.close()  # the transaction holds the snapshot now; drops the temporary slot
            # Keys changed around the cut are left out of both sides' checksums: on a busy source
            # they would make nearly every bucket differ and every row be read.
            skip = _keys_in_flight(settings, catalog, selected, cut, land) if cut is not None else {}
            for table in selected:
                out.append(
                    reconcile_table(
                        settings,
                        conn,
                        catalog,
                        table,
                        show_values=show_values,
                        cut=cut,
                        skip=skip.get(table.qualified),
                    )
                )
            absent = [] if tables else _captured_without_history(conn, settings, {t.qualified for t in selected})
        finally:
            conn.execute("ROLLBACK")
            if exported is not None:
                exported.close()
    if absent:
        out.extend(_absent_from_lake(settings, catalog, absent, cut, land))
    if cut is not None and any(r.found for r in out):
        _settle(settings, catalog, out, cut, land)
    if any(f.source_values for r in out for f in r.found):
        _mark_erased(settings, catalog, out)
    for r in out:
        _judge(r, max_examples)
    return out


# Rows counted at most, for a captured table the lake does not hold at all.
_ABSENT_COUNT_MAX = 1_000_000


def _captured_without_history(
    conn: Any, settings: LoaderSettings, have: set[str], limit: int = _ABSENT_COUNT_MAX
) -> list[tuple[SourceTable, int]]:
    """The tables capture captures (its own plan: include/exclude, readable by the role, in the
    publication for pgoutput) that hold rows at the cut but have no history table: (table, rows,
    counted up to ``limit``: 1 asks only whether it holds any)."""
    from loader.capture.source_filter import captured_plan
    from loader.capture.source_tables import split_qualified

    plan = captured_plan(conn, settings)
    out = []
    for qualified in sorted(plan.wanted - have):
        table = SourceTable(*split_qualified(conn, qualified))
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %s) AS s").format(
                stored_rows(conn, table.schema, table.table)
            ),
            (limit,),
        ).fetchone()
        if row and row[0]:
            out.append((table, int(row[0])))
    return out


def _absent_from_lake(
    settings: LoaderSettings,
    catalog: Any,
    absent: list[tuple[SourceTable, int]],
    cut: int | None,
    land: Callable[[int], None] | None,
    limit: int = _ABSENT_COUNT_MAX,
) -> list[Reconciliation]:
    """Results for captured tables with rows and no history table (counted up to ``limit``): every row missing (never
    snapshotted, say, so none of its rows reached the lake), unless its changes are on their way
    (in landing files not loaded yet, once what committed before the cut is landed): lag, left out.
    When what committed before the cut cannot be landed, nothing is judged."""
    if cut is not None and _land_to_cut(settings, cut, land) is not None:
        return []
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        store, pending = _pending_files(settings, catalog)
    except (NoSuchTableError, NoSuchNamespaceError):  # no ledger yet: every landing file is pending
        from loader.landing.store import open_landing

        store = open_landing(settings)
        pending = store.files()
    out = []
    for table, rows in absent:
        if any(_table_in_landing(store, f.name, table) for f in pending):
            continue
        res = Reconciliation(table.qualified, source_rows=rows, missing=rows, source=table)
        counted = f"at least {rows:,} source row{'s' if rows > 1 else ''}" if rows >= limit else f"{rows:,} source rows"
        res.note = (
            f"captured, but the lake holds no history of it: {counted} missing (rows that "
            f"were there before capture began are only landed by a snapshot); run 'loader resync --table "
            f"{table.qualified}'"
        )
        res.examples.append(res.note)
        out.append(res)
    return out


def _judge(res: Reconciliation, max_examples: int) -> None:
    """Findings become differences, except keys in flight; with the cut unsettled, none are."""
    for f in res.found:
        if f.erased:
            res.erased += 1
            continue
        if res.limited is not None and not f.in_flight and res.unsettled is None:
            res.limited_rows += 1
            continue
        if res.unsettled is not None or f.in_flight:
            res.in_flight += 1
            continue
        setattr(res, f.kind, getattr(res, f.kind) + 1)
        _example(res, max_examples, f.text)
    if res.limited_rows:
        res.note = (res.note + "; " if res.note else "") + f"{res.limited_rows} rows differ: {res.limited}"
    if res.erased:
        res.note = (res.note + "; " if res.note else "") + (
            f"{res.erased} rows erased from the lake ('loader erase') are still in the source: delete them there"
        )
    if res.in_flight:
        res.note = (res.note + "; " if res.note else "") + (
            f"{res.in_flight} keys in flight (changed between the lake's position and the cut)"
            if res.unsettled is None
            else f"{res.in_flight} differing keys not judged: {res.unsettled}"
        )


def _mark_erased(settings: LoaderSettings, catalog: Any, results: list[Reconciliation]) -> None:
    """Missing rows that hold an erased value (its salted hash in the erased-keys table) are the
    erasure's doing, not a difference: the lake must not have them."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.expressions import EqualTo

    from loader.lake.erased import PROP_SALT, value_hash

    try:
        erased = catalog.load_table((settings.catalog.loader_namespace, "erased_keys"))
    except NoSuchTableError:
        return
    salt = erased.properties.get(PROP_SALT)
    if salt is None:
        return
    for res in results:
        if not any(f.source_values for f in res.found):
            continue
        rows = erased.scan(row_filter=EqualTo("source_table", res.table)).to_arrow()  # type: ignore[misc,call-arg,arg-type]
        hashes = set(zip(rows.column("source_column").to_pylist(), rows.column("value_hash").to_pylist()))
        if not hashes:
            continue
        res.found = [
            replace(
                f,
                erased=any(
                    (column, value_hash(salt, value)) in hashes
                    for column, value in f.source_values.items()
                    if value is not None
                ),
            )
            if f.source_values
            else f
            for f in res.found
        ]


def _land_to_cut(settings: LoaderSettings, cut: int, land: Callable[[int], None] | None) -> str | None:
    """Land what committed before the cut, exactly as 'loader capture' would (``land`` instead in
    follow mode); None when done, else why the keys around the cut cannot be judged."""
    src = settings.source
    with slots.connect(src.conninfo()) as conn:
        info = slots.slot_info(conn, src.slot)
    if info is not None and info.confirmed_flush_lsn is not None and info.confirmed_flush_lsn >= cut:
        return None
    from loader.capture.capture import Capture
    from loader.errors import LoaderError

    try:
        if land is not None:
            land(cut)
        else:
            Capture(settings).run(create_slot=False, upto_lsn=cut)
    except LoaderError as exc:
        return (
            f"changes committed before the cut {format_lsn(cut)} are not captured yet "
            f"({str(exc).splitlines()[0]}); run 'loader capture' and verify again"
        )
    return None


def _pending_files(settings: LoaderSettings, catalog: Any) -> tuple[Any, list[Any]]:
    """The landing store and its files not loaded yet."""
    from loader.landing.store import open_landing

    store = open_landing(settings)
    ledger = catalog.load_table((settings.catalog.loader_namespace, LEDGER_NAME))
    loaded = watermark(ledger, SUMMARY_LOADED_THROUGH)
    loaded_at = ChangePosition.from_token(loaded) if loaded else None
    return store, [f for f in store.files() if loaded_at is None or f.last > loaded_at]


def _moving_keys(
    settings: LoaderSettings, catalog: Any, table: SourceTable, cut: int, store: Any, pending: list[Any]
) -> set[tuple[str, ...]] | None:
    """Keys (canonical pieces) of a keyed table with a change between the lake's position and the
    cut: in history after min(merged, cut), or in landing files not loaded yet. None when one of
    them cannot be typed for comparison."""
    c = settings.catalog
    hist = catalog.load_table((c.history_namespace, table.iceberg_name))
    pk: list[str] = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
    if not pk:
        return set()
    current = catalog.load_table((c.current_namespace, table.iceberg_name))
    types: dict[str, str] = json.loads(current.properties.get(PROP_PG_TYPES, "{}"))
    keys = {k: types[k] for k in pk}
    merged = watermark(current, SUMMARY_MERGED_THROUGH)
    low = min(ChangePosition.from_token(merged), ChangePosition(cut - 1, 1 << 62)) if merged else None
    moving = _keys_in_history(hist, keys, low)
    for f in pending:
        found = _keys_in_landing(store, f.name, table, keys)
        moving = None if moving is None or found is None else moving | found
    return moving


def _settle(
    settings: LoaderSettings,
    catalog: Any,
    results: list[Reconciliation],
    cut: int,
    land: Callable[[int], None] | None = None,
) -> None:
    """Mark the findings whose keys have a change in flight around the cut (see :func:`reconcile`)."""
    why = _land_to_cut(settings, cut, land)
    if why is not None:
        for r in results:
            r.unsettled = why if r.found else r.unsettled
        return
    store, pending = _pending_files(settings, catalog)
    after_cut = ChangePosition(cut, 0)
    for res in results:
        if not res.found:
            continue
        table = res.source or SourceTable.parse(res.table)
        hist = catalog.load_table((settings.catalog.history_namespace, table.iceberg_name))
        if not json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]")):
            # History is read as of the cut; only changes before it that are not loaded yet are lag.
            if any(_table_in_landing(store, f.name, table) for f in pending):
                res.found = [replace(f, in_flight=True) for f in res.found]
            continue
        moving = _moving_keys(settings, catalog, table, cut, store, pending)
        if moving is None:
            res.unsettled = "keys changed around the cut cannot be typed for comparison"
            continue
        res.found = [
            replace(f, in_flight=f.key in moving or (f.lake_position is not None and f.lake_position >= after_cut))
            for f in res.found
        ]


def _keys_in_flight(
    settings: LoaderSettings,
    catalog: Any,
    tables: list[SourceTable],
    cut: int,
    land: Callable[[int], None] | None,
) -> dict[str, set[str]]:
    """Before any checksum: the canonical key texts of each keyed table's keys in flight around the
    cut (what :func:`_settle` would judge as lag), so that both sides leave them out and only the
    rows that should be equal are summed. Empty for a table whose keys cannot be told (its
    differences are then judged after the comparison, as before)."""
    from pyiceberg.exceptions import NoSuchTableError

    if _land_to_cut(settings, cut, land) is not None:
        return {}
    store, pending = _pending_files(settings, catalog)
    out: dict[str, set[str]] = {}
    for table in tables:
        try:
            moving = _moving_keys(settings, catalog, table, cut, store, pending)
        except (NoSuchTableError, KeyError):  # not merged yet, or keyless
            continue
        if moving:
            out[table.qualified] = {"".join(k) for k in moving}
    return out


def _keys_in_history(hist: Any, keys: dict[str, str], low: ChangePosition | None) -> set[tuple[str, ...]] | None:
    """Keys (old and new) of the history rows after ``low`` (all rows without one)."""
    from pyiceberg.expressions import AlwaysTrue, GreaterThanOrEqual

    fields = (*(lake_column(k) for k in keys), "pg_lsn", "pg_seq", "pg_old_key")
    where = (
        GreaterThanOrEqual("pg_lsn", low.commit_lsn)  # type: ignore[misc,call-arg,arg-type]
        if low is not None
        else AlwaysTrue()
    )
    out: set[tuple[str, ...]] = set()
    for batch in scan_batches(hist.scan(row_filter=where, selected_fields=fields)):
        if low is not None:
            lsn, seq = batch.column("pg_lsn"), batch.column("pg_seq")
            batch = batch.filter(arrow_positions_after(lsn, seq, low))
        pieces = [
            canonical.lake_pieces(batch.column(lake_column(k)), spark_type(t)).to_pylist() for k, t in keys.items()
        ]
        out.update(zip(*pieces))
        for old in batch.column("pg_old_key").drop_null().to_pylist():
            doc = json.loads(old)
            typed = _text_key([doc.get(lake_column(k)) for k in keys], keys)
            if typed is None:
                return None
            out.add(typed)
    return out


def _table_in_landing(store: Any, name: str, table: SourceTable) -> bool:
    return any((rec.schema, rec.table) == (table.schema, table.table) for rec in store.read_records(name))


def _keys_in_landing(store: Any, name: str, table: SourceTable, keys: dict[str, str]) -> set[tuple[str, ...]] | None:
    """Keys (old and new) of the table's changes in one landing file."""
    out: set[tuple[str, ...]] = set()
    for rec in store.read_records(name):
        if (rec.schema, rec.table) != (table.schema, table.table):
            continue
        for cols in (rec.columns, rec.identity):
            values = {c.name: c.value for c in cols}
            if not all(k in values for k in keys):
                continue
            typed = _text_key([values[k] for k in keys], keys)
            if typed is None:
                return None
            out.add(typed)
    return out


def _text_key(values: list[str | None], keys: dict[str, str]) -> tuple[str, ...] | None:
    """A key given as PostgreSQL text (a landing record, an old key) in canonical pieces; None when
    a key type's text is not its canonical text and the load's Arrow typing cannot type it."""
    import pyarrow as pa

    from loader.load.driver import NotPlain, _typed
    from loader.load.sql import HistoryColumn

    out = []
    for value, (name, pg_type) in zip(values, keys.items()):
        st = spark_type(pg_type)
        if value is None:
            out.append(canonical.NULL_PIECE)
        elif st.lossless_text or st.sql in ("INT", "BIGINT") or st.sql.startswith("DECIMAL("):
            out.append(canonical.piece(str(value)))
        else:
            try:
                typed = _typed(pa.array([str(value)]), HistoryColumn(name, pg_type), SourceTable("", ""))
            except NotPlain:
                return None
            out.append(canonical.lake_pieces(typed, st)[0].as_py())
    return tuple(out)


# --- continuous verification (follow mode) ------------------------------------------------------
VERIFY_LOG = "verify_log"


@dataclass
class VerifyRound:
    results: list[Reconciliation] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)  # tables whose resync was requested
    seconds: float = 0.0

    def summary(self) -> str:
        bad = [r for r in self.results if not r.ok and r.parked is None]
        rows = sum(r.source_rows for r in self.results)
        text = f"verify: {len(self.results)} tables, {rows} rows in {self.seconds:.1f}s"
        if bad:
            text += "; DIFFERENT: " + ", ".join(f"{r.table} ({r.missing + r.extra + r.different} keys)" for r in bad)
        if self.repairs:
            text += "; resync requested: " + ", ".join(self.repairs)
        return text


class RollingVerifier:
    """Follow mode's continuous verification: every ``verify.every_minutes``, tables are verified in
    turn (where the last round stopped, in name order) until ``verify.budget_s`` is spent. A table
    that differs is logged, counted in ``loader_verify_differences``, recorded in the landing area's
    ``_state/verify.state.json`` (``loader status`` shows it) and its differing keys appended to the
    ``verify_log`` table of the loader's namespace (keys only; a keyless row as its checksum); with
    ``verify.auto_repair`` the next capture resyncs it."""

    def __init__(
        self,
        settings: LoaderSettings,
        metrics: Any = None,
        store: Any = None,
        land: Callable[[int], None] | None = None,
        started: float | None = None,
    ) -> None:
        from loader.landing.store import open_landing

        self.land = land
        self.settings = settings
        self.metrics = metrics
        self.store = store or open_landing(settings)
        self._last_round: float | None = started

    def due(self, now: float) -> bool:
        c = self.settings.verify
        return c.enabled and (self._last_round is None or now - self._last_round >= c.every_minutes * 60)

    def round(self, now: float | None = None) -> VerifyRound:
        import logging
        import time

        from loader.lake.catalog import history_source_tables
        from loader.landing.state import VERIFY_STATE, request_resync

        log = logging.getLogger("loader.verify")
        started = time.monotonic()
        self._last_round = now if now is not None else started
        out = VerifyRound()
        catalog = open_catalog(self.settings)
        every = sorted(t.qualified for t in history_source_tables(self.settings))
        state = self.store.read_state(VERIFY_STATE) or {}
        after = state.get("last_table")
        order = [t for t in every if after is None or t > after] + [
            t for t in every if after is not None and t <= after
        ]
        tables = dict(state.get("tables", {}))
        # Captured tables the lake holds nothing of, every round (catalog queries and a capped count
        # each): no history table to take a turn in the order below.
        absent = self._absent(catalog, set(every))
        for table in [r.table for r in absent] + order:
            if out.results and time.monotonic() - started >= self.settings.verify.budget_s:
                break
            if absent and absent[0].table == table:
                res = absent.pop(0)
            else:
                (res,) = reconcile(self.settings, [table], land=self.land)
            out.results.append(res)
            differing = res.missing + res.extra + res.different
            tables[table] = {
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "ok": res.ok,
                "differing_keys": differing,
                "in_flight": res.in_flight,
                "rows": res.source_rows,
                "parked": res.parked,
            }
            state = {"last_table": table if table in every else after, "tables": tables}
            if self.metrics is not None:
                self.metrics.verify_differences.labels(table=table).set(differing)
                self.metrics.verify_rows.inc(res.source_rows)
            if differing:
                log.warning("verify: %s", res.line())
                self._log_keys(catalog, res)
                if self.settings.verify.auto_repair and res.parked is None:
                    request_resync(self.store, table, f"continuous verification found {differing} differing keys")
                    out.repairs.append(table)
            self.store.write_state(VERIFY_STATE, state)
        out.seconds = time.monotonic() - started
        return out

    def _absent(self, catalog: Any, have: set[str]) -> list[Reconciliation]:
        """Results for the captured tables with rows and no history table (see reconcile): counted
        now, then judged after landing what committed before the current position (follow mode's
        capture thread lands it), so rows just committed and not landed yet are not reported.
        Whether such a table holds rows is all a round asks (one row read, not a count: a big table
        never snapshotted would otherwise be counted every round until it is repaired)."""
        from loader.lsn import parse_lsn

        with slots.connect(self.settings.source.conninfo()) as conn:
            absent = _captured_without_history(conn, self.settings, have, limit=1)
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        if not absent or not row:
            return []
        return _absent_from_lake(self.settings, catalog, absent, parse_lsn(str(row[0])), self.land, limit=1)

    def _log_keys(self, catalog: Any, res: Reconciliation) -> None:
        """The judged differences' keys in ``verify_log`` (never values: a keyless row as its md5)."""
        import hashlib

        import pyarrow as pa

        c = self.settings.catalog
        rows = [f for f in res.found if not f.in_flight]
        if not rows:
            return
        schema = pa.schema(
            [
                pa.field("verified_at", pa.timestamp("us", tz="UTC")),
                pa.field("source_table", pa.string()),
                pa.field("kind", pa.string()),
                pa.field("key", pa.string()),
            ]
        )
        table = catalog.create_table_if_not_exists((c.loader_namespace, VERIFY_LOG), schema=schema)
        keyless = res.note.startswith("no primary key")
        now = datetime.now(UTC)
        table.append(
            pa.table(
                {
                    "verified_at": [now] * len(rows),
                    "source_table": [res.table] * len(rows),
                    "kind": [f.kind for f in rows],
                    "key": [
                        "row md5 " + hashlib.md5(f.key[0].encode()).hexdigest() if keyless else "".join(f.key)
                        for f in rows
                    ],
                },
                schema=schema,
            )
        )
