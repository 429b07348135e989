#!/usr/bin/env bash
# Local three-broker Kafka cluster (KRaft) for the fault-injection tests: what a production
# cluster does when a broker dies, on loopback.
#
#   dev/kafka-cluster.sh start         fetch jars if missing, format storage once, start the
#                                      nodes not running, wait until each of the three answers
#                                      on its port and is a broker in the cluster's metadata
#   dev/kafka-cluster.sh stop          stop every node (SIGTERM, then SIGKILL after a grace period)
#   dev/kafka-cluster.sh status        exit 0 if all three brokers serve
#   dev/kafka-cluster.sh kill N        SIGKILL node N (1, 2 or 3): a broker that dies
#   dev/kafka-cluster.sh start-node N  start node N again; wait until it serves again
#
# Each node is a broker and a controller (three voters): killing one leaves a quorum, killing
# two leaves none. Topics are replicated 3 times by default, with min.insync.replicas=2 (the
# internal topics too), as a production cluster is set up to lose no acknowledged write.
# The jars are dev/kafka.sh's (.cache/kafka/libs); everything else lives in the git-ignored
# .cache/kafka-cluster/ of this checkout:
#   cluster.id       node-N/server.properties   node-N/data/   node-N/kafka.pid   node-N/kafka.log
#
# Environment:
#   LOOMFLOW_KAFKA_CLUSTER_PORTS             client ports of nodes 1-3 (default 19092 19192 19292)
#   LOOMFLOW_KAFKA_CLUSTER_CONTROLLER_PORTS  controller ports (default 19093 19193 19293)
#   LOOMFLOW_KAFKA_CLUSTER_HEAP              maximum heap of each node (default 512m)
#   LOOMFLOW_KAFKA_START_TIMEOUT             seconds to wait for readiness (default 90)
#   LOOMFLOW_KAFKA_PROBE                     auto (default) | python | java: how readiness is checked
#
# Progress goes to stderr; on a successful start, start-node or status stdout gets only
#   export LOOMFLOW_KAFKA_BOOTSTRAP=127.0.0.1:<port 1>,127.0.0.1:<port 2>,127.0.0.1:<port 3>
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
read -r -a PORTS <<<"${LOOMFLOW_KAFKA_CLUSTER_PORTS:-19092 19192 19292}"
read -r -a CONTROLLER_PORTS <<<"${LOOMFLOW_KAFKA_CLUSTER_CONTROLLER_PORTS:-19093 19193 19293}"
HEAP="${LOOMFLOW_KAFKA_CLUSTER_HEAP:-512m}"
START_TIMEOUT="${LOOMFLOW_KAFKA_START_TIMEOUT:-90}"
PROBE="${LOOMFLOW_KAFKA_PROBE:-auto}"
NODES=(1 2 3)

CACHE="$ROOT/.cache/kafka-cluster"
CLUSTER_ID_FILE="$CACHE/cluster.id"

LOG_NAME=kafka-cluster
# shellcheck source=dev/kafka/lib.sh
source "$ROOT/dev/kafka/lib.sh"

