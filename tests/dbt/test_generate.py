"""Pure parts of the dbt integration: generated sources/models, drift, dbt arguments, server command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from loader.config import LoaderSettings
from loader.dbt import dbt_args, profile_env
from loader.dbtgen import (
    CatalogTables,
    Comments,
    TableSpec,
    declared_columns,
    declared_sources,
    inert,
    render_generated,
    source_drift,
)
from loader.lake.tables import SourceTable
from loader.sqlserver import server_command, server_conf

SETTINGS = LoaderSettings(
    catalog={"uri": "postgresql://u@127.0.0.1:5432/cat", "history_namespace": "h", "current_namespace": "c"},
    dbt={
        "pii_columns": {"public.people": ["email", "nope"]},
        "subject_columns": {"person": ["public.people.person_id", "public.orders.person_id"]},
    },
)
PEOPLE = TableSpec(
    SourceTable("public", "people"),
    "public__people",
    ["person_id"],
    {"person_id": "bigint", "email": "text", "Odd Name": "numeric(10,2)"},
    True,
)
LOG = TableSpec(SourceTable("public", "log"), "public__log", [], {"line": "text"}, False)
CATALOG = CatalogTables([LOG, PEOPLE], ["public__people"])


def test_generated_sources_and_models(tmp_path: Path) -> None:
    files = render_generated(SETTINGS, CATALOG, Comments(columns={("public.people", "email"): "Where we write"}))
    # models only for keyed tables with a current table
    assert sorted(p for p in files if p.endswith(".sql")) == [
        f"models/generated/public__people/public__people{s}.sql" for s in ("", "__changes", "__from_history", "__scd2")
    ]
    doc = yaml.safe_load(files["models/generated/_sources.yml"])
    hist, cur = doc["sources"]
    assert hist["schema"] == "{{ var('loader_history_namespace') }}"
    assert [t["name"] for t in hist["tables"]] == ["public__log", "public__people"]
    people = hist["tables"][1]
    email = next(c for c in people["columns"] if c["name"] == "email")
    assert email["description"].startswith("Where we write") and email["meta"]["pii"] is True
    # PII audit only on configured columns that exist; subject audit reads the old key on history
    assert {"loader_pii_retention": {"arguments": {"columns": ["email"]}}} in people["data_tests"]
    pid = next(c for c in people["columns"] if c["name"] == "person_id")
    assert pid["data_tests"][0]["loader_erased_subjects_absent"]["arguments"]["in_old_key"] is True
    cur_tests = cur["tables"][0]["data_tests"]
    assert {"loader_unique_key": {"arguments": {"key": ["person_id"]}}} in cur_tests
    assert any("loader_reconciliation" in t for t in cur_tests)
    assert {"loader_no_toast_placeholder": {"arguments": {"columns": ["email"]}}} in cur_tests
    # the old key is typed like the merge types it
    changes = files["models/generated/public__people/public__people__changes.sql"]
    assert "try_cast(from_json(pg_old_key, 'map<string,string>')['person_id'] AS BIGINT)" in changes
    assert '"Odd Name"' in changes

    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    declared = declared_sources(tmp_path)
    assert source_drift(CATALOG, declared) == []
    newer = CatalogTables([PEOPLE], ["public__people", "public__extra"])
    assert source_drift(newer, declared) == [
        "history.public__log: declared as a source, not in the catalog",
        "current.public__extra: in the catalog, not declared as a source",
    ]
    # A column added at the source (and in the catalog) that the project does not declare yet.
    columns = declared_columns(tmp_path)
    assert source_drift(CATALOG, declared, columns) == []
    widened = replace(PEOPLE, pg_types={**PEOPLE.pg_types, "nickname": "text"})
    assert source_drift(CatalogTables([LOG, widened], CATALOG.current_names), declared, columns) == [
        "current.public__people.nickname: in the catalog, not declared",
        "history.public__people.nickname: in the catalog, not declared",
    ]
    # Plain YAML (no anchors), and freshness on every source table.
    text = files["models/generated/_sources.yml"]
    assert "&id" not in text and "*id" not in text
    doc = yaml.safe_load(text)
    for source in doc["sources"]:
        for table in source["tables"]:
            if "columns" in table:
                assert (
                    table["loaded_at_field"] == "pg_txn_timestamp" and table["freshness"]["warn_after"]["count"] == 24
                )


@pytest.mark.parametrize(
    "text",
    [
        "{{ env_var('X') }}",
        "env_var('X')",
        " ref('m') ",
        'a}}b"c\\d{#',
        "{% do x %}",
        "tab\tnew\nline\r{",
        "é😀{{",
        "\\u0041{",
        "123{",
    ],
)
def test_inert_text_reads_back_exactly_in_dbt(text: str) -> None:
    """What dbt renders (natively for names and the audits' arguments) is the text itself."""
    from dbt.clients.jinja import get_rendered

    written = inert(text)
    assert written != text
    for native in (True, False):
        assert get_rendered(written, {}, native=native) == text
    assert inert("plain_name") == "plain_name" and inert("Odd Name") == "Odd Name"


def test_dbt_arguments_and_profile() -> None:
    p = Path("/w")
    assert dbt_args(["build", "-s", "x"], p) == ["build", "-s", "x", "--project-dir", "/w", "--profiles-dir", "/w"]
    assert dbt_args(["--version"], p) == ["--version"]
    assert dbt_args(["docs", "generate", "--project-dir", "/o"], p) == [
        "docs",
        "generate",
        "--project-dir",
        "/o",
        "--profiles-dir",
        "/w",
    ]
    env = profile_env(SETTINGS, "thrift")
    assert env["DBT_LAKEHOUSE_TARGET"] == "thrift" and env["DBT_LAKEHOUSE_THRIFT_PORT"] == "10000"
    assert env["DBT_LAKEHOUSE_SCHEMA"] == "analytics"


def test_thrift_server_command() -> None:
    cmd = server_command(SETTINGS)
    assert "--driver-class-path" in cmd and "--jars" not in cmd
    assert not any(a.startswith("spark.jars=") for a in cmd)
    assert "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2" in cmd
    tail = cmd[cmd.index("spark-internal") :]
    assert tail == [
        "spark-internal",
        "--hiveconf",
        "hive.server2.thrift.port=10000",
        "--hiveconf",
        "hive.server2.thrift.bind.host=127.0.0.1",
    ]
    conf = server_conf(SETTINGS)
    assert conf["spark.sql.defaultCatalog"] == "lakehouse" and "spark.jars" not in conf
    assert "--properties-file" in cmd and not any(a.startswith("spark.sql.") for a in cmd), (
        "settings stay off the command line"
    )
