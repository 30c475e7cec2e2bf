"""Other inputs (pgkafka messages, wal2json v1/v2 files, Debezium envelopes) -> landing -> history/current.

The input files are written by the test from real changes of a real PostgreSQL: wal2json's own
output of a second slot (format 1 and 2), and pgkafka / Debezium messages built from it the way a
producer would, with duplicates and out-of-order files as Kafka delivers them.
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
from loader.capture.landing import LocalLandingStore
from loader.capture.records import COMMIT, ChangeRecord
from loader.capture.wal2json import WAL2JSON_OPTIONS, parse_json_exact
from loader.errors import DecodeError
from loader.inputs.importer import import_files
from tests.harness import Env

V1_OPTIONS = ("format-version", "1", "include-lsn", "1", "include-xids", "1", "include-timestamp", "1",
              "include-types", "1", "include-pk", "1")


def make_changes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO accounts SELECT g, g * 1.5, '2024-01-01 10:00:00'::timestamp + g * interval '1.5 s',"
                  " 'n' || g, g % 2 = 0 FROM generate_series(1, 40) g")
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
    env.sql("CREATE TABLE accounts (id integer PRIMARY KEY, balance numeric(20,2), opened timestamp, note text, active boolean)")
    aux = f"aux_{env.uid}"
    env.sql("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (aux,))
    try:
        make_changes(env.settings.source.dsn)
        with slots.connect(env.settings.source.dsn) as c:
            def peek(opts: tuple[str, ...]) -> list[str]:
                ph = ", ".join(["%s"] * len(opts))
                return [r[0] for r in c.execute(f"SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, {ph})", (aux, *opts))]

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
        "lsn": doc["lsn"], "xid": int(doc["xid"]), "timestamp": doc["timestamp"],
        "operation": {"I": "insert", "U": "update", "D": "delete"}[doc["action"]],
        "table": f"{doc['schema']}.{doc['table']}",
        "columns": [c["name"] for c in cols], "types": [c["type"] for c in cols],
        # Numbers as JSON numbers with their exact digits (1.50 stays 1.50), as a producer writes them.
        "values": [RAW + c["value"] if c["type"] in ("integer", "numeric(20,2)") and c["value"] is not None
                   else c["value"] for c in cols],
        **({"identity": {"columns": [c["name"] for c in ident], "types": [c["type"] for c in ident],
                         "values": [int(c["value"]) for c in ident]}} if ident else {}),
    }


def _dbz_field(name: str, pg_type: str) -> dict[str, Any]:
    if pg_type == "integer":
        return {"field": name, "type": "int32", "optional": False}
    if pg_type.startswith("numeric"):
        return {"field": name, "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "2", "connect.decimal.precision": "20"}}
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
            "before": before, "after": after, "op": {"I": "c", "U": "u", "D": "d"}[doc["action"]],
            "source": {"connector": "postgresql", "schema": doc["schema"], "table": doc["table"], "lsn": lsn,
                       "txId": int(doc["xid"]), "ts_ms": int(ts.timestamp() * 1000)},
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
        return [write_raw(tmp / "part-1.json", v1[len(v1) // 2:]), write_raw(tmp / "part-0.json", v1[: len(v1) // 2])], pk
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
    return [write_lines(tmp / "topic+0+0000.json", msgs[: len(msgs) // 2]), write_lines(tmp / "topic+0+0100.json", msgs[len(msgs) // 2:])], pk


def landed(store: LocalLandingStore) -> list[ChangeRecord]:
    return [r for f in store.files() for r in store.read_records(f.name)]


FORMATS = ["wal2json-v2", "wal2json-v1", "pgkafka", "debezium"]


def test_every_input_format_lands_the_same_changes_as_capture(env: Env) -> None:
    env.capture()  # the reference: the live slot sees the same changes
    v2, v1 = setup_source(env)
    env.capture()
    ref_store = LocalLandingStore(Path(env.settings.landing.url.removeprefix("file://")) / env.settings.source.slot)
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        json.loads((Path(__file__).resolve().parents[1] / "schemas" / "landing-change.v1.json").read_text())
    )
    reference = [(r.op, r.table, [(c.name, c.value) for c in r.columns], [(c.name, c.value) for c in r.identity])
                 for r in landed(ref_store) if r.op != COMMIT]
    for fmt in FORMATS:
        files, pk = input_files(env, fmt, v2, v1, env.tmp / "in" / fmt)
        store = LocalLandingStore(env.tmp / "out" / fmt)
        res = import_files(env.settings, fmt.split("-")[0], [str(f) for f in files], pk, store=store)
        assert res.duplicates == (10 if fmt in ("pgkafka", "debezium") else 0), fmt
        recs = landed(store)
        positions = [r.position for r in recs]
        assert positions == sorted(positions) and len(set(positions)) == len(positions), fmt
        got = [(r.op, r.table, [(c.name, c.value) for c in r.columns], [(c.name, c.value) for c in r.identity])
               for r in recs if r.op != COMMIT]
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


def test_bad_input_names_the_file_and_line(tmp_path: Path, pg_admin: str) -> None:
    from loader.config import LoaderSettings

    bad = tmp_path / "bad.json"
    bad.write_text('{"lsn": "0/10", "xid": 1, "operation": "insert", "table": "public.t", "columns": ["a"], "types": [], "values": [1]}\n')
    settings = LoaderSettings(landing={"url": (tmp_path / "land").as_uri()})
    with pytest.raises(DecodeError) as err:
        import_files(settings, "pgkafka", [str(bad)])
    assert "bad.json:1" in str(err.value)
    with pytest.raises(DecodeError):
        import_files(settings, "debezium", [str(bad)])


def test_debezium_logical_types_become_postgres_text() -> None:
    from loader.inputs.debezium import _convert_value

    dec = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "3"}}
    raw = base64.b64encode((-1234567).to_bytes(4, "big", signed=True)).decode()
    assert _convert_value(raw, dec) == ("numeric", "-1234.567")
    assert _convert_value("19782", {"type": "int32", "name": "io.debezium.time.Date"}) == ("date", "2024-02-29")
    assert _convert_value("1706702400123456", {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}) == (
        "timestamp without time zone", "2024-01-31 12:00:00.123456")
    assert _convert_value("2024-01-31T12:00:00.5+05:30", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}) == (
        "timestamp with time zone", "2024-01-31 06:30:00.5+00")
    assert _convert_value("45296000001", {"type": "int64", "name": "io.debezium.time.MicroTime"}) == (
        "time without time zone", "12:34:56.000001")
    assert _convert_value("AP8=", {"type": "bytes"}) == ("bytea", "\\x00ff")
    src_type = {"type": "string", "parameters": {"__debezium.source.column.type": "UUID"}}
    assert _convert_value("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", src_type)[0] == "uuid"
    assert _convert_value(None, dec) == ("numeric", None)
