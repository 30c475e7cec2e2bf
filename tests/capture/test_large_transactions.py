"""One 200,000-row transaction: captured without holding it in memory, split across landing files,
loaded and merged whole. (bench/capture_memory.py runs the 1,000,000-row case and prints peak RSS.)"""

from __future__ import annotations

import tracemalloc

from loader.capture import wal2json_arrow
from loader.capture.capture import Capture
from loader.landing.records import COMMIT
from loader.landing.store import open_landing
from tests.harness import Env

ROWS = 200_000


def test_200k_row_transaction_is_streamed_split_and_loaded_whole(env: Env) -> None:
    settings = env.settings.model_copy(
        update={"source": env.settings.source.model_copy(update={"max_changes_per_file": 50_000, "fetch_size": 2_000})}
    )
    env.settings = settings
    env.sql("CREATE TABLE big (id bigint PRIMARY KEY, payload text NOT NULL, amount numeric(18,2))")
    env.capture()
    env.sql("INSERT INTO big VALUES (0, 'before', 1)")
    env.sql(
        f"INSERT INTO big SELECT g, repeat(md5(g::text), 6), g / 100.0 FROM generate_series(1, {ROWS}) g"
    )  # one transaction, ~230 bytes per landed line: ~46 MB of JSON
    env.sql("UPDATE big SET amount = -1 WHERE id = 0")

    # What this measures is the transaction's, not the first import of modules capture loads lazily
    # (pyarrow imports pandas on its first conversion of Python objects: about 18 MB of code
    # objects when this test runs first; the suite's earlier tests have imported them).
    import pandas  # noqa: F401

    wal2json_arrow.read_rows(
        b'{"action":"I","xid":1,"timestamp":"2026-01-01 00:00:00+00","lsn":"0/1","schema":"public",'
        b'"table":"big","columns":[{"name":"id","type":"bigint","value":1}],"pk":[]}\n'
    )
    tracemalloc.start()
    try:
        res = Capture(settings).run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.changes == ROWS + 2 and res.transactions == 3
    # Python-side memory stays far below the transaction's size (it streams through a server-side
    # cursor into landing files); holding it would need hundreds of MB of objects. What capture
    # holds is one landing block at a time (here a file's 50,000 records: the numpy arrays that
    # split it by table and shape are traced, its Arrow buffers are not): 18.4 MB with blocks of
    # 8,192 records, 22.2 MB with whole files of 50,000.
    assert peak < 26 * 1024 * 1024, f"capture held {peak / 1e6:.1f} MB of Python objects"

    store = open_landing(settings)
    files = store.files()
    records = [r for f in files for r in store.read_records(f.name)]
    lsn = max({r.commit_lsn for r in records}, key=lambda x: sum(1 for r in records if r.commit_lsn == x))
    txn_files = [f for f in files if f.first.commit_lsn <= lsn <= f.last.commit_lsn]
    # 200,000 changes at 50,000 per file: four files end inside the transaction, the fifth on its commit.
    assert [f.complete for f in txn_files] == [False, False, False, False, True], [f.name for f in files]
    seqs = [r.seq for r in records if r.commit_lsn == lsn]
    assert seqs == list(range(1, ROWS + 2))  # changes 1..N, then the commit marker: the boundary is recoverable
    assert records[[r.commit_lsn for r in records].index(lsn) + ROWS].op == COMMIT

    env.load()
    env.merge()
    env.assert_reconciled()
    assert env.history("public.big").count() == ROWS + 2
