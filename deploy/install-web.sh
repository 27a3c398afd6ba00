#!/usr/bin/env bash
# Installs what the dashboard's browser test drives Chromium with:
# playwright-core, and axe-core (the accessibility checks it runs on each
# page), pinned by tests/web/package-lock.json, into
# .taskgrid/web/node_modules with `npm ci`. The browser is Debian's
# chromium (deploy/install-deps.sh --web); nothing downloads another one.
# Idempotent: when the installed lock matches, it only says so. Needs node
# and npm.
#
#   deploy/install-web.sh      -> .taskgrid/web/node_modules/playwright-core
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix="$root/.taskgrid/web"
module="$prefix/node_modules/playwright-core"

if [[ -f "$module/package.json" && -f "$prefix/node_modules/axe-core/axe.min.js" ]] && cmp -s "$root/tests/web/package-lock.json" "$prefix/package-lock.json"; then
  echo "install-web: playwright-core present in $prefix"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install-web: npm is not installed (deploy/install-deps.sh --web)" >&2
  exit 1
fi
mkdir -p "$prefix"
cp "$root/tests/web/package.json" "$root/tests/web/package-lock.json" "$prefix/"
# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core downloads nothing, and
# this says so to any version that would.
(cd "$prefix" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error >/dev/null)
if [[ ! -f "$module/package.json" ]]; then
  echo "install-web: npm ci finished but $module is missing" >&2
  exit 1
fi
echo "install-web: installed playwright-core $(node -p "require('$module/package.json').version") in $prefix"
