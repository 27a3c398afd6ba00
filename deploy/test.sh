#!/usr/bin/env bash
# The test command: installs what is missing, builds every target with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang) and runs every test
# through ctest; builds the tests that start threads (taskgrid_test(...
# TSAN), all gRPC-free) with ThreadSanitizer (GCC) and runs them again.
# Debian's gRPC is not instrumented, which is why TSan covers only
# gRPC-free code (see docs/architecture.md, "Testing"). Last, clang builds the libFuzzer targets
# and tests/fuzz/run.sh runs each for TASKGRID_FUZZ_SECONDS (default 20) from
# the seeds in tests/fuzz/corpus.
#
# The system tests mostly wait on the processes they start, so while they
# run (one at a time, as their timing wants) the TSan and fuzz trees build
# beside them at the lowest CPU priority; their output goes to
# build/background.log, printed when the build fails.
#
#   deploy/test.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)

# Also Python's gRPC (the Python client's tests), buf (the grpcurl
# stand-in the reflection test drives), Chromium with playwright-core
# (the dashboard's browser test, which must then run rather than skip),
# PostgreSQL's server (the PostgreSQL store's tests start one of their own
# per ctest run, tests/testing/postgres.sh, and must then run rather than
# skip), mold (a linker several times faster than GNU ld on these
# binaries), and promtool (the metrics test checks the shipped alert rules
# and Grafana dashboard with it, and must then run rather than skip).
"$root/deploy/install-deps.sh" --python --fuzz --web --mold --postgres
"$root/deploy/install-buf.sh"
"$root/deploy/install-web.sh"
"$root/deploy/install-promtool.sh"
export TASKGRID_REQUIRE_BROWSER=1
export TASKGRID_REQUIRE_PROMTOOL=1
export TASKGRID_REQUIRE_POSTGRES=1

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
# Leaks inside Debian's uninstrumented OpenSSL are not ours (tests/lsan.supp).
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
export no_proxy=127.0.0.1,localhost

# Every tree: line tables only (-g1), which is all a sanitizer's stack trace
# needs (function, file and line); full -g costs a fifth more compile time
# and much more link time. mold, or else lld, when installed.
tree_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1)
for ld in mold lld; do
  if command -v "ld.$ld" >/dev/null 2>&1; then
    tree_flags+=("-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=$ld")
    break
  fi
done

start=$(date +%s)
phase_name=""
phase_start=$start
summary=()
# Ends the phase under way (its time goes into the summary) and starts $1.
phase() {
  local now
  now=$(date +%s)
  if [[ -n $phase_name ]]; then
    summary+=("$(printf '  %-58s %5d s' "$phase_name" $((now - phase_start)))")
  fi
  phase_name=$1
  phase_start=$now
  if [[ -n $phase_name ]]; then echo "== $phase_name"; fi
}

# The background build runs in a process group of its own (set -m), so an
# early exit stops all of it.
background=""
trap '[[ -z $background ]] || kill -- "-$background" 2>/dev/null || true' EXIT

# The ASan + UBSan tree with clang: with the same sanitizers it compiles
# these sources in half of GCC's time or less, and its tests run faster.
# GCC still builds the TSan tree below, so both compilers' -Wall -Wextra
# see the core; the production and development builds use GCC (Debian's
# default c++).
phase "build: ASan + UBSan (clang), every target"
CC=clang CXX=clang++ cmake -S "$root" -B "$root/build/asan" "${tree_flags[@]}" \
  -DSANITIZE=address,undefined >/dev/null
cmake --build "$root/build/asan" -j "$jobs"

phase "tests: ASan + UBSan, unit and integration"
ctest --test-dir "$root/build/asan" -j "$jobs" -LE system --output-on-failure --timeout 600

phase "tests: ASan + UBSan, system (the TSan and fuzz trees build meanwhile)"
set -m
(
  renice -n 19 -p "$BASHPID" >/dev/null
  t0=$(date +%s)
  cmake -S "$root" -B "$root/build/tsan" "${tree_flags[@]}" -DSANITIZE=thread \
    -DTASKGRID_WITH_GRPC=OFF >/dev/null
  cmake --build "$root/build/tsan" -j "$jobs"
  t1=$(date +%s)
  echo "== built the TSan tree (the tests marked TSAN) in $((t1 - t0)) s"
  "$root/tests/fuzz/build.sh" "$root/build/fuzz"
  echo "== built the libFuzzer targets (clang, ASan + UBSan) in $(($(date +%s) - t1)) s"
) >"$root/build/background.log" 2>&1 &
background=$!
set +m
ctest --test-dir "$root/build/asan" -L system --output-on-failure --timeout 600

phase "build: what is left of the TSan and fuzz trees"
if ! wait "$background"; then
  background=""
  tail -n 60 "$root/build/background.log"
  echo "the TSan or fuzz build failed; its whole log: $root/build/background.log" >&2
  exit 1
fi
background=""
grep '^== built' "$root/build/background.log"

phase "tests: TSan"
ctest --test-dir "$root/build/tsan" -j "$jobs" --output-on-failure --timeout 600

phase "fuzz: each target ${TASKGRID_FUZZ_SECONDS:-20} s, side by side"
"$root/tests/fuzz/run.sh" "$root/build/fuzz" "${TASKGRID_FUZZ_SECONDS:-20}"

phase ""
printf '%s\n' "${summary[@]}"
echo "== all tests passed in $(($(date +%s) - start)) s"
