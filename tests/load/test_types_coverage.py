"""Every PostgreSQL type the loader maps round-trips from the source into history and current unchanged.

Columns kept as exact text are compared with the source's ``col::text``; native columns (decimal,
timestamps, dates, binary, 1-D arrays...) are compared as typed values, read through pyiceberg.
"""

from __future__ import annotations

from typing import Any

import pytest

from loader.lake.catalog import open_catalog
from loader.lake.tables import PROP_PG_TYPES, SourceTable
from loader.lake.types import spark_type
from loader.verify import _lake_rows, _source_rows, normalize_column
from tests.harness import Env

COLUMNS = """
    id integer PRIMARY KEY,
    c_smallint smallint, c_integer integer, c_bigint bigint, c_real real, c_double double precision,
    c_numeric_ps numeric(12,4), c_numeric numeric, c_numeric_wide numeric(50,10), c_bool boolean,
    c_date date, c_ts timestamp, c_ts3 timestamp(3), c_tstz timestamptz, c_time time, c_timetz timetz,
    c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb, c_text text, c_varchar varchar(10),
    c_char char(5), c_bytea bytea, c_mood mood, c_money money, c_inet inet, c_cidr cidr, c_macaddr macaddr,
    c_int_arr integer[], c_text_arr text[], c_num_arr numeric(6,2)[], c_bool_arr boolean[], c_date_arr date[],
    c_uuid_arr uuid[], c_float_arr double precision[], c_tstz_arr timestamptz[], c_bit bit(4), c_varbit varbit,
    c_point point, c_range int4range, c_tsvector tsvector, c_domain posint, "Mixed Case" text, "select" int
"""

ROW = """(
    1, -32768, 2147483647, -9223372036854775808, 1.1, 3.141592653589793,
    12345678.1234, 123456789012345678901234567890.123456789012345678901234567890,
    1234567890123456789012345678901234567890.0123456789, true,
    '2024-02-29', '2024-02-29 23:59:59.999999', '2024-01-01 00:00:00.123', '2024-06-30 22:30:00.5+02',
    '23:59:59.999999', '12:00:00+05:30', '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    '{"b": 1, "a": [1, 2.50]}', '{"b": 1, "a": [1, 2.50], "s": "\\u00e9"}', e'multi\\nline ''quoted'' \\\\ text',
    'ten chars!', 'ab', '\\x00ff10', 'happy', 1234.56, '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
    '{1,NULL,-3}', ARRAY['a,b', 'NULL', NULL, 'q"x\\y', '', 'sp ace', e'new\\nline', '{}'], '{1.50,NULL}',
    '{t,f,NULL}', '{2024-01-01,NULL}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{1.5,-0.25,1e100}',
    '{"2024-01-01 00:00:00+00"}', B'1010', B'10101', '(1.5,2)', '[1,10)', 'a fat cat', 42, 'Ünïcødé', 7
)"""


