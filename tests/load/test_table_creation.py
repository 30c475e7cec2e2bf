"""Tables created without a JVM (pyiceberg, ``lake.commits.create_table``) are the tables Spark's
DDL creates: the same schema with the same field ids and types for every storage type, the same
partition spec, sort order, properties and location. A first load on the driver creates history
tables this way, so it never starts Spark; a table either way must read and evolve the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loader.config import LoaderSettings
from loader.lake.catalog import open_catalog
from loader.lake.iceberg import create_source_table
from loader.lake.tables import (
    CURRENT_METADATA,
    HISTORY_METADATA,
    PROP_PG_TYPES,
    SourceTable,
    TableNames,
    source_columns,
)
from loader.load.history import HISTORY_TABLE_PROPERTIES
from loader.names import lake_column
from tests.harness import lake_settings

# Every storage type spark_type gives (and a few spellings of each family).
PG_TYPES = [
    "smallint",
    "integer",
    "bigint",
    "oid",
    "real",
    "double precision",
    "boolean",
    "date",
    "timestamp without time zone",
    "timestamp(3) with time zone",
    "timestamptz",
    "bytea",
    "numeric(12,3)",
    "numeric(38)",
    "numeric",
    "numeric(60,2)",
    "text",
    "character varying(20)",
    "uuid",
    "jsonb",
    "integer[]",
    "bigint[]",
    "double precision[]",
    "boolean[]",
    "date[]",
    "numeric(10,2)[]",
    "text[]",
    "timestamptz[]",
    "mood",
]


def _describe(table: Any, warehouse: str) -> dict[str, Any]:
    props = dict(table.properties)
    return {
        "schema": table.schema().as_struct(),
        "identifier_fields": table.schema().identifier_field_ids,
        "spec": table.spec(),
        "sort": table.sort_order(),
        "format": table.format_version,
        "properties": props,
        "location": table.location().removeprefix(warehouse.rstrip("/")),
    }


@pytest.mark.parametrize("kind", ["history", "current"])
def test_a_source_table_created_without_spark_is_the_one_spark_creates(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path, kind: str
) -> None:
    """History tables (partitioned by day, ordered by position) as the driver load creates them,
    current tables (bucketed by the first key column, ordered by the key) as the merge does."""
    from loader.lake.commits import create_table, default_location, ensure_loader_tables
    from loader.merge.current import CURRENT_TABLE_PROPERTIES

    settings = lake_settings(base_settings, tmp_path)
    ensure_loader_tables(settings)
    names = TableNames(settings)
    catalog = open_catalog(settings)
    pg_types = {f"c{i} {t}": t for i, t in enumerate(PG_TYPES)}
    key = ["c1 integer", "c16 text"]
    shared = {
        "loader.source-table": "public.t",
        "loader.primary-key": json.dumps(key),
        PROP_PG_TYPES: json.dumps(pg_types),
    }
    by_spark, by_py = SourceTable("public", "by_spark"), SourceTable("public", "by_py")
    if kind == "history":
        ns, metadata, props = names.history_ns, HISTORY_METADATA, {**HISTORY_TABLE_PROPERTIES, **shared}
        spark_ident = names.history
        partition, order, day_of, bucket = "days(pg_txn_timestamp)", ["pg_lsn", "pg_seq"], "pg_txn_timestamp", None
    else:
        ns, metadata, props = names.current_ns, CURRENT_METADATA, {**CURRENT_TABLE_PROPERTIES, **shared}
        spark_ident = names.current
        lake_key = [lake_column(k) for k in key]
        partition, order, day_of = f"bucket(7, `{lake_key[0]}`)", lake_key, None
        bucket = (lake_key[0], 7)
    create_source_table(
        spark, spark_ident(by_spark), pg_types, metadata, props, partition, ", ".join(f"`{c}`" for c in order)
    )
    ident = (ns, by_py.iceberg_name)
    create_table(
        catalog,
        ident,
        source_columns(pg_types, metadata),
        props,
        day_of,
        order,
        default_location(settings.catalog.warehouse, ns, by_py.iceberg_name),
        bucket=bucket,
    )
    spark_table = catalog.load_table((ns, by_spark.iceberg_name))
    py_table = catalog.load_table(ident)
    a, b = _describe(spark_table, settings.catalog.warehouse), _describe(py_table, settings.catalog.warehouse)
    assert a["location"].endswith("by_spark") and b["location"].endswith("by_py")
    a["location"] = a["location"].removesuffix("by_spark")
    b["location"] = b["location"].removesuffix("by_py")
    pa_, pb = a.pop("properties"), b.pop("properties")
    assert a == b
    assert {k: (pa_.get(k), pb.get(k)) for k in set(pa_) | set(pb) if pa_.get(k) != pb.get(k)} == {}
    # Spark reads and evolves either the same way.
    for t in (by_spark, by_py):
        spark.sql(f"ALTER TABLE {spark_ident(t)} ADD COLUMN added STRING")
        assert (
            spark.table(spark_ident(t)).schema.simpleString()
            == spark.table(spark_ident(by_spark)).schema.simpleString()
        )


def test_the_loaders_own_tables_created_without_spark_are_the_ones_spark_creates(
    spark: Any, base_settings: LoaderSettings, tmp_path: Path
) -> None:
    from loader.lake.commits import ensure_loader_tables
    from loader.lake.tables import LEDGER_DDL, REJECTS_DDL

    by_py, by_spark = lake_settings(base_settings, tmp_path), lake_settings(base_settings, tmp_path)
    ensure_loader_tables(by_py)
    ensure_loader_tables(by_py)  # again: nothing to do
    names = TableNames(by_spark)
    for ns in (names.history_ns, names.current_ns, names.loader_ns):
        spark.sql(f"CREATE NAMESPACE {names.catalog}.{ns}")
    spark.sql(f"CREATE TABLE {names.ledger} ({LEDGER_DDL}) USING iceberg")
    spark.sql(f"CREATE TABLE {names.rejects} ({REJECTS_DDL}) USING iceberg PARTITIONED BY (days(rejected_at))")
    catalog = open_catalog(base_settings)
    for name in ("landing_files", "rejects"):
        a = _describe(catalog.load_table((by_spark.catalog.loader_namespace, name)), base_settings.catalog.warehouse)
        b = _describe(catalog.load_table((by_py.catalog.loader_namespace, name)), base_settings.catalog.warehouse)
        assert a.pop("location").replace(by_spark.catalog.loader_namespace, "ns") == b.pop("location").replace(
            by_py.catalog.loader_namespace, "ns"
        )
        assert a == b, name
    for s in (by_py, by_spark):
        n = TableNames(s)
        assert {(ns,) for ns in (n.history_ns, n.current_ns, n.loader_ns)} <= set(catalog.list_namespaces())
        # Spark sees and writes the pyiceberg-made ledger as its own.
        spark.sql(f"INSERT INTO {n.ledger} VALUES ('f', 'a', 'b', 1, 0, current_timestamp())")
        assert spark.table(n.ledger).count() == 1
