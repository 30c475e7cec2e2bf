"""Iceberg appends without a JVM (pyiceberg): the driver load's history rows and its ledger.

pyiceberg writes the data files (by the table's partition spec, with its Parquet settings) and
commits through the catalog tables Spark's Iceberg catalog uses, with the same optimistic
concurrency: a commit that lost a race is retried on the new metadata (the table's
``commit.retry.*`` properties). Snapshot-summary values and table properties go into the same
commit as the rows.

A Spark session of the same process keeps tables cached (Iceberg's caching catalog): after a
commit here, :func:`append_arrow` refreshes the table in that session, if one runs, so what the
process reads next through Spark (the merge of ``loader run``) sees it.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.errors import WarehouseUnavailableError
from loader.lake.files import write_properties

if TYPE_CHECKING:
    import pyarrow as pa


MANIFEST_MERGE = "commit.manifest-merge.enabled"


@dataclass(frozen=True)
class OwnFile:
    """A part of :func:`append_arrow`'s ``parts`` written to data files of its own, never in one
    with the parts before or after it: rows that sort before parts already written (a park that the
    rows of a streamed transaction, typed as they were written, turned out to need) would otherwise
    leave a data file that is not in position order inside itself."""

    rows: pa.Table


def append_arrow(
    table: Any,
    parts: pa.Table | Iterable[pa.Table | OwnFile],
    summary: dict[str, str],
    properties: dict[str, str] | None = None,
    spark: Any = None,
    spark_ident: str | None = None,
    hint: str = "nothing was marked loaded; re-run 'loader load' once the warehouse answers",
    remove: list[str] | None = None,
    buffer_bytes: int = 128 << 20,
) -> int:
    """Append ``parts`` (Arrow tables in the table's schema, with its field ids) to ``table`` (a
    pyiceberg Table, as loaded: a commit that lost a race is retried on newer metadata) in one
    commit that also writes ``summary`` into the snapshot summary and sets ``properties`` (and
    removes ``remove``). Returns the rows appended. Parts are written once ``buffer_bytes`` of them
    are held (bounded memory for a streamed batch, files of a useful size for a batch of many small
    parts); an :class:`OwnFile` part is written alone. Files of a commit that failed are removed
    unless its outcome is unknown (then orphan cleanup takes them if it did not land). A warehouse
    that does not answer: WarehouseUnavailableError (``hint``), never bad data."""
    written: list[str] = []
    with _appending(table, written, summary, properties or {}, remove or [], hint) as (tx, append):

        def add(data_file: Any) -> None:
            written.append(data_file.file_path)
            append.append_data_file(data_file)

        total = write_parts(tx.table_metadata, table.io, parts, append.commit_uuid, add, buffer_bytes)
    if spark is not None and spark_ident is not None:
        refresh_spark(spark, spark_ident)
    return total


@contextlib.contextmanager
def _appending(
    table: Any, written: list[str], summary: dict[str, str], properties: dict[str, str], remove: list[str], hint: str
) -> Iterator[tuple[Any, Any]]:
    """One append to ``table`` in one commit: the transaction and its snapshot producer (data files
    are added to the latter), with ``summary`` in the snapshot summary, ``properties`` set and
    ``remove`` removed. The files in ``written`` are deleted when the commit fails for certain."""
    properties = dict(properties)
    if MANIFEST_MERGE not in table.properties:
        # Iceberg's Java appends merge manifests by default (past commit.manifest.min-count-to-merge);
        # pyiceberg's only when the property says so: written out, or a table appended every few
        # seconds would gather one manifest per commit until maintenance rewrote them.
        properties[MANIFEST_MERGE] = "true"
    with (
        uncommitted_removed(table.io, written),
        warehouse_answers(f"appending to {'.'.join(table.name())}", hint),
        table.transaction() as tx,
    ):
        if properties:
            tx.set_properties(properties)
        if remove:
            tx.remove_properties(*remove)
        with tx.update_snapshot(snapshot_properties=dict(summary)).merge_append() as append:
            yield tx, append


def write_parts(
    metadata: Any,
    io: Any,
    parts: pa.Table | Iterable[pa.Table | OwnFile],
    write_uuid: Any,
    add: Callable[[Any], None],
    buffer_bytes: int = 128 << 20,
) -> int:
    """Write ``parts`` (Arrow tables in the schema of the table ``metadata`` describes) to data
    files, handing each file to ``add`` as it is written (pyiceberg's DataFile; nothing is
    committed here). Parts are written once ``buffer_bytes`` of them are held; an :class:`OwnFile`
    part is written alone. Returns the rows written."""
    import pyarrow as pa

    counter = itertools.count(0)
    held: list[pa.Table] = []
    total = 0

    def write() -> None:
        rows = pa.concat_tables(held) if len(held) > 1 else held[0]
        held.clear()
        for data_file in data_files(metadata, rows, io, write_uuid, counter):
            add(data_file)

    for part in [parts] if isinstance(parts, pa.Table) else parts:
        alone = isinstance(part, OwnFile)
        rows = part.rows if isinstance(part, OwnFile) else part
        if not rows.num_rows:
            continue
        total += rows.num_rows
        if alone and held:
            write()
        held.append(rows)
        if alone or sum(t.nbytes for t in held) >= buffer_bytes:
            write()
    if held:
        write()
    return total


def commit_data_files(
    table: Any,
    files: list[Any],
    summary: dict[str, str],
    properties: dict[str, str],
    remove: list[str],
    hint: str,
) -> None:
    """Commit data files already written (:func:`write_parts`) to ``table`` (pyiceberg's, as
    loaded: a commit that lost a race is retried on newer metadata) in one append that also writes
    ``summary`` into the snapshot summary, sets ``properties`` and removes ``remove``: what
    :func:`append_arrow` commits, for files written earlier. The files are deleted when the commit
    fails for certain (kept when its outcome is unknown). A warehouse that does not answer:
    WarehouseUnavailableError (``hint``)."""
    with _appending(table, [f.file_path for f in files], summary, properties, remove, hint) as (_, append):
        for data_file in files:
            append.append_data_file(data_file)


def data_files(metadata: Any, rows: pa.Table, io: Any, write_uuid: Any, counter: itertools.count[int]) -> Iterable[Any]:
    """The data files of ``rows`` (pyiceberg's ``_dataframe_to_data_files``, written now as the
    iterator is consumed). Rows that all fall in one partition of a table partitioned by one field
    (a snapshot's rows, a day's changes in history: nearly every append) are written without
    pyiceberg's split, which filters a copy of every row out of the table for each partition and
    then combines its chunks into a third copy: a fifth of a snapshot's append on the driver."""
    import pyarrow.compute as pc
    from pyiceberg.io.pyarrow import (
        _dataframe_to_data_files,
        bin_pack_arrow_table,
        pyarrow_to_schema,
        schema_to_pyarrow,
    )
    from pyiceberg.io.pyarrow import write_file as write_data_files
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.schema import sanitize_column_names
    from pyiceberg.table import TableProperties, WriteTask
    from pyiceberg.utils.properties import property_as_int

    # The files carry the table's schema with its names sanitized as pyiceberg writes them.
    file_schema = schema_to_pyarrow(sanitize_column_names(metadata.schema()))
    properties = write_properties(metadata.properties, rows, file_schema)
    metadata = metadata.model_copy(update={"properties": properties})
    spec, schema = metadata.spec(), metadata.schema()
    if len(spec.fields) != 1 or not rows.num_rows:
        return _dataframe_to_data_files(metadata, rows, io, write_uuid, counter)
    field = spec.fields[0]
    column = rows.column(schema.find_column_name(field.source_id))
    values = pc.unique(field.transform.pyarrow_transform(schema.find_field(field.source_id).field_type)(column))
    if len(values) != 1:
        return _dataframe_to_data_files(metadata, rows, io, write_uuid, counter)
    key = PartitionKey(
        field_values=[PartitionFieldValue(field=field, value=values[0].as_py())], partition_spec=spec, schema=schema
    )
    # As _dataframe_to_data_files builds them: the write schema from the rows' field ids (no
    # nanosecond timestamps here to downcast), files bin-packed to the table's target size.
    task_schema = pyarrow_to_schema(
        rows.schema, name_mapping=schema.name_mapping, format_version=metadata.format_version
    )
    target = (
        property_as_int(
            metadata.properties,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
        )
        or TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT
    )
    tasks = (
        WriteTask(
            write_uuid=write_uuid, task_id=next(counter), record_batches=batches, partition_key=key, schema=task_schema
        )
        for batches in bin_pack_arrow_table(rows, target)
    )
    return write_data_files(io=io, table_metadata=metadata, tasks=tasks)


