"""A generated, reproducible source workload (the demo's and the tests' bank schema).

Every statement runs with ``RETURNING`` so the workload records, per transaction, exactly which
rows it changed: the history oracle compares that log to the history tables.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS public.customers (
    customer_id   bigint PRIMARY KEY,
    name          text NOT NULL,
    email         varchar(200),
    segment       smallint,
    is_active     boolean NOT NULL DEFAULT true,
    birth_date    date,
    profile       jsonb,
    external_ref  uuid,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS public.accounts (
    account_id    integer PRIMARY KEY,
    customer_id   bigint NOT NULL,
    currency      varchar(3) NOT NULL,
    balance       numeric(18,2) NOT NULL,
    interest_rate numeric(6,4),
    opened_on     date NOT NULL,
    last_activity timestamp
);
CREATE TABLE IF NOT EXISTS public.transactions (
    transaction_id bigint PRIMARY KEY,
    account_id     integer NOT NULL,
    amount         numeric(18,2) NOT NULL,
    memo           text,
    posted_at      timestamptz NOT NULL,
    tx_uuid        uuid NOT NULL
);
"""

TABLES = ("public.customers", "public.accounts", "public.transactions")


@dataclass
class Change:
    table: str
    op: str  # insert / update / delete
    key: tuple[Any, ...]


@dataclass
class WorkloadLog:
    """Transactions in commit order, each a list of changes."""

    transactions: list[list[Change]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return sum(len(t) for t in self.transactions)

    def for_table(self, table: str) -> list[list[Change]]:
        return [[c for c in t if c.table == table] for t in self.transactions if any(c.table == table for c in t)]


class BankWorkload:
    """Inserts, updates and deletes across customers, accounts and transactions."""

    def __init__(self, dsn: str, seed: int = 7) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.log = WorkloadLog()
        self.customers: set[int] = set()
        self.accounts: dict[int, int] = {}
        self.txns: set[int] = set()
        self._next = {"customer": 1, "account": 1, "txn": 1}

    def create_schema(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA_SQL)

    def _id(self, kind: str) -> int:
        n = self._next[kind]
        self._next[kind] = n + 1
        return n

    def run(self, transactions: int, max_ops: int = 8) -> WorkloadLog:
        with psycopg.connect(self.dsn) as conn:
            for _ in range(transactions):
                changes: list[Change] = []
                with conn.transaction():
                    for _ in range(self.rng.randint(1, max_ops)):
                        changes.extend(self._one(conn))
                if changes:
                    self.log.transactions.append(changes)
        return self.log

    def _one(self, conn: psycopg.Connection) -> list[Change]:
        r = self.rng.random()
        if r < 0.15 or not self.customers:
            return self._insert_customer(conn)
        if r < 0.30 or not self.accounts:
            return self._insert_account(conn)
        if r < 0.60:
            return self._insert_txn(conn)
        if r < 0.78:
            return self._update_account(conn)
        if r < 0.88:
            return self._update_customer(conn)
        if r < 0.95 and self.txns:
            return self._delete_txn(conn)
        return self._delete_account(conn)

    def _insert_customer(self, conn: psycopg.Connection) -> list[Change]:
        cid = self._id("customer")
        rng = self.rng
        row = conn.execute(
            "INSERT INTO customers (customer_id, name, email, segment, is_active, birth_date, profile, external_ref, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING customer_id",
            (
                cid,
                f"Customer {cid} {rng.choice(['Ann', 'Bo', 'Chloé', 'Dmitri', 'Eßa', '李'])}",
                f"c{cid}@example.com" if rng.random() < 0.9 else None,
                rng.randint(1, 5),
                rng.random() < 0.9,
                date(1950, 1, 1) + timedelta(days=rng.randint(0, 20000)) if rng.random() < 0.8 else None,
                Jsonb({"tier": rng.choice(["gold", "silver"]), "tags": [rng.randint(0, 9)]}),
                uuid.UUID(int=rng.getrandbits(128)),
                datetime(2024, 1, 1, tzinfo=UTC)
                + timedelta(seconds=rng.randint(0, 10**8), microseconds=rng.randint(0, 999999)),
            ),
        ).fetchone()
        assert row is not None
        self.customers.add(cid)
        return [Change("public.customers", "insert", (cid,))]

    def _insert_account(self, conn: psycopg.Connection) -> list[Change]:
        aid = self._id("account")
        cid = self.rng.choice(sorted(self.customers))
        conn.execute(
            "INSERT INTO accounts VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                aid,
                cid,
                self.rng.choice(["USD", "EUR", "GBP"]),
                Decimal(self.rng.randint(0, 10**9)) / 100,
                Decimal(self.rng.randint(0, 99999)) / 10000 if self.rng.random() < 0.7 else None,
                date(2020, 1, 1) + timedelta(days=self.rng.randint(0, 1500)),
                datetime(2024, 5, 1)
                + timedelta(seconds=self.rng.randint(0, 10**7), microseconds=self.rng.randint(0, 999999)),
            ),
        )
        self.accounts[aid] = cid
        return [Change("public.accounts", "insert", (aid,))]

    def _insert_txn(self, conn: psycopg.Connection) -> list[Change]:
        if not self.accounts:
            return self._insert_account(conn)
        tid = self._id("txn")
        aid = self.rng.choice(sorted(self.accounts))
        amount = Decimal(self.rng.randint(-500000, 500000)) / 100
        conn.execute(
            "INSERT INTO transactions VALUES (%s, %s, %s, %s, %s, %s)",
            (
                tid,
                aid,
                amount,
                self.rng.choice(["coffee", "rent", "salary", None, "transfer 'quoted'", "emoji 🎉"]),
                datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=self.rng.randint(0, 10**7)),
                uuid.UUID(int=self.rng.getrandbits(128)),
            ),
        )
        self.txns.add(tid)
        conn.execute(
            "UPDATE accounts SET balance = balance + %s, last_activity = now()::timestamp WHERE account_id = %s",
            (amount, aid),
        )
        return [Change("public.transactions", "insert", (tid,)), Change("public.accounts", "update", (aid,))]

    def _update_account(self, conn: psycopg.Connection) -> list[Change]:
        aid = self.rng.choice(sorted(self.accounts))
        conn.execute(
            "UPDATE accounts SET interest_rate = %s, currency = %s WHERE account_id = %s",
            (
                Decimal(self.rng.randint(0, 99999)) / 10000 if self.rng.random() < 0.8 else None,
                self.rng.choice(["USD", "EUR", "GBP", "CHF"]),
                aid,
            ),
        )
        return [Change("public.accounts", "update", (aid,))]

    def _update_customer(self, conn: psycopg.Connection) -> list[Change]:
        cid = self.rng.choice(sorted(self.customers))
        conn.execute(
            "UPDATE customers SET is_active = NOT is_active, segment = %s, profile = profile || %s WHERE customer_id = %s",
            (self.rng.randint(1, 5), Jsonb({"n": self.rng.randint(0, 100)}), cid),
        )
        return [Change("public.customers", "update", (cid,))]

    def _delete_txn(self, conn: psycopg.Connection) -> list[Change]:
        tid = self.rng.choice(sorted(self.txns))
        conn.execute("DELETE FROM transactions WHERE transaction_id = %s", (tid,))
        self.txns.discard(tid)
        return [Change("public.transactions", "delete", (tid,))]

    def _delete_account(self, conn: psycopg.Connection) -> list[Change]:
        aid = self.rng.choice(sorted(self.accounts))
        conn.execute("DELETE FROM accounts WHERE account_id = %s", (aid,))
        del self.accounts[aid]
        return [Change("public.accounts", "delete", (aid,))]
