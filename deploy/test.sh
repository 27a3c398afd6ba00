#!/usr/bin/env bash
# The test command: installs what is missing, builds with AddressSanitizer +
# UndefinedBehaviorSanitizer and runs every test through ctest, then builds
# the gRPC-free targets (core, store, engine) with ThreadSanitizer and runs
# their tests again. Debian's gRPC is not instrumented, which is why TSan
# covers only those (see docs/architecture.md, "Testing"). Last, clang builds
# the libFuzzer targets and tests/fuzz/run.sh runs each for
# TASKGRID_FUZZ_SECONDS (default 20) from the seeds in tests/fuzz/corpus.
#
#   deploy/test.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)

# Also Python's gRPC (the Python client's tests), buf (the grpcurl
# stand-in the reflection test drives), and Chromium with playwright-core
# (the dashboard's browser test, which must then run rather than skip).
"$root/deploy/install-deps.sh" --python --fuzz --web
"$root/deploy/install-buf.sh"
"$root/deploy/install-web.sh"
export TASKGRID_REQUIRE_BROWSER=1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
# Leaks inside Debian's uninstrumented OpenSSL are not ours (tests/lsan.supp).
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
export no_proxy=127.0.0.1,localhost

start=$(date +%s)
echo "== build: ASan + UBSan, every target"
cmake -S "$root" -B "$root/build/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DSANITIZE=address,undefined >/dev/null
cmake --build "$root/build/asan" -j "$jobs"

echo "== build: TSan, gRPC-free targets"
cmake -S "$root" -B "$root/build/tsan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DSANITIZE=thread -DTASKGRID_WITH_GRPC=OFF >/dev/null
cmake --build "$root/build/tsan" -j "$jobs"
echo "== built in $(($(date +%s) - start)) s"

echo "== tests: ASan + UBSan"
ctest --test-dir "$root/build/asan" -j "$jobs" --output-on-failure --timeout 600
echo "== tests: TSan"
ctest --test-dir "$root/build/tsan" -j "$jobs" --output-on-failure --timeout 600
echo "== build: libFuzzer targets (clang, ASan + UBSan, gRPC-free)"
CC=clang CXX=clang++ cmake -S "$root" -B "$root/build/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS=-O1 -DSANITIZE=address,undefined -DTASKGRID_WITH_GRPC=OFF \
  -DTASKGRID_FUZZ=ON >/dev/null
cmake --build "$root/build/fuzz" -j "$jobs" --target fuzz_submit fuzz_agent
echo "== fuzz"
"$root/tests/fuzz/run.sh" "$root/build/fuzz" "${TASKGRID_FUZZ_SECONDS:-20}"
echo "== all tests passed in $(($(date +%s) - start)) s"
