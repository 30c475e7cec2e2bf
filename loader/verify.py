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
import re
import struct
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from loader import canonical
from loader.capture import slot as slots
from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog, row_count
from loader.lake.tables import PROP_PARKED, PROP_PG_TYPES, PROP_PRIMARY_KEY, SourceTable
from loader.lake.types import NON_FINITE, spark_type
from loader.names import lake_column


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
    buckets_differing: int = 0  # buckets whose rows were read and compared

    @property
    def ok(self) -> bool:
        return self.parked is None and self.missing == 0 and self.extra == 0 and self.different == 0

    def line(self) -> str:
        if self.parked is not None:
            return f"PARKED {self.table:<29} {self.parked}"
        state = "OK " if self.ok else "BAD"
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
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(cols), sql.Identifier(table.schema), sql.Identifier(table.table)
    )
    cur = conn.cursor()
    cur.execute(query)
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _existing_source_columns(conn: Any, table: SourceTable) -> set[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass"
        " AND attnum > 0 AND NOT attisdropped",
        (table.schema, table.table),
    ).fetchall()
    return {r[0] for r in rows}


def reconcile_table(
    settings: LoaderSettings,
    conn: Any,
    catalog: Any,
    table: SourceTable,
    max_examples: int = 5,
    show_values: bool = False,
) -> Reconciliation:
    c = settings.catalog
    res = Reconciliation(table.qualified)
    hist = catalog.load_table((c.history_namespace, table.iceberg_name))
    pk: list[str] = json.loads(hist.properties.get(PROP_PRIMARY_KEY, "[]"))
    if PROP_PARKED in hist.properties:
        res.parked = json.loads(hist.properties[PROP_PARKED]).get("reason", "parked")
        return res
    if not pk:
        res.note = "no primary key: history only, not reconciled"
        return res
    cur_table = catalog.load_table((c.current_namespace, table.iceberg_name))
    if PROP_PARKED in cur_table.properties:
        res.parked = json.loads(cur_table.properties[PROP_PARKED]).get("reason", "parked")
        return res
    pg_types: dict[str, str] = json.loads(cur_table.properties.get(PROP_PG_TYPES, "{}"))
    live = _existing_source_columns(conn, table)
    # Columns dropped at the source stay in the lakehouse (NULL from then on); compare the live ones.
    compared = {k: v for k, v in pg_types.items() if k in live}
    _compare_by_checksums(res, conn, cur_table, table, compared, pk, max_examples, show_values)
    return res


def _compare_by_checksums(
    res: Reconciliation,
    conn: Any,
    lake_table: Any,
    table: SourceTable,
    columns: dict[str, str],
    pk: list[str],
    max_examples: int,
    show_values: bool,
) -> None:
    """Checksums per bucket of keys on both sides (see loader.canonical); rows are read, and compared
    column by column, only in the buckets whose checksums differ, a group of buckets at a time."""
    import numpy as np

    keys = {k: columns[k] for k in pk}
    bits = canonical.bucket_bits(max(row_count(lake_table), _source_estimate(conn, table)))
    source_counts, source_sums = _source_checksums(conn, table, columns, keys, bits)
    lake_counts = np.zeros(1 << bits, np.int64)
    lake_sums = np.zeros(1 << bits, np.int64)
    for batch in _lake_batches(lake_table, columns):
        row_hashes, _ = canonical.hashes(_row_text(batch, columns))
        buckets = canonical.key_buckets(_row_text(batch, keys), bits)
        np.add.at(lake_counts, buckets, 1)
        np.add.at(lake_sums, buckets, row_hashes)
    res.source_rows, res.lake_rows = int(source_counts.sum()), int(lake_counts.sum())
    differing = np.flatnonzero((source_counts != lake_counts) | (source_sums != lake_sums))
    res.buckets, res.buckets_differing = 1 << bits, len(differing)
    # Drill down a group of buckets at a time: memory holds at most ~DRILL_ROWS rows per side.
    group: list[int] = []
    held = 0
    for b in differing.tolist():
        group.append(b)
        held += int(max(source_counts[b], lake_counts[b]))
        if held >= DRILL_ROWS:
            _drill(res, conn, lake_table, table, columns, pk, bits, group, max_examples, show_values)
            group, held = [], 0
    if group:
        _drill(res, conn, lake_table, table, columns, pk, bits, group, max_examples, show_values)


# Rows read per side when drilling into differing buckets (buckets hold ~4096 rows each).
DRILL_ROWS = 200_000


def _source_estimate(conn: Any, table: SourceTable) -> int:
    row = conn.execute(
        "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass",
        (table.schema, table.table),
    ).fetchone()
    return int(row[0]) if row else 0