@contextlib.contextmanager
def uncommitted_removed(io: Any, written: list[str]) -> Iterator[None]:
    """The data files in ``written`` (paths the block writes and appends to) are deleted when the
    block fails before its commit; kept when it commits, or when the commit's outcome is unknown
    (it may have landed: orphan cleanup takes them if it did not)."""
    from pyiceberg.exceptions import CommitStateUnknownException

    try:
        yield
    except CommitStateUnknownException:
        written.clear()
        raise
    else:
        written.clear()
    finally:
        delete_uncommitted(io, written)


def delete_uncommitted(io: Any, paths: list[str]) -> None:
    """Delete data files written and never committed (best effort: orphan cleanup removes the rest)."""
    for path in paths:
        try:
            io.delete(path)
        except Exception:  # pragma: no cover - best effort; orphan cleanup removes it
            pass


def object_store_outage(exc: BaseException) -> bool:
    """An error of pyiceberg's file I/O (pyarrow's S3 file system) that says the object store did
    not answer, rather than that a file is missing or bad."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    text = str(exc)
    return isinstance(exc, OSError) and any(
        marker in text for marker in ("AWS Error NETWORK_CONNECTION", "curlCode", "Connection refused", "timed out")
    )


@contextlib.contextmanager
def warehouse_answers(what: str, hint: str) -> Iterator[None]:
    """Inside: an object store that does not answer (:func:`object_store_outage`) is the transient
    WarehouseUnavailableError naming ``what`` (and ``hint``), never bad data."""
    try:
        yield
    except WarehouseUnavailableError:
        raise
    except Exception as exc:
        if not object_store_outage(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise WarehouseUnavailableError(f"the warehouse did not answer while {what} ({first})", hint=hint) from exc


def refresh_spark(spark: Any, spark_ident: str) -> None:
    """Make a running Spark session of this process see the table's newest commit."""
    from loader.spark import spark_started

    if spark_started(spark):
        from loader.lake.iceberg import iceberg_table

        iceberg_table(spark, spark_ident)  # loads through the session's catalog and refreshes


