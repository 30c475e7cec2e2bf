"""The canonical change record that every input format decodes to, and its landing-file JSON form.

One JSON object per line (see ``schemas/landing-change.v1.json``). All column values are kept as
PostgreSQL's text form (or JSON null), so nothing is lost between the source and the typed load:
numbers keep every digit, timestamps keep their offset, and a column absent from ``columns`` (an
unchanged TOASTed value) stays distinct from one present with value null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loader.lsn import ChangePosition

# Operation codes as they appear in landing files and in history's pg_operation column.
OPERATIONS = {"I": "insert", "U": "update", "D": "delete", "R": "read", "T": "truncate"}
COMMIT = "C"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    value: str | None = None


@dataclass
class ChangeRecord:
    """One committed change (or a transaction's commit marker, op 'C')."""

    op: str
    commit_lsn: int
    seq: int
    xid: int
    ts: str
    schema: str = ""
    table: str = ""
    change_lsn: int = 0
    columns: list[Column] = field(default_factory=list)
    identity: list[Column] = field(default_factory=list)
    pk: list[str] = field(default_factory=list)

    @property
    def position(self) -> ChangePosition:
        return ChangePosition(self.commit_lsn, self.seq)

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "op": self.op,
            "lsn": self.commit_lsn,
            "seq": self.seq,
            "xid": self.xid,
            "ts": self.ts,
        }
        if self.op != COMMIT:
            doc["change_lsn"] = self.change_lsn
            doc["schema"] = self.schema
            doc["table"] = self.table
            doc["columns"] = [[c.name, c.type, c.value] for c in self.columns]
            if self.identity:
                doc["identity"] = [[c.name, c.type, c.value] for c in self.identity]
            doc["pk"] = self.pk
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "ChangeRecord":
        doc = json.loads(line)
        if doc.get("v") != FORMAT_VERSION:
            raise ValueError(f"unsupported landing format version {doc.get('v')!r}")
        op = doc["op"]
        if op != COMMIT and op not in OPERATIONS:
            raise ValueError(f"unknown operation {op!r}")
        return cls(
            op=op,
            commit_lsn=int(doc["lsn"]),
            seq=int(doc["seq"]),
            xid=int(doc["xid"]),
            ts=str(doc["ts"]),
            schema=doc.get("schema", ""),
            table=doc.get("table", ""),
            change_lsn=int(doc.get("change_lsn", 0)),
            columns=[Column(*_col(c)) for c in doc.get("columns", [])],
            identity=[Column(*_col(c)) for c in doc.get("identity", [])],
            pk=list(doc.get("pk", [])),
        )


def _col(c: Any) -> tuple[str, str, str | None]:
    name, typ, value = c
    if value is not None and not isinstance(value, str):
        raise ValueError(f"column {name!r} value must be text or null, got {type(value).__name__}")
    return str(name), str(typ), value
