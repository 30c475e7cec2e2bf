"""Landing files -> canonical change rows (Arrow), run inside Spark executors via mapInArrow.

A line that cannot be decoded becomes a row with ``reject_reason`` and its raw text, so a bad
line is quarantined instead of failing the load or being dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from loader.capture.records import COMMIT, OPERATIONS, ChangeRecord

CHANGE_ROW_DDL = (
    "landing_file STRING, line INT, op STRING, commit_lsn BIGINT, seq BIGINT, change_lsn BIGINT,"
    " xid BIGINT, ts STRING, src_schema STRING, src_table STRING,"
    " col_names ARRAY<STRING>, col_types ARRAY<STRING>, col_values ARRAY<STRING>,"
    " key_names ARRAY<STRING>, key_values ARRAY<STRING>, pk ARRAY<STRING>,"
    " reject_reason STRING, raw STRING"
)

_FIELDS = (
    "landing_file", "line", "op", "commit_lsn", "seq", "change_lsn", "xid", "ts", "src_schema",
    "src_table", "col_names", "col_types", "col_values", "key_names", "key_values", "pk",
    "reject_reason", "raw",
)


def record_row(file: str, line_no: int, rec: ChangeRecord) -> dict[str, Any]:
    return {
        "landing_file": file,
        "line": line_no,
        "op": OPERATIONS[rec.op],
        "commit_lsn": rec.commit_lsn,
        "seq": rec.seq,
        "change_lsn": rec.change_lsn,
        "xid": rec.xid,
        "ts": rec.ts,
        "src_schema": rec.schema,
        "src_table": rec.table,
        "col_names": [c.name for c in rec.columns],
        "col_types": [c.type for c in rec.columns],
        "col_values": [c.value for c in rec.columns],
        "key_names": [c.name for c in rec.identity],
        "key_values": [c.value for c in rec.identity],
        "pk": rec.pk,
        "reject_reason": None,
        "raw": None,
    }


def reject_row(file: str, line_no: int, raw: str, reason: str) -> dict[str, Any]:
    row: dict[str, Any] = {f: None for f in _FIELDS}
    row.update(landing_file=file, line=line_no, reject_reason=reason, raw=raw)
    # Keep whatever routing information survives so the reject names its table and LSN.
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict):
            row["src_schema"] = doc.get("schema")
            row["src_table"] = doc.get("table")
            row["commit_lsn"] = int(doc["lsn"]) if "lsn" in doc else None
            row["seq"] = int(doc["seq"]) if "seq" in doc else None
    except (ValueError, TypeError):
        pass
    return row


def decode_lines(file: str, lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Canonical rows of one landing file; commit markers are dropped, bad lines rejected."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = ChangeRecord.from_json(line)
        except (ValueError, KeyError, TypeError) as exc:
            yield reject_row(file, line_no, line, f"undecodable change record: {exc}")
            continue
        if rec.op == COMMIT:
            continue
        if rec.op in ("I", "U", "R") and not rec.columns:
            yield reject_row(file, line_no, line, f"{OPERATIONS[rec.op]} without column values")
            continue
        yield record_row(file, line_no, rec)


def make_decoder(settings_json: str, batch_rows: int = 20_000) -> Any:
    """The mapInArrow function: batches of landing_file names in, change rows out."""

    def decode(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from loader.capture.landing import open_landing
        from loader.config import LoaderSettings
        from loader.errors import LandingError

        settings = LoaderSettings.model_validate_json(settings_json)
        store = open_landing(settings)
        schema = _arrow_schema()
        buf: list[dict[str, Any]] = []
        for batch in batches:
            for name in batch.column(0).to_pylist():
                try:
                    rows: Iterator[dict[str, Any]] = decode_lines(name, store.read_lines(name))
                    for row in rows:
                        buf.append(row)
                        if len(buf) >= batch_rows:
                            yield pa.RecordBatch.from_pylist(buf, schema=schema)
                            buf = []
                except LandingError as exc:
                    buf.append(reject_row(name, 0, "", str(exc)))
        if buf:
            yield pa.RecordBatch.from_pylist(buf, schema=schema)

    return decode


def _arrow_schema() -> Any:
    import pyarrow as pa

    s, i64, i32 = pa.string(), pa.int64(), pa.int32()
    ls = pa.list_(s)
    return pa.schema(
        [
            ("landing_file", s), ("line", i32), ("op", s), ("commit_lsn", i64), ("seq", i64),
            ("change_lsn", i64), ("xid", i64), ("ts", s), ("src_schema", s), ("src_table", s),
            ("col_names", ls), ("col_types", ls), ("col_values", ls), ("key_names", ls),
            ("key_values", ls), ("pk", ls), ("reject_reason", s), ("raw", s),
        ]
    )
