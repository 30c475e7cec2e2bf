"""Landing area: files named by the LSN range they hold, on local disk or S3.

File name: ``<first>_<last>_<c|p>.<suffix>`` where ``first``/``last`` are ChangePosition tokens
(fixed-width, so names sort in commit order) and ``c`` means the file ends on a transaction's
commit marker, ``p`` that it stops inside a transaction (a huge transaction continues in the next
file). A file is published only when complete and durable: local files are fsynced and renamed
into place, S3 objects appear atomically when the PUT (or multipart upload) completes.

A v1 file is two gzip members: a header line (the tables it holds, with counts) and the records
as JSON lines; a v2 file's header is its Arrow schema's metadata. A truncated or damaged file
therefore still names every table it touched.

Landing format v3 (``<first>_<last>_<c|p>.tables.arrow``, ``loader.landing.tablefile``,
``schemas/landing-change.v3.md``; ``source.stream_format = "tables"``, the default) holds each
table's changes in columns of their own. Landing format v2 holds the same records as Arrow IPC
streams: change-stream files ``<first>_<last>_<c|p>.changes.arrow`` (``loader.landing.changefile``,
``schemas/landing-change.v2.md``; ``source.stream_format = "arrow"``) and snapshot chunks
``<first>_<last>_<c|p>.arrows``, one table per file (``loader.landing.arrowfile``,
``schemas/landing-snapshot.v2.md``). ``LandingFile.format`` tells the four apart and
``read_records`` reads them all.

Landing files hold personal data as it was in the source. Locally, every file the loader writes here
(landing files, ``_state/`` objects, spool and temporary files) is created 0600 and every directory
0700, whatever the umask (``open_private``, ``private_dir``); the slot's directory and its ``_state``
are narrowed to 0700 when found wider.

Failures of the channel (S3 throttling, timeouts, resets, local I/O errors) are retried with
backoff (:mod:`loader.retry`) and then raised as ``LandingUnavailableError``; a missing object is a
``LandingError``. Neither is ever mistaken for bad data.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import os
import re
import tempfile
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlparse

from isal import igzip, igzip_lib

from loader.config import LoaderSettings, secret_text
from loader.errors import DecompressedSizeError, LandingError
from loader.faults import checkpoint
from loader.landing.private import open_private, private_dir
from loader.landing.records import COMMIT, ChangeRecord, FileHeader
from loader.lsn import ChangePosition
from loader.retry import call_with_retry

log = logging.getLogger("loader.landing")

STATE_PREFIX = "_state"
MAX_DECOMPRESSED = 4096 << 20  # landing.max_decompressed_mb's default
# What reading damaged gzip raises (the gzip module's, zlib's and ISA-L's errors).
GZIP_DAMAGE: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, cast(type, igzip_lib.IsalError))
_UNREADABLE: tuple[type[BaseException], ...] = (*GZIP_DAMAGE, UnicodeDecodeError)
_NAME_RE = re.compile(
    r"^([0-9A-F]{16}\.\d{10})_([0-9A-F]{16}\.\d{10})_([cp])(\.jsonl\.gz|\.arrows|\.changes\.arrow|\.tables\.arrow)\Z"
)
# Landing formats by file name: v1 gzip JSON lines (every kind of record); v2 Arrow IPC streams,
# either one snapshot chunk (loader.landing.arrowfile, schemas/landing-snapshot.v2.md) or records of
# the change stream (loader.landing.changefile, schemas/landing-change.v2.md); v3, the change
# stream with each table's changes in columns (loader.landing.tablefile, schemas/landing-change.v3.md).
JSONL = "jsonl"
ARROW = "arrow"
CHANGES = "changes"
TABLES = "tables"
_SUFFIX = {JSONL: ".jsonl.gz", ARROW: ".arrows", CHANGES: ".changes.arrow", TABLES: ".tables.arrow"}
# The formats of the change stream's files (either is read by every reader of records).
STREAM_FORMATS = (CHANGES, TABLES)


def gunzip_bounded(data: bytes, limit: int, what: str) -> bytes:
    """A whole (multi-member) gzip file decompressed, stopping with ``DecompressedSizeError`` (naming
    ``what``) as soon as it passes ``limit`` bytes. Damage raises what the gzip reader raises
    (``OSError``, ``EOFError``, ISA-L's error), as ``igzip.decompress`` would."""
    out: list[bytes] = []
    total = 0
    with igzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as f:
        while chunk := f.read(1 << 24):
            total += len(chunk)
            if total > limit:
                raise too_large(what, limit)
            out.append(chunk)
    return b"".join(out)


def too_large(what: str, limit: int) -> DecompressedSizeError:
    return DecompressedSizeError(
        f"{what} decompresses to more than "
        + (f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes")
        + " (landing.max_decompressed_mb): not read",
        hint="a file this large is not one the loader wrote (a gzip bomb?): move it out of the way; if it is "
        "genuine, raise LOADER_LANDING__MAX_DECOMPRESSED_MB",
    )


@dataclass(frozen=True, order=True)
class LandingFile:
    """A published landing file; ordering follows commit order."""

    first: ChangePosition
    last: ChangePosition
    complete: bool
    name: str

    @property
    def format(self) -> str:
        """``jsonl`` (landing v1), ``arrow`` (landing v2, a snapshot chunk), ``changes`` (landing
        v2, records of the change stream) or ``tables`` (landing v3, the change stream by table)."""
        return format_of(self.name)

    @classmethod
    def parse(cls, name: str) -> LandingFile | None:
        m = _NAME_RE.match(name)
        if not m:
            return None
        return cls(
            ChangePosition.from_token(m.group(1)),
            ChangePosition.from_token(m.group(2)),
            m.group(3) == "c",
            name,
        )

    @staticmethod
    def name_for(first: ChangePosition, last: ChangePosition, complete: bool, format: str = JSONL) -> str:
        return f"{first.token()}_{last.token()}_{'c' if complete else 'p'}{_SUFFIX[format]}"


# A landing file's name (LandingFile.name_for) is "<first>_<last>_<c|p><suffix>", each position a
# fixed-width token that sorts like it: the first RANGE_CHARS characters order names by range.
_TOKEN_CHARS = len(ChangePosition(0, 0).token())
RANGE_CHARS = 2 * _TOKEN_CHARS + 1


def name_last_token(name: str) -> str | None:
    """The token of a landing file name's last position (text that sorts like the position),
    without parsing it; None for a name not in the landing layout."""
    if len(name) > RANGE_CHARS and name[_TOKEN_CHARS] == "_" and name[RANGE_CHARS] == "_":
        return name[_TOKEN_CHARS + 1 : RANGE_CHARS]
    return None


# Per landing area (its URL): the names of the last listing and its files in commit order.
_LISTED: dict[str, tuple[list[str], list[LandingFile]]] = {}


def _in_commit_order(names: list[str]) -> list[LandingFile]:
    """The landing files among ``names`` (sorted text) in commit order: the text order, which is
    (first, last) order for the fixed-width names, except between files of the same first and
    last position, sorted again only when there are such."""
    out = [f for f in map(LandingFile.parse, names) if f is not None]
    if any(a.name[:RANGE_CHARS] >= b.name[:RANGE_CHARS] for a, b in itertools.pairwise(out)):
        out.sort()
    return out


def stream_landing_format(setting: str) -> str:
    """The landing format of the change stream's files for ``source.stream_format``."""
    return {"arrow": CHANGES, "tables": TABLES}.get(setting, JSONL)


def format_of(name: str) -> str:
    """A landing file's format, by its name."""
    for fmt in (CHANGES, TABLES, ARROW):
        if name.endswith(_SUFFIX[fmt]):
            return fmt
    return JSONL


def _arrow_module(fmt: str) -> Any:
    """The module that reads and writes a landing format held in Arrow (v2 either kind, v3)."""
    from loader.landing import arrowfile, changefile, tablefile

    return {CHANGES: changefile, TABLES: tablefile}.get(fmt, arrowfile)


class LandingStore(ABC):
    """Where landing files live. Implementations: a local directory, an S3 prefix."""

    url: str
    retry_attempts: int = 5
    retry_max_wait: float = 20.0
    max_decompressed: int = MAX_DECOMPRESSED  # bytes one landing file may decompress to

    def _retry(self, fn: Any, what: str) -> Any:
        return call_with_retry(fn, what, self.retry_attempts, self.retry_max_wait)

    @abstractmethod
    def names(self) -> list[str]:
        """Every object name under the prefix (not only landing files), sorted."""

    @abstractmethod
    def publish(self, local_path: Path, name: str) -> None:
        """Make a finished local file durable under ``name``; atomic for readers."""

    @abstractmethod
    def open_bytes(self, name: str) -> bytes:
        """Full content of one object."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove one object (used only for unloaded files of an interrupted snapshot)."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether an object (possibly under a sub-prefix) exists."""

    def write_state(self, name: str, doc: dict[str, Any]) -> None:
        """Durably replace a small JSON state object, kept under ``_state/`` beside the landing files.

        The sub-prefix keeps state out of ``names()``, which lists the landing files' level only.
        """
        fd, tmp = tempfile.mkstemp(suffix=".json")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(doc, indent=2, sort_keys=True).encode("utf-8"))
            self.publish(Path(tmp), f"{STATE_PREFIX}/{name}")
        finally:
            Path(tmp).unlink(missing_ok=True)

    def read_state(self, name: str) -> dict[str, Any] | None:
        key = f"{STATE_PREFIX}/{name}"
        if not self.exists(key):
            return None
        doc = json.loads(self.open_bytes(key).decode("utf-8"))
        if not isinstance(doc, dict):
            raise LandingError(f"state object {self.url}/{key} is not a JSON object", hint="delete it and re-run")
        return doc

    def files(self) -> list[LandingFile]:
        """The landing files listed, in commit order.

        A landing area holds every file of ``landing.retention_hours`` (a week by default: over a
        million files at two a second), and follow mode lists it several times a cycle: the
        files of the last listing of each landing area are kept for the process (a function of
        the names alone, whichever store listed them), so a listing that only added files parses
        only those; the names' text order is the commit order (fixed-width tokens) except between
        files of the same first and last position, which alone are sorted again."""
        names = self.names()
        old_names, old_files = _LISTED.get(self.url, ([], []))
        if old_names and len(names) >= len(old_names) and names[: len(old_names)] == old_names:
            # Files only added after the last listing's (the common case: nothing retired since)
            tail = _in_commit_order(names[len(old_names) :])
            out = old_files + tail
            if old_files and tail and old_files[-1] > tail[0]:
                out.sort()
        else:
            out = _in_commit_order(names)
        _LISTED[self.url] = (names, out)
        return list(out)

    def landed_position(self) -> ChangePosition | None:
        """The last change position that is durably landed, or None if nothing is."""
        files = self.files()
        return files[-1].last if files else None

    def read_lines(self, name: str) -> Iterator[str]:
        """Every line of an intact file (header included); a damaged file raises LandingError.

        The load does not use this: it salvages what a damaged file still holds (loader.load.decode).
        A landing v2 file gives the lines a v1 file with the same records holds.
        """
        if format_of(name) != JSONL:
            got = self._salvage(name)
            if got.header is not None:
                yield FileHeader(got.header.tables).to_json()
            for rec in self._arrow_records(name, got):
                yield rec.to_json()
            return
        data = self.open_bytes(name)
        try:
            if name.endswith(".gz"):
                text = gunzip_bounded(data, self.max_decompressed, f"landing file {self.url}/{name}").decode("utf-8")
            else:
                text = data.decode("utf-8")
        except DecompressedSizeError:
            raise
        except _UNREADABLE as exc:
            raise LandingError(
                f"landing file {self.url}/{name} is damaged (not readable gzip/UTF-8: {exc})",
                hint="'loader load' keeps its readable changes and parks the tables it touched; "
                "'loader resync --table ...' repairs them",
            ) from exc
        # Lines end at "\n" only: str.splitlines would also cut at U+0085, U+2028 and the like,
        # which JSON leaves unescaped inside a value.
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        yield from lines

    def _salvage(self, name: str) -> Any:
        """A v2 or v3 file read batch by batch (its module's ``Salvage``)."""
        return _arrow_module(format_of(name)).salvage(self.open_bytes(name))

    def _arrow_records(self, name: str, got: Any) -> Iterator[ChangeRecord]:
        """The records of a salvaged v2 or v3 file (``got``), or LandingError when it is not intact."""
        try:
            yield from _arrow_module(format_of(name)).intact_records(got)
        except ValueError as exc:
            raise LandingError(
                f"landing file {self.url}/{name} is damaged ({exc})",
                hint="'loader load' keeps its readable changes and parks the tables it touched; "
                "'loader resync --table ...' repairs them",
            ) from exc

    def read_records(self, name: str) -> Iterator[ChangeRecord]:
        """The change and control records of an intact file, without its header (either format)."""
        if format_of(name) != JSONL:
            yield from self._arrow_records(name, self._salvage(name))
            return
        for line in self.read_lines(name):
            if line.strip() and '"op":"H"' not in line[:40]:
                yield ChangeRecord.from_json(line)


class LocalLandingStore(LandingStore):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = path.as_uri()
        self._private: set[Path] = set()  # directories made (or found) private by this store

    def names(self) -> list[str]:
        def listing() -> list[str]:
            if not self.path.exists():
                return []
            # scandir's entries know their type without a stat per file (a million stats a listing
            # in a week-old landing area)
            with os.scandir(self.path) as entries:
                return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file())

        return self._retry(listing, f"listing {self.url}")

    def exists(self, name: str) -> bool:
        return (self.path / name).is_file()

    def publish(self, local_path: Path, name: str) -> None:
        self._retry(lambda: self._publish(local_path, name), f"writing {self.url}/{name}")

    def _publish(self, local_path: Path, name: str) -> None:
        target = self.path / name
        if target.parent not in self._private:
            # the slot's directory and _state are the loader's own: narrowed if an older version made them wider
            private_dir(self.path, narrow=True)
            private_dir(target.parent, narrow=True)
            self._private.add(target.parent)
        tmp = target.parent / f".{target.name}.tmp"
        with open(local_path, "rb") as src, open_private(tmp) as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, target)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def open_bytes(self, name: str) -> bytes:
        try:
            return self._retry((self.path / name).read_bytes, f"reading {self.path / name}")
        except FileNotFoundError as exc:
            raise LandingError(
                f"landing file {self.path / name} is listed but missing",
                hint="it was moved or deleted by someone else; restore it, or resync the tables it held",
            ) from exc


