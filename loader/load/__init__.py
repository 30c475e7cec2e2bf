"""Load stage: landing files -> Iceberg history tables (append-only, sorted by pg_lsn)."""
