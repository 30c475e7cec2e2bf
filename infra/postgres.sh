#!/usr/bin/env bash
# Private PostgreSQL 15 cluster for the embedded defaults, the demo and the tests.
# wal_level=logical, wal2json, loopback only, its own port and socket dir.
# initdb refuses root, so when run as root the cluster is owned by the unprivileged `postgres` user.
#   infra/postgres.sh start|stop|status|env   (settings from PGDATA_DIR, PGPORT, PGHOST_DIR)
set -euo pipefail
cmd="${1:-status}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PGBIN="${PGBIN:-/usr/lib/postgresql/15/bin}"
PGDATA_DIR="${PGDATA_DIR:-$ROOT/.state/pgdata}"
PGHOST_DIR="${PGHOST_DIR:-$ROOT/.state/pgsock}"
PGPORT="${PGPORT:-25432}"
LOG="${PGDATA_DIR%/}.log"

as_owner() {
  if [ "$(id -u)" = "0" ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "$cmd" in
  start)
    mkdir -p "$(dirname "$PGDATA_DIR")" "$PGHOST_DIR"
    if [ "$(id -u)" = "0" ]; then
      chown postgres "$(dirname "$PGDATA_DIR")" "$PGHOST_DIR"
      # the owner must reach the data dir through every parent
      d="$(dirname "$PGDATA_DIR")"; while [ "$d" != "/" ]; do chmod o+x "$d" 2>/dev/null || true; d="$(dirname "$d")"; done
    fi
    if [ ! -s "$PGDATA_DIR/PG_VERSION" ]; then
      as_owner "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
    fi
    if as_owner "$PGBIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
      echo "postgres already running on 127.0.0.1:$PGPORT"; exit 0
    fi
    if ! as_owner "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$LOG" -w -t 60 start -o \
      "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGHOST_DIR -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 -c max_connections=200 -c max_prepared_transactions=10 -c fsync=off -c full_page_writes=off -c shared_buffers=256MB" >/dev/null; then
      if tail -n 20 "$LOG" 2>/dev/null | grep -q "Address already in use"; then
        holder="$(ss -Htlnp "sport = :$PGPORT" 2>/dev/null | sed -n 's/.*users:((\(.*\)))/\1/p' | head -n 1)"
        echo "cannot start PostgreSQL: 127.0.0.1:$PGPORT is already in use${holder:+ by $holder}." >&2
        echo "Stop that process, or use another port: PGPORT=<port> for this script and the same port in" >&2
        echo "LOADER_SOURCE__DSN and LOADER_CATALOG__URI for the loader (README 'Configuration')." >&2
      else
        echo "cannot start PostgreSQL; its log: $LOG" >&2
        tail -n 5 "$LOG" >&2 || true
      fi
      exit 1
    fi
    echo "postgres started on 127.0.0.1:$PGPORT (data $PGDATA_DIR)"
    ;;
  stop)
    if [ -s "$PGDATA_DIR/PG_VERSION" ]; then
      as_owner "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w stop >/dev/null 2>&1 && echo "postgres stopped" || echo "postgres was not running"
    fi
    ;;
  status)
    as_owner "$PGBIN/pg_ctl" -D "$PGDATA_DIR" status
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
