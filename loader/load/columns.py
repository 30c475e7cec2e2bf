"""A batch of landing records in Arrow columns, as the driver load and the executors' decoder
both read it: the column and old-key entries flattened with their row offsets, the key lists, and
rows numbered by their shape (operation, table, column names and types, old-key names, key).

:class:`NotPlain` says a batch is not one the columnar paths take (a null entry, say); they then
leave it to the row-by-row decoder (``loader.load.decode``), which says exactly what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loader.landing.records import ChangeRecord, Column

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


class NotPlain(Exception):
    """The batch goes to the Spark path, which says exactly what is wrong (this only says what is
    not plain, for the debug log)."""


def entries(chunked: Any, what: str) -> tuple[np.ndarray, pa.Array, pa.Array, pa.Array]:
    """A ``list<[name, type, value]>`` column (v1) or ``list<struct<name, type, value>>`` (v2) as
    (row offsets, names, types, values), flat; an absent list reads as empty (msgspec's default)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths, names, types, values = [], [], [], []
    for chunk in chunked.chunks:
        lengths.append(pc.fill_null(pc.list_value_length(chunk), 0).to_numpy())
        flat = chunk.flatten()
        if flat.null_count:
            raise NotPlain(f"a {what} entry that is null")
        if pa.types.is_struct(flat.type):  # landing v2: {name, type, value}
            name, typ, value = flat.flatten()
            names.append(name)
            types.append(typ)
            values.append(value)
            continue
        if len(flat):
            entry_len = pc.list_value_length(flat)
            if pc.min(entry_len).as_py() != 3 or pc.max(entry_len).as_py() != 3:
                raise NotPlain(f"a {what} entry that is not [name, type, value]")
        names.append(pc.list_element(flat, 0))
        types.append(pc.list_element(flat, 1))
        values.append(pc.list_element(flat, 2))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [])]).astype(np.int64)

    def concat(parts: list[Any]) -> Any:
        return pa.concat_arrays(parts) if parts else pa.array([], pa.string())

    n, t = concat(names), concat(types)
    if n.null_count or t.null_count:
        raise NotPlain(f"a {what} entry without a name or type")
    return offsets, n, t, concat(values)


