"""The executors' columnar decoding of landing v2 and v3 change files (``decode.plain_change_rows``,
``decode.plain_table_rows``) against the record-by-record decoding (``decode.decode_file``): for
every file it takes, the same rows.

Random files mix plain changes with what it must leave to the row path: control and quarantined
records, positions repeated, out of order or outside the file's span, commit times that are not
timestamps, shapes the decoder refuses (no table, a name twice, names equal but for case, names
longer than PostgreSQL's, a key column missing, a delete without its old key), null values, and
damaged bytes. A file it takes must give exactly the row path's rows; a file it leaves must be one
the row path finds something in (a reject, a park or a control row) or that is damaged, out of order
or not placed as the name says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import CHANGES, TABLES, LandingFile, LandingWriter, LocalLandingStore
from loader.load.decode import _arrow_schema, decode_file, plain_change_rows, plain_table_rows, rows_to_batch

_COLUMNAR = {CHANGES: plain_change_rows, TABLES: plain_table_rows}

_NAMES = ["id", "a", "Id", "select", "b" * 64, "v"]
_TS = ["2026-01-01 00:00:00+00", "2026-01-01 00:00:00.5+00", "yesterday"]


@st.composite
def _records(draw: st.DrawFn) -> list[ChangeRecord]:
    """Transactions of records, mostly plain, some not (see the module docstring)."""
    out: list[ChangeRecord] = []
    lsn = 500
    plain_only = draw(st.booleans())
    for _ in range(draw(st.integers(1, 4))):
        seq = 0
        ts = draw(st.sampled_from(_TS))
        for _ in range(draw(st.integers(0, 12))):
            seq = max(0, seq + (1 if plain_only else draw(st.sampled_from([1, 1, 1, 1, 0, -1]))))
            op = draw(st.sampled_from("IUDT" if plain_only else "IUDRTSPX"))
            if plain_only:
                names = ["id", *draw(st.lists(st.sampled_from(["a", "v", "select"]), max_size=2, unique=True))]
                key = ["id"] if op in "UD" else []
                pk = ["id"]
                schema = "public"
            else:
                names = draw(st.lists(st.sampled_from(_NAMES), max_size=4))
                key = draw(st.lists(st.sampled_from(_NAMES), max_size=2))
                pk = draw(st.lists(st.sampled_from(_NAMES[:2]), max_size=2))
                schema = draw(st.sampled_from(["public", "public", ""]))
            values = draw(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=len(names), max_size=len(names)))
            out.append(
                ChangeRecord(
                    op,
                    lsn,
                    seq,
                    7,
                    ts,
                    schema,
                    draw(st.sampled_from(["t", "u"])),
                    change_lsn=lsn - 1,
                    columns=[
                        Column(n, draw(st.sampled_from(["integer", "text"])), v)
                        for n, v in zip(names, values, strict=True)
                    ],
                    identity=[Column(k, "integer", "1") for k in key],
                    pk=pk,
                    reason=draw(st.sampled_from(["", "why"])) if op in "SPX" else "",
                )
            )
        out.append(ChangeRecord(COMMIT, lsn, max([0, *(r.seq for r in out if r.commit_lsn == lsn)]) + 1, 7, ts))
        lsn += draw(st.integers(1, 3))
    return out


def _file(tmp: Path, records: list[ChangeRecord], fmt: str = CHANGES) -> tuple[str, bytes]:
    store = LocalLandingStore(tmp)
    for f in store.files():
        store.delete(f.name)
    writer = LandingWriter(store, max_changes=10_000, format=fmt)
    for r in records:
        writer.write(r)
    writer.close_file()
    (f,) = store.files()
    return f.name, (tmp / f.name).read_bytes()


def _row_path(name: str, data: bytes) -> tuple[list[dict[str, Any]], tuple[Any, Any] | None]:
    parsed = LandingFile.parse(name)
    span = (parsed.first, parsed.last) if parsed is not None else None
    first = parsed.first.commit_lsn if parsed is not None else 0
    return list(decode_file(name, data, first, span)), span


@pytest.mark.parametrize("fmt", [CHANGES, TABLES])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_records(), damage=st.sampled_from([None, None, None, "cut", "flip"]), at=st.floats(0.05, 0.95))
def test_columnar_decoding_gives_the_row_paths_rows(
    tmp_path: Path, fmt: str, records: list[ChangeRecord], damage: str | None, at: float
) -> None:
    if not any(r.op != COMMIT for r in records):
        return  # an empty file is never written
    name, data = _file(tmp_path / "land", records, fmt)
    if damage == "cut":
        data = data[: int(len(data) * at)]
    elif damage == "flip":
        i = int(len(data) * at)
        data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]
    rows, span = _row_path(name, data)
    got = _COLUMNAR[fmt](name, data, span)
    event("taken in columns" if got is not None else "left to the row path")
    if got is None:
        # (v3's columnar decoding takes changes only: a truncate or read record is in a records
        # segment, v2's layout, which the row path reads)
        taken = ("insert", "update", "delete") + (("truncate", "read") if fmt == CHANGES else ())
        plainly = all(r["reject_reason"] is None and r["op"] in taken for r in rows)
        if damage is not None:
            return  # (a damaged file's park rows have no position)
        increasing = [(r["commit_lsn"], r["seq"]) for r in rows] == sorted({(r["commit_lsn"], r["seq"]) for r in rows})
        assert not plainly or not increasing, rows
        return
    want = rows_to_batch(rows, _arrow_schema())
    assert got.schema == want.schema
    assert pa.Table.from_batches([got]).to_pylist() == pa.Table.from_batches([want]).to_pylist()


def test_a_column_name_damaged_into_invalid_utf8_is_damage_not_a_crash(tmp_path: Path) -> None:
    """A flipped byte inside a column name of the stream's schema message (found by the test
    above: Arrow then raises UnicodeDecodeError when the names are read): the file's header is
    unreadable, which parks its tables, and both decoders say so instead of stopping the load."""
    from loader.landing import changefile

    records = [
        ChangeRecord(
            "I", 500, 1, 7, "2026-01-01 00:00:00+00", "public", "t", 499, [Column("id", "integer", "1")], [], ["id"]
        ),
        ChangeRecord(COMMIT, 500, 2, 7, "2026-01-01 00:00:00+00"),
    ]
    name, data = _file(tmp_path / "land", records)
    at = data.index(b"change_lsn")
    damaged = data[:at] + b"\xff" + data[at + 1 :]
    got = changefile.salvage(damaged)
    assert got.header is None and got.damage is not None and "header" in got.damage, got.damage
    rows, span = _row_path(name, damaged)
    assert plain_change_rows(name, damaged, span) is None
    assert rows and all(r["op"] == "park" or r["reject_reason"] is not None for r in rows), rows


@pytest.mark.parametrize("fmt", [CHANGES, TABLES])
def test_plain_files_are_taken_in_columns(tmp_path: Path, fmt: str) -> None:
    """The common file (row changes of a few shapes, nulls, unchanged TOAST left out) is taken:
    the executors decode it without a Python object per record."""
    recs: list[ChangeRecord] = []
    for s in range(1, 400):
        op = "IUD"[s % 3]
        cols = [] if op == "D" else [Column("id", "integer", str(s)), Column("v", "text", None if s % 7 else "x")]
        if op == "U" and s % 2:
            cols = cols[:1]  # v unchanged in TOAST: absent
        recs.append(
            ChangeRecord(
                op,
                900,
                s,
                3,
                "2026-01-01 00:00:00+00",
                "public",
                "t",
                change_lsn=899,
                columns=cols,
                identity=[Column("id", "integer", str(s))] if op != "I" else [],
                pk=["id"],
            )
        )
    recs.append(ChangeRecord(COMMIT, 900, 400, 3, "2026-01-01 00:00:00+00"))
    name, data = _file(tmp_path / "land", recs, fmt)
    rows, span = _row_path(name, data)
    got = _COLUMNAR[fmt](name, data, span)
    assert got is not None and got.num_rows == 399
    assert pa.Table.from_batches([got]).to_pylist() == rows_to_batch(rows, _arrow_schema()).to_pylist()