(( ${#PORTS[@]} == 3 )) || die "LOOMFLOW_KAFKA_CLUSTER_PORTS must list 3 ports (got '${PORTS[*]}')"
(( ${#CONTROLLER_PORTS[@]} == 3 )) \
  || die "LOOMFLOW_KAFKA_CLUSTER_CONTROLLER_PORTS must list 3 ports (got '${CONTROLLER_PORTS[*]}')"

node_dir() { echo "$CACHE/node-$1"; }
node_conf() { echo "$CACHE/node-$1/server.properties"; }
node_pidfile() { echo "$CACHE/node-$1/kafka.pid"; }
node_log() { echo "$CACHE/node-$1/kafka.log"; }
node_port() { echo "${PORTS[$1 - 1]}"; }
node_controller_port() { echo "${CONTROLLER_PORTS[$1 - 1]}"; }
node_pid() { find_kafka_pid "$(node_pidfile "$1")" "$(node_conf "$1")"; }

bootstrap() {
  local n list=()
  for n in "${NODES[@]}"; do list+=("$HOST:$(node_port "$n")"); done
  (IFS=,; echo "${list[*]}")
}

print_exports() { echo "export LOOMFLOW_KAFKA_BOOTSTRAP=$(bootstrap)"; }

check_node() {
  [[ "${1:-}" =~ ^[123]$ ]] || die "name a node: 1, 2 or 3 (got '${1:-}')"
}

# --- readiness ----------------------------------------------------------------------------------
# serving N...: print those of nodes N... that serve, one a line: the node answers a metadata
# request on its own client port, is a broker in the cluster's metadata (registered and
# unfenced), and has caught up: it is in the in-sync replicas of every partition it holds. A
# node opens its client port only once the controller has unfenced it, so a restarted node is
# not taken for the registration its killed predecessor left behind; and one that is not yet
# back in sync would leave a partition with fewer copies than its replication says.
serving_python() {
  local n addresses=()
  for n in "$@"; do addresses+=("$n=$HOST:$(node_port "$n")"); done
  timeout 20 "$VENV_PY" - "${addresses[@]}" <<'PY' 2>/dev/null || true
import asyncio, sys
from aiokafka.admin import AIOKafkaAdminClient

async def serving(node: int, address: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=address, request_timeout_ms=5000)
    try:
        await asyncio.wait_for(admin.start(), 10)  # a metadata request to this node
        brokers = (await admin.describe_cluster())["brokers"]
        if not any(broker["node_id"] == node for broker in brokers):
            return False
        return all(
            node in partition["isr"]
            for topic in await admin.describe_topics()
            for partition in topic["partitions"]
            if node in partition["replicas"]
        )
    except Exception:
        return False
    finally:
        await admin.close()

async def main(nodes: list[str]) -> None:
    pairs = [(int(n), address) for n, address in (item.split("=", 1) for item in nodes)]
    answers = await asyncio.gather(*(serving(n, address) for n, address in pairs))
    for (n, _), yes in zip(pairs, answers):
        if yes:
            print(n)

asyncio.run(main(sys.argv[1:]))
PY
}

serving_java() {
  local client_conf="$CACHE/probe-client.properties" n address
  [[ -f "$client_conf" ]] || printf '%s\n' request.timeout.ms=5000 default.api.timeout.ms=10000 \
    socket.connection.setup.timeout.max.ms=5000 >"$client_conf"
  for n in "$@"; do
    address="$HOST:$(node_port "$n")"
    # lines like "127.0.0.1:19092 (id: 1 rack: null isFenced: false) -> ("
    timeout 20 java "${TOOL_JAVA_OPTS[@]}" -cp "$LIBS/*" org.apache.kafka.tools.BrokerApiVersionsCommand \
      --bootstrap-server "$address" --command-config "$client_conf" </dev/null 2>/dev/null \
      | grep -q "(id: $n " || continue
    # lines like "Topic: t  Partition: 0  Leader: 1  Replicas: 1,2,3  Isr: 1,3  Elr: ..."
    timeout 20 java "${TOOL_JAVA_OPTS[@]}" -cp "$LIBS/*" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$address" --command-config "$client_conf" --describe </dev/null 2>/dev/null \
      | awk -v n="$n" '
          /Replicas:/ {
            for (k = 1; k < NF; k++) { if ($k == "Replicas:") r = $(k + 1); if ($k == "Isr:") i = $(k + 1) }
            if (index("," r ",", "," n ",") && !index("," i ",", "," n ",")) behind = 1
          }
          END { exit behind }' \
      && echo "$n"
  done
  return 0
}

# all_serving N...: do all these nodes serve (see serving_python)?
all_serving() {
  local answering n
  answering=" $(probe_with serving_python serving_java "$@" | tr '\n' ' ') "
  for n in "$@"; do
    [[ "$answering" == *" $n "* ]] || return 1
  done
}

# wait_ready N...: wait until these nodes are brokers of the cluster; those of them this call
# launched (LAUNCHED) are stopped again if they never get there.
LAUNCHED=()
wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT)) n pid
  while :; do
    for n in "$@"; do
      if ! pid="$(node_pid "$n")"; then
        show_log_tail "$(node_log "$n")"
        die "node $n exited during startup (its log: $(node_log "$n"))"
      fi
    done
    if all_serving "$@"; then return 0; fi
    if (( SECONDS >= deadline )); then
      for n in "$@"; do show_log_tail "$(node_log "$n")"; done
      if (( ${#LAUNCHED[@]} )); then
        log "giving up after ${START_TIMEOUT}s; stopping node(s) ${LAUNCHED[*]}"
        for n in "${LAUNCHED[@]}"; do stop_node "$n"; done
      fi
      die "broker(s) $* did not join the cluster on $(bootstrap) within ${START_TIMEOUT}s"
    fi
    sleep 1
  done
}

# --- config ---------------------------------------------------------------------------------------
write_config() {
  local n="$1" voters=() m
  for m in "${NODES[@]}"; do voters+=("$m@$HOST:$(node_controller_port "$m")"); done
  write_kafka_config "$(node_conf "$n")" "$n" "$(IFS=,; echo "${voters[*]}")" "$HOST" \
    "$(node_port "$n")" "$(node_controller_port "$n")" "$(node_dir "$n")/data" 3 2
  # A controlled shutdown waits (up to 5 minutes) for the controller quorum to move the node's
  # leaders away; 'stop' takes every node down at once, so the quorum goes too. Nodes only
  # ever leave alone by SIGKILL here ('kill'), which never shuts down in a controlled way.
  # A dead broker is fenced (its leaders move) after 6 s without a heartbeat instead of 9;
  # a restarted one registers again once its previous registration has expired so.
  cat >>"$(node_conf "$n")" <<EOF
controlled.shutdown.enable=false
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
EOF
}

# --- commands -----------------------------------------------------------------------------------
# prepare_node N: check node N's ports are free, write its config, format its storage once.
prepare_node() {
  local n="$1" port controller
  port="$(node_port "$n")"
  controller="$(node_controller_port "$n")"
  tcp_open "$HOST" "$port" && die "port $HOST:$port of node $n is already in use (set LOOMFLOW_KAFKA_CLUSTER_PORTS)"
  tcp_open "$HOST" "$controller" \
    && die "controller port $HOST:$controller of node $n is already in use (set LOOMFLOW_KAFKA_CLUSTER_CONTROLLER_PORTS)"
  write_config "$n"
  format_storage "$(node_conf "$n")" "$(node_dir "$n")/data" "$CLUSTER_ID"
}

# launch_node N: start node N in the background (no wait).
launch_node() {
  local n="$1"
  log "starting node $n on $HOST:$(node_port "$n") (controller $(node_controller_port "$n")) ..."
  # C1 only: three JVMs starting at once on a few cores are up 2-3 times sooner, and fault
  # tests need no peak throughput
  launch_kafka "$(node_conf "$n")" "$(node_pidfile "$n")" "$(node_log "$n")" \
    "$(node_dir "$n")/logs" "$HEAP" -XX:TieredStopAtLevel=1 >/dev/null
}

stop_node() {
  local n="$1" pid
  if pid="$(node_pid "$n")"; then
    log "stopping node $n (pid $pid) ..."
    stop_kafka_pid "$pid" "$(node_conf "$n")"
  fi
  rm -f "$(node_pidfile "$n")"
}

# start_nodes N...: start those of these nodes that are not running, then wait for all of them.
start_nodes() {
  local n
  mkdir -p "$CACHE"
  require_java
  fetch_libs
  for n in "$@"; do
    node_pid "$n" >/dev/null || LAUNCHED+=("$n")
  done
  if (( ${#LAUNCHED[@]} )); then
    CLUSTER_ID="$(new_cluster_id "$CLUSTER_ID_FILE")"
    local preparing=() pid
    for n in "${LAUNCHED[@]}"; do prepare_node "$n" & preparing+=($!); done  # formats: a JVM each
    for pid in "${preparing[@]}"; do wait "$pid" || die "could not prepare node(s) ${LAUNCHED[*]}"; done
    for n in "${LAUNCHED[@]}"; do launch_node "$n"; done
  fi
  if (( ${#LAUNCHED[@]} == 0 )) && all_serving "$@"; then
    log "already running on $(bootstrap)"
  else
    wait_ready "$@"
    log "node(s) $* ready on $(bootstrap)"
  fi
  print_exports
}

cmd_stop() {
  local n pids=()
  # SIGTERM to all at once: one by one, the last nodes would wait for a quorum that is gone
  for n in "${NODES[@]}"; do
    if node_pid "$n" >/dev/null; then stop_node "$n" & pids+=($!); fi
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  (( ${#pids[@]} )) && log "stopped" || log "not running"
  return "$rc"
}

cmd_kill() {
  local n="$1" pid _
  check_node "$n"
  pid="$(node_pid "$n")" || die "node $n is not running"
  log "killing node $n (pid $pid) with SIGKILL"
  kill -KILL "$pid"
  for _ in $(seq 100); do
    kafka_process "$pid" "$(node_conf "$n")" || { rm -f "$(node_pidfile "$n")"; return 0; }
    sleep 0.1
  done
  die "node $n (pid $pid) is still alive 10 s after SIGKILL"
}

cmd_status() {
  local n pid answering rc=0
  answering=" $(probe_with serving_python serving_java "${NODES[@]}" | tr '\n' ' ') "
  for n in "${NODES[@]}"; do
    if ! pid="$(node_pid "$n")"; then
      log "node $n is not running"
      rc=1
    elif [[ "$answering" == *" $n "* ]]; then
      log "node $n (pid $pid) is a broker of the cluster on $HOST:$(node_port "$n")"
    else
      log "node $n (pid $pid) runs but does not serve as a broker of the cluster (yet)"
      rc=1
    fi
  done
  (( rc == 0 )) && print_exports
  return "$rc"
}

case "${1:-}" in
  start) start_nodes "${NODES[@]}" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kill) cmd_kill "${2:-}" ;;
  start-node) check_node "${2:-}"; start_nodes "$2" ;;
  *) echo "usage: $0 {start|stop|status|kill N|start-node N}" >&2; exit 2 ;;
esac
