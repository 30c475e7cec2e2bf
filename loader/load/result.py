"""What a history load did (``loader load``'s summary, follow mode's and the tests' view): the files
it marked loaded, the changes appended per table, duplicates, rejects, parks, and which engine
loaded each batch. Apart from :mod:`loader.load.history` so that the stages a load runs
(:mod:`loader.load.staging`) can add to it without importing the load."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadResult:
    files: list[str] = field(default_factory=list)
    rows_per_table: dict[str, int] = field(default_factory=dict)
    duplicates_skipped: int = 0
    rejects: int = 0
    waiting_files: int = 0
    loaded_through: str | None = None
    # Tables parked by this load (or still parked): qualified name -> reason.
    parked: dict[str, str] = field(default_factory=dict)
    retired_columns: list[str] = field(default_factory=list)
    gap: str | None = None  # the batch stopped before a file whose transaction's beginning is missing
    erased_dropped: int = 0  # changes of erased subjects not loaded (see loader.erase)
    # Which engine loaded each batch, and why the Spark path when it was not the driver's.
    engines: list[str] = field(default_factory=list)

    def absorb(self, part: LoadResult) -> None:
        """Add one table's results (see each_table)."""
        self.rows_per_table.update(part.rows_per_table)
        self.duplicates_skipped += part.duplicates_skipped
        self.rejects += part.rejects
        self.parked.update(part.parked)
        self.retired_columns.extend(part.retired_columns)
        self.erased_dropped += part.erased_dropped
        self.engines.extend(part.engines)

    def summary(self) -> str:
        gap = f"\n  waiting: {self.gap}" if self.gap else ""
        if not self.files:
            waiting = (
                f" ({self.waiting_files} waiting: the rest of their transaction, or the next batch)"
                if self.waiting_files
                else ""
            )
            return "load: no new landing files" + waiting + gap
        per = ", ".join(f"{t}={n}" for t, n in sorted(self.rows_per_table.items()))
        text = (
            f"load: {len(self.files)} files, {sum(self.rows_per_table.values())} changes appended ({per}); "
            f"{self.duplicates_skipped} duplicates skipped; {self.rejects} rejected"
        )
        if self.engines:
            text += "\n  engine: " + "; ".join(self.engines)
        for col in self.retired_columns:
            text += f"\n  note: {col}"
        for table, reason in sorted(self.parked.items()):
            text += f"\n  parked: {table}: {reason}"
        return text + gap
