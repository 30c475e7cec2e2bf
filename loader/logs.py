"""Logging for every command: stdlib ``logging``, as text or JSON lines, with Spark's noise kept out.

``--log-level`` (default WARNING for one-shot commands, INFO for follow mode) and
``--log-format text|json``. JSON lines (python-json-logger) carry the logger, level, time and any
``extra`` fields (table, lsn, file, ...), for log pipelines. Secrets never reach a log record: the
loader only ever logs redacted values (loader.config.redact).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

_NOISY = ("py4j", "py4j.clientserver", "py4j.java_gateway", "urllib3", "botocore", "s3transfer", "boto3", "pyiceberg")


# The format chosen for this process; Spark's JVM (loader.spark) logs in the same one.
_FORMAT = "text"


def log_format() -> str:
    return _FORMAT


def _zoned_time(record: logging.LogRecord, datefmt: str | None = None) -> str:
    """ISO 8601 with the offset (UTC): log pipelines must not guess the zone."""
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def setup_logging(level: str = "WARNING", fmt: str = "text") -> None:
    global _FORMAT
    _FORMAT = fmt
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        formatter = JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level"},
        )
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    formatter.formatTime = _zoned_time  # type: ignore[method-assign]
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