class S3LandingStore(LandingStore):
    def __init__(self, bucket: str, prefix: str, client: Any, multipart_threshold: int = 64 * 1024 * 1024) -> None:
        # S3 parts are at least 5 MiB (except the last one).
        self.multipart_threshold = max(multipart_threshold, 5 * 1024 * 1024)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self.url = f"s3://{bucket}/{self.prefix}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def names(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[str]:
            out: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base):
                for obj in page.get("Contents", []):
                    rest = obj["Key"][len(base) :]
                    if "/" not in rest:
                        out.append(rest)
            return sorted(out)

        return self._retry(listing, f"listing {self.url}")

    def delete(self, name: str) -> None:
        self._retry(
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(name)),
            f"deleting s3://{self.bucket}/{self._key(name)}",
        )

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self._key(name))
                return True
            except ClientError as exc:
                if _not_found(exc):
                    return False
                raise

        return self._retry(head, f"checking s3://{self.bucket}/{self._key(name)}")

    def publish(self, local_path: Path, name: str) -> None:
        from boto3.s3.transfer import TransferConfig

        # upload_file switches to multipart above the threshold; the object is visible only
        # once the whole upload completes, so readers never see a torn file.
        part = self.multipart_threshold
        cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
        self._retry(
            lambda: self.client.upload_file(str(local_path), self.bucket, self._key(name), Config=cfg),
            f"writing s3://{self.bucket}/{self._key(name)}",
        )

    def open_bytes(self, name: str) -> bytes:
        from botocore.exceptions import ClientError

        def get() -> bytes:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read())

        try:
            return self._retry(get, f"reading s3://{self.bucket}/{self._key(name)}")
        except ClientError as exc:
            if _not_found(exc):
                raise LandingError(
                    f"landing file s3://{self.bucket}/{self._key(name)} is listed but missing",
                    hint="it was moved or deleted by someone else; restore it, or resync the tables it held",
                ) from exc
            raise LandingError(f"cannot read s3://{self.bucket}/{self._key(name)}: {exc}") from exc


