#!/usr/bin/env bash
# The test suite with the services its integration tests need.
#
# When LOOMFLOW_KAFKA_BOOTSTRAP / LOOMFLOW_POSTGRES_DSN are set, those services are used.
# Otherwise, with a Docker engine, the fixtures start containers (testcontainers); without
# one, dev/services.sh installs and starts a local Kafka and PostgreSQL first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -z "${LOOMFLOW_KAFKA_BOOTSTRAP:-}" || -z "${LOOMFLOW_POSTGRES_DSN:-}" ]]; then
  if ! docker info >/dev/null 2>&1; then
    exports="$(dev/services.sh start)"
    eval "$(grep '^export ' <<<"$exports")"
  fi
fi
# the report test opens the HTML report in Debian's chromium (installed when missing)
dev/chromium.sh >/dev/null
exec .venv/bin/python -m pytest -q "$@"
