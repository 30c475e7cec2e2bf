"""The same snapshot landed as v1 (gzip JSON lines) and v2 (Arrow IPC streams) reads the same to every
consumer: records (resume, replay, status, import tools), the load's decoded rows, erasure.

No Spark: the load's decoder (``decode_file``) is what its executors run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loader.capture.snapshot import Snapshot
from loader.config import LoaderSettings
from loader.erase import Erasure, Target
from loader.lake.tables import SourceTable
from loader.landing import arrowfile
from loader.landing.records import COMMIT
from loader.landing.store import ARROW, JSONL, LandingFile, LandingStore, LocalLandingStore
from loader.load.decode import decode_file
from tests.harness import TEST_PG, create_db

SOURCE = [
    """CREATE TABLE public.kinds (
        id int PRIMARY KEY, t text, b boolean, c char(5), n numeric(12,3), f float8, ts timestamptz,
        d date, iv interval, j jsonb, a int[], by bytea, "Mixed Case" text, ip inet, sm smallint, bg bigint)""",
    """INSERT INTO public.kinds SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'v' || g || E'\\n"é\\\\' END,
        g % 2 = 0, 'ab', g / 3.0, g / 7.0, '2024-01-01 00:00:00+02'::timestamptz + g * interval '1 minute',
        '2024-02-29'::date + g, g * interval '1 second', jsonb_build_object('k', g), ARRAY[g, NULL],
        decode('00ff', 'hex'), CASE WHEN g % 5 = 0 THEN NULL ELSE 'x' END, '10.0.0.1',
        CASE g % 4 WHEN 0 THEN NULL WHEN 1 THEN -32768 WHEN 2 THEN 32767 ELSE -g END,
        CASE g % 4 WHEN 0 THEN -9223372036854775808 WHEN 1 THEN 9223372036854775807 WHEN 2 THEN NULL ELSE -g END
        FROM generate_series(1, 1234) g""",
    "CREATE TABLE public.keyless (v text, w int)",
    "INSERT INTO public.keyless SELECT 'k' || g, g FROM generate_series(1, 300) g",
    "CREATE TABLE public.empty (id int PRIMARY KEY, v text)",
    "CREATE TABLE public.last (id bigint PRIMARY KEY)",
    "INSERT INTO public.last SELECT g FROM generate_series(1, 200) g",  # a multiple of the chunk
]
CHUNK = 100


@pytest.fixture
def source(pg_admin: str, base_settings: LoaderSettings) -> Iterator[LoaderSettings]:
    uid = uuid.uuid4().hex[:8]
    db = f"fmt_{uid}"
    create_db(pg_admin, db)
    with psycopg.connect(f"{TEST_PG}/{db}", autocommit=True) as conn:
        for statement in SOURCE:
            conn.execute(statement)
    settings = base_settings.model_copy(
        update={"source": base_settings.source.model_copy(update={"dsn": f"{TEST_PG}/{db}", "slot": f"fmt_{uid}"})}
    )
    try:
        yield settings
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (settings.source.slot,),
            )
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(db)))


def land(settings: LoaderSettings, fmt: str, landing: Path) -> LandingStore:
    with psycopg.connect(settings.source.dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (settings.source.slot,),
        )
    s = settings.model_copy(update={"source": settings.source.model_copy(update={"snapshot_format": fmt})})
    store = LocalLandingStore(landing)
    Snapshot(s, store, chunk_rows=CHUNK, reason="formats test").run()
    return store


def normal(rec: Any) -> tuple[Any, ...]:
    """A record without what differs between two snapshots of the same data (position, time)."""
    return (rec.op, rec.seq, rec.xid, rec.schema, rec.table, rec.columns, rec.identity, rec.pk, rec.reason, rec.raw)


_VOLATILE = {"landing_file", "commit_lsn", "change_lsn", "ts"}


def decoded(store: LandingStore) -> list[dict[str, Any]]:
    rows = []
    for f in store.files():
        for row in decode_file(f.name, store.open_bytes(f.name), f.first.commit_lsn, (f.first, f.last)):
            rows.append({k: v for k, v in row.items() if k not in _VOLATILE})
    return rows


def test_v1_and_v2_snapshots_read_the_same_everywhere(source: LoaderSettings, tmp_path: Path) -> None:
    v1 = land(source, JSONL, tmp_path / "v1")
    v2 = land(source, ARROW, tmp_path / "v2")
    files1, files2 = v1.files(), v2.files()
    assert {f.format for f in files1} == {JSONL} and {f.format for f in files2} == {ARROW}
    for f in files2:
        assert (v2.path / f.name).stat().st_mode & 0o777 == 0o600  # type: ignore[attr-defined]
    # Integer and boolean columns are held as Arrow values (landing v2 NATIVE_TYPES), the rest as text.
    kinds = next(f for f in files2 if next(iter(v2.read_records(f.name))).table == "kinds")
    got = arrowfile.salvage(v2.open_bytes(kinds.name), native=True)
    assert got.header is not None
    held = {c: str(got.batches[0].schema.field(j + 1).type) for j, (c, _) in enumerate(got.header.columns)}
    assert (held["id"], held["sm"], held["bg"], held["b"]) == ("int32", "int16", "int64", "bool")
    assert held["t"] == held["n"] == held["c"] == "string"
    recs1 = [r for f in files1 for r in v1.read_records(f.name)]
    recs2 = [r for f in files2 for r in v2.read_records(f.name)]
    assert len(recs1) == 1234 + 300 + 200 + 4 + 1
    assert [normal(r) for r in recs1] == [normal(r) for r in recs2]
    assert [r.op for r in recs2 if r.op == COMMIT] == [COMMIT] and recs2[-1].op == COMMIT
    # Every file's name covers exactly its records, and ends with the commit marker only at the end.
    for f in files2:
        got = list(v2.read_records(f.name))
        assert (got[0].position, got[-1].position) == (f.first, f.last)
        assert f.complete == (got[-1].op == COMMIT)
        assert len({r.table for r in got if r.op != COMMIT}) <= 1, "a file holds one table"
    rows1, rows2 = decoded(v1), decoded(v2)
    assert rows1 == rows2
    assert not any(r["reject_reason"] for r in rows2)


def test_damaged_v2_file_keeps_its_readable_prefix_and_parks_its_table(
    source: LoaderSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrowfile, "IPC_BATCH_ROWS", 100)
    s = source.model_copy(update={"source": source.source.model_copy(update={"snapshot_format": ARROW})})
    store = LocalLandingStore(tmp_path / "v2")
    Snapshot(s, store, chunk_rows=20_000, reason="damage test").run()
    f = next(f for f in store.files() if next(iter(store.read_records(f.name))).table == "kinds")
    data = store.open_bytes(f.name)
    cut = data[: len(data) * 2 // 3]
    rows = list(decode_file(f.name, cut, f.first.commit_lsn, (f.first, f.last)))
    reads = [r for r in rows if r["op"] == "read"]
    assert 0 < len(reads) < 1234 and len(reads) % 100 == 0
    assert [r["seq"] for r in reads] == list(range(f.first.seq + 1, f.first.seq + 1 + len(reads)))
    parks = [r for r in rows if r["op"] == "park"]
    assert [(p["src_schema"], p["src_table"]) for p in parks] == [("public", "kinds")]
    assert f"{1235 - 1 - len(reads)} of its 1235 changes" in parks[0]["note"]
    # Without its schema message nothing names the table: every table parks.
    rows = list(decode_file(f.name, data[:10], f.first.commit_lsn, (f.first, f.last)))
    assert [(r["op"], r["src_table"]) for r in rows] == [("park", None)]
    (store.path / f.name).write_bytes(cut)
    with pytest.raises(Exception, match="damaged"):
        list(store.read_records(f.name))


def test_erasure_scrubs_v2_files_like_v1(source: LoaderSettings, tmp_path: Path) -> None:
    v1 = land(source, JSONL, tmp_path / "v1")
    v2 = land(source, ARROW, tmp_path / "v2")
    targets = [
        Target(SourceTable.parse("public.kinds"), "id", "17"),
        Target(SourceTable.parse("public.kinds"), "t", 'v18\n"é\\'),
    ]
    got = []
    for store in (v1, v2):
        unreadable: list[str] = []
        removed = Erasure(None, source, store)._scrub_landing(targets, False, unreadable)  # type: ignore[arg-type]
        assert not unreadable
        got.append(removed)
    assert got[0] == got[1] == (2, 1)
    recs1 = [normal(r) for f in v1.files() for r in v1.read_records(f.name)]
    recs2 = [normal(r) for f in v2.files() for r in v2.read_records(f.name)]
    assert recs1 == recs2 and len(recs2) == 1234 + 300 + 200 + 4 + 1 - 2
    assert decoded(v1) == decoded(v2)
    kinds = next(f for f in v2.files() if next(iter(v2.read_records(f.name))).table == "kinds")
    header = arrowfile.salvage(v2.open_bytes(kinds.name)).header
    assert header is not None and header.tables == {"public.kinds": CHUNK + 1 - 2} and header.rows == CHUNK - 2
    assert LandingFile.parse(kinds.name) == kinds
