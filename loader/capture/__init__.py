"""Capture stage: PostgreSQL logical slot (wal2json) -> landing files named by LSN range."""
