#!/usr/bin/env bash
# Installs buf (npm @bufbuild/buf, pinned) into .taskgrid/npm, for `buf curl`:
# the grpcurl stand-in the reflection system test and the README use.
# Idempotent: when the binary is there it only says so. Needs node + npm.
#
#   deploy/install-buf.sh      -> .taskgrid/npm/node_modules/.bin/buf
set -euo pipefail

BUF_VERSION=1.75.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix="$root/.taskgrid/npm"
buf="$prefix/node_modules/.bin/buf"

if [[ -x "$buf" ]]; then
  echo "install-buf: $buf present ($("$buf" --version 2>/dev/null || echo '?'))"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install-buf: npm is not installed (apt-get install nodejs npm, or Node 18+)" >&2
  exit 1
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  "@bufbuild/buf@$BUF_VERSION" >/dev/null
if [[ ! -x "$buf" ]]; then
  echo "install-buf: npm finished but $buf is missing" >&2
  exit 1
fi
echo "install-buf: installed @bufbuild/buf@$BUF_VERSION at $buf"
