"""Embedded defaults: make sure the local source and catalog databases exist.

The private PostgreSQL cluster itself is started by ``infra/postgres.sh`` (``make pg-start``);
this module only prepares databases inside whatever server the DSNs point at.
"""

from __future__ import annotations

from urllib.parse import urlparse, urlunparse

import psycopg

from loader.config import LoaderSettings
from loader.errors import SourceError


def ensure_database(dsn: str) -> None:
    u = urlparse(dsn)
    db = u.path.lstrip("/")
    admin = urlunparse(u._replace(path="/postgres"))
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone()
            if not exists:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(db)))
    except psycopg.OperationalError as exc:
        raise SourceError(
            f"cannot reach PostgreSQL at {u.hostname}:{u.port}: {str(exc).strip()}",
            hint="start the embedded cluster with 'make pg-start' or point LOADER_SOURCE__DSN elsewhere",
        ) from exc


def ensure_embedded(settings: LoaderSettings) -> None:
    """Create the source and catalog databases when they are missing."""
    ensure_database(settings.source.dsn)
    if urlparse(settings.catalog.uri).scheme.startswith("postgres"):
        ensure_database(settings.catalog.uri)
