#!/usr/bin/env bash
# Server CPU of the PostgreSQL store's two statements per executed call (the claim and the
# completion, as calls of the store's functions idem_claim_v1 / idem_complete_v1), of the same
# work in batches of BATCH (default 8) claims and then their completions (idem_batch_v1, as the
# store runs what waits at the same time), of the floor under a batch (the same rows inserted and
# updated as plain sets), and of the floor of two single-row UPDATEs each committed on its own:
# pgbench (-M extended, unnamed statements, as the store sends them) with 4 clients for 10 s; the
# CPU of pgbench's own backends (from /proc, so run as root or as the server's user, on the
# server's machine) over the middle 6 s, per claim + completion.
#
#   [BATCH=N] scripts/pg-call-cost.sh [postgres://USER@HOST:PORT/DB]     (default: DATABASE_URL)
#
# Creates the schema mcp_idem_call_cost (through `mcp-idem inspect stats`, which opens the store)
# and the table mcp_idem_call_cost.floor, and drops them at the end.
set -euo pipefail
URL=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
BIN=${MCP_IDEM_BIN:-$(dirname "$0")/../target/release/mcp-idem}
S=mcp_idem_call_cost
DIR=$(mktemp -d)
trap 'psql "$URL" -qc "DROP SCHEMA IF EXISTS $S CASCADE" >/dev/null 2>&1; rm -rf "$DIR"' EXIT

"$BIN" inspect stats --store "$URL?schema=$S" >/dev/null
psql "$URL" -q <<SQL
UPDATE $S.idem_total_shards SET capacity = 62500000, capacity_limit = 1000000000;
INSERT INTO $S.idem_scope_shards (namespace, principal, shard, records, capacity, capacity_limit)
SELECT 'ns', 'p', g::int2, 0, 62500000, 1000000000 FROM generate_series(0, 15) AS g;
CREATE TABLE $S.floor (id int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO $S.floor SELECT g, 0 FROM generate_series(1, 100000) AS g;
SQL
cat >"$DIR/call.sql" <<SQL
\set k random(1, 1000000000000)
\set sh random(0, 15)
SELECT * FROM $S.idem_claim_v1('ns', 'p', 'k' || :k, '\x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20'::bytea, 'noop', 123456789, 1800000030000, 1800000000000, 1800086400000, 1000000000, 1000000000, :sh::int2);
SELECT $S.idem_complete_v1('ns', 'p', 'k' || :k, 123456789, 'result', '{"content":[{"type":"text","text":"ok"}]}', 1800000000000, 1800086400000);
SQL
# The same 8 claims, then their 8 completions, each set as one call of the batch function
# (idem_batch_v1), as the store sends what waits at the same time.
N=${BATCH:-8}
FP='\x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20'
cat >"$DIR/batch.sql" <<SQL
\set k random(1, 1000000000000)
SELECT count(*) FROM $S.idem_batch_v1(array_fill('ns'::text, ARRAY[$N]), array_fill('p'::text, ARRAY[$N]), ARRAY(SELECT 'k' || :k || '-' || g FROM generate_series(1, $N) AS g), array_fill('$FP'::bytea, ARRAY[$N]), array_fill('noop'::text, ARRAY[$N]), array_fill(123456789::int8, ARRAY[$N]), array_fill(1800000030000::int8, ARRAY[$N]), array_fill(1800000000000::int8, ARRAY[$N]), array_fill(1800086400000::int8, ARRAY[$N]), array_fill(1000000000::int8, ARRAY[$N]), array_fill(1000000000::int8, ARRAY[$N]), ARRAY(SELECT (g % 16)::int2 FROM generate_series(1, $N) AS g), '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}');
SELECT count(*) FROM $S.idem_batch_v1('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', array_fill('ns'::text, ARRAY[$N]), array_fill('p'::text, ARRAY[$N]), ARRAY(SELECT 'k' || :k || '-' || g FROM generate_series(1, $N) AS g), array_fill(123456789::int8, ARRAY[$N]), array_fill('result'::text, ARRAY[$N]), array_fill('{"content":[{"type":"text","text":"ok"}]}'::text, ARRAY[$N]), array_fill(1800000000000::int8, ARRAY[$N]), array_fill(1800086400000::int8, ARRAY[$N]));
SQL
# The floor under it: the same rows written and updated as sets, one statement each, with none of
# the store's checks (no counters, no conflict handling, no answers).
cat >"$DIR/batch-floor.sql" <<SQL
\set k random(1, 1000000000000)
INSERT INTO $S.idem_records (namespace, principal, key, fingerprint, tool_name, owner, lease_expires_at, created_at, expires_at, shard) SELECT 'ns', 'p' || :k, 'k' || g, '$FP'::bytea, 'noop', 123456789, 1800000030000, 1800000000000, 1800086400000, (g % 16)::int2 FROM generate_series(1, $N) AS g;
UPDATE $S.idem_records SET owner = NULL, lease_expires_at = NULL, outcome_kind = 'result', outcome_body = '{"content":[{"type":"text","text":"ok"}]}', completed_at = 1800000000000, expires_at = 1800086400000 FROM generate_series(1, $N) AS g WHERE namespace = 'ns' AND principal = 'p' || :k AND key = ('k' || g) COLLATE "C";
SQL
cat >"$DIR/floor.sql" <<SQL
\set id random(1, 100000)
UPDATE $S.floor SET v = v + 1 WHERE id = :id;
UPDATE $S.floor SET v = v + 1 WHERE id = :id;
SQL

# $1: script, $2: SQL counting the calls done so far
measure() {
    PGAPPNAME=mcp-idem-call-cost pgbench "$URL" -n -M extended -c 4 -j 1 -T 10 -f "$1" >/dev/null 2>&1 &
    local bench=$!
    sleep 1.5
    local pids
    pids=$(psql "$URL" -tAc "SELECT pid FROM pg_stat_activity WHERE application_name = 'mcp-idem-call-cost'")
    cpu() { local t=0 p; for p in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
    local n1 c1 n2 c2
    n1=$(psql "$URL" -tAc "$2"); c1=$(cpu)
    sleep 6
    n2=$(psql "$URL" -tAc "$2"); c2=$(cpu)
    wait "$bench"
    local ticks=$(getconf CLK_TCK)
    echo "$(( (n2 - n1) / 6 )) per second, backend CPU $(( (c2 - c1) * 1000000 / ticks / (n2 - n1) )) us each"
}

echo "synchronous_commit: $(psql "$URL" -tAc 'SHOW synchronous_commit'), fsync: $(psql "$URL" -tAc 'SHOW fsync')"
echo "claim + completion (the store's functions): $(measure "$DIR/call.sql" "SELECT count(*) FROM $S.idem_records")"
echo "claim + completion, in batches of $N:        $(measure "$DIR/batch.sql" "SELECT count(*) FROM $S.idem_records")"
echo "floor of that, plain set-based statements:  $(measure "$DIR/batch-floor.sql" "SELECT count(*) FROM $S.idem_records")"
echo "floor, two committed single-row UPDATEs:   $(measure "$DIR/floor.sql" "SELECT sum(v)::bigint / 2 FROM $S.floor")"
