#!/usr/bin/env bash
# Local PostgreSQL for tests and CI, using Debian's packaged cluster (postgresql-common).
#
#   dev/postgres.sh start    install Debian's postgresql if missing, start the cluster on
#                            127.0.0.1:$LOOMFLOW_POSTGRES_PORT, wait until ready, ensure role
#                            and database "loomflow" (password "loomflow") exist
#   dev/postgres.sh stop     stop the cluster
#   dev/postgres.sh restart  stop (fast: every connection is cut) and start again, for tests of
#                            what survives a database restart
#   dev/postgres.sh status   exit 0 if the loomflow database answers
#
# Why the Debian cluster and not one under .cache/: it survives fresh clones (CI clones the repo
# into another folder), needs no repo-path permissions for the postgres user, and on a fresh
# image `apt-get install postgresql` already creates it. Runs as root (or with passwordless sudo).
#
# Environment:
#   LOOMFLOW_POSTGRES_PORT           port (default 5432)
#   LOOMFLOW_POSTGRES_CLUSTER        the Debian cluster (default main); another name is a cluster
#                                    of its own (the outage tests start and stop one), created
#                                    on first start on LOOMFLOW_POSTGRES_PORT, and not started
#                                    at boot
#   LOOMFLOW_POSTGRES_START_TIMEOUT  seconds to wait for readiness (default 60)
#
# Progress goes to stderr; on a successful start/status stdout gets only
#   export LOOMFLOW_POSTGRES_DSN=postgresql://loomflow:loomflow@127.0.0.1:<port>/loomflow
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${LOOMFLOW_POSTGRES_PORT:-5432}"
START_TIMEOUT="${LOOMFLOW_POSTGRES_START_TIMEOUT:-60}"
CLUSTER_NAME="${LOOMFLOW_POSTGRES_CLUSTER:-main}"
[[ "$CLUSTER_NAME" =~ ^[A-Za-z0-9_]+$ ]] \
  || { echo "postgres: ERROR: LOOMFLOW_POSTGRES_CLUSTER must be letters, digits and _ (got '$CLUSTER_NAME')" >&2; exit 1; }
DB_USER=loomflow
DB_PASSWORD=loomflow
DB_NAME=loomflow
DSN="postgresql://$DB_USER:$DB_PASSWORD@$HOST:$PORT/$DB_NAME"
CACHE="$ROOT/.cache/postgres"

log() { echo "postgres: $*" >&2; }
die() { echo "postgres: ERROR: $*" >&2; exit 1; }

