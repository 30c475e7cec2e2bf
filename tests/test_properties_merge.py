"""Property: any change sequence, however batched, duplicated or delivered out of order, ends in the model.

Changes are written as landing files directly (no PostgreSQL), then loaded and merged by the real
Spark jobs. The model applies the same changes in commit order to a Python dict.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.capture.landing import LandingWriter, open_landing
from loader.capture.records import COMMIT, ChangeRecord, Column
from loader.config import LoaderSettings
from loader.load.history import HistoryLoad
from loader.merge.current import CurrentMerge
from loader.tables import SourceTable, TableNames

TABLE = SourceTable("public", "acct")
TS = "2024-05-01 10:00:00+00"


def lake_settings(base: LoaderSettings, root: Path) -> LoaderSettings:
    """Fresh landing dir and catalog namespaces on the shared test catalog (no source database)."""
    uid = uuid.uuid4().hex[:8]
    return base.model_copy(
        update={
            "source": base.source.model_copy(update={"slot": f"prop_{uid}"}),
            "landing": base.landing.model_copy(update={"url": (root / uid).as_uri()}),
            "catalog": base.catalog.model_copy(
                update={
                    "history_namespace": f"h_{uid}",
                    "current_namespace": f"c_{uid}",
                    "loader_namespace": f"l_{uid}",
                }
            ),
        }
    )


@dataclass
class Txn:
    commit_lsn: int
    changes: list[ChangeRecord] = field(default_factory=list)

    def records(self) -> list[ChangeRecord]:
        commit = ChangeRecord(
            op=COMMIT, commit_lsn=self.commit_lsn, seq=len(self.changes) + 1, xid=self.commit_lsn, ts=TS
        )
        return [*self.changes, commit]


def change(txn: Txn, op: str, cols: dict[str, Any] | None, old_id: int | None = None) -> None:
    """Append one change; ``cols`` maps name -> value, a missing 'a' on an update = unchanged TOAST."""
    types = {"id": "integer", "a": "text", "b": "bigint"}
    columns = [Column(n, types[n], None if v is None else str(v)) for n, v in (cols or {}).items()]
    identity = [Column("id", "integer", str(old_id))] if old_id is not None else []
    seq = len(txn.changes) + 1
    txn.changes.append(
        ChangeRecord(
            op=op,
            commit_lsn=txn.commit_lsn,
            seq=seq,
            xid=txn.commit_lsn,
            ts=TS,
            schema=TABLE.schema,
            table=TABLE.table,
            change_lsn=txn.commit_lsn - 100 + seq,
            columns=columns,
            identity=identity,
            pk=["id"],
        )
    )


def generate(
    rnd: random.Random, n_txns: int, keys: int = 4
) -> tuple[list[Txn], dict[int, tuple[str | None, int | None]]]:
    """Random transactions over a few keys, and the model state after applying them in order."""
    model: dict[int, tuple[str | None, int | None]] = {}
    txns = []
    for t in range(n_txns):
        txn = Txn(commit_lsn=0x1000 * (t + 1))
        for _ in range(rnd.randint(1, 3)):
            live = sorted(model)
            free = [k for k in range(1, keys + 1) if k not in model]
            kind = rnd.choice(["insert", "update", "update", "delete", "keychange"])
            if kind == "insert" or not live:
                if not free:
                    continue
                k = rnd.choice(free)
                a = rnd.choice([None, f"text-{rnd.randint(0, 99)}"])
                b = rnd.choice([None, rnd.randint(-5, 5)])
                change(txn, "I", {"id": k, "a": a, "b": b})
                model[k] = (a, b)
            elif kind == "delete":
                k = rnd.choice(live)
                change(txn, "D", None, old_id=k)
                del model[k]
            else:
                k = rnd.choice(live)
                new_k = rnd.choice(free) if kind == "keychange" and free else k
                a_old, _ = model.pop(k)
                b = rnd.choice([None, rnd.randint(-5, 5)])
                cols: dict[str, Any] = {"id": new_k, "b": b}
                if rnd.random() < 0.5:  # TOASTed value left unchanged: not sent
                    a = a_old
                else:
                    a = rnd.choice([None, f"upd-{rnd.randint(0, 99)}"])
                    cols["a"] = a
                change(txn, "U", cols, old_id=k)
                model[new_k] = (a, b)
        if txn.changes:
            txns.append(txn)
    return txns, model


def write_files(settings: LoaderSettings, txns: list[Txn], max_changes: int) -> list[str]:
    writer = LandingWriter(open_landing(settings), max_changes=max_changes)
    for txn in txns:
        for rec in txn.records():
            writer.write(rec)
    writer.close_file()
    return writer.published


def current_rows(spark: Any, settings: LoaderSettings) -> dict[int, tuple[str | None, int | None]]:
    rows = spark.table(TableNames(settings).current(TABLE)).collect()
    return {r["id"]: (r["a"], r["b"]) for r in rows}


def history_positions(spark: Any, settings: LoaderSettings) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in spark.table(TableNames(settings).history(TABLE)).select("pg_lsn", "pg_seq").collect()]


def load_and_merge(spark: Any, settings: LoaderSettings) -> None:
    HistoryLoad(spark, settings).run()
    CurrentMerge(spark, settings).run()


@settings(
    max_examples=int(os.environ.get("LOADER_PROPERTY_EXAMPLES", "5")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_txns=st.integers(2, 14),
    n_batches=st.integers(1, 3),
    max_changes=st.integers(1, 4),
)
def test_any_delivery_ends_in_the_model(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, seed: int, n_txns: int, n_batches: int, max_changes: int
) -> None:
    rnd = random.Random(seed)
    settings_ = lake_settings(base_settings, tmp_path)
    txns, model = generate(rnd, n_txns)
    cuts = sorted(rnd.sample(range(1, len(txns)), min(n_batches - 1, len(txns) - 1))) if len(txns) > 1 else []
    batches = [txns[i:j] for i, j in zip([0, *cuts], [*cuts, len(txns)])]
    held_back: list[Txn] = []
    for i, batch in enumerate(batches):
        to_write = list(batch)
        if i > 0 and rnd.random() < 0.5:
            # Redelivery: the previous batch's last transaction lands again in an overlapping file.
            to_write = [batches[i - 1][-1], *to_write]
        if held_back:
            # A file held back from the previous batch arrives late, after later ones were loaded.
            write_files(settings_, held_back, max_changes)
            held_back = []
        if len(to_write) > 1 and i < len(batches) - 1 and rnd.random() < 0.3:
            held_back = [to_write.pop(0)]
        # Several files per batch, published in a random order.
        parts: list[list[Txn]] = [[]]
        for txn in to_write:
            if parts[-1] and rnd.random() < 0.5:
                parts.append([])
            parts[-1].append(txn)
        rnd.shuffle(parts)
        for part in parts:
            if part:
                write_files(settings_, part, max_changes)
        load_and_merge(spark, settings_)
        if rnd.random() < 0.3:
            load_and_merge(spark, settings_)  # a repeated run changes nothing
    if held_back:
        write_files(settings_, held_back, max_changes)
        load_and_merge(spark, settings_)
    positions = history_positions(spark, settings_)
    assert len(positions) == len(set(positions)) == sum(len(t.changes) for t in txns), "history not exactly once"
    assert current_rows(spark, settings_) == model
