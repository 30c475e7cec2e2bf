"""The load kernel's row rules in Arrow: landing change rows into history rows.

Both schedulers run these: the driver on the batches it reads itself (``loader.load.driver``), and
Spark in its executors (``mapInArrow`` over the decoder's change rows,
``loader.load.history``). What a history row holds is written here once:

- each source column's value typed by :mod:`loader.load.values`, a value that does not fit kept
  out (NULL) and named in the row's reason (``column c (t): value v does not fit``, joined by
  ``'; '``), which makes the row a reject;
- ``pg_old_key``: the old key as a JSON object of lake names to PostgreSQL's texts, written as
  Spark's ``to_json`` of a ``map<string,string>`` writes it (Jackson's escapes);
- ``pg_absent_columns``: per update, the varlena columns it did not send (unchanged TOAST), except
  columns dropped at the source at or before the change;
- ``pg_txn_timestamp``: the commit time typed as a timestamptz;
- what a table's rows that did not fit leave behind (:func:`misfit_park_note`: one park, where
  :func:`park_seq` puts it) and the ``loader.parked`` state its park and resync rows give
  (:func:`parked_after`).

Input rows are ``loader.load.decode.CHANGE_ROW_DDL``'s; :func:`history_ddl` is the output's Spark
schema, :func:`history_batch` the function.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loader.lake.types import never_toasted, quote_ident, spark_type
from loader.load.sql import LINE, RAW, REASON, HistoryColumn
from loader.load.values import Misfit, typed_distinct, typed_or_misfits
from loader.lsn import ChangePosition, positions_after
from loader.names import lake_column

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# History's metadata columns as the kernel writes them (Spark types), then the internal ones.
METADATA_DDL = (
    "pg_lsn BIGINT, pg_seq BIGINT, pg_txn_id BIGINT, pg_operation STRING, pg_txn_timestamp TIMESTAMP,"
    " pg_change_lsn BIGINT, pg_old_key STRING, pg_absent_columns ARRAY<STRING>, pg_landing_file STRING,"
    f" pg_note STRING, {LINE} INT, {REASON} STRING, {RAW} STRING"
)
_RAW_FIELDS = (
    "op",
    "commit_lsn",
    "seq",
    "xid",
    "ts",
    "src_schema",
    "src_table",
    "col_names",
    "col_values",
    "key_names",
    "key_values",
)


def history_ddl(columns: list[HistoryColumn]) -> str:
    """Spark's schema of :func:`history_batch`'s output for ``columns``."""
    source = [f"{quote_ident(c.lake)} {spark_type(c.pg_type).sql}" for c in columns]
    return ", ".join([*source, METADATA_DDL])


def history_batch(
    batch: pa.RecordBatch, columns: list[HistoryColumn], dropped: dict[str, ChangePosition]
) -> pa.RecordBatch:
    """One batch of a table's change rows (``CHANGE_ROW_DDL``) as history rows plus the internal
    ``pg__line``, ``pg__reason`` ('' where every value fits) and ``pg__raw`` (the change as JSON,
    for the rows that do not fit)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    names = batch.column("col_names")
    values = batch.column("col_values")
    flat_names = names.flatten()
    flat_values = values.flatten()
    parents = pc.list_parent_indices(names).to_numpy()
    op = batch.column("op")
    is_update = pc.fill_null(pc.equal(op, "update"), False).to_numpy(zero_copy_only=False)
    lsn = batch.column("commit_lsn").to_numpy(zero_copy_only=False)
    seq = batch.column("seq").to_numpy(zero_copy_only=False)
    out: list[pa.Array] = []
    reasons: list[pa.Array] = []
    sent_of: dict[str, np.ndarray] = {}
    # Where each column's value sits in the flattened lists, for every row (-1: not sent): the
    # names numbered once (dictionary), then one scatter for all columns, whatever the width.
    encoded = pc.dictionary_encode(flat_names)
    number = {c.source: i for i, c in enumerate(columns)}
    of_name = np.array([number.get(name, -1) for name in encoded.dictionary.to_pylist()] + [-1], np.int64)
    column_of = of_name[pc.fill_null(encoded.indices, len(of_name) - 1).to_numpy(zero_copy_only=False)]
    known = np.flatnonzero(column_of >= 0)
    where = np.full((len(columns), n), -1, np.int64)
    where[column_of[known], parents[known]] = known
    for i, col in enumerate(columns):
        at = where[i]
        sent = at >= 0
        storage, why = typed_column(flat_values.take(pa.array(at, pa.int64(), mask=~sent)), col)
        out.append(storage)
        if why is not None:
            reasons.append(why)
        sent_of[col.source] = sent
    reason = _joined_reasons(reasons) if reasons else None
    try:
        ts = typed_distinct(batch.column("ts"), "timestamp with time zone", "")
    except Misfit:
        ts, _ = typed_or_misfits(batch.column("ts"), "timestamp with time zone")
    out += [
        batch.column("commit_lsn"),
        batch.column("seq"),
        batch.column("xid"),
        op,
        ts,
        batch.column("change_lsn"),
        json_objects(batch.column("key_names"), batch.column("key_values")),
        absent_columns(columns, sent_of, is_update, lsn, seq, dropped),
        batch.column("landing_file"),
        batch.column("note"),
        batch.column("line"),
        reason if reason is not None else pa.array([""] * n, pa.string()),
        _raw_json(batch, reason),
    ]
    names_out = [c.lake for c in columns] + [f.split(" ")[0] for f in METADATA_DDL.split(", ")]
    return pa.RecordBatch.from_arrays(out, names=names_out)


