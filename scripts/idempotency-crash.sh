#!/usr/bin/env bash
# Idempotency-Key across a crash, at volume (opt-in, not run by CI): thousands
# of keyed requests through `tollgate serve` processes, a kill -9 of one of
# them while they run, every key resent after the key's lease (2 s here) to a
# live process, and the ledger counted: a key charged twice is a failure.
# SQLite: one process, killed and restarted. PostgreSQL (when
# TOLLGATE_TEST_POSTGRES is set): three processes, one killed and replaced.
#
#   scripts/idempotency-crash.sh                 # 3000 keys, 64 at a time, backend answers in 100 ms
#   KEYS=10000 CONC=128 TTFT=50ms KILL_AFTER=2s scripts/idempotency-crash.sh
#   TOLLGATE_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' scripts/idempotency-crash.sh
#
# It runs the end-to-end tests of cmd/tollgate/idempotency_crash_test.go with a
# bigger batch (each begins with one deterministic crash between the charge
# and the stored answer) and prints, per store, the test's figures line:
# answers of the first send, of the resend (ran, replayed, lost), and the
# charges against the keys. docs/idempotency.md has the figures of a run.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOLLGATE_IDEM_CRASH_KEYS=${KEYS:-3000}
export TOLLGATE_IDEM_CRASH_CONC=${CONC:-64}
export TOLLGATE_IDEM_CRASH_TTFT=${TTFT:-100ms}
export TOLLGATE_IDEM_CRASH_KILL_AFTER=${KILL_AFTER:-1500ms}
tests=TestIdempotencyCrashAfterTheChargeSQLite
if [ -n "${TOLLGATE_TEST_POSTGRES:-}" ]; then
  tests="$tests|TestIdempotencyCrashAfterTheChargePostgres"
else
  echo "TOLLGATE_TEST_POSTGRES is not set: SQLite only" >&2
fi
go test -count=1 -timeout 30m -v -run "^($tests)\$" ./cmd/tollgate/ |
  grep -E '^(=== RUN|--- |ok|FAIL)|idempotency_crash_test.go:[0-9]+: ' || true
