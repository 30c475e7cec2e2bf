"""Name mapping: reversible, collision-free, within the catalog's limits (no JVM, no services)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader.names import (
    METADATA_COLUMNS,
    decode_part,
    encode_part,
    internal,
    lake_column,
    parse_table_name,
    source_column,
    table_name,
)

# PostgreSQL identifiers: 1..63 bytes of UTF-8, no NUL.
pg_names = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=63
).filter(lambda s: len(s.encode("utf-8")) <= 63)
plainish = st.from_regex(r"[a-z_A-Z0-9.]{1,12}", fullmatch=True)


@given(pg_names | plainish, pg_names | plainish)
def test_table_names_round_trip_and_stay_in_the_catalog_alphabet(schema: str, table: str) -> None:
    name = table_name(schema, table)
    assert parse_table_name(name) == (schema, table)
    assert re.fullmatch(r"[a-z0-9_]+", name)
    assert len(name) <= 255


@given(st.tuples(pg_names | plainish, pg_names | plainish), st.tuples(pg_names | plainish, pg_names | plainish))
def test_distinct_tables_never_share_a_name(a: tuple[str, str], b: tuple[str, str]) -> None:
    if a != b:
        assert table_name(*a) != table_name(*b)


@pytest.mark.parametrize(
    ("schema", "table", "expected"),
    [
        ("public", "accounts", "public__accounts"),
        ("public", "order_items", "public__order_items"),
        ("sales2024", "q1", "sales2024__q1"),
    ],
)
def test_plain_names_are_kept_as_they_are(schema: str, table: str, expected: str) -> None:
    assert table_name(schema, table) == expected


def test_the_double_underscore_pair_from_the_field_report_gets_two_names() -> None:
    assert table_name("a__b", "c") != table_name("a", "b__c")
    assert parse_table_name(table_name("a__b", "c")) == ("a__b", "c")
    assert parse_table_name(table_name("a", "b__c")) == ("a", "b__c")


@pytest.mark.parametrize(
    "name", ["Users", "user.name", 'we"ird', "sp ace", "ünïcødé", "_lead", "trail_", "X" * 63, "ä" * 31]
)
def test_hostile_parts_round_trip(name: str) -> None:
    enc = encode_part(name)
    assert enc.startswith("_") and "__" not in enc and not enc.endswith("_")
    assert decode_part(enc) == name


def test_readable_slug_is_kept_for_short_names() -> None:
    assert encode_part("OrderItems").startswith("_orderitems_")


@given(st.text(min_size=1, max_size=40))
def test_columns_round_trip(col: str) -> None:
    assert source_column(lake_column(col)) == col


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_columns_are_injective(a: str, b: str) -> None:
    if a != b:
        assert lake_column(a) != lake_column(b)


@given(st.text(min_size=1, max_size=40))
def test_no_source_column_meets_a_metadata_column_or_an_internal_alias(col: str) -> None:
    lake = lake_column(col).lower()
    assert lake not in METADATA_COLUMNS
    for word in ("kind", "sub", "from", "seg", "rn", "reason", "raw", "line", "m", "absent_0", "carry_0"):
        assert lake != internal(word).lower()


@pytest.mark.parametrize("col", ["pg_lsn", "PG_LSN", "pg_operation", "pg__x", "Pg__Y"])
def test_reserved_source_columns_are_escaped(col: str) -> None:
    assert lake_column(col) == "pg__" + col


@pytest.mark.parametrize("col", ["_reason", "_kind", "__absent", "pg_version", "id"])
def test_ordinary_columns_keep_their_name(col: str) -> None:
    assert lake_column(col) == col


def test_internal_aliases_refuse_words_that_could_meet_escaped_columns() -> None:
    with pytest.raises(ValueError):
        internal("pg_x")


def test_a_trailing_newline_is_never_plain() -> None:
    from loader.landing.store import LandingFile

    assert encode_part("orders\n").startswith("_")
    assert LandingFile.parse("0000000000000001.0000000001_0000000000000001.0000000002_c.jsonl.gz\n") is None


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_a_column_reference_splits_by_the_lake_s_tables_whatever_dots_the_names_hold(
    schema: str, table: str, column: str
) -> None:
    """``schema.table.column`` names the column of the lake's table its text starts with, so a dot
    inside any of the three names does not move the split (``dbt.subject_columns``, ``loader erase``)."""
    from loader.errors import UsageError
    from loader.lake.tables import SourceTable

    t = SourceTable(schema, table)
    others = [SourceTable("public", "other"), SourceTable(f"{schema}.x", "y")]
    ref = f"{schema}.{table}.{column}"
    rivals = [o for o in others if ref.startswith(o.qualified + ".") and len(ref) > len(o.qualified) + 1]
    if rivals:  # another lake table spells a prefix of the same text: refused, never guessed
        with pytest.raises(UsageError, match="names 2 columns"):
            SourceTable.column_ref(ref, [t, *others])
    else:
        assert SourceTable.column_ref(ref, [t, *others]) == (t, column)
    if "." not in schema + table + column:  # not in the lake yet: the dots split as written
        assert SourceTable.column_ref(ref, others) == (t, column)


def test_table_names_parts_reverse_the_quoting() -> None:
    """A Spark identifier TableNames quoted, back to pyiceberg's (namespace, table): backticks and
    dots in names included; another catalog's or an unquoted identifier is not this catalog's."""
    from loader.config import LoaderSettings
    from loader.lake.tables import SourceTable, TableNames

    names = TableNames(LoaderSettings())
    t = SourceTable("app.v2", "we`ird.name")
    assert names.parts(names.history(t)) == (names.history_ns, t.iceberg_name)
    assert names.parts(names.ledger) == (names.loader_ns, "landing_files")
    assert names.parts(names.history(t).replace(names.catalog, "other", 1)) is None
    assert names.parts("lakehouse.history.t") is None
