#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, on the gRPC-free code,
# in BUILD_DIR (default build/fuzz). Used by the test command and by
# deploy/fuzz.sh.
#
#   tests/fuzz/build.sh [BUILD_DIR]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build/fuzz}
# Line tables only (-g1): all a sanitizer's stack trace needs. mold, or
# else lld, when installed.
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1)
for ld in mold lld; do
  if command -v "ld.$ld" >/dev/null 2>&1; then
    flags+=("-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=$ld")
    break
  fi
done
CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${flags[@]}" \
  -DCMAKE_CXX_FLAGS=-O1 -DSANITIZE=address,undefined -DTASKGRID_WITH_GRPC=OFF \
  -DTASKGRID_FUZZ=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_submit fuzz_agent fuzz_http
