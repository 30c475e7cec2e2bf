"""``loader sql-server``: the Spark Thrift Server (HiveServer2 protocol: JDBC/ODBC) on the loader's catalog.

The server ships in the pyspark package and is started with its ``spark-submit``. Two traps, both
verified with pyspark 3.5 and Iceberg 1.10: the Iceberg runtime and the catalog's JDBC driver go on the driver's system
classpath (``--driver-class-path``), not ``--jars``, or Hive client sessions cannot load Iceberg's
JDBC catalog classes; and clients run ``USE default`` on connect, so the ``default`` namespace must
exist in the Iceberg catalog, which is the default catalog. Port and bind host are Hive settings
(``--hiveconf``); the server binds 127.0.0.1 unless configured otherwise.

Security: the server starts only with authentication (``hive.server2.authentication=CUSTOM`` with
:data:`AUTH_CLASS`, a password file of salted PBKDF2-HMAC-SHA256 hashes, or ``LDAP``) and TLS
(``hive.server2.use.SSL`` with a keystore), unless the caller passes ``no_auth`` (``--no-auth``).
The Java source of the password check ships in the package (``loader/java``) and is compiled with
``javac`` at first start into a jar cached under the state directory. Hive settings that carry
secrets (the keystore password) go to a ``hive-site.xml`` in a private (0700) conf directory on the
server's class path, Spark settings to a 0600 properties file: never on a command line. The custom
provider is created by Hive with a fresh ``HiveConf``, which reads only ``hive-site.xml`` and system
properties, so its settings must be there rather than in the Spark properties.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.resources
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from loader.config import LoaderSettings, secret_text, state_dir
from loader.errors import ConfigError, TransientError
from loader.spark import (
    catalog_scheme,
    iceberg_runtime_jar,
    jdbc_driver_jar,
    spark_conf,
    uses_s3,
    write_properties_file,
)

THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
# hive.server2.authentication=CUSTOM provider (loader/java/PasswordFileAuthenticator.java).
AUTH_CLASS = "lakehouse.sqlserver.PasswordFileAuthenticator"
AUTH_SOURCE = "PasswordFileAuthenticator.java"
PASSWORD_FILE_KEY = "lakehouse.sql-server.password-file"
HASH_SCHEME = "pbkdf2-sha256"
HASH_ITERATIONS = 310_000  # OWASP's 2023 figure for PBKDF2-HMAC-SHA256
TLS_ALIAS = "lakehouse-sql-server"


class SqlServerError(TransientError):
    """The Spark Thrift Server did not start or stopped."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def jdbc_url(settings: LoaderSettings, tls: bool = True) -> str:
    """The JDBC URL clients use (no password in it: beeline asks, or reads ``-w FILE``)."""
    s = settings.sql_server
    url = f"jdbc:hive2://{s.host}:{s.port}/default"
    if tls:
        url += ";ssl=true"
        if s.tls_truststore:
            url += f";sslTrustStore={s.tls_truststore}"
    return url


def server_dir(settings: LoaderSettings) -> Path:
    """Working directory of the server (Hive's local metastore_db and logs stay out of the way)."""
    return state_dir() / "sql-server" / str(settings.sql_server.port)


def conf_dir(settings: LoaderSettings) -> Path:
    """The server's private (0700) Hive conf directory, first on its class path (``hive-site.xml``)."""
    return server_dir(settings) / "conf"


def password_file(settings: LoaderSettings) -> Path:
    configured = settings.sql_server.password_file
    return Path(configured).expanduser().resolve() if configured else state_dir() / "sql-server" / "passwords"


# --- the password file --------------------------------------------------------------------------


