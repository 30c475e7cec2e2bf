"""Typed configuration: one TOML file plus ``LOADER_*`` environment overrides.

Precedence (highest first): keyword arguments, environment (``LOADER_SECTION__KEY``, for example
``LOADER_SOURCE__DSN``), the TOML file (``--config`` or ``LOADER_CONFIG``), the defaults below.
The defaults are the embedded setup: a private PostgreSQL on 127.0.0.1:25432 that holds both the
source database and the Iceberg JDBC catalog, a warehouse and a landing area under ``.state/``.
Unknown keys (every section forbids extras) and unknown ``LOADER_*`` variables are errors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from loader.errors import ConfigError

# The --config file of the settings being built; a context variable, not os.environ, so one
# process can build settings from several files without leaking one into child processes.
_config_file: ContextVar[str | None] = ContextVar("loader_config_file", default=None)


_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/:@\s]*:)(?P<secret>[^@/\s]*)(?P<tail>@)")
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every password of a URL (``scheme://user:secret@host``) or a libpq
    ``key=value`` DSN (``password=secret``) replaced by ``***``. Use it on anything shown."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}***{m['tail']}", text)
    return _KV_PASSWORD.sub(lambda m: f"{m['head']}***", text)


def secret_text(value: SecretStr | str | None) -> str | None:
    """The text of a secret setting (settings built in code with model_copy may hold a plain str)."""
    if value is None:
        return None
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def _merge_password(dsn: str, password: SecretStr | None) -> str:
    if password is None:
        return dsn
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, password=secret_text(password))


class _Section(BaseModel):
    """A settings section: a key it does not know (a typo in the TOML file or a ``LOADER_*``
    variable) is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid")


class _Redacted(_Section):
    """Settings sections whose connection strings may embed passwords: never shown in repr."""

    _redacted_fields: tuple[str, ...] = ()

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact(value) if name in self._redacted_fields and isinstance(value, str) else value)


def state_dir() -> Path:
    """Where embedded state (landing files, warehouse, cluster) lives: LOADER_HOME or ./.state."""
    return Path(os.environ.get("LOADER_HOME", Path.cwd() / ".state")).resolve()


