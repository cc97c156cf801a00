#!/usr/bin/env bash
# Server CPU per command of the Redis store's floor, and of its claim script: redis-benchmark with
# 16 clients (as the http_throughput bench keeps 16 calls in flight), the CPU of redis-server read
# from /proc before and after each run (so run it on the server's machine, against a server that
# nothing else uses while it runs).
#
#   scripts/redis-call-cost.sh [redis://HOST:PORT]     (default: REDIS_URL, else 127.0.0.1:6379)
#
# Rows: PING (a round trip); EVALSHA of `return 1` (a script call); EVALSHA of a script that writes
# a 6-field hash and sets its expiry (the least a recording round trip does); the store's own claim
# script (common.lua + writes.lua + claim.lua) on a fresh key each time; the batch script with
# BATCH claims (default 8) of fresh keys per call, per claim. An executed call makes two round trips
# (the claim before the call, the outcome before the answer), so its floor is twice the third row.
# Keys go under mcp-idem-call-cost: and are deleted at the end. Needs redis-cli and redis-benchmark
# (Debian: redis-tools) and bc.
set -euo pipefail
URL=${1:-${REDIS_URL:-redis://127.0.0.1:6379}}
HOSTPORT=${URL#redis://}
HOSTPORT=${HOSTPORT%%/*}
HOST=${HOSTPORT%:*}
PORT=${HOSTPORT##*:}
N=${CALLS:-200000}
BATCH=${BATCH:-8}
SRC=$(dirname "$0")/../crates/mcp-idempotency/src/store/redis
cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }
P=mcp-idem-call-cost:
trap 'cli --scan --pattern "$P*" | xargs -r -n 500 redis-cli -h "$HOST" -p "$PORT" DEL >/dev/null' EXIT

PID=$(cli INFO server | tr -d '\r' | awk -F: '$1 == "process_id" {print $2}')
TICKS=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
# $1: label; $2: operations per command; the rest: the command, as redis-benchmark takes it
measure() {
    local label=$1 per=$2
    shift 2
    local c1 c2 commands=$((N / per))
    c1=$(cpu)
    redis-benchmark -h "$HOST" -p "$PORT" -c 16 -n "$commands" -r 1000000000 -q "$@" >/dev/null
    c2=$(cpu)
    printf '%-52s %6.1f us of server CPU each\n' "$label" \
        "$(echo "($c2 - $c1) * 1000000 / $TICKS / ($commands * $per)" | bc -l)"
}

ONE=$(cli SCRIPT LOAD "return 1")
WRITE=$(cli SCRIPT LOAD "redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'tool', ARGV[2], 'owner', ARGV[3], 'lease', ARGV[4], 'created', ARGV[5], 'expires', ARGV[6]) redis.call('PEXPIRE', KEYS[1], ARGV[7]) return 1")
CLAIM=$(cli -x SCRIPT LOAD < <(cat "$SRC/common.lua" "$SRC/writes.lua" "$SRC/claim.lua"))
BATCH_SCRIPT=$(cli -x SCRIPT LOAD < <(cat "$SRC/common.lua" "$SRC/writes.lua" "$SRC/batch.lua"))

echo "redis-server $(cli INFO server | tr -d '\r' | awk -F: '$1 == "redis_version" {print $2}') at $HOST:$PORT, $N commands per row, 16 clients"
echo
measure "PING" 1 PING
measure "EVALSHA of 'return 1'" 1 EVALSHA "$ONE" 0
measure "EVALSHA: a 6-field hash and its expiry" 1 EVALSHA "$WRITE" 1 "${P}w:__rand_int__" \
    0123456789abcdef0123456789abcdef noop 123456789 1800000030000 1800000000000 1800086400000 600000
measure "the store's claim script, a fresh key each" 1 EVALSHA "$CLAIM" 4 \
    "${P}r:ns:p:__rand_int__" "${P}s:ns:p" "${P}all" "${P}run" "ns:p:__rand_int__" 1800000000000 \
    0123456789abcdef0123456789abcdef noop 123456789 1800000030000 1800086400000 1000000000 1000000000 "$P" 100
keys=()
args=()
for i in $(seq 1 "$BATCH"); do
    keys+=("${P}r:ns:p:__rand_int__.$i" "${P}s:ns:p")
    args+=(c "ns:p:__rand_int__.$i" 1800000000000 0123456789abcdef0123456789abcdef noop 123456789
        1800000030000 1800086400000 1000000000 1000000000 "$P" 100)
done
measure "the batch script, $BATCH claims each, per claim" "$BATCH" EVALSHA "$BATCH_SCRIPT" \
    $((2 + 2 * BATCH)) "${P}all" "${P}run" "${keys[@]}" "${args[@]}"