def text_lists(chunked: Any) -> tuple[np.ndarray, pa.Array]:
    """A ``list<string>`` column (the key) as (row offsets, items)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = [pc.fill_null(pc.list_value_length(c), 0).to_numpy() for c in chunked.chunks]
    items = [c.flatten() for c in chunked.chunks]
    flat = pa.concat_arrays(items) if items else pa.array([], pa.string())
    if flat.null_count:
        raise NotPlain("a key column that is null")
    return np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [])]).astype(np.int64), flat


def shape_ids(row_codes: list[np.ndarray], lists: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, int]:
    """Rows numbered by their shape, densely from 0 in order of first appearance: rows get the same number exactly when their
    ``row_codes`` and their code lists (``(row offsets, codes)``) are equal.

    The codes are combined as digits of one number per row (mixed radix); when the next digit
    would overflow, the number so far is renumbered densely (one sort) first. Lists enter by their
    length, then by their items position by position (a row without an item there gives the
    digit 0, items shifted by one). Returns (numbers, how many)."""
    import numpy as np

    n = len(row_codes[0])
    if n == 0:
        return np.zeros(0, np.int64), 0
    acc = np.zeros(n, np.int64)
    span = 1  # acc < span

    def digit(values: np.ndarray, radix: int) -> None:
        nonlocal acc, span
        if span * radix >= 1 << 62:
            uniq, inverse = np.unique(acc, return_inverse=True)
            acc, span = inverse.ravel().astype(np.int64), len(uniq)
        acc = acc * radix + values
        span *= radix

    for codes in row_codes:
        digit(codes, int(codes.max()) + 1)
    for offsets, items in lists:
        lengths = np.diff(offsets)
        longest = int(lengths.max())
        digit(lengths, longest + 1)
        radix = int(items.max()) + 2 if len(items) else 1
        for k in range(longest):
            has = lengths > k
            values = np.zeros(n, np.int64)
            values[has] = items[offsets[:-1][has] + k] + 1
            digit(values, radix)
    return dense_ids(acc)


def dense_ids(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Integers numbered densely from 0 in the order they first appear (equal values, equal
    numbers), by Arrow's hash table: no sort. Returns (numbers, how many)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(pa.array(values, pa.int64()))
    return np.asarray(encoded.indices).astype(np.int64), len(encoded.dictionary)


def first_rows(ids: np.ndarray) -> np.ndarray:
    """Where each number of :func:`dense_ids` first appears (the rows where the running maximum
    rises: numbers are given in order of first appearance), for number 0, 1, ..."""
    import numpy as np

    if not len(ids):
        return np.zeros(0, np.int64)
    running = np.maximum.accumulate(ids)
    return np.flatnonzero(np.diff(running, prepend=-1) > 0)


def text_codes(texts: Any) -> tuple[np.ndarray, Any]:
    """Texts (plain or dictionary-encoded) as (a code per text, the distinct texts): equal texts
    get equal codes (a file's dictionary may repeat a text: its entries are numbered again)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    encoded = texts if pa.types.is_dictionary(texts.type) else pc.dictionary_encode(texts)
    indices = np.asarray(encoded.indices.fill_null(0)).astype(np.int64)
    unique = pc.dictionary_encode(encoded.dictionary)
    if len(unique.dictionary) < len(encoded.dictionary):
        return np.asarray(unique.indices).astype(np.int64)[indices], unique.dictionary
    return indices, encoded.dictionary


@dataclass
class RecordShape:
    """What a record's checks and its row's name lists depend on besides its values."""

    op: str
    schema: str
    table: str
    names: list[str]
    types: list[str]
    key_names: list[str]
    key_types: list[str]
    pk: list[str]

    def record(self) -> ChangeRecord:
        """A record of this shape (no position, no values), for the decoder's shape checks."""
        return ChangeRecord(
            self.op,
            0,
            0,
            0,
            "",
            self.schema,
            self.table,
            columns=[Column(n, t, None) for n, t in zip(self.names, self.types, strict=True)],
            identity=[Column(n, t, None) for n, t in zip(self.key_names, self.key_types, strict=True)],
            pk=self.pk,
        )


class RecordColumns:
    """A batch of records' column entries, old-key entries and keys, flat with row offsets
    (:func:`entries`, :func:`text_lists`); NotPlain for a null entry."""

    def __init__(self, rows: Any) -> None:
        self.col_offsets, self.names, self.types, self.values = entries(rows.column("columns"), "column")
        self.id_offsets, self.id_names, self.id_types, self.id_values = entries(rows.column("identity"), "old-key")
        self.pk_offsets, self.pk_items = text_lists(rows.column("pk"))

    def shape_ids(self, op: Any, schema: Any, table: Any) -> tuple[np.ndarray, int, list[Any]]:
        """Rows numbered by shape (operation, table, column names and types, old-key names and
        types, key) as :func:`shape_ids` numbers them: (numbers, how many, the distinct texts of
        names and types, for callers that check them)."""
        op_codes, _ = text_codes(op)
        schema_codes, schemas = text_codes(schema)
        table_codes, tables = text_codes(table)
        name_codes, name_dict = text_codes(self.names)
        type_codes, type_dict = text_codes(self.types)
        id_codes, id_dict = text_codes(self.id_names)
        id_type_codes, id_type_dict = text_codes(self.id_types)
        pk_codes, pk_dict = text_codes(self.pk_items)
        ids, count = shape_ids(
            [op_codes, schema_codes, table_codes],
            [
                (self.col_offsets, name_codes * max(1, len(type_dict)) + type_codes),
                (self.id_offsets, id_codes * max(1, len(id_type_dict)) + id_type_codes),
                (self.pk_offsets, pk_codes),
            ],
        )
        return ids, count, [schemas, tables, name_dict, type_dict, id_dict, id_type_dict, pk_dict]

    def shape(self, op: Any, schema: Any, table: Any, r: int) -> RecordShape:
        """Row ``r``'s shape (``op``, ``schema``, ``table``: the batch's record-level columns)."""
        import pyarrow as pa

        def part(texts: Any, offsets: Any) -> list[str]:
            a, b = int(offsets[r]), int(offsets[r + 1])
            return [str(x) for x in texts.slice(a, b - a).cast(pa.string()).to_pylist()]

        return RecordShape(
            str(op[r].as_py()),
            str(schema[r].as_py()),
            str(table[r].as_py()),
            part(self.names, self.col_offsets),
            part(self.types, self.col_offsets),
            part(self.id_names, self.id_offsets),
            part(self.id_types, self.id_offsets),
            part(self.pk_items, self.pk_offsets),
        )
