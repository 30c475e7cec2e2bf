"""Other inputs (pgkafka messages, wal2json v1/v2 files, Debezium envelopes) -> landing -> history/current.

The input files are written by the test from real changes of a real PostgreSQL: wal2json's own
output of a second slot (format 1 and 2), and pgkafka / Debezium messages built from it the way a
producer would, with duplicates and out-of-order files as Kafka delivers them.

The quarantine and Debezium-placeholder tests below need neither PostgreSQL nor Spark: their
inputs are written by hand, each bad message beside good ones, and the landing files are read back.
"""

from __future__ import annotations

import base64
import json
import random
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loader.capture import slot as slots
from loader.capture.wal2json import WAL2JSON_OPTIONS, parse_json_exact
from loader.config import LoaderSettings
from loader.errors import DecodeError
from loader.inputs.common import QUARANTINE_STATE, ImportResult
from loader.inputs.debezium import UNAVAILABLE_VALUE_PLACEHOLDER
from loader.inputs.importer import import_files
from loader.landing.records import COMMIT, ChangeRecord
from loader.landing.store import LocalLandingStore
from loader.load.decode import decode_file
from tests.harness import ROOT, Env

V1_OPTIONS = (
    "format-version",
    "1",
    "include-lsn",
    "1",
    "include-xids",
    "1",
    "include-timestamp",
    "1",
    "include-types",
    "1",
    "include-pk",
    "1",
)


def make_changes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO accounts SELECT g, g * 1.5, '2024-01-01 10:00:00'::timestamp + g * interval '1.5 s',"
            " 'n' || g, g % 2 = 0 FROM generate_series(1, 40) g"
        )
        for i in range(1, 15):
            c.execute("UPDATE accounts SET balance = balance + 0.25, note = NULL WHERE id = %s", (i,))
        c.execute("UPDATE accounts SET id = 1000 WHERE id = 20")  # key change
        c.execute("DELETE FROM accounts WHERE id IN (3, 4, 5)")
        with c.transaction():
            c.execute("INSERT INTO accounts VALUES (2000, 99999999999999.99, NULL, 'ü😀', true)")
            c.execute("UPDATE accounts SET note = 'same txn' WHERE id = 2000")
            c.execute("DELETE FROM accounts WHERE id = 30")


def setup_source(env: Env) -> tuple[list[str], list[str]]:
    """Create the table, a slot that records wal2json v1 and v2 output, make changes; return both outputs."""
    env.sql(
        "CREATE TABLE accounts (id integer PRIMARY KEY, balance numeric(20,2), opened timestamp, note text, active boolean)"
    )
    aux = f"aux_{env.uid}"
    env.sql("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (aux,))
    try:
        make_changes(env.settings.source.dsn)
        with slots.connect(env.settings.source.dsn) as c:

            def peek(opts: tuple[str, ...]) -> list[str]:
                ph = ", ".join(["%s"] * len(opts))
                return [
                    r[0]
                    for r in c.execute(
                        f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {ph})", (aux, *opts)
                    )
                ]

            return peek(WAL2JSON_OPTIONS), peek(V1_OPTIONS)
    finally:
        env.sql("SELECT pg_drop_replication_slot(%s)", (aux,))


def v2_changes(v2: list[str]) -> list[dict[str, Any]]:
    """wal2json v2 change documents with their transaction's B record."""
    out, begin = [], None
    for line in v2:
        doc = parse_json_exact(line)
        if doc["action"] == "B":
            begin = doc
        elif doc["action"] in "IUD":
            out.append({**doc, "_begin": begin})
    return out


def to_pgkafka(doc: dict[str, Any]) -> dict[str, Any]:
    cols = doc.get("columns", [])
    ident = doc.get("identity", [])
    return {
        "lsn": doc["lsn"],
        "xid": int(doc["xid"]),
        "timestamp": doc["timestamp"],
        "operation": {"I": "insert", "U": "update", "D": "delete"}[doc["action"]],
        "table": f"{doc['schema']}.{doc['table']}",
        "columns": [c["name"] for c in cols],
        "types": [c["type"] for c in cols],
        # Numbers as JSON numbers with their exact digits (1.50 stays 1.50), as a producer writes them.
        "values": [
            RAW + c["value"] if c["type"] in ("integer", "numeric(20,2)") and c["value"] is not None else c["value"]
            for c in cols
        ],
        **(
            {
                "identity": {
                    "columns": [c["name"] for c in ident],
                    "types": [c["type"] for c in ident],
                    "values": [int(c["value"]) for c in ident],
                }
            }
            if ident
            else {}
        ),
    }


