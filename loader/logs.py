"""Logging for every command: stdlib ``logging``, as text or JSON lines, with Spark's noise kept out.

``--log-level`` (default WARNING for one-shot commands, INFO for follow mode) and
``--log-format text|json``. JSON lines (python-json-logger) carry the logger, level, time and any
``extra`` fields (table, lsn, file, ...), for log pipelines. Secrets never reach a log record: the
loader only ever logs redacted values (loader.config.redact).
"""

from __future__ import annotations

import logging
import sys

_NOISY = ("py4j", "py4j.clientserver", "py4j.java_gateway", "urllib3", "botocore", "s3transfer", "boto3", "pyiceberg")


def setup_logging(level: str = "WARNING", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
