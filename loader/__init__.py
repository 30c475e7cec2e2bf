"""PostgreSQL change history into Iceberg: capture (wal2json) -> landing -> history -> current."""

__version__ = "0.1.0"