def _dbz_field(name: str, pg_type: str) -> dict[str, Any]:
    if pg_type == "integer":
        return {"field": name, "type": "int32", "optional": False}
    if pg_type.startswith("numeric"):
        return {
            "field": name,
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "20"},
        }
    if pg_type.startswith("timestamp"):
        return {"field": name, "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"}
    if pg_type == "boolean":
        return {"field": name, "type": "boolean", "optional": True}
    return {"field": name, "type": "string", "optional": True}


def _dbz_value(pg_type: str, text: Any) -> Any:
    if text is None:
        return None
    if pg_type == "integer":
        return int(text)
    if pg_type.startswith("numeric"):
        unscaled = int(Decimal(str(text)).scaleb(2))
        return base64.b64encode(unscaled.to_bytes(16, "big", signed=True)).decode()
    if pg_type.startswith("timestamp"):
        dt = datetime.fromisoformat(str(text))
        return int((dt - datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    if pg_type == "boolean":
        return text is True or text == "true"
    return text


def to_debezium(doc: dict[str, Any], types: dict[str, str], with_key: bool) -> dict[str, Any]:
    cols = {c["name"]: c["value"] for c in doc.get("columns", [])}
    ident = {c["name"]: c["value"] for c in doc.get("identity", [])}
    row_schema = {"type": "struct", "fields": [_dbz_field(n, t) for n, t in types.items()]}
    before = {n: _dbz_value(types[n], ident.get(n)) for n in types} if ident else None
    after = {n: _dbz_value(types[n], cols.get(n)) for n in types} if cols else None
    ts = datetime.fromisoformat(doc["timestamp"].replace("+00", "+00:00"))
    lsn = slots.parse_lsn(doc["lsn"])
    env = {
        "schema": {"type": "struct", "fields": [{**row_schema, "field": "before"}, {**row_schema, "field": "after"}]},
        "payload": {
            "before": before,
            "after": after,
            "op": {"I": "c", "U": "u", "D": "d"}[doc["action"]],
            "source": {
                "connector": "postgresql",
                "schema": doc["schema"],
                "table": doc["table"],
                "lsn": lsn,
                "txId": int(doc["xid"]),
                "ts_ms": int(ts.timestamp() * 1000),
            },
            "ts_ms": int(ts.timestamp() * 1000),
        },
    }
    if with_key:
        key = {"id": int((ident or cols)["id"])}
        return {"key": {"payload": key}, "value": env}
    return env


RAW = "\u0001raw:"


def write_lines(path: Path, docs: list[Any]) -> Path:
    import re

    def line(d: Any) -> str:
        return re.sub(r'"\\u0001raw:([^"]*)"', r"\1", json.dumps(d))

    path.write_text("".join(line(d) + "\n" for d in docs), encoding="utf-8")
    return path


def write_raw(path: Path, lines: list[str]) -> Path:
    """wal2json output exactly as pg_recvlogical writes it (re-encoding would round 1.50 to 1.5)."""
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def input_files(env: Env, fmt: str, v2: list[str], v1: list[str], tmp: Path) -> tuple[list[Path], list[str]]:
    """Files of one format holding the same changes: split in two, shuffled, with duplicates."""
    rng = random.Random(fmt)
    tmp.mkdir(parents=True, exist_ok=True)
    pk: list[str] = []
    if fmt == "wal2json-v2":
        half = next(i for i in range(len(v2) // 2, len(v2)) if '"action":"C"' in v2[i]) + 1
        return [write_raw(tmp / "b.json", v2[half:]), write_raw(tmp / "a.json", v2[:half])], pk
    if fmt == "wal2json-v1":
        return [
            write_raw(tmp / "part-1.json", v1[len(v1) // 2 :]),
            write_raw(tmp / "part-0.json", v1[: len(v1) // 2]),
        ], pk
    changes = v2_changes(v2)
    if fmt == "pgkafka":
        msgs = [to_pgkafka(d) for d in changes]
    else:
        types = {c["name"]: c["type"] for c in changes[0]["columns"]}
        msgs = [to_debezium(d, types, with_key=i % 2 == 0) for i, d in enumerate(changes)]
        pk = []  # half the records carry the Kafka key; that is enough to learn it
        pk = ["public.accounts=id"]
    msgs = msgs + rng.sample(msgs, 10)  # at-least-once delivery
    rng.shuffle(msgs)
    return [
        write_lines(tmp / "topic+0+0000.json", msgs[: len(msgs) // 2]),
        write_lines(tmp / "topic+0+0100.json", msgs[len(msgs) // 2 :]),
    ], pk


def landed(store: LocalLandingStore) -> list[ChangeRecord]:
    return [r for f in store.files() for r in store.read_records(f.name)]


FORMATS = ["wal2json-v2", "wal2json-v1", "pgkafka", "debezium"]


def test_every_input_format_lands_the_same_changes_as_capture(env: Env) -> None:
    env.capture()  # the reference: the live slot sees the same changes
    v2, v1 = setup_source(env)
    env.capture()
    ref_store = LocalLandingStore(Path(env.settings.landing.url.removeprefix("file://")) / env.settings.source.slot)
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "landing-change.v1.json").read_text()))
    reference = [
        (r.op, r.table, [(c.name, c.value) for c in r.columns], [(c.name, c.value) for c in r.identity])
        for r in landed(ref_store)
        if r.op != COMMIT
    ]
    for fmt in FORMATS:
        files, pk = input_files(env, fmt, v2, v1, env.tmp / "in" / fmt)
        store = LocalLandingStore(env.tmp / "out" / fmt)
        res = import_files(env.settings, fmt.split("-")[0], [str(f) for f in files], pk, store=store)
        assert res.duplicates == (10 if fmt in ("pgkafka", "debezium") else 0), fmt
        recs = landed(store)
        positions = [r.position for r in recs]
        assert positions == sorted(positions) and len(set(positions)) == len(positions), fmt
        got = [
            (r.op, r.table, [(c.name, c.value) for c in r.columns], [(c.name, c.value) for c in r.identity])
            for r in recs
            if r.op != COMMIT
        ]
        assert got == reference, fmt
        assert all(r.pk == ["id"] for r in recs if r.op != COMMIT), fmt
        for f in store.files():
            for line in store.read_lines(f.name):
                validator.validate(json.loads(line))
        again = import_files(env.settings, fmt.split("-")[0], [str(f) for f in files], pk, store=store)
        assert again.changes == 0 and again.already_landed == res.transactions, f"{fmt}: re-import must be a no-op"


def test_imported_debezium_and_pgkafka_files_load_and_merge_to_the_source_state(env: Env) -> None:
    v2, v1 = setup_source(env)
    base = env.settings
    for fmt in ("debezium", "pgkafka"):
        files, pk = input_files(env, fmt, v2, v1, env.tmp / "in" / fmt)
        env.settings = base.model_copy(
            update={
                "source": base.source.model_copy(update={"slot": f"import_{fmt}"}),
                "catalog": base.catalog.model_copy(
                    update={
                        "history_namespace": f"h_{fmt}_{env.uid}",
                        "current_namespace": f"c_{fmt}_{env.uid}",
                        "loader_namespace": f"l_{fmt}_{env.uid}",
                    }
                ),
            }
        )
        import_files(env.settings, fmt, [str(f) for f in files], pk)
        env.load()
        env.merge()
        env.assert_reconciled()
        hist = env.history("public.accounts")
        assert hist.count() == len(v2_changes(v2))
    env.settings = base


def test_debezium_logical_types_become_postgres_text() -> None:
    from loader.inputs.debezium import _convert_value

    dec = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "3"}}
    raw = base64.b64encode((-1234567).to_bytes(4, "big", signed=True)).decode()
    assert _convert_value(raw, dec) == ("numeric", "-1234.567")
    assert _convert_value("19782", {"type": "int32", "name": "io.debezium.time.Date"}) == ("date", "2024-02-29")
    assert _convert_value("1706702400123456", {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}) == (
        "timestamp without time zone",
        "2024-01-31 12:00:00.123456",
    )
    assert _convert_value(
        "2024-01-31T12:00:00.5+05:30", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
    ) == ("timestamp with time zone", "2024-01-31 06:30:00.5+00")
    assert _convert_value("45296000001", {"type": "int64", "name": "io.debezium.time.MicroTime"}) == (
        "time without time zone",
        "12:34:56.000001",
    )
    assert _convert_value("AP8=", {"type": "bytes"}) == ("bytea", "\\x00ff")
    src_type = {"type": "string", "parameters": {"__debezium.source.column.type": "UUID"}}
    assert _convert_value("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", src_type)[0] == "uuid"
    assert _convert_value(None, dec) == ("numeric", None)


# --- quarantine of bad messages, Debezium's unavailable placeholder (pure: no PostgreSQL, no Spark) ---------

TS = "2024-01-31 12:00:00+00"
Entry = tuple[str | bytes | list[str], str | tuple[str, str] | None]


def _settings(tmp: Path) -> LoaderSettings:
    return LoaderSettings.model_validate({"landing": {"url": (tmp / "land").as_uri()}})


def _write(path: Path, entries: list[Entry]) -> dict[str, tuple[str, str]]:
    """Write one input file; return {origin: (reason fragment, raw text)} of its bad messages.

    An entry is a line (or the lines of one multi-line bad message) and None for a good message,
    else the fragment its X record's reason must hold (or (fragment, raw) when the raw text is not
    the lines themselves).
    """
    bad: dict[str, tuple[str, str]] = {}
    out, line = b"", 1
    for text, expect in entries:
        lines: list[str | bytes] = list(text) if isinstance(text, list) else [text]
        data = b"".join((x if isinstance(x, bytes) else x.encode("utf-8")) + b"\n" for x in lines)
        if expect is not None:
            fragment, raw = (
                expect
                if isinstance(expect, tuple)
                else (expect, data.rstrip(b"\n").decode("utf-8", "backslashreplace"))
            )
            bad[f"{path}:{line}"] = (fragment, raw)
        out += data
        line += len(lines)
    path.write_bytes(out)
    return bad


def _j(doc: Any) -> str:
    return json.dumps(doc)


def _pgk(lsn: Any, xid: Any, op: str, values: list[Any], identity: int | None = None, **extra: Any) -> str:
    doc: dict[str, Any] = {
        "lsn": lsn,
        "xid": xid,
        "operation": op,
        "table": "public.t",
        "timestamp": TS,
        "columns": ["id", "v"][: len(values)],
        "types": ["integer", "text"][: len(values)],
        "values": values,
    }
    if identity is not None:
        doc["identity"] = {"columns": ["id"], "types": ["integer"], "values": [identity]}
    doc.update(extra)
    return _j({k: v for k, v in doc.items() if v is not ...})


def _dbz(
    op: str,
    lsn: int,
    tx: int,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    table: str = "t",
    schema: dict[str, Any] | None = None,
    key: dict[str, Any] | None = None,
) -> str:
    env: dict[str, Any] = {
        "before": before,
        "after": after,
        "op": op,
        "source": {"schema": "public", "table": table, "lsn": lsn, "txId": tx, "ts_ms": 1706702400000},
    }
    doc: dict[str, Any] = {"schema": schema, "payload": env} if schema is not None else env
    return _j({"key": {"payload": key}, "value": doc} if key is not None else doc)


def _begin(lsn: str, xid: int, **extra: Any) -> str:
    return _j({"action": "B", "xid": xid, "lsn": lsn, "nextlsn": lsn[:-1] + "8", "timestamp": TS, **extra})


def _w2_insert(i: int, **extra: Any) -> str:
    doc = {
        "action": "I",
        "schema": "public",
        "table": "t",
        "columns": [{"name": "id", "type": "integer", "value": i}],
        "pk": [{"name": "id", "type": "integer"}],
        **extra,
    }
    return _j({k: v for k, v in doc.items() if v is not ...})


COMMIT_V2 = _j({"action": "C"})


def pgkafka_inputs(tmp: Path) -> tuple[list[Path], dict[str, tuple[str, str]], int]:
    """pgkafka files: 5 good changes in 4 transactions, 10 bad messages between them."""
    a, b = tmp / "topic+0+0000.json", tmp / "topic+0+0100.json"
    bad = _write(
        a,
        [
            (_pgk("0/1000", 500, "insert", [1, "a"]), None),
            ('{"lsn": "0/1500", "xid": 9, "operation": "ins', "not JSON"),  # truncated
            ("[1, 2, 3]", "not an object"),
            (_pgk(..., 9, "insert", [7, "x"]), "no lsn"),
            (_pgk("banana", 9, "insert", [7, "x"]), "'banana' is not an LSN"),
            (_pgk("0/2000", 501, "update", [1, "b"], identity=1), None),
            (_pgk("0/1600", 9, "upsert", [7, "x"]), "unknown operation 'upsert'"),
        ],
    )
    bad |= _write(
        b,
        [
            (_pgk("0/1700", 9, "insert", [7, "x"], table=...), "no table"),
            (_pgk("0/3000", 502, "insert", [2, "c"]), None),
            (
                _j(
                    {
                        "lsn": "0/1800",
                        "xid": 9,
                        "operation": "insert",
                        "table": "public.t",
                        "timestamp": TS,
                        "columns": ["id", "v"],
                        "types": ["integer"],
                        "values": [7, "x"],
                    }
                ),
                "differ in length",
            ),
            (_pgk("0/3010", 502, "insert", [3, "d"]), None),
            (
                (
                    b'{"lsn": "0/1900", "xid": 9, "operation": "insert", "table": "public.t", "timestamp": "x", "columns": ["v"], '
                    b'"types": ["text"], "values": ["caf\xe9"]}'
                ),
                "not UTF-8",
            ),
            (_pgk("0/1A00", 9, "delete", []), "without the old key"),
            (_pgk("0/1B00", "abc", "insert", [7, "x"]), "not a transaction id"),
            (_pgk("0/4000", 503, "delete", [], identity=2), None),
        ],
    )
    return [a, b], bad, 5


def debezium_inputs(tmp: Path) -> tuple[list[Path], dict[str, tuple[str, str]], int]:
    """Debezium files: 3 good changes, 7 bad messages."""
    dec = {
        "type": "struct",
        "fields": [
            {
                "field": "after",
                "type": "struct",
                "fields": [
                    {"field": "id", "type": "int32"},
                    {
                        "field": "amount",
                        "type": "bytes",
                        "name": "org.apache.kafka.connect.data.Decimal",
                        "parameters": {"scale": "2"},
                    },
                ],
            },
        ],
    }
    f = tmp / "dbz+0+0000.json"
    bad = _write(
        f,
        [
            (_dbz("c", 20000, 800, None, {"id": 1, "v": "a"}, key={"id": 1}), None),
            (_dbz("c", 19000, 7, None, {"id": 5, "v": UNAVAILABLE_VALUE_PLACEHOLDER}), "placeholder in v"),
            (_dbz("x", 19001, 7, None, {"id": 5}), "unknown op 'x'"),
            (_j({"before": None, "after": {"id": 5}, "op": "c"}), "no 'source'"),
            (_dbz("u", 20100, 801, {"id": 1}, {"id": 1, "v": "b"}, key={"id": 1}), None),
            (
                _j(
                    {
                        "before": None,
                        "after": {"id": 5},
                        "op": "c",
                        "source": {"schema": "public", "table": "t", "txId": 7},
                    }
                ),
                "no source.lsn",
            ),
            (_dbz("c", 19002, 7, None, {"id": 5, "amount": "not base64!"}, schema=dec), "envelope not understood"),
            ('"just a string"', "not an object"),
            (
                _dbz(
                    "r",
                    19003,
                    7,
                    None,
                    {"id": 5, "v": base64.b64encode(UNAVAILABLE_VALUE_PLACEHOLDER.encode()).decode()},
                ),
                "snapshot read carries the unavailable-value placeholder",
            ),
            (_dbz("d", 20200, 802, {"id": 1}, None, key={"id": 1}), None),
            (_j({"key": {"payload": {"id": 1}}, "value": None}), None),  # tombstone: nothing, not bad
        ],
    )
    return [f], bad, 3


def wal2json_inputs(tmp: Path) -> tuple[list[Path], dict[str, tuple[str, str]], int]:
    """wal2json v1 + v2 files: 4 good changes, 8 bad messages (one of them a transaction cut off by the file's end)."""
    a, b = tmp / "recv-a.json", tmp / "recv-b.json"
    bad_change = {"kind": "upsert", "schema": "public", "table": "t"}
    bad = _write(
        a,
        [
            (_begin("0/5000", 600), None),
            (_w2_insert(1, lsn="0/4F00"), None),
            (_w2_insert(9, table=...), "not understood"),  # a change the decoder cannot read, inside a good transaction
            (COMMIT_V2, None),
            (_w2_insert(8), "outside a transaction"),
            (_j({"action": "Z", "schema": "public", "table": "t"}), "unknown wal2json action 'Z'"),
            (
                _j(
                    {
                        "xid": 700,
                        "timestamp": TS,
                        "change": [
                            {
                                "kind": "insert",
                                "schema": "public",
                                "table": "t",
                                "columnnames": ["id"],
                                "columntypes": ["integer"],
                                "columnvalues": [7],
                            }
                        ],
                    }
                ),
                "without nextlsn",
            ),
            (
                _j(
                    {
                        "xid": 701,
                        "nextlsn": "0/6030",
                        "timestamp": TS,
                        "change": [
                            {
                                "kind": "insert",
                                "schema": "public",
                                "table": "t",
                                "columnnames": ["id"],
                                "columntypes": ["integer"],
                                "columnvalues": [2],
                            },
                            bad_change,
                        ],
                    }
                ),
                ("unknown kind 'upsert'", json.dumps(bad_change)),
            ),
            (_j({"foo": 1}), "neither wal2json format"),
            ([_j({"action": "B", "xid": 602, "timestamp": TS}), _w2_insert(6), COMMIT_V2], "cannot be placed"),
        ],
    )
    bad |= _write(
        b,
        [
            (_begin("0/7000", 603), None),
            (_w2_insert(3), None),
            (_w2_insert(4), None),
            (COMMIT_V2, None),
            ([_begin("0/8000", 604), _w2_insert(5)], "no commit record"),
        ],
    )
    return [a, b], bad, 4


QUARANTINE_INPUTS = {"pgkafka": pgkafka_inputs, "debezium": debezium_inputs, "wal2json": wal2json_inputs}


def check_quarantine(store: LocalLandingStore, res: ImportResult, bad: dict[str, tuple[str, str]], good: int) -> int:
    """Every good change landed, one X per bad message in one control transaction before the first import's; its commit LSN."""
    recs = landed(store)
    positions = [r.position for r in recs]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    xs = [r for r in recs if r.op == "X"]
    assert res.quarantined == len(bad) == len(xs), res.summary()
    by_origin = {r.reason.split(": ", 1)[0]: r for r in xs}
    assert set(by_origin) == set(bad)
    for origin, (fragment, raw) in bad.items():
        x = by_origin[origin]
        assert fragment in x.reason, (origin, x.reason)
        assert x.raw == raw, origin
    changes = [r for r in recs if r.op in "IUDRT" and r.op != COMMIT]
    assert res.changes == len(changes) == good
    # One control transaction first: X records at (first commit - 1, 1..k), then its commit marker.
    first_commit = min(r.commit_lsn for r in changes)
    k = len(xs)
    assert [r.op for r in recs[: k + 1]] == ["X"] * k + [COMMIT]
    assert [r.position for r in recs[: k + 1]] == [(first_commit - 1, s) for s in range(1, k + 2)]
    assert all(r.xid == 0 and r.ts for r in recs[: k + 1])
    assert all(r.commit_lsn >= first_commit for r in recs[k + 1 :])
    # Every landing file has its header, counting the X records under their tables.
    for f in store.files():
        header = json.loads(next(iter(store.read_lines(f.name))))
        assert header["op"] == "H"
    return first_commit


@pytest.mark.parametrize("fmt", sorted(QUARANTINE_INPUTS))
def test_bad_messages_are_quarantined_and_the_import_goes_on(tmp_path: Path, fmt: str) -> None:
    files, bad, good = QUARANTINE_INPUTS[fmt](tmp_path)
    store = LocalLandingStore(tmp_path / "land")
    res = import_files(_settings(tmp_path), fmt, [str(f) for f in files], store=store)
    check_quarantine(store, res, bad, good)
    assert f"{len(bad)} bad messages quarantined" in res.summary()

    # The load turns each X record into a reject naming its table; an X without one parks every table.
    rows = [row for f in store.files() for row in decode_file(f.name, store.open_bytes(f.name), f.first.commit_lsn)]
    rejects = [r for r in rows if r["reject_reason"] is not None]
    assert len(rejects) == len(bad)
    assert all(r["reject_reason"].startswith("quarantined before landing (capture or import): ") for r in rejects)
    named = {r["raw"] for r in rejects if r["src_table"] == "t"}
    assert named and all(r["src_schema"] == "public" for r in rejects if r["src_table"])
    tableless = [r for r in rejects if r["src_table"] is None]
    parks_all = [r for r in rows if r["op"] == "park" and r["src_table"] is None]
    assert bool(parks_all) == bool(tableless)

    # A re-import lands nothing: no transaction, and no X record again.
    names = [f.name for f in store.files()]
    again = import_files(_settings(tmp_path), fmt, [str(f) for f in files], store=store)
    assert (again.changes, again.transactions, again.quarantined, again.files) == (0, 0, 0, [])
    assert again.quarantined_before == len(bad) and again.already_landed == res.transactions
    assert [f.name for f in store.files()] == names


def test_quarantine_is_idempotent_across_overlapping_imports(tmp_path: Path) -> None:
    """Old files re-listed beside new ones (topic+0+*.json): only the new bad messages are quarantined, before the new changes."""
    settings = _settings(tmp_path)
    store = LocalLandingStore(tmp_path / "land")
    old = tmp_path / "topic+0+0000.json"
    bad = _write(old, [(_pgk("0/1000", 500, "insert", [1, "a"]), None), ("not json", "not JSON")])
    res = import_files(settings, "pgkafka", [str(old)], store=store)
    check_quarantine(store, res, bad, 1)

    new = tmp_path / "topic+0+0100.json"
    _write(new, [(_pgk("0/2000", 501, "insert", [2, "b"]), None), (_pgk("0/xyz", 9, "insert", [3, "c"]), "not an LSN")])
    res = import_files(settings, "pgkafka", [str(old), str(new)], store=store)
    assert (res.quarantined, res.quarantined_before, res.changes, res.already_landed) == (1, 1, 1, 1)
    recs = [r for f in store.files()[1:] for r in store.read_records(f.name)]
    assert [(r.op, r.position) for r in recs] == [
        ("X", (0x2000 - 1, 1)),
        (COMMIT, (0x2000 - 1, 2)),
        ("I", (0x2000, 1)),
        (COMMIT, (0x2000, 2)),
    ]
    assert recs[0].reason.startswith(f"{new}:2: ") and recs[0].table == "t"

    # Only bad messages, nothing new to land: the control transaction follows what is landed; once.
    only_bad = tmp_path / "topic+0+0200.json"
    bad_only = _write(only_bad, [("{", "not JSON"), (_pgk("0/3000", 9, "merge", [4, "d"]), "unknown operation")])
    landed_before = store.landed_position()
    assert landed_before is not None
    res = import_files(settings, "pgkafka", [str(old), str(new), str(only_bad)], store=store)
    assert (res.quarantined, res.quarantined_before, res.changes, res.transactions) == (2, 2, 0, 0)
    recs = list(store.read_records(store.files()[-1].name))
    assert [r.position for r in recs] == [(landed_before.commit_lsn, landed_before.seq + s) for s in (1, 2, 3)]
    assert {r.reason.split(": ", 1)[0] for r in recs if r.op == "X"} == set(bad_only)
    for _ in range(2):
        res = import_files(settings, "pgkafka", [str(old), str(new), str(only_bad)], store=store)
        assert (res.quarantined, res.quarantined_before, res.files) == (0, 4, [])

    # A landing area that was emptied (the ledger outlives it) gets the X records again, at (0, 1..k) when nothing else lands.
    fresh = LocalLandingStore(tmp_path / "land2")
    (tmp_path / "land2" / "_state").mkdir(parents=True)
    (tmp_path / "land2" / "_state" / QUARANTINE_STATE).write_bytes(
        (tmp_path / "land" / "_state" / QUARANTINE_STATE).read_bytes()
    )
    res = import_files(settings, "pgkafka", [str(only_bad)], store=fresh)
    assert res.quarantined == 2
    assert [r.position for r in landed(fresh)] == [(0, 1), (0, 2), (0, 3)]


def test_debezium_unavailable_placeholder_is_an_absent_column(tmp_path: Path) -> None:
    """Unchanged TOASTed values Debezium did not receive (text, bytea base64/hex, text[]) are left out, not kept as data."""
    P = UNAVAILABLE_VALUE_PLACEHOLDER
    fields = [
        {"field": "id", "type": "int32"},
        {"field": "body", "type": "string", "optional": True},
        {"field": "blob", "type": "bytes", "optional": True},
        {"field": "tags", "type": "array", "items": {"type": "string"}, "optional": True},
        {"field": "note", "type": "string", "optional": True},
    ]
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "fields": fields},
            {"field": "after", "type": "struct", "fields": fields},
        ],
    }
    b64 = base64.b64encode(P.encode()).decode()
    full = {
        "id": 1,
        "body": "long text",
        "blob": base64.b64encode(b"\x00\xff").decode(),
        "tags": ["a", "b"],
        "note": "n1",
    }
    toasted = {"id": 1, "body": P, "blob": b64, "tags": [P], "note": "n2"}
    f = tmp_path / "dbz.json"
    _write(
        f,
        [
            (_dbz("c", 1000, 10, None, full, schema=schema, key={"id": 1}), None),
            (_dbz("u", 2000, 11, {**toasted, "note": "n1"}, toasted, schema=schema, key={"id": 1}), None),
            # REPLICA IDENTITY FULL without a key: the old row is the identity, minus what was unavailable.
            (
                _dbz("u", 3000, 12, {**toasted, "note": "n2"}, {**toasted, "note": "n3"}, table="nokey", schema=schema),
                None,
            ),
            # Without the Connect schema a bytea arrives as hex text.
            (_dbz("u", 4000, 13, None, {"id": 1, "blob": "\\x" + P.encode().hex(), "note": "n4"}, key={"id": 1}), None),
            (_dbz("d", 5000, 14, {**toasted, "note": "n4"}, None, table="nokey", schema=schema), None),
        ],
    )
    store = LocalLandingStore(tmp_path / "land")
    res = import_files(_settings(tmp_path), "debezium", [str(f)], store=store)
    assert res.quarantined == 0, res.summary()
    ins, upd, upd_nokey, upd_hex, dele = [r for r in landed(store) if r.op != COMMIT]
    assert [c.name for c in ins.columns] == ["id", "body", "blob", "tags", "note"]
    assert [(c.name, c.value) for c in upd.columns] == [("id", "1"), ("note", "n2")]
    assert [c.name for c in upd.identity] == ["id"]
    assert [(c.name, c.value) for c in upd_nokey.columns] == [("id", "1"), ("note", "n3")]
    assert [(c.name, c.value) for c in upd_nokey.identity] == [("id", "1"), ("note", "n2")]
    assert [(c.name, c.value) for c in upd_hex.columns] == [("id", "1"), ("note", "n4")]
    assert [(c.name, c.value) for c in dele.identity] == [("id", "1"), ("note", "n4")]
    assert not any(
        P in (c.value or "") or b64 in (c.value or "") for r in landed(store) for c in r.columns + r.identity
    )

    # The placeholder is configurable; then Debezium's default text is ordinary data.
    g = tmp_path / "custom.json"
    _write(g, [(_dbz("u", 6000, 15, None, {"id": 1, "body": "<unavailable>", "note": P}, key={"id": 1}), None)])
    store2 = LocalLandingStore(tmp_path / "land2")
    import_files(_settings(tmp_path), "debezium", [str(g)], store=store2, unavailable_placeholder="<unavailable>")
    (rec,) = [r for r in landed(store2) if r.op != COMMIT]
    assert [(c.name, c.value) for c in rec.columns] == [("id", "1"), ("note", P)]


def test_bad_input_names_the_file_and_line_and_only_whole_input_problems_are_fatal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"lsn": "0/10", "xid": 1, "operation": "insert", "table": "public.t", "columns": ["a"], "types": [], "values": [1]}\n'
    )
    store = LocalLandingStore(tmp_path / "land")
    res = import_files(_settings(tmp_path), "pgkafka", [str(bad)], store=store)
    assert res.quarantined == 1 and res.reasons[0].startswith(f"{bad}:1: ")
    res = import_files(_settings(tmp_path), "debezium", [str(bad)], store=LocalLandingStore(tmp_path / "land-dbz"))
    assert res.quarantined == 1 and "no 'op'" in res.reasons[0]

    # Two transactions claiming one commit position: the input mixes sources. Nothing is written.
    mixed = tmp_path / "mixed.json"
    _write(mixed, [(_pgk("0/100", 1, "insert", [1, "a"]), None), (_pgk("0/100", 2, "insert", [2, "b"]), None)])
    with pytest.raises(DecodeError, match="share the commit position"):
        import_files(_settings(tmp_path), "pgkafka", [str(mixed)], store=LocalLandingStore(tmp_path / "land-mixed"))
    # An input file that cannot be read at all.
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(DecodeError, match="not readable gzip"):
        import_files(_settings(tmp_path), "pgkafka", [str(broken)], store=LocalLandingStore(tmp_path / "land-gz"))
    assert not (tmp_path / "land-mixed").exists() and not (tmp_path / "land-gz").exists()


def test_a_transaction_an_interrupted_import_landed_in_part_is_resumed(tmp_path: Path) -> None:
    """Files are cut inside a big transaction; if the import died after the first ones, the next import continues it."""
    settings = LoaderSettings.model_validate(
        {"source": {"max_changes_per_file": 2}, "landing": {"url": (tmp_path / "land").as_uri()}}
    )
    f = tmp_path / "big.json"
    _write(f, [(_pgk(f"0/{0x100 + i:X}", 7, "insert", [i, "x"]), None) for i in range(5)] + [("nope", "not JSON")])
    store = LocalLandingStore(tmp_path / "land")
    import_files(settings, "pgkafka", [str(f)], store=store)
    complete = landed(store)
    for lf in store.files()[2:]:  # as if the import had died after publishing two files
        store.delete(lf.name)
    (tmp_path / "land" / "_state" / QUARANTINE_STATE).unlink()
    assert not store.files()[-1].complete
    res = import_files(settings, "pgkafka", [str(f)], store=store)
    assert res.quarantined == 1
    recs = landed(store)
    commit = 0x104
    txn = [(r.op, r.position, r.columns) for r in recs if r.commit_lsn == commit and r.seq <= 6]
    assert txn == [(r.op, r.position, r.columns) for r in complete if r.commit_lsn == commit]
    assert len(txn) == 6
    # The X record landed first time round before the transaction; its second copy has to follow it.
    assert [(r.op, r.position) for r in recs[-2:]] == [("X", (commit, 7)), (COMMIT, (commit, 8))]
    assert [r.position for r in recs] == sorted(r.position for r in recs)


def test_load_rejects_quarantined_messages_and_parks_their_table(env: Env) -> None:
    """End to end through Spark: X records of an import become rejects and park the table; good changes reach history."""
    (env.tmp / "in").mkdir()
    files, bad, good = pgkafka_inputs(env.tmp / "in")
    res = import_files(env.settings, "pgkafka", [str(f) for f in files])
    assert res.quarantined == len(bad)
    load = env.load()
    assert load.rejects == len(bad), load.summary()
    assert "public.t" in load.parked, load.summary()
    assert env.history("public.t").where("pg_operation <> 'park'").count() == good