class S3Settings(_Section):
    """S3 access shared by the landing area and the warehouse (Python and JVM side)."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    region: str = "us-east-1"
    path_style: bool = True
    # Spark's S3A client (a warehouse on S3): tries of one request and how long a connection or a
    # response may take, so that an S3 outage fails a Spark stage within minutes, as a transient
    # error (the next run or follow cycle tries again), instead of hanging for hours in nested
    # retries (S3A's defaults: 20 SDK attempts inside 7 S3A retries, reads waiting up to 200 s).
    # Any fs.s3a.* key in spark.conf still overrides these.
    jvm_request_attempts: int = Field(default=3, ge=1)
    jvm_connect_timeout_s: float = Field(default=5.0, gt=0)
    jvm_read_timeout_s: float = Field(default=60.0, gt=0)


class SourceSettings(_Redacted):
    """The PostgreSQL database whose changes are captured."""

    _redacted_fields = ("dsn",)
    # URL or key=value libpq string. Prefer keeping the password out of it: ``password`` below,
    # PGPASSWORD or a .pgpass file; a password inside it is accepted and never shown.
    dsn: str = "postgresql://postgres@127.0.0.1:25432/app"
    password: SecretStr | None = None
    slot: str = "lakehouse"
    # Logical decoding plugin: wal2json (default), or pgoutput (built into PostgreSQL, on every managed
    # service; keeps numeric/float NaN and Infinity, which wal2json 2.5 prints as null; needs a publication).
    plugin: Literal["wal2json", "pgoutput"] = "wal2json"
    publication: str = "lakehouse"
    include: list[str] = Field(default_factory=lambda: ["*.*"])
    exclude: list[str] = Field(default_factory=lambda: ["pg_catalog.*", "information_schema.*"])
    # A landing file is closed after this many changes, even inside a transaction (bounded memory).
    max_changes_per_file: int = 50_000
    # Changes fetched from the slot per round trip of the server-side cursor.
    fetch_size: int = 5_000
    # Creating a logical slot (the first capture, every resync's temporary slot) waits until every
    # transaction in progress when it began has ended: a session left idle in a transaction, or a
    # forgotten prepared transaction, holds it forever. Capture names them in a warning after 10 s
    # (then every minute) and gives up after this many seconds, naming them (None: wait).
    slot_create_timeout_s: float | None = Field(default=900.0, gt=0)
    # A capture whose backlog is at least this many MB of WAL has a fetcher process consume a
    # temporary copy of the slot in rounds (loader/capture/stream.py), so the server decodes the
    # next round while this process lands the last; smaller backlogs peek (the fetcher takes ~0.3 s
    # to start). Negative: always peek.
    pipeline_min_lag_mb: float = 16.0
    # Plugin rows of the first round of the pipelined read (whole transactions: a round may hold
    # more); a round that comes back full doubles the next, up to 16 times this (stream.py).
    pipeline_round_rows: int = 100_000
    # During a pipelined read the slot is advanced to the last published file at most this often
    # (and always at the read's end): each advance makes the server decode again from the slot's
    # restart position. A crash re-reads at most this long of changes (the landed position skips
    # them) and the slot holds that much more WAL. 0: after every file.
    confirm_interval_s: float = 5.0
    # Rows per chunk of an initial snapshot (``loader backfill snapshot``); a resumed snapshot
    # restarts at most this much work.
    snapshot_chunk_rows: int = 50_000
    # Landing format of snapshot files: "arrow" (landing v2, one Arrow IPC stream per chunk read
    # through ADBC's COPY BINARY and loaded column by column: schemas/landing-snapshot.v2.md) or
    # "jsonl" (landing v1, gzip JSON lines, as before).
    snapshot_format: Literal["jsonl", "arrow"] = "arrow"
    # Landing format of the change stream's files: "tables" (landing v3, each table's changes in
    # columns of their own: schemas/landing-change.v3.md), "arrow" (landing v2, one Arrow IPC
    # stream of records per file: schemas/landing-change.v2.md) or "jsonl" (landing v1, gzip JSON
    # lines). Every consumer reads all three, and they may share a landing area.
    stream_format: Literal["jsonl", "arrow", "tables"] = "tables"
    # With stream_format "tables" or "arrow", a pipelined read decodes blocks of plain wal2json rows in columns
    # (Arrow's JSON reader, loader/capture/wal2json_arrow.py) instead of one row at a time; the same
    # records and the same bytes either way. False: every row through the row decoder.
    columnar_decode: bool = True
    # While a snapshot or resync copies, the stream is captured (and the slot confirmed) between
    # chunks at most this many seconds apart, so a long copy does not hold the WAL of everything
    # written meanwhile; the load waits for the snapshot's commit before loading what came after it.
    # 0: after every chunk; negative: never (the slot then holds all the WAL written during the copy).
    snapshot_drain_interval_s: float = 10.0
    # Resync a table automatically when capture sees it changed without row changes in the WAL
    # (ADD COLUMN with a default, ALTER TYPE ... USING, renames, SET LOGGED, identity restored, ...).
    auto_resync: bool = True
    # Also resync after a bare table rewrite (VACUUM FULL, CLUSTER, TRUNCATE, SET TABLESPACE): the catalog
    # cannot tell those from ALTER COLUMN ... TYPE ... USING with the same type, which changes values.
    resync_on_table_rewrite: bool = True
    # DDL in the stream (loader.capture.ddl): where the role may (superuser, rds_superuser), capture
    # installs an event trigger that emits each table DDL as a transactional logical message, so it
    # lands at its exact position (fast defaults and rewrites on tables created since the last run;
    # TRUNCATE, VACUUM FULL and CLUSTER told apart from ALTER ... USING). false: catalog comparison only.
    ddl_trigger: bool = True
    # Declaratively partitioned tables: "root" lands every partition's changes as changes of the
    # partitioned table (one history and one current table, as users query it); "leaf" keeps each
    # partition a table of its own.
    partitions: Literal["root", "leaf"] = "root"
    # When the slot is lost (dropped, invalidated by max_slot_wal_keep_size, consumed elsewhere): "fail"
    # (exit 1 naming 'loader resync'), or "resync" (re-create it and resync every table, unattended).
    on_slot_loss: Literal["fail", "resync"] = "fail"
    # A heartbeat (a transactional logical message, loader.capture.heartbeat) sent through the slot:
    # every ``loader capture`` run emits one, follow mode at most this often (seconds) and also
    # when nothing else happens. Capture confirms the slot past it, so the slot stops holding WAL
    # that other databases or excluded tables wrote; status shows when the last one came back.
    # 0: off (the slot is then confirmed only up to the last change captured).
    heartbeat_interval_s: float = Field(default=10.0, ge=0)

    def conninfo(self) -> str:
        """The connection string with the password merged in (for connecting, never for showing)."""
        return _merge_password(self.dsn, self.password)


class LandingSettings(_Section):
    """Where capture writes landing files: a local directory or s3://bucket/prefix."""

    url: str = Field(default_factory=lambda: (state_dir() / "landing").as_uri())
    # Landing files larger than this go to S3 as a multipart upload (parts of this size, min 5).
    multipart_threshold_mb: int = 64
    # Transient failures (throttling, timeouts, resets, I/O errors) are retried this many times
    # with exponential backoff capped at retry_max_wait_s, then the run fails with nothing marked done.
    retry_attempts: int = 6
    retry_max_wait_s: float = 20.0
    # The most one landing file (or one file given to `loader import`) may decompress to; past it,
    # reading stops with an error naming the file (a gzip bomb must not exhaust an executor's memory).
    # Capture's files hold source.max_changes_per_file changes: far below this.
    max_decompressed_mb: int = Field(default=4096, ge=1)
    # Landing files loaded into history more than this long ago are retired by 'loader maintain'
    # (and follow mode's maintenance); 'backfill replay' reaches back only this far. None: keep all.
    retention_hours: float | None = Field(default=168.0, gt=0)


