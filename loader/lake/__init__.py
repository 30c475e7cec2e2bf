"""The lake layer: table names and metadata columns, the pyiceberg catalog, Iceberg helpers on Spark, inventory and procedures."""
