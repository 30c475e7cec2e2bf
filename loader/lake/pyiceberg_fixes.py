"""A cost of pyiceberg's that grows with a table's age, removed where the loader uses pyiceberg.

pyiceberg's ``Transaction.table_metadata`` replays the transaction's staged updates onto the
table's metadata and returns a deep copy of the result, snapshot list included, on every read; a
single append reads it about 17 times. Its cost is the table's history, not the work: measured
here (local catalog, one-row appends), 13 ms an append at 10 snapshots, 316 ms at 500, 596 ms at
1,000. Follow mode commits a changed table every cycle, so between snapshot expiries its commits
slowed down by the hour. Upstream knows it (apache/iceberg-python#2673; the cache below is the one
of #3302, approved there and closed unmerged, carried on in #3784); pyiceberg's main still reads
the metadata this way.

:func:`apply` makes the property compute once per transaction state: the result is kept with the
two objects it came from (the table's metadata, the tuple of staged updates) and returned again
while both are the same objects. Staging an update rebinds the tuple and a commit replaces the
table's metadata, so either makes the next read compute afresh; the cache holds both objects, so
neither identity can be reused while it is kept. Readers get the same metadata object twice
instead of two equal copies: pyiceberg's models are immutable (frozen), and no pyiceberg code
path changes the returned metadata in place (``tests/test_pyiceberg_fixes.py`` holds the
metadata a transaction commits equal with and without the cache).

The same replay (``update_table_metadata``) then ends in ``model_copy(deep=True)`` of the whole
metadata, and a commit still runs it three times (the transaction's state after its updates are
staged, the catalog's new metadata): 25 ms a copy at 200 snapshots, 75 ms of a 100 ms commit,
growing with the table's history as above. Every update it applies builds new containers (a new
snapshot list, a new properties dict; ``tests/test_pyiceberg_fixes.py`` checks the base metadata
unchanged), so :func:`apply` also installs the same replay ending in a shallow copy: the new
metadata shares the unchanged snapshots, schemas and lists with the old, as Iceberg's Java
``TableMetadata.Builder`` does.

Every ``load_table`` of pyiceberg's SQL catalog reads and parses the table's metadata file (an S3
GET, and a parse that grows with the history: 7 ms at 200 snapshots), and the load reads a table
about five times a group (prepared, appended, the commit's check of the current metadata, the
ledger's twice). A metadata file is written once under a name of its own and never changed
(Iceberg's rule: a commit writes a new file and swaps the catalog's pointer), so
:class:`MetadataFiles` keeps the parsed metadata of the files it read or the loader wrote, by
location: a table whose catalog row still points at a kept file is not read again, and one another
writer committed to points elsewhere and is read as before. Bounded by files and by snapshots held.

pyiceberg hands pyarrow's Parquet writer only the arguments it derives from Iceberg's table
properties (codec, page and dictionary sizes). :func:`apply` also lets a write add its own
(:data:`WRITER_OPTIONS_PROPERTY`, JSON on the copy of the metadata the write uses): the loader's
encodings (``loader.lake.files.parquet_encodings``: integer-like columns delta-encoded).

Applied when the loader opens a pyiceberg catalog (:func:`loader.lake.catalog.open_catalog`), and
only to the pyiceberg versions it was checked against (``CHECKED``): another version keeps its own
behaviour, with a warning naming this module.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

log = logging.getLogger("loader.lake")

CHECKED = frozenset({"0.12.0"})
# Arguments for pyarrow's ParquetWriter beyond the ones pyiceberg derives from table properties
# (JSON, on the copy of the metadata a write uses; never committed): loader.lake.files'
# parquet_encodings.
WRITER_OPTIONS_PROPERTY = "loader.write.parquet-writer-options"
_APPLIED = "_loader_cached_table_metadata"
ORIGINAL = "_loader_pyiceberg_table_metadata"
# Where pyiceberg's modules hold update_table_metadata by name (imported with "from ... import").
_REPLAY_HOLDERS = ("pyiceberg.table.update", "pyiceberg.table", "pyiceberg.catalog")


def apply() -> bool:
    """Install the cache on ``pyiceberg.table.Transaction`` (once); whether it is in place."""
    import pyiceberg
    import pyiceberg.table as pyiceberg_table
    from pyiceberg.table import Transaction

    if getattr(Transaction, _APPLIED, False):
        return True
    if pyiceberg.__version__ not in CHECKED:
        log.warning(
            "pyiceberg %s is not one loader.lake.pyiceberg_fixes was checked against (%s): commits keep "
            "pyiceberg's own metadata reads, whose cost grows with the table's snapshots",
            pyiceberg.__version__,
            ", ".join(sorted(CHECKED)),
        )
        return False

    def table_metadata(self: Any) -> Any:
        base, updates = self._table.metadata, self._updates
        kept = self.__dict__.get(_APPLIED)
        if kept is not None and kept[0] is base and kept[1] is updates:
            return kept[2]
        metadata = pyiceberg_table.update_table_metadata(base, updates)  # the name pyiceberg's own reads call
        self.__dict__[_APPLIED] = (base, updates, metadata)
        return metadata

    _install_shallow_replay()
    _install_metadata_files()
    _install_writer_options()
    table_metadata.__doc__ = (
        "The transaction's metadata (pyiceberg's, computed once per state: loader.lake.pyiceberg_fixes)."
    )
    setattr(Transaction, ORIGINAL, Transaction.__dict__["table_metadata"])  # for tests: pyiceberg's own
    Transaction.table_metadata = property(table_metadata)  # type: ignore[method-assign,assignment]
    setattr(Transaction, _APPLIED, True)
    return True


def original_replay() -> Any:
    """pyiceberg's own ``update_table_metadata`` (for tests)."""
    import pyiceberg.table.update as replay

    return getattr(replay, ORIGINAL, replay.update_table_metadata)


