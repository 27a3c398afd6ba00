#!/usr/bin/env bash
# Installs promtool (from Debian's prometheus package, unpacked: no server
# installed, no service started) into .taskgrid/tools, for the metrics
# test: it checks the alert rules in deploy/prometheus (`promtool check
# rules`, `promtool test rules`) and every query of the Grafana dashboard in
# deploy/grafana. Idempotent: when the binary is there it only says so.
#
#   deploy/install-promtool.sh      -> .taskgrid/tools/promtool
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="$root/.taskgrid/tools"
promtool="$dir/promtool"

if [[ -x "$promtool" ]] && "$promtool" --version >/dev/null 2>&1; then
  echo "install-promtool: $promtool present"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download writes as the _apt user when it can; a directory it may
# write to keeps it from warning.
chmod 777 "$tmp"
if ! (cd "$tmp" && apt-get download -q prometheus >/dev/null 2>&1); then
  # Stale package lists name a file the mirror no longer has.
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  (cd "$tmp" && apt-get download -q prometheus >/dev/null)
fi
mkdir -p "$dir"
dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
install -m 755 "$tmp/usr/bin/promtool" "$promtool"
echo "install-promtool: installed $("$promtool" --version 2>&1 | head -1) at $promtool"
