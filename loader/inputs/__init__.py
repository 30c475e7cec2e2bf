"""Other inputs for the same downstream: files of change messages converted to landing files.

Each format module turns messages into ``InputChange`` values; ``landing.import_files`` orders them
by LSN, drops duplicates and writes ordinary landing files, which ``loader load`` then takes like
files from a live slot. Formats: ``pgkafka`` (pgkafka-style Simple JSON messages), ``wal2json``
(format-version 1 or 2 JSON lines as pg_recvlogical writes them), ``debezium`` (Debezium
PostgreSQL connector envelopes, as a Kafka S3 sink writes them).
"""
