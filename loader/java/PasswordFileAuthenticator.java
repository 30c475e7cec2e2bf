package lakehouse.sqlserver;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.List;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;
import javax.security.sasl.AuthenticationException;
import org.apache.hadoop.conf.Configurable;
import org.apache.hadoop.conf.Configuration;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The Spark Thrift Server's {@code hive.server2.authentication=CUSTOM} provider of {@code loader sql-server}:
 * user names and passwords are checked against a file of salted PBKDF2-HMAC-SHA256 hashes, one user a line:
 *
 * <pre>name:pbkdf2-sha256:iterations:base64(salt):base64(hash)</pre>
 *
 * written by {@code loader sql-server add-user} (loader/sqlserver.py holds the same format). The file's path is
 * the Hive setting {@value #FILE_KEY} (hive-site.xml). It is read on every login, so added and removed users take
 * effect without a restart. An unknown user costs the same hash as a known one (no user enumeration by timing),
 * and hashes are compared in constant time.
 */
public final class PasswordFileAuthenticator implements PasswdAuthenticationProvider, Configurable {
  public static final String FILE_KEY = "lakehouse.sql-server.password-file";
  private static final String SCHEME = "pbkdf2-sha256";
  private static final int DUMMY_ITERATIONS = 310000;
  private static final byte[] DUMMY_SALT = new byte[16];

  private Configuration conf;

  @Override
  public void setConf(Configuration conf) {
    this.conf = conf;
  }

  @Override
  public Configuration getConf() {
    return conf;
  }

  private String passwordFile() {
    String path = conf == null ? null : conf.get(FILE_KEY);
    if (path == null || path.isEmpty()) {
      path = System.getProperty(FILE_KEY);
    }
    return path;
  }

  private static byte[] pbkdf2(String password, byte[] salt, int iterations, int bytes)
      throws AuthenticationException {
    PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, iterations, bytes * 8);
    try {
      // SunJCE encodes the password's characters as UTF-8, as Python's hashlib.pbkdf2_hmac is given them.
      return SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded();
    } catch (GeneralSecurityException e) {
      throw new AuthenticationException("PBKDF2WithHmacSHA256 is not available", e);
    } finally {
      spec.clearPassword();
    }
  }

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String path = passwordFile();
    if (path == null || path.isEmpty()) {
      throw new AuthenticationException("no password file configured (" + FILE_KEY + ")");
    }
    List<String> lines;
    try {
      lines = Files.readAllLines(Paths.get(path), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new AuthenticationException("cannot read the password file " + path, e);
    }
    String[] entry = null;
    for (String line : lines) {
      String[] fields = line.split(":", -1);
      if (fields.length == 5 && fields[0].equals(user) && SCHEME.equals(fields[1])) {
        entry = fields;
      }
    }
    String given = password == null ? "" : password;
    boolean ok;
    if (entry == null) {
      pbkdf2(given, DUMMY_SALT, DUMMY_ITERATIONS, 32);
      ok = false;
    } else {
      byte[] expected;
      byte[] salt;
      int iterations;
      try {
        iterations = Integer.parseInt(entry[2]);
        salt = Base64.getDecoder().decode(entry[3]);
        expected = Base64.getDecoder().decode(entry[4]);
      } catch (IllegalArgumentException e) {
        throw new AuthenticationException("malformed entry for this user in " + path, e);
      }
      byte[] actual = pbkdf2(given, salt, iterations, expected.length);
      ok = MessageDigest.isEqual(actual, expected) && !given.isEmpty();
    }
    if (!ok) {
      throw new AuthenticationException("wrong user name or password");
    }
  }
}
