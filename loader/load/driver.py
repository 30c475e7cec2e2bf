"""A plain load batch read, checked and typed on the driver with Arrow, appended without a Spark job.

The Spark path (:mod:`loader.load.history`) decodes landing lines in Python workers, one record
at a time, and then runs a survey, a typing query and a write over them: a 1M-change load took
~16 s, of which the decoding alone ~9.5 s. For a batch in which nothing is unusual, the same result
comes from Arrow's C++ JSON reader (all lines of a file at once, with the landing schema's types:
a number where text belongs, a missing required field, a duplicated key all fail the read), a few
vectorised checks, and Arrow casts.

*Plain* means everything the Spark path would accept as it is: every file intact (gzip readable,
UTF-8, every line a version-1 landing record, no header count short), only inserts, updates,
deletes and snapshot reads, positions inside each file's name range and strictly increasing, the
files' ranges disjoint, commit times in the UTC form capture writes, every record's shape (the
checks of :func:`loader.load.decode._shape_problem`) valid, no column retyped incompatibly or
dropped at the source, no erased subject, every change after what history holds (no dedupe
needed), and every value typed by an Arrow cast that accepts no text Spark's ``try_cast`` would
read differently. A value that does not fit leaves its row out of the rows appended and becomes a
reject, with the park the Spark path writes (:class:`Misfits`, :func:`misfit_rejects`,
:func:`park_rows`), also in a snapshot or transaction typed file by file as it is written (the park
and the table's bookkeeping then join the commit once its rows are written). Whatever else is not plain raises
:class:`NotPlain` before anything is committed, and the Spark path loads the batch, with its
rejects, parks and exact reasons. Both paths write the same history rows (a property test holds
them to each other on random batches).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.errors import LandingUnavailableError
from loader.faults import checkpoint
from loader.lake.tables import SourceTable
from loader.lake.types import UTC_TEXT
from loader.landing.records import OPERATIONS, ChangeRecord, Column, FileHeader, parse_header
from loader.landing.store import TABLES, LandingFile, LandingStore
from loader.load.columns import NotPlain, RecordColumns, RecordShape, dense_ids, first_rows
from loader.load.decode import _TIMESTAMP, _shape_problem, layout_shape
from loader.load.kernel import absent_columns, json_objects, typed_column
from loader.load.sql import HistoryColumn
from loader.load.survey import OTHER, ROW, UPDATE, BatchSurvey, Shape
from loader.load.values import Misfit, typed, typed_distinct
from loader.lsn import ChangePosition, positions_after

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


_KINDS = {"I": ROW, "R": ROW, "U": UPDATE, "D": OTHER}
# Separators of the per-row shape key; names holding them are not plain.
_SEP_FIELD, _SEP_ITEM = "\x1e", "\x1f"


def _landing_schema() -> pa.Schema:
    """Landing format v1 (schemas/landing-change.v1.json) as Arrow reads it: the types msgspec's
    decoder insists on (a field of another JSON type fails the read)."""
    import pyarrow as pa

    s = pa.string()
    columns = pa.list_(pa.list_(s))
    return pa.schema(
        [
            ("v", pa.int64()),
            ("op", s),
            ("lsn", pa.uint64()),
            ("seq", pa.int64()),
            ("xid", pa.int64()),
            ("ts", s),
            ("change_lsn", pa.int64()),
            ("schema", s),
            ("table", s),
            ("columns", columns),
            ("identity", columns),
            ("pk", pa.list_(s)),
            ("reason", s),
            ("raw", s),
        ]
    )


def _read_text(name: str, data: bytes, limit: int) -> tuple[bytes, FileHeader | None]:
    """One intact landing file's record lines (header line removed, ending in a newline).

    A file decompressing past ``limit`` bytes raises ``DecompressedSizeError`` (so would the Spark path)."""
    from loader.errors import DecompressedSizeError
    from loader.landing.store import gunzip_bounded

    if not name.endswith(".gz"):
        raise NotPlain(f"{name}: not a gzip landing file")
    try:
        text = gunzip_bounded(data, limit, f"landing file {name}")
    except DecompressedSizeError:
        raise
    except Exception as exc:  # damaged: the Spark path salvages what is readable
        raise NotPlain(f"{name}: damaged ({exc})") from None
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise NotPlain(f"{name}: not UTF-8") from None
    # The shape key's separators (control characters) can only arrive escaped (\u001e, \u001F).
    if b"\\u001" in text:
        raise NotPlain(f"{name}: text holding control characters")
    end = text.find(b"\n")
    first_line = text if end < 0 else text[:end]
    header = None
    if b'"op":"H"' in first_line:
        header = parse_header(first_line.decode("utf-8"))
        if header is None:
            raise NotPlain(f"{name}: unreadable header")
        text = b"" if end < 0 else text[end + 1 :]
    if text and not text.endswith(b"\n"):
        text += b"\n"
    return text, header


def _read_changes(name: str, data: bytes) -> tuple[pa.Table, FileHeader]:
    """One intact landing v2 change file (loader.landing.changefile) as an Arrow table and its
    header's counts; a damaged file is not plain (the Spark path salvages what is readable)."""
    import pyarrow as pa

    from loader.landing import changefile

    got = changefile.salvage(data, decode=False)
    if got.header is None or got.damage is not None:
        raise NotPlain(f"{name}: damaged ({got.damage})")
    table = pa.Table.from_batches(got.batches, schema=changefile.arrow_schema(stored=True))
    # The record-level texts decoded; column names and types, key names stay dictionary-encoded
    # (a million changes of one table hold a few distinct names: the load numbers them anyway).
    plain = changefile.arrow_schema()
    for column in ("op", "ts", "schema", "table"):
        i = plain.get_field_index(column)
        table = table.set_column(i, plain.field(i), table.column(i).cast(plain.field(i).type))
    return table, FileHeader(got.header.tables)


def _read_file(store: LandingStore, f: LandingFile) -> tuple[bytes | pa.Table | TablesBody, FileHeader | None]:
    """A landing file's records as the driver reads them: v1 record lines, a v2 change file's
    Arrow table, or a v3 file's segments."""
    from loader.landing import tablefile
    from loader.landing.store import CHANGES, TABLES

    data = store.open_bytes(f.name)
    if f.format == CHANGES:
        return _read_changes(f.name, data)
    if f.format == TABLES:
        got = tablefile.salvage(data)
        if got.header is None or got.damage is not None:
            raise NotPlain(f"{f.name}: damaged ({got.damage})")
        return TablesBody(got), FileHeader(got.header.tables)
    return _read_text(f.name, data, store.max_decompressed)


# Landing files read (fetched, decompressed, checked) at once, ahead of the one being grouped: the
# first group of a load is read on both cores, and an object store's latency is paid once for them.
READ_AHEAD_FILES = 2


