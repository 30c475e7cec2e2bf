"""Landing v3 change files (loader.landing.tablefile): each table's changes in columns, read back as
exactly the v1 file of the same records; the same bytes however the records arrived; a cut file
keeps the records before its first lost segment and parks what it lost."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.landing import changefile, tablefile
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import TABLES, LandingFile
from loader.load.decode import decode_file
from tests.capture.test_change_files import TS, _transactions, assert_read_as_v1


@pytest.mark.parametrize("min_rows", [1, tablefile.MIN_SEGMENT_ROWS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_transactions(), max_changes=st.integers(1, 9))
def test_v3_files_read_as_v1_files_of_the_same_records(
    tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch, min_rows: int, records: list[ChangeRecord], max_changes: int
) -> None:
    """Whether a table's few changes of a block get a rows segment (``min_rows`` 1) or stay in the
    records segment (the default minimum)."""
    monkeypatch.setattr(tablefile, "MIN_SEGMENT_ROWS", min_rows)
    assert_read_as_v1(tmp_path_factory.mktemp("landing"), records, max_changes, TABLES)


def _spooled(path: Path, records: list[ChangeRecord], feed: Any) -> bytes:
    with open(path, "wb") as out:
        spool = tablefile.Spool(out)
        feed(spool)
        spool.close()
    tables: dict[str, int] = {}
    for r in records:
        if r.op != COMMIT:
            tables[r.qualified_table] = tables.get(r.qualified_table, 0) + 1
    final = path.with_suffix(".final")
    with open(final, "wb") as out:
        spool.finish(path, tables, len(records), out)
    return final.read_bytes()


def _many(n: int, seed: int) -> list[ChangeRecord]:
    """``n`` changes of three tables in a few shapes (absent columns, old keys), transactions of 1-40."""
    rnd = random.Random(seed)
    out: list[ChangeRecord] = []
    lsn, seq = 0x1000, 0
    for i in range(n):
        # (a rare table: a few changes a block, kept in the records segments)
        table = "rare" if rnd.random() < 0.002 else rnd.choice(["a", "b", "c"])
        op = rnd.choice("IIUD")
        cols = [Column("id", "integer", str(i)), Column("v", "text", rnd.choice([None, "x", "ü\n"]))]
        if op == "U" and rnd.random() < 0.3:
            cols = cols[:1]  # v unchanged TOAST: another shape
        ident = [Column("id", "integer", str(i))] if op != "I" else []
        seq += 1
        out.append(
            ChangeRecord(op, lsn, seq, i // 40, TS, "public", table, lsn - 1, cols if op != "D" else [], ident, ["id"])
        )
        if rnd.random() < 0.05:
            out.append(ChangeRecord("T", lsn, seq + 1, i // 40, TS, "public", table))  # to a records segment
            seq += 1
        if rnd.random() < 1 / 40:
            out.append(ChangeRecord(COMMIT, lsn, seq + 1, i // 40, TS))
            lsn, seq = lsn + 0x100, 0
    out.append(ChangeRecord(COMMIT, lsn, seq + 1, n // 40, TS))
    return out


# Blocks closed by either bound: (records, text bytes). _many's records hold about 40 bytes of
# texts each, so 60,000 bytes close a block every 1,500 records or so, at a record that passes it.
_BLOCK_BOUNDS = st.sampled_from(
    [
        (tablefile.BATCH_RECORDS, tablefile.BLOCK_TEXT_BYTES),
        (8192, tablefile.BLOCK_TEXT_BYTES),
        (8192, 60_000),
        (3000, 100_000),
    ]
)


def _block_bounds(monkeypatch: pytest.MonkeyPatch, bounds: tuple[int, int]) -> None:
    monkeypatch.setattr(tablefile, "BATCH_RECORDS", bounds[0])
    monkeypatch.setattr(tablefile, "BLOCK_TEXT_BYTES", bounds[1])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1 << 30), cuts=st.lists(st.integers(0, 30_000), max_size=6), block=_BLOCK_BOUNDS)
def test_the_same_records_give_the_same_bytes_one_by_one_or_in_arrow_blocks(
    tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch, seed: int, cuts: list[int], block: tuple[int, int]
) -> None:
    """Capture's columnar path hands the spool Arrow blocks (v2's decoded schema) of any size, with
    its parser's shape numbers or without, the row decoder records one by one, in any mix: the
    file's bytes depend on its records only, blocks closed by their record or their text bound."""
    _block_bounds(monkeypatch, block)
    records = _many(17_000, seed)
    root = tmp_path_factory.mktemp("spool")
    by_one = _spooled(root / "one", records, lambda s: [s.add(r) for r in records])
    bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})

    numbers: dict[Any, int] = {}
    rnd = random.Random(seed)

    def hint(rs: list[ChangeRecord]) -> Any:
        # Shape numbers as capture's parser gives them, but finer (a shape split at random): the
        # split must not depend on them.
        import numpy as np

        out = []
        for r in rs:
            shape = (r.op, r.schema, r.table, *((c.name, c.type) for c in r.columns), None)
            shape += (*((c.name, c.type) for c in r.identity), None, *r.pk)
            out.append(numbers.setdefault(shape, len(numbers)) * 3 + rnd.randrange(3))
        return np.array(out, np.int32)

    def mixed(spool: tablefile.Spool, hinted: bool) -> None:
        for k, (a, b) in enumerate(itertools.pairwise(bounds)):
            if k % 2:
                for r in records[a:b]:
                    spool.add(r)
            else:
                batch = changefile.record_batch(records[a:b]).cast(changefile.arrow_schema())
                spool.add_batch(batch, hint(records[a:b]) if hinted else None)

    assert _spooled(root / "mixed", records, lambda s: mixed(s, False)) == by_one
    assert _spooled(root / "hinted", records, lambda s: mixed(s, True)) == by_one
    got = tablefile.salvage(by_one)
    assert got.damage is None and list(tablefile.intact_records(got)) == records
    assert {s.layout is None for s, _ in got.segments} == {True, False}  # both kinds of segment


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1 << 30), cut=st.floats(0.0, 1.0), block=_BLOCK_BOUNDS)
def test_a_cut_v3_file_keeps_the_records_before_its_first_lost_segment(
    tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch, seed: int, cut: float, block: tuple[int, int]
) -> None:
    """Cut anywhere, a file keeps a prefix of its records: every record before the first ordinal
    of a lost segment (at most one block of ``BATCH_RECORDS`` records lost before the cut), and the
    load parks each table its header says lost some (every table, without a readable header)."""
    _block_bounds(monkeypatch, block)
    records = _many(17_000, seed)
    path = tmp_path_factory.mktemp("cut") / "f.tables.arrow"
    tablefile.write_file(path, records)
    whole = path.read_bytes()
    data = whole[: int(len(whole) * cut)]
    got = tablefile.salvage(data)
    kept = list(tablefile.readable_records(got))
    assert kept == records[: len(kept)]
    whole_segments = tablefile.salvage(whole).segments
    if got.header is not None:
        read = sum(len(b) for _, b in got.segments)
        assert len(kept) >= len(records) - (len(records) - read) - tablefile.BATCH_RECORDS
    name = LandingFile.name_for(records[0].position, records[-1].position, True, TABLES)
    f = LandingFile.parse(name)
    assert f is not None
    rows = list(decode_file(name, data, f.first.commit_lsn, (f.first, f.last)))
    parks = [r for r in rows if r["op"] == "park" and r["line"] == 0]
    if data == whole:
        assert not parks and len(whole_segments) > 3
    elif got.header is None:
        assert len(parks) == 1 and parks[0]["src_table"] is None
    else:
        counts: dict[str, int] = {}
        for r in records:
            if r.op != COMMIT:
                counts[r.qualified_table] = counts.get(r.qualified_table, 0) + 1
        lost = {t for t in counts if sum(1 for r in kept if r.op != COMMIT and r.qualified_table == t) < counts[t]}
        assert lost == {f"{p['src_schema']}.{p['src_table']}" for p in parks}