def hash_password(password: str, salt: bytes | None = None, iterations: int = HASH_ITERATIONS) -> str:
    """``pbkdf2-sha256:iterations:salt:hash`` (base64), the form the Java provider checks."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    b64 = base64.b64encode
    return f"{HASH_SCHEME}:{iterations}:{b64(salt).decode()}:{b64(digest).decode()}"


def check_password(entry: str, password: str) -> bool:
    """Whether ``password`` matches a stored ``hash_password`` entry (constant-time compare)."""
    scheme, iterations, salt, digest = entry.split(":")
    if scheme != HASH_SCHEME or not password:
        return False
    actual = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), base64.b64decode(salt), int(iterations))
    return hmac.compare_digest(actual, base64.b64decode(digest))


def read_users(path: Path) -> dict[str, str]:
    """User name -> hash entry of a password file (empty when the file does not exist)."""
    if not path.is_file():
        return {}
    users: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, entry = line.partition(":")
        if sep and entry.startswith(HASH_SCHEME + ":"):
            users[name] = entry
    return users


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def validate_user_name(name: str) -> None:
    if not name or any(c in name for c in ":\n\r") or name != name.strip():
        raise ConfigError(f"invalid user name {name!r}", hint="no ':', line breaks or surrounding spaces")


def set_user(path: Path, name: str, password: str) -> bool:
    """Add a user or change its password; True when the user already existed. The file is 0600."""
    validate_user_name(name)
    if not password:
        raise ConfigError("empty password", hint="give a password on stdin or at the prompt")
    users = read_users(path)
    existed = name in users
    users[name] = hash_password(password)
    _write_private(path, "".join(f"{n}:{e}\n" for n, e in sorted(users.items())))
    return existed


def remove_user(path: Path, name: str) -> bool:
    users = read_users(path)
    if users.pop(name, None) is None:
        return False
    _write_private(path, "".join(f"{n}:{e}\n" for n, e in sorted(users.items())))
    return True


# --- the compiled password check ------------------------------------------------------------------


def _spark_jar(prefix: str) -> Path:
    found = sorted((spark_home() / "jars").glob(f"{prefix}*.jar"))
    if not found:
        raise ConfigError(f"{prefix}*.jar not found in {spark_home() / 'jars'}", hint="reinstall pyspark")
    return found[-1]


def find_javac() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").is_file():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def auth_jar() -> Path:
    """The password check (``AUTH_CLASS``) compiled from the packaged source, cached by its hash."""
    source = importlib.resources.files("loader") / "java" / AUTH_SOURCE
    code = source.read_bytes()
    thriftserver = _spark_jar("spark-hive-thriftserver_")
    key = hashlib.sha256(code + thriftserver.name.encode()).hexdigest()[:16]
    jar = state_dir() / "sql-server" / "auth" / f"password-auth-{key}.jar"
    if jar.is_file():
        return jar
    javac = find_javac()
    if javac is None:
        raise ConfigError(
            "javac not found: the SQL server's password check is compiled from Java source at first start",
            hint="install a JDK (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to one; "
            "or use sql_server.auth=ldap",
        )
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
        src = Path(tmp) / AUTH_SOURCE
        src.write_bytes(code)
        out = Path(tmp) / "classes"
        classpath = os.pathsep.join([str(thriftserver), str(_spark_jar("hadoop-client-api-"))])
        cmd = [javac, "--release", "8", "-Xlint:-options", "-nowarn", "-cp", classpath, "-d", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(
                f"compiling the SQL server's password check failed: {(done.stderr or done.stdout).strip()[:500]}",
                hint="a JDK 8 or newer is needed (javac --release 8)",
            )
        staged = Path(tmp) / jar.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for cls in sorted(out.rglob("*.class")):
                z.write(cls, cls.relative_to(out).as_posix())
        os.replace(staged, jar)
    return jar


# --- TLS ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SelfSignedTls:
    keystore: Path
    password_file: Path  # the keystore's password (0600)
    truststore: Path  # JKS, for Java clients (beeline, JDBC); no password needed to read it
    certificate: Path  # PEM, for Python clients (PyHive, ssl.create_default_context(cafile=...))


def tls_dir() -> Path:
    return state_dir() / "sql-server" / "tls"


def _keytool() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "keytool").is_file():
        return str(Path(java_home) / "bin" / "keytool")
    found = shutil.which("keytool")
    if found is None:
        raise ConfigError(
            "keytool not found (needed for --self-signed-tls)",
            hint="install a JDK (Debian: apt-get install openjdk-17-jdk-headless) or give sql_server.tls_keystore",
        )
    return found


def _san(host: str) -> str:
    names = {"dns:localhost", "ip:127.0.0.1", f"dns:{socket.gethostname()}"}
    if host not in ("", "0.0.0.0", "::"):
        try:
            ipaddress.ip_address(host)
            names.add(f"ip:{host}")
        except ValueError:
            names.add(f"dns:{host}")
    return ",".join(sorted(names))


def self_signed_tls(host: str, directory: Path | None = None) -> SelfSignedTls:
    """A self-signed key pair for the server (made once, then reused), its truststore and PEM.

    keytool reads the keystore password from its environment (``-storepass:env``), never from its
    command line.
    """
    d = directory or tls_dir()
    tls = SelfSignedTls(d / "keystore.p12", d / "keystore.password", d / "truststore.jks", d / "server.pem")
    if tls.keystore.is_file() and tls.password_file.is_file() and tls.truststore.is_file():
        return tls
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    for f in (tls.keystore, tls.truststore, tls.certificate):
        f.unlink(missing_ok=True)
    password = secrets.token_urlsafe(24)
    _write_private(tls.password_file, password + "\n")
    env = dict(os.environ, LOADER_KEYSTORE_PASSWORD=password, LOADER_TRUSTSTORE_PASSWORD="lakehouse")
    keytool = _keytool()
    cn = host if host not in ("", "0.0.0.0", "::") else socket.gethostname()
    store = ["-storepass:env", "LOADER_KEYSTORE_PASSWORD"]
    steps = [
        [
            *("-genkeypair", "-alias", TLS_ALIAS, "-keyalg", "RSA", "-keysize", "3072", "-validity", "825"),
            *("-dname", f"CN={cn}", "-ext", f"SAN={_san(host)}", "-storetype", "PKCS12"),
            *("-keystore", str(tls.keystore), *store, "-keypass:env", "LOADER_KEYSTORE_PASSWORD"),
        ],
        [
            "-exportcert",
            "-rfc",
            "-alias",
            TLS_ALIAS,
            "-keystore",
            str(tls.keystore),
            *store,
            "-file",
            str(tls.certificate),
        ],
        # JKS: Java reads its certificates without the store password (a PKCS12 truststore would
        # need the password in every client's URL). It holds nothing secret.
        [
            *("-importcert", "-noprompt", "-alias", TLS_ALIAS, "-file", str(tls.certificate), "-storetype", "JKS"),
            *("-keystore", str(tls.truststore), "-storepass:env", "LOADER_TRUSTSTORE_PASSWORD"),
        ],
    ]
    for args in steps:
        done = subprocess.run([keytool, *args], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"keytool {args[0]} failed: {(done.stderr or done.stdout).strip()[:300]}")
    os.chmod(tls.keystore, 0o600)
    return tls


def with_self_signed_tls(settings: LoaderSettings, tls: SelfSignedTls) -> LoaderSettings:
    from pydantic import SecretStr

    s = settings.sql_server.model_copy(
        update={
            "tls_keystore": str(tls.keystore),
            "tls_keystore_password": SecretStr(tls.password_file.read_text().strip()),
            "tls_truststore": str(tls.truststore),
        }
    )
    return settings.model_copy(update={"sql_server": s})


# --- what the server is started with --------------------------------------------------------------


def hive_site(settings: LoaderSettings, no_auth: bool = False) -> dict[str, str]:
    """The server's Hive settings (secrets included: they go to a 0600 hive-site.xml).

    Raises ``ConfigError`` when authentication or TLS is not configured, unless ``no_auth``.
    """
    s = settings.sql_server
    if no_auth:
        return {"hive.server2.authentication": "NONE", "hive.server2.use.SSL": "false"}
    conf: dict[str, str] = {}
    refuse = "loader sql-server --no-auth starts it without (a local test only)"
    if s.auth == "password":
        path = password_file(settings)
        if not read_users(path):
            raise ConfigError(
                f"the SQL server has no users ({path} has none): it does not start without authentication",
                hint=f"add one with 'loader sql-server add-user NAME', or set sql_server.auth=ldap; {refuse}",
            )
        conf["hive.server2.authentication"] = "CUSTOM"
        conf["hive.server2.custom.authentication.class"] = AUTH_CLASS
        conf[PASSWORD_FILE_KEY] = str(path)
    else:
        if not s.ldap_url:
            raise ConfigError(
                "sql_server.auth=ldap needs sql_server.ldap_url", hint=f"e.g. ldaps://ldap.example.com; {refuse}"
            )
        conf["hive.server2.authentication"] = "LDAP"
        conf["hive.server2.authentication.ldap.url"] = s.ldap_url
        if s.ldap_base_dn:
            conf["hive.server2.authentication.ldap.baseDN"] = s.ldap_base_dn
        if s.ldap_user_dn_pattern:
            conf["hive.server2.authentication.ldap.userDNPattern"] = s.ldap_user_dn_pattern
    if not s.tls_keystore or s.tls_keystore_password is None:
        raise ConfigError(
            "the SQL server has no TLS keystore: it does not start without TLS",
            hint="set sql_server.tls_keystore and LOADER_SQL_SERVER__TLS_KEYSTORE_PASSWORD, or pass "
            f"--self-signed-tls; {refuse}",
        )
    if not Path(s.tls_keystore).is_file():
        raise ConfigError(f"TLS keystore {s.tls_keystore} not found", hint="check sql_server.tls_keystore")
    conf["hive.server2.use.SSL"] = "true"
    conf["hive.server2.keystore.path"] = str(Path(s.tls_keystore).resolve())
    conf["hive.server2.keystore.password"] = secret_text(s.tls_keystore_password) or ""
    return conf


def write_hive_site(conf: dict[str, str], directory: Path) -> Path:
    """``hive-site.xml`` in a directory only the owner can enter; the file itself 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    props = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n" for k, v in conf.items()
    )
    path = directory / "hive-site.xml"
    _write_private(path, f'<?xml version="1.0"?>\n<configuration>\n{props}</configuration>\n')
    return path


