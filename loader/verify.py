"""Reconciliation: each current table against ``SELECT * FROM`` its source table, value for value.

This is the product's own correctness check (``loader verify``) and the oracle of every
end-to-end test. The lakehouse side is read through pyiceberg, an engine independent of the
Spark jobs that wrote it. Columns the loader stores as exact text are fetched from the source
as their type's output text (what wal2json prints); the rest are compared as typed values.

What it prints names tables, keys and columns, never the values of other columns: a difference is
``key (2,) differs in: email``. The values themselves are personal data in most tables and end up
in terminals, CI logs and tickets, so they are shown only on request (``show_values``,
``loader verify --show-values``).
"""

from __future__ import annotations

import json
import math
import re
import struct
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from loader.capture import slot as slots
from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
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
    source = [{k: normalize_column(compared[k], v) for k, v in r.items()} for r in _source_rows(conn, table, compared)]
    lake_names = {lake_column(k): k for k in compared}
    lake_arrow = cur_table.scan(selected_fields=tuple(lake_names)).to_arrow()
    lake = [
        {lake_names[k]: normalize_column(compared[lake_names[k]], v) for k, v in r.items()}
        for r in _lake_rows(lake_arrow)
    ]
    res.source_rows, res.lake_rows = len(source), len(lake)

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(r[k] for k in pk)

    src_by_key = {key(r): r for r in source}
    lake_counts = Counter(key(r) for r in lake)
    lake_by_key = {key(r): r for r in lake}
    for k, n in lake_counts.items():
        if n > 1:
            res.extra += n - 1
            _example(res, max_examples, f"duplicate key {k} ({n} rows)")
    for k, row in src_by_key.items():
        other = lake_by_key.get(k)
        if other is None:
            res.missing += 1
            _example(res, max_examples, f"missing key {k}")
        elif other != row:
            res.different += 1
            differing = [c for c in row if row[c] != other[c]]
            if show_values:
                diff = {c: (row[c], other[c]) for c in differing}
                _example(res, max_examples, f"key {k} differs (source, lakehouse): {diff}")
            else:
                _example(res, max_examples, f"key {k} differs in: {', '.join(differing)}")
    for k in lake_by_key:
        if k not in src_by_key:
            res.extra += 1
            _example(res, max_examples, f"extra key {k}")
    return res


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
            out.append(reconcile_table(settings, conn, catalog, table, show_values=show_values))
    return out
