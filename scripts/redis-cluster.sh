#!/usr/bin/env bash
# A local 6-node Redis Cluster (3 primaries, 3 replicas) from the installed redis-server, for the
# cluster tests (REDIS_CLUSTER_URL) and for trying `--store redis-cluster://…` by hand.
#
#   scripts/redis-cluster.sh start   # idempotent: a cluster already up on the ports is kept
#   scripts/redis-cluster.sh stop    # shuts the six nodes down and removes their directories
#   scripts/redis-cluster.sh url     # prints the REDIS_CLUSTER_URL to export
#
# Ports 7000-7005 on 127.0.0.1 (REDIS_CLUSTER_BASE_PORT to move them), no persistence, node
# directories under /tmp/mcp-idem-redis-cluster/PORT (REDIS_CLUSTER_DIR to move them).
#
# With REDIS_CLUSTER_TLS_DIR set to a directory holding ca.pem, server.pem and server.key (see
# scripts/test-certs.sh; scripts/tls-redis.sh does this), the nodes speak TLS only, to clients, on
# the cluster bus and for replication (tls-cluster, tls-replication), without client
# certificates, and `url` prints a rediss-cluster:// URL.
set -euo pipefail

BASE=${REDIS_CLUSTER_BASE_PORT:-7000}
PORTS=$(seq "$BASE" $((BASE + 5)))
ROOT=${REDIS_CLUSTER_DIR:-/tmp/mcp-idem-redis-cluster}
TLS=${REDIS_CLUSTER_TLS_DIR:-}

SCHEME=redis-cluster
CLI_TLS=()
LISTEN=()
if [ -n "$TLS" ]; then
    SCHEME=rediss-cluster
    CLI_TLS=(--tls --cacert "$TLS/ca.pem")
fi

# The options of the node on port $1 that say where it listens.
listen() {
    if [ -n "$TLS" ]; then
        LISTEN=(--port 0 --tls-port "$1" --tls-cert-file "$TLS/server.pem"
            --tls-key-file "$TLS/server.key" --tls-ca-cert-file "$TLS/ca.pem"
            --tls-auth-clients no --tls-cluster yes --tls-replication yes)
    else
        LISTEN=(--port "$1")
    fi
}

url() { echo "$SCHEME://127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))"; }

cli() { redis-cli "${CLI_TLS[@]}" "$@"; }

node_up() { [ "$(cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

cluster_ok() {
    cli -h 127.0.0.1 -p "$BASE" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

wait_until() { # description, tries (0.2 s each), command...
    local what=$1 tries=$2; shift 2
    for _ in $(seq 1 "$tries"); do
        if "$@"; then return 0; fi
        sleep 0.2
    done
    echo "redis-cluster: $what" >&2
    return 1
}

start() {
    command -v redis-server >/dev/null || { echo "redis-cluster: redis-server is missing" >&2; exit 1; }
    if cluster_ok; then
        echo "redis-cluster: already up ($(url))"
        return 0
    fi
    for port in $PORTS; do
        if node_up "$port"; then continue; fi
        mkdir -p "$ROOT/$port"
        # A node that was part of an older cluster would refuse to join a new one.
        rm -f "$ROOT/$port/nodes.conf"
        listen "$port"
        redis-server "${LISTEN[@]}" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
            --save "" --appendonly no --dir "$ROOT/$port" \
            --logfile "$ROOT/$port/redis.log" --daemonize yes
    done
    for port in $PORTS; do
        wait_until "node $port did not start" 50 node_up "$port"
    done
    local known
    known=$(cli -h 127.0.0.1 -p "$BASE" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')
    if [ "${known:-1}" -le 1 ]; then
        local nodes=()
        for port in $PORTS; do nodes+=("127.0.0.1:$port"); done
        cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
    fi
    wait_until "the cluster did not reach cluster_state:ok" 150 cluster_ok
    # Replicas must be in sync before the tests (WAIT, failovers) rely on them.
    for port in $PORTS; do
        wait_until "node $port did not finish syncing" 150 synced "$port"
    done
    echo "redis-cluster: up ($(url))"
}

# A primary, or a replica whose link to its primary is up.
synced() {
    local info
    info=$(cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null) || return 1
    grep -q '^role:master' <<<"$info" || grep -q '^master_link_status:up' <<<"$info"
}

stop() {
    for port in $PORTS; do
        cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
    rm -rf "$ROOT"
    echo "redis-cluster: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
