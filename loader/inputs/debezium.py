"""Debezium PostgreSQL connector envelopes, as a Kafka S3 sink writes them (JSON, one per line).

Accepted shapes per document: the envelope itself (``{"before", "after", "source", "op", ...}``),
the Kafka Connect JSON form ``{"schema": ..., "payload": envelope}``, or a record with its key
``{"key": ..., "value": ...}`` (sinks that store keys). ``op`` c/u/d/r/t maps to I/U/D/R/T,
``source.lsn`` is the change LSN, ``source.txId`` the transaction, ``source.ts_ms`` its commit time.

Values become PostgreSQL text. With the Connect schema present, logical types are decoded:
``Decimal`` (base64 unscaled bytes + scale), ``io.debezium.time.{Date, Time, MicroTime, NanoTime,
Timestamp, MicroTimestamp, NanoTimestamp, ZonedTimestamp, ZonedTime}``, ``VariableScaleDecimal``,
bytes (base64 -> ``\\x`` hex); the column type is the source type when the connector ran with
``column.propagate.source.type`` (``__debezium.source.column.type``), else one derived from the
Connect type. Without a schema, values are kept as their JSON text and typed ``text`` (numbers as
``numeric``, booleans as ``boolean``): history keeps them, typing is coarser.

The key is the record key when present, else ``--pk``; without either the table is history only.

Unavailable values. For an unchanged TOASTed column it did not receive, Debezium writes its
``unavailable.value.placeholder`` (default ``__debezium_unavailable_value``; a bytea column holds
the placeholder's bytes, so base64 or hex text; an array column an array of it). That means
"unchanged", so the column is left out of the change (absent, exactly like wal2json's unchanged
TOAST), in ``after`` and in ``before``/identity alike. An insert or snapshot read carrying it is a
malformed message (a new row has no unchanged column). A real value equal to the placeholder is
indistinguishable from it, in Debezium as here; pass another placeholder if the connector uses one.

Malformed messages (not JSON, not an object, no op/source/lsn/table, an unknown op, a bad LSN, a
value that does not decode as its schema says) are quarantined (see ``loader.inputs.common``);
a tombstone (a record whose value is null) carries nothing and is skipped.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from loader.errors import DecodeError
from loader.inputs.common import (
    MAX_DECOMPRESSED,
    InputChange,
    InputItem,
    Quarantined,
    json_documents,
    lsn_value,
    value_text,
)
from loader.landing.records import Column

# Debezium's default ``unavailable.value.placeholder``: written instead of an unchanged TOASTed
# value the connector did not receive (an UPDATE under REPLICA IDENTITY DEFAULT). Not data.
UNAVAILABLE_VALUE_PLACEHOLDER = "__debezium_unavailable_value"

_OPS = {"c": "I", "u": "U", "d": "D", "r": "R", "t": "T"}
_EPOCH = datetime(1970, 1, 1)
_CONNECT_TYPES = {
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float32": "real",
    "float64": "double precision",
    "boolean": "boolean",
    "string": "text",
    "bytes": "bytea",
}
_LOGICAL_TYPES = {
    "org.apache.kafka.connect.data.Decimal": "numeric",
    "io.debezium.data.VariableScaleDecimal": "numeric",
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Time": "time without time zone",
    "io.debezium.time.MicroTime": "time without time zone",
    "io.debezium.time.NanoTime": "time without time zone",
    "io.debezium.time.Timestamp": "timestamp without time zone",
    "io.debezium.time.MicroTimestamp": "timestamp without time zone",
    "io.debezium.time.NanoTimestamp": "timestamp without time zone",
    "org.apache.kafka.connect.data.Timestamp": "timestamp without time zone",
    "io.debezium.time.ZonedTimestamp": "timestamp with time zone",
    "io.debezium.time.ZonedTime": "time with time zone",
    "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Uuid": "uuid",
    "io.debezium.time.MicroDuration": "interval",
    "io.debezium.time.Interval": "interval",
}


def _ts_text(dt: datetime) -> str:
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond:06d}".rstrip("0")
    return text


def _time_text(micros: int) -> str:
    s, us = divmod(micros, 1_000_000)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}".rstrip("0") if us else "")


def _decimal_text(raw: Any, scale: int) -> str:
    unscaled = int.from_bytes(base64.b64decode(raw), "big", signed=True)
    d = Decimal(unscaled).scaleb(-scale)
    return f"{d:f}"


def _convert_value(value: Any, field: dict[str, Any] | None) -> tuple[str, str | None]:
    """(PostgreSQL type, text value) of one field."""
    if field is None:
        if value is None:
            return "text", None
        if value is True or value is False:
            return "boolean", value_text(value)
        if isinstance(value, str) and value.lstrip("-").replace(".", "", 1).isdigit():
            return "numeric", value  # parse_int/parse_float kept the exact text
        return "text", value_text(value)
    params = field.get("parameters") or {}
    logical = field.get("name") or ""
    pg_type = str(params.get("__debezium.source.column.type", "")).lower() or _LOGICAL_TYPES.get(
        logical, _CONNECT_TYPES.get(field.get("type", ""), "text")
    )
    if (
        "__debezium.source.column.length" in params
        and pg_type == "numeric"
        and "__debezium.source.column.scale" in params
    ):
        pg_type = f"numeric({params['__debezium.source.column.length']},{params['__debezium.source.column.scale']})"
    if value is None:
        return pg_type, None
    if logical == "org.apache.kafka.connect.data.Decimal":
        return pg_type, _decimal_text(value, int(params.get("scale", 0)))
    if logical == "io.debezium.data.VariableScaleDecimal":
        return pg_type, _decimal_text(value["value"], int(value["scale"]))
    if logical in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return pg_type, (_EPOCH + timedelta(days=int(value))).strftime("%Y-%m-%d")
    if logical == "io.debezium.time.Time":
        return pg_type, _time_text(int(value) * 1000)
    if logical == "io.debezium.time.MicroTime":
        return pg_type, _time_text(int(value))
    if logical == "io.debezium.time.NanoTime":
        return pg_type, _time_text(int(value) // 1000)
    if logical in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return pg_type, _ts_text(_EPOCH + timedelta(milliseconds=int(value)))
    if logical == "io.debezium.time.MicroTimestamp":
        return pg_type, _ts_text(_EPOCH + timedelta(microseconds=int(value)))
    if logical == "io.debezium.time.NanoTimestamp":
        return pg_type, _ts_text(_EPOCH + timedelta(microseconds=int(value) // 1000))
    if logical == "io.debezium.time.ZonedTimestamp":
        dt = datetime.fromisoformat(str(value)).astimezone(UTC)
        return pg_type, _ts_text(dt.replace(tzinfo=None)) + "+00"
    if field.get("type") == "bytes":
        return pg_type, "\\x" + base64.b64decode(value).hex()
    return pg_type, value_text(value)


def placeholder_forms(placeholder: str) -> frozenset[str]:
    """Every text under which Debezium writes ``placeholder``: as is, and a bytea column's forms.

    Debezium puts the placeholder's UTF-8 bytes in a bytea column, which reach JSON as base64
    (``binary.handling.mode`` bytes/base64, plain or URL-safe) or hex (hex mode; ``\\x`` hex once
    decoded the way this module decodes bytes).
    """
    raw = placeholder.encode("utf-8")
    b64 = base64.b64encode(raw).decode("ascii")
    url = base64.urlsafe_b64encode(raw).decode("ascii")
    hx = raw.hex()
    return frozenset(
        {placeholder, b64, b64.rstrip("="), url, url.rstrip("="), hx, hx.upper(), "\\x" + hx, "\\x" + hx.upper()}
    )


def _unavailable(value: Any, forms: frozenset[str]) -> bool:
    """Whether a JSON value is Debezium's "unavailable" placeholder (an array column: an array of it)."""
    if isinstance(value, str):
        return value in forms
    if isinstance(value, list) and value:
        return all(isinstance(v, str) and v in forms for v in value)
    return False


