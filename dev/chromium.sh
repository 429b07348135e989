#!/usr/bin/env bash
# Install Debian's chromium, which the report test opens the HTML report in (headless).
#
#   dev/chromium.sh          # installs it unless /usr/bin/chromium is there; prints its path
#
# playwright-python drives it through executable_path: playwright cannot download a browser
# of its own on our machines. Runs as root (or with passwordless sudo), like dev/postgres.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache/chromium"
BROWSER=/usr/bin/chromium

log() { echo "chromium: $*" >&2; }
die() { echo "chromium: ERROR: $*" >&2; exit 1; }

as_root() {
  if [[ "$(id -u)" == 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "needs root (or passwordless sudo) to run: $*"
  fi
}

apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=180 chromium fonts-dejavu-core </dev/null >>"$1" 2>&1
}

if [[ ! -x "$BROWSER" ]]; then
  mkdir -p "$CACHE"
  apt_log="$CACHE/apt.log"
  : >"$apt_log"
  log "installing Debian's chromium package with apt-get ..."
  if ! apt_install "$apt_log"; then
    log "apt-get install failed; running apt-get update and retrying ..."
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q -o DPkg::Lock::Timeout=180 \
      </dev/null >>"$apt_log" 2>&1 || { tail -n 20 "$apt_log" >&2; die "apt-get update failed (log: $apt_log)"; }
    apt_install "$apt_log" || { tail -n 20 "$apt_log" >&2; die "apt-get install chromium failed (log: $apt_log)"; }
  fi
  [[ -x "$BROWSER" ]] || die "chromium installed, but $BROWSER is missing"
fi
echo "$BROWSER"
