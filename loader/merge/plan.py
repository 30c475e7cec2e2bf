"""What a merge of one table does, decided from values alone (no Spark): tested without a JVM.

Control rows in history decide how far a current table may go:
- ``truncate`` and ``resync`` are *boundaries*: current rows older than the last one that the
  increment does not rewrite are deleted (a resync is a consistent re-snapshot that replaces the
  table's state; keys missing from it are gone).
- ``park`` stops the table: its current table is merged up to just before the first park after
  the last resync, and no further, until a later resync arrives. A park can never be skipped
  over: the merged-through watermark stays strictly before it, so every later merge sees it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loader.lsn import ChangePosition


@dataclass(frozen=True, order=True)
class Marker:
    """A control row of a history increment."""

    position: ChangePosition
    op: str  # truncate / resync / park
    note: str = ""


@dataclass(frozen=True)
class MergePlan:
    cut: ChangePosition  # apply every change at or before this position
    boundary: ChangePosition | None  # last truncate/resync at or before cut
    parked: Marker | None  # the park that holds the table back (cut is just before it)
    resynced: bool  # a resync is among the applied markers

    @property
    def note(self) -> str:
        parts = []
        if self.resynced:
            parts.append("resynced")
        elif self.boundary is not None:
            parts.append(f"truncated at {self.boundary}")
        if self.parked is not None:
            parts.append(f"parked at {self.parked.position}: {self.parked.note}")
        return "; ".join(parts)


def plan_markers(markers: Sequence[Marker], cut: ChangePosition) -> MergePlan:
    """Apply the control rows of an increment (any order) to the requested ``cut``."""
    ordered = sorted(m for m in markers if m.position <= cut)
    last_resync = max((i for i, m in enumerate(ordered) if m.op == "resync"), default=-1)
    park = next((m for m in ordered[last_resync + 1 :] if m.op == "park"), None)
    if park is not None:
        cut = park.position.just_before()
    applied = [m for m in ordered if m.position <= cut]
    boundaries = [m for m in applied if m.op in ("truncate", "resync")]
    return MergePlan(
        cut=cut,
        boundary=boundaries[-1].position if boundaries else None,
        parked=park,
        resynced=any(m.op == "resync" for m in applied),
    )


@dataclass
class ToastPatch:
    """Values a key-changing update did not send, recovered from the old key's row."""

    position: tuple[int, int]
    values: dict[str, Any]
    columns: list[str] = field(default_factory=list)


def replay_key_changes(
    events: list[dict[str, Any]],
    state: dict[tuple[Any, ...], dict[str, Any] | None],
    pk: list[str],
    non_key: list[str],
) -> list[ToastPatch]:
    """Replay key events in commit order; patch what key-changing updates left unsent (TOAST).

    ``events``: dicts with the key and non-key columns, ``pg_lsn``, ``pg_seq``, ``kind``
    ('delete'/'upsert'), ``absent`` (columns not sent) and ``from`` (the old key of a key change,
    or None), sorted by position. ``state``: the current row of every involved key before the
    increment (updated in place). An update that moves a row to a new key and leaves a TOASTed
    value unchanged does not send it; the value is the one the old key's row had just before.
    """
    before_delete: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    patches: list[ToastPatch] = []
    for e in events:
        k = tuple(e[c] for c in pk)
        if e["kind"] == "delete":
            before_delete[k] = state.get(k)
            state[k] = None
            continue
        absent = set(e["absent"] or ())
        if e["from"] is not None:
            base = before_delete.get(tuple(e["from"])) or {}
            patched = sorted(c for c in absent if c in base)
        else:
            base = state.get(k) or {}
            patched = []
        row = {c: (base.get(c) if c in absent else e[c]) for c in non_key}
        state[k] = row
        if patched:
            patches.append(ToastPatch((e["pg_lsn"], e["pg_seq"]), row, patched))
    return patches


@dataclass(frozen=True)
class CompactionPlan:
    """What a merge's compaction of its current table rewrites (see :func:`plan_compaction`)."""

    full: bool  # every data file with deletes, the deletes applied (else: small files only)
    small_file_bytes: int  # data files below this size are combined (when not full)
    reason: str


def plan_compaction(
    summary: dict[str, str], buckets: int, deleted_ratio: float, target_file_bytes: int
) -> CompactionPlan:
    """The compaction a current table's merge runs every ``merge.compact_every`` merges, decided
    from its current snapshot's ``summary`` totals.

    A full rewrite (every data file that has deletes, rewritten with them applied) costs the
    table's size: merges scatter their deletes over every bucket, so every file has some. It runs
    once the rows deleted reach ``deleted_ratio`` of the rows the data files hold (the share of
    dead rows a reader skips), so its cost, spread over the merges between two of them, follows
    the changes rather than the table. Between them a compaction combines the small data files
    the merges wrote (below a sixteenth of a bucket's share of the table, at least 1 MiB and at
    most three quarters of ``target_file_bytes``) and rewrites the delete files into one per
    bucket: its cost follows the changes since the last one. A snapshot without the totals, or
    ``deleted_ratio`` 0, gets the full rewrite."""
    try:
        records = int(summary["total-records"])
        deletes = int(summary["total-position-deletes"]) + int(summary.get("total-equality-deletes", "0"))
        size = int(summary["total-files-size"])
    except (KeyError, ValueError):
        return CompactionPlan(True, 0, "the snapshot carries no totals")
    if records <= 0 or deletes >= deleted_ratio * records:
        return CompactionPlan(True, 0, f"{deletes:,} of {records:,} rows deleted")
    small = min(max(size // (max(1, buckets) * 16), 1 << 20), max(1, int(target_file_bytes * 0.75)))
    return CompactionPlan(False, small, f"{deletes:,} of {records:,} rows deleted: small files only")
