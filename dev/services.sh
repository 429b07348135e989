#!/usr/bin/env bash
# Start/stop every local service the tests need (Kafka, PostgreSQL).
#
#   eval "$(dev/services.sh start | grep ^export)"
#   dev/services.sh stop
#   dev/services.sh status
#
# start runs both starts in parallel; progress goes to stderr, stdout gets only the
# export lines (LOOMFLOW_KAFKA_BOOTSTRAP, LOOMFLOW_POSTGRES_DSN).
set -euo pipefail

DEV="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

cmd_start() {
  tmp="$(mktemp -d)"   # global: the EXIT trap runs after this function has returned
  trap 'rm -rf "$tmp"' EXIT
  local pg_rc=0 kafka_rc=0 pg_pid
  "$DEV/postgres.sh" start >"$tmp/postgres.out" &
  pg_pid=$!
  "$DEV/kafka.sh" start >"$tmp/kafka.out" || kafka_rc=$?
  wait "$pg_pid" || pg_rc=$?
  (( kafka_rc == 0 )) || echo "services: ERROR: dev/kafka.sh start failed (exit $kafka_rc)" >&2
  (( pg_rc == 0 )) || echo "services: ERROR: dev/postgres.sh start failed (exit $pg_rc)" >&2
  (( kafka_rc == 0 && pg_rc == 0 )) || exit 1
  grep '^export ' "$tmp/kafka.out" "$tmp/postgres.out" -h
}

cmd_stop() {
  local rc=0
  "$DEV/kafka.sh" stop || rc=1
  "$DEV/postgres.sh" stop || rc=1
  return "$rc"
}

cmd_status() {
  local rc=0
  "$DEV/kafka.sh" status || rc=1
  "$DEV/postgres.sh" status || rc=1
  return "$rc"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
esac
