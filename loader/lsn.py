"""PostgreSQL log sequence numbers and the change ordering key.

A change's place in commit order is ``(commit_lsn, seq)``: the LSN of its transaction's commit
record and its position inside that transaction. No two changes share it, and sorting by it
restores exact commit order across tables.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def parse_lsn(text: str) -> int:
    """'16/B374D848' -> integer byte position in the WAL."""
    m = _LSN_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def format_lsn(value: int) -> str:
    """Integer WAL position -> PostgreSQL's 'X/X' text form."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"LSN out of range: {value}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class ChangePosition(NamedTuple):
    """Total order of changes: commit LSN, then position within the transaction."""

    commit_lsn: int
    seq: int

    def token(self) -> str:
        """Fixed-width text that sorts like the position (used in landing file names)."""
        return f"{self.commit_lsn:016X}.{self.seq:010d}"

    @classmethod
    def from_token(cls, token: str) -> "ChangePosition":
        lsn_hex, seq = token.split(".")
        return cls(int(lsn_hex, 16), int(seq))

    def __str__(self) -> str:
        return f"{format_lsn(self.commit_lsn)}#{self.seq}"
