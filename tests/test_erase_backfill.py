"""Erasure of a data subject (a byte search of every file shows it gone), LSN-range replays, and
rebuilds as of an LSN or a time, each ending with the source oracle."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from loader.backfill import Backfill, parse_time
from loader.erase import Erasure
from loader.lake.iceberg import watermark
from loader.lake.tables import SUMMARY_LOADED_THROUGH, SourceTable
from loader.landing.store import open_landing
from loader.load.decode import gunzip_salvage
from loader.lsn import ChangePosition
from loader.merge.current import CurrentMerge
from loader.verify import normalize
from tests.harness import Env
from tests.oracle import assert_no_duplicate_positions

ACCOUNTS = '"crm.v2".accounts'  # a schema with a dot in its name
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"


def files_holding(root: Path, needle: str) -> list[str]:
    """Every file under ``root`` whose bytes, decoded as their format stores them, contain ``needle``."""
    import fastavro
    import pyarrow.parquet as pq

    from loader.verify import _lake_rows

    raw = needle.encode()
    found = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        texts = [data]
        try:
            if p.name.endswith(".gz"):
                texts.append(gunzip_salvage(data)[0])
            elif p.name.endswith((".arrows", ".changes.arrow", ".tables.arrow")):  # landing v2, v3: as v1 lines
                texts.append(_arrow_landing_text(p.name, data))
            elif p.suffix == ".parquet":
                # Dates and timestamps as their integers: the session's other tables hold values
                # Python's datetime cannot (infinity, BC), and the needle is text anyway.
                texts.append(repr(_lake_rows(pq.read_table(p))).encode())
            elif p.suffix == ".avro":
                with open(p, "rb") as f:
                    texts.append(repr(list(fastavro.reader(f))).encode())
        except (OSError, ValueError):
            # The warehouse is shared by the session's tests, and crash tests leave torn files: a
            # 0-byte Parquet file a killed writer created holds nothing to find. A torn file with
            # content could hide the needle in pages that cannot be read: that fails the test.
            if data:
                raise
        if any(raw in t for t in texts):
            found.append(str(p.relative_to(root)))
    return found


def _arrow_landing_text(name: str, data: bytes) -> bytes:
    """A landing v2 or v3 file's readable records as the v1 lines they stand for."""
    from loader.landing import arrowfile, changefile, tablefile

    if name.endswith(".tables.arrow"):
        records = list(tablefile.readable_records(tablefile.salvage(data)))
    elif name.endswith(".changes.arrow"):
        got = changefile.salvage(data)
        records = [r for b in got.batches for r in changefile.batch_records(b)]
    else:
        snap = arrowfile.salvage(data)
        records = list(arrowfile.row_records(snap.header, snap.batches)) if snap.header is not None else []
    return "\n".join(r.to_json() for r in records).encode()


def lake_roots(env: Env) -> list[Path]:
    return [Path(env.settings.catalog.warehouse.removeprefix("file://")), env.tmp / "landing"]


