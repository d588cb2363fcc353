#!/usr/bin/env bash
# What billing costs in throughput, measured from outside: a simulated vLLM
# server and one `tollgate serve` per billing mode, each its own process, and
# wrk (a C load generator, its own process) driving them over loopback. The
# modes take turns, one slice each per round (off, sqlite, sqlite-durable,
# [postgres], off, ...), so that the VM's slow spells fall on every mode; the
# script prints each slice and, per mode, the median over the rounds of its
# throughput and of its ratio to off in the same round.
#
# The in-process benchmark (BenchmarkBilling, docs/performance.md "Billing")
# runs the load generator and the simulator on tollgate's own Go scheduler;
# this one gives each its own process, as in a deployment.
#
#   scripts/bench-billing-wrk.sh                     # 128 connections, 3 s slices, 6 rounds
#   CONNS=256 ROUNDS=8 DURATION=2s scripts/bench-billing-wrk.sh
#   STREAM=1 scripts/bench-billing-wrk.sh            # streamed requests
#   MODES="off sqlite" scripts/bench-billing-wrk.sh
#   TOLLGATE_TEST_POSTGRES=postgres://... adds the postgres mode (in a schema of its own)
#
# Requests: 16 completion tokens, max_tokens 64, as BenchmarkBilling sends.
# Needs wrk (apt-get install wrk). Ports 19101 (simulator) and 1811x (tollgate).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-bench.sh
CONNS=${CONNS:-128}
DURATION=${DURATION:-3s}
ROUNDS=${ROUNDS:-6}
STREAM=${STREAM:-0}
if [ -z "${MODES:-}" ]; then
  MODES="off sqlite sqlite-durable"
  [ -n "${TOLLGATE_TEST_POSTGRES:-}" ] && MODES="$MODES postgres"
fi
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 2; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${schema:-}" ]; then
    psql "$TOLLGATE_TEST_POSTGRES" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/tollgate" ./cmd/tollgate
"$work/tollgate" simulate --flavour vllm --listen 127.0.0.1:19101 --model bench-up --no-record --context 1048576 \
  >"$work/sim.log" 2>&1 &
pids+=($!)

stream=false
[ "$STREAM" = 1 ] && stream=true
port=18110
declare -A url
for mode in $MODES; do
  port=$((port + 1))
  dir="$work/$mode"
  mkdir -p "$dir"
  store="  sqlite: $dir/tollgate.db"
  extra=""
  case $mode in
    off) extra=$'billing:\n  disabled: true' ;;
    sqlite) ;;                                                    # the default: the charge journal
    sqlite-durable) extra=$'billing:\n  journal: "off"' ;;            # every response waits for its durable commit
    sqlite-async) extra=$'billing:\n  journal: "off"\n  async_settle: true' ;;
    sqlite-normal) store="$store"$'\n  sqlite_synchronous: normal' ;;
    postgres)
      schema="tg_wrk_$$"
      psql "$TOLLGATE_TEST_POSTGRES" -qc "CREATE SCHEMA $schema" >/dev/null
      sep='?'
      case $TOLLGATE_TEST_POSTGRES in *\?*) sep='&' ;; esac
      export TG_WRK_PG="$TOLLGATE_TEST_POSTGRES${sep}search_path=$schema"
      store="  postgres_url_env: TG_WRK_PG" ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  start_tollgate "$work/tollgate" "$dir" "$port" "$store" "$extra" http://127.0.0.1:19101
  pids+=("$TOLLGATE_PID")
  key=$TOLLGATE_KEY
  cat >"$dir/req.lua" <<LUA
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
wrk.body = '{"model":"bench","max_tokens":64,"stream":$stream,"messages":[{"role":"user","content":"Benchmark me. [sim tokens=16]"}]}'
LUA
  url[$mode]="http://127.0.0.1:$port"
done

# wrk prints non-2xx responses and socket errors; a slice with either is a failure.
slice() { # $1 mode, $2 duration -> "req/s p50"
  local out
  out=$(wrk -t1 -c"$CONNS" -d"$2" --latency -s "$work/$1/req.lua" "${url[$1]}")
  if echo "$out" | grep -q "Non-2xx\|Socket errors"; then
    echo "$1: failed requests:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "$(echo "$out" | awk '/Requests\/sec/ {print $2}') $(echo "$out" | awk '$1=="50%" {print $2}')"
}

echo "wrk -c$CONNS, $DURATION slices, $ROUNDS rounds, streamed $stream, $(nproc) CPUs; modes: $MODES"
for mode in $MODES; do slice "$mode" 1s >/dev/null; done # warm-up
declare -A rps ratios
for r in $(seq 1 "$ROUNDS"); do
  line="round $r:"
  off=""
  for mode in $MODES; do
    read -r x p50 <<<"$(slice "$mode" "$DURATION")"
    rps[$mode]+="$x "
    [ "$mode" = off ] && off=$x
    if [ -n "$off" ] && [ "$mode" != off ]; then
      ratios[$mode]+="$(awk -v a="$x" -v b="$off" 'BEGIN {printf "%.3f", a/b}') "
    fi
    line+="  $mode $(printf '%.0f' "$x") req/s (p50 $p50)"
  done
  echo "$line"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
range() { tr ' ' '\n' | grep . | sort -g | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%s–%s", lo, hi}'; }
for mode in $MODES; do
  m=$(echo "${rps[$mode]}" | median)
  if [ "$mode" = off ] || [ -z "${ratios[$mode]:-}" ]; then
    printf "%-13s median %8.0f req/s\n" "$mode" "$m"
  else
    printf "%-13s median %8.0f req/s   ratio to off %.2f (%s)\n" "$mode" "$m" \
      "$(echo "${ratios[$mode]}" | median)" "$(echo "${ratios[$mode]}" | range)"
  fi
done