def _source_checksums(
    conn: Any, table: SourceTable, columns: dict[str, str], keys: dict[str, str], bits: int
) -> tuple[Any, Any]:
    import numpy as np
    from psycopg import sql

    query = sql.SQL(
        "SELECT _b, count(*), sum(_h) FROM (SELECT {} AS _b, {} AS _h FROM {}.{}) AS _s GROUP BY _b"
    ).format(
        canonical.source_bucket_sql(canonical.source_row_text(keys), bits),
        canonical.source_hash_sql(canonical.source_row_text(columns)),
        sql.Identifier(table.schema),
        sql.Identifier(table.table),
    )
    counts = np.zeros(1 << bits, np.int64)
    sums = np.zeros(1 << bits, np.int64)
    for bucket, count, total in conn.execute(query):
        counts[bucket] = count
        sums[bucket] = canonical.as_signed64(total)
    return counts, sums


def _lake_batches(lake_table: Any, columns: dict[str, str]) -> Any:
    """The current table's rows, a record batch at a time (memory: one batch)."""
    fields = tuple(lake_column(c) for c in columns)
    return lake_table.scan(selected_fields=fields).to_arrow_batch_reader()


def _row_text(batch: Any, columns: dict[str, str]) -> Any:
    return canonical.lake_row_text([batch.column(lake_column(c)) for c in columns], list(columns.values()))


def _drill(
    res: Reconciliation,
    conn: Any,
    lake_table: Any,
    table: SourceTable,
    columns: dict[str, str],
    pk: list[str],
    bits: int,
    buckets: list[int],
    max_examples: int,
    show_values: bool,
) -> None:
    """Compare, row by row and column by column, the rows of ``buckets`` on both sides."""
    import numpy as np
    from psycopg import sql

    keys = {k: columns[k] for k in pk}
    names = list(columns)
    query = sql.SQL("SELECT {} FROM {}.{} WHERE {} = ANY(%s)").format(
        sql.SQL(", ").join(canonical.source_piece(c, t) for c, t in columns.items()),
        sql.Identifier(table.schema),
        sql.Identifier(table.table),
        canonical.source_bucket_sql(canonical.source_row_text(keys), bits),
    )
    key_at = [names.index(k) for k in pk]

    def key_of(row: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(row[i] for i in key_at)

    source: dict[tuple[str, ...], tuple[str, ...]] = {}
    for row in conn.execute(query, (buckets,)):
        source[key_of(row)] = tuple(row)
    lake: dict[tuple[str, ...], tuple[str, ...]] = {}
    wanted = np.array(buckets, np.int64)
    for batch in _lake_batches(lake_table, columns):
        mask = np.isin(canonical.key_buckets(_row_text(batch, keys), bits), wanted)
        if not mask.any():
            continue
        import pyarrow as pa

        picked = batch.filter(pa.array(mask))
        pieces = [
            canonical.lake_pieces(picked.column(lake_column(c)), spark_type(t)).to_pylist() for c, t in columns.items()
        ]
        for row in zip(*pieces):
            k = key_of(row)
            if k in lake:
                res.extra += 1
                _example(res, max_examples, f"duplicate key {_shown_key(k, keys)}")
            lake[k] = row
    for k, row in source.items():
        other = lake.get(k)
        if other is None:
            res.missing += 1
            _example(res, max_examples, f"missing key {_shown_key(k, keys)}")
        elif other != row:
            res.different += 1
            differing = [names[i] for i in range(len(names)) if row[i] != other[i]]
            if show_values:
                diff = {
                    names[i]: (_piece_value(row[i]), _piece_value(other[i]))
                    for i in range(len(names))
                    if row[i] != other[i]
                }
                _example(res, max_examples, f"key {_shown_key(k, keys)} differs (source, lakehouse): {diff}")
            else:
                _example(res, max_examples, f"key {_shown_key(k, keys)} differs in: {', '.join(differing)}")
    for k in lake:
        if k not in source:
            res.extra += 1
            _example(res, max_examples, f"extra key {_shown_key(k, keys)}")


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
    settings: LoaderSettings, tables: list[str] | None = None, show_values: bool = False
) -> list[Reconciliation]:
    """Every (or the named) captured table reconciled; ``show_values`` puts differing values in the examples."""
    catalog = open_catalog(settings)
    out = []
    with slots.connect(settings.source.conninfo()) as conn:
        for ident in sorted(catalog.list_tables(settings.catalog.history_namespace)):
            table = SourceTable.from_iceberg_name(ident[-1])
            if tables and table.qualified not in tables:
                continue
            # One snapshot per table: its checksums and the rows drilled into agree with each other.
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                out.append(reconcile_table(settings, conn, catalog, table, show_values=show_values))
            finally:
                conn.execute("ROLLBACK")
    return out
