#!/usr/bin/env bash
# Installs the Debian 12 packages Taskgrid builds and tests with. Idempotent:
# when everything is present it only checks (about a second) and changes nothing.
#
#   deploy/install-deps.sh          build + test packages
#   deploy/install-deps.sh --python also the Python package's packages (and its
#                                   tests': venv, pytest)
#   deploy/install-deps.sh --fuzz   also clang and its libFuzzer runtime
#   deploy/install-deps.sh --web    also Chromium (and Node.js with npm when
#                                   npm is missing) for the dashboard's
#                                   browser test
#   deploy/install-deps.sh --mold   also mold, the fast linker deploy/test.sh
#                                   links its sanitizer trees with
#   deploy/install-deps.sh --postgres also PostgreSQL's server, which the
#                                   tests of the PostgreSQL store start on
#                                   their own (tests/testing/postgres.sh)
set -euo pipefail

pkgs=(
  cmake ninja-build g++ pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsqlite3-dev libspdlog-dev libgtest-dev libgmock-dev
  libcurl4-openssl-dev libmicrohttpd-dev libcpp-httplib-dev grpc-proto procps python3 openssl tzdata
  libpq-dev libjemalloc-dev
)
for arg in "$@"; do
  case "$arg" in
    --python) pkgs+=(python3-grpcio python3-protobuf python3-venv python3-pytest) ;;
    --fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
    --web)
      pkgs+=(chromium)
      # A Node.js from elsewhere brings its own npm; Debian's npm would
      # conflict with it, so only a machine without npm gets Debian's.
      if ! command -v npm >/dev/null 2>&1; then pkgs+=(nodejs npm); fi
      ;;
    --mold) pkgs+=(mold) ;;
    --postgres) pkgs+=(postgresql-15) ;;
    *) echo "install-deps: unknown option $arg (--python, --fuzz, --web, --mold, --postgres)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
