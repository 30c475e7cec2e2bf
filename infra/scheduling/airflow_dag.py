"""Airflow DAGs for lakehouse-loader (copy into your dags/ folder; needs Airflow 2.4+).

- ``lakehouse_loader``: capture -> load -> merge every 5 minutes, then the dbt build hourly.
  ``max_active_runs=1`` keeps Airflow from overlapping itself; the loader's own locks make an
  overlap with anything else (cron, a follower, a second scheduler) exit 75, which is retried.
- ``lakehouse_loader_maintenance``: nightly table maintenance.

Exit status 3 (rejects quarantined) and 5 (tables parked) mean "done, but look": they fail the task
so someone sees them, without retries (retrying cannot fix bad input).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

DEFAULTS = {"retries": 3, "retry_delay": timedelta(minutes=1), "retry_exponential_backoff": True}
ENV = {"LOADER_CONFIG": "/etc/lakehouse-loader/loader.toml", "LOADER_LOG_FORMAT": "json"}

with DAG(
    "lakehouse_loader",
    start_date=datetime(2026, 1, 1),
    schedule=timedelta(minutes=5),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
) as dag:
    capture = BashOperator(task_id="capture", bash_command="loader capture --json", env=ENV, append_env=True)
    load = BashOperator(task_id="load", bash_command="loader load --json", env=ENV, append_env=True)
    merge = BashOperator(task_id="merge", bash_command="loader merge --json", env=ENV, append_env=True)
    capture >> load >> merge

with DAG(
    "lakehouse_loader_maintenance",
    start_date=datetime(2026, 1, 1),
    schedule="30 3 * * *",
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
) as maintenance_dag:
    maintain = BashOperator(task_id="maintain", bash_command="loader maintain --json", env=ENV, append_env=True)
    dbt = BashOperator(task_id="dbt_build", bash_command="loader dbt build", env=ENV, append_env=True)
    maintain >> dbt
