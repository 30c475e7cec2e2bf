"""pgkafka-style JSON messages (the "Simple" format): one message per change.

    {"lsn": "0/16B3748", "xid": 563, "operation": "update", "table": "public.accounts",
     "timestamp": "2024-01-31 12:00:00.123456+00",
     "columns": ["id", "balance"], "types": ["integer", "numeric(12,2)"], "values": [1, "10.50"],
     "identity": {"columns": ["id"], "types": ["integer"], "values": [1]}}

``table`` may be ``schema.table`` or carry ``schema`` separately (default ``public``). ``lsn``
is the change's LSN (text or integer). Numbers keep their exact text. The key: ``--pk`` for a
table, else the identity columns seen on that table's updates/deletes (REPLICA IDENTITY DEFAULT
sends exactly the primary key).

A malformed message (not JSON, not an object, no lsn/xid/operation/table/timestamp, an unknown
operation, a bad LSN, columns/types/values of different lengths) is quarantined (see
``loader.inputs.common``) and the import goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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

_OPS = {
    "insert": "I",
    "update": "U",
    "delete": "D",
    "read": "R",
    "snapshot": "R",
    "truncate": "T",
    "I": "I",
    "U": "U",
    "D": "D",
    "R": "R",
    "T": "T",
}
_REQUIRED = ("lsn", "xid", "operation", "table", "timestamp")


def _cols(names: Any, types: Any, values: Any, what: str) -> list[Column]:
    if any(x is not None and not isinstance(x, list) for x in (names, types, values)):
        raise DecodeError(f"{what}: columns, types and values must be arrays")
    names, types, values = list(names or []), list(types or []), list(values or [])
    if not (len(names) == len(types) == len(values)):
        raise DecodeError(
            f"{what}: columns, types and values differ in length ({len(names)}, {len(types)}, {len(values)})"
        )
    return [Column(str(n), str(t), value_text(v)) for n, t, v in zip(names, types, values)]


def _table(doc: dict[str, Any]) -> tuple[str, str]:
    """``table`` as schema.table, or with ``schema`` beside it (default public)."""
    qualified = str(doc["table"])
    schema = str(doc.get("schema") or (qualified.split(".", 1)[0] if "." in qualified else "public"))
    table = qualified.split(".", 1)[1] if "." in qualified and "schema" not in doc else qualified
    return schema, table


def where(doc: Any) -> tuple[str, str]:
    """(schema, table) a message names, as far as it is readable; ("", "") when it names none."""
    if not isinstance(doc, dict) or not isinstance(doc.get("table"), str) or not doc["table"]:
        return "", ""
    schema, table = _table(doc)
    return (schema, table) if schema and table else ("", "")


def convert(doc: Any, origin: str) -> InputChange:
    """One message -> its change; a malformed one raises DecodeError saying what is wrong."""
    if not isinstance(doc, dict):
        raise DecodeError(f"not a pgkafka message: a JSON {type(doc).__name__}, not an object")
    missing = [k for k in _REQUIRED if k not in doc or doc[k] is None or doc[k] == ""]
    if missing:
        raise DecodeError(
            f"not a pgkafka message: no {', '.join(missing)}", hint="expected lsn, xid, operation, table, ..."
        )
    if not isinstance(doc["table"], str):
        raise DecodeError(f"table {doc['table']!r} is not a name")
    op = _OPS.get(doc["operation"]) if isinstance(doc["operation"], str) else None
    if op is None:
        raise DecodeError(f"unknown operation {doc['operation']!r}", hint="insert, update, delete, read, truncate")
    schema, table = _table(doc)
    ident = doc.get("identity") or {}
    if not isinstance(ident, dict):
        raise DecodeError("identity is not an object of columns, types and values")
    try:
        xid = int(doc["xid"])
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"xid {doc['xid']!r} is not a transaction id") from exc
    return InputChange(
        op=op,
        txn=str(xid),
        xid=xid,
        change_lsn=lsn_value(doc["lsn"]),
        ts=str(doc["timestamp"]),
        schema=schema,
        table=table,
        columns=_cols(doc.get("columns"), doc.get("types"), doc.get("values"), "new row"),
        identity=_cols(ident.get("columns"), ident.get("types"), ident.get("values"), "identity"),
        origin=origin,
    )


def read(paths: Iterable[Path], pk: dict[str, list[str]], max_bytes: int = MAX_DECOMPRESSED) -> Iterator[InputItem]:
    """Changes of every file, keyed; a malformed message becomes a Quarantined item and reading goes on."""
    items: list[InputItem] = []
    for path in paths:
        for d in json_documents(path, max_bytes):
            if d.error is not None:
                items.append(Quarantined(d.origin, d.error, d.raw))
                continue
            try:
                change = convert(d.doc, d.origin)
            except DecodeError as exc:
                items.append(Quarantined(d.origin, exc.one_line(), d.raw, *where(d.doc)))
                continue
            change.raw = d.raw
            items.append(change)
    changes = [c for c in items if isinstance(c, InputChange)]
    keys = dict(pk)
    for ch in changes:
        if ch.identity and f"{ch.schema}.{ch.table}" not in keys:
            keys[f"{ch.schema}.{ch.table}"] = [c.name for c in ch.identity]
    for ch in changes:
        ch.pk = keys.get(f"{ch.schema}.{ch.table}", [])
    yield from items
