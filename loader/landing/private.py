"""Local files and directories of the landing area kept private: files 0600, directories 0700,
whatever the umask (landing files hold personal data as it was in the source)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import IO

log = logging.getLogger("loader.landing")

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def open_private(path: Path | str) -> IO[bytes]:
    """``path`` created (or truncated) for writing with mode 0600, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # the mode given to open() is masked by the umask
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def private_dir(path: Path, narrow: bool = False) -> None:
    """``path`` and its missing parents created with mode 0700, whatever the umask.

    Existing directories are left alone (a landing root may be a shared mount), unless ``narrow``:
    then ``path`` itself, if it is wider than 0700, is narrowed (a directory of the loader's own).
    """
    missing = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, PRIVATE_DIR)
        except FileExistsError:
            continue  # created meanwhile by another process
        os.chmod(d, PRIVATE_DIR)  # mkdir's mode is masked by the umask
    if narrow and not missing and path.stat().st_mode & 0o077:
        try:
            os.chmod(path, PRIVATE_DIR)
        except PermissionError:
            log.warning("%s is readable by others and not ours to narrow: chmod 700 it", path)
