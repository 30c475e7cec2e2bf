"""Source names are data, never code: generated dbt files stay inert when dbt parses them.

Anyone who may create a table, a column or a type in a captured database chooses names that end up
in the generated YAML (names, meta, the audits' arguments) and SQL. dbt renders those as Jinja at
parse time, with ``env_var`` and ``print`` in reach, so a name like ``{{ env_var('SECRET') }}`` would
read the loader's environment into dbt's logs, manifest and target files. This test creates such a
table in the source and in the catalog, runs the loader's dbt integration (generation, then a real
``dbt parse`` on the thrift target, which needs no server and no Spark) and looks for a canary value
of the environment in everything dbt printed or wrote.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from loader.config import LoaderSettings
from loader.dbt import invoke_dbt
from loader.dbtgen import model_name
from loader.lake.tables import PROP_PG_TYPES, PROP_PRIMARY_KEY, PROP_SOURCE_TABLE, SourceTable
from tests.harness import TEST_PG, create_db

pytestmark = [pytest.mark.integration, pytest.mark.dbt]

CANARY_VAR = "LOADER_TEST_CANARY"
# Each name would run code if dbt rendered it: an expression, a statement, and (for the audits'
# arguments, which dbt evaluates when they merely look like a call) a bare call.
KEY = "{{ print(env_var('LOADER_TEST_CANARY')) }}"
BARE = "env_var('LOADER_TEST_CANARY')"
STMT = "{% do print(env_var('LOADER_TEST_CANARY')) %}x"
TABLE = "{{ env_var('LOADER_TEST_CANARY') }}"
TYPE = "{{ env_var('LOADER_TEST_CANARY') }}t"


def test_names_from_the_source_never_run_in_dbt(
    pg_admin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from loader.lake.catalog import open_catalog

    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv(CANARY_VAR, canary)
    uid = uuid.uuid4().hex[:8]
    src_db, cat_db = f"src_inert_{uid}", f"cat_inert_{uid}"
    create_db(pg_admin, src_db)
    create_db(pg_admin, cat_db)
    try:
        # the source: a table, its columns and a type named like Jinja, a comment too
        with psycopg.connect(f"{TEST_PG}/{src_db}", autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TYPE {} AS ENUM ('a')").format(sql.Identifier(TYPE)))
            conn.execute(
                sql.SQL("CREATE TABLE public.{} ({} bigint PRIMARY KEY, {} text, {} {})").format(
                    sql.Identifier(TABLE), *map(sql.Identifier, (KEY, BARE, STMT, TYPE))
                )
            )
            conn.execute(
                sql.SQL("COMMENT ON COLUMN public.{}.{} IS {}").format(
                    sql.Identifier(TABLE),
                    sql.Identifier(BARE),
                    sql.Literal("{{ print(env_var('" + CANARY_VAR + "')) }}"),
                )
            )
        source = SourceTable("public", TABLE)
        settings = LoaderSettings(
            source={"dsn": f"{TEST_PG}/{src_db}", "slot": "unused"},
            catalog={
                "uri": f"{TEST_PG}/{cat_db}",
                "warehouse": (tmp_path / "warehouse").as_uri(),
                "history_namespace": "h",
                "current_namespace": "c",
            },
            dbt={
                "work_dir": str(tmp_path / "dbt-work"),
                "pii_columns": {source.qualified: [BARE, STMT]},
                "subject_columns": {"person": [f"{source.qualified}.{KEY}", f"{source.qualified}.{BARE}"]},
            },
        )
        # the catalog as the load leaves it: history and current tables with the source's key and types
        catalog = open_catalog(settings)
        pg_types = {KEY: "bigint", BARE: "text", STMT: f'"{TYPE}"'}
        schema = Schema(
            NestedField(1, KEY, LongType()), NestedField(2, BARE, StringType()), NestedField(3, STMT, StringType())
        )
        props = {
            PROP_SOURCE_TABLE: source.qualified,
            PROP_PRIMARY_KEY: json.dumps([KEY]),
            PROP_PG_TYPES: json.dumps(pg_types),
        }
        for ns in ("h", "c"):
            catalog.create_namespace(ns)
            catalog.create_table((ns, source.iceberg_name), schema, properties=props)

        res = invoke_dbt(settings, ["parse", "--target", "thrift"], echo=lambda _: None)
        assert res.success, res.exception

        work = Path(settings.dbt.work_dir)
        out, err = capfd.readouterr()
        leaks = [p for p in sorted(work.rglob("*")) if p.is_file() and canary.encode() in p.read_bytes()]
        assert canary not in out + err, "dbt printed the environment"
        assert leaks == [], f"the environment reached {leaks}"

        # ... and dbt still resolves every name to the source's own
        manifest = json.loads((work / "target" / "manifest.json").read_text())
        ident = source.iceberg_name
        for kind in ("history", "current"):
            node = manifest["sources"][f"source.lakehouse.{kind}.{ident}"]
            assert {KEY, BARE, STMT} <= set(node["columns"]), node["columns"].keys()
            assert node["meta"]["source_table"] == source.qualified
            assert node["columns"][STMT]["meta"]["pg_type"] == f'"{TYPE}"'
            assert node["columns"][KEY]["meta"]["primary_key"] is True
        model = manifest["nodes"][f"model.lakehouse.{model_name(ident)}"]
        assert {KEY, BARE, STMT} <= set(model["columns"])
        changes = manifest["nodes"][f"model.lakehouse.{model_name(ident)}__changes"]
        assert f"{STMT}__before" in changes["columns"]
        comment = manifest["sources"][f"source.lakehouse.current.{ident}"]["columns"][BARE]["description"]
        assert comment.startswith("{{ print(env_var('" + CANARY_VAR + "')) }}"), comment
        # the audits' arguments reach the tests as the names themselves
        kwargs = [
            n["test_metadata"]["kwargs"]
            for n in manifest["nodes"].values()
            if n["resource_type"] == "test"
            and n.get("test_metadata", {}).get("name") == "loader_erased_subjects_absent"
        ]
        assert sorted(k["column_name"] for k in kwargs) == sorted([KEY, KEY, BARE, BARE]), kwargs
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            for db in (src_db, cat_db):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