def server_settings(settings: LoaderSettings) -> LoaderSettings:
    """The settings the server's Spark runs with: its own catalog login and S3 credentials if set."""
    s = settings.sql_server
    update: dict[str, object] = {}
    if s.catalog_uri:
        update["catalog"] = settings.catalog.model_copy(update={"uri": s.catalog_uri, "password": s.catalog_password})
    if s.s3_access_key_id:
        update["s3"] = settings.s3.model_copy(
            update={"access_key_id": s.s3_access_key_id, "secret_access_key": s.s3_secret_access_key}
        )
    return settings.model_copy(update=update) if update else settings


def credential_warnings(settings: LoaderSettings) -> list[str]:
    """What the server could do with the loader's own (writing) credentials."""
    s = settings.sql_server
    out = []
    if not s.catalog_uri and catalog_scheme(settings) == "postgresql":
        out.append(
            "warning: the SQL server uses the loader's own catalog login, which can write: a client can DROP or "
            "change tables. Set sql_server.catalog_uri to a read-only role (README: 'SQL for BI tools')."
        )
    if uses_s3(settings) and not s.s3_access_key_id and settings.s3.access_key_id:
        out.append(
            "warning: the SQL server uses the loader's own S3 credentials, which can write: set "
            "sql_server.s3_access_key_id / s3_secret_access_key to read-only ones."
        )
    return out


