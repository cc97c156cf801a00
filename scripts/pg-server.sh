#!/usr/bin/env bash
# A throwaway PostgreSQL server of its own: a data directory under $PG_DIR, its own port on
# 127.0.0.1, trust auth, a database `test`; started from the newest /usr/lib/postgresql/*/bin,
# as the postgres user when run as root. What scripts/tls-postgres.sh starts (with TLS) and what
# the restart tests (crates/mcp-idem/tests/integration/pg_restart.rs) start, restart and stop.
# Never touches another server: everything it does is to the one in $PG_DIR.
#
#   scripts/pg-server.sh start                     idempotent: nothing when it already answers
#   scripts/pg-server.sh restart fast|immediate    pg_ctl restart -m MODE (immediate: a crash,
#                                                  the start replays the WAL)
#   scripts/pg-server.sh stop [fast|immediate]     (default fast)
#   scripts/pg-server.sh status                    exit 0 if it answers
#
# Environment: PG_DIR (required; data in $PG_DIR/data, log $PG_DIR/server.log, socket in $PG_DIR),
# PG_PORT (required), PG_OPTIONS (more server options for the first start, e.g. "-c ssl=on").
set -euo pipefail

DIR="${PG_DIR:?set PG_DIR}"
PORT="${PG_PORT:?set PG_PORT}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"

as_owner() { # runs a command as the user owning $DIR (postgres when we are root)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
up() { pg_isready -h 127.0.0.1 -p "$PORT" -q; }
need_bin() { [ -n "$BIN" ] || { echo "PostgreSQL's server binaries are missing" >&2; exit 1; }; }
ctl() { as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" "$@" >/dev/null; }

start() {
    if up; then return 0; fi
    need_bin
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then chown -R postgres "$DIR"; fi
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
        as_owner "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    fi
    ctl -w -t 30 start -o "-c listen_addresses=127.0.0.1 -c port=$PORT \
        -c unix_socket_directories=$DIR ${PG_OPTIONS:-}"
    as_owner psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'test'" postgres | grep -q 1 \
        || as_owner psql -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE DATABASE test" postgres
}

# The options of the last start are kept in postmaster.opts: a restart reuses them.
restart() { need_bin; ctl -w -t 30 restart -m "${1:?fast or immediate}"; }

stop() {
    if [ -f "$DIR/data/postmaster.pid" ]; then
        need_bin
        ctl -w -t 30 stop -m "${1:-fast}" || true
    fi
}

case "${1:-start}" in
    start) start ;;
    restart) restart "${2:-}" ;;
    stop) stop "${2:-fast}" ;;
    status) up ;;
    *) echo "usage: $0 start | restart fast|immediate | stop [fast|immediate] | status" >&2; exit 2 ;;
esac
