#!/usr/bin/env bash
# Two tollgate builds side by side in one run: the CPU time each `tollgate
# serve` process spends per request (utime+stime from /proc, and stime alone,
# divided by the requests wrk completed), its throughput and latency, and the simulator
# direct as the reference, for non-streamed and streamed requests. The two
# builds serve the same simulator, each with its own SQLite store (auth and
# billing on); they are measured in turn (A, B, A, B, ...), so a change in
# the machine's state shows as spread between rounds, not as a difference.
#
#   scripts/bench-cpu.sh /tmp/tg-before /tmp/tg-after
#   ROUNDS=3 DURATION=10s TOKENS=50 scripts/bench-cpu.sh A B
#
# Needs wrk (apt-get install wrk). Ports 19001 (simulator), 18080 (A), 18081 (B).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-bench.sh
A=${1:?usage: bench-cpu.sh BINARY_A BINARY_B}
B=${2:?usage: bench-cpu.sh BINARY_A BINARY_B}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
TOKENS=${TOKENS:-50}
CELLS=${CELLS:-"plain:10 plain:64 stream:10"}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

"$A" simulate --flavour vllm --listen 127.0.0.1:19001 --model bench-up --no-record --context 1048576 >"$work/sim.log" 2>&1 &
mkdir -p "$work/a" "$work/b"
start_tollgate "$A" "$work/a" 18080 "  sqlite: $work/a/tollgate.db" "" http://127.0.0.1:19001
keyA=$TOLLGATE_KEY pidA=$TOLLGATE_PID
start_tollgate "$B" "$work/b" 18081 "  sqlite: $work/b/tollgate.db" "" http://127.0.0.1:19001
keyB=$TOLLGATE_KEY pidB=$TOLLGATE_PID

script() { # $1 file, $2 model, $3 key (may be empty), $4 stream (true/false)
  local content="Write one short sentence about gateways."
  [ "$4" = true ] && content="$content [sim tokens=$TOKENS]"
  cat >"$1" <<LUA
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
$( [ -n "$3" ] && echo "wrk.headers[\"Authorization\"] = \"Bearer $3\"" )
wrk.body = '{"model":"$2","stream":$4,"messages":[{"role":"user","content":"$content"}]}'
LUA
}
for s in true false; do
  script "$work/direct-$s.lua" bench-up "" $s
  script "$work/a-$s.lua" bench "$keyA" $s
  script "$work/b-$s.lua" bench "$keyB" $s
done

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
sys() { awk '{print $15}' "/proc/$1/stat"; }
run() { # $1 label, $2 lua, $3 url, $4 conns, $5 pid (empty: no CPU figure)
  local before after sbefore safter out reqs rps p50 p99 ms="-" sms="-"
  [ -n "$5" ] && before=$(cpu "$5") && sbefore=$(sys "$5")
  out=$(wrk -t1 -c"$4" -d"$DURATION" --latency -s "$2" "$3")
  [ -n "$5" ] && after=$(cpu "$5") && safter=$(sys "$5")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  [ -n "$5" ] && ms=$(awk -v d=$((after - before)) -v n="$reqs" -v t="$ticks" 'BEGIN {printf "%.3f", d * 1000 / t / n}')
  [ -n "$5" ] && sms=$(awk -v d=$((safter - sbefore)) -v n="$reqs" -v t="$ticks" 'BEGIN {printf "%.3f", d * 1000 / t / n}')
  printf "%-7s %-4s %-7s req/s %-9s p50 %-8s p99 %-8s cpu ms/req %-6s (system %-6s) non-2xx %s\n" "$cell" "$4" "$1" "$rps" "$p50" "$p99" "$ms" "$sms" "${non2xx:-0}"
}

echo "wrk, $DURATION per run, $ROUNDS rounds, $(nproc) CPUs; A=$A B=$B; streams of $TOKENS tokens"
for c in $CELLS; do
  cell=${c%%:*} conns=${c##*:}
  s=false
  [ "$cell" = stream ] && s=true
  run direct "$work/direct-$s.lua" http://127.0.0.1:19001 "$conns" ""
  for _ in $(seq "$ROUNDS"); do
    run A "$work/a-$s.lua" http://127.0.0.1:18080 "$conns" "$pidA"
    run B "$work/b-$s.lua" http://127.0.0.1:18081 "$conns" "$pidB"
  done
done
