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
#
# Environment:
#   LOOMFLOW_KAFKA_PORT             client port (default 9092)
#   LOOMFLOW_KAFKA_CONTROLLER_PORT  controller port (default 9093)
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

CACHE="$ROOT/.cache/kafka"
LIBS="$CACHE/libs"
DATA="$CACHE/data"
CONF="$CACHE/server.properties"
PIDFILE="$CACHE/kafka.pid"
LOGFILE="$CACHE/kafka.log"
CLUSTER_ID_FILE="$CACHE/cluster.id"
POM="$ROOT/dev/kafka/pom.xml"
LOG4J="$ROOT/dev/kafka/log4j2.properties"
VENV_PY="$ROOT/.venv/bin/python"

log() { echo "kafka: $*" >&2; }
die() { echo "kafka: ERROR: $*" >&2; exit 1; }

# Options for short-lived CLI tools (StorageTool, TopicCommand): quick JVM start, quiet logs.
TOOL_JAVA_OPTS=(
  -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$LOG4J"
  -Dloomflow.kafka.log.level=WARN -Dloomflow.kafka.log.target=SYSTEM_ERR
)

require_java() {
  command -v java >/dev/null 2>&1 || die "java not found on PATH (Kafka 4 needs Java 17+; apt-get install openjdk-17-jre-headless)"
  local v
  v="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2; exit}')"
  if ! [[ "${v%%.*}" =~ ^[0-9]+$ ]] || (( ${v%%.*} < 17 )); then
    die "Kafka 4 needs Java 17+, but 'java' is version '${v:-unknown}'"
  fi
}

# --- jars ---------------------------------------------------------------------------------------
pom_stamp() { sha256sum "$POM" | cut -d' ' -f1; }

libs_present() {
  [[ -f "$LIBS/.stamp" && "$(cat "$LIBS/.stamp")" == "$(pom_stamp)" ]] \
    && compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null
}

fetch_libs() {
  libs_present && return 0
  command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (needed once to fetch the Kafka jars; apt-get install maven)"
  log "fetching Kafka jars with Maven into .cache/kafka/libs ..."
  local staging="$CACHE/libs.staging"
  rm -rf "$staging"
  mkdir -p "$staging"
  local mvn_log="$CACHE/mvn.log"
  if ! mvn -B -q -f "$POM" dependency:copy-dependencies "-Dkafka.libs.dir=$staging" \
      </dev/null >"$mvn_log" 2>&1; then
    tail -n 30 "$mvn_log" >&2 || true
    rm -rf "$staging"
    die "Maven could not fetch the Kafka jars (dev/kafka/pom.xml); full output in $mvn_log"
  fi
  compgen -G "$staging/kafka_2.13-*.jar" >/dev/null \
    || die "Maven ran but no kafka_2.13 jar landed in $staging"
  pom_stamp >"$staging/.stamp"
  rm -rf "$LIBS"
  mv "$staging" "$LIBS"
}

# --- process bookkeeping ------------------------------------------------------------------------
# Is $1 a live broker process started with this checkout's config?
is_our_broker() {
  local pid="$1" cmdline
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  [[ "$cmdline" == *kafka.Kafka* && "$cmdline" == *"$CONF"* ]]
}

# Prints the broker pid (from the pid file, else by scanning for our exact config path).
find_pid() {
  local pid
  if [[ -f "$PIDFILE" ]]; then
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if is_our_broker "$pid"; then echo "$pid"; return 0; fi
  fi
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    if is_our_broker "$pid"; then echo "$pid"; return 0; fi
  done
  return 1
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

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

have_python_probe() {
  [[ -x "$VENV_PY" ]] && "$VENV_PY" -c 'import aiokafka' >/dev/null 2>&1
}

# Real readiness: the broker answers a metadata request and lists itself.
answering() {
  port_open || return 1
  case "$PROBE" in
    python) probe_python ;;
    java) libs_present && probe_java ;;
    auto)
      if have_python_probe; then probe_python
      elif libs_present; then probe_java
      else die "cannot check readiness: neither $VENV_PY with aiokafka nor the Kafka jars are available"
      fi ;;
    *) die "LOOMFLOW_KAFKA_PROBE must be auto, python or java (got '$PROBE')" ;;
  esac
}

