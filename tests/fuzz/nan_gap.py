"""The oracle's allowance for the known gap ``nan_infinity`` (``workload.KNOWN_GAPS``), pure.

wal2json 2.5 prints numeric and float ``NaN`` / ``Infinity`` / ``-Infinity`` as JSON null, so a value
that came through the stream is NULL in the lake where the source holds one of them (snapshots and
resyncs keep them). With the gap drawn, the fuzz oracle re-reads a table verify found different and
accepts it only if every difference is exactly that: a NULL in the lake where the source's value, in
a ``numeric``, ``real`` or ``double precision`` column, is NaN or +-Infinity. Anything else (a NULL
where the source holds a finite value, a missing or extra row, any other column) stays a difference.

Rows are tuples of canonical pieces (``loader.canonical``: ``N;`` or ``<length>:<text>;``), one per
compared column, as verify compares them: no database here (``test_workload_unit.py`` holds it to that).

- A keyed table: the source's and the lake's rows by key; each differing value must be explained.
- A keyless table: the source's rows against history's state (rows added, +1, and old row images
  updates and deletes took away, -1; ``loader.verify`` rebuilds it). An old image wal2json sent has
  NULL where the stored row (from a snapshot) has NaN too, so a -1 image cancels a +1 row it equals
  but for such NULLs, and each source row must be matched to a +1 row it equals but for such NULLs:
  a perfect bipartite matching (found per class of rows equal once every NaN/+-Infinity is NULL).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from loader.canonical import NULL_PIECE

Row = tuple[str, ...]

#: The canonical texts (``loader.canonical``) of NaN, +Infinity and -Infinity per source type: numeric
#: as PostgreSQL prints it, floats as their IEEE bits (every NaN is ``NaN``).
SPECIAL_TEXTS = {
    "numeric": frozenset({"NaN", "Infinity", "-Infinity"}),
    "real": frozenset({"NaN", "7f800000", "ff800000"}),
    "double precision": frozenset({"NaN", "7ff0000000000000", "fff0000000000000"}),
}
# Scalar columns only (format_type's spelling): arrays of them are not part of the gap.
_SPECIAL_TYPE = re.compile(r"^(numeric|real|double precision)(\(\d+(,\s*-?\d+)?\))?$")

#: How capture flags a table whose NaN/+-Infinity wal2json before 2.6 prints as null: a note, in the
#: capture's result and its summary (``  note: schema.table: NaN and ±Infinity in c1, c2 arrive as NULL ...``).
_FLAG_NOTE = re.compile(r"^\s*(?:note: )?(\S+): NaN and ±Infinity in .* arrive as NULL", re.MULTILINE)


def flagged_tables(output: str) -> set[str]:
    """The tables capture's notes (or a capture's summary, a loader process's output) flag for the gap."""
    return set(_FLAG_NOTE.findall(output))


# A reject of a NaN that a numeric(p,s) column (a lake decimal) cannot hold: the load's reason for it
# (loader.load.kernel), one part per column that does not fit.
_NAN_MISFIT = re.compile(r"^column .+ \(numeric\(\d+,\s*\d+\)\): value NaN does not fit$")
_QUARANTINE_PARK = "changes quarantined in the rejects table"


def parked_for_nan(park_reason: str, reject_reasons: Sequence[str]) -> bool:
    """Whether a park is the loader's answer to NaN in a ``numeric(p,s)`` column and nothing else:
    a decimal cannot hold NaN, so a snapshot or resync that reads one quarantines the row and parks
    the table (the stream, under wal2json 2.5, brings NULL instead). The park must be for quarantined
    changes, and every reject of the table (``reject_reasons``, at least one) such a NaN alone."""
    return (
        _QUARANTINE_PARK in park_reason
        and bool(reject_reasons)
        and all(_NAN_MISFIT.match(part) for reason in reject_reasons for part in reason.split("; "))
    )


def special_texts(pg_type: str) -> frozenset[str]:
    """The canonical texts of NaN and +-Infinity in a column of ``pg_type`` (empty: not part of the gap)."""
    m = _SPECIAL_TYPE.match(pg_type)
    return SPECIAL_TEXTS[m.group(1)] if m else frozenset()


def piece_text(piece: str) -> str | None:
    """The canonical text in a piece (None for NULL)."""
    return None if piece == NULL_PIECE else piece[piece.index(":") + 1 : -1]


def split_pieces(text: str) -> Row:
    """A row's canonical text (its pieces joined) back into its pieces."""
    out = []
    i = 0
    while i < len(text):
        if text.startswith(NULL_PIECE, i):
            out.append(NULL_PIECE)
            i += len(NULL_PIECE)
            continue
        colon = text.index(":", i)
        end = colon + 1 + int(text[i:colon])
        if text[end : end + 1] != ";":
            raise ValueError(f"not a canonical row text at {i}: {text!r}")
        out.append(text[i : end + 1])
        i = end + 1
    return tuple(out)


