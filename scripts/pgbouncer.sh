#!/usr/bin/env bash
# Starts PgBouncer in transaction pooling mode on 127.0.0.1:6432 in front of the PostgreSQL
# server on 127.0.0.1:5432 (any database, trust auth): what the PostgreSQL store tests run
# through as PGBOUNCER_URL=postgres://postgres@127.0.0.1:6432/test. Idempotent: does nothing
# when PgBouncer already answers there.
#
#   scripts/pgbouncer.sh start    install (Debian's pgbouncer, when missing and run as root), start
#   scripts/pgbouncer.sh stop     stop the PgBouncer this script started
#   scripts/pgbouncer.sh status   exit 0 if it answers
#
# Environment: PGBOUNCER_DIR (config, pid and log; default /tmp/mcp-idem-pgbouncer),
# PGBOUNCER_PORT (6432), PGBOUNCER_UPSTREAM_PORT (5432).
set -euo pipefail

DIR="${PGBOUNCER_DIR:-/tmp/mcp-idem-pgbouncer}"
PORT="${PGBOUNCER_PORT:-6432}"
UPSTREAM_PORT="${PGBOUNCER_UPSTREAM_PORT:-5432}"

up() { pg_isready -h 127.0.0.1 -p "$PORT" -q; }

start() {
    if up; then echo "PgBouncer answers on 127.0.0.1:$PORT"; return 0; fi
    if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "installing pgbouncer"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null \
                || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null; }
        else
            echo "pgbouncer is missing: install it (Debian: apt-get install pgbouncer)" >&2
            return 1
        fi
    fi
    local bin
    bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
    mkdir -p "$DIR"
    # PgBouncer 1.18 has no support for protocol-level prepared statements: transaction pooling
    # is the mode in which named prepared statements break. auth_type=trust still wants the user
    # in the auth file.
    cat >"$DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$UPSTREAM_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 8
max_client_conn = 1000
server_lifetime = 300
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
INI
    printf '"postgres" ""\n' >"$DIR/userlist.txt"
    local as=()
    if [ "$(id -u)" = 0 ]; then
        # PgBouncer refuses to run as root.
        chown -R postgres "$DIR"
        as=(-u postgres)
    fi
    "$bin" -d "${as[@]}" "$DIR/pgbouncer.ini"
    for _ in $(seq 1 50); do
        if up; then echo "PgBouncer is up on 127.0.0.1:$PORT (transaction pooling)"; return 0; fi
        sleep 0.2
    done
    echo "PgBouncer did not come up; see $DIR/pgbouncer.log" >&2
    return 1
}

stop() {
    if [ -f "$DIR/pgbouncer.pid" ]; then
        kill "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null || true
        rm -f "$DIR/pgbouncer.pid"
    fi
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) up ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
