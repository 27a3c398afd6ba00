#!/usr/bin/env bash
# The long fuzz run, on demand (the test command runs each target for 20 s):
# builds the libFuzzer targets with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build/fuzz, runs each target side by side
# for RUNS executions (default 10,000,000) from the corpus kept in
# tests/fuzz/corpus, and keeps what reached new code in
# tests/fuzz/corpus/TARGET/found for the next runs, the test command's
# included: commit it. A crash, a broken invariant, a leak or a timeout
# stops it with the input that did it.
#
#   deploy/fuzz.sh [RUNS]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-10000000}
"$root/deploy/install-deps.sh" --fuzz

"$root/tests/fuzz/build.sh" "$root/build/fuzz"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
start=$(date +%s)
"$root/tests/fuzz/run.sh" --runs="$runs" --save "$root/build/fuzz"
echo "== fuzz: done in $(($(date +%s) - start)) s"
