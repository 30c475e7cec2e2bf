"""One Spark job over a decoded batch: everything the load must know before it writes.

A batch's changes are grouped by (landing file, table, kind of change, column layout). The groups
are few (a table's changes share one layout until its DDL changes), and from them the driver
reads, without another job: the tables in the batch with their columns and key, the columns
dropped at the source, the ledger's per-file counts, the newest commit time, and whether anything
was rejected or a file lost changes of unknown tables. Only then, and only if so, do the rarer
paths (rejects, parks for damage) run their own jobs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loader.lake.tables import SourceTable
from loader.lake.types import never_toasted
from loader.lsn import ChangePosition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Kinds of change, as the dropped-column evidence needs them.
ROW, UPDATE, PARK, OTHER = "row", "update", "park", "other"


@dataclass(frozen=True)
class Shape:
    """The accepted changes of one table in one landing file that share a kind and a column layout."""

    landing_file: str
    table: SourceTable | None
    kind: str
    col_names: tuple[str, ...]
    col_types: tuple[str | None, ...]
    changes: int = 0
    rejects: int = 0
    first: ChangePosition | None = None
    last: ChangePosition | None = None
    newest: tuple[int, int, str] | None = None  # (commit LSN, seq, commit time) of the newest dated change
    pk: tuple[str, ...] | None = None
    pk_at: ChangePosition | None = None
    # A delete's old key (names and PostgreSQL types), which types a key column no change of the
    # batch sent a value of (only deletes seen yet); empty for other kinds.
    key_names: tuple[str, ...] = ()
    key_types: tuple[str, ...] = ()


@dataclass
class BatchSurvey:
    shapes: list[Shape] = field(default_factory=list)

    @property
    def rejects(self) -> int:
        return sum(s.rejects for s in self.shapes)

    @property
    def damaged_unknown(self) -> bool:
        """A file lost changes whose table is unknown (a park row without a table)."""
        return any(s.table is None and s.kind == PARK and s.changes for s in self.shapes)

    def file_counts(self) -> dict[str, tuple[int, int]]:
        """landing file -> (accepted changes, rejected changes)."""
        out: dict[str, tuple[int, int]] = {}
        for s in self.shapes:
            c, r = out.get(s.landing_file, (0, 0))
            out[s.landing_file] = (c + s.changes, r + s.rejects)
        return out

    def newest_ts(self) -> str | None:
        """Commit time of the newest accepted change that has one (the load's freshness mark)."""
        newest = max((s.newest for s in self.shapes if s.newest is not None), default=None)
        return str(newest[2]) if newest is not None else None

    def tables(self) -> dict[SourceTable, tuple[list[tuple[str, str]], list[str]]]:
        """table -> ([(column, pg type)] in source order, key), for every table with accepted changes.

        A column's place is the first it had; its type the one of its newest change (a column
        retyped inside the batch takes its newest type). The key is the newest one sent. A key
        column that no change sent a value of (a table whose changes so far are deletes) is typed
        by the deletes' old keys, after the other columns.
        """
        out: dict[SourceTable, tuple[list[tuple[str, str]], list[str]]] = {}
        for table, shapes in self._by_table().items():
            place: dict[str, int] = {}
            typed: dict[str, tuple[ChangePosition, str | None]] = {}
            for s in shapes:
                for i, (name, pg_type) in enumerate(itertools.zip_longest(s.col_names, s.col_types)):
                    if name is None:
                        continue
                    place[name] = min(place.get(name, i), i)
                    if s.last is not None and (name not in typed or s.last > typed[name][0]):
                        typed[name] = (s.last, pg_type)
                    elif name not in typed:
                        typed[name] = (ChangePosition(-1, -1), pg_type)
            keyed = [s for s in shapes if s.pk is not None and s.pk_at is not None]
            pk = list(max(keyed, key=lambda s: s.pk_at or ChangePosition(-1, -1)).pk or ()) if keyed else []
            columns = sorted(place, key=lambda n: (place[n], n))
            typed_columns = [(n, typed[n][1] or "") for n in columns]
            for k in pk:
                if k not in place:
                    old_keys = [s for s in shapes if k in s.key_names and s.last is not None]
                    if old_keys:
                        newest = max(old_keys, key=lambda s: s.last or ChangePosition(-1, -1))
                        typed_columns.append((k, newest.key_types[newest.key_names.index(k)]))
            out[table] = (typed_columns, pk)
        return out

    def dropped_columns(
        self, table: SourceTable, known: dict[str, ChangePosition], columns: list[tuple[str, str]]
    ) -> tuple[dict[str, ChangePosition], bool]:
        """Columns dropped at the source with the position the drop was first seen, and whether
        ``known`` changed.

        wal2json sends every column of an insert, and every fixed-length column of an update;
        only varlena values left unchanged in TOAST storage are omitted from updates. So a column
        missing from an insert (or a fixed-length one missing from an update) no longer exists. A
        column seen again after its drop (re-added under the same name) is live again.
        """
        shapes = self._by_table().get(table, [])
        known = dict(known)
        changed = False
        for name, pg_type in columns:
            evidence = {ROW, UPDATE} if never_toasted(pg_type) else {ROW}
            gone_at = min(
                (s.first for s in shapes if s.first is not None and s.kind in evidence and name not in s.col_names),
                default=None,
            )
            seen_at = max((s.last for s in shapes if s.last is not None and name in s.col_names), default=None)
            if name in known and seen_at is not None and seen_at > known[name]:
                del known[name]
                changed = True
            if gone_at is not None and name not in known and (seen_at is None or seen_at < gone_at):
                known[name] = gone_at
                changed = True
        return known, changed

    def _by_table(self) -> dict[SourceTable, list[Shape]]:
        out: dict[SourceTable, list[Shape]] = {}
        for s in self.shapes:
            if s.table is not None and s.changes:
                out.setdefault(s.table, []).append(s)
        return out


def survey(decoded: DataFrame) -> BatchSurvey:
    """Run the one job over ``decoded`` (the decoder's rows, rejects included)."""
    from pyspark.sql import functions as F

    good = F.col("reject_reason").isNull()
    placed = good & F.col("commit_lsn").isNotNull() & F.col("seq").isNotNull()
    pos = F.struct("commit_lsn", "seq")
    dated = placed & F.col("ts").isNotNull() & (F.col("ts") != "")
    keyed = placed & (F.size("pk") > 0)
    op = F.col("op")
    kind = F.when(op.isin("insert", "read"), ROW).when(op == "update", UPDATE).when(op == "park", PARK).otherwise(OTHER)
    deleted = good & (op == "delete")
    rows = (
        decoded.groupBy(
            "landing_file",
            F.when(good, F.col("src_schema")).alias("src_schema"),
            F.when(good, F.col("src_table")).alias("src_table"),
            kind.alias("kind"),
            F.when(good, F.col("col_names")).alias("col_names"),
            F.when(good, F.col("col_types")).alias("col_types"),
            F.when(deleted, F.col("key_names")).alias("key_names"),
            F.when(deleted, F.col("key_types")).alias("key_types"),
        )
        .agg(
            F.count(F.when(good, 1)).alias("changes"),
            F.count(F.when(~good, 1)).alias("rejects"),
            F.min(F.when(placed, pos)).alias("first"),
            F.max(F.when(placed, pos)).alias("last"),
            F.max(F.when(dated, F.struct("commit_lsn", "seq", "ts"))).alias("newest"),
            F.max_by(F.when(keyed, F.col("pk")), F.when(keyed, pos)).alias("pk"),
            F.max(F.when(keyed, pos)).alias("pk_at"),
        )
        .collect()
    )
    return BatchSurvey([_shape(r) for r in rows])


def _shape(r: Any) -> Shape:
    def position(v: Any) -> ChangePosition | None:
        return ChangePosition(int(v[0]), int(v[1])) if v is not None else None

    table = SourceTable(r.src_schema, r.src_table) if r.src_table is not None and r.changes else None
    return Shape(
        landing_file=r.landing_file,
        table=table,
        kind=r.kind,
        col_names=tuple(r.col_names or ()),
        col_types=tuple(r.col_types or ()),
        changes=int(r.changes),
        rejects=int(r.rejects),
        first=position(r.first),
        last=position(r.last),
        newest=(int(r.newest[0]), int(r.newest[1]), str(r.newest[2])) if r.newest is not None else None,
        pk=tuple(r.pk) if r.pk is not None else None,
        pk_at=position(r.pk_at),
        key_names=tuple(r.key_names or ()),
        key_types=tuple(r.key_types or ()),
    )