@pytest.mark.parametrize("stream_format", ["arrow", "tables"])
def test_erase_a_subject_from_every_file_and_keep_it_erased(env: Env, stream_format: str) -> None:
    """The accounts table's schema has a dot in its name: the subject's column reference
    ``crm.v2.accounts.customer_id`` names it by the lake's tables, not by its first dot. The change
    stream lands as landing v2 or v3: either is scrubbed in place."""
    from loader.dbt import invoke_dbt

    env.configure("source", stream_format=stream_format)
    token = uuid.uuid4().hex
    email, bio = f"erase-me-{token}@example.org", f"BIO{token}"
    env.configure(
        "dbt",
        subject_columns={"customer": ["public.customers.customer_id", "crm.v2.accounts.customer_id"]},
        analytics_namespace=f"a_{env.uid}",
    )
    env.sql("CREATE TABLE public.customers (customer_id int PRIMARY KEY, email text, bio text)")
    env.sql('CREATE SCHEMA "crm.v2"')
    env.sql('CREATE TABLE "crm.v2".accounts (account_id int PRIMARY KEY, customer_id int, note text)')
    env.sql(f"ALTER TABLE {ACCOUNTS} REPLICA IDENTITY FULL")
    env.capture()
    env.sql(f"INSERT INTO public.customers SELECT g, 'c' || g || '@example.org', {BIG} FROM generate_series(1, 5) g")
    env.sql(f"UPDATE public.customers SET email = '{email}', bio = '{bio}' || {BIG} WHERE customer_id = 3")
    env.sql(f"INSERT INTO {ACCOUNTS} SELECT g, 1 + g % 5, 'note ' || g FROM generate_series(10, 19) g")
    env.sql(f"UPDATE {ACCOUNTS} SET note = 'for {email}' WHERE customer_id = 3")
    env.sql("UPDATE public.customers SET email = email || '.v2' WHERE customer_id = 3")  # bio unchanged: TOAST not sent
    env.sql(f"UPDATE {ACCOUNTS} SET note = 'moved on' WHERE customer_id = 3")  # FULL: the old row holds the email
    env.run_all()
    first = ChangePosition.from_token(watermark(env.spark, env.names.ledger, SUMMARY_LOADED_THROUGH)).commit_lsn  # type: ignore[arg-type]
    res = invoke_dbt(env.settings, ["build", "--exclude", "test_type:data"])
    assert res.success, res
    # The erasure request: the subject is deleted at the source, then from the lake.
    env.sql(f"DELETE FROM {ACCOUNTS} WHERE customer_id = 3")
    env.sql("DELETE FROM public.customers WHERE customer_id = 3")
    env.run_all()
    last = ChangePosition.from_token(watermark(env.spark, env.names.ledger, SUMMARY_LOADED_THROUGH)).commit_lsn  # type: ignore[arg-type]
    for needle in (email, bio):
        assert any(files_holding(root, needle) for root in lake_roots(env)), f"{needle} must be in the lake before"
    keep = env.tmp / "unscrubbed"
    shutil.copytree(env.tmp / "landing", keep)  # an old copy of the landing area, for the replay below

    dry = Erasure(env.spark, env.settings).run("customer=3", None, None, dry_run=True)
    assert dry.rows["history public.customers"] >= 4 and dry.landing_records > 0
    report = Erasure(env.spark, env.settings).run("customer=3", None, None)
    assert report.rows == dry.rows and report.landing_records == dry.landing_records
    for needle in (email, bio):
        for root in lake_roots(env):
            assert files_holding(root, needle) == [], f"{needle} still in {root}"
    env.assert_reconciled()  # every other subject intact, row for row
    assert_no_duplicate_positions(env)
    log = env.spark.table(Erasure(env.spark, env.settings).erasures).collect()
    # The log names the subject only by its salted SHA-256, never by the value "3".
    assert len(log) == 1 and log[0]["subject_type"] == "customer"
    assert re.fullmatch(r"[0-9a-f]{64}", log[0]["subject_hash"]), log[0]["subject_hash"]
    res = invoke_dbt(env.settings, ["test", "--select", "test_name:loader_erased_subjects_absent"])
    assert res.success, "the compliance audit passes"

    # A replay of the old range, with the unscrubbed old landing files back, does not resurrect it.
    for f in (keep / env.settings.source.slot).glob("*_?.*"):
        shutil.copy(f, env.tmp / "landing" / env.settings.source.slot / f.name)
    replay = Backfill(env.spark, env.settings).replay(first - 1, last)
    assert not replay.appended, replay.summary()
    for table in ("public.customers", "crm.v2.accounts"):
        hist = env.history(table)
        assert hist.where("customer_id = 3").count() == 0
        assert hist.where('pg_old_key LIKE \'%"customer_id":"3"%\'').count() == 0
    env.assert_reconciled()


def test_status_counts_rows_exactly_after_an_erasure(env: Env) -> None:
    """Row counts in status after erase (issue 26 point 3): exact, as a scan counts them; the
    erasure's rewrite leaves no delete file behind (before, the deletes it applied stayed, dangling)."""
    from click.testing import CliRunner

    from loader.cli import main
    from tests.harness import cli_env

    env.configure("merge", compact_every=0)  # the merge-on-read deletes stay until the erasure
    env.sql("CREATE TABLE public.orders (id int PRIMARY KEY, customer int, v text)")
    env.capture()
    env.sql("INSERT INTO public.orders SELECT g, g % 7, 'v' || g FROM generate_series(1, 300) g")
    env.run_all()
    env.sql("UPDATE public.orders SET v = 'w' WHERE id % 5 = 0")
    env.sql("DELETE FROM public.orders WHERE id % 11 = 0")  # merge-on-read deletes in the current table
    env.run_all()
    # Beyond what it may read of delete files, the count is the summary's, and says it is an estimate.
    from loader.lake.catalog import RowCount, live_rows, open_catalog

    c = env.settings.catalog
    cur = open_catalog(env.settings).load_table((c.current_namespace, SourceTable("public", "orders").iceberg_name))
    assert live_rows(cur) == RowCount(env.current("public.orders").count(), True)
    assert not live_rows(cur, max_delete_bytes=0).exact
    deletes_before = int(cur.current_snapshot().summary["total-delete-files"])  # type: ignore[union-attr]
    Erasure(env.spark, env.settings).run(None, "public.orders", "customer=3")
    # Every data file held a row of customer 3: all were rewritten, and the deletes they had went.
    cur = open_catalog(env.settings).load_table((c.current_namespace, SourceTable("public", "orders").iceberg_name))
    deletes_after = int(cur.current_snapshot().summary["total-delete-files"])  # type: ignore[union-attr]
    assert deletes_before > 0 and deletes_after == 0, (deletes_before, deletes_after)
    st = json.loads(CliRunner().invoke(main, ["status", "--json"], env=cli_env(env)).output)
    (t,) = [t for t in st["tables"] if t["table"] == "public.orders"]
    scanned = (env.history("public.orders").count(), env.current("public.orders").count())
    assert (t["history_rows"], t["current_rows"]) == scanned, (t, scanned)
    assert not t["rows_estimated"], t


