"""loader.lake.pyiceberg_fixes: a transaction's metadata computed once per state, and the same
commits as pyiceberg's own reads make.

No database, no Spark: pyiceberg's SQL catalog on SQLite in a temporary folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Transaction
from pyiceberg.types import StringType

from loader.lake import pyiceberg_fixes


@contextlib.contextmanager
def _cached(on: bool) -> Iterator[None]:
    """With the fixes (``on``), or pyiceberg's own metadata reads and replay."""
    import importlib

    assert pyiceberg_fixes.apply()
    fixed = Transaction.__dict__["table_metadata"]
    holders = [importlib.import_module(name) for name in pyiceberg_fixes._REPLAY_HOLDERS]
    shallow = [m.update_table_metadata for m in holders]  # type: ignore[attr-defined]
    assert all(f is not pyiceberg_fixes.original_replay() for f in shallow)
    files = pyiceberg_fixes.METADATA_FILES
    files.clear()
    bound = files.max_files
    if not on:
        Transaction.table_metadata = getattr(Transaction, pyiceberg_fixes.ORIGINAL)  # type: ignore[method-assign]
        for m in holders:
            m.update_table_metadata = pyiceberg_fixes.original_replay()  # type: ignore[attr-defined]
        files.max_files = 0  # every read parses its file, as pyiceberg's own reads do
    try:
        yield
    finally:
        Transaction.table_metadata = fixed  # type: ignore[method-assign]
        for m, f in zip(holders, shallow, strict=True):
            m.update_table_metadata = f  # type: ignore[attr-defined]
        files.max_files = bound
        files.clear()


def _catalog(root: Path) -> Any:
    root.mkdir()
    return SqlCatalog("c", uri=f"sqlite:///{root}/c.db", warehouse=f"file://{root}/wh")


def _table(root: Path, appends: int, **properties: str) -> tuple[Any, Any]:
    """A catalog under ``root`` and its table ``n.t`` with ``appends`` appends of 10 rows."""
    catalog = _catalog(root)
    catalog.create_namespace("n")
    t = catalog.create_table("n.t", schema=_rows(0, 1).schema, properties=properties)
    for k in range(appends):
        t.append(_rows(k * 10, 10))
    return catalog, t


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


def _workload(catalog: Any) -> Any:
    """Appends, a delete, a schema change staged in the same transaction as an append, properties."""
    catalog.create_namespace("n")
    t = catalog.create_table("n.t", schema=_rows(0, 1).schema, properties={"a": "1"})
    for k in range(5):
        t.append(_rows(k * 10, 10))
    t.delete(EqualTo("id", 3))
    with t.transaction() as tx:
        with tx.update_schema() as schema:
            schema.add_column("w", StringType())
        tx.append(pa.table({"id": pa.array([100], pa.int64()), "v": ["x"], "w": ["y"]}))
        tx.set_properties(b="2")
    t = catalog.load_table("n.t")
    return t


def _picture(t: Any) -> dict[str, Any]:
    """What a commit decides, without what differs run to run (ids, times, paths)."""
    md = t.metadata
    summaries = [
        {k: v for k, v in s.summary.additional_properties.items() if "size" not in k} | {"op": s.summary.operation}
        for s in md.snapshots
    ]
    return {
        "schemas": [s.model_dump() for s in md.schemas],
        "current_schema": md.current_schema_id,
        "specs": [s.model_dump() for s in md.partition_specs],
        "properties": md.properties,
        "snapshots": summaries,
        "parents": [s.parent_snapshot_id is None for s in md.snapshots],
        "rows": sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["id"]),
    }


def test_commits_are_the_same_with_and_without_the_cache(tmp_path: Path) -> None:
    with _cached(False):
        theirs = _picture(_workload(_catalog(tmp_path / "without")))
    with _cached(True):
        ours = _picture(_workload(_catalog(tmp_path / "with")))
    assert ours == theirs
    assert len(ours["snapshots"]) == 7 and len(ours["rows"]) == 50  # 5 appends, a delete, the last transaction


