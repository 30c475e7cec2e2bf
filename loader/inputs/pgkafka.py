"""pgkafka-style JSON messages (the "Simple" format): one message per change.

    {"lsn": "0/16B3748", "xid": 563, "operation": "update", "table": "public.accounts",
     "timestamp": "2024-01-31 12:00:00.123456+00",
     "columns": ["id", "balance"], "types": ["integer", "numeric(12,2)"], "values": [1, "10.50"],
     "identity": {"columns": ["id"], "types": ["integer"], "values": [1]}}

``table`` may be ``schema.table`` or carry ``schema`` separately (default ``public``). ``lsn``
is the change's LSN (text or integer). Numbers keep their exact text. The key: ``--pk`` for a
table, else the identity columns seen on that table's updates/deletes (REPLICA IDENTITY DEFAULT
sends exactly the primary key).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loader.capture.records import Column
from loader.errors import DecodeError
from loader.inputs.common import InputChange, json_documents, lsn_value, value_text

_OPS = {"insert": "I", "update": "U", "delete": "D", "read": "R", "snapshot": "R", "truncate": "T",
        "I": "I", "U": "U", "D": "D", "R": "R", "T": "T"}


def _cols(names: Any, types: Any, values: Any, origin: str) -> list[Column]:
    names, types, values = list(names or []), list(types or []), list(values or [])
    if not (len(names) == len(types) == len(values)):
        raise DecodeError(f"{origin}: columns, types and values differ in length")
    return [Column(str(n), str(t), value_text(v)) for n, t, v in zip(names, types, values)]


def convert(doc: dict[str, Any], origin: str) -> InputChange:
    try:
        op = _OPS[str(doc["operation"])]
        qualified = str(doc["table"])
        schema = str(doc.get("schema") or (qualified.split(".", 1)[0] if "." in qualified else "public"))
        table = qualified.split(".", 1)[1] if "." in qualified and "schema" not in doc else qualified
        ident = doc.get("identity") or {}
        return InputChange(
            op=op,
            txn=str(doc["xid"]),
            xid=int(doc["xid"]),
            change_lsn=lsn_value(doc["lsn"], origin),
            ts=str(doc["timestamp"]),
            schema=schema,
            table=table,
            columns=_cols(doc.get("columns"), doc.get("types"), doc.get("values"), origin),
            identity=_cols(ident.get("columns"), ident.get("types"), ident.get("values"), origin),
            origin=origin,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"{origin}: not a pgkafka message ({exc})", hint="expected lsn, xid, operation, table, ...") from exc


def read(paths: Iterable[Path], pk: dict[str, list[str]]) -> Iterator[InputChange]:
    changes = [convert(doc, origin) for path in paths for origin, doc in json_documents(path)]
    keys = dict(pk)
    for ch in changes:
        if ch.identity and f"{ch.schema}.{ch.table}" not in keys:
            keys[f"{ch.schema}.{ch.table}"] = [c.name for c in ch.identity]
    for ch in changes:
        ch.pk = keys.get(f"{ch.schema}.{ch.table}", [])
        yield ch
