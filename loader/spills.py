"""Local directories a process keeps source rows in while it works: capture's spool (the open
landing file, the pipelined read's rounds), the merge's bulk-build spills (a first state's
partitions, each bucket's Parquet file before its upload).

Each is named ``<prefix><pid>-<random>`` (``tempfile.mkdtemp``: mode 0700) and removed when its
work ends; a process killed meanwhile cannot remove its own, so the next process of the same kind
removes those whose process is gone (:func:`remove_orphans`, called by :func:`private_dir`). They
hold source rows: nothing else would ever remove them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def private_dir(prefix: str, parent: str | Path | None = None) -> Path:
    """A new directory of this process (0700) under ``parent`` (else ``$TMPDIR``), after removing
    the orphans of ``prefix``."""
    remove_orphans(prefix, parent)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def remove_orphans(prefix: str, parent: str | Path | None = None) -> None:
    """Directories ``<prefix><pid>-*`` whose process is gone."""
    root = Path(parent or tempfile.gettempdir())
    for d in root.glob(f"{prefix}*-*"):
        pid = d.name[len(prefix) :].split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue  # alive, owned by someone else