def _files_read(
    store: LandingStore, files: list[LandingFile]
) -> Iterator[tuple[LandingFile, bytes | pa.Table | TablesBody | None, FileHeader | None, str | None]]:
    """``files`` read in order, each as (file, body, header, why it is not plain): the body and
    header None when it is not. ``READ_AHEAD_FILES`` are read at once on threads of their own (the
    reading releases the GIL for its I/O and decompression); any other error is raised when its
    file's turn comes. A consumer that stops early leaves no reading behind."""
    from concurrent.futures import Future, ThreadPoolExecutor

    def read(f: LandingFile) -> tuple[bytes | pa.Table | TablesBody | None, FileHeader | None, str | None]:
        try:
            body, header = _read_file(store, f)
        except NotPlain as exc:
            return None, None, str(exc)
        return body, header, None

    pool = ThreadPoolExecutor(READ_AHEAD_FILES, thread_name_prefix="landing-read")
    ahead: deque[tuple[LandingFile, Future[Any]]] = deque()
    try:
        for f in files:
            ahead.append((f, pool.submit(read, f)))
            if len(ahead) < READ_AHEAD_FILES:
                continue
            g, future = ahead.popleft()
            yield (g, *future.result())
        while ahead:
            g, future = ahead.popleft()
            yield (g, *future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _size(body: bytes | pa.Table | TablesBody | None) -> int:
    if body is None:
        return 0
    return len(body) if isinstance(body, bytes) else int(body.nbytes)


@dataclass
class TextGroup:
    """Consecutive landing files of the change stream (v1, or v2 change files) the driver load
    takes as one batch (:func:`plain_groups`): their records as read (v1 record lines, v2 Arrow
    tables), or why the group goes to the Spark path (``not_plain``), or neither: a transaction
    longer than the bound, read again file by file (``streamed``)."""

    files: list[LandingFile]
    texts: list[tuple[bytes | pa.Table | TablesBody, FileHeader | None]] | None
    not_plain: str | None = None
    plain: PlainBatch | TablesBatch | None = None  # its records checked and numbered (:func:`checked_ahead`)

    @property
    def streamed(self) -> bool:
        return self.texts is None and self.not_plain is None and self.plain is None


# The first group of a load is cut at this share of the bound: its rows reach the writing thread
# after a short read and typing instead of a whole group's (the groups' commits are made together,
# loader.load.staging, so one more group costs no commit).
FIRST_GROUP_SHARE = 8


def plain_groups(store: LandingStore, files: list[LandingFile], max_bytes: int) -> Iterator[TextGroup]:
    """``files`` (landing v1 or v2 change files, one format, in order) read one at a time and cut
    into groups of at most ``max_bytes`` of record text (Arrow bytes for v2), each ending with a file that ends a transaction (a cut never
    splits one; a group is cut at the first such file past half the bound; the first group at
    the first past half of ``max_bytes // FIRST_GROUP_SHARE``), so a backlog of any size loads on
    the driver in bounded memory, group after group.

    A file that is not plain (damaged, not UTF-8, ...) sends its group (up to the end of its
    transaction) to the Spark path. A transaction longer than ``max_bytes`` makes a group of its
    own that the driver reads again file by file (``streamed``, :class:`StreamedPlainBatch`). The
    text of such groups is dropped as soon as that is known. The groups after it are read as before."""
    group: list[LandingFile] = []
    texts: list[tuple[bytes | pa.Table | TablesBody, FileHeader | None]] | None = []
    size, reason = 0, None
    bound = max(1, max_bytes // FIRST_GROUP_SHARE)
    for f, body, header, problem in _files_read(store, files):
        n = _size(body)
        # Cut at a file ending a transaction once half the bound is reached (or the next file would
        # pass it): a transaction running on past that point then has the other half to end in.
        full = size >= bound // 2 or size + n > bound
        if group and group[-1].complete and reason is None and (body is None or full):
            yield TextGroup(group, texts)
            group, texts, size, bound = [], [], 0, max_bytes
        group.append(f)
        size += n
        reason = reason or problem
        if reason is not None or size > max_bytes:
            texts = None
        elif texts is not None and body is not None:
            texts.append((body, header))
        if f.complete and texts is None:
            yield TextGroup(group, None, reason)
            group, texts, size, reason, bound = [], [], 0, None, max_bytes
    if group:
        yield TextGroup(group, texts, reason)


def checked_ahead(groups: Iterator[TextGroup], store: LandingStore, max_bytes: int) -> Iterator[TextGroup]:
    """``groups`` each read and checked (its :class:`PlainBatch` built: records parsed, positions
    checked, shapes numbered) on another thread while the caller loads the group before it: the
    files' reading and checking overlap the previous group's typing, writes and commits (Arrow,
    numpy, zstd and the Parquet writer release the GIL for most of their work). One group is read
    ahead at most, so two are held at most. Reading commits nothing: a group read ahead and never
    loaded (the load failed, or was killed) is read again by the next load."""
    from loader.lake.files import prefetched

    def checked(group: TextGroup) -> TextGroup:
        if group.texts is not None and group.not_plain is None:
            try:
                if group.files[0].format == TABLES:
                    group.plain = TablesBatch(store, group.files, max_bytes, group.texts)
                else:
                    group.plain = PlainBatch(store, group.files, max_bytes, group.texts)
            except NotPlain as exc:
                group.not_plain = str(exc)
            group.texts = None
        return group

    return prefetched(map(checked, groups), depth=1)


class _ShapeTally:
    """A batch's survey shapes, gathered run by run: per (file, table, kind, column names and
    types, and a delete's old-key names and types) the changes, the first and last position, a
    reference to the newest change (``newest``: whatever :meth:`survey` is given to read it) and
    the latest key."""

    def __init__(self) -> None:
        self._merged: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(
        self,
        file: str,
        info: RecordShape,
        changes: int,
        first: ChangePosition,
        last: ChangePosition,
        newest: Any,
    ) -> None:
        old_key = (tuple(info.key_names), tuple(info.key_types)) if info.op == "D" else ((), ())
        k = (file, info.schema, info.table, _KINDS[info.op], tuple(info.names), tuple(info.types), *old_key)
        m = self._merged.setdefault(k, {"changes": 0, "first": first, "last": last, "newest": newest, "pk": None})
        m["changes"] += changes
        m["first"] = min(m["first"], first)
        if last >= m["last"]:
            m["last"], m["newest"] = last, newest
        if info.pk and (m["pk"] is None or last > m["pk"][1]):
            m["pk"] = (tuple(info.pk), last)

    def survey(self, newest: Callable[[Any], tuple[int, int, str]]) -> BatchSurvey:
        """The Spark path's survey of the batch; ``newest(ref)``: (lsn, seq, commit time) of a change."""
        shapes = []
        for (file, schema, table, kind, names, types, key_names, key_types), m in self._merged.items():
            shapes.append(
                Shape(
                    landing_file=file,
                    table=SourceTable(schema, table),
                    kind=kind,
                    col_names=names,
                    col_types=types,
                    changes=m["changes"],
                    first=m["first"],
                    last=m["last"],
                    newest=newest(m["newest"]),
                    pk=m["pk"][0] if m["pk"] else None,
                    pk_at=m["pk"][1] if m["pk"] else None,
                    key_names=key_names,
                    key_types=key_types,
                )
            )
        return BatchSurvey(shapes)


class PlainBatch:
    """A plain batch in Arrow: its survey (as the Spark path's survey job would give it) and, per
    table, its history rows."""

    def __init__(
        self,
        store: LandingStore,
        batch: list[LandingFile],
        max_bytes: int,
        texts: list[tuple[Any, FileHeader | None]] | None = None,
    ) -> None:
        """``texts``: the files' records (v1 lines or a v2 change file's Arrow table) and headers
        as :func:`plain_groups` read them (else read here)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        bodies: list[bytes | pa.Table] = []
        lines, headers, size = [], [], 0
        for i, f in enumerate(batch):
            if texts is None:
                body, header = _read_file(store, f)
            else:
                body, header = texts[i]
            if isinstance(body, TablesBody):
                raise NotPlain(f"{f.name}: a landing v3 file in a batch of records")
            size += _size(body)
            if size > max_bytes:
                raise NotPlain(f"more than load.driver_max_bytes ({max_bytes}) of landing text")
            bodies.append(body)
            lines.append(body.count(b"\n") if isinstance(body, bytes) else body.num_rows)
            headers.append(header)
        if texts is not None:
            texts.clear()  # handed over: each file's text is freed once it is parsed
        schema = _landing_schema()
        parsed = []
        arrow = any(not isinstance(b, bytes) for b in bodies)
        if arrow:
            if not all(isinstance(b, pa.Table) for b in bodies):
                raise NotPlain("landing formats mixed in one batch")
            from loader.landing import changefile

            schema = changefile.arrow_schema()
        for i, body in enumerate(bodies):
            bodies[i] = b""
            if not isinstance(body, bytes):
                parsed.append(body)
                continue
            if not body:
                continue
            try:  # Arrow parses blocks of a file on every core, no copy of its text
                parsed.append(
                    pj.read_json(
                        pa.BufferReader(body),
                        read_options=pj.ReadOptions(block_size=min(16 << 20, max(1 << 20, len(body) // 4 + 1))),
                        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
                    )
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise NotPlain(f"landing file {batch[i].name}: {str(exc)[:200]}") from None
            del body
        rows = pa.concat_tables(parsed) if parsed else schema.empty_table()
        del parsed
        if rows.num_rows != sum(lines):
            raise NotPlain("blank lines in a landing file")
        for required in ("op", "lsn", "seq", "xid", "ts") if arrow else ("v", "op", "lsn", "seq", "xid", "ts"):
            if rows.column(required).null_count:
                raise NotPlain(f"a record without {required}")
        if not arrow and rows.num_rows and pc.any(pc.not_equal(rows.column("v"), 1)).as_py():
            raise NotPlain("a record of another landing format version")
        ops = set(pc.unique(rows.column("op")).to_pylist())
        if not ops <= set(_KINDS) | {"C"}:
            raise NotPlain(f"control records ({sorted(ops - set(_KINDS) - {'C'})})")
        if (
            rows.column("reason").null_count != rows.num_rows
            and pc.any(pc.not_equal(pc.fill_null(rows.column("reason"), ""), "")).as_py()
        ):
            raise NotPlain("a record carries a note")
        file_of = np.repeat(np.arange(len(batch)), lines)
        lsn_u = rows.column("lsn").to_numpy()
        seq = rows.column("seq").to_numpy()
        if len(lsn_u) and (lsn_u.max() >= 1 << 63 or seq.min() < 0):
            raise NotPlain("a position out of range")
        lsn = lsn_u.astype(np.int64)
        change = pc.not_equal(rows.column("op"), "C").to_numpy(zero_copy_only=False)
        # Positions: strictly increasing within each file, inside the file's name range.
        c_lsn, c_seq, c_file = lsn[change], seq[change], file_of[change]
        same = c_file[1:] == c_file[:-1]
        up = positions_after(c_lsn[1:], c_seq[1:], (c_lsn[:-1], c_seq[:-1]))
        if not up[same].all():
            raise NotPlain("positions not strictly increasing in a file")
        lo_l = np.array([f.first.commit_lsn for f in batch], np.int64)[c_file]
        lo_s = np.array([f.first.seq for f in batch], np.int64)[c_file]
        hi_l = np.array([f.last.commit_lsn for f in batch], np.int64)[c_file]
        hi_s = np.array([f.last.seq for f in batch], np.int64)[c_file]
        below = ~positions_after(c_lsn, c_seq, (lo_l, lo_s), inclusive=True)
        above = positions_after(c_lsn, c_seq, (hi_l, hi_s))
        if below.any() or above.any():
            raise NotPlain("a position outside its file's range")
        self.batch, self.headers = batch, headers
        self.num_rows = rows.num_rows
        self.misfits: dict[SourceTable, list[Misfits]] = {}
        self.change = change
        self.file_of = file_of
        self.lsn, self.seq = lsn, seq
        self.xid = rows.column("xid").combine_chunks()
        self.change_lsn = pc.fill_null(rows.column("change_lsn").combine_chunks(), 0)
        self.op = rows.column("op").combine_chunks()
        self.ts = rows.column("ts").combine_chunks()
        for value in pc.unique(pc.filter(self.ts, pa.array(change))).to_pylist():
            if not _TIMESTAMP.match(value) or not re.match(UTC_TEXT, value):
                raise NotPlain(f"commit time {value[:40]!r} not in capture's UTC form")
        schema_col = pc.fill_null(rows.column("schema").combine_chunks(), "")
        table_col = pc.fill_null(rows.column("table").combine_chunks(), "")
        cols = RecordColumns(rows)
        self.col_offsets, self.values = cols.col_offsets, cols.values
        self.id_offsets, self.id_values = cols.id_offsets, cols.id_values
        del rows

        # Each row's shape as a number: texts as dictionary codes, rows with the same codes the
        # same shape (exact, no hashing).
        self.shape, n_shapes, texts = cols.shape_ids(self.op, schema_col, table_col)
        if arrow:  # v1 text holding these separators was refused above, unparsed
            for part in texts:
                if len(part) and pc.any(pc.match_substring_regex(part, f"[{_SEP_FIELD}{_SEP_ITEM}]")).as_py():
                    raise NotPlain("a name holding control characters")
        self.shapes: list[RecordShape | None] = [None] * n_shapes
        for s, r in enumerate(first_rows(self.shape).tolist()):
            if not change[r]:
                continue  # commit markers: no shape
            info = cols.shape(self.op, schema_col, table_col, r)
            problem = _shape_problem(info.record(), info.names, info.key_names)
            if problem:
                raise NotPlain(f"{info.schema}.{info.table}: {problem}")
            self.shapes[s] = info
        self.survey = self._survey()

    def _survey(self) -> BatchSurvey:
        """The Spark path's survey of this batch (loader.load.survey), from the shapes."""
        import numpy as np

        file_names = [f.name for f in self.batch]
        n_shapes = max(1, len(self.shapes))
        group = (self.file_of.astype(np.int64) * n_shapes + self.shape)[self.change]
        at = np.flatnonzero(self.change)
        ids, n_groups = dense_ids(group)
        first = first_rows(ids)
        last = np.zeros(n_groups, np.int64)
        np.maximum.at(last, ids, np.arange(len(ids)))
        counts = np.bincount(ids, minlength=n_groups)
        order = np.argsort(group[first], kind="stable")  # by file, then shape, as before
        keys, first, last, counts = group[first][order], at[first[order]], at[last[order]], counts[order]
        seen: dict[tuple[int, str], int] = {}
        tally = _ShapeTally()
        for g, a, b, n in zip(keys.tolist(), first.tolist(), last.tolist(), counts.tolist(), strict=True):
            info = self.shapes[g % n_shapes]
            assert info is not None
            where = (g // n_shapes, f"{info.schema}.{info.table}")
            seen[where] = seen.get(where, 0) + n
            pos_a = ChangePosition(int(self.lsn[a]), int(self.seq[a]))
            pos_b = ChangePosition(int(self.lsn[b]), int(self.seq[b]))
            tally.add(file_names[g // n_shapes], info, n, pos_a, pos_b, b)
        for i, header in enumerate(self.headers):
            if header is not None and any(n > seen.get((i, t), 0) for t, n in header.tables.items()):
                raise NotPlain(f"{file_names[i]}: fewer records than its header counts")
        return tally.survey(lambda b: (int(self.lsn[b]), int(self.seq[b]), self.ts[b].as_py()))

    def table_rows(self, table: SourceTable) -> np.ndarray:
        import numpy as np

        ids = [
            i for i, s in enumerate(self.shapes) if s is not None and (s.schema, s.table) == (table.schema, table.table)
        ]
        return np.flatnonzero(np.isin(self.shape, ids))

    def span(self, table: SourceTable) -> tuple[ChangePosition, ChangePosition]:
        """The positions of the table's first and last change in the batch."""
        rows = self.table_rows(table)
        return (
            ChangePosition(int(self.lsn[rows[0]]), int(self.seq[rows[0]])),
            ChangePosition(int(self.lsn[rows[-1]]), int(self.seq[rows[-1]])),
        )

    def history_parts(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> list[pa.Table]:
        """The table's history rows, in position order, as one part (the batch is in memory); rows
        whose values do not fit are left out and kept in :attr:`misfits`."""
        return [self.history_rows(table, columns, target)]

    def history_rows(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> pa.Table:
        """The table's history rows in ``target``'s columns and types (the Iceberg table's schema).
        A value that does not fit leaves its row out of them (in :attr:`misfits`)."""
        import numpy as np
        import pyarrow as pa

        rows = self.table_rows(table)
        shape = self.shape[rows]
        out: dict[str, Any] = {}
        sent: dict[str, np.ndarray] = {}
        bad: np.ndarray | None = None  # rows holding a value that does not fit
        row_offsets = self.col_offsets[rows]
        for col in columns:
            where = np.full(len(self.shapes), -1, np.int64)
            for s, info in enumerate(self.shapes):
                if info is None or (info.schema, info.table) != (table.schema, table.table):
                    continue
                if col.source in info.names:
                    if info.types[info.names.index(col.source)] != col.pg_type:
                        raise NotPlain(f"{table.qualified}: column {col.source} changes type in the batch")
                    where[s] = info.names.index(col.source)
            j = where[shape]
            sent[col.source] = j >= 0
            idx = pa.array(row_offsets + j, pa.int64(), mask=j < 0)
            out[col.lake], misfit = _typed_or_misfit(self.values.take(idx), col, table)
            if misfit is not None:
                bad = misfit if bad is None else bad | misfit
        ts = _typed(self.ts.take(pa.array(rows)), HistoryColumn("", "timestamp with time zone"), table, distinct=True)
        ops = self.op.take(pa.array(rows))
        out.update(
            pg_lsn=pa.array(self.lsn[rows]),
            pg_seq=pa.array(self.seq[rows]),
            pg_txn_id=self.xid.take(pa.array(rows)),
            pg_operation=_operation_names(ops),
            pg_txn_timestamp=ts,
            pg_change_lsn=self.change_lsn.take(pa.array(rows)),
            pg_old_key=self._old_keys(rows, shape),
            # (a batch with columns dropped at the source goes to the Spark path: no drops here)
            pg_absent_columns=absent_columns(columns, sent, self._updates(shape), self.lsn[rows], self.seq[rows], {}),
            pg_landing_file=pa.array([f.name for f in self.batch], pa.string()).take(pa.array(self.file_of[rows])),
            pg_note=pa.nulls(len(rows), pa.string()),
        )
        history = _in_target(out, len(rows), target)
        if bad is None:
            return history
        self.misfits.setdefault(table, []).append(
            Misfits(self.file_of[rows][bad], self.lsn[rows][bad], self.seq[rows][bad])
        )
        return history.filter(pa.array(~bad))

    def _old_keys(self, rows: np.ndarray, shape: np.ndarray) -> pa.Array:
        """pg_old_key: the rows' old keys (names from their shapes, texts from the batch) as the
        load kernel writes them (``loader.load.kernel.json_objects``)."""
        import numpy as np
        import pyarrow as pa

        key_names = [info.key_names if info is not None else [] for info in self.shapes]
        per_shape = np.array([len(k) for k in key_names], np.int64)
        starts = np.concatenate([[0], np.cumsum(per_shape)])
        width = per_shape[shape]
        offsets = np.concatenate([[0], np.cumsum(width)])
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], width)
        names = pa.array([n for k in key_names for n in k], pa.string()).take(
            pa.array(np.repeat(starts[shape], width) + within)
        )
        texts = self.id_values.take(pa.array(np.repeat(self.id_offsets[rows], width) + within))
        lists = pa.array(offsets.astype(np.int32))
        return json_objects(pa.ListArray.from_arrays(lists, names), pa.ListArray.from_arrays(lists, texts))

    def _updates(self, shape: np.ndarray) -> np.ndarray:
        """Which rows (of shapes ``shape``) are updates."""
        import numpy as np

        return np.array([info is not None and info.op == "U" for info in self.shapes], bool)[shape]


def _in_target(out: dict[str, Any], n: int, target: pa.Schema) -> pa.Table:
    """History rows of ``n`` rows: ``out``'s arrays (by lake column) in ``target``'s columns and
    types, a column ``out`` lacks as nulls (a column dropped before these rows)."""
    import pyarrow as pa

    arrays = []
    for f in target:
        arr = out.get(f.name)
        if arr is None:
            arrays.append(pa.nulls(n, f.type))
            continue
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arrays.append(arr.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _operation_names(ops: pa.Array) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(ops)
    names = pa.array([OPERATIONS[c] for c in encoded.dictionary.to_pylist()], pa.string())
    return names.take(encoded.indices)


def _typed(values: pa.Array, col: HistoryColumn, table: SourceTable, distinct: bool = False) -> pa.Array:
    """A column's values typed by the load's rules (loader.load.values); a misfit sends the batch to
    the Spark path, which rejects it. ``distinct``: a column of few distinct values."""
    try:
        return (typed_distinct if distinct else typed)(values, col.pg_type, f"{table.qualified}.{col.source}")
    except Misfit as exc:
        raise NotPlain(str(exc)) from None


def _typed_or_misfit(values: pa.Array, col: HistoryColumn, table: SourceTable) -> tuple[pa.Array, np.ndarray | None]:
    """A column's values typed by the load kernel (``typed_column``): a value that does not fit as
    NULL, and a mask of the rows holding one (None when every value fits). A snapshot file's native
    integers or booleans are typed by :func:`_typed` (a misfit there is not plain)."""
    import pyarrow as pa

    if not pa.types.is_string(values.type):
        return _typed(values, col, table), None
    storage, why = typed_column(values, col)
    if why is None:
        return storage, None
    return storage, why.is_valid().to_numpy(zero_copy_only=False)


@dataclass
class Misfits:
    """Rows of a table whose values do not fit (``loader.load.kernel.typed_column``), left out of
    the history rows a batch returns: per row, its file (index in the batch) and position. The
    load writes them to the rejects table and parks the table (:func:`misfit_rejects`)."""

    files: np.ndarray
    lsn: np.ndarray
    seq: np.ndarray


def misfit_rejects(
    store: LandingStore,
    batch: list[LandingFile],
    table: SourceTable,
    columns: list[HistoryColumn],
    found: list[Misfits],
) -> pa.Table:
    """The rejects table's rows (without ``rejected_at``) of the misfits ``found``, plus ``ts``
    (their commit time's text), in position order: their files decoded again as the Spark path
    decodes them (``loader.load.decode``) and typed by the load kernel, so the line, reason and
    raw text are the Spark path's. Rare (a value that does not fit), so the cost of decoding a file
    row by row is taken only for files holding one. A file that reads differently the second time
    raises NotPlain (nothing was committed)."""
    import numpy as np
    import pyarrow as pa

    from loader.load.decode import _arrow_schema, decode_file, rows_to_batch
    from loader.load.kernel import history_batch
    from loader.load.sql import LINE, RAW, REASON

    files = np.concatenate([m.files for m in found])
    wanted = set(zip(np.concatenate([m.lsn for m in found]).tolist(), np.concatenate([m.seq for m in found]).tolist()))
    parts = []
    for i in sorted(set(files.tolist())):
        f = batch[i]
        rows = [
            r
            for r in decode_file(
                f.name, store.open_bytes(f.name), f.first.commit_lsn, (f.first, f.last), store.max_decompressed
            )
            if r["reject_reason"] is None
            and (r["src_schema"], r["src_table"]) == (table.schema, table.table)
            and (r["commit_lsn"], r["seq"]) in wanted
        ]
        if len(rows) != int((files == i).sum()):
            raise NotPlain(f"{f.name}: read differently the second time")
        typed_rows = history_batch(rows_to_batch(rows, _arrow_schema()), columns, {})
        if "" in typed_rows.column(REASON).to_pylist():
            raise NotPlain(f"{f.name}: read differently the second time")
        parts.append(
            pa.table(
                {
                    "landing_file": typed_rows.column("pg_landing_file"),
                    "line": typed_rows.column(LINE),
                    "source_table": pa.array([table.qualified] * len(rows), pa.string()),
                    "pg_lsn": typed_rows.column("pg_lsn"),
                    "pg_seq": typed_rows.column("pg_seq"),
                    "reason": typed_rows.column(REASON),
                    "raw": typed_rows.column(RAW),
                    "ts": pa.array([r["ts"] for r in rows], pa.string()),
                }
            )
        )
    return pa.concat_tables(parts).sort_by([("pg_lsn", "ascending"), ("pg_seq", "ascending")])


def park_rows(
    table: SourceTable, columns: list[HistoryColumn], target: pa.Schema, lsn: int, seq: int, ts: str, note: str
) -> pa.Table:
    """A park row the load derives, in ``target``'s columns: the one the Spark path writes
    (``loader.load.decode.park_row`` through the load kernel)."""
    from loader.load.decode import _arrow_schema, park_row, rows_to_batch
    from loader.load.kernel import history_batch

    park = history_batch(
        rows_to_batch([park_row("", table.schema, table.table, lsn, ts, note, seq)], _arrow_schema()), columns, {}
    )
    return _in_target({name: park.column(name) for name in park.schema.names}, 1, target)


# A driver append writes its rows once this many bytes of Arrow rows are held: a streamed batch's
# parts (one landing file's rows each) gathered into data files of a useful size, in bounded memory.
APPEND_FILE_ARROW_BYTES = 128 << 20


def commit_files(
    table: Any, files: list[Any], summary: dict[str, str], properties: dict[str, str], remove: list[str]
) -> None:
    """The driver load's one commit to a history ``table`` (pyiceberg's) of data files written
    by one or more of its groups (in position order), with ``summary`` in the snapshot summary and
    the table's bookkeeping ``properties`` set (``remove`` removed) in the same commit, through
    pyiceberg (loader.lake.commits: no JVM). A Spark session of the process is not refreshed here
    (the load refreshes each table once, when it ends)."""
    from loader.lake.commits import commit_data_files

    commit_data_files(
        table,
        files,
        summary,
        properties,
        remove,
        hint="nothing was marked loaded; re-run 'loader load' once the warehouse answers",
    )


class StreamedPlainBatch:
    """Landing change files (v1, v2 or v3) of a transaction too long to hold (more than
    ``max_bytes`` of text or columns), with the interface of :class:`PlainBatch`: every file is
    read, checked and surveyed as a batch of its own here (a :class:`TablesBatch` for v3, else a
    PlainBatch), and read again when its rows are written (:meth:`history_parts`, file by file),
    so the transaction is still appended in one commit per table with one file's rows in memory. A
    file that reads differently the second time raises NotPlain (nothing is committed)."""

    def __init__(self, store: LandingStore, batch: list[LandingFile], max_bytes: int) -> None:
        self.store, self.batch, self.max_bytes = store, batch, max_bytes
        self.num_rows = 0
        shapes: list[Shape] = []
        self._spans: dict[SourceTable, tuple[ChangePosition, ChangePosition]] = {}
        self._in_file: list[dict[SourceTable, tuple[ChangePosition, ChangePosition]]] = []
        for f in batch:
            part = self._one(f)
            shapes.extend(part.survey.shapes)
            spans = {table: part.span(table) for table in part.survey.tables()}
            for table, (first, last) in spans.items():
                before = self._spans.get(table)
                self._spans[table] = (before[0], last) if before else (first, last)
            self._in_file.append(spans)
            self.num_rows += part.num_rows
        self.survey = BatchSurvey(shapes)
        self.misfits: dict[SourceTable, list[Misfits]] = {}

    def _one(self, f: LandingFile) -> PlainBatch | TablesBatch:
        if f.format == TABLES:
            return TablesBatch(self.store, [f], self.max_bytes)
        return PlainBatch(self.store, [f], self.max_bytes)

    def span(self, table: SourceTable) -> tuple[ChangePosition, ChangePosition]:
        return self._spans[table]

    def history_parts(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> Iterator[pa.Table]:
        """The table's history rows, file by file, in position order."""
        import numpy as np

        for i, (f, spans) in enumerate(zip(self.batch, self._in_file, strict=True)):
            if table not in spans:
                continue
            part = self._one(f)
            if table not in part.survey.tables() or part.span(table) != spans[table]:
                raise NotPlain(f"{f.name}: read differently the second time")
            rows = part.history_rows(table, columns, target)
            for m in part.misfits.pop(table, []):  # file 0 of ``part`` is file i here
                self.misfits.setdefault(table, []).append(Misfits(np.full(len(m.files), i), m.lsn, m.seq))
            yield rows
            checkpoint("load-streamed-file")  # a file's rows written, the table's commit still ahead


#: Rows of snapshot files kept from the survey for typing, at most (the rest are read again then:
#: decompressing costs about 0.1 s per million rows; holding them, fresh pages and a second copy).
SNAPSHOT_KEEP_BYTES = 32 << 20


def constant_array(value: Any, t: pa.DataType, n: int) -> pa.Array:
    """``n`` times ``value`` as an array of type ``t``: texts and empty lists built from their
    buffers (``pa.repeat`` takes about 0.2 us a row for them, a tenth of a snapshot row's load)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(value, str) and t == pa.string():
        data = value.encode("utf-8")
        offsets = np.arange(n + 1, dtype=np.int64) * len(data)
        if offsets[-1] < 1 << 31:
            return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data * n))
    if value == [] and pa.types.is_list(t):
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], t.value_type))
    return pa.repeat(pa.scalar(value, t), n)


class SnapshotBatch:
    """A batch of landing v2 files (snapshot chunks, loader.landing.arrowfile) in Arrow, with the
    interface of :class:`PlainBatch`: its survey and, per table, its history rows. No JSON and no
    per-row Python: each file's columns are already the text values, typed column by column with
    ``_typed``. The resync markers become the rows the Spark path writes for them (operation
    ``resync``, the reason as note, null values). Anything unusual (a damaged file, a shape the
    Spark path would reject, a commit time not in capture's form) raises NotPlain.

    Memory is bounded whatever the snapshot's size: every file is read and checked once here, but
    only the first ``max_bytes`` (at most ``SNAPSHOT_KEEP_BYTES``) of rows are kept; the history rows are produced file by file
    (:meth:`history_parts`), and a file not kept is read again then (checked to be the same)."""

    def __init__(self, store: LandingStore, batch: list[LandingFile], max_bytes: int) -> None:
        import numpy as np

        from loader.landing import arrowfile

        self.store = store
        self.batch = batch
        # (file index, header, rows table or None when not kept in memory)
        self.files: list[tuple[int, arrowfile.SnapshotHeader, Any]] = []
        self._spans: dict[str, tuple[ChangePosition, ChangePosition]] = {}
        self.num_rows = 0
        self.misfits: dict[SourceTable, list[Misfits]] = {}
        size = 0
        shapes: list[Shape] = []
        for i, f in enumerate(batch):
            if f.format != "arrow":
                raise NotPlain(f"{f.name}: not a landing v2 file")
            h, rows = self._read(i)
            if not _TIMESTAMP.match(h.ts) or not re.match(UTC_TEXT, h.ts):
                raise NotPlain(f"commit time {h.ts[:40]!r} not in capture's UTC form")
            if not (0 <= h.commit_lsn < 1 << 63):
                raise NotPlain("a position out of range")
            seqs = rows.column(0).to_numpy() if rows is not None else np.array([], np.int64)
            marker = h.resync_record()
            at = np.concatenate([np.array([marker.seq] if marker is not None else [], np.int64), seqs.astype(np.int64)])
            if len(at) and (np.any(np.diff(at) <= 0) or at[0] < 0):
                raise NotPlain(f"{f.name}: positions not strictly increasing")
            ends = ([int(at[0]), int(at[-1])] if len(at) else []) + ([int(h.commit["seq"])] if h.commit else [])
            if ends and (
                ChangePosition(h.commit_lsn, ends[0]) != f.first or ChangePosition(h.commit_lsn, ends[-1]) != f.last
            ):
                raise NotPlain(f"{f.name}: positions outside its name's range")
            if not len(at):
                continue  # the commit marker alone
            table = SourceTable(h.schema, h.table)
            names, types = tuple(c for c, _ in h.columns), tuple(t for _, t in h.columns)
            for op, n in (("S", 1 if marker is not None else 0), ("R", len(seqs))):
                if not n:
                    continue
                rec = ChangeRecord(
                    op,
                    h.commit_lsn,
                    0,
                    0,
                    h.ts,
                    h.schema,
                    h.table,
                    columns=[Column(c, t, None) for c, t in h.columns],
                    pk=list(h.pk),
                )
                problem = _shape_problem(rec, list(names), [])
                if problem:
                    raise NotPlain(f"{h.qualified}: {problem}")
                first = ChangePosition(h.commit_lsn, int(at[0]) if op == "S" else int(seqs[0]))
                last = ChangePosition(h.commit_lsn, int(at[0]) if op == "S" else int(seqs[-1]))
                shapes.append(
                    Shape(
                        landing_file=f.name,
                        table=table,
                        kind=OTHER if op == "S" else ROW,
                        col_names=names,
                        col_types=types,
                        changes=n,
                        first=first,
                        last=last,
                        newest=(last.commit_lsn, last.seq, h.ts),
                        pk=tuple(h.pk) if h.pk else None,
                        pk_at=last if h.pk else None,
                    )
                )
            kept = rows if rows is not None and size + rows.nbytes <= min(max_bytes, SNAPSHOT_KEEP_BYTES) else None
            size += kept.nbytes if kept is not None else 0
            self.files.append((i, h, kept))
            span = (ChangePosition(h.commit_lsn, int(at[0])), ChangePosition(h.commit_lsn, int(at[-1])))
            before = self._spans.get(h.qualified)
            self._spans[h.qualified] = (before[0], span[1]) if before else span
            self.num_rows += len(at)
        self.survey = BatchSurvey(shapes)

    def _read(self, i: int) -> tuple[Any, Any]:
        """File ``i`` of the batch: its header and rows (None when it holds none); NotPlain if damaged."""
        import pyarrow as pa

        from loader.landing import arrowfile

        name = self.batch[i].name
        got = arrowfile.salvage(self.store.open_bytes(name), native=True)
        if got.header is None or got.damage is not None:
            raise NotPlain(f"{name}: damaged ({got.damage})")
        rows = pa.Table.from_batches(got.batches, schema=got.batches[0].schema) if got.batches else None
        return got.header, rows

    def span(self, table: SourceTable) -> tuple[ChangePosition, ChangePosition]:
        """The positions of the table's first and last change in the batch."""
        return self._spans[table.qualified]

    def resync_markers(self, table: SourceTable) -> list[tuple[int, int, str, str | None]]:
        """The table's resync markers in the batch: (lsn, seq, 'resync', note), as its history rows
        hold them (:meth:`_history_rows`)."""
        return [
            (h.commit_lsn, int(h.resync["seq"]), "resync", str(h.resync["reason"] or "") or None)
            for _, h, _ in self.files
            if h.qualified == table.qualified and h.resync is not None
        ]

    def history_parts(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> Iterable[pa.Table]:
        """The table's history rows in ``target``'s columns and types, as the Spark path writes
        them: one part per landing file, in position order. When every file of the table is kept
        they are typed now (a NotPlain before anything is written); otherwise lazily, each file not
        kept read again, so a NotPlain can come while the table is being appended. Memory: the
        rows kept, or the parts in flight."""
        from loader.lake.files import prefetched

        mine: deque[tuple[int, Any, Any]] = deque()
        for k, (i, h, rows) in enumerate(self.files):
            if h.qualified == table.qualified:
                mine.append((i, h, rows))
                self.files[k] = (i, h, None)  # the rows kept are released as they are typed
        if all(rows is not None or not h.rows for _, h, rows in mine):
            # Every file kept (at most SNAPSHOT_KEEP_BYTES): typed now, so a NotPlain comes before
            # anything of the batch is written.
            return list(self._history_stream(table, mine, columns, target))
        # Read and typed on a thread of their own while the caller encodes the parts before them:
        # memory holds the parts in flight, not the table's typed rows.
        return prefetched(self._history_stream(table, mine, columns, target), depth=2)

    def _history_stream(
        self, table: SourceTable, mine: deque[tuple[int, Any, Any]], columns: list[HistoryColumn], target: pa.Schema
    ) -> Iterator[pa.Table]:
        while mine:
            i, h, rows = mine.popleft()
            if rows is None and h.rows:
                again, rows = self._read(i)
                if again.to_doc() != h.to_doc() or rows is None or rows.num_rows != h.rows:
                    raise LandingUnavailableError(
                        f"landing file {self.batch[i].name} changed while it was loaded",
                        hint="nothing was committed for its table; re-run 'loader load'",
                    )
            yield self._history_rows(table, [(i, h, rows)], columns, target)

    def _history_rows(
        self, table: SourceTable, parts: list[tuple[int, Any, Any]], columns: list[HistoryColumn], target: pa.Schema
    ) -> pa.Table:
        """History rows of ``parts`` (files of ``table`` of one transaction: index, header, rows);
        a value that does not fit leaves its row out (in :attr:`misfits`)."""
        import numpy as np
        import pyarrow as pa

        values: dict[str, list[Any]] = {c.lake: [] for c in columns}
        ops: list[Any] = []
        notes: list[Any] = []
        files: list[Any] = []
        file_index: list[Any] = []
        seqs: list[Any] = []
        for i, h, rows in parts:
            n = rows.num_rows if rows is not None else 0
            marker = 1 if h.resync is not None else 0
            index = {c: j for j, (c, _) in enumerate(h.columns)}
            types = dict(h.columns)
            for col in columns:
                j = index.get(col.source)
                if j is not None and types[col.source] != col.pg_type:
                    raise NotPlain(f"{table.qualified}: column {col.source} changes type in the batch")
                if marker:
                    values[col.lake].append(pa.nulls(1, pa.string()))
                if n:
                    values[col.lake].append(
                        rows.column(j + 1).combine_chunks() if j is not None else pa.nulls(n, pa.string())
                    )
            if marker:
                ops.append(pa.array(["resync"], pa.string()))
                notes.append(pa.array([str(h.resync["reason"] or "") or None], pa.string()))  # type: ignore[index]
                seqs.append(pa.array([int(h.resync["seq"])], pa.int64()))  # type: ignore[index]
            if n:
                ops.append(constant_array("read", pa.string(), n))
                notes.append(pa.nulls(n, pa.string()))
                seqs.append(rows.column(0).combine_chunks())
            files.append(constant_array(self.batch[i].name, pa.string(), n + marker))
            file_index.append(np.full(n + marker, i, np.int64))
        total = sum(len(a) for a in ops)

        def cat(arrays: list[Any], t: Any) -> Any:
            return pa.concat_arrays([a.cast(t) for a in arrays]) if arrays else pa.array([], t)

        def values_of(arrays: list[Any]) -> Any:
            # A file's integer or boolean column as it holds it (landing v2 NATIVE_TYPES; the
            # markers' nulls beside it), else as text.
            native = [a for a in arrays if not pa.types.is_string(a.type)]
            if not native:
                return cat(arrays, pa.string())
            boolean = pa.types.is_boolean(native[0].type)

            def held(a: Any) -> bool:
                return pa.types.is_boolean(a.type) if boolean else pa.types.is_integer(a.type)

            if all(held(a) or a.null_count == len(a) for a in arrays):
                return cat(arrays, pa.bool_() if boolean else pa.int64())
            return cat(arrays, pa.string())

        out: dict[str, Any] = {}
        bad: np.ndarray | None = None  # rows holding a value that does not fit
        for c in columns:
            out[c.lake], misfit = _typed_or_misfit(values_of(values[c.lake]), c, table)
            if misfit is not None:
                bad = misfit if bad is None else bad | misfit
        header = parts[0][1]

        def const(value: Any, t: Any) -> Any:
            return constant_array(value, t, total)

        ts = _typed(const(header.ts, pa.string()), HistoryColumn("", "timestamp with time zone"), table, distinct=True)
        out.update(
            pg_lsn=const(header.commit_lsn, pa.int64()),
            pg_seq=cat(seqs, pa.int64()),
            pg_txn_id=const(header.xid, pa.int64()),
            pg_operation=cat(ops, pa.string()),
            pg_txn_timestamp=ts,
            pg_change_lsn=const(header.change_lsn, pa.int64()),
            pg_old_key=pa.nulls(total, pa.string()),
            pg_absent_columns=const([], pa.list_(pa.string())),
            pg_landing_file=cat(files, pa.string()),
            pg_note=cat(notes, pa.string()),
        )
        history = _in_target(out, total, target)
        if bad is None:
            return history
        where = np.concatenate(file_index)[bad]
        seq = out["pg_seq"].to_numpy()[bad]
        self.misfits.setdefault(table, []).append(Misfits(where, np.full(len(where), header.commit_lsn, np.int64), seq))
        return history.filter(pa.array(~bad))


@dataclass
class TablesBody:
    """A landing v3 change file as read (:func:`_read_file`): its salvaged segments."""

    got: Any  # loader.landing.tablefile.Salvage

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for _, b in self.got.segments if b is not None)


class TablesBatch:
    """A batch of landing v3 change files (loader.landing.tablefile) in Arrow, with the interface
    of :class:`PlainBatch`: its survey and, per table, its history rows. Each table's changes are
    already columns of their own in the files (one per source column, a segment per shape), so
    nothing is parsed, flattened or numbered by shape: the segments' columns are concatenated in
    position order and typed column by column with ``_typed_or_misfit``, as every other path does.

    Plain means what :class:`PlainBatch` takes: intact files whose records segments hold commit
    markers only (control records, truncates, quarantined input and damage go through the Spark
    path, which says what each one is), positions strictly increasing in each file and inside its
    name's range, commit times in capture's form, shapes the decoder's checks pass, and every
    table's count as the header announces. Anything else raises NotPlain."""

    def __init__(
        self,
        store: LandingStore,
        batch: list[LandingFile],
        max_bytes: int,
        texts: list[tuple[Any, FileHeader | None]] | None = None,
    ) -> None:
        import numpy as np

        from loader.landing import tablefile

        self.batch = batch
        self.misfits: dict[SourceTable, list[Misfits]] = {}
        self.num_rows = 0
        # per table: (file index, segment, batch), in file and segment order
        self._segments: dict[str, list[tuple[int, Any, Any]]] = {}
        self._ends: dict[int, tuple[ChangePosition, ChangePosition]] = {}  # by id of a segment's batch
        tally = _ShapeTally()
        size = 0
        ts_seen: set[str] = set()
        for i, f in enumerate(batch):
            if texts is not None:
                body = texts[i][0]
                if not isinstance(body, TablesBody):
                    raise NotPlain("landing formats mixed in one batch")
                got = body.got
            else:
                got = tablefile.salvage(store.open_bytes(f.name))
            if got.header is None or got.damage is not None:
                raise NotPlain(f"{f.name}: damaged ({got.damage})")
            size += TablesBody(got).nbytes
            if size > max_bytes:
                raise NotPlain(f"more than load.driver_max_bytes ({max_bytes}) of landing columns")
            self.num_rows += got.header.records
            ords, lsns, seqs = [], [], []
            counts: dict[str, int] = {}
            try:
                segments = tablefile.rows_segments(got.segments)
            except ValueError as exc:
                raise NotPlain(f"{f.name}: {exc}") from None
            for seg, b in segments:
                layout = seg.layout
                lsn_u = b.column(1).to_numpy()
                if len(lsn_u) and lsn_u.max() >= 1 << 63:
                    raise NotPlain("a position out of range")
                n_seg, seq_seg = b.column(0).to_numpy(), b.column(2).to_numpy()
                if np.any(np.diff(n_seg) <= 0):
                    raise NotPlain(f"{f.name}: ordinals not increasing in a segment")
                ords.append(n_seg)
                lsns.append(lsn_u.astype(np.int64))
                seqs.append(seq_seg)
                # The segment's ends as its rows say (positions rise with ordinals: checked below),
                # never as the header says.
                self._ends[id(b)] = (
                    ChangePosition(int(lsn_u[0]), int(seq_seg[0])),
                    ChangePosition(int(lsn_u[-1]), int(seq_seg[-1])),
                )
                ts_seen.update(b.column(4).dictionary.to_pylist())
                counts[layout.qualified] = counts.get(layout.qualified, 0) + seg.rows
                self._segments.setdefault(layout.qualified, []).append((i, seg, b))
                codes = b.column(tablefile.VALUES_AT - 1).to_numpy()
                for k, shape in enumerate(layout.shapes):
                    info, problem = layout_shape(layout, shape)
                    if problem:
                        raise NotPlain(f"{layout.qualified}: {problem}")
                    rows = np.flatnonzero(codes == k)
                    if len(rows):
                        r0, r1 = int(rows[0]), int(rows[-1])
                        tally.add(
                            f.name,
                            info,
                            len(rows),
                            ChangePosition(int(lsn_u[r0]), int(seq_seg[r0])),
                            ChangePosition(int(lsn_u[r1]), int(seq_seg[r1])),
                            (b, r1),
                        )
            if any(counts.get(t, 0) != k for t, k in got.header.tables.items()) or set(counts) - set(got.header.tables):
                raise NotPlain(f"{f.name}: records other than its header counts")
            if ords:
                # The file's changes in ordinal order (which is position order: checked), each
                # put at its ordinal: no sort.
                n_all = np.concatenate(ords)
                total = got.header.records
                if n_all.min() < 0 or n_all.max() >= total:
                    raise NotPlain(f"{f.name}: an ordinal out of range")
                held = np.zeros(total, bool)
                held[n_all] = True
                if int(held.sum()) != len(n_all):
                    raise NotPlain(f"{f.name}: an ordinal twice")
                lsn, seq = np.zeros(total, np.int64), np.zeros(total, np.int64)
                lsn[n_all], seq[n_all] = np.concatenate(lsns), np.concatenate(seqs)
                lsn, seq = lsn[held], seq[held]
                if len(lsn) and (seq.min() < 0 or not positions_after(lsn[1:], seq[1:], (lsn[:-1], seq[:-1])).all()):
                    raise NotPlain("positions not strictly increasing in a file")
                if (
                    not positions_after(lsn[:1], seq[:1], f.first, inclusive=True).all()
                    or positions_after(lsn[-1:], seq[-1:], f.last).any()
                ):
                    raise NotPlain("a position outside its file's range")
        for value in ts_seen:
            if not _TIMESTAMP.match(value) or not re.match(UTC_TEXT, value):
                raise NotPlain(f"commit time {value[:40]!r} not in capture's UTC form")
        self.survey = tally.survey(_newest_row)

    def span(self, table: SourceTable) -> tuple[ChangePosition, ChangePosition]:
        """The positions of the table's first and last change in the batch."""
        segs = self._segments[table.qualified]
        return min(self._ends[id(b)][0] for _, _, b in segs), max(self._ends[id(b)][1] for _, _, b in segs)

    def history_parts(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> list[pa.Table]:
        """The table's history rows, in position order, as one part (the batch is in memory); rows
        whose values do not fit are left out and kept in :attr:`misfits`."""
        return [self.history_rows(table, columns, target)]

    def history_rows(self, table: SourceTable, columns: list[HistoryColumn], target: pa.Schema) -> pa.Table:
        """The table's history rows in ``target``'s columns and types (the Iceberg table's schema)."""
        import numpy as np
        import pyarrow as pa

        from loader.landing.tablefile import VALUES_AT

        segs = self._segments.pop(table.qualified)
        lsn = np.concatenate([b.column(1).to_numpy().astype(np.int64) for _, _, b in segs])
        seq = np.concatenate([b.column(2).to_numpy() for _, _, b in segs])
        codes = [b.column(VALUES_AT - 1).to_numpy() for _, _, b in segs]
        # A segment holds a table's changes of one block in file order, so the segments in file
        # and block order are the table's changes in position order. Should a file list them
        # otherwise, one permutation by (file, ordinal) puts them in order, applied to each
        # column once it is typed (fixed-width values move cheaply).
        ords = np.concatenate([(np.int64(i) << 32) | b.column(0).to_numpy().astype(np.int64) for i, _, b in segs])
        perm = None if bool((np.diff(ords) > 0).all()) else np.argsort(ords, kind="stable")
        order = None if perm is None else pa.array(perm)
        if perm is not None:
            lsn, seq = lsn[perm], seq[perm]

        def ordered(values: Any) -> Any:
            return values if order is None else values.take(order)

        def ordered_np(values: Any) -> Any:
            return values if perm is None else values[perm]

        def cat(arrays: list[Any]) -> Any:
            return pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]

        # Per segment: the value columns of each source column name.
        places = []
        for _, seg, _ in segs:
            at: dict[str, list[int]] = {}
            for u, (name, _) in enumerate(seg.layout.columns):
                at.setdefault(name, []).append(u)
            places.append(at)
        out: dict[str, Any] = {}
        sent: dict[str, np.ndarray] = {}
        bad: np.ndarray | None = None
        for col in columns:
            parts, mask = [], []
            for (_, seg, b), at, code in zip(segs, places, codes, strict=True):
                layout = seg.layout
                us = at.get(col.source, [])
                if not us:
                    parts.append(pa.nulls(len(b), pa.string()))
                    mask.append(np.zeros(len(b), bool))
                    continue
                if len(us) > 1 or layout.columns[us[0]][1] != col.pg_type:
                    raise NotPlain(f"{table.qualified}: column {col.source} changes type in the batch")
                u = us[0]
                held = np.array([u in shape.columns for shape in layout.shapes])[code]
                values = b.column(VALUES_AT + u)
                if not held.all() and (values.is_valid().to_numpy(zero_copy_only=False) & ~held).any():
                    raise NotPlain(f"{table.qualified}: a value of {col.source} in a change without it")
                parts.append(values)
                mask.append(held)
            sent[col.source] = ordered_np(np.concatenate(mask))
            typed, misfit = _typed_or_misfit(cat(parts), col, table)
            out[col.lake] = ordered(typed)
            if misfit is not None:
                misfit = ordered_np(misfit)
                bad = misfit if bad is None else bad | misfit
        op = ordered_np(
            np.concatenate(
                [
                    np.array([_OP_INDEX[shape.op] for shape in seg.layout.shapes], np.int8)[code]
                    for (_, seg, _), code in zip(segs, codes, strict=True)
                ]
            )
        )
        out.update(
            pg_lsn=pa.array(lsn),
            pg_seq=pa.array(seq),
            pg_txn_id=ordered(cat([b.column(3) for _, _, b in segs])),
            pg_operation=pa.array([OPERATIONS[o] for o in _OP_INDEX], pa.string()).take(pa.array(op)),
            pg_txn_timestamp=ordered(self._commit_times(table, segs)),
            pg_change_lsn=ordered(cat([b.column(5) for _, _, b in segs])),
            pg_old_key=ordered(self._old_keys(segs, codes)),
            pg_note=pa.nulls(len(lsn), pa.string()),
        )
        # (a batch with columns dropped at the source goes to the Spark path: no drops here)
        out["pg_absent_columns"] = absent_columns(columns, sent, op == _OP_INDEX["U"], lsn, seq, {})
        file_of = ordered_np(np.repeat(np.array([i for i, _, _ in segs], np.int64), [seg.rows for _, seg, _ in segs]))
        out["pg_landing_file"] = pa.array([f.name for f in self.batch], pa.string()).take(pa.array(file_of))
        history = _in_target(out, len(lsn), target)
        if bad is None:
            return history
        self.misfits.setdefault(table, []).append(Misfits(file_of[bad], lsn[bad], seq[bad]))
        return history.filter(pa.array(~bad))

    @staticmethod
    def _commit_times(table: SourceTable, segs: list[tuple[int, Any, Any]]) -> pa.Array:
        """pg_txn_timestamp of the segments' rows (in segment order): each distinct text typed once."""
        import pyarrow as pa
        import pyarrow.compute as pc

        texts = pc.unique(pa.concat_arrays([b.column(4).dictionary for _, _, b in segs]))
        typed = _typed(texts, HistoryColumn("", "timestamp with time zone"), table)
        return pa.concat_arrays(
            [typed.take(pc.index_in(b.column(4).dictionary, texts).take(b.column(4).indices)) for _, _, b in segs]
        )

    @staticmethod
    def _old_keys(segs: list[tuple[int, Any, Any]], codes: list[Any]) -> pa.Array:
        """pg_old_key of the segments' rows (in segment order), as the load kernel writes it
        (``loader.load.kernel.json_objects``): the rows of shapes with the same old-key columns
        share their names, so each row's object is the same literal text around its values,
        joined column by column; null for a change without an old key."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from loader.landing.tablefile import VALUES_AT
        from loader.load.kernel import json_string, json_strings, keyed_objects
        from loader.names import lake_column

        parts = []
        for (_, seg, b), code in zip(segs, codes, strict=True):
            layout = seg.layout
            keyed: dict[tuple[int, ...], list[int]] = {}
            for k, shape in enumerate(layout.shapes):
                if shape.identity:
                    keyed.setdefault(shape.identity, []).append(k)
            part = pa.nulls(len(b), pa.string())
            first = VALUES_AT + len(layout.columns)
            for ident, shapes in keyed.items():
                of_shapes = np.zeros(len(layout.shapes), bool)
                of_shapes[shapes] = True
                rows = of_shapes[code]
                every = bool(rows.all())
                prefixes = [
                    ("{" if j == 0 else ",") + json_string(lake_column(layout.identity[u][0])) + ":"
                    for j, u in enumerate(ident)
                ]
                spread = keyed_objects(prefixes, [b.column(first + u) for u in ident], None if every else rows)
                if spread is not None:
                    part = spread if every or len(keyed) == 1 else pc.if_else(pa.array(rows), spread, part)
                    continue
                at = None if every else pa.array(np.flatnonzero(rows))
                pieces: list[Any] = []
                for prefix, u in zip(prefixes, ident, strict=True):
                    values = b.column(first + u)
                    pieces.extend([prefix, json_strings(values if at is None else values.take(at))])
                pieces.append("}")
                objects = pc.binary_join_element_wise(*pieces, "")
                if every:
                    part = objects
                    continue
                # Back in the segment's rows: each keyed row takes its object, the others stay.
                spread = objects.take(pa.array(np.cumsum(rows) - 1, mask=~rows))
                part = spread if len(keyed) == 1 else pc.if_else(pa.array(rows), spread, part)
            parts.append(part)
        return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


_OP_INDEX = {"I": 0, "U": 1, "D": 2}


def _newest_row(ref: tuple[Any, int]) -> tuple[int, int, str]:
    """(lsn, seq, commit time) of row ``ref[1]`` of the segment batch ``ref[0]``."""
    batch, r = ref
    return int(batch.column(1)[r].as_py()), int(batch.column(2)[r].as_py()), batch.column(4)[r].as_py()
