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

up() { pg_isready -h 127.0.0.1 -p "$PORT" -q; }

# The server itself is scripts/pg-server.sh's, with TLS and these options.
server() {
    PG_DIR="$DIR" PG_PORT="$PORT" PG_OPTIONS="-c ssl=on -c ssl_cert_file=$DIR/server.pem \
        -c ssl_key_file=$DIR/server.key -c fsync=off -c max_connections=200" \
        "$(dirname "$0")/pg-server.sh" "$@"
}

start() {
    if up; then echo "TLS PostgreSQL answers on 127.0.0.1:$PORT"; return 0; fi
    mkdir -p "$DIR"
    test_certificates "$DIR"
    server start
    echo "TLS PostgreSQL is up on 127.0.0.1:$PORT (CA: $DIR/ca.pem)"
}

stop() { server stop fast; }

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) up ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
