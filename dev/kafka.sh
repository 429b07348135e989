#!/usr/bin/env bash
# Local single-node Kafka (KRaft, broker+controller) for tests and CI.
#
#   dev/kafka.sh start    fetch jars if missing, format storage once, start, wait until ready
#   dev/kafka.sh stop     stop the broker (SIGTERM, then SIGKILL after a grace period)
#   dev/kafka.sh restart  stop, then start (tests of what survives a broker restart)
#   dev/kafka.sh status   exit 0 if the broker answers metadata requests
#
# Everything lives in the git-ignored .cache/kafka/ of this checkout:
#   libs/              jars copied by Maven from dev/kafka/pom.xml
#   server.properties  generated broker config
#   data/              log.dirs (KRaft metadata + topic data)
#   kafka.pid          broker pid      kafka.log   broker output
# A second broker of the same checkout (the outage tests start one of their own) keeps all but
# the jars in a folder of its own, LOOMFLOW_KAFKA_DIR: start, stop and status act only on the
# broker run from that folder's config.
#
# Environment:
#   LOOMFLOW_KAFKA_PORT             client port (default 9092)
#   LOOMFLOW_KAFKA_CONTROLLER_PORT  controller port (default 9093)
#   LOOMFLOW_KAFKA_DIR              the broker's config, data, pid and log (default .cache/kafka)
#   LOOMFLOW_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 90)
#   LOOMFLOW_KAFKA_PROBE            auto (default) | python | java: how readiness is checked
#
# Progress goes to stderr; on a successful start/status stdout gets only
#   export LOOMFLOW_KAFKA_BOOTSTRAP=127.0.0.1:<port>
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${LOOMFLOW_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${LOOMFLOW_KAFKA_CONTROLLER_PORT:-9093}"
START_TIMEOUT="${LOOMFLOW_KAFKA_START_TIMEOUT:-90}"
PROBE="${LOOMFLOW_KAFKA_PROBE:-auto}"
BOOTSTRAP="$HOST:$PORT"

CACHE="$(realpath -m "${LOOMFLOW_KAFKA_DIR:-$ROOT/.cache/kafka}")"  # absolute: pids are found by it
DATA="$CACHE/data"
CONF="$CACHE/server.properties"
PIDFILE="$CACHE/kafka.pid"
LOGFILE="$CACHE/kafka.log"
CLUSTER_ID_FILE="$CACHE/cluster.id"

LOG_NAME=kafka
# shellcheck source=dev/kafka/lib.sh
source "$ROOT/dev/kafka/lib.sh"

# --- process bookkeeping ------------------------------------------------------------------------
# Prints the broker pid (from the pid file, else by scanning for our exact config path).
find_pid() { find_kafka_pid "$PIDFILE" "$CONF"; }
is_our_broker() { kafka_process "$1" "$CONF"; }

port_open() { tcp_open "$HOST" "$PORT"; }

# --- readiness ----------------------------------------------------------------------------------
probe_python() {
  timeout 20 "$VENV_PY" - "$BOOTSTRAP" <<'PY' >/dev/null 2>&1
import asyncio, sys
from aiokafka.client import AIOKafkaClient

async def main(bootstrap: str) -> int:
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await asyncio.wait_for(client.bootstrap(), 10)  # sends a metadata request
        return 0 if client.cluster.brokers() else 1
    finally:
        await client.close()

sys.exit(asyncio.run(main(sys.argv[1])))
PY
}

probe_java() {
  local client_conf="$CACHE/probe-client.properties"
  [[ -f "$client_conf" ]] || printf '%s\n' request.timeout.ms=5000 default.api.timeout.ms=10000 \
    socket.connection.setup.timeout.max.ms=5000 >"$client_conf"
  timeout 20 java "${TOOL_JAVA_OPTS[@]}" -cp "$LIBS/*" org.apache.kafka.tools.TopicCommand \
    --bootstrap-server "$BOOTSTRAP" --command-config "$client_conf" --list </dev/null >/dev/null 2>&1
}

# Real readiness: the broker answers a metadata request and lists itself.
answering() {
  port_open || return 1
  probe_with probe_python probe_java
}

# host:port the running broker was configured with (from the config written when it started).
running_bootstrap() {
  sed -n 's|^advertised.listeners=PLAINTEXT://||p' "$CONF" 2>/dev/null | head -n 1
}

print_exports() { echo "export LOOMFLOW_KAFKA_BOOTSTRAP=$BOOTSTRAP"; }

# --- config ---------------------------------------------------------------------------------------
write_config() {
  write_kafka_config "$CONF" 1 "1@$HOST:$CONTROLLER_PORT" "$HOST" "$PORT" "$CONTROLLER_PORT" \
    "$DATA" 1 1
}

format_storage_once() {
  [[ -f "$DATA/meta.properties" ]] && return 0
  format_storage "$CONF" "$DATA" "$(new_cluster_id "$CLUSTER_ID_FILE")"
}

# --- commands -----------------------------------------------------------------------------------
# wait_ready PID [existing]: wait until the broker answers; a broker launched by this call is
# stopped again if it never becomes ready, one found running is left alone.
wait_ready() {
  local pid="$1" origin="${2:-launched}" deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    if ! is_our_broker "$pid"; then
      show_log_tail "$LOGFILE"
      rm -f "$PIDFILE"
      die "broker process $pid exited during startup"
    fi
    if answering; then return 0; fi
    if (( SECONDS >= deadline )); then
      show_log_tail "$LOGFILE"
      if [[ "$origin" == existing ]]; then
        die "broker pid $pid did not answer on $BOOTSTRAP within ${START_TIMEOUT}s (try 'dev/kafka.sh stop' and start again)"
      fi
      log "giving up after ${START_TIMEOUT}s; stopping pid $pid"
      stop_pid "$pid"
      die "broker did not answer on $BOOTSTRAP within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
}

cmd_start() {
  mkdir -p "$CACHE"
  local pid running
  if pid="$(find_pid)"; then
    running="$(running_bootstrap)"
    if [[ "$running" != "$BOOTSTRAP" ]]; then
      die "the broker of this checkout (pid $pid) is running on ${running:-an unknown address}, not $BOOTSTRAP; run 'dev/kafka.sh stop' first to change ports"
    fi
    if answering; then
      log "already running (pid $pid) on $BOOTSTRAP"
      print_exports
      return 0
    fi
    log "broker pid $pid exists but is not answering yet; waiting ..."
    require_java
    wait_ready "$pid" existing
    log "ready on $BOOTSTRAP (pid $pid)"
    print_exports
    return 0
  fi
  rm -f "$PIDFILE"

  if port_open; then
    # Something else listens there. If it is a working Kafka (e.g. started from another
    # checkout), use it. Checking needs either the Python probe or the jars.
    if ! have_python_probe; then require_java; fetch_libs; fi
    if answering; then
      log "a Kafka broker not started from this checkout already answers on $BOOTSTRAP; using it"
      print_exports
      return 0
    fi
    die "port $HOST:$PORT is in use by something that is not a working Kafka broker (set LOOMFLOW_KAFKA_PORT to use another port)"
  fi
  if (exec 3<>"/dev/tcp/$HOST/$CONTROLLER_PORT") 2>/dev/null; then
    die "controller port $HOST:$CONTROLLER_PORT is already in use (set LOOMFLOW_KAFKA_CONTROLLER_PORT)"
  fi

  require_java
  fetch_libs
  write_config
  format_storage_once

  log "starting broker on $BOOTSTRAP ..."
  pid="$(launch_kafka "$CONF" "$PIDFILE" "$LOGFILE" "$CACHE/logs" 512m)"
  wait_ready "$pid"
  log "ready on $BOOTSTRAP (pid $pid)"
  print_exports
}

stop_pid() { stop_kafka_pid "$1" "$CONF"; }

cmd_stop() {
  local pid
  if pid="$(find_pid)"; then
    log "stopping broker (pid $pid) ..."
    stop_pid "$pid"
    log "stopped"
  else
    log "not running"
  fi
  rm -f "$PIDFILE"
}

cmd_status() {
  local pid=""
  pid="$(find_pid)" || true
  if answering; then
    log "answering on $BOOTSTRAP${pid:+ (pid $pid)}"
    print_exports
    return 0
  fi
  if [[ -n "$pid" && "$(running_bootstrap)" != "$BOOTSTRAP" ]]; then
    log "not answering on $BOOTSTRAP; this checkout's broker (pid $pid) runs on $(running_bootstrap)"
  elif [[ -n "$pid" ]]; then
    log "process $pid is running but not answering on $BOOTSTRAP"
  else
    log "not running"
  fi
  return 1
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop && cmd_start ;;
  status) cmd_status ;;
  *) echo "usage: $0 {start|stop|restart|status}" >&2; exit 2 ;;
esac