def is_special(pg_type: str, piece: str) -> bool:
    return piece != NULL_PIECE and piece_text(piece) in special_texts(pg_type)


def lost(types: Sequence[str], source: Row, lake: Row) -> list[int] | None:
    """The columns where ``lake`` holds NULL for the source's NaN/+-Infinity, if that is the only way
    the two rows differ; None if they differ in any other way."""
    if len(source) != len(lake) or len(source) != len(types):
        return None
    out = []
    for i, (t, s, v) in enumerate(zip(types, source, lake)):
        if s == v:
            continue
        if v == NULL_PIECE and is_special(t, s):
            out.append(i)
            continue
        return None
    return out


def _describe(names: Sequence[str], source: Row, lake: Row) -> str:
    diff = {names[i]: (piece_text(s), piece_text(v)) for i, (s, v) in enumerate(zip(source, lake)) if s != v}
    return f"(source, lakehouse): {diff}"


def judge_keyed(
    names: Sequence[str], types: Sequence[str], source: dict[Row, Row], lake: dict[Row, Row]
) -> tuple[list[str], int]:
    """Source and lake rows by key: (differences the gap does not explain, values it explains)."""
    problems: list[str] = []
    accepted = 0
    for k, row in source.items():
        if k not in lake:
            problems.append(f"missing key {k}")
            continue
        cols = lost(types, row, lake[k])
        if cols is None:
            problems.append(f"key {k} differs {_describe(names, row, lake[k])}")
        else:
            accepted += len(cols)
    problems += [f"extra key {k}" for k in lake if k not in source]
    return problems, accepted


def normal(types: Sequence[str], row: Row) -> Row:
    """``row`` with every NaN/+-Infinity of a gap column as NULL: rows the gap may confuse share it."""
    return tuple(NULL_PIECE if is_special(t, p) else p for t, p in zip(types, row))


def judge_keyless(
    names: Sequence[str], types: Sequence[str], source: Sequence[Row], state: Sequence[tuple[Row, int]]
) -> tuple[list[str], int]:
    """Source rows against history's state (rows with +1 or -1): (differences the gap does not
    explain, values it explains). A -1 image cancels a +1 row it is ``lost`` from; every source row
    is matched to a +1 row ``lost`` from it; nothing may be left on either side."""
    plus: list[Row] = []
    minus: list[Row] = []
    for row, sign in state:
        for _ in range(abs(sign)):
            (plus if sign > 0 else minus).append(row)
    # Left: source rows and -1 images; right: +1 rows. Edges only within a class of ``normal``.
    left: dict[Row, list[tuple[str, Row]]] = defaultdict(list)
    right: dict[Row, list[Row]] = defaultdict(list)
    for row in source:
        left[normal(types, row)].append(("source", row))
    for row in minus:
        left[normal(types, row)].append(("minus", row))
    for row in plus:
        right[normal(types, row)].append(row)
    problems: list[str] = []
    accepted = 0
    for cls in sorted(set(left) | set(right)):
        ls, rs = left.get(cls, []), right.get(cls, [])

        adjacency = [[ri for ri in range(len(rs)) if _edge(types, ls[li], rs[ri]) is not None] for li in range(len(ls))]
        match = _max_matching(adjacency, len(rs))
        matched_left = {li for li in match if li is not None}
        for ri, li in enumerate(match):
            if li is None:
                problems.append(f"a row in history's state, not in the source: {_shown(names, rs[ri])}")
            else:
                accepted += len(_edge(types, ls[li], rs[ri]) or [])
        for li, (kind, row) in enumerate(ls):
            if li not in matched_left:
                problems.append(
                    f"a row in the source, not in history's state: {_shown(names, row)}"
                    if kind == "source"
                    else f"a row history's state takes away but never held: {_shown(names, row)}"
                )
    return problems, accepted


def _edge(types: Sequence[str], left: tuple[str, Row], plus: Row) -> list[int] | None:
    """A source row to the +1 row that may hold it (``plus`` lost values of it), or a -1 image to the
    +1 row it may take away (the image lost values of ``plus``)."""
    kind, row = left
    return lost(types, row, plus) if kind == "source" else lost(types, plus, row)


def _shown(names: Sequence[str], row: Row) -> dict[str, str | None]:
    return {n: piece_text(p) for n, p in zip(names, row)}


def _max_matching(adjacency: list[list[int]], n_right: int) -> list[int | None]:
    """A maximum bipartite matching (Kuhn's augmenting paths): for each right node, its left node."""
    match: list[int | None] = [None] * n_right

    def augment(li: int, seen: set[int]) -> bool:
        for ri in adjacency[li]:
            if ri in seen:
                continue
            seen.add(ri)
            other = match[ri]
            if other is None or augment(other, seen):
                match[ri] = li
                return True
        return False

    for li in range(len(adjacency)):
        augment(li, set())
    return match
