"""Hostile landing input: each case is quarantined with its reason (or safely accepted, for names
that are odd but legal), counted in the load's summary, parks only the table it touched, and leaves
every other table advancing. Ends with the oracle after a resync of the victim.

The hostile files are written into the landing area between real captured changes, at positions
no real change can have (one past the last landed commit's LSN; a commit LSN is the start of a
WAL record, and records are at least 24 bytes long).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass

import pytest

from loader.landing.records import FileHeader
from loader.landing.store import LandingFile, open_landing
from loader.lsn import ChangePosition
from tests.harness import Env

TS = "2026-01-01 00:00:00+00"
VICTIM = ("public", "victim")


@dataclass
class Case:
    name: str
    reason: str  # expected in the reject's reason ('' when the case parks without a reject line)
    lines: list[bytes]
    header: dict[str, int] | None = None
    mangle: str = ""  # file-level damage: truncate, flip, garbage-tail
    rejects: int = 1


def rec(seq_offset: int, **fields: object) -> bytes:
    doc: dict[str, object] = {
        "v": 1,
        "op": "I",
        "lsn": 0,
        "seq": seq_offset,
        "xid": 7,
        "ts": TS,
        "change_lsn": 1,
        "schema": VICTIM[0],
        "table": VICTIM[1],
        "columns": [["id", "integer", str(1000 + seq_offset)]],
        "pk": ["id"],
    }
    doc.update(fields)
    return json.dumps(doc).encode()


def typed(seq: int, col: str, typ: str, value: str) -> bytes:
    return rec(seq, columns=[["id", "integer", str(1000 + seq)], [col, typ, value]])


CASES = [
    # line-level damage and malformed records
    Case("cut-json", "undecodable", [rec(1)[:40]]),
    Case("invalid-utf8", "not UTF-8", [rec(1).replace(b'"1001"', b'"\xff\xfe"')]),
    Case("json-array", "must be a JSON object", [b"[1, 2, 3]"]),
    Case("version-99", "version 99", [rec(1, v=99)]),
    Case("unknown-op", "unknown operation", [rec(1, op="Z")]),
    Case("lsn-as-text", "lsn must be an integer", [rec(1, lsn="0/16")]),
    Case("negative-seq", "not a valid change position", [rec(1, seq=-5)]),
    Case("insert-without-columns", "without column values", [rec(1, columns=[])]),
    Case("value-not-text", "must be text or null", [rec(1, columns=[["id", "integer", 5]])]),
    Case("column-two-elements", "must be [name, type, value]", [rec(1, columns=[["id", "integer"]])]),
    Case("duplicate-columns", "appears twice", [rec(1, columns=[["id", "integer", "1"], ["id", "integer", "2"]])]),
    Case("delete-without-key", "old key", [rec(1, op="D", columns=[])]),
    Case("no-table", "without schema and table", [rec(1, table="")]),
    Case("ts-not-a-timestamp", "not a timestamp", [rec(1, ts="yesterday at noon")]),
    Case("outside-file-range", "outside the file's range", [rec(1, seq=10_000)]),
    Case("duplicate-position", "appears twice in the file", [rec(1), rec(1, columns=[["id", "integer", "77"]])]),
    Case("key-missing", "key column 'id' missing", [rec(1, columns=[["n", "integer", "1"]])]),
    Case("name-500-chars", "longer than PostgreSQL allows", [rec(1, table="t" * 500)]),
    Case(
        "capture-quarantine",
        "quarantined before landing",
        [rec(1, op="X", columns=[], reason="wal2json output is not UTF-8", raw="caf\\xe9")],
    ),
    Case("header-says-more", "", [rec(1)], header={"public.victim": 4}, rejects=0),
    # values that do not fit their column
    Case("text-in-int", "does not fit", [typed(1, "n", "integer", "twelve")]),
    Case("oversized-int", "does not fit", [typed(1, "n", "integer", "9" * 2_000_000)]),
    Case("numeric-overflow", "does not fit", [typed(1, "amount", "numeric(5,2)", "123456.789")]),
    Case("date-impossible", "does not fit", [typed(1, "d", "date", "2024-02-30")]),  # infinity is kept: see typemap
    Case("int-array-of-words", "does not fit", [typed(1, "arr", "integer[]", "{a,b}")]),
    Case("multidimensional-array", "does not fit", [typed(1, "arr", "integer[]", "{{1,2},{3,4}}")]),
    Case("bytea-not-hex", "does not fit", [typed(1, "b", "bytea", "\\xZZ")]),
    Case("timestamp-garbage", "does not fit", [typed(1, "t", "timestamp with time zone", "not a time")]),
    Case("boolean-maybe", "does not fit", [typed(1, "ok", "boolean", "maybe")]),
    # file-level damage (the header still names the table)
    Case("truncated-file", "", [rec(i) for i in range(1, 9)], mangle="truncate", rejects=-1),
    Case(
        "bit-flips",
        "",
        [rec(i, columns=[["id", "integer", str(i)], ["n", "integer", str(i) * 30]]) for i in range(1, 9)],
        mangle="flip",
        rejects=-1,
    ),
    Case("garbage-tail", "damaged after its last record", [rec(1)], mangle="garbage-tail"),
]


def write_case(env: Env, case: Case, base: ChangePosition, index: int) -> str:
    lsn = base.commit_lsn + 1
    first_seq = index * 100 + 1
    body = []
    for line in case.lines:
        try:
            doc = json.loads(line)
        except ValueError:
            body.append(line)
            continue
        if isinstance(doc, dict):
            if doc.get("lsn") == 0:
                doc["lsn"] = lsn
            if isinstance(doc.get("seq"), int) and 0 < doc["seq"] < 100:
                doc["seq"] = first_seq + doc["seq"] - 1
            body.append(json.dumps(doc).encode())
        else:
            body.append(line)
    last = ChangePosition(lsn, first_seq + 99)  # the next file starts right after: contiguous
    body.append(json.dumps({"v": 1, "op": "C", "lsn": lsn, "seq": last.seq, "xid": 7, "ts": TS}).encode())
    header = case.header or {"public.victim": len(case.lines)}
    data = gzip.compress(FileHeader(header).to_json().encode() + b"\n") + gzip.compress(b"\n".join(body) + b"\n")
    if case.mangle == "truncate":
        data = data[: len(data) - 60]
    elif case.mangle == "flip":
        cut = len(data) * 3 // 4
        data = data[:cut] + bytes(b ^ 0x5A for b in data[cut : cut + 16]) + data[cut + 16 :]
    elif case.mangle == "garbage-tail":
        data += b"not gzip at all"
    name = LandingFile.name_for(ChangePosition(lsn, first_seq), last, True)
    spool = env.tmp / f"hostile-{index}.gz"
    spool.write_bytes(data)
    open_landing(env.settings).publish(spool, name)
    return name


def test_thirty_hostile_inputs_are_quarantined_and_isolated(env: Env) -> None:
    env.sql("CREATE TABLE public.good (id int PRIMARY KEY, v text)")
    env.sql(
        "CREATE TABLE public.victim (id int PRIMARY KEY, n int, amount numeric(5,2), d date, arr int[], b bytea,"
        " t timestamptz, ok boolean)"
    )
    env.capture()
    env.sql("INSERT INTO public.good SELECT g, 'g' FROM generate_series(1, 20) g")
    env.sql(
        "INSERT INTO public.victim (id, n, amount, d, arr, b, t, ok) VALUES (1, 1, 1.5, '2024-01-01', '{1}', '\\x00', now(), true)"
    )
    env.run_all()
    base = open_landing(env.settings).landed_position()
    assert base is not None
    names = {write_case(env, case, base, i): case for i, case in enumerate(CASES)}
    # Odd but legal names are data, not code: an injection attempt lands as a table of its own.
    injection = json.dumps(
        {
            "v": 1,
            "op": "I",
            "lsn": base.commit_lsn + 1,
            "seq": len(CASES) * 100 + 1,
            "xid": 7,
            "ts": TS,
            "change_lsn": 1,
            "schema": "public",
            "table": "x'); DROP TABLE good; --",
            "columns": [["`a`; DROP", "text", "{{ run_query('x') }}"]],
            "pk": [],
        }
    ).encode()
    names[
        write_case(
            env, Case("injection", "", [injection], header={"public.x'); DROP TABLE good; --": 1}), base, len(CASES)
        )
    ] = Case("injection", "", [], rejects=0)
    assert len(CASES) >= 30
    load = env.load()
    rejects = {(r["landing_file"], r["line"]): r for r in env.spark.table(env.names.rejects).collect()}
    by_file: dict[str, list[str]] = {}
    for (file, _), r in rejects.items():
        by_file.setdefault(file, []).append(r["reason"])
    for name, case in names.items():
        reasons = by_file.get(name, [])
        if case.rejects >= 0:
            assert len(reasons) == case.rejects, f"{case.name}: {reasons}"
        if case.reason:
            assert any(case.reason in why for why in reasons), f"{case.name}: {reasons}"
    # The damaged files' cases (rejects=-1) may quarantine lines or only park: which depends on
    # where the damage falls in the compressed bytes, and so on the LSNs in the text.
    assert load.rejects == len(rejects) >= sum(c.rejects for c in CASES if c.rejects > 0)
    assert set(load.parked) == {"public.victim"}, load.parked
    assert "loader resync --table public.victim" in load.parked["public.victim"]
    assert env.history("public.x'); DROP TABLE good; --").count() == 1
    assert env.history("public.good").count() == 20, "the injection attempt touched nothing else"
    # Everything else keeps advancing while the victim is parked.
    env.sql("INSERT INTO public.good VALUES (100, 'after')")
    env.sql("UPDATE public.victim SET n = 2 WHERE id = 1")
    _, _, merge = env.run_all()
    assert set(merge.parked) == {"public.victim"}
    results = {r.table: r for r in env.reconcile()}
    assert results["public.good"].ok and results["public.victim"].parked
    env.resync(["public.victim"])
    env.run_all()
    env.assert_reconciled(["public.good", "public.victim"])


@pytest.mark.parametrize("damage", ["cut short", "no header"])
@pytest.mark.parametrize("fmt", ["arrow", "jsonl"])
def test_a_damaged_file_of_a_resync_parks_its_table_after_the_resync(
    env: Env, fmt: str, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resync is one transaction whose resync marker lifts every park before it: a park for a
    damaged file of it goes after the table's last row of that transaction (``park_seq``), as one
    for a row that does not fit does. (It went to the transaction's start: the resync lifted it, and
    the current table was built from the rows that survived, not parked, the loss unreported.)"""
    from loader.landing import arrowfile

    monkeypatch.setattr(arrowfile, "IPC_BATCH_ROWS", 4)  # several batches a file: a cut keeps some
    env.configure("source", snapshot_format=fmt, snapshot_chunk_rows=10)
    env.sql("CREATE TABLE public.s (id int PRIMARY KEY, v text)")
    env.sql("CREATE TABLE public.bystander (id int PRIMARY KEY)")
    env.capture()
    env.sql("INSERT INTO public.s SELECT g, 'a' FROM generate_series(1, 30) g")
    env.sql("INSERT INTO public.bystander VALUES (1)")
    env.run_all()
    env.assert_reconciled()
    store = open_landing(env.settings)
    before = {f.name for f in store.files()}
    env.sql("UPDATE public.s SET v = 'b'")
    env.resync(["public.s"])
    chunks = [
        f.name
        for f in store.files()
        if f.name not in before and any(r.op == "R" and r.table == "s" for r in store.read_records(f.name))
    ]
    assert len(chunks) == 3, chunks  # 30 rows, 10 a file
    victim = chunks[1]  # the resync marker is in the first: readable, it would lift a park before it
    path = store.path / victim  # type: ignore[attr-defined]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3] if damage == "cut short" else data[:10])
    _, load, merge = env.run_all()
    assert "public.s" in load.parked and "public.s" in merge.parked, (load.parked, merge.parked)
    assert victim in merge.parked["public.s"], merge.parked
    # The resync applied with the rows that survived; the table waits for the next resync.
    current = {r["id"]: r["v"] for r in env.current("public.s").collect()}
    assert set(current.values()) == {"b"} and len(current) < 30
    results = {r.table: r for r in env.reconcile()}
    assert results["public.s"].parked
    env.resync(["public.s"] if damage == "cut short" else None)
    _, load, merge = env.run_all()
    assert not merge.parked, merge.parked
    env.assert_reconciled()
