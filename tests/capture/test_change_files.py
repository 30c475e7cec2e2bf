"""Landing v2 change files (loader.landing.changefile) hold exactly what v1 files of the same records
hold, for every consumer: records (replay, status, import tools, snapshot resume), the load's
decoded rows (what Spark's executors run), damage salvage, erasure; and capture writes them
byte-identically when it lands the same records again.

No Spark and no database: the writers are capture's (LandingWriter), the readers the load's.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.landing import changefile
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import CHANGES, JSONL, LandingFile, LandingWriter, LocalLandingStore
from loader.load.decode import decode_file

TS = "2026-11-26 10:00:00.123456+00"
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_value = st.one_of(st.none(), _text, st.sampled_from(["", "0", "-0", "NaN", "\\x00ff", '{"k": [1, null]}']))


@st.composite
def _transactions(draw: Any) -> list[ChangeRecord]:
    """Records as capture lands them: transactions of changes and control records, each ended by
    its commit marker, positions increasing."""
    out: list[ChangeRecord] = []
    lsn = 0x1000
    for _ in range(draw(st.integers(1, 6))):
        lsn += draw(st.integers(1, 1 << 20))
        xid = draw(st.integers(0, 1 << 40))
        seq = 0
        for _ in range(draw(st.integers(0, 7))):
            seq += 1
            op = draw(st.sampled_from("IUDRTSPX"))
            table = draw(st.sampled_from(["acct", "Mixed Case", "ü", ""]))
            names = draw(st.lists(st.sampled_from(["id", "n", "Value", "value", "t x"]), unique=True, max_size=4))
            columns = [
                Column(n, draw(st.sampled_from(["integer", "text", "bytea", "numeric(10,2)"])), draw(_value))
                for n in names
            ]
            identity = [Column("id", "integer", draw(_value))] if op in "UD" and draw(st.booleans()) else []
            out.append(
                ChangeRecord(
                    op=op,
                    commit_lsn=lsn,
                    seq=seq,
                    xid=xid,
                    ts=TS,
                    schema=draw(st.sampled_from(["public", "s"])),
                    table=table,
                    change_lsn=lsn - 50 + seq,
                    columns=columns,
                    identity=identity,
                    pk=draw(st.sampled_from([[], ["id"], ["id", "n"]])),
                    reason=draw(st.sampled_from(["", "why: ü"])) if op in "SPX" else "",
                    raw=draw(st.one_of(st.none(), _text)) if op == "X" else None,
                )
            )
        out.append(ChangeRecord(COMMIT, lsn, seq + 1, xid, TS))
    return out


def _land(root: Path, records: list[ChangeRecord], max_changes: int, fmt: str) -> LocalLandingStore:
    store = LocalLandingStore(root)
    writer = LandingWriter(store, max_changes, format=fmt)
    for rec in records:
        writer.write(rec)
    writer.close_file()
    return store


def _rows(store: LocalLandingStore, f: LandingFile, data: bytes | None = None) -> list[dict[str, Any]]:
    """The load's decoded rows of a file, without the file's name (its suffix differs by format)."""
    raw = store.open_bytes(f.name) if data is None else data
    rows = list(decode_file(f.name, raw, f.first.commit_lsn, (f.first, f.last)))
    return [
        {k: v.replace(f.name, "<file>") if isinstance(v, str) else v for k, v in r.items() if k != "landing_file"}
        for r in rows
    ]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_transactions(), max_changes=st.integers(1, 9))
def test_v2_change_files_read_as_v1_files_of_the_same_records(
    tmp_path_factory: Any, records: list[ChangeRecord], max_changes: int
) -> None:
    assert_read_as_v1(tmp_path_factory.mktemp("landing"), records, max_changes, CHANGES)


def assert_read_as_v1(root: Path, records: list[ChangeRecord], max_changes: int, fmt: str) -> None:
    """``records`` landed in ``fmt`` and in v1: the same files, each read as the v1 file (records,
    lines with the header, the load's decoded rows)."""
    v1 = _land(root / "v1", records, max_changes, JSONL)
    other = _land(root / fmt, records, max_changes, fmt)
    f1, f2 = v1.files(), other.files()
    assert [(f.first, f.last, f.complete) for f in f1] == [(f.first, f.last, f.complete) for f in f2]
    assert all(f.format == fmt for f in f2)
    for a, b in zip(f1, f2, strict=True):
        assert list(other.read_records(b.name)) == list(v1.read_records(a.name))
        assert list(other.read_lines(b.name)) == list(v1.read_lines(a.name))  # the header line too
        assert _rows(other, b) == _rows(v1, a)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_transactions(), cut=st.floats(0.0, 1.0))
