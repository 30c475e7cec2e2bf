"""Prometheus metrics of follow mode (prometheus-client), served on ``--metrics-port``.

| metric | type | meaning |
|---|---|---|
| ``loader_changes_total{stage}`` | counter | changes captured / loaded into history / merged into current tables (increment rows) |
| ``loader_cycles_total{result}`` | counter | follow-mode cycles: ``work``, ``idle`` or ``error`` |
| ``loader_cycle_seconds`` | histogram | duration of a cycle that did work (load + merge) |
| ``loader_last_success_timestamp_seconds`` | gauge | when the last cycle ended without an error |
| ``loader_slot_lag_bytes`` | gauge | WAL between the source's current position and what the slot confirmed |
| ``loader_slot_retained_wal_bytes`` | gauge | WAL the server keeps for the slot: current position minus the lesser of restart_lsn and confirmed_flush_lsn (alert well below max_slot_wal_keep_size) |
| ``loader_slot_wal_status{status}`` | gauge | 1 for the slot's current ``wal_status`` (reserved, extended, unreserved, lost), 0 for the others |
| ``loader_heartbeat_age_seconds`` | gauge | since the loader's last heartbeat came back out of the slot (idle source: stays below the heartbeat interval plus a capture; stuck capture: grows) |
| ``loader_freshness_seconds{table}`` | gauge | now minus the commit time of the newest source transaction the table's current table reflects |
| ``loader_freshness_max_seconds`` | gauge | the largest of those (the stalest table) |
| ``loader_rejects_total`` | counter | changes quarantined in the rejects table |
| ``loader_parked_tables`` | gauge | tables whose current tables wait for a resync |
| ``loader_outages_total{server}`` | counter | steps (capture runs, cycles, maintenance) that met an outage of the ``source`` or ``catalog`` database and were retried |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.changes = Counter("loader_changes", "Changes per stage", ["stage"], registry=r)
        self.cycles = Counter("loader_cycles", "Follow-mode cycles by result", ["result"], registry=r)
        self.cycle_seconds = Histogram(
            "loader_cycle_seconds",
            "Duration of a cycle that did work",
            registry=r,
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
        )
        self.last_success = Gauge(
            "loader_last_success_timestamp_seconds", "End of the last cycle without error", registry=r
        )
        self.slot_lag = Gauge("loader_slot_lag_bytes", "WAL not yet confirmed by the slot", registry=r)
        self.freshness = Gauge(
            "loader_freshness_seconds",
            "Age of the newest source commit a current table reflects",
            ["table"],
            registry=r,
        )
        self.freshness_max = Gauge("loader_freshness_max_seconds", "The stalest table's freshness", registry=r)
        self.rejects = Counter("loader_rejects", "Changes quarantined in the rejects table", registry=r)
        self.parked = Gauge("loader_parked_tables", "Tables waiting for a resync", registry=r)
        self.slot_retained = Gauge(
            "loader_slot_retained_wal_bytes", "WAL the source keeps for the replication slot", registry=r
        )
        self.slot_wal_status = Gauge(
            "loader_slot_wal_status", "1 for the slot's current wal_status", ["status"], registry=r
        )
        self.heartbeat_age = Gauge(
            "loader_heartbeat_age_seconds", "Seconds since the last heartbeat came back out of the slot", registry=r
        )
        self._heartbeat_seen_at: float | None = None
        self.heartbeat_age.set_function(self._heartbeat_age)
        self.outages = Counter(
            "loader_outages", "Steps that met a source or catalog database outage (retried)", ["server"], registry=r
        )
        self._fresh_as_of: dict[str, float] = {}
        self.freshness_max.set_function(self._stalest)
        self.verify_differences = Gauge(
            "loader_verify_differences",
            "Keys that differed from the source at the table's last continuous verification (lag excluded)",
            ["table"],
            registry=r,
        )
        self.load_batches = Counter(
            "loader_load_batches",
            "Load batches by the engine that loaded them (driver or spark)",
            ["engine"],
            registry=r,
        )
        self.verify_rows = Counter("loader_verify_rows", "Source rows compared by continuous verification", registry=r)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def note_slot(self, retained_wal_bytes: int, wal_status: str | None) -> None:
        self.slot_retained.set(retained_wal_bytes)
        for status in WAL_STATUSES:
            self.slot_wal_status.labels(status=status).set(1 if status == wal_status else 0)

    def note_heartbeat(self, seen_at: float) -> None:
        """The last heartbeat came back at ``seen_at`` (epoch seconds)."""
        self._heartbeat_seen_at = seen_at

    def _heartbeat_age(self) -> float:
        return float("nan") if self._heartbeat_seen_at is None else time.time() - self._heartbeat_seen_at

    def table_fresh_as_of(self, table: str, commit_time: datetime) -> None:
        """The table reflects every source transaction committed up to ``commit_time``."""
        known = table in self._fresh_as_of
        self._fresh_as_of[table] = commit_time.timestamp()
        if not known:
            self.freshness.labels(table=table).set_function(self._age_of(table))

    def _age_of(self, table: str) -> Callable[[], float]:
        return lambda: time.time() - self._fresh_as_of[table]

    def _stalest(self) -> float:
        if not self._fresh_as_of:
            return 0.0
        return time.time() - min(self._fresh_as_of.values())
