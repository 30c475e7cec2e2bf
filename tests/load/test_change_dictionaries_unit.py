"""The driver load reads a landing v2 change file's column names, types and key names as the file
stores them (dictionary-encoded per batch) and numbers the rows' shapes from those dictionaries. A
file whose dictionaries repeat a text (another writer's, or batches written with fresh
dictionaries) must read exactly as the same records written with one entry per text."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from loader.lake.tables import SourceTable
from loader.landing import changefile
from loader.landing.records import COMMIT, ChangeRecord, Column
from loader.landing.store import CHANGES, LandingFile, LocalLandingStore
from loader.load.driver import PlainBatch
from loader.load.sql import HistoryColumn

TS = "2026-11-26 10:00:00+00"
TABLE = SourceTable("public", "t")


def _records() -> list[ChangeRecord]:
    recs = []
    for i in range(40):
        cols = [Column("id", "integer", str(i)), Column("v", "text", f"v{i}")]
        if i % 3 == 0:
            cols.append(Column("w", "bigint", str(-i)))
        recs.append(ChangeRecord("I", 100, i + 1, 7, TS, "public", "t", columns=cols, pk=["id"]))
    recs.append(ChangeRecord(COMMIT, 100, 41, 7, TS))
    return recs


def _repeat_dictionaries(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every column-name and type dictionary doubled (each text twice), odd rows
    pointing at the second copy."""
    columns = batch.column("columns")
    entries = columns.values
    fields = []
    for name in ("name", "type"):
        d = entries.field(name)
        twice = pa.concat_arrays([d.dictionary, d.dictionary])
        odd = pc.equal(pc.bit_wise_and(pa.array(range(len(d)), pa.int64()), 1), 1)
        shifted = pc.if_else(odd, pc.add(d.indices, len(d.dictionary)), d.indices).cast(pa.int32())
        fields.append(pa.DictionaryArray.from_arrays(shifted, twice))
    struct = pa.StructArray.from_arrays(
        [*fields, entries.field("value")], fields=list(entries.type), mask=pc.is_null(entries)
    )
    rebuilt = pa.ListArray.from_arrays(columns.offsets, struct, type=columns.type)
    arrays = [rebuilt if n == "columns" else batch.column(n) for n in batch.schema.names]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


def test_a_change_file_whose_dictionaries_repeat_texts_reads_the_same(tmp_path: Path) -> None:
    recs = _records()
    name = LandingFile.name_for(recs[0].position, recs[-1].position, True, CHANGES)
    plain_dir, repeated_dir = tmp_path / "a" / "slot", tmp_path / "b" / "slot"
    plain_dir.mkdir(parents=True)
    repeated_dir.mkdir(parents=True)
    changefile.write_file(plain_dir / name, recs)
    reader = pa.ipc.open_stream(pa.BufferReader((plain_dir / name).read_bytes()))
    batches = [_repeat_dictionaries(b) for b in reader]
    assert len(batches[0].column("columns").values.field("name").dictionary) == 6  # id, v, w twice
    with pa.ipc.new_stream(str(repeated_dir / name), reader.schema) as out:
        for b in batches:
            out.write_batch(b)
    # Records read the same (texts decoded) ...
    a, b = LocalLandingStore(plain_dir), LocalLandingStore(repeated_dir)
    assert list(a.read_records(name)) == list(b.read_records(name))
    # ... and the driver load numbers the same shapes and writes the same rows.
    columns = [HistoryColumn("id", "integer"), HistoryColumn("v", "text"), HistoryColumn("w", "bigint")]
    target = pa.schema(
        [
            ("id", pa.int32()),
            ("v", pa.string()),
            ("w", pa.int64()),
            ("pg_seq", pa.int64()),
            ("pg_operation", pa.string()),
        ]
    )
    got = []
    for store in (a, b):
        batch = PlainBatch(store, store.files(), 1 << 30)
        got.append((len([s for s in batch.shapes if s is not None]), batch.history_rows(TABLE, columns, target)))
    assert got[0][0] == got[1][0] == 2  # with and without w
    assert got[0][1].equals(got[1][1])
    assert got[0][1].column("w").to_pylist()[:4] == [0, None, None, -3]
