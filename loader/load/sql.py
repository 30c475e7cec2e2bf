"""The history load's column vocabulary and the SQL of its rejects.

The load kernel (``loader.load.kernel``) turns change rows into history rows: the source columns
under their lake names, the metadata columns, and three internal columns the load drops before
writing: ``pg__line``, ``pg__reason`` (why a value does not fit, '' if all fit) and ``pg__raw``.
Inside the lake everything speaks lake names: the columns, and the names held in metadata
(pg_old_key's keys, pg_absent_columns); source names appear only in landing records.
"""

from __future__ import annotations

from dataclasses import dataclass

from loader.lake.types import sql_string
from loader.names import internal, lake_column

LINE, REASON, RAW = internal("line"), internal("reason"), internal("raw")


@dataclass(frozen=True)
class HistoryColumn:
    """A source column as the history table stores it."""

    source: str
    pg_type: str

    @property
    def lake(self) -> str:
        return lake_column(self.source)


def rejects_select(qualified: str) -> list[str]:
    """Typed rows whose values did not fit -> rows of the rejects table (without rejected_at)."""
    return [
        "pg_landing_file AS landing_file",
        f"{LINE} AS line",
        f"{sql_string(qualified)} AS source_table",
        "pg_lsn",
        "pg_seq",
        f"{REASON} AS reason",
        f"{RAW} AS raw",
    ]