def test_a_cut_v2_change_file_keeps_its_readable_batches_and_parks_what_it_lost(
    tmp_path_factory: Any, records: list[ChangeRecord], cut: float
) -> None:
    """Cut anywhere, a file loses at most the batches from the cut on: the load keeps the records
    before them and parks each table its header says lost some (all, without a readable header)."""
    path = tmp_path_factory.mktemp("cut") / "f.changes.arrow"
    batch = 3
    recs = [r for r in records if r.op == COMMIT or r.table]  # a record naming no table parks every table
    with open(path, "wb") as spool:
        s = changefile.Spool(spool)
        for i in range(0, len(recs), batch):
            s.write(recs[i : i + batch])
        s.close()
    tables: dict[str, int] = {}
    for r in recs:
        if r.op != COMMIT:
            tables[r.qualified_table] = tables.get(r.qualified_table, 0) + 1
    out = io.BytesIO()
    changefile.Spool.finish(path, changefile.ChangeHeader(tables, len(recs)), out)
    whole = out.getvalue()
    data = whole[: int(len(whole) * cut)]
    got = changefile.salvage(data)
    kept = [r for b in got.batches for r in changefile.batch_records(b)]
    assert kept == recs[: len(kept)]
    assert len(kept) % batch == 0 or len(kept) == len(recs)
    name = LandingFile.name_for(recs[0].position, recs[-1].position, True, CHANGES)
    f = LandingFile.parse(name)
    assert f is not None
    rows = list(decode_file(name, data, f.first.commit_lsn, (f.first, f.last)))
    parks = [r for r in rows if r["op"] == "park" and r["line"] == 0]  # the file's account, not P records
    every = any(p["src_table"] is None for p in parks)  # every table may have lost changes
    if len(kept) == len(recs) and data == whole:
        assert not parks
    elif got.header is None:
        assert len(parks) == 1 and every
    else:
        lost = {t for t in tables if sum(1 for r in kept if r.op != COMMIT and r.qualified_table == t) < tables[t]}
        assert every or lost <= {f"{p['src_schema']}.{p['src_table']}" for p in parks}


def test_capture_writes_the_same_v2_bytes_again(tmp_path: Path) -> None:
    """Landing the same records again (a capture re-run after a kill) gives byte-identical files;
    the spooled file (header after the fact) equals one written in one go."""
    records = [
        ChangeRecord("I", 0x100, i, 7, TS, "public", "t", 0x90 + i, [Column("id", "integer", str(i))], [], ["id"])
        for i in range(1, 10_001)
    ] + [ChangeRecord(COMMIT, 0x100, 10_001, 7, TS)]
    a = _land(tmp_path / "a", records, 50_000, CHANGES)
    b = _land(tmp_path / "b", records, 50_000, CHANGES)
    (fa,), (fb,) = a.files(), b.files()
    assert fa.name == fb.name and a.open_bytes(fa.name) == b.open_bytes(fb.name)
    changefile.write_file(tmp_path / "one.changes.arrow", records)
    assert (tmp_path / "one.changes.arrow").read_bytes() == a.open_bytes(fa.name)
    header = changefile.salvage(a.open_bytes(fa.name)).header
    assert header == changefile.ChangeHeader({"public.t": 10_000}, 10_001)