def _install_shallow_replay() -> None:
    """``update_table_metadata`` as pyiceberg 0.12.0 writes it, ending in a shallow copy instead of
    a deep one (see the module's docstring), wherever pyiceberg's modules call it by name."""
    import importlib
    from datetime import datetime

    import pyiceberg.table.update as replay
    from pyiceberg.utils.datetime import datetime_to_millis

    original = replay.update_table_metadata

    def update_table_metadata(
        base_metadata: Any,
        updates: tuple[Any, ...],
        enforce_validation: bool = False,
        metadata_location: str | None = None,
    ) -> Any:
        context = replay._TableMetadataUpdateContext()
        new_metadata = base_metadata
        for update in updates:
            new_metadata = replay._apply_table_update(update, new_metadata, context)
        if context.has_changes():
            if metadata_location:
                new_metadata = replay._update_table_metadata_log(
                    new_metadata, metadata_location, base_metadata.last_updated_ms
                )
            if base_metadata.last_updated_ms == new_metadata.last_updated_ms:
                now = datetime_to_millis(datetime.now().astimezone())
                new_metadata = new_metadata.model_copy(update={"last_updated_ms": now})
        new_metadata.spec().check_compatible(new_metadata.schema())
        new_metadata.sort_order().check_compatible(new_metadata.schema())
        if enforce_validation:
            return replay.TableMetadataUtil.parse_obj(new_metadata.model_dump())
        return new_metadata.model_copy()

    update_table_metadata.__doc__ = original.__doc__
    setattr(replay, ORIGINAL, original)
    for holder in _REPLAY_HOLDERS:
        module = importlib.import_module(holder)
        if getattr(module, "update_table_metadata", None) is original:
            module.update_table_metadata = update_table_metadata  # type: ignore[attr-defined]


class MetadataFiles:
    """Parsed table metadata by file location, least recently used dropped first once more than
    ``max_files`` files or ``max_entries`` snapshots and log entries are held."""

    def __init__(self, max_files: int = 128, max_entries: int = 200_000) -> None:
        self.max_files, self.max_entries = max_files, max_entries
        self._kept: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()
        self.reads = 0  # files read and parsed (for tests)

    def get(self, location: str) -> Any:
        with self._lock:
            kept = self._kept.get(location)
            if kept is None:
                return None
            self._kept.move_to_end(location)
            return kept[0]

    def put(self, location: str, metadata: Any) -> None:
        size = len(metadata.snapshots) + len(metadata.snapshot_log) + len(metadata.metadata_log) + 1
        with self._lock:
            if location in self._kept:
                return
            self._kept[location] = (metadata, size)
            self._entries += size
            while self._kept and (len(self._kept) > self.max_files or self._entries > self.max_entries):
                _, (_, dropped) = self._kept.popitem(last=False)
                self._entries -= dropped

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._entries = 0


METADATA_FILES = MetadataFiles()


def _install_metadata_files() -> None:
    """The SQL catalog's table reads through :data:`METADATA_FILES`, which also keeps what its
    commits and creates write."""
    from pyiceberg.catalog import Catalog, load_file_io
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.serializers import FromInputFile, ToOutputFile
    from pyiceberg.table import Table

    original_convert = SqlCatalog._convert_orm_to_iceberg

    def _convert_orm_to_iceberg(self: Any, orm_table: Any) -> Any:
        location = orm_table.metadata_location
        if not location or not orm_table.table_namespace or not orm_table.table_name:
            return original_convert(self, orm_table)  # pyiceberg's own errors
        metadata = METADATA_FILES.get(location)
        if metadata is None:  # read as pyiceberg reads it
            io = load_file_io(properties=self.properties, location=location)
            metadata = FromInputFile.table_metadata(io.new_input(location))
            METADATA_FILES.reads += 1
            METADATA_FILES.put(location, metadata)
        return Table(
            identifier=(*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def _write_metadata(metadata: Any, io: Any, metadata_path: str) -> None:
        ToOutputFile.table_metadata(metadata, io.new_output(metadata_path))  # a new file: fails if it exists
        METADATA_FILES.put(metadata_path, metadata)

    SqlCatalog._convert_orm_to_iceberg = _convert_orm_to_iceberg  # type: ignore[method-assign]
    SqlCatalog._write_metadata = staticmethod(_write_metadata)  # type: ignore[method-assign,assignment]


def _install_writer_options() -> None:
    """pyiceberg's Parquet writer arguments with :data:`WRITER_OPTIONS_PROPERTY`'s added."""
    import json

    import pyiceberg.io.pyarrow as pyiceberg_arrow

    original = pyiceberg_arrow._get_parquet_writer_kwargs

    def _get_parquet_writer_kwargs(table_properties: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = original(table_properties)
        if extra := table_properties.get(WRITER_OPTIONS_PROPERTY):
            kwargs.update(json.loads(extra))
        return kwargs

    pyiceberg_arrow._get_parquet_writer_kwargs = _get_parquet_writer_kwargs