class CatalogSettings(_Redacted):
    """The Iceberg catalog shared by Spark, pyiceberg and dbt."""

    _redacted_fields = ("uri",)
    name: str = "lakehouse"
    # SQLAlchemy-style URI of the JDBC catalog database (PostgreSQL or SQLite). The password may be
    # given separately (``password``), and is never shown either way.
    uri: str = "postgresql://postgres@127.0.0.1:25432/iceberg_catalog"
    password: SecretStr | None = None
    warehouse: str = Field(default_factory=lambda: (state_dir() / "warehouse").as_uri())
    history_namespace: str = "history"
    current_namespace: str = "current"
    loader_namespace: str = "loader"

    def secret(self) -> str | None:
        """The catalog database password: ``password``, else the one inside ``uri``."""
        from urllib.parse import unquote, urlparse

        if self.password is not None:
            return secret_text(self.password)
        embedded = urlparse(self.uri).password
        return unquote(embedded) if embedded else None

    def conninfo(self) -> str:
        """The catalog database connection string (psycopg), password merged in."""
        return _merge_password(self.uri, self.password)


class SparkSettings(_Section):
    """How the loader starts Spark when it is not given a session by spark-submit."""

    master: str = "local[2]"
    shuffle_partitions: int = 4
    # Tables loaded and merged at once (driver threads, each with its own Spark jobs and commit).
    # A small table's load or merge is mostly job scheduling and commit latency, so a cycle over
    # several changed tables overlaps them; 1 processes tables one after another.
    table_threads: int = Field(default=8, ge=1, le=64)
    driver_memory: str = "2g"
    # Extra jars (comma-separated paths or URLs, or a JSON list): S3A / AWS SDK jars for a warehouse
    # on s3:// where the platform does not provide them ('make s3a-jars' fetches them into .state/jars).
    extra_jars: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("extra_jars", mode="before")
    @classmethod
    def _split_jars(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [p.strip() for p in text.split(",") if p.strip()]
        return value

    # Override the JDBC driver jar of the catalog database; found from Debian's packages by default.
    jdbc_driver_jar: str | None = None
    # Override the Iceberg Spark runtime jar; found in the installed Python package by default.
    iceberg_jar: str | None = None

    @field_validator("extra_jars", "jdbc_driver_jar", "iceberg_jar")
    @classmethod
    def _no_plain_http(cls, value: Any) -> Any:
        # Code the JVM runs: fetched over plain http, anyone on the path can replace it. (The URL is
        # not repeated: it may hold credentials.)
        for jar in value if isinstance(value, list) else [value] if value else []:
            if jar.strip().lower().startswith("http://"):
                raise ValueError(
                    "a jar given as an http:// URL is refused (anyone on the network path could replace "
                    "the code Spark runs): use https:// or a local path"
                )
        return value

    conf: dict[str, str] = Field(default_factory=dict)


class FollowSettings(_Section):
    """``loader run --follow``: one long-lived process cycling capture -> load -> merge."""

    interval_s: float = 2.0  # a load + merge cycle starts at most this often
    capture_interval_s: float = 1.0  # the capture thread's pause between runs
    # Each cycle first asks the capture thread for a run and waits for it at most this long, so it
    # loads what was committed before it started (not only what the last timed run landed); 0: off.
    capture_wait_s: float = Field(default=5.0, ge=0)
    max_batch_files: int = 200  # landing files per load (a transaction longer than this goes whole)
    metrics_port: int | None = None  # Prometheus metrics on 127.0.0.1:<port>; None: off
    metrics_host: str = "127.0.0.1"


class MaintenanceSettings(_Section):
    """``loader maintain``, and the policy follow mode applies on its own."""

    every_minutes: float = 60.0  # follow mode runs maintenance this often
    # Snapshots older than this are expired (the newest retain_last are always kept).
    snapshot_retention_hours: float = 24.0
    retain_last: int = 5
    # And at most this many are kept per table, whatever their age (None: no cap): every commit
    # rewrites the table's metadata file, which lists every snapshot, so a table that follow mode
    # commits each cycle (about 1,800 an hour) would otherwise make its commits, and every reader's
    # table load, slower by the hour until snapshot_retention_hours expires them. The cap never
    # expires a snapshot younger than snapshot_min_age_minutes (a running query may read it). Follow
    # mode also expires a table on its own after a quarter of the cap's commits to it.
    max_snapshots: int | None = Field(default=500, ge=1)
    snapshot_min_age_minutes: float = Field(default=30.0, ge=0)
    # Files no snapshot references, older than this, are deleted (never younger: a writer may be
    # about to commit them).
    orphan_older_than_hours: float = 72.0
    # Compaction: rewrite when a partition has at least this many small files; aim at this size.
    min_input_files: int = 5
    target_file_mb: int = 128


class VerifySettings(_Section):
    """Continuous verification in follow mode (``loader verify`` by hand needs none of this)."""

    enabled: bool = True
    every_minutes: float = Field(default=10.0, gt=0)  # a round at most this often
    # A round verifies tables in turn (rolling through all of them across rounds) until this
    # much time is spent; at least one table per round.
    budget_s: float = Field(default=30.0, gt=0)
    # A table found different is resynced by the next capture (its current state replaced).
    auto_repair: bool = False


class RetrySettings(_Section):
    """Outages of the source or the catalog database (refused, reset, restarting, failing over, full)."""

    # A one-shot command is retried whole this many times, with exponential backoff (random, up to
    # 0.5 s x 2^n) capped at max_wait_s, then exits 75 naming the server; follow mode keeps cycling.
    attempts: int = Field(default=6, ge=1)
    max_wait_s: float = Field(default=20.0, ge=0)


class LockSettings(_Section):
    """How a stage meets another process already running it (see loader.locks)."""

    # Wait this long for the other 'loader load' / 'loader merge' to finish; 0 fails at once.
    wait_seconds: float = 0.0


class MergeSettings(_Section):
    """Layout of the current tables (see README: cost follows the change)."""

    # Current tables are partitioned by bucket(key_buckets, first key column). Every merge writes a
    # data file and a delete file per bucket its keys touch, and a few hundred random keys touch
    # every bucket, so each bucket costs every later merge a file or two to read until compaction:
    # 2 (the cores of a small machine) measured faster than 16 in every benchmark (README,
    # Performance). More buckets pay off only when increments are a handful of keys.
    key_buckets: int = Field(default=2, ge=1, le=1024)
    # Every this many merges of a table, the merge compacts its current table (data files rewritten
    # with their deletes applied): each merge adds up to one data and one delete file per touched
    # bucket, and every later merge reads them all. 0: only ``loader maintain`` compacts.
    compact_every: int = 10
    # A merge's compaction rewrites every data file that has deletes (the table's size in work)
    # only once the rows deleted reach this share of the rows its data files hold; before that it
    # combines the small files merges wrote and rewrites the delete files into one per bucket (the
    # changes' size in work), so a big table's compaction no longer stalls a follow cycle.
    # 0: a full rewrite every time (the loader before 2026-11-29).
    compact_deleted_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    # Plain increments (no truncate/resync/park, no unsent TOAST values, no key changes, integer
    # or text keys) of up to this many history rows are merged on the driver with Arrow, without a
    # Spark job (loader.merge.driver); the driver holds them and reads the current table's key
    # columns batch by batch (current tables above 250x this many rows go to Spark). 0: never.
    driver_max_rows: int = Field(default=200_000, ge=0)


class LoadSettings(_Section):
    """The history load (see README: Performance, the eighth round)."""

    # Batches in which nothing is unusual (see loader.load.driver: intact files, row changes only,
    # values Arrow types as Spark does) are read, typed and appended on the driver with Arrow,
    # without a Spark job, in groups of up to this many bytes of landing text, each cut after a file
    # that ends a transaction (loader.load.driver.plain_groups); the next group is read and
    # checked on a second thread while one is typed and written (driver.checked_ahead): the driver
    # holds about four groups' worth in memory; one transaction longer than this is read again file
    # by file as its rows are written (StreamedPlainBatch). A group that is not plain goes to the Spark path. 0: never. Outages of the landing area or the warehouse during
    # a driver load are the same transient errors (exit 75) as on the Spark path.
    driver_max_bytes: int = Field(default=64 << 20, ge=0)
    # A group's rows are written to data files as soon as it is typed; the groups' commits (one per
    # history table, then the ledger) wait for the groups after them up to this many seconds (and
    # are always made before a DDL change, a batch the Spark path loads, and when the load ends):
    # a backlog pays the commits' metadata work once per interval, not once per group, and its
    # tables gather one snapshot per interval. A load killed before a commit loses at most this
    # much work (its files are orphans, nothing is marked loaded); one killed between the tables'
    # commits and the ledger's sends the groups of that commit through the Spark path's anti-join
    # on the next load: a few seconds bound both (a second of groups already takes nearly all of
    # the commits' cost away). 0: commit every group.
    commit_interval_s: float = Field(default=5.0, ge=0)


class DbtSettings(_Section):
    """The dbt project run by ``loader dbt`` (views, change-log, SCD2, compliance audits)."""

    # The project shipped in the repository by default; generated sources/models go to work_dir.
    project_dir: str | None = None
    # Where the runnable copy of the project (generated sources and models, target/, logs/) lives;
    # default <state>/dbt/<catalog>.
    work_dir: str | None = None
    # Namespace (dbt schema) of the models, in the same catalog as history and current.
    analytics_namespace: str = "analytics"
    target: str = "session"  # session (in-process Spark) or thrift (the Spark Thrift Server)
    threads: int = 2
    # "schema.table" -> columns holding personal data: tagged pii, audited for retention in history.
    pii_columns: dict[str, list[str]] = Field(default_factory=dict)
    pii_retention_days: int = 365
    # Subject type -> "schema.table.column" holding that subject's id (audited against the
    # erased_subjects seed).
    subject_columns: dict[str, list[str]] = Field(default_factory=dict)
    # `dbt source freshness`: a table whose newest change committed longer ago than this warns /
    # errors (loaded_at_field pg_txn_timestamp: source activity, so set them to what the source's
    # quietest table allows; None leaves the threshold out).
    freshness_warn_hours: int | None = Field(default=24, ge=1)
    freshness_error_hours: int | None = Field(default=None, ge=1)


class SqlServerSettings(_Redacted):
    """The Spark Thrift Server started by ``loader sql-server`` (JDBC/ODBC for BI tools).

    It starts only with authentication and TLS (or with an explicit ``--no-auth``, for a local test).
    """

    _redacted_fields = ("catalog_uri",)
    host: str = "127.0.0.1"
    port: int = 10000
    # The user name `loader dbt --target thrift` and the printed beeline command log in as, and the
    # password dbt sends (LOADER_SQL_SERVER__CLIENT_PASSWORD).
    user: str = "loader"
    client_password: SecretStr | None = None
    driver_memory: str = "2g"
    # How clients are authenticated: "password" (a file of salted PBKDF2 hashes, managed with
    # 'loader sql-server add-user'), or "ldap" (HiveServer2's LDAP bind: ldap_url, ldap_base_dn or
    # ldap_user_dn_pattern).
    auth: Literal["password", "ldap"] = "password"
    password_file: str | None = None  # default <state>/sql-server/passwords
    ldap_url: str | None = None
    ldap_base_dn: str | None = None
    ldap_user_dn_pattern: str | None = None
    # TLS: a Java keystore (PKCS12 or JKS) holding the server's key and certificate, and its password
    # (LOADER_SQL_SERVER__TLS_KEYSTORE_PASSWORD); 'loader sql-server --self-signed-tls' makes one.
    tls_keystore: str | None = None
    tls_keystore_password: SecretStr | None = None
    # The truststore Java clients verify the server with (only shown in the printed connection commands).
    tls_truststore: str | None = None
    # PEM certificate(s) Python clients (`loader dbt --target thrift`) verify the server with; unset:
    # the system's CAs. For --self-signed-tls: <state>/sql-server/tls/server.pem.
    tls_ca_file: str | None = None
    # A catalog login for the server that can read but not write (see README, "SQL for BI tools"):
    # a PostgreSQL role with SELECT on the Iceberg catalog tables. Unset: the loader's own login.
    catalog_uri: str | None = None
    catalog_password: SecretStr | None = None
    # Read-only S3 credentials for the warehouse. Unset: the loader's own (s3.*).
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None


class LoaderSettings(BaseSettings):
    """All loader settings; see README 'Configuration' for each key."""

    model_config = SettingsConfigDict(env_prefix="LOADER_", env_nested_delimiter="__", extra="forbid", toml_file=None)

    source: SourceSettings = Field(default_factory=SourceSettings)
    landing: LandingSettings = Field(default_factory=LandingSettings)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    merge: MergeSettings = Field(default_factory=MergeSettings)
    locks: LockSettings = Field(default_factory=LockSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    follow: FollowSettings = Field(default_factory=FollowSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    dbt: DbtSettings = Field(default_factory=DbtSettings)
    sql_server: SqlServerSettings = Field(default_factory=SqlServerSettings)
    s3: S3Settings = Field(default_factory=S3Settings)

    @model_validator(mode="after")
    def _groups_committed_before_orphans_expire(self) -> LoaderSettings:
        """A load's data files wait up to load.commit_interval_s for their commit; orphan cleanup
        deletes unreferenced files older than maintenance.orphan_older_than_hours, so a wait that
        long could let maintenance delete files a commit is about to name."""
        if self.load.commit_interval_s * 4 > self.maintenance.orphan_older_than_hours * 3600:
            raise ValueError(
                f"load.commit_interval_s ({self.load.commit_interval_s:g}) must stay under a quarter of"
                f" maintenance.orphan_older_than_hours ({self.maintenance.orphan_older_than_hours:g} h):"
                " orphan cleanup could delete data files a load has written and not yet committed"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file.get() or os.environ.get("LOADER_CONFIG")
        if path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


# ``LOADER_*`` variables that are not settings: read by the loader itself, or by its test suite and
# benchmarks (so a shell that runs both does not trip over them).
OTHER_VARIABLES = frozenset(
    {
        "LOADER_CONFIG",
        "LOADER_HOME",
        "LOADER_LOG_LEVEL",
        "LOADER_LOG_FORMAT",
        "LOADER_FAULT",
        "LOADER_PAUSE",
        "LOADER_KEYSTORE_PASSWORD",
        "LOADER_TRUSTSTORE_PASSWORD",
        "LOADER_TEST_PG",
        "LOADER_BENCH_PG",
        "LOADER_SOAK",
        "LOADER_SOAK_CYCLES",
        "LOADER_SOAK_MAINTAIN_EVERY",
        "LOADER_PROPERTY_EXAMPLES",
    }
)


def known_variables() -> tuple[frozenset[str], frozenset[str]]:
    """(every ``LOADER_*`` variable the loader reads, the prefixes of dict settings' entries)."""
    names = set(OTHER_VARIABLES)
    dict_prefixes = set()
    for section, field in LoaderSettings.model_fields.items():
        head = f"LOADER_{section.upper()}"
        names.add(head)
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for key, sub in model.model_fields.items():
            names.add(f"{head}__{key.upper()}")
            if getattr(sub.annotation, "__origin__", None) is dict:
                dict_prefixes.add(f"{head}__{key.upper()}__")
    return frozenset(names), frozenset(dict_prefixes)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Fail on a ``LOADER_*`` variable the loader does not read (a typo would otherwise be ignored)."""
    import difflib

    names, dict_prefixes = known_variables()
    env = os.environ if environ is None else environ
    for var in sorted(env):
        upper = var.upper()
        if not upper.startswith("LOADER_") or upper in names or upper.startswith(tuple(dict_prefixes)):
            continue
        close = difflib.get_close_matches(upper, sorted(names), n=1, cutoff=0.6)
        raise ConfigError(
            f"unknown environment variable {var}" + (f": did you mean {close[0]}?" if close else ""),
            hint="settings are named LOADER_<SECTION>__<KEY>, see README 'Configuration'",
        )


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> LoaderSettings:
    """Build settings from an optional TOML file, the environment and explicit overrides.

    Unknown keys (in the file or as ``LOADER_*`` variables) and a file that is not TOML are
    configuration errors naming the key, variable or file and line."""
    import tomllib

    check_environment()
    path_text = str(config_file) if config_file is not None else os.environ.get("LOADER_CONFIG")
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist", hint="pass an existing TOML file to --config")
    token = _config_file.set(str(Path(config_file).resolve()) if config_file is not None else None)
    try:
        return LoaderSettings(**overrides)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {path_text} is not valid TOML: {exc}", hint="fix the file at that line"
        ) from None
    except ValidationError as exc:
        # Without the input values: a bad DSN or key must not print the secret next to it.
        problems = "; ".join(_problem(e) for e in exc.errors(include_input=False, include_url=False))
        where = f" (from {path_text} or LOADER_* variables)" if path_text else ""
        raise ConfigError(f"invalid configuration{where}: {problems}", hint="see README 'Configuration'") from None
    except Exception as exc:
        raise ConfigError(f"invalid configuration: {redact(str(exc))}", hint="see README 'Configuration'") from None
    finally:
        _config_file.reset(token)


def _problem(error: Any) -> str:
    """One validation error; an unknown key with the section's closest known key."""
    import difflib

    loc = [str(p) for p in error["loc"]]
    if error["type"] != "extra_forbidden":
        return f"{'.'.join(loc)}: {error['msg']}"
    model: Any = LoaderSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        model = field.annotation if field is not None else None
    known = sorted(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    return f"unknown key {'.'.join(loc)}" + (f" (did you mean {'.'.join([*loc[:-1], close[0]])}?)" if close else "")


def executor_settings_json(settings: LoaderSettings) -> str:
    """Settings for code that runs in Spark executors: no passwords, no keys (see loader.spark)."""
    safe = settings.model_copy(
        update={
            "source": settings.source.model_copy(update={"dsn": "", "password": None}),
            "catalog": settings.catalog.model_copy(update={"uri": "", "password": None}),
            "s3": settings.s3.model_copy(update={"access_key_id": None, "secret_access_key": None}),
        }
    )
    return safe.model_dump_json()