def _not_found(exc: Any) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def s3_client(settings: LoaderSettings) -> Any:
    import boto3
    from botocore.config import Config

    s3 = settings.s3
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=secret_text(s3.secret_access_key),
        region_name=s3.region,
        # Few quick attempts inside botocore; the loader's own backoff (loader.retry) waits longer.
        config=Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 2, "mode": "standard"}),
    )


def open_landing(settings: LoaderSettings, url: str | None = None) -> LandingStore:
    """The landing store for the configured (or given) URL, scoped to the capture slot."""
    url = url or settings.landing.url
    u = urlparse(url)
    store: LandingStore
    if u.scheme in ("s3", "s3a"):
        store = S3LandingStore(
            u.netloc,
            f"{u.path.strip('/')}/{settings.source.slot}".strip("/"),
            s3_client(settings),
            multipart_threshold=settings.landing.multipart_threshold_mb * 1024 * 1024,
        )
    elif u.scheme in ("", "file"):
        store = LocalLandingStore(Path(u.path) / settings.source.slot)
    else:
        raise LandingError(f"landing url {url!r} is neither a local path nor s3://", hint="set LOADER_LANDING__URL")
    store.retry_attempts = settings.landing.retry_attempts
    store.max_decompressed = settings.landing.max_decompressed_mb << 20
    store.retry_max_wait = settings.landing.retry_max_wait_s
    return store