def server_conf(settings: LoaderSettings) -> dict[str, str]:
    """The Thrift Server's Spark settings (secrets included: they go to a 0600 properties file)."""
    own = server_settings(settings)
    conf = spark_conf(own)
    conf.pop("spark.jars", None)  # on the system classpath instead (trap 1)
    conf["spark.sql.defaultCatalog"] = settings.catalog.name
    conf["spark.sql.warehouse.dir"] = str(server_dir(settings) / "spark-warehouse")
    if settings.sql_server.catalog_uri:
        # a read-only login cannot create the catalog's tables; the loader already did
        conf[f"spark.sql.catalog.{settings.catalog.name}.jdbc.init-catalog-tables"] = "false"
    return conf


def properties_path(settings: LoaderSettings) -> Path:
    return server_dir(settings) / "spark.properties"


def server_command(settings: LoaderSettings, password_check: Path | None = None) -> list[str]:
    """The spark-submit command line of the Thrift Server for these settings (pure).

    Its Spark settings, secrets among them, are in a properties file only the owner can read, its
    Hive settings in a private hive-site.xml: a command line is visible to every user of the
    machine (``ps``). ``password_check``: the jar of :data:`AUTH_CLASS` (:func:`auth_jar`), when
    the server checks passwords itself.
    """
    jars = [iceberg_runtime_jar(settings), jdbc_driver_jar(settings), *settings.spark.extra_jars]
    classpath = [str(conf_dir(settings))]  # hive-site.xml, ahead of any SPARK_CONF_DIR
    if password_check is not None:
        classpath.append(str(password_check))
    classpath += [j for j in jars if not j.startswith(("http:", "https:"))]
    cmd = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        settings.spark.master,
        "--driver-memory",
        settings.sql_server.driver_memory,
        "--driver-class-path",
        os.pathsep.join(classpath),
        "--properties-file",
        str(properties_path(settings)),
        "--class",
        THRIFT_SERVER_CLASS,
        "--name",
        "lakehouse-sql-server",
    ]
    s = settings.sql_server
    cmd += [
        "spark-internal",
        "--hiveconf",
        f"hive.server2.thrift.port={s.port}",
        "--hiveconf",
        f"hive.server2.thrift.bind.host={s.host}",
    ]
    return cmd


