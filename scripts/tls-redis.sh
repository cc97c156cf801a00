#!/usr/bin/env bash
# Redis with TLS only, for the Redis store's TLS tests and for trying `--store rediss://…` by hand:
# a test CA and a server certificate for localhost / 127.0.0.1 (scripts/test-certs.sh), then
#   (a) one redis-server on 127.0.0.1:6380 (also bound to 127.0.0.2, an address the certificate
#       does not name, for the host name tests), and
#   (b) a 6-node Redis Cluster (3 primaries, 3 replicas) on 127.0.0.1:7100-7105, TLS on the
#       cluster bus and for replication too (scripts/redis-cluster.sh with REDIS_CLUSTER_TLS_DIR).
# No client certificates, no persistence. Never touches the Redis on 6379 or the cluster on
# 7000-7005.
#
#   scripts/tls-redis.sh start        # idempotent: what already answers is kept
#   scripts/tls-redis.sh stop         # shuts both down and removes their directories
#   scripts/tls-redis.sh url          # REDIS_TLS_URL:         rediss://127.0.0.1:6380
#   scripts/tls-redis.sh cluster-url  # REDIS_TLS_CLUSTER_URL: rediss-cluster://127.0.0.1:7100,…
#   scripts/tls-redis.sh ca           # REDIS_TLS_CA:          the test CA's PEM file
#
# Environment: REDIS_TLS_DIR (default /tmp/mcp-idem-redis-tls), REDIS_TLS_PORT (6380),
# REDIS_TLS_CLUSTER_BASE_PORT (7100).
set -euo pipefail

HERE=$(dirname "$0")
DIR=${REDIS_TLS_DIR:-/tmp/mcp-idem-redis-tls}
PORT=${REDIS_TLS_PORT:-6380}
CLUSTER_BASE=${REDIS_TLS_CLUSTER_BASE_PORT:-7100}
# shellcheck source=scripts/test-certs.sh
. "$HERE/test-certs.sh"

cluster() {
    REDIS_CLUSTER_BASE_PORT=$CLUSTER_BASE REDIS_CLUSTER_DIR=$DIR/cluster \
        REDIS_CLUSTER_TLS_DIR=$DIR "$HERE/redis-cluster.sh" "$@"
}

up() {
    [ "$(redis-cli --tls --cacert "$DIR/ca.pem" -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = PONG ]
}

start() {
    command -v redis-server >/dev/null || { echo "tls-redis: redis-server is missing" >&2; exit 1; }
    # Debian builds redis-server with TLS; a build without it does not know tls-port (and this
    # check exits at once: it listens nowhere).
    if redis-server --port 0 --tls-port 0 --save "" 2>&1 | grep -q "Bad directive"; then
        echo "tls-redis: this redis-server was built without TLS" >&2
        exit 1
    fi
    test_certificates "$DIR"
    if up; then
        echo "tls-redis: already up on 127.0.0.1:$PORT"
    else
        mkdir -p "$DIR/standalone"
        redis-server --port 0 --tls-port "$PORT" --bind 127.0.0.1 127.0.0.2 \
            --tls-cert-file "$DIR/server.pem" --tls-key-file "$DIR/server.key" \
            --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients no \
            --save "" --appendonly no --dir "$DIR/standalone" \
            --logfile "$DIR/standalone/redis.log" --daemonize yes
        for _ in $(seq 1 50); do
            if up; then break; fi
            sleep 0.2
        done
        up || { echo "tls-redis: the server on $PORT did not start" >&2; exit 1; }
        echo "tls-redis: up on 127.0.0.1:$PORT (CA: $DIR/ca.pem)"
    fi
    cluster start
}

stop() {
    redis-cli --tls --cacert "$DIR/ca.pem" -h 127.0.0.1 -p "$PORT" shutdown nosave \
        >/dev/null 2>&1 || true
    cluster stop
    rm -rf "$DIR"
    echo "tls-redis: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) echo "rediss://127.0.0.1:$PORT" ;;
    cluster-url) cluster url ;;
    ca) echo "$DIR/ca.pem" ;;
    *) echo "usage: $0 start|stop|url|cluster-url|ca" >&2; exit 2 ;;
esac