def test_erasure_takes_rejects_of_no_table_matches_the_value_literally_and_fails_on_a_damaged_file(
    env: Env,
) -> None:
    """Rejects too damaged to name their table go when their raw text holds the subject; a value
    holding LIKE's wildcards (``a_1%``) takes nothing of another subject (``ab1x``); a landing file
    the erasure cannot read makes it fail, naming the file, instead of reporting success."""
    import gzip
    import json

    from click.testing import CliRunner

    from loader.cli import main
    from loader.errors import ErasureIncompleteError, TerminalError
    from loader.landing.records import FileHeader
    from loader.landing.store import LandingFile
    from tests.harness import cli_env

    subjects = {"customer": ["public.customers.customer_id"]}
    env.configure("dbt", subject_columns=subjects, analytics_namespace=f"a_{env.uid}")
    env.sql("CREATE TABLE public.customers (customer_id text PRIMARY KEY, email text)")
    env.capture()
    env.sql("INSERT INTO public.customers VALUES ('a_1%', 'mine@example.org'), ('ab1x', 'other@example.org')")
    env.run_all()
    store = open_landing(env.settings)
    base = store.landed_position()
    assert base is not None
    lsn = base.commit_lsn + 1

    def line(seq: int, columns: list[list[str]]) -> bytes:
        doc = {"v": 1, "op": "I", "lsn": lsn, "seq": seq, "xid": 7, "ts": "2026-01-01 00:00:00+00"}
        doc |= {"change_lsn": 1, "schema": "public", "table": "customers", "columns": columns, "pk": ["customer_id"]}
        return json.dumps(doc).encode()

    cut = [line(1, [["customer_id", "text", "a_1%"]])[:-5], line(2, [["customer_id", "text", "ab1x"]])[:-5]]
    twice = line(3, [["customer_id", "text", "ab1x"], ["customer_id", "text", "ab1x"]])  # rejected, table known
    commit = json.dumps({"v": 1, "op": "C", "lsn": lsn, "seq": 4, "xid": 7, "ts": "2026-01-01 00:00:00+00"})
    body = b"\n".join([*cut, twice, commit.encode()]) + b"\n"
    header = FileHeader({"public.customers": 3}).to_json().encode() + b"\n"
    hostile = LandingFile.name_for(ChangePosition(lsn, 1), ChangePosition(lsn, 4), True)
    spool = env.tmp / "hostile.gz"
    spool.write_bytes(gzip.compress(header) + gzip.compress(body))
    store.publish(spool, hostile)
    env.load()
    rejects = env.spark.table(env.names.rejects).select("source_table", "raw").collect()
    assert sorted(r["source_table"] or "" for r in rejects) == ["", "", "public.customers"], rejects

    report = Erasure(env.spark, env.settings).run("customer=a_1%", None, None)
    left = env.spark.table(env.names.rejects).select("raw").collect()
    assert len(left) == 2 and all('"ab1x"' in r["raw"] and '"a_1%"' not in r["raw"] for r in left), left
    assert report.rows["rejects public.customers"] == 1 and report.unreadable == [], report.summary()
    hist = env.history("public.customers")
    assert hist.where("customer_id = 'a_1%'").count() == 0 and hist.where("customer_id = 'ab1x'").count() == 1
    landing = env.tmp / "landing"
    assert files_holding(landing, '"a_1%"') == [] and files_holding(landing, "mine@example.org") == []
    assert len(files_holding(landing, '"ab1x"')) == 2, "the hostile file keeps the other subject's lines"

    # the file holding the other subject is damaged: the erasure does everything else, then fails naming it
    damaged = store.path / hostile  # type: ignore[attr-defined]
    damaged.write_bytes(damaged.read_bytes()[:-40])
    with pytest.raises(ErasureIncompleteError) as failed:
        Erasure(env.spark, env.settings).run("customer=ab1x", None, None, dry_run=True)
    assert isinstance(failed.value, TerminalError) and hostile in str(failed.value)
    out = CliRunner().invoke(
        main,
        ["erase", "--subject", "customer=ab1x"],
        env=cli_env(env, LOADER_DBT__SUBJECT_COLUMNS=json.dumps(subjects)),
    )
    assert out.exit_code == 1 and hostile in out.output and "erasure incomplete" in out.output, out.output
    assert env.history("public.customers").where("customer_id = 'ab1x'").count() == 0, "the rest was erased"


