#!/usr/bin/env bash
# Load test of the running binaries with wrk: a simulated vLLM server, and
# tollgate serve in front of it (auth on; billing on unless BILLING=off),
# as three separate processes on loopback. Prints wrk's throughput and
# latency for the simulator direct and through tollgate, at each concurrency.
#
#   scripts/bench-wrk.sh                 # concurrencies 1 4 64, 10 s each
#   CONNS="4" DURATION=20s BILLING=off scripts/bench-wrk.sh
#
# Needs wrk (apt-get install wrk). Uses ports 19001 (simulator) and 18080 (tollgate).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-bench.sh
CONNS=${CONNS:-"1 4 64"}
DURATION=${DURATION:-10s}
BILLING=${BILLING:-on}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

go build -o "$work/tollgate" ./cmd/tollgate
"$work/tollgate" simulate --flavour vllm --listen 127.0.0.1:19001 --model bench-up --no-record --context 1048576 >"$work/sim.log" 2>&1 &
billing=""
[ "$BILLING" = off ] && billing=$'billing:\n  disabled: true\n'
start_tollgate "$work/tollgate" "$work" 18080 "  sqlite: $work/tollgate.db" "$billing" http://127.0.0.1:19001
key=$TOLLGATE_KEY

body='{"model":"MODEL","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Write one short sentence about gateways."}],"temperature":0.7}'
script() { # $1 model, $2 key (may be empty)
  cat >"$work/$1.lua" <<LUA
wrk.method = "POST"
wrk.path = "${3}"
wrk.headers["Content-Type"] = "application/json"
$( [ -n "$2" ] && echo "wrk.headers[\"Authorization\"] = \"Bearer $2\"" )
wrk.body = '${body/MODEL/$1}'
LUA
}
script bench-up "" /v1/chat/completions
script bench "$key" /v1/chat/completions
echo "wrk, $DURATION per run, billing $BILLING, $(nproc) CPUs"
for c in $CONNS; do
  for target in "direct bench-up http://127.0.0.1:19001" "tollgate bench http://127.0.0.1:18080"; do
    set -- $target
    out=$(wrk -t1 -c"$c" -d"$DURATION" --latency -s "$work/$2.lua" "$3")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p50=$(echo "$out" | awk '$1=="50%" {print $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    printf "conns %-3s %-9s req/s %-9s p50 %-8s p99 %-8s non-2xx %s\n" "$c" "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
  done
done