def typed_column(text: pa.Array, col: HistoryColumn) -> tuple[pa.Array, pa.Array | None]:
    """A column's texts typed by :mod:`loader.load.values`, a value that does not fit as NULL; and
    per row why (``column c (t): value v does not fit``, NULL where it fits), or None when every
    value fits."""
    import pyarrow as pa
    import pyarrow.compute as pc

    storage, misfit = typed_or_misfits(text, col.pg_type)
    if misfit is None or spark_type(col.pg_type).lossless_text:
        return storage, None
    label = f"column {col.source} ({col.pg_type}): value "
    why = pc.if_else(
        misfit, pc.binary_join_element_wise(label, text, " does not fit", ""), pa.scalar(None, pa.string())
    )
    return storage, why


def _joined_reasons(reasons: list[pa.Array]) -> pa.Array:
    """Per row, its columns' reasons joined by '; ' ('' where none): ``concat_ws`` of them."""
    import pyarrow as pa

    lists = [r.to_pylist() for r in reasons]
    return pa.array(["; ".join(x for x in row if x is not None) for row in zip(*lists, strict=True)], pa.string())


def absent_columns(
    columns: list[HistoryColumn],
    sent: dict[str, np.ndarray],
    is_update: np.ndarray,
    lsn: np.ndarray,
    seq: np.ndarray,
    dropped: dict[str, ChangePosition],
) -> pa.Array:
    """pg_absent_columns: per update, the lake names of the varlena columns it did not send (their
    value is unchanged TOAST), in ``columns``' order. Fixed-length columns are never TOASTed (not
    sent: dropped at the source), and a column dropped at or before the change reads NULL.
    ``sent``: per source column, which rows carry it."""
    import numpy as np

    absent = []
    for col in columns:
        if never_toasted(col.pg_type):
            continue
        gone = ~sent.get(col.source, np.zeros(len(is_update), bool)) & is_update
        if col.source in dropped:
            gone &= ~positions_after(lsn, seq, dropped[col.source], inclusive=True)
        absent.append((col.lake, gone))
    return _name_lists(absent, len(is_update))


def _name_lists(absent: list[tuple[str, np.ndarray]], n: int) -> pa.Array:
    """Per row, the names whose mask is true there, in ``absent``'s order."""
    import numpy as np
    import pyarrow as pa

    absent = [(name, mask) for name, mask in absent if mask.any()]  # (most changes send every column)
    if not absent:
        return _empty_lists(n)
    masks = np.stack([m for _, m in absent], axis=1)
    offsets = np.concatenate([[0], np.cumsum(masks.sum(axis=1))]).astype(np.int32)
    _, which = np.nonzero(masks)  # row-major: each row's names in column order
    labels = pa.array([name for name, _ in absent], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), labels.take(pa.array(which)))


def _empty_lists(n: int) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()))


# --- JSON as Spark's to_json writes it --------------------------------------------------------

# Jackson's escapes: '"' and '\\', short forms for five control characters, \\u00XX (upper-case
# hex) for the other control characters; everything else (including '/', DEL, non-ASCII) as is.
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES = {**{chr(c): f"\\u{c:04X}" for c in range(32)}, **_SHORT}
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def json_string(text: str) -> str:
    """``text`` as a JSON string literal, escaped as Spark's ``to_json`` escapes it."""
    return '"' + "".join(_ESCAPES.get(ch, ch) for ch in text) + '"'


