"""Names of the state objects kept in the landing area's ``_state/`` folder, beside the files they describe.

Each is a small JSON document written atomically through the store (``LandingStore.write_state``).
"""

from __future__ import annotations

from typing import Any

from loader.landing.store import LandingStore

# Name of the state object an unfinished snapshot leaves in the landing area (see snapshot.py).
SNAPSHOT_STATE = "snapshot.state.json"
# What the catalog looked like at the last run, and resyncs still to do (see loader.capture.watch).
CATALOG_STATE = "catalog.state.json"
# The last position this loader confirmed on the slot (written before each advance).
SLOT_STATE = "slot.state.json"
# What the source-side filter left out (skipped tables, for ``loader status``), the tables the
# pgoutput publication listed, and whether the "every table" notice was given for this slot.
SOURCE_STATE = "source.state.json"


def record_confirmed(store: LandingStore, slot: str, lsn: int) -> None:
    """Remember, before the slot moves, how far this loader confirms it (see slots.check_not_lost)."""
    store.write_state(SLOT_STATE, {"slot": slot, "confirmed": lsn})


# Tables to resync at the next capture run, asked for by another process (continuous verification
# with verify.auto_repair): {table: reason}. Capture moves them to its pending resyncs.
RESYNC_REQUESTS = "resync_requests.json"
# Continuous verification's rolling position and each table's last verdict (for status).
VERIFY_STATE = "verify.state.json"


def unfinished_snapshot(store: LandingStore) -> dict[str, Any] | None:
    """The snapshot state while a snapshot or resync is not done (copying, or interrupted), else None.
    Its ``position_lsn`` is the commit position of every one of its files."""
    state = store.read_state(SNAPSHOT_STATE)
    return state if state is not None and not state.get("done") else None


def request_resync(store: LandingStore, table: str, reason: str) -> None:
    """Ask the next capture run to resync ``table``."""
    requests = dict((store.read_state(RESYNC_REQUESTS) or {}).get("tables", {}))
    requests[table] = reason
    store.write_state(RESYNC_REQUESTS, {"tables": requests})


# How far landing retention has retired files: {"retired_through": position token}; replay refuses
# ranges that begin at or before it.
RETENTION_STATE = "retention.state.json"
