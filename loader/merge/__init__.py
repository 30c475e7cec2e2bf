"""Merge stage: history increments -> current tables by incremental Spark MERGE INTO."""