def create_table(
    catalog: Any,
    ident: tuple[str, str],
    columns: list[tuple[str, str]],
    properties: dict[str, str],
    day_of: str | None,
    order: list[str],
    location: str,
    bucket: tuple[str, int] | None = None,
) -> Any:
    """Create the Iceberg table Spark's ``CREATE TABLE ... USING iceberg PARTITIONED BY
    (days(day_of)) TBLPROPERTIES (...)`` (or ``PARTITIONED BY (bucket(n, column))`` for ``bucket``
    = (column, n)) followed by ``ALTER TABLE ... WRITE LOCALLY ORDERED BY order`` creates, in one
    commit and without a JVM (``tests/load/test_table_creation.py`` holds them equal: schema and
    ids, spec, sort order, properties, location). ``columns``: (name, Spark SQL type), every
    column optional as Spark's are. Returns the table (pyiceberg's); a table created meanwhile by
    another process is loaded instead (CREATE TABLE IF NOT EXISTS)."""
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
    from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
    from pyiceberg.types import NestedField

    from loader.lake.types import iceberg_type

    # Spark's CREATE TABLE records who created the table (its user: SPARK_USER, else the OS user).
    # Iceberg's Java (1.4 on) writes its Parquet codec default into every new table's properties.
    properties = {
        "owner": os.environ.get("SPARK_USER") or getpass.getuser(),
        "write.parquet.compression-codec": "zstd",
        **properties,
    }
    # Field ids as Spark assigns them: top-level columns 1..n, nested ids after them
    # (create_table assigns ids afresh the same way; these only have to be distinct).
    fields = [
        NestedField(field_id=i, name=name, field_type=iceberg_type(sql), required=False)
        for i, (name, sql) in enumerate(columns, start=1)
    ]
    schema = Schema(*fields)
    by_name = {f.name: f.field_id for f in fields}
    spec = PartitionSpec()
    if day_of is not None:
        spec = PartitionSpec(
            PartitionField(source_id=by_name[day_of], field_id=1000, transform=DayTransform(), name=f"{day_of}_day")
        )
    elif bucket is not None:
        column, n = bucket
        spec = PartitionSpec(
            PartitionField(
                source_id=by_name[column], field_id=1000, transform=BucketTransform(n), name=f"{column}_bucket"
            )
        )
    sort = SortOrder(
        *[
            SortField(
                source_id=by_name[c],
                transform=IdentityTransform(),
                direction=SortDirection.ASC,
                null_order=NullOrder.NULLS_FIRST,
            )
            for c in order
        ]
    )
    try:
        return catalog.create_table(
            ident, schema, location=location, partition_spec=spec, sort_order=sort, properties=properties
        )
    except TableAlreadyExistsError:
        return catalog.load_table(ident)