def _setup(env: Env) -> None:
    env.sql("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    env.sql("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
    env.sql(f"CREATE TABLE public.alltypes ({COLUMNS})")


def test_every_type_round_trips_into_history_and_current(env: Env) -> None:
    _setup(env)
    env.capture()
    env.sql(f"INSERT INTO public.alltypes VALUES {ROW}")
    env.sql("INSERT INTO public.alltypes (id) VALUES (2)")  # every column NULL
    env.sql(
        "INSERT INTO public.alltypes (id, c_text_arr, c_int_arr, c_real, c_double) VALUES (3, '{}', '{}', -0.5, 1e-300)"
    )
    _, load, _ = env.run_all()
    assert load.rejects == 0
    env.assert_reconciled()
    # A second increment of updates exercises the typed MERGE path for every type.
    env.sql(
        "UPDATE public.alltypes SET c_integer = c_integer - 1, c_text_arr = c_text_arr || ARRAY['z'], id = id + 100"
    )
    _, load, _ = env.run_all()
    assert load.rejects == 0
    env.assert_reconciled()
    _assert_history_matches_source_first_version(env)


def test_every_type_survives_a_compaction_rewritten_on_the_driver(env: Env) -> None:
    """A small current table's compaction reads its rows with pyiceberg (deletes applied) and
    writes them again on the driver: every type the loader maps comes out as the source has it."""
    _setup(env)
    env.configure("merge", compact_every=1)
    env.capture()
    env.sql(f"INSERT INTO public.alltypes VALUES {ROW}")
    env.sql("INSERT INTO public.alltypes (id) VALUES (2)")
    env.sql("INSERT INTO public.alltypes (id, c_text_arr, c_real) VALUES (3, '{}', -0.5)")
    env.run_all()
    env.sql("UPDATE public.alltypes SET c_integer = c_integer - 1, c_text_arr = c_text_arr || ARRAY['z'] WHERE id < 3")
    env.sql("DELETE FROM public.alltypes WHERE id = 3")
    _, load, merge = env.run_all()
    assert load.rejects == 0
    note = {t.table: t for t in merge.tables}["public.alltypes"].note
    assert "compacted (rewritten on the driver)" in note, note
    env.assert_reconciled()


def _assert_history_matches_source_first_version(env: Env) -> None:
    """The history's insert rows hold exactly the values the source had at insert time."""
    catalog = open_catalog(env.settings)
    c = env.settings.catalog
    hist = catalog.load_table((c.history_namespace, SourceTable("public", "alltypes").iceberg_name))
    import json

    pg_types: dict[str, str] = json.loads(hist.properties[PROP_PG_TYPES])
    # Native types really are native (not text) for the types the README promises.
    native = {n: spark_type(t).sql for n, t in pg_types.items() if not spark_type(t).lossless_text}
    assert native["c_numeric_ps"] == "DECIMAL(12,4)" and native["c_tstz"] == "TIMESTAMP"
    assert native["c_ts"] == "TIMESTAMP_NTZ" and native["c_ts3"] == "TIMESTAMP_NTZ"
    assert native["c_int_arr"] == "ARRAY<INT>" and native["c_text_arr"] == "ARRAY<STRING>"
    assert native["c_bytea"] == "BINARY" and native["c_date"] == "DATE"
    assert "c_numeric" not in native and "c_uuid" not in native and "c_jsonb" not in native
    rows = _lake_rows(hist.scan(row_filter="pg_operation == 'insert'").to_arrow())
    lake = {r["id"]: {k: normalize_column(pg_types[k], r[k]) for k in pg_types} for r in rows}
    # Undo the second increment at the source to compare the insert-time values.
    env.sql(
        "UPDATE public.alltypes SET c_integer = c_integer + 1, c_text_arr = CASE WHEN id = 102 THEN NULL ELSE c_text_arr[1:cardinality(c_text_arr) - 1] END, id = id - 100"
    )
    source = {
        r["id"]: {k: normalize_column(pg_types[k], v) for k, v in r.items()}
        for r in _source_rows(env.conn, SourceTable("public", "alltypes"), pg_types)
    }
    assert set(lake) == set(source) == {1, 2, 3}
    for key, want in source.items():
        got = lake[key]
        diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
        assert not diff, f"row {key}: {diff}"


def test_host_addresses_reconcile_as_postgresql_prints_them(env: Env) -> None:
    """inet host addresses: wal2json prints '10.0.0.1', while inet::text is '10.0.0.1/32'; the
    oracle compares the output text (found by the fuzzer, seed 5)."""
    env.sql("CREATE TABLE public.hosts (id int PRIMARY KEY, a inet, b cidr, c inet[])")
    env.capture()
    env.sql(
        "INSERT INTO public.hosts VALUES (1, '10.0.0.1', '10.0.0.0/8', '{::1,10.0.0.1/24}'), (2, '::1', NULL, NULL)"
    )
    env.run_all()
    env.assert_reconciled()
    assert {r["a"] for r in env.current("public.hosts").collect()} == {"10.0.0.1", "::1"}


def test_multidimensional_array_value_is_rejected_not_flattened(env: Env) -> None:
    env.sql("CREATE TABLE public.arr (id int PRIMARY KEY, a integer[])")
    env.capture()
    env.sql("INSERT INTO public.arr VALUES (1, '{1,2}')")
    env.sql("INSERT INTO public.arr VALUES (2, '{{1,2},{3,4}}'), (3, '[0:1]={5,6}')")
    _, load, _ = env.run_all()
    assert load.rejects == 2
    rows = env.spark.table(env.names.rejects).collect()
    assert all("column a (integer[])" in r["reason"] and r["source_table"] == "public.arr" for r in rows)
    assert [r["id"] for r in env.current("public.arr").collect()] == [1]


@pytest.mark.parametrize(
    ("pg_type", "fits", "misfit"),
    [("integer[]", "'{3}'", "'{{1,2},{3,4}}'"), ("numeric(12,2)", "3.5", "'NaN'")],
    ids=["2-d array", "numeric NaN"],
)
def test_a_resync_whose_rows_do_not_fit_parks_the_table(env: Env, pg_type: str, fits: str, misfit: str) -> None:
    """A snapshot is one transaction, and its resync marker lifts every park before it (a retype's
    park waits for exactly that): a row of it that cannot be typed parks its table right after the
    table's rows of it. (It parked at the transaction's start, so the resync lifted it: the rejected
    rows were gone from a current table that was not parked. Found by the fuzzer, FUZZ_GAPS=all seed
    307: a numeric(14,4) NaN, NULL from wal2json 2.5, rejected when a resync read it.)"""
    env.sql(f"CREATE TABLE public.m (id int PRIMARY KEY, v {pg_type})")
    env.capture()
    env.sql(f"INSERT INTO public.m VALUES (1, {fits}), (2, {fits})")
    env.run_all()
    env.assert_reconciled()
    env.sql(f"UPDATE public.m SET v = {misfit} WHERE id = 2")
    env.run_all()  # the stream: a reject that parks (the array), or NULL (NaN under wal2json 2.5)
    before = sorted((r["id"], str(r["v"])) for r in env.current("public.m").collect())
    env.resync(["public.m"])
    _, load, merge = env.run_all()
    assert load.rejects == 1 and "public.m" in load.parked and "public.m" in merge.parked
    assert "quarantined" in merge.parked["public.m"]
    # The resync applied without the row that did not fit, and the table parked after it.
    assert sorted((r["id"], str(r["v"])) for r in env.current("public.m").collect()) == before[:1]
    assert [r.parked is not None for r in env.reconcile(["public.m"])] == [True]
    # The repair: the value fixed at the source, a resync of a later transaction lifts the park.
    env.sql(f"UPDATE public.m SET v = {fits} WHERE id = 2")
    env.resync(["public.m"])
    _, load, merge = env.run_all()
    assert load.rejects == 0 and not load.parked and not merge.parked
    env.assert_reconciled(["public.m"])


def test_timestamptz_fast_path_equals_the_general_parse_in_any_session_time_zone(spark: Any) -> None:
    """capture's UTC text ('...+00') is typed without Spark's per-value zone parsing; the result
    must be the general path's for every form PostgreSQL prints, whatever the session's zone."""
    from loader.lake.types import _TSTZ_ANY, UTC_TEXT

    values = [
        "2024-01-31 12:00:00.123456+00",
        "2024-01-31 12:00:00+00",
        "2024-01-31 12:00:00.5+00",
        "0001-01-01 00:00:00+00",
        "0001-01-01 00:00:00+00 BC",
        "1969-12-31 23:59:59.999999+00",
        "9999-12-31 23:59:59.999999+00",
        "12345-06-07 01:02:03.000001+00",
        "294247-01-10 04:00:54.775807+00",
        "2024-01-31 12:00:00+05:30",
        "2024-01-31 12:00:00-08",
        "2024-02-30 12:00:00+00",
        "2024-01-31 25:00:00+00",
        "2024-01-31 12:00:00.1234567+00",
        "infinity",
        "-infinity",
        "",
        None,
    ]
    values = [v for v in values if v is None or ("infinity" not in v and not v.endswith(" BC"))]  # see below
    fast, general = spark_type("timestamptz").cast.replace("{v}", "v"), _TSTZ_ANY.replace("{v}", "v")
    assert "RLIKE" in fast and UTC_TEXT.endswith("\\+00$")
    before = spark.conf.get("spark.sql.session.timeZone")
    try:
        for zone in ("UTC", "America/New_York", "Asia/Kolkata"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            rows = (
                spark.createDataFrame([(v,) for v in values], "v STRING")
                .selectExpr("v", f"unix_micros({fast}) AS fast", f"unix_micros({general}) AS general")
                .collect()
            )
            assert [(r.v, r.fast) for r in rows] == [(r.v, r.general) for r in rows], zone
            assert rows[0].fast == 1706702400123456
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


# Values beyond Python's datetime and, for infinity, beyond any calendar: each must be kept (never a
# reject, never a park), reversibly (typemap.NON_FINITE), through the stream and through a resync.
_EDGE_TEMPORALS = [
    ("infinity", "infinity", "infinity"),
    ("-infinity", "-infinity", "-infinity"),
    ("0044-03-15 BC", "0044-03-15 10:11:12.5 BC", "0044-03-15 10:11:12.5+00 BC"),
    ("0001-01-01 BC", "0001-12-31 23:59:59.999999 BC", "0001-12-31 23:59:59.999999+00 BC"),
    ("4713-11-24 BC", "4713-11-24 00:00:00 BC", "4713-11-24 00:00:00+00 BC"),
    ("0001-01-01", "0001-01-01 00:00:00", "0001-01-01 00:00:00+00"),
    ("10000-01-01", "12345-06-07 01:02:03.000001", "12345-06-07 01:02:03.000001+00"),
    ("5874897-12-31", "294247-01-10 04:00:54.775806", "294247-01-10 04:00:54.775806+00"),
    ("2024-02-29", "2024-02-29 12:00:00", "2024-02-29 12:00:00+05:30"),
]


def test_infinity_bc_and_far_future_dates_and_timestamps_are_kept(env: Env) -> None:
    from loader.lake.types import NON_FINITE

    env.sql("CREATE TABLE public.validity (id int PRIMARY KEY, d date, ts timestamp, tstz timestamptz, v text)")
    env.sql("CREATE TABLE public.early (id int PRIMARY KEY, d date, ts timestamp, tstz timestamptz)")
    for i, (d, ts, tstz) in enumerate(_EDGE_TEMPORALS):
        env.sql("INSERT INTO public.early VALUES (%s, %s, %s, %s)", (i, d, ts, tstz))  # before the slot
    env.capture()
    for i, (d, ts, tstz) in enumerate(_EDGE_TEMPORALS):
        env.sql("INSERT INTO public.validity VALUES (%s, %s, %s, %s, 'a')", (i, d, ts, tstz))
    env.sql("UPDATE public.validity SET v = 'b', d = 'infinity' WHERE id = 2")  # open-ended validity
    cap, load, merge = env.run_all()
    assert load.rejects == 0 and not merge.parked and not cap.parked, (load, merge.parked, cap.parked)
    env.resync(["public.early"])  # a snapshot reads the same values through another road
    env.load()
    env.merge()
    env.assert_reconciled(["public.validity", "public.early"])
    # The documented mapping: infinity is the storage type's last value, -infinity its first.
    row = (
        env.current("public.validity")
        .where("id = 0")
        .selectExpr("unix_date(d) AS d", "unix_micros(CAST(ts AS TIMESTAMP)) AS ts", "unix_micros(tstz) AS tstz")
        .collect()[0]
    )
    assert (row.d, row.ts, row.tstz) == (NON_FINITE["DATE"][0], NON_FINITE["TIMESTAMP"][0], NON_FINITE["TIMESTAMP"][0])
    bc = env.current("public.validity").where("id = 3").selectExpr("CAST(d AS STRING) AS d").collect()[0]
    assert bc.d == "0000-01-01"  # 1 BC is year 0 in the astronomical numbering Spark (and ISO 8601) use
