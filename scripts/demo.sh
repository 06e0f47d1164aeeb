#!/usr/bin/env bash
# make demo: the outbox end to end on local services. Starts PostgreSQL and Kafka (make up, which
# installs only what they need: no test tools), builds and migrates, runs the relay in the
# background, writes orders with their outbox events and reads the events back from Kafka
# (examples/demo), shows where to look next (the relay's metrics, outbox-relay status), stops the
# relay with SIGTERM, and stops the services (make down) whatever happened. Re-runnable: the
# services keep their data between runs, the relay resumes its slot, and the demo prints only the
# events it just wrote.
set -euo pipefail

cd "$(dirname "$0")/.."
LOCAL="${LOCAL:-.local}"
RELAY_LOG="$LOCAL/demo-relay.log"
METRICS_ADDR="${DEMO_METRICS_ADDR:-127.0.0.1:9187}"
relay_pid=""
demo_pid=""

step() { printf '\n==> %s\n' "$*"; }

# stop_relay sends SIGTERM and waits (bounded) for the relay to exit; it returns the exit status.
stop_relay() {
  local pid="$relay_pid" status=0
  relay_pid=""
  [[ -n "$pid" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 450); do # the relay's shutdown_timeout is 30s
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "relay did not stop within 45s of SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || status=$?
  return "$status"
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n "$demo_pid" ]]; then
    kill -TERM "$demo_pid" 2>/dev/null || true
    wait "$demo_pid" 2>/dev/null || true
  fi
  if [[ -n "$relay_pid" ]]; then
    stop_relay || true
    if [[ -f "$RELAY_LOG" ]]; then
      step "relay log ($RELAY_LOG), last lines"
      tail -n 20 "$RELAY_LOG"
    fi
  fi
  step "make down"
  make --no-print-directory down LOCAL="$LOCAL" || true
  if [[ $status -ne 0 ]]; then
    printf '\ndemo FAILED (exit status %d)\n' "$status" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "make up: PostgreSQL (wal_level=logical) and Kafka"
make --no-print-directory up LOCAL="$LOCAL"
set -a
# shellcheck disable=SC1091
. "$LOCAL/services.env"
set +a

step "go build -o bin/outbox-relay ./cmd/outbox-relay"
go build -o bin/outbox-relay ./cmd/outbox-relay

step "bin/outbox-relay migrate"
bin/outbox-relay migrate

step "bin/outbox-relay run --log-format=console --kafka.auto-create-topics --metrics-addr=$METRICS_ADDR (the demo's topic is created by its first event; in the background, log in $RELAY_LOG)"
bin/outbox-relay run --log-format=console --kafka.auto-create-topics --metrics-addr="$METRICS_ADDR" >"$RELAY_LOG" 2>&1 &
relay_pid=$!
echo "relay pid $relay_pid"

step "examples/demo: write orders and their events, read them back from Kafka"
go build -o bin/outbox-demo ./examples/demo
bin/outbox-demo &
demo_pid=$!
# Fail fast if the relay dies meanwhile, rather than when the demo times out.
while kill -0 "$demo_pid" 2>/dev/null; do
  if ! kill -0 "$relay_pid" 2>/dev/null; then
    echo "the relay exited while the demo ran" >&2
    exit 1
  fi
  sleep 0.2
done
status=0
wait "$demo_pid" || status=$?
demo_pid=""
if [[ $status -ne 0 ]]; then
  exit "$status"
fi

step "where to look next, while the relay runs"
echo "  metrics:  http://$METRICS_ADDR/metrics  (health: /healthz, /readyz; alerts and what to do: docs/operations.md)"
echo "  the slot: bin/outbox-relay status  (with $LOCAL/services.env in the environment)"
echo "  keys:     docs/configuration.md, or bin/outbox-relay run -h"
if command -v curl >/dev/null; then
  printf '\n$ curl -s http://%s/metrics | grep ^outbox_relay_events_published_total\n' "$METRICS_ADDR"
  curl -s --max-time 5 "http://$METRICS_ADDR/metrics" | grep '^outbox_relay_events_published_total' || true
fi
printf '\n$ bin/outbox-relay status\n'
bin/outbox-relay status || true

step "stop the relay (SIGTERM)"
status=0
stop_relay || status=$?
echo "relay exited with status $status"
step "relay log ($RELAY_LOG), last lines"
tail -n 8 "$RELAY_LOG"
if [[ $status -ne 0 ]]; then
  exit "$status"
fi
printf '\ndemo OK. To run it yourself: make up, then "Running it" in README.md.\n'
