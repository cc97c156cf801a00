#!/usr/bin/env bash
# The deterministic simulation of the claim path (crates/simulator; docs/reliability.md,
# "Deterministic simulation"). Builds the simulator in release mode, then runs it:
#
#   scripts/simulate.sh --seeds N [--first S] [--faults a,b,…] [--mutant NAME] [--determinism]
#   scripts/simulate.sh --seed S [--history]     one seed; --history prints it whole
#   scripts/simulate.sh --list-mutants | --list-faults | --model-check
#
# Prints "N seeds, V violations"; exits 1 on a violation, after the broken seed's history, the
# invariants it broke and the command that replays it. --jobs J (before the other arguments)
# splits --seeds N over J processes.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=1
if [ "${1:-}" = "--jobs" ]; then
    jobs=$2
    shift 2
fi
cargo build --quiet --release -p mcp-idem-simulator --bin simulate
bin=${CARGO_TARGET_DIR:-target}/release/simulate
if [ "$jobs" -le 1 ]; then
    exec "$bin" "$@"
fi

# --jobs: the seeds in J slices, one process each, then one summary.
seeds= first=0 rest=()
while [ $# -gt 0 ]; do
    case $1 in
    --seeds) seeds=$2; shift 2 ;;
    --first) first=$2; shift 2 ;;
    *) rest+=("$1"); shift ;;
    esac
done
[ -n "$seeds" ] || { echo "--jobs needs --seeds N" >&2; exit 2; }
out=$(mktemp -d)
slice=$(( (seeds + jobs - 1) / jobs ))
start=$EPOCHREALTIME
pids=()
for ((j = 0; j < jobs; j++)); do
    from=$((first + j * slice))
    count=$(( seeds - j * slice < slice ? seeds - j * slice : slice ))
    [ "$count" -gt 0 ] || break
    "$bin" --seeds "$count" --first "$from" "${rest[@]}" >"$out/$j.txt" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
cat "$out"/*.txt | grep -v -e '^[0-9]* seeds, ' || true
awk '/^[0-9]+ seeds, / { n += $1; v += $3; gsub(/[(,]/, ""); c += $5; e += $7; f += $9 }
     END { printf "%d seeds, %d violations (%d calls, %d executions, %d faults,", n, v, c, e, f }' "$out"/*.txt
awk -v start="$start" -v end="$EPOCHREALTIME" -v jobs="$jobs" 'BEGIN { printf " %.0f s on %d processes)\n", end - start, jobs }'
rm -r "$out"
exit $status
