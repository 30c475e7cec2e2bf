"""A batch of landing records in Arrow columns, as the driver load and the executors' decoder
both read it: the column and old-key entries flattened with their row offsets, the key lists, and
rows numbered by their shape (operation, table, column names and types, old-key names, key).

:class:`NotPlain` says a batch is not one the columnar paths take (a null entry, say); they then
leave it to the row-by-row decoder (``loader.load.decode``), which says exactly what is wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    """Rows numbered by their shape, densely from 0: rows get the same number exactly when their
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
    uniq, inverse = np.unique(acc, return_inverse=True)
    return inverse.ravel().astype(np.int64), len(uniq)


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