def test_replay_a_range_exactly_once(env: Env) -> None:
    env.configure("source", max_changes_per_file=20)
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v int)")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, 0 FROM generate_series(1, 30) g")
    env.run_all()
    store = open_landing(env.settings)
    before = {f.name for f in store.files()}
    env.sql("UPDATE public.t SET v = 1 WHERE id <= 10")
    env.sql("DELETE FROM public.t WHERE id = 30")
    env.run_all()
    new = [f for f in store.files() if f.name not in before]
    # The range's changes go missing from history (a restore from an old backup, say)...
    hist = env.names.history(SourceTable("public", "t"))
    lo, hi = new[0].first.commit_lsn, new[-1].last.commit_lsn
    env.spark.sql(f"DELETE FROM {hist} WHERE pg_lsn BETWEEN {lo} AND {hi}")
    # ... and come back by a replay of that range, exactly once.
    dry = Backfill(env.spark, env.settings).replay(lo, hi, dry_run=True)
    assert dry.changes_in_range.get("public.t", 0) == 11
    res = Backfill(env.spark, env.settings).replay(lo, hi)
    assert res.appended == {"public.t": 11} and res.rebuilt == ["public.t"]
    env.assert_reconciled()
    again = Backfill(env.spark, env.settings).replay(lo, hi, tables=["public.t"])
    assert again.appended == {} and again.already_in_history == 11
    assert_no_duplicate_positions(env)
    env.assert_reconciled()


def source_rows(env: Env) -> list[tuple[Any, ...]]:
    return sorted((r[0], normalize(r[1])) for r in env.sql("SELECT id, v FROM public.t"))


def current_rows(env: Env) -> list[tuple[Any, ...]]:
    return sorted((r["id"], normalize(r["v"])) for r in env.current("public.t").collect())


def test_rebuild_current_as_of_an_lsn_and_a_time(env: Env) -> None:
    env.sql("CREATE TABLE public.t (id int PRIMARY KEY, v numeric(10,2))")
    env.capture()
    env.sql("INSERT INTO public.t SELECT g, g FROM generate_series(1, 20) g")
    env.sql("UPDATE public.t SET v = v * 2 WHERE id % 3 = 0")
    env.run_all()
    then = source_rows(env)  # the source state at the loaded position
    at = ChangePosition.from_token(watermark(env.spark, env.names.ledger, SUMMARY_LOADED_THROUGH))  # type: ignore[arg-type]
    then_ts = env.history("public.t").agg({"pg_txn_timestamp": "max"}).collect()[0][0]
    env.sql("DELETE FROM public.t WHERE id > 15")
    env.sql("UPDATE public.t SET v = 0 WHERE id = 1")
    env.sql("INSERT INTO public.t VALUES (100, 1)")
    env.run_all()
    env.assert_reconciled()
    CurrentMerge(env.spark, env.settings).rebuild("public.t", ChangePosition.end_of(at.commit_lsn))
    assert current_rows(env) == then
    pos = Backfill(env.spark, env.settings).position_at(
        "public.t", parse_time(then_ts.strftime("%Y-%m-%d %H:%M:%S.%f+00"))
    )
    assert pos == ChangePosition.end_of(at.commit_lsn)
    CurrentMerge(env.spark, env.settings).rebuild("public.t", pos)
    assert current_rows(env) == then
    CurrentMerge(env.spark, env.settings).rebuild("public.t")  # back to everything loaded
    env.assert_reconciled()
