"""Data files written by the loader itself (the driver load, the driver merge): Parquet bytes and
the Arrow schema carrying a table's Iceberg field ids."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from loader.spark import jvm_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def parquet_bytes(table: Any) -> bytes:
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


def iceberg_arrow_schema(spark: SparkSession, table: Any) -> Any:
    """The table's schema as Arrow, with Iceberg field ids (pyiceberg does the mapping)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.schema import Schema

    text = jvm_class(spark, "org.apache.iceberg.SchemaParser").toJson(table.schema())
    return schema_to_pyarrow(Schema.model_validate_json(text), include_field_ids=True)
