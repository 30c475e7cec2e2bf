"""PostgreSQL log sequence numbers and the change ordering key.

A change's place in commit order is ``(commit_lsn, seq)``: the LSN of its transaction's commit
record and its position inside that transaction. No two changes share it, and sorting by it
restores exact commit order across tables.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

# The largest seq a position token can hold: (lsn, END_OF_TRANSACTION) sorts after every change of
# the transaction committed at lsn and before every later transaction.
END_OF_TRANSACTION = 9_999_999_999

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\Z")


def parse_lsn(text: str) -> int:
    """'16/B374D848' -> integer byte position in the WAL."""
    m = _LSN_RE.match(text) or _LSN_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}")
    hi, lo = m.groups()
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(value: int) -> str:
    """Integer WAL position -> PostgreSQL's 'X/X' text form."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"LSN out of range: {value}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


_TOKEN_RE = re.compile(r"^([0-9A-Fa-f]{16})\.([0-9]{10})\Z")
_SHOWN_RE = re.compile(r"^([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8})(?:#([0-9]+))?\Z")


def parse_position(text: str) -> ChangePosition:
    """Any spelling of a position a user may have read somewhere, as a position.

    The one form the loader shows is ``X/Y#seq`` (PostgreSQL's LSN, then the change's place in its
    transaction); also accepted: a bare LSN ``X/Y`` (seq 0), the fixed-width token of landing file
    names and JSON of older versions (``0000000001EDBE78.0000000010``), and the integer ``pg_lsn``
    of history tables (seq 0).
    """
    t = text.strip()
    m = _SHOWN_RE.match(t)
    if m:
        return ChangePosition(parse_lsn(m.group(1)), int(m.group(2) or 0))
    m = _TOKEN_RE.match(t)
    if m:
        return ChangePosition(int(m.group(1), 16), int(m.group(2)))
    if t.isdigit() and int(t) < 1 << 64:
        return ChangePosition(int(t), 0)
    raise ValueError(
        f"not a position: {text!r} (give X/Y#seq as 'loader status' shows it, an LSN X/Y, or a pg_lsn integer)"
    )


def show_token(token: str) -> str:
    """A position token in the form the loader shows (``X/Y#seq``); other text unchanged."""
    return str(ChangePosition.from_token(token)) if _TOKEN_RE.match(token) else token


class ChangePosition(NamedTuple):
    """Total order of changes: commit LSN, then position within the transaction."""

    commit_lsn: int
    seq: int

    def token(self) -> str:
        """Fixed-width text that sorts like the position (used in landing file names)."""
        return f"{self.commit_lsn:016X}.{self.seq:010d}"

    @classmethod
    def from_token(cls, token: str) -> ChangePosition:
        lsn_hex, seq = token.split(".")
        return cls(int(lsn_hex, 16), int(seq))

    @classmethod
    def end_of(cls, commit_lsn: int) -> ChangePosition:
        """After every change of the transaction committed at ``commit_lsn``."""
        return cls(commit_lsn, END_OF_TRANSACTION)

    def just_before(self) -> ChangePosition:
        """The greatest position that sorts before this one."""
        if self.seq > 0:
            return ChangePosition(self.commit_lsn, self.seq - 1)
        return ChangePosition.end_of(self.commit_lsn - 1)

    def __str__(self) -> str:
        return f"{format_lsn(self.commit_lsn)}#{self.seq}"


SqlPosition = ChangePosition | tuple[int, int] | tuple[str, str]


def _sql_operands(position: SqlPosition) -> tuple[str, str]:
    lsn, seq = position
    # Integers become literals; strings are column expressions (a row compared with another row).
    return (str(int(lsn)) if isinstance(lsn, int) else lsn), (str(int(seq)) if isinstance(seq, int) else seq)


def position_after_sql(lsn_col: str, seq_col: str, position: SqlPosition, inclusive: bool = False) -> str:
    """SQL predicate: the change at (``lsn_col``, ``seq_col``) comes after ``position`` (or is it).

    The one spelling of the ordering comparison for every SQL the loader builds; written as
    plain comparisons (not struct/tuple comparison) so Iceberg can prune files on pg_lsn.
    """
    lsn, seq = _sql_operands(position)
    op = ">=" if inclusive else ">"
    return f"({lsn_col} > {lsn} OR ({lsn_col} = {lsn} AND {seq_col} {op} {seq}))"


def positions_after(lsn: Any, seq: Any, position: ChangePosition | tuple[Any, Any], inclusive: bool = False) -> Any:
    """numpy: which of the changes at (``lsn``, ``seq``) (arrays) come after ``position`` (or are
    it); ``position`` one position, or arrays of positions compared element by element."""
    p_lsn, p_seq = position
    return (lsn > p_lsn) | ((lsn == p_lsn) & ((seq >= p_seq) if inclusive else (seq > p_seq)))


def arrow_positions_after(
    lsn: Any, seq: Any, position: ChangePosition | tuple[Any, Any], inclusive: bool = False
) -> Any:
    """Arrow: which of the changes at (``lsn``, ``seq``) come after ``position`` (or are it), as
    :func:`positions_after`; NULL where a position is NULL."""
    import pyarrow.compute as pc

    p_lsn, p_seq = position
    later_seq = pc.greater_equal(seq, p_seq) if inclusive else pc.greater(seq, p_seq)
    return pc.or_(pc.greater(lsn, p_lsn), pc.and_(pc.equal(lsn, p_lsn), later_seq))


def arrow_positions_at_or_before(lsn: Any, seq: Any, position: ChangePosition | tuple[Any, Any]) -> Any:
    """Arrow: which of the changes at (``lsn``, ``seq``) come before ``position`` or are it."""
    import pyarrow.compute as pc

    return pc.invert(arrow_positions_after(lsn, seq, position))


def position_before_sql(lsn_col: str, seq_col: str, position: SqlPosition, inclusive: bool = True) -> str:
    """SQL predicate: the change comes before ``position`` (or is it, when ``inclusive``)."""
    lsn, seq = _sql_operands(position)
    op = "<=" if inclusive else "<"
    return f"({lsn_col} < {lsn} OR ({lsn_col} = {lsn} AND {seq_col} {op} {seq}))"