def default_location(warehouse: str, namespace: str, name: str) -> str:
    """Where Iceberg's JDBC catalog (Java) puts a new table: ``<warehouse>/<namespace>/<name>``
    (pyiceberg's own default adds ``.db`` to the namespace)."""
    return f"{warehouse.rstrip('/')}/{namespace}/{name}"


def ddl_columns(ddl: str) -> list[tuple[str, str]]:
    """``"a STRING, b BIGINT"`` as [(name, Spark SQL type)] (the loader's own simple DDLs)."""
    return [(c.strip().split(" ", 1)[0], c.strip().split(" ", 1)[1]) for c in ddl.split(",")]


def ensure_loader_tables(settings: Any) -> None:
    """The namespaces and the loader's own tables (ledger, rejects), created if missing.

    With pyiceberg (queries of the catalog database, no JVM): every load, merge and follow cycle
    asks, Spark's catalog lookups cost up to a second on a busy driver, and a first load on the
    driver then starts no Spark at all. The tables are the ones Spark's DDL creates
    (``tests/load/test_table_creation.py``); creating them twice at once is harmless (IF NOT EXISTS)."""
    from loader.lake.catalog import open_catalog
    from loader.lake.tables import LEDGER_DDL, LEDGER_NAME, REJECTS_DDL, TableNames

    names = TableNames(settings)
    catalog = open_catalog(settings)
    with warehouse_answers("creating the loader's tables", "re-run once the warehouse answers"):
        for ns in (names.history_ns, names.current_ns, names.loader_ns):
            if not catalog.namespace_exists(ns):
                catalog.create_namespace_if_not_exists(ns)
        # (listed, not loaded: table_exists would read each table's metadata file)
        present = {i[-1] for i in catalog.list_tables(names.loader_ns)}
        warehouse = settings.catalog.warehouse
        for name, ddl, day_of in ((LEDGER_NAME, LEDGER_DDL, None), ("rejects", REJECTS_DDL, "rejected_at")):
            if name not in present:
                where = default_location(warehouse, names.loader_ns, name)
                create_table(catalog, (names.loader_ns, name), ddl_columns(ddl), {}, day_of, [], where)