@pytest.mark.parametrize("on", [False, True])
def test_an_append_computes_the_metadata_once_per_state(tmp_path: Path, on: bool, monkeypatch: Any) -> None:
    """pyiceberg 0.12 replays and deep-copies the metadata on each of about 17 reads an append
    makes; with the cache, once per staged state (the reads of one state share one copy)."""
    import pyiceberg.table as pyiceberg_table

    calls = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    with _cached(on):
        _, t = _table(tmp_path / "c", 1)
        real = pyiceberg_table.update_table_metadata
        with monkeypatch.context() as patch:  # undone before _cached puts the fixes back
            patch.setattr(pyiceberg_table, "update_table_metadata", counted)
            t.append(_rows(10, 10))
    if on:
        assert len(calls) <= 3, len(calls)
    else:
        assert len(calls) >= 10, len(calls)  # what the cache is for: pyiceberg's own count


def test_a_commit_shares_what_it_did_not_change_and_leaves_the_old_metadata_as_it_was(tmp_path: Path) -> None:
    """The replay ends in a shallow copy (pyiceberg's ends in a deep one, whose cost is the table's
    history): the new metadata holds the very snapshot objects the old one did, and the old one,
    the table's metadata before the commit, reads as it did (no update changed it in place)."""
    with _cached(True):
        catalog, t = _table(tmp_path / "c", 3, a="1")
        before = t.metadata
        picture = before.model_dump_json()
        with t.transaction() as tx:
            tx.set_properties(b="2")
            tx.remove_properties("a")
            tx.append(_rows(100, 1))
            staged = tx.table_metadata
        after = t.metadata
    assert before.model_dump_json() == picture
    assert len(staged.snapshots) == 4 and all(
        a is b for a, b in zip(staged.snapshots[:3], before.snapshots, strict=True)
    )
    assert staged.schemas[0] is before.schemas[0]
    for md in (staged, after):
        assert md.properties.get("b") == "2" and "a" not in md.properties
    assert before.properties["a"] == "1" and len(after.snapshots) == 4
    assert catalog.load_table("n.t").scan().to_arrow().num_rows == 31


def test_a_table_is_read_again_only_when_its_catalog_row_points_at_another_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Metadata files are written once: a table read again, or read after this process committed
    to it, is not parsed again, and what it holds is what pyiceberg parses from the file; a commit
    by another writer (a Spark job: its file is not one this process wrote) moves the catalog's
    pointer, and the next read parses the new file."""
    from pyiceberg.serializers import FromInputFile, ToOutputFile

    files = pyiceberg_fixes.METADATA_FILES
    with _cached(True):
        catalog, _ = _table(tmp_path / "c", 1)
        reads = files.reads
        first, again = catalog.load_table("n.t"), catalog.load_table("n.t")
        assert files.reads == reads and first.metadata is again.metadata
        parsed = FromInputFile.table_metadata(first.io.new_input(first.metadata_location))
        assert parsed.model_dump() == first.metadata.model_dump()

        def elsewhere(metadata: Any, io: Any, metadata_path: str) -> None:
            ToOutputFile.table_metadata(metadata, io.new_output(metadata_path))

        with monkeypatch.context() as patch:  # another writer: its metadata file is not kept here
            patch.setattr(type(catalog), "_write_metadata", staticmethod(elsewhere))
            catalog.load_table("n.t").append(_rows(10, 5))
        latest = catalog.load_table("n.t")
        assert files.reads == reads + 1
        assert len(latest.metadata.snapshots) == 2 and latest.scan().to_arrow().num_rows == 15
        assert catalog.load_table("n.t").metadata is latest.metadata and files.reads == reads + 1


def test_the_metadata_kept_is_bounded_by_files_and_by_snapshots() -> None:
    class Md:
        def __init__(self, n: int) -> None:
            self.snapshots, self.snapshot_log, self.metadata_log = [0] * n, [0] * n, []

    files = pyiceberg_fixes.MetadataFiles(max_files=2, max_entries=25)
    for k in range(3):
        files.put(f"f{k}", Md(1))
    assert files.get("f0") is None and files.get("f1") is not None and files.get("f2") is not None
    files.put("big", Md(10))  # 21 entries: f1 (3) and f2 (3) would make 27, so the least recent goes
    assert files.get("big") is not None and files.get("f1") is None
    files.put("huge", Md(50))  # larger than the bound alone: not kept, nothing else either
    assert files.get("huge") is None and files.get("big") is None
