"""wal2json output saved to files (pg_recvlogical -f, or a Kafka sink of its messages).

Format version 2: one JSON document per action (B/I/U/D/T/C), decoded by the same decoder as
the live slot, so positions are the real commit LSN and sequence. Needs include-lsn (and
include-xids / include-timestamp for those fields). A transaction is read from its ``B`` to its
``C`` record within one file.

Format version 1: one document per transaction, ``{"xid", "nextlsn", "timestamp", "change": [...]}``
with ``columnnames/columntypes/columnvalues`` and ``oldkeys``. ``nextlsn`` (include-lsn=1) is the
end of the commit record: it orders transactions exactly and serves as their commit position.

What is quarantined (see ``loader.inputs.common``), one X record per bad message:
- a document that is not JSON, not an object, or neither format; a v2 change or commit record
  outside a transaction (its begin record is not in the file); an unknown v2 action; a v2 change
  the decoder does not understand (inside a transaction: only that change);
- a v1 change that is not understood (only that change), or a v1 document without a usable
  ``nextlsn``/``timestamp``/``xid`` (the whole document: nothing of it can be placed);
- a v2 transaction that cannot be placed: its begin record lacks lsn/nextlsn/timestamp, or it has no
  commit record (the file ends inside it, or the next begin comes first). Its changes are kept
  together as one X record naming the file and the reason (one per table it touched, so only those
  tables park; none readable: one without a table, which parks every table).
Non-transactional logical messages (``M`` outside a transaction, v1 ``message`` kind) are not
changes and are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loader.capture.wal2json import Wal2JsonDecoder, column_text
from loader.errors import DecodeError
from loader.inputs.common import (
    MAX_DECOMPRESSED,
    Document,
    InputChange,
    InputItem,
    Quarantined,
    json_documents,
    lsn_value,
)
from loader.landing.records import COMMIT, Column
from loader.lsn import parse_lsn

_KINDS = {"insert": "I", "update": "U", "delete": "D", "truncate": "T"}
_CHANGE_ACTIONS = ("I", "U", "D", "T")


def _table_of(doc: Any) -> tuple[str, str]:
    """(schema, table) of a change document when readable, else ("", "")."""
    if isinstance(doc, dict) and isinstance(doc.get("schema"), str) and isinstance(doc.get("table"), str):
        return (doc["schema"], doc["table"]) if doc["schema"] and doc["table"] else ("", "")
    return "", ""


def _quarantine_group(origin: str, what: str, raw: str, changes: list[Any]) -> Iterator[Quarantined]:
    """Several changes that cannot be placed: one X per table they name; one without table if any names none."""
    tables = [_table_of(c) for c in changes]
    named = sorted({t for t in tables if t[0]})
    for schema, table in named:
        yield Quarantined(origin, what, raw, schema, table)
    if not named or ("", "") in tables:
        yield Quarantined(origin, what, raw)


def _v1_cols(names: Any, types: Any, values: Any, what: str) -> list[Column]:
    names, types, values = list(names or []), list(types or []), list(values or [])
    if not (len(names) == len(types) == len(values)):
        raise DecodeError(
            f"{what} names, types and values differ in length ({len(names)}, {len(types)}, {len(values)})"
        )
    return [Column(str(n), str(t), column_text(str(t), v)) for n, t, v in zip(names, types, values)]


def _read_v1(d: Document, pk: dict[str, list[str]]) -> Iterator[InputItem]:
    doc = d.doc
    changes = doc.get("change")
    problem = None
    if not isinstance(changes, list):
        problem = "wal2json format 1 document whose 'change' is not a list"
        changes = []
    elif "nextlsn" not in doc:
        problem = "wal2json format 1 transaction without nextlsn (produce it with include-lsn=1)"
    elif not doc.get("timestamp"):
        problem = "wal2json format 1 transaction without timestamp (produce it with include-timestamp=1)"
    else:
        try:
            commit = lsn_value(doc["nextlsn"])
            xid = int(doc.get("xid", 0))
        except (DecodeError, TypeError, ValueError) as exc:
            problem = f"wal2json format 1 transaction without a usable nextlsn/xid: {exc}"
    if problem is not None:
        yield from _quarantine_group(
            d.origin, problem, d.raw, [c for c in changes if isinstance(c, dict) and c.get("kind") != "message"]
        )
        return
    for i, ch in enumerate(changes):
        if isinstance(ch, dict) and ch.get("kind") == "message":
            continue  # a logical message, not a change
        raw = json.dumps(ch, ensure_ascii=False)
        try:
            if not isinstance(ch, dict):
                raise DecodeError(f"a JSON {type(ch).__name__}, not an object")
            kind = _KINDS.get(str(ch.get("kind")))
            if kind is None:
                raise DecodeError(f"unknown kind {ch.get('kind')!r}")
            schema, table = _table_of(ch)
            if not table:
                raise DecodeError("no schema and table")
            old = ch.get("oldkeys") or {}
            table_pk = pk.get(f"{schema}.{table}") or [str(p) for p in (ch.get("pk") or {}).get("pknames", [])]
            yield InputChange(
                op=kind,
                txn=f"v1:{commit}",
                xid=xid,
                commit_lsn=commit,
                change_lsn=i,
                ts=str(doc["timestamp"]),
                schema=schema,
                table=table,
                columns=_v1_cols(ch.get("columnnames"), ch.get("columntypes"), ch.get("columnvalues"), "column"),
                identity=_v1_cols(old.get("keynames"), old.get("keytypes"), old.get("keyvalues"), "oldkeys"),
                pk=table_pk,
                origin=d.origin,
                raw=raw,
            )
        except (DecodeError, TypeError, ValueError, AttributeError) as exc:
            what = exc.one_line() if isinstance(exc, DecodeError) else f"{type(exc).__name__}: {exc}"
            yield Quarantined(
                d.origin, f"change #{i + 1} of the transaction not understood: {what}", raw, *_table_of(ch)
            )


def _begin_problem(doc: dict[str, Any]) -> str | None:
    """Why a v2 begin record cannot place its transaction, or None."""
    for name in ("lsn", "nextlsn"):
        value = doc.get(name)
        try:
            parse_lsn(value if isinstance(value, str) else "")
        except ValueError:
            return f"begin record without a usable {name} ({value!r}; produce it with include-lsn=1)"
    if not isinstance(doc.get("timestamp"), str) or not doc["timestamp"]:
        return "begin record without timestamp (produce it with include-timestamp=1)"
    try:
        int(doc.get("xid", 0))
    except (TypeError, ValueError):
        return f"begin record with xid {doc.get('xid')!r}"
    return None


def _v2_transaction(docs: list[Document], pk: dict[str, list[str]]) -> list[InputItem]:
    """One whole v2 transaction (B .. C) -> its changes, with the changes the decoder quarantined."""
    problem = _begin_problem(docs[0].doc)
    if problem is None:
        out: list[InputItem] = []
        decoder = Wal2JsonDecoder()
        try:
            for d in docs:
                for rec in decoder.feed(json.dumps(d.doc)):
                    if rec.op == COMMIT:
                        continue
                    if rec.op == "X":
                        named = bool(rec.schema and rec.table)
                        out.append(
                            Quarantined(
                                d.origin, rec.reason, d.raw, rec.schema if named else "", rec.table if named else ""
                            )
                        )
                        continue
                    out.append(
                        InputChange(
                            op=rec.op,
                            txn=f"v2:{rec.commit_lsn}",
                            xid=rec.xid,
                            commit_lsn=rec.commit_lsn,
                            change_lsn=rec.change_lsn or rec.seq,
                            ts=rec.ts,
                            schema=rec.schema,
                            table=rec.table,
                            columns=rec.columns,
                            identity=rec.identity,
                            pk=pk.get(rec.qualified_table) or rec.pk,
                            origin=d.origin,
                            raw=d.raw,
                        )
                    )
            return out
        except DecodeError as exc:
            problem = exc.one_line()  # the decoder refused the stream itself: the transaction cannot be placed
    changes = [d.doc for d in docs if d.doc.get("action") in _CHANGE_ACTIONS]
    return list(_quarantine_group(docs[0].origin, f"transaction cannot be placed: {problem}", _joined(docs), changes))


def _joined(docs: list[Document]) -> str:
    return "\n".join(d.raw for d in docs)


def _incomplete(docs: list[Document], why: str) -> Iterator[Quarantined]:
    changes = [d.doc for d in docs if d.doc.get("action") in _CHANGE_ACTIONS]
    n = len(changes)
    what = (
        f"transaction begun here has no commit record ({why}): its {n} change{'' if n == 1 else 's'} cannot be imported"
    )
    yield from _quarantine_group(docs[0].origin, what, _joined(docs), changes)


def read(paths: Iterable[Path], pk: dict[str, list[str]], max_bytes: int = MAX_DECOMPRESSED) -> Iterator[InputItem]:
    """Changes of every file; a malformed message becomes a Quarantined item and reading goes on."""
    for path in paths:
        txn: list[Document] | None = None  # the open v2 transaction: its B record and what followed
        for d in json_documents(path, max_bytes):
            if d.error is not None:
                yield Quarantined(d.origin, d.error, d.raw)
                continue
            doc = d.doc
            if not isinstance(doc, dict):
                yield Quarantined(
                    d.origin, f"not a wal2json document: a JSON {type(doc).__name__}, not an object", d.raw
                )
            elif "action" in doc:
                action = doc["action"]
                if action == "B":
                    if txn is not None:
                        yield from _incomplete(txn, f"the next begin record comes first, at {d.origin}")
                    txn = [d]
                elif txn is not None:
                    txn.append(d)  # the decoder deals with unknown actions inside a transaction
                    if action == "C":
                        yield from _v2_transaction(txn, pk)
                        txn = None
                elif action == "M":
                    continue  # a non-transactional logical message: not a change
                elif action in (*_CHANGE_ACTIONS, "C"):
                    yield Quarantined(
                        d.origin,
                        f"wal2json {action!r} record outside a transaction (no begin record before it in this file)",
                        d.raw,
                        *_table_of(doc),
                    )
                else:
                    yield Quarantined(d.origin, f"unknown wal2json action {action!r}", d.raw, *_table_of(doc))
            elif "change" in doc:
                yield from _read_v1(d, pk)
            else:
                yield Quarantined(
                    d.origin,
                    "neither wal2json format 1 (no 'change') nor 2 (no 'action'); check the --format option",
                    d.raw,
                    *_table_of(doc),
                )
        if txn is not None:
            yield from _incomplete(txn, f"{path} ends inside it")