def test_shapes_never_merge_whatever_the_names_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture's blocks are split into shapes by the dictionary codes of their names and types, so
    names holding separators, commas or control characters cannot make two shapes one."""
    monkeypatch.setattr(tablefile, "MIN_SEGMENT_ROWS", 1)  # a rows segment for these few changes
    cols = [
        [Column("a,b", "text", "1")],
        [Column("a", "text", "2"), Column("b", "text", "3")],
        [Column("a|b", "text", "4")],
        [Column("a\x1fb", "text", "5")],
        [Column("a", "text,b", "6")],
        [Column("a", "text", "7"), Column("a", "text", "8")],  # a name twice keeps two columns
    ]
    records = [ChangeRecord("I", 0x100, i + 1, 7, TS, "public", "t", 0x90, c, [], []) for i, c in enumerate(cols)]
    records.append(ChangeRecord(COMMIT, 0x100, len(cols) + 1, 7, TS))
    batch = changefile.record_batch(records).cast(changefile.arrow_schema())
    data = _spooled(tmp_path / "s", records, lambda s: s.add_batch(batch))
    got = tablefile.salvage(data)
    assert list(tablefile.intact_records(got)) == records
    (layout,) = [s.layout for s, _ in got.segments if s.layout is not None]
    assert len(layout.shapes) == len(cols)


def test_a_block_spread_over_many_tables_stays_the_size_of_v2(tmp_path: Path) -> None:
    """A table with few changes in a block keeps them in the records segment (a segment per table
    would cost its framing for each of thousands of tables: files ten times v2's); a table with
    many gets its rows segment. Readers by columns take the records segment's changes apart into
    rows segments of their own (``rows_segments``), in position order per table."""
    records: list[ChangeRecord] = []
    lsn = 0x1000
    for i in range(16_384):
        table = "big" if i % 4 == 0 else f"t{i % 2000}"
        cols = [Column("id", "integer", str(i)), Column("v", "text", "x" * 20)]
        records.append(ChangeRecord("I", lsn, i + 1, 7, TS, "public", table, lsn - 1, cols, [], ["id"]))
    records.append(ChangeRecord(COMMIT, lsn, 16_385, 7, TS))
    tablefile.write_file(tmp_path / "v3", records)
    changefile.write_file(tmp_path / "v2", records)
    v3, v2 = (tmp_path / "v3").read_bytes(), (tmp_path / "v2").read_bytes()
    assert len(v3) < 1.5 * len(v2), (len(v3), len(v2))
    got = tablefile.salvage(v3)
    assert list(tablefile.intact_records(got)) == records
    assert {s.layout.table for s, _ in got.segments if s.layout is not None} == {"big"}
    by_table: dict[str, list[int]] = {}
    for seg, batch in tablefile.rows_segments(got.segments):
        by_table.setdefault(seg.layout.table, []).extend(batch.column(0).to_pylist())
    assert len(by_table) == len({r.table for r in records[:-1]}) and sum(map(len, by_table.values())) == 16_384
    assert all(ords == sorted(ords) for ords in by_table.values())