# Landing files are gzip, written by ISA-L (``isal``, a drop-in for zlib's deflate with SIMD): at its
# level 1, 38.9 MB of landing lines compress in 18 ms against zlib level 1's 90 ms, into a slightly
# smaller file (2.66 MB vs 2.70 MB); the output is plain gzip that every reader takes, and
# deterministic, so a re-capture still writes byte-identical files. Capture's CPU is its bottleneck.
GZIP_LEVEL = 1
# Records that do not count toward a file's changes (besides commit markers): resync and park markers.
_UNCOUNTED_OPS = (COMMIT, "S", "P")


class LandingWriter:
    """Buffers records into landing files on local spool disk and publishes them by LSN range.

    ``format``: ``jsonl`` (v1, gzip JSON lines) or ``changes`` (v2, an Arrow IPC stream,
    :mod:`loader.landing.changefile`). Memory stays bounded: records stream into a compressed temp
    file (v1: every thousand lines; v2: every ``changefile.BATCH_RECORDS`` records, one Arrow
    batch); a file is closed after ``max_changes`` changes even inside a transaction (after the
    commit marker when it comes next).
    """

    def __init__(
        self, store: LandingStore, max_changes: int, spool_dir: Path | None = None, format: str = JSONL
    ) -> None:
        if format not in (JSONL, *STREAM_FORMATS):
            raise ValueError(f"landing writer format {format!r}: 'jsonl', 'changes' or 'tables'")
        self.store = store
        self.max_changes = max_changes
        self.spool_dir = spool_dir
        self.format = format
        self._tmp: Path | None = None
        self._gz: gzip.GzipFile | None = None
        self._arrow: Any = None  # the changefile.Spool (v2) or tablefile.Spool (v3) of the open file
        self._spool: IO[bytes] | None = None
        self._first: ChangePosition | None = None
        self._last: tuple[ChangePosition, bool] | None = None  # the open file's last record: position, is commit
        self._count = 0
        self._records = 0
        self._tables: dict[str, int] = {}
        self._pending: list[bytes] = []  # encoded lines (v1) not yet handed to the compressor
        self._cut_due = False  # the open file is full: closed at the next record
        self.published: list[str] = []

    @property
    def _open(self) -> bool:
        return self._spool is not None

    def write(self, record: ChangeRecord, qualified: str | None = None) -> None:
        """Append a record (``qualified``: its ``schema.table``, when the caller has it)."""
        if self._cut_due:
            # A file full at a transaction's last change takes the commit marker that follows, so
            # it ends the transaction (name ``_c``) and the load can cut a batch after it.
            self._cut_due = False
            if record.op == COMMIT and self._open:
                if self._arrow is None:
                    self._pending.append(record.to_json_bytes())
                else:
                    self._arrow.add(record)
                self._records += 1
                self._last = (record.position, True)
                self.close_file()
                return
            self.close_file()
        if not self._open:
            self._start_file(record.position)
        if self._arrow is None:
            pending = self._pending
            pending.append(record.to_json_bytes())
            if len(pending) >= 1024:
                self._flush_pending()
        else:
            self._arrow.add(record)
        self._records += 1
        op = record.op
        self._last = (record.position, op == COMMIT)
        if op != COMMIT:
            if op not in _UNCOUNTED_OPS:  # markers do not count toward a file's changes
                self._count += 1
            t = qualified if qualified is not None else record.qualified_table
            tables = self._tables
            tables[t] = tables.get(t, 0) + 1
        if self._count >= self.max_changes:
            self._cut_due = True  # at the next record: after it if it is the commit marker

    def write_batch(self, batch: Any, tables: Any, shapes: Any = None) -> list[int]:
        """Append the records of ``batch`` (a v2 change-file batch, decoded schema; ``tables``: each
        record's ``schema.table``, null for commit markers), exactly as :meth:`write` would one by
        one: the same files, cut at the same records, with the same bytes. Only for v2 and v3 files.
        ``shapes``: each record's shape number from capture's parser, if it has them (a v3 file's
        split uses them: :meth:`loader.landing.tablefile.Spool.add_batch`).

        Returns, for each file this closed, the index of its last record in ``batch`` (-1: the
        file ended before the batch)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        assert self.format in STREAM_FORMATS
        n = batch.num_rows
        ops = batch.column(0)
        counted = pc.invert(pc.is_in(ops, value_set=pa.array(_UNCOUNTED_OPS))).to_numpy(zero_copy_only=False)
        commits = pc.equal(ops, COMMIT).to_numpy(zero_copy_only=False)
        lsns = batch.column(1).to_numpy()
        seqs = batch.column(2).to_numpy()
        at = 0
        closed: list[int] = []
        while at < n:
            if self._cut_due:
                self._cut_due = False
                if commits[at] and self._open:
                    self._append(batch, tables, shapes, at, at + 1, lsns, seqs, commits, 0)
                    self.close_file()
                    closed.append(at)
                    at += 1
                    continue
                if self.close_file() is not None:
                    closed.append(at - 1)
            if not self._open:
                self._start_file(ChangePosition(int(lsns[at]), int(seqs[at])))
            # Up to the record that fills the file, if it is in this batch.
            room = self.max_changes - self._count
            running = np.cumsum(counted[at:])
            full = int(np.searchsorted(running, room)) if room > 0 else 0
            end = n if full >= n - at else at + full + 1
            taken = int(running[end - at - 1]) if end > at else 0
            self._append(batch, tables, shapes, at, end, lsns, seqs, commits, taken)
            at = end
            if self._count >= self.max_changes:
                self._cut_due = True
        return closed

    def _append(
        self,
        batch: Any,
        tables: Any,
        shapes: Any,
        start: int,
        end: int,
        lsns: Any,
        seqs: Any,
        commits: Any,
        counted: int,
    ) -> None:
        import pyarrow.compute as pc

        assert self._arrow is not None
        if shapes is not None and self.format == TABLES:
            self._arrow.add_batch(batch.slice(start, end - start), shapes[start:end])
        else:
            self._arrow.add_batch(batch.slice(start, end - start))
        self._records += end - start
        self._count += counted
        last = end - 1
        self._last = (ChangePosition(int(lsns[last]), int(seqs[last])), bool(commits[last]))
        counts = pc.value_counts(tables.slice(start, end - start).drop_null())
        mine = self._tables
        for name, k in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist()):
            mine[name] = mine.get(name, 0) + k

    def _start_file(self, first: ChangePosition) -> None:
        self._open_spool()
        self._first = first
        self._count = 0
        self._records = 0
        self._tables = {}

    def _open_spool(self) -> None:
        suffix = _SUFFIX[self.format]
        fd, tmp = tempfile.mkstemp(suffix=suffix, dir=self.spool_dir)  # mode 0600
        self._tmp = Path(tmp)
        self._spool = os.fdopen(fd, "wb")  # closed in _close_spool, after the writer on it
        if self.format in STREAM_FORMATS:
            self._arrow = _arrow_module(self.format).Spool(self._spool)
        else:
            # No name and no time in the gzip header: a re-capture writes byte-identical files.
            self._gz = igzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=self._spool, mtime=0)

    def drain(self, into: list[str], point: str, on_published: Callable[[str], None] | None) -> None:
        """Hand the files published so far to ``into`` (and ``on_published``), each after the
        fault-injection checkpoint ``point``."""
        while self.published:
            name = self.published.pop(0)
            into.append(name)
            checkpoint(point)
            if on_published is not None:
                on_published(name)

    def close_file(self) -> str | None:
        """Publish the open file, if any; returns its name."""
        self._cut_due = False
        if not self._open:
            return None
        arrow = self._arrow
        self._close_spool()
        last = self._last
        assert self._tmp is not None and self._first is not None and last is not None
        name = LandingFile.name_for(self._first, last[0], last[1], self.format)
        final = self._tmp.with_suffix(".final")
        tables = dict(sorted(self._tables.items()))
        try:
            with open_private(final) as out:
                if self.format == TABLES:
                    arrow.finish(self._tmp, tables, self._records, out)
                elif arrow is not None:
                    from loader.landing import changefile

                    changefile.Spool.finish(self._tmp, changefile.ChangeHeader(tables, self._records), out)
                else:
                    # The header is its own gzip member in front of the records (gzip readers
                    # concatenate members), so a file cut short anywhere after it still says
                    # which tables it held.
                    header = FileHeader(tables).to_json().encode("utf-8") + b"\n"
                    out.write(igzip.compress(header, compresslevel=GZIP_LEVEL, mtime=0))
                    with open(self._tmp, "rb") as body:
                        while chunk := body.read(1 << 20):
                            out.write(chunk)
            self.store.publish(final, name)
        finally:
            final.unlink(missing_ok=True)
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
        self.published.append(name)
        return name

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        # One compressor call per thousand lines: GzipFile.write has a fixed cost per call.
        assert self._gz is not None
        self._pending.append(b"")
        self._gz.write(b"\n".join(self._pending))
        self._pending.clear()

    def _close_spool(self) -> None:
        if self._arrow is None:
            self._flush_pending()
        if self._arrow is not None:
            self._arrow.close()
        elif self._gz is not None:
            self._gz.close()  # GzipFile does not close a file object it was given
        self._arrow = self._gz = None
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def abort(self) -> None:
        self._cut_due = False
        self._pending.clear()
        if self._open:
            self._close_spool()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        self._tmp = None


def publish_arrow(store: LandingStore, header: Any, first_seq: int, columns: list[Any]) -> str:
    """Write one v2 file to a private spool file and publish it atomically in ``store`` (a
    LandingStore), named by the positions of its first and last record; returns the name."""
    import os
    import tempfile

    from loader.landing.arrowfile import EXTENSION, write_file
    from loader.lsn import ChangePosition

    marker, commit = header.resync_record(), header.commit_record()
    if marker is not None:
        start = marker.position
    elif header.rows:
        start = ChangePosition(header.commit_lsn, first_seq)
    else:
        assert commit is not None, "a v2 file holds a row or a marker"
        start = commit.position
    end = commit.position if commit is not None else ChangePosition(header.commit_lsn, first_seq + header.rows - 1)
    if header.rows == 0 and commit is None:
        assert marker is not None
        end = marker.position
    name = LandingFile.name_for(start, end, commit is not None, ARROW)
    fd, tmp = tempfile.mkstemp(suffix=EXTENSION)  # mode 0600
    os.close(fd)
    try:
        write_file(Path(tmp), header, first_seq, columns)
        store.publish(Path(tmp), name)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return name
