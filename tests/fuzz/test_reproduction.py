"""A failing seed's script reproduces the source: ``psql -f`` of ``Workload.script`` leaves every
table exactly as the fuzzer's runner left it (COPY data, quoting, transactions and savepoints included)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.fuzz.runner import apply_sql
from tests.fuzz.workload import KNOWN_GAPS, SCHEMAS, Sql, generate
from tests.harness import TEST_PG, create_db

PSQL = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"


def table_digests(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " AND n.nspname = ANY(%s)",
            (list(SCHEMAS),),
        ).fetchall()
        out = {}
        for (t,) in tables:
            # Columns added with DEFAULT clock_timestamp() (named v_<n>) differ by design.
            row = conn.execute(
                "SELECT count(*), md5(coalesce(string_agg(r, '|' ORDER BY r), '')) FROM (SELECT (SELECT"
                " jsonb_object_agg(k, v) FROM jsonb_each(to_jsonb(x)) AS e(k, v) WHERE k NOT LIKE 'v\\_%')::text AS r"
                f" FROM {t} x) y"
            ).fetchone()
            assert row is not None
            out[t] = f"{row[0]}:{row[1]}"
    return out


@pytest.mark.parametrize("seed", [5, 7, 10, 21])
def test_script_reproduces_the_source(pg_admin: str, tmp_path: Path, seed: int) -> None:
    if not Path(PSQL).exists():
        pytest.fail(f"psql not found at {PSQL}")
    workload = generate(seed, rounds=4, gaps=frozenset(KNOWN_GAPS))
    uid = uuid.uuid4().hex[:8]
    by_runner, by_script = f"fz_run_{uid}", f"fz_psql_{uid}"
    for db in (by_runner, by_script):
        create_db(pg_admin, db)
    try:
        with psycopg.connect(f"{TEST_PG}/{by_runner}", autocommit=True) as conn:
            for step in workload.steps:
                if isinstance(step, Sql):
                    apply_sql(conn, step)
        script = tmp_path / "repro.sql"
        script.write_text(workload.script())
        done = subprocess.run(
            [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", f"{TEST_PG}/{by_script}", "-f", str(script)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        want = table_digests(f"{TEST_PG}/{by_runner}")
        assert want and table_digests(f"{TEST_PG}/{by_script}") == want
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            for db in (by_runner, by_script):
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