def ensure_default_namespace(settings: LoaderSettings) -> None:
    """Clients run ``USE default`` on connect; it must resolve in the Iceberg catalog (trap 2)."""
    from loader.lake.catalog import open_catalog

    open_catalog(settings).create_namespace_if_not_exists("default")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class SqlServer:
    """A running Thrift Server process."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path | None

    def wait_ready(self, host: str, port: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SqlServerError(
                    f"the Spark Thrift Server exited with status {self.process.returncode} before listening on {host}:{port}",
                    hint=f"see {self.log_path}" if self.log_path else "see its output above",
                )
            if port_open(host, port):
                return
            time.sleep(1)
        self.stop()
        raise SqlServerError(
            f"the Spark Thrift Server did not listen on {host}:{port} within {timeout:.0f}s",
            hint=f"see {self.log_path}" if self.log_path else "see its output above",
        )

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def tls_transport(
    host: str, port: int, username: str, password: str, cafile: str | None = None, timeout_ms: int | None = None
) -> Any:
    """A HiveServer2 client transport over TLS with SASL PLAIN (user name and password), for PyHive:
    ``pyhive.hive.connect(thrift_transport=tls_transport(...))``.

    The server's certificate is verified (against ``cafile``, else the system's CAs) and must name
    ``host``. dbt-spark 1.10's own TLS transport neither verifies it nor connects (dbt-adapters#1846:
    it hands thrift_sasl a puresasl client without the API thrift_sasl calls), so ``loader dbt``
    uses this one (:func:`use_verified_tls_in_dbt`).
    """
    import ssl

    import thrift_sasl
    from pyhive.sasl_compat import PureSASLClient
    from thrift.transport.TSSLSocket import TSSLSocket

    context = ssl.create_default_context(cafile=cafile)
    sock = TSSLSocket(host, port, ssl_context=context, server_hostname=host)
    if timeout_ms is not None:
        sock.setTimeout(timeout_ms)

    def sasl_client() -> Any:
        return PureSASLClient(host, mechanism="PLAIN", username=username, password=password)

    return thrift_sasl.TSaslClientTransport(sasl_client, "PLAIN", sock)


def use_verified_tls_in_dbt(cafile: str | None) -> None:
    """Make dbt-spark's ``use_ssl`` thrift connections (this process only) go through :func:`tls_transport`."""
    from dbt.adapters.spark import connections

    def build_ssl_transport(
        host: str, port: int, username: str, auth: str, kerberos_service_name: str, password: str | None = None
    ) -> Any:
        if auth not in ("CUSTOM", "LDAP", "NONE", None):
            raise ConfigError(f"dbt's thrift target over TLS supports SASL PLAIN only, not auth={auth}")
        return tls_transport(host, port or 10000, username, password or "", cafile)

    connections.build_ssl_transport = build_ssl_transport  # type: ignore[assignment]