def _fields(schema: Any, name: str) -> dict[str, dict[str, Any]] | None:
    if not isinstance(schema, dict):
        return None
    for f in schema.get("fields", []):
        if f.get("field") == name:
            return {c["field"]: c for c in f.get("fields", [])}
    return None


def _row(
    row: dict[str, Any] | None, fields: dict[str, dict[str, Any]] | None, forms: frozenset[str]
) -> tuple[list[Column], list[str]]:
    """Columns of a row image, and the names of the columns Debezium marked unavailable (left out)."""
    out, unavailable = [], []
    for name, value in (row or {}).items():
        if _unavailable(value, forms):
            # An unchanged TOASTed value the connector did not receive: absent, like wal2json's.
            unavailable.append(name)
            continue
        pg_type, text = _convert_value(value, fields.get(name) if fields is not None else None)
        out.append(Column(name, pg_type, text))
    return out, unavailable


def _unwrap(doc: Any) -> tuple[Any, Any, Any]:
    """(record key, Connect schema, envelope) of one document; the envelope is None for a tombstone."""
    key: Any = None
    if isinstance(doc, dict) and "value" in doc and "key" in doc:
        key_doc = doc["key"]
        key = key_doc.get("payload", key_doc) if isinstance(key_doc, dict) else None
        doc = doc["value"]
    if doc is None:
        return key, None, None
    if isinstance(doc, dict) and "payload" in doc:
        return key, doc.get("schema"), doc["payload"]
    return key, None, doc


