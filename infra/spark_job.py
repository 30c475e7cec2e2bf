"""spark-submit entry point: the same commands as the ``loader`` CLI, on the session spark-submit made.

    spark-submit $(loader spark-conf) infra/spark_job.py load
    spark-submit $(loader spark-conf) infra/spark_job.py merge

The ``loader`` package (and its dependencies) must be importable on the driver and executors:
install the wheel into the cluster image or ship a packed virtualenv with --archives.
"""

from loader.cli import main

if __name__ == "__main__":
    main(prog_name="loader")
