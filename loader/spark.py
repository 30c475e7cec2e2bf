"""The only place that builds a SparkSession: jars, Iceberg extensions, the shared catalog, S3.

Jars are located at run time: the Iceberg runtime inside the installed
``snowpark-connect-deps-iceberg`` package, the JDBC driver of the catalog database from
configuration or the operating system's Java package directory. On a cluster, give the same
settings with ``loader spark-conf`` (it prints the ``--jars``/``--conf`` for spark-submit).
"""

from __future__ import annotations

import importlib.resources
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from loader.config import LoaderSettings, redact, secret_text
from loader.errors import ConfigError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Directories where distributions install Java libraries (Debian: libpostgresql-jdbc-java).
_JAVA_LIB_DIRS = ("/usr/share/java", "/usr/local/share/java", "/usr/lib/java")


def log4j_config() -> str:
    """The JVM's log configuration: errors only, in the format of the loader's own log lines
    (text, or JSON under ``--log-format json``), with zoned times."""
    from loader.logs import log_format

    name = "json.properties" if log_format() == "json" else "text.properties"
    return str(Path(str(importlib.resources.files("loader") / "log4j" / name)))


def iceberg_runtime_jar(settings: LoaderSettings) -> str:
    if settings.spark.iceberg_jar:
        return settings.spark.iceberg_jar
    try:
        jars = importlib.resources.files("snowpark_connect_deps_iceberg") / "jars"
        found = sorted(str(p) for p in Path(str(jars)).glob("iceberg-spark-runtime-3.5_2.12-*.jar"))
    except ModuleNotFoundError:
        found = []
    if not found:
        raise ConfigError(
            "Iceberg Spark runtime jar not found",
            hint="pip install snowpark-connect-deps-iceberg==1.0.2 or set LOADER_SPARK__ICEBERG_JAR",
        )
    return found[-1]


def jdbc_driver_jar(settings: LoaderSettings) -> str:
    if settings.spark.jdbc_driver_jar:
        return settings.spark.jdbc_driver_jar
    scheme = catalog_scheme(settings)
    name = "postgresql.jar" if scheme == "postgresql" else "sqlite-jdbc.jar"
    for d in _JAVA_LIB_DIRS:
        candidate = Path(d) / name
        if candidate.exists():
            return str(candidate)
    pkg = "libpostgresql-jdbc-java" if scheme == "postgresql" else "libxerial-sqlite-jdbc-java"
    raise ConfigError(
        f"JDBC driver jar {name} for the {scheme} catalog not found",
        hint=f"install the Debian package {pkg} or set LOADER_SPARK__JDBC_DRIVER_JAR",
    )


def catalog_scheme(settings: LoaderSettings) -> str:
    scheme = urlparse(settings.catalog.uri).scheme.split("+")[0]
    if scheme not in ("postgresql", "sqlite"):
        raise ConfigError(
            f"catalog uri {redact(settings.catalog.uri)!r} is neither postgresql:// nor sqlite://",
            hint="set LOADER_CATALOG__URI",
        )
    return scheme


# How secrets appear where they are shown rather than used (``loader spark-conf``): as references to
# environment variables the user exports before spark-submit.
SECRET_REFERENCES = {
    "catalog": "${LOADER_CATALOG__PASSWORD}",
    "s3": "${LOADER_S3__SECRET_ACCESS_KEY}",
}


def jdbc_catalog_properties(settings: LoaderSettings, reveal: bool = True) -> dict[str, str]:
    """Iceberg JDBC catalog properties (without the spark.sql.catalog.<name> prefix)."""
    u = urlparse(settings.catalog.uri)
    props = {"type": "jdbc", "warehouse": spark_path(settings.catalog.warehouse)}
    if catalog_scheme(settings) == "postgresql":
        port = f":{u.port}" if u.port else ""
        # Connection options (sslmode, sslrootcert, ...) carry over: the JDBC driver takes the
        # same names as libpq for TLS, and dropping them would silently connect without TLS checks.
        query = f"?{u.query}" if u.query else ""
        props["uri"] = f"jdbc:postgresql://{u.hostname}{port}{u.path}{query}"
        if u.username:
            props["jdbc.user"] = unquote(u.username)
        secret = settings.catalog.secret()
        if secret:
            props["jdbc.password"] = secret if reveal else SECRET_REFERENCES["catalog"]
    else:
        props["uri"] = f"jdbc:sqlite:{u.path}"
    # V1 schema is what Iceberg views need.
    props["jdbc.schema-version"] = "V1"
    return props