# host:port the running broker was configured with (from the config written when it started).
running_bootstrap() {
  sed -n 's|^advertised.listeners=PLAINTEXT://||p' "$CONF" 2>/dev/null | head -n 1
}

print_exports() { echo "export LOOMFLOW_KAFKA_BOOTSTRAP=$BOOTSTRAP"; }

show_log_tail() {
  if [[ -s "$LOGFILE" ]]; then
    echo "kafka: ---- last lines of $LOGFILE ----" >&2
    tail -n 40 "$LOGFILE" >&2 || true
    echo "kafka: ----" >&2
  fi
}

# --- config & storage ---------------------------------------------------------------------------
write_config() {
  mkdir -p "$DATA"
  cat >"$CONF.tmp" <<EOF
# Generated by dev/kafka.sh; edits are overwritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
EOF
  mv "$CONF.tmp" "$CONF"
}

format_storage_once() {
  [[ -f "$DATA/meta.properties" ]] && return 0
  # Half-formatted or foreign leftovers: start clean.
  rm -rf "$DATA"
  mkdir -p "$DATA"
  local cluster_id
  if [[ -s "$CLUSTER_ID_FILE" ]]; then
    cluster_id="$(cat "$CLUSTER_ID_FILE")"
  else
    cluster_id="$(java "${TOOL_JAVA_OPTS[@]}" -cp "$LIBS/*" kafka.tools.StorageTool random-uuid </dev/null)" \
      || die "kafka.tools.StorageTool random-uuid failed"
    echo "$cluster_id" >"$CLUSTER_ID_FILE"
  fi
  log "formatting KRaft storage (cluster id $cluster_id) ..."
  local out
  if ! out="$(java "${TOOL_JAVA_OPTS[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format \
      -t "$cluster_id" -c "$CONF" </dev/null 2>&1)"; then
    echo "$out" >&2
    rm -rf "$DATA"
    die "kafka.tools.StorageTool format failed"
  fi
}

# --- commands -----------------------------------------------------------------------------------
# wait_ready PID [existing]: wait until the broker answers; a broker launched by this call is
# stopped again if it never becomes ready, one found running is left alone.
wait_ready() {
  local pid="$1" origin="${2:-launched}" deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    if ! is_our_broker "$pid"; then
      show_log_tail
      rm -f "$PIDFILE"
      die "broker process $pid exited during startup"
    fi
    if answering; then return 0; fi
    if (( SECONDS >= deadline )); then
      show_log_tail
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
  [[ -f "$LOGFILE" ]] && mv -f "$LOGFILE" "$LOGFILE.1"
  # setsid: own session, so terminal signals to the caller don't reach the broker.
  # All standard streams are redirected so callers capturing our output don't hang.
  # shellcheck disable=SC2016  # $$ and $1 expand in the inner bash
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    java -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
      "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$CACHE/logs" \
      -cp "$LIBS/*" kafka.Kafka "$CONF" \
    </dev/null >"$LOGFILE" 2>&1 &
  local _
  for _ in $(seq 50); do
    [[ -s "$PIDFILE" ]] && break
    sleep 0.1
  done
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ -n "$pid" ]] || die "broker launch failed (no pid written to $PIDFILE)"
  wait_ready "$pid"
  log "ready on $BOOTSTRAP (pid $pid)"
  print_exports
}

stop_pid() {
  local pid="$1" _
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 300); do   # controlled shutdown usually takes a few seconds
    is_our_broker "$pid" || return 0
    sleep 0.1
  done
  log "pid $pid still alive after 30s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    is_our_broker "$pid" || return 0
    sleep 0.1
  done
  die "could not stop broker pid $pid"
}

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