def where(doc: Any) -> tuple[str, str]:
    """(schema, table) a message names, as far as it is readable; ("", "") when it names none."""
    try:
        src = _unwrap(doc)[2]["source"]
        schema, table = src["schema"], src["table"]
    except (KeyError, TypeError, IndexError):
        return "", ""
    return (schema, table) if isinstance(schema, str) and isinstance(table, str) and schema and table else ("", "")


def convert(
    doc: Any, origin: str, pk: dict[str, list[str]], placeholder: str = UNAVAILABLE_VALUE_PLACEHOLDER
) -> InputChange | None:
    """One document -> its change (None for a tombstone); a malformed one raises DecodeError saying what is wrong."""
    forms = placeholder_forms(placeholder)
    key, schema, env = _unwrap(doc)
    if env is None:
        return None  # tombstone after a delete (null value or payload): carries nothing
    if not isinstance(env, dict):
        raise DecodeError(f"not a Debezium envelope: a JSON {type(env).__name__}, not an object")
    if "op" not in env:
        raise DecodeError(
            "not a Debezium envelope: no 'op'", hint="expected op, before, after, source{lsn, txId, ts_ms}"
        )
    op = _OPS.get(env["op"]) if isinstance(env["op"], str) else None
    if op is None:
        raise DecodeError(f"unknown op {env['op']!r}", hint="Debezium ops are c, u, d, r and t")
    src = env.get("source")
    if not isinstance(src, dict):
        raise DecodeError("no 'source' object", hint="expected source{lsn, txId, ts_ms, schema, table}")
    for name in ("schema", "table"):
        if not isinstance(src.get(name), str) or not src[name]:
            raise DecodeError(f"no source.{name}")
    if "lsn" not in src:
        raise DecodeError("no source.lsn", hint="each message needs its change LSN")
    change_lsn = lsn_value(src["lsn"])
    table = f"{src['schema']}.{src['table']}"
    try:
        before, _ = _row(env.get("before"), _fields(schema, "before"), forms)
        after, unavailable = _row(env.get("after"), _fields(schema, "after"), forms)
        if unavailable and op in ("I", "R"):
            # An inserted (or snapshot) row has no previous value to keep: the placeholder is not data.
            raise DecodeError(
                f"{'insert' if op == 'I' else 'snapshot read'} carries the unavailable-value placeholder in "
                f"{', '.join(unavailable)}: a new row has no unchanged column"
            )
        keys = pk.get(table) or (list(key) if isinstance(key, dict) else [])
        identity: list[Column] = []
        if op in ("U", "D"):
            by_name = {c.name: c for c in before}
            after_types = {c.name: c.type for c in after}
            if keys and all(k in by_name for k in keys):
                identity = [by_name[k] for k in keys]
            elif keys and isinstance(key, dict):
                identity = [
                    Column(k, after_types.get(k) or _convert_value(key[k], None)[0], value_text(key[k])) for k in keys
                ]
            elif before:
                identity = before
        ts_ms = int(src.get("ts_ms") or env.get("ts_ms") or 0)
        ts = _ts_text(_EPOCH + timedelta(milliseconds=ts_ms)) + "+00"
        txid = src.get("txId")
        return InputChange(
            op=op,
            txn=str(txid) if txid is not None else f"lsn:{change_lsn}",
            xid=int(txid or 0),
            change_lsn=change_lsn,
            ts=ts,
            schema=str(src["schema"]),
            table=str(src["table"]),
            columns=after if op in ("I", "U", "R") else [],
            identity=identity,
            pk=keys,
            origin=origin,
        )
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        raise DecodeError(
            f"envelope not understood ({type(exc).__name__}: {exc})",
            hint="values must decode as the Connect schema says; expected op, before, after, source{lsn, txId, ts_ms}",
        ) from exc


def read(
    paths: Iterable[Path],
    pk: dict[str, list[str]],
    placeholder: str = UNAVAILABLE_VALUE_PLACEHOLDER,
    max_bytes: int = MAX_DECOMPRESSED,
) -> Iterator[InputItem]:
    """Changes of every file; a malformed message becomes a Quarantined item and reading goes on."""
    for path in paths:
        for d in json_documents(path, max_bytes):
            if d.error is not None:
                yield Quarantined(d.origin, d.error, d.raw)
                continue
            try:
                ch = convert(d.doc, d.origin, pk, placeholder)
            except DecodeError as exc:
                yield Quarantined(d.origin, exc.one_line(), d.raw, *where(d.doc))
                continue
            if ch is not None:
                ch.raw = d.raw
                yield ch
