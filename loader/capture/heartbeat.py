"""The heartbeat: a transactional logical message the loader sends through its own slot.

Why: the slot is confirmed only at positions decoding reached. A loader that confirms only the
changes it received never moves the slot while its tables are quiet (or filtered at the source)
and the rest of the cluster writes: the server then keeps every byte of WAL written since. Each
capture run therefore first emits ``pg_logical_emit_message(true, PREFIX, {slot, seq, time})`` in
the source database; decoding returns it as a transaction of its own (begin, message, commit),
and once every change before it is in published landing files the run confirms the slot to the
end of that transaction, like any other commit.

Safe: the heartbeat is a committed transaction, so confirming its end is what capture already
does for every commit. A transaction still open when the heartbeat commits commits later, past the
confirmed position, and is decoded whole by the next run (the slot's restart point keeps its start).

Freshness: the message carries the time it was emitted; capture notes when it came back out of
the slot (``_state/heartbeat.state.json``), so ``loader status`` tells an idle source (heartbeats
come back) from a stuck capture (they stop coming back).

Rights: ``pg_logical_emit_message`` is executable by PUBLIC by default. Where an administrator
revoked it (or the session is read-only), capture warns once and confirms only what it receives,
as before. No heartbeat-less confirm past the last received commit is attempted: a peek's ``upto``
bound is not a position decoding is known to have reached (the flush position may lag it, and a
commit record straddling it would be skipped by the next decoding).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from loader.lsn import parse_lsn

log = logging.getLogger("loader.capture")

PREFIX = "lakehouse-loader.heartbeat"
# The last heartbeat emitted and the last seen coming back, per slot (landing area _state/).
HEARTBEAT_STATE = "heartbeat.state.json"


@dataclass
class Seen:
    """A heartbeat that came back out of the slot, in a committed transaction ending at ``end_lsn``."""

    slot: str
    seq: int
    emitted_at: float  # epoch seconds, the emitting loader's clock
    lsn: int  # where the message is in the WAL
    end_lsn: int  # the end of its transaction: where the slot may be confirmed to


def content(slot: str, seq: int, when: float | None = None) -> str:
    return json.dumps({"slot": slot, "seq": seq, "time": time.time() if when is None else when}, sort_keys=True)


def parse(prefix: Any, text: Any, lsn: int) -> Seen | None:
    """A heartbeat message of any loader (None: another prefix, or a body that is not one)."""
    if prefix != PREFIX:
        return None
    try:
        doc = json.loads(text if isinstance(text, str) else bytes(text).decode("utf-8"))
        return Seen(str(doc["slot"]), int(doc["seq"]), float(doc["time"]), lsn, 0)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


class Refused(Exception):
    """The source would not take the heartbeat (no EXECUTE right, a read-only session or standby)."""


def emit(conn: psycopg.Connection, slot: str, seq: int) -> int:
    """Emit heartbeat ``seq`` of ``slot`` in its own transaction; the message's LSN."""
    try:
        row = conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)::text", (PREFIX, content(slot, seq))
        ).fetchone()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
        raise Refused(str(exc).strip()) from exc
    assert row is not None
    return parse_lsn(row[0])


def read_state(store: Any, slot: str) -> dict[str, Any]:
    doc = store.read_state(HEARTBEAT_STATE) or {}
    return doc if doc.get("slot") == slot else {"slot": slot}


def note(store: Any, slot: str, emitted: tuple[int, int, float] | None, seen: Seen | None) -> dict[str, Any]:
    """At the end of a run, in one state write: the heartbeat it emitted (seq, LSN, when), and the newest
    one that came back and that the slot is now confirmed past (when, and how long that took)."""
    state = read_state(store, slot)
    now = time.time()
    if emitted is not None:
        state.update({"emitted_seq": emitted[0], "emitted_lsn": emitted[1], "emitted_at": emitted[2]})
    if seen is not None:
        state.update(
            {
                "seen_seq": seen.seq,
                "seen_emitted_at": seen.emitted_at,
                "seen_at": now,
                "seen_lag_s": max(0.0, now - seen.emitted_at),
                "seen_lsn": seen.lsn,
            }
        )
    store.write_state(HEARTBEAT_STATE, state)
    return state


def describe(state: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """What ``status`` shows: the age of the last heartbeat seen and its lag."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {"seen_age_s": None, "lag_s": None, "emitted_age_s": None}
    if "seen_at" in state:
        out["seen_age_s"] = round(max(0.0, now - float(state["seen_at"])), 1)
        out["lag_s"] = round(float(state.get("seen_lag_s", 0.0)), 3)
    if "emitted_at" in state:
        out["emitted_age_s"] = round(max(0.0, now - float(state["emitted_at"])), 1)
    return out
