"""wal2json output saved to files (pg_recvlogical -f, or a Kafka sink of its messages).

Format version 2: one JSON document per action (B/I/U/D/T/C), decoded by the same decoder as
the live slot, so positions are the real commit LSN and sequence. Needs include-lsn (and
include-xids / include-timestamp for those fields).

Format version 1: one document per transaction, ``{"xid", "nextlsn", "timestamp", "change": [...]}``
with ``columnnames/columntypes/columnvalues`` and ``oldkeys``. ``nextlsn`` (include-lsn=1) is the
end of the commit record: it orders transactions exactly and serves as their commit position.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loader.capture.records import COMMIT, Column
from loader.capture.wal2json import Wal2JsonDecoder, column_text
from loader.errors import DecodeError
from loader.inputs.common import InputChange, json_documents, lsn_value

_KINDS = {"insert": "I", "update": "U", "delete": "D", "truncate": "T"}


def _v1_cols(names: Any, types: Any, values: Any) -> list[Column]:
    return [Column(str(n), str(t), column_text(str(t), v)) for n, t, v in zip(names or [], types or [], values or [])]


def _read_v1(origin: str, doc: dict[str, Any], pk: dict[str, list[str]]) -> Iterator[InputChange]:
    if "nextlsn" not in doc:
        raise DecodeError(f"{origin}: wal2json format 1 transaction without nextlsn", hint="produce it with include-lsn=1")
    if not doc.get("timestamp"):
        raise DecodeError(f"{origin}: wal2json format 1 transaction without timestamp", hint="produce it with include-timestamp=1")
    commit = lsn_value(doc["nextlsn"], origin)
    xid = int(doc.get("xid", 0))
    for i, ch in enumerate(doc.get("change", [])):
        kind = _KINDS.get(ch.get("kind", ""))
        if kind is None:
            continue  # logical messages
        old = ch.get("oldkeys") or {}
        table_pk = pk.get(f"{ch['schema']}.{ch['table']}") or list((ch.get("pk") or {}).get("pknames", []))
        yield InputChange(
            op=kind, txn=f"v1:{commit}", xid=xid, commit_lsn=commit, change_lsn=i, ts=str(doc.get("timestamp", "")),
            schema=ch["schema"], table=ch["table"],
            columns=_v1_cols(ch.get("columnnames"), ch.get("columntypes"), ch.get("columnvalues")),
            identity=_v1_cols(old.get("keynames"), old.get("keytypes"), old.get("keyvalues")),
            pk=table_pk, origin=origin,
        )


def read(paths: Iterable[Path], pk: dict[str, list[str]]) -> Iterator[InputChange]:
    for path in paths:
        decoder = Wal2JsonDecoder()
        for origin, doc in json_documents(path):
            if not isinstance(doc, dict):
                raise DecodeError(f"{origin}: not a wal2json document")
            if "action" in doc:
                for rec in decoder.feed(json.dumps(doc)):
                    if rec.op == COMMIT:
                        continue
                    yield InputChange(
                        op=rec.op, txn=f"v2:{rec.commit_lsn}", xid=rec.xid, commit_lsn=rec.commit_lsn,
                        change_lsn=rec.change_lsn or rec.seq, ts=rec.ts, schema=rec.schema, table=rec.table,
                        columns=rec.columns, identity=rec.identity,
                        pk=pk.get(rec.qualified_table) or rec.pk, origin=origin,
                    )
            elif "change" in doc:
                yield from _read_v1(origin, doc, pk)
            else:
                raise DecodeError(f"{origin}: neither wal2json format 1 nor 2", hint="check the --format option")
        if decoder.in_transaction:
            raise DecodeError(f"{path}: ends inside a transaction (no commit record)", hint="import whole transactions")