def json_strings(texts: pa.Array) -> pa.Array:
    """Each text as a JSON string literal (quoted, escaped as :func:`json_string`), NULL as ``null``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = texts.cast(pa.string())
    if len(texts) and pc.any(pc.match_substring_regex(texts, _NEEDS_ESCAPE)).as_py():
        texts = pc.replace_substring(texts, "\\", "\\\\")
        for ch, esc in _ESCAPES.items():
            if ch != "\\" and pc.any(pc.match_substring(texts, ch)).as_py():
                texts = pc.replace_substring(texts, ch, esc)
    return pc.fill_null(pc.binary_join_element_wise('"', texts, '"', ""), "null")


def keyed_objects(prefixes: list[str], columns: list[pa.Array], keyed: np.ndarray | None) -> pa.Array | None:
    """Per row, ``prefixes[0] json(columns[0][row]) prefixes[1] ... "}"`` (each text a JSON string
    literal as :func:`json_strings` writes it, NULL as ``null``) where ``keyed`` is true (every row
    when None), NULL elsewhere: a history segment's pg_old_key in one pass of the compiled typing
    module (``loader/load/_typing.c``). None where that module is not built, a column is not a plain
    string array, or the texts would pass 2 GiB: the caller then joins them with Arrow."""
    import numpy as np
    import pyarrow as pa

    from loader.load.values import _string_buffers, _typing_c

    n = len(columns[0])
    buffers = []
    for c in columns:
        found = _string_buffers(c)
        if found is None:
            return None
        validity = c.buffers()[0]
        buffers.append((*found, c.offset, validity if validity is not None and c.null_count else b""))
    flags = b"" if keyed is None else np.ascontiguousarray(keyed, np.uint8)
    out = _typing_c.json_objects(tuple(p.encode() for p in prefixes), tuple(buffers), flags, n)
    if out is None:
        return None
    validity, offsets, data = out
    return pa.Array.from_buffers(
        pa.string(), n, [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)], null_count=-1
    )


def json_objects(keys: pa.Array, values: pa.Array) -> pa.Array:
    """Per row, ``{"lake name":"text",...}`` from parallel lists of source names and texts, as
    ``to_json(map_from_arrays(lake names, texts))``; NULL where the lists are empty or NULL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(keys, pa.ChunkedArray):
        keys, values = keys.combine_chunks(), values.combine_chunks()
    flat_keys = keys.flatten()
    if len(flat_keys):
        encoded = pc.dictionary_encode(flat_keys)
        lake = pa.array([lake_column(k) for k in encoded.dictionary.to_pylist()], pa.string())
        flat_keys = lake.take(encoded.indices)
    items = pc.binary_join_element_wise(json_strings(flat_keys), json_strings(values.flatten()), ":")
    offsets = pc.subtract(keys.offsets, keys.offsets[0]) if len(keys) else pa.array([0], pa.int32())
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, items), ",")
    wrapped = pc.binary_join_element_wise("{", joined, "}", "")
    empty = pc.fill_null(pc.equal(pc.list_value_length(keys), 0), True)
    return pc.if_else(empty, pa.scalar(None, pa.string()), wrapped)


def _raw_json(batch: pa.RecordBatch, reason: pa.Array | None) -> pa.Array:
    """The change as ``to_json(struct(...))`` (NULL fields left out), for the rows with a reason."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    if reason is None or not pc.any(pc.not_equal(reason, "")).as_py():
        return pa.nulls(n, pa.string())
    rows = batch.select(list(_RAW_FIELDS)).to_pylist()
    bad = pc.not_equal(reason, "").to_pylist()
    return pa.array([_to_json(r) if b else None for r, b in zip(rows, bad, strict=True)], pa.string())


def _to_json(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_string(k)}:{_to_json(v)}" for k, v in value.items() if v is not None) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_to_json(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json_string(value)
    return json.dumps(value)


# --- parks -----------------------------------------------------------------------------------


def misfit_park_note(misfits: int, first_lsn: int, first_reason: str, qualified: str) -> str:
    """The note of the park a table's rows that did not fit leave (``misfits`` of them, the first
    at ``first_lsn`` with ``first_reason``): they are in the rejects table."""
    from loader.load.decode import repair_hint

    return (
        f"{misfits} changes quarantined in the rejects table (first at LSN {ChangePosition(first_lsn, 0)}: "
        f"{first_reason}); {repair_hint(qualified)}"
    )


def park_seq(last_seq: int | None, resync: bool) -> int:
    """Where in a transaction a park for changes of it that could not be taken goes
    (``last_seq``: the last position of the table's rows of that transaction in the batch, those
    changes included; ``resync``: one of them is a resync marker).

    At its start (seq 0), so that the current table stops before the whole transaction; but a
    snapshot or resync is one transaction whose resync marker lifts every park before it (a park
    the load derives for a retype waits for exactly that resync), so there the park goes right after
    the table's last row of it: the resync is applied without the rows that did not fit, and the
    table is parked until a later resync. (At seq 0 the snapshot lifted its own park, and the
    rejected rows were gone from a current table that was not parked: fuzz, FUZZ_GAPS=all seed 307.)
    """
    return int(last_seq) + 1 if resync and last_seq is not None else 0


def parked_after(state: str | None, markers: list[tuple[int, int, str, str | None]]) -> str | None:
    """A history table's ``loader.parked`` property (``state``: as it is, JSON or None) after its
    park and resync rows ``markers`` ((lsn, seq, operation, note), in position order): a resync
    lifts the park, the first park after it sets one (since its position, its note as reason); a
    table already parked stays parked since its first park. Display only (status, verify): merges
    find parks from the rows themselves."""
    parked = json.loads(state) if state else None
    for lsn, seq, operation, note in markers:
        if operation == "resync":
            parked = None
        elif parked is None:
            parked = {"since": ChangePosition(lsn, seq).token(), "reason": note or "parked"}
    return json.dumps(parked) if parked is not None else None
