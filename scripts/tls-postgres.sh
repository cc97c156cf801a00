#!/usr/bin/env bash
# Starts a second, throwaway PostgreSQL server with TLS on 127.0.0.1:5433 (trust auth, database
# `test`), from a temporary data directory, with a test CA and a server certificate for
# localhost / 127.0.0.1 made with openssl: what the PostgreSQL TLS tests connect to as
#   PG_TLS_URL=postgres://postgres@localhost:5433/test
#   PG_TLS_CA=$DIR/ca.pem
# Idempotent: does nothing when the server already answers. Never touches the server on 5432.
#
#   scripts/tls-postgres.sh start | stop | status
#
# Environment: PG_TLS_DIR (default /tmp/mcp-idem-pg-tls), PG_TLS_PORT (5433).
set -euo pipefail

DIR="${PG_TLS_DIR:-/tmp/mcp-idem-pg-tls}"
PORT="${PG_TLS_PORT:-5433}"
# shellcheck source=scripts/test-certs.sh
. "$(dirname "$0")/test-certs.sh"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"

as_owner() { # runs a command as the user owning $DIR (postgres when we are root)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
up() { pg_isready -h 127.0.0.1 -p "$PORT" -q; }

start() {
    if up; then echo "TLS PostgreSQL answers on 127.0.0.1:$PORT"; return 0; fi
    [ -n "$BIN" ] || { echo "PostgreSQL's server binaries are missing" >&2; return 1; }
    mkdir -p "$DIR"
    test_certificates "$DIR"
    [ "$(id -u)" = 0 ] && chown -R postgres "$DIR"
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
        as_owner "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    fi
    as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 30 start -o \
        "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DIR \
         -c ssl=on -c ssl_cert_file=$DIR/server.pem -c ssl_key_file=$DIR/server.key \
         -c fsync=off -c max_connections=200" >/dev/null
    as_owner psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'test'" postgres | grep -q 1 \
        || as_owner psql -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE DATABASE test" postgres
    echo "TLS PostgreSQL is up on 127.0.0.1:$PORT (CA: $DIR/ca.pem)"
}

stop() {
    if [ -f "$DIR/data/postmaster.pid" ]; then
        as_owner "$BIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null || true
    fi
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) up ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