def client_commands(settings: LoaderSettings, no_auth: bool = False) -> list[str]:
    """How to connect, as printed once the server is ready (no password in them)."""
    s = settings.sql_server
    beeline = spark_home() / "bin" / "beeline"
    if no_auth:
        return [f"  beeline: {beeline} -u '{jdbc_url(settings, tls=False)}' -n {s.user}"]
    url = jdbc_url(settings)
    if not s.tls_truststore:
        url += ";sslTrustStore=<truststore with the server's certificate>"
    lines = [
        f"  beeline: {beeline} -u '{url}' -n {s.user} -w <file holding the password>",
        "  (or leave out -w and type the password when beeline asks for it)",
    ]
    if s.tls_truststore:
        pem = Path(s.tls_truststore).with_name("server.pem")
        lines.append(f"  truststore for Java clients: {s.tls_truststore}")
        if pem.is_file():
            lines.append(f"  certificate (PEM) for other clients: {pem}")
    return lines


def start_server(
    settings: LoaderSettings,
    background: bool = True,
    wait: bool = True,
    timeout: float = 240.0,
    echo: Callable[[str], None] = print,
    no_auth: bool = False,
) -> SqlServer:
    """Start the Thrift Server; with ``background`` its output goes to a log file under the state dir.

    Refuses (``ConfigError``) to start without authentication and TLS unless ``no_auth``.
    """
    s = settings.sql_server
    hive_conf = hive_site(settings, no_auth)  # refuses before anything starts
    uses_password_file = hive_conf.get("hive.server2.authentication") == "CUSTOM"
    password_check = auth_jar() if uses_password_file else None  # javac missing: said before anything starts
    if port_open(s.host, s.port):
        raise ConfigError(
            f"{s.host}:{s.port} is already in use",
            hint="stop the other server or set LOADER_SQL_SERVER__PORT",
        )
    if no_auth:
        echo(
            "WARNING: --no-auth: the SQL server accepts ANY user name and password, without TLS. Anyone who "
            f"reaches {s.host}:{s.port} reads every table (personal data included) and can change or drop "
            "them. Use it for a local test only."
        )
    for warning in credential_warnings(settings):
        echo(warning)
    ensure_default_namespace(settings)
    write_properties_file(server_conf(settings), properties_path(settings))
    write_hive_site(hive_conf, conf_dir(settings))
    command = server_command(settings, password_check)
    workdir = server_dir(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SPARK_HOME=str(spark_home()))
    log_path = None
    if background:
        log_path = workdir / "server.log"
        out = open(log_path, "wb")  # noqa: SIM115 - the server's stdout for its whole life
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        (workdir / "server.pid").write_text(str(proc.pid))
    else:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL)
    server = SqlServer(proc, jdbc_url(settings, tls=not no_auth), log_path)
    echo(f"starting the Spark Thrift Server on {s.host}:{s.port} (catalog {settings.catalog.name}, pid {proc.pid})")
    if wait:
        server.wait_ready(s.host, s.port, timeout)
        echo(f"ready: JDBC URL {server.url}")
        for line in client_commands(settings, no_auth):
            echo(line)
    return server


def stop_background(settings: LoaderSettings) -> bool:
    """Stop a server started with ``--background`` (its pid file is under the state dir)."""
    pid_file = server_dir(settings) / "server.pid"
    if not pid_file.is_file():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)  # the server was started in its own session/process group
    except ProcessLookupError:
        return False
    return True


def run_foreground(settings: LoaderSettings, echo: Callable[[str], None] = print, no_auth: bool = False) -> int:
    """Run until Ctrl-C (or until the server exits); returns the server's exit status."""
    server = start_server(settings, background=False, wait=True, echo=echo, no_auth=no_auth)
    echo("press Ctrl-C to stop")
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        return 0
