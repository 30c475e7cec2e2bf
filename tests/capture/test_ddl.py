"""Schema changes mid-stream, end to end: each landed change carries the schema it was written
under, so one load batch holding changes from before and after ADD/DROP/ALTER COLUMN evolves the
history table and the current table matches the source."""

from __future__ import annotations

from tests.harness import Env


def test_add_drop_alter_column_between_changes_of_one_table(env: Env) -> None:
    env.sql("CREATE TABLE acct (id int PRIMARY KEY, amount int, price numeric(10,2), label varchar(10), note text)")
    env.capture()
    env.sql("INSERT INTO acct VALUES (1, 10, 1.50, 'a', 'first'), (2, 20, 2.50, 'b', 'second')")
    env.run_all()  # the history table exists; everything below lands in one batch
    env.sql("ALTER TABLE acct ADD COLUMN flag boolean")  # without default
    env.sql("INSERT INTO acct VALUES (3, 30, 3.50, 'c', 'third', true)")
    env.sql("ALTER TABLE acct ADD COLUMN region text NOT NULL DEFAULT 'eu'")  # with default: old rows read 'eu'
    env.sql("UPDATE acct SET amount = 11 WHERE id = 1")
    env.sql("ALTER TABLE acct DROP COLUMN note")
    env.sql("INSERT INTO acct VALUES (4, 40, 4.50, 'd', false, 'us')")
    env.sql("ALTER TABLE acct ALTER COLUMN amount TYPE bigint")
    env.sql("ALTER TABLE acct ALTER COLUMN price TYPE numeric(14,2)")
    env.sql("ALTER TABLE acct ALTER COLUMN label TYPE varchar(50)")
    env.sql("UPDATE acct SET amount = 5000000000 WHERE id = 2")
    env.sql("UPDATE acct SET price = 123456789012.25, label = repeat('x', 40) WHERE id = 3")
    env.sql("DELETE FROM acct WHERE id = 4")
    # A table whose very first batch already holds a retype.
    env.sql("CREATE TABLE fresh (id int PRIMARY KEY, amount int)")
    env.sql("INSERT INTO fresh VALUES (1, 10)")
    env.sql("ALTER TABLE fresh ALTER COLUMN amount TYPE bigint")
    env.sql("INSERT INTO fresh VALUES (2, 5000000000)")
    env.capture()
    env.load()  # one batch: changes written under six different schemas of the table
    env.merge()
    env.assert_reconciled()
    hist = env.history("public.acct")
    assert {"flag", "region", "note"} <= set(hist.columns)
    dtypes = dict(hist.dtypes)
    assert dtypes["amount"] == "bigint" and dtypes["price"] == "decimal(14,2)"
    # The dropped column keeps its history; changes after the drop leave it NULL.
    notes = {r["id"]: r["note"] for r in hist.where("pg_operation = 'insert'").collect()}
    assert notes == {1: "first", 2: "second", 3: "third", 4: None}