as_root() {
  if [[ "$(id -u)" == 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "needs root (or passwordless sudo) to run: $*"
  fi
}

as_postgres() {
  # cd / so that the postgres user is not left in an unreadable working directory
  if [[ "$(id -u)" == 0 ]]; then (cd / && runuser -u postgres -- "$@")
  elif command -v sudo >/dev/null 2>&1; then (cd / && sudo -n -u postgres "$@")
  else die "needs root (or passwordless sudo) to run as postgres: $*"
  fi
}

server_versions() {  # installed server major versions, newest first
  local d
  for d in /usr/lib/postgresql/*/bin/postgres; do
    [[ -x "$d" ]] && basename "$(dirname "$(dirname "$d")")"
  done | sort -rn
}

installed() {
  command -v pg_ctlcluster >/dev/null 2>&1 && command -v pg_isready >/dev/null 2>&1 \
    && command -v psql >/dev/null 2>&1 && [[ -n "$(server_versions)" ]]
}

apt_install() {
  local apt_log="$1"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=180 postgresql </dev/null >>"$apt_log" 2>&1
}

ensure_installed() {
  installed && return 0
  mkdir -p "$CACHE"
  local apt_log="$CACHE/apt.log"
  : >"$apt_log"
  log "installing Debian's postgresql package with apt-get ..."
  if ! apt_install "$apt_log"; then
    log "apt-get install failed; running apt-get update and retrying ..."
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=180 \
      </dev/null >>"$apt_log" 2>&1 || { tail -n 20 "$apt_log" >&2; die "apt-get update failed (log: $apt_log)"; }
    apt_install "$apt_log" || { tail -n 20 "$apt_log" >&2; die "apt-get install postgresql failed (log: $apt_log)"; }
  fi
  installed || die "postgresql installed, but pg_ctlcluster/psql/pg_isready or the server binary is still missing"
}

# Sets VERSION: the newest version that has a "main" cluster, else the newest installed server.
pick_cluster() {
  VERSION="$(pg_lsclusters -h 2>/dev/null | awk -v n="$CLUSTER_NAME" '$2 == n {print $1}' | sort -rn | head -n 1)"
  if [[ -z "$VERSION" ]]; then
    VERSION="$(server_versions | head -n 1)"
    log "creating cluster $VERSION/$CLUSTER_NAME on port $PORT ..."
    local out start_conf=()
    # a cluster other than main is a test's, started and stopped by it alone
    [[ "$CLUSTER_NAME" == main ]] || start_conf=(--start-conf=manual)
    out="$(as_root pg_createcluster "${start_conf[@]}" --port="$PORT" "$VERSION" "$CLUSTER_NAME" </dev/null 2>&1)" \
      || { echo "$out" >&2; die "pg_createcluster $VERSION $CLUSTER_NAME failed"; }
  fi
}

cluster_running() { as_root pg_ctlcluster "$VERSION" "$CLUSTER_NAME" status >/dev/null 2>&1; }

cluster_port() { pg_conftool -s "$VERSION" "$CLUSTER_NAME" show port 2>/dev/null || echo 5432; }

cluster_log() { pg_lsclusters -h 2>/dev/null | awk -v v="$VERSION" -v n="$CLUSTER_NAME" '$1 == v && $2 == n {print $7}'; }

show_log_tail() {
  local f
  f="$(cluster_log)"
  if [[ -n "$f" && -r "$f" ]]; then
    echo "postgres: ---- last lines of $f ----" >&2
    tail -n 25 "$f" >&2 || true
    echo "postgres: ----" >&2
  fi
}

ready() { pg_isready -q -h "$HOST" -p "$PORT" -t 2 >/dev/null 2>&1; }

dsn_works() {
  [[ "$(PGCONNECT_TIMEOUT=5 psql "$DSN" -X -q -t -A -c 'select 1' </dev/null 2>/dev/null)" == 1 ]]
}

print_exports() { echo "export LOOMFLOW_POSTGRES_DSN=$DSN"; }

wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  until ready; do
    if (( SECONDS >= deadline )); then
      show_log_tail
      die "cluster $VERSION/$CLUSTER_NAME did not accept connections on $HOST:$PORT within ${START_TIMEOUT}s"
    fi
    sleep 0.5
  done
}

provision() {
  dsn_works && return 0
  log "creating role and database '$DB_NAME' ..."
  local out
  out="$(as_postgres psql --cluster "$VERSION/$CLUSTER_NAME" -X -q -v ON_ERROR_STOP=1 -d postgres 2>&1 <<SQL
SELECT 'CREATE ROLE $DB_USER' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') \gexec
ALTER ROLE $DB_USER WITH LOGIN CREATEDB PASSWORD '$DB_PASSWORD';
SELECT 'CREATE DATABASE $DB_NAME OWNER $DB_USER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB_NAME') \gexec
ALTER DATABASE $DB_NAME OWNER TO $DB_USER;
SQL
)" || { echo "$out" >&2; die "creating role/database '$DB_NAME' failed"; }
}

cmd_start() {
  ensure_installed
  pick_cluster
  local current_port
  current_port="$(cluster_port)"
  if cluster_running; then
    [[ "$current_port" == "$PORT" ]] \
      || die "cluster $VERSION/$CLUSTER_NAME is running on port $current_port, not $PORT; run 'dev/postgres.sh stop' first to change ports"
  else
    if [[ "$current_port" != "$PORT" ]]; then
      log "setting port of cluster $VERSION/$CLUSTER_NAME to $PORT (was $current_port)"
      as_root pg_conftool "$VERSION" "$CLUSTER_NAME" set port "$PORT"
    fi
    # /var/run is a tmpfs on many systems; the socket directory may be gone after a reboot.
    as_root install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    log "starting cluster $VERSION/$CLUSTER_NAME on $HOST:$PORT ..."
    # Output goes to a file, not a pipe: a server that inherited a pipe would keep our
    # caller (e.g. "$(dev/postgres.sh start)") waiting forever.
    mkdir -p "$CACHE"
    if ! as_root pg_ctlcluster "$VERSION" "$CLUSTER_NAME" start </dev/null >"$CACHE/pg_ctlcluster.$CLUSTER_NAME.out" 2>&1; then
      cat "$CACHE/pg_ctlcluster.$CLUSTER_NAME.out" >&2
      show_log_tail
      die "pg_ctlcluster $VERSION $CLUSTER_NAME start failed"
    fi
  fi
  wait_ready
  provision
  dsn_works || die "psql could not run 'select 1' via $DSN"
  log "ready on $HOST:$PORT (cluster $VERSION/$CLUSTER_NAME)"
  print_exports
}

cmd_stop() {
  if ! installed; then
    log "not installed; nothing to stop"
    return 0
  fi
  VERSION="$(pg_lsclusters -h 2>/dev/null | awk -v n="$CLUSTER_NAME" '$2 == n {print $1}' | sort -rn | head -n 1)"
  if [[ -z "$VERSION" ]] || ! cluster_running; then
    log "not running"
    return 0
  fi
  log "stopping cluster $VERSION/$CLUSTER_NAME ..."
  local out
  out="$(as_root pg_ctlcluster "$VERSION" "$CLUSTER_NAME" stop -m fast </dev/null 2>&1)" \
    || { echo "$out" >&2; die "pg_ctlcluster $VERSION $CLUSTER_NAME stop failed"; }
  log "stopped"
}

cmd_status() {
  if command -v psql >/dev/null 2>&1 && dsn_works; then
    log "answering on $HOST:$PORT"
    print_exports
    return 0
  fi
  if command -v pg_isready >/dev/null 2>&1 && ready; then
    log "server answers on $HOST:$PORT but '$DB_NAME' is not usable (run 'dev/postgres.sh start')"
  else
    log "not running on $HOST:$PORT"
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