def spark_path(url: str) -> str:
    """s3://bucket/x is read through Hadoop's S3A filesystem."""
    if url.startswith("s3://"):
        return "s3a://" + url[len("s3://") :]
    return url


def uses_s3(settings: LoaderSettings) -> bool:
    return settings.catalog.warehouse.startswith(("s3://", "s3a://"))


def spark_conf(settings: LoaderSettings, reveal: bool = True) -> dict[str, str]:
    """Every Spark setting the loader needs, as spark-submit --conf pairs.

    ``reveal=False`` writes secrets as ``${ENV_VAR}`` references (for showing, never for use).
    """
    cat = f"spark.sql.catalog.{settings.catalog.name}"
    jars = [iceberg_runtime_jar(settings), jdbc_driver_jar(settings), *settings.spark.extra_jars]
    conf: dict[str, str] = {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        cat: "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.defaultCatalog": settings.catalog.name,
        "spark.sql.shuffle.partitions": str(settings.spark.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        # Spark 3.5 clones the session on every Dataset.persist() unless these three are set
        # (CacheManager.getOrCloneSessionWithConfigsOff); each clone builds a new Iceberg JdbcCatalog
        # whose connection pool lives until the JVM collects it, so a long run exhausts the catalog
        # database's connections. Cost: AQE no longer coalesces the final stage of a query.
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
        "spark.sql.adaptive.applyFinalStageShuffleOptimizations": "false",
        "spark.sql.sources.bucketing.autoBucketedScan.enabled": "false",
        # History tables are appended in LSN order; Spark must not reorder the increment.
        "spark.sql.iceberg.planning.preserve-data-grouping": "true",
        # Spark keeps 100 compiled (Janino) classes by default; one load + merge cycle over a few
        # tables generates about 200 distinct ones, so every cycle recompiled all of them (and the
        # JIT then compiled the new classes again): ~1.5 s of CPU per cycle on 2 cores.
        "spark.sql.codegen.cache.maxEntries": "2000",
        # Cached batches (a load's decoded rows and typed rows, a merge's increment) are read once
        # or twice and dropped: gathering the statistics to compress them cost more CPU than the
        # memory saved is worth (a 1M-change load: 25.0 -> 22.4 s; MEMORY_AND_DISK spills the rest).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.driver.extraJavaOptions": "-Djava.library.path=/usr/lib/x86_64-linux-gnu/jni"
        f" -Dlog4j2.configurationFile={log4j_config()}",
    }
    for k, v in jdbc_catalog_properties(settings, reveal).items():
        conf[f"{cat}.{k}"] = v
    if uses_s3(settings):
        s3 = settings.s3
        h = "spark.hadoop.fs.s3a."
        conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        if s3.endpoint_url:
            conf[h + "endpoint"] = s3.endpoint_url
            conf[h + "connection.ssl.enabled"] = str(s3.endpoint_url.startswith("https")).lower()
        conf[h + "path.style.access"] = str(s3.path_style).lower()
        conf[h + "endpoint.region"] = s3.region
        # Bounded retries (see S3Settings): the SDK's attempts of one request, then S3A's own
        # retries of the failed operation, then the error reaches the loader's retry policy.
        conf[h + "attempts.maximum"] = str(s3.jvm_request_attempts - 1)  # the SDK counts retries
        conf[h + "retry.limit"] = str(s3.jvm_request_attempts)
        conf[h + "retry.interval"] = "500ms"
        conf[h + "retry.throttle.limit"] = str(max(s3.jvm_request_attempts, 5))
        conf[h + "connection.establish.timeout"] = str(int(s3.jvm_connect_timeout_s * 1000))
        conf[h + "connection.timeout"] = str(int(s3.jvm_read_timeout_s * 1000))
        if s3.access_key_id:
            conf[h + "access.key"] = s3.access_key_id
            secret = secret_text(s3.secret_access_key) or ""
            conf[h + "secret.key"] = secret if reveal else SECRET_REFERENCES["s3"]
            conf[h + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    conf.update(settings.spark.conf)
    return conf


def get_spark(settings: LoaderSettings, app_name: str = "lakehouse-loader") -> SparkSession:
    """The active session (spark-submit) or a new local one configured for the loader."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _import_hot_classes(active)  # a session someone else built (a notebook, a test harness)
        return active
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", _python()))
    builder = SparkSession.builder.appName(app_name)
    conf = spark_conf(settings)
    if under_spark_submit():
        # spark-submit already started the JVM with its own master, jars and static confs;
        # only runtime (SQL) settings can still be applied here.
        conf = {k: v for k, v in conf.items() if k.startswith("spark.sql.") and k != "spark.sql.extensions"}
        for k, v in conf.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
    else:
        conf = {"spark.master": settings.spark.master, "spark.driver.memory": settings.spark.driver_memory, **conf}
        spark = _launch_with_properties_file(builder, conf)
    spark.sparkContext.setLogLevel("ERROR")
    _import_hot_classes(spark)
    return spark


class LazySpark:
    """A Spark session started on first use: a command whose work needs no JVM (a load the driver
    does whole, with pyiceberg's commits) never starts one. Any attribute of the session starts it
    and is passed through, so code written for a SparkSession takes this as one."""

    def __init__(self, settings: LoaderSettings, app_name: str = "lakehouse-loader") -> None:
        self._settings = settings
        self._app_name = app_name
        self._session: SparkSession | None = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._session is None:
            log.info("starting Spark (%s)", self._app_name)
            self._session = get_spark(self._settings, self._app_name)
        return getattr(self._session, name)


def spark_started(spark: Any) -> bool:
    """Whether ``spark`` is a running session (a LazySpark not used yet is not)."""
    return not isinstance(spark, LazySpark) or spark.started


def _launch_with_properties_file(builder: Any, conf: dict[str, str]) -> SparkSession:
    """Start the JVM with every setting in a 0600 properties file, none as an argument.

    PySpark turns each builder setting into a ``--conf k=v`` argument of spark-submit, and every
    local user can read a process's arguments (``ps``, ``/proc/*/cmdline``): the catalog password
    and the S3 secret key would be on show for as long as the command runs. spark-submit reads a
    ``--properties-file`` instead (it replaces ``spark-defaults.conf``, whose settings are copied in
    first, ours winning); the file lives in a private directory removed once the JVM has read it.
    """
    import shlex
    import shutil
    import tempfile

    merged = {**spark_defaults(), **conf}
    private = tempfile.mkdtemp(prefix="loader-spark-")  # mode 0700
    props = Path(private) / "spark.properties"
    write_properties_file(merged, props)
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    args = shlex.split(previous) if previous else ["pyspark-shell"]
    os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(["--properties-file", str(props), *args])
    try:
        return builder.getOrCreate()  # type: ignore[no-any-return]
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = previous
        shutil.rmtree(private, ignore_errors=True)


def spark_defaults() -> dict[str, str]:
    """The settings of ``spark-defaults.conf`` (``$SPARK_CONF_DIR`` or ``$SPARK_HOME/conf``), if any."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    if not conf_dir:
        return {}
    path = Path(conf_dir) / "spark-defaults.conf"
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[0]] = parts[1].strip()
    return out


# --- py4j: name lookups without class-path scans ---------------------------------------------
#
# py4j resolves every ``jvm.a.b.C`` step and every short name (``jvm.functions``) with a
# reflection call that tries ``Class.forName`` on each candidate (the name itself, then each
# package PySpark imported with a wildcard); each miss searches all ~250 jars on the class path.
# A load + merge cycle over a few tables made ~3,000 such lookups (0.1-0.5 ms each, plus a py4j
# round trip), most of them from iterating Java maps: py4j ends an iteration with a Java
# exception, and PySpark's exception conversion does a dozen more lookups to classify it.

# Classes PySpark reaches by short name on every DataFrame call (``F.col`` -> ``jvm.functions``).
_HOT_CLASSES = (
    "org.apache.spark.sql.functions",
    "org.apache.spark.api.python.PythonUtils",
    "org.apache.spark.sql.api.python.PythonSQLUtils",
    "org.apache.spark.api.python.PythonRDD",
    "org.apache.spark.api.python.SerDeUtil",
    "org.apache.spark.sql.SparkSession",
)
# Keyed by gateway (kept in the value, so its id cannot be reused by another while cached).
_JVM_CLASSES: dict[tuple[int, str], tuple[Any, Any]] = {}
_JSON_MAPPERS: dict[int, tuple[Any, Any]] = {}
_IMPORTED: dict[int, Any] = {}


def _import_hot_classes(spark: SparkSession) -> None:
    """Single-class imports resolve those short names with one successful lookup (once per JVM view)."""
    from py4j.java_gateway import java_import

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    if _IMPORTED.get(id(jvm)) is jvm:
        return
    for fqn in _HOT_CLASSES:
        java_import(jvm, fqn)
    _IMPORTED[id(jvm)] = jvm


def jvm_class(spark: SparkSession, fqn: str) -> Any:
    """The py4j handle of a JVM class, looked up once per gateway (static calls and constructors
    on it go straight to the class)."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    key = (id(gateway), fqn)
    cached = _JVM_CLASSES.get(key)
    if cached is not None and cached[0] is gateway:
        return cached[1]
    found = gateway.jvm
    for part in fqn.split("."):
        found = getattr(found, part)
    _JVM_CLASSES[key] = (gateway, found)
    return found


def java_map(spark: SparkSession, jmap: Any) -> dict[str, str]:
    """A ``java.util.Map<String, String>`` as a dict, in one call (JSON through Spark's Jackson)
    instead of a py4j iteration (two round trips per entry and an exception at its end)."""
    import json

    gateway = spark.sparkContext._gateway
    assert gateway is not None
    cached = _JSON_MAPPERS.get(id(gateway))
    if cached is not None and cached[0] is gateway:
        mapper = cached[1]
    else:
        mapper = jvm_class(spark, "com.fasterxml.jackson.databind.ObjectMapper")()
        _JSON_MAPPERS[id(gateway)] = (gateway, mapper)
    return {str(k): str(v) for k, v in json.loads(mapper.writeValueAsString(jmap)).items()}


def executor_environment(settings: LoaderSettings) -> dict[str, str]:
    """Credentials Python code in executors needs (S3 landing reads), as environment variables.

    Given to Spark as the Python workers' environment (``SparkContext.environment``), never inside
    a pickled function: the closure carries only settings without secrets. On a cluster the
    executors can instead take credentials from the platform (instance profile, IRSA, workload
    identity), and then nothing is passed at all.
    """
    s3 = settings.s3
    env: dict[str, str] = {}
    if s3.access_key_id:
        env["AWS_ACCESS_KEY_ID"] = s3.access_key_id
    if s3.secret_access_key is not None:
        env["AWS_SECRET_ACCESS_KEY"] = secret_text(s3.secret_access_key) or ""
    return env


def write_properties_file(conf: dict[str, str], path: str | Path) -> None:
    """A Spark properties file (``spark-submit --properties-file``) only its owner can read.

    The way to give spark-submit secrets without putting them on a command line (``ps`` shows
    every process's arguments to every user).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for k, v in conf.items():
            # java.util.Properties format: backslash, and leading/trailing specials, escaped.
            f.write(f"{_prop_escape(k)}={_prop_escape(v)}\n")


def _prop_escape(text: str) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")
    return ("\\" + out) if out.startswith((" ", "#", "!")) else out


def hadoop_s3a_conf(settings: LoaderSettings) -> dict[str, str]:
    """The S3A settings of ``spark_conf`` as Hadoop keys (without the ``spark.hadoop.`` prefix)."""
    prefix = "spark.hadoop."
    return {k[len(prefix) :]: v for k, v in spark_conf(settings).items() if k.startswith(prefix + "fs.s3")}


def configure_running_session(spark: SparkSession, settings: LoaderSettings) -> None:
    """Register these settings' catalog (and S3A access) on a session started with other settings.

    Catalogs are created on first use, so a catalog name the session has not used yet can be
    configured at run time; Hadoop's S3A settings are read when a bucket's filesystem is first
    opened. Jars cannot be added to a running JVM: the S3A jars must be on the session from the start.
    """
    cat = f"spark.sql.catalog.{settings.catalog.name}"
    for k, v in spark_conf(settings).items():
        if k == cat or k.startswith(cat + "."):
            spark.conf.set(k, v)
    if uses_s3(settings):
        require_s3a(spark)
        hconf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        for k, v in hadoop_s3a_conf(settings).items():
            hconf.set(k, v)


def require_s3a(spark: SparkSession) -> None:
    """Fail clearly when the warehouse is on S3 but the S3A filesystem jars are not loaded."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem", False, loader)
    except Exception as exc:
        raise ConfigError(
            "the warehouse is on S3 but Spark has no S3A filesystem (hadoop-aws) on its classpath",
            hint="run 'make s3a-jars' and set LOADER_SPARK__EXTRA_JARS=.state/jars/hadoop-aws-3.3.1.jar,"
            ".state/jars/aws-java-sdk-bundle-1.11.901.jar (or give the platform's jars)",
        ) from exc


def under_spark_submit() -> bool:
    """True when spark-submit launched this Python process (the JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _python() -> str:
    import sys

    return sys.executable
