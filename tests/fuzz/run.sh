#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time, the two side by side (each
# is one process on one core), starting from the seeds in tests/fuzz/corpus
# (text format, encoded here with protoc). A crash, a broken invariant, a
# leak or a timeout fails the run; the input that did it is left in the
# work directory, printed at the end.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]   (default 20)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR [SECONDS_PER_TARGET]}
seconds=${2:-20}
work=$(mktemp -d "${TMPDIR:-/tmp}/taskgrid-fuzz.XXXXXX")
keep=0
trap '[[ $keep == 1 ]] || rm -rf "$work"' EXIT

declare -A type=([submit]=taskgrid.v1.SubmitJobRequest [agent]=taskgrid.v1.AgentBatch)
declare -A proto=([submit]=taskgrid/v1/job_service.proto [agent]=taskgrid/v1/agent_service.proto)

# Each target on a core of its own, side by side; each keeps its own log.
declare -A pid
for target in submit agent; do
  corpus="$work/$target/corpus"
  mkdir -p "$corpus" "$work/$target/artifacts"
  for seed in "$root/tests/fuzz/corpus/$target"/*.textproto; do
    protoc -I "$root/proto" -I /usr/include --encode="${type[$target]}" "${proto[$target]}" \
      <"$seed" >"$corpus/$(basename "$seed" .textproto)"
  done
  echo "== fuzz $target: ${seconds}s from $(ls "$corpus" | wc -l) seeds"
  "$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$work/$target/artifacts/" "$corpus" 2>"$work/$target/log" &
  pid[$target]=$!
done
failed=0
for target in submit agent; do
  if ! wait "${pid[$target]}"; then
    keep=1
    failed=1
    tail -n 40 "$work/$target/log"
    echo "fuzz $target failed; the input is in $work/$target/artifacts/" >&2
    continue
  fi
  echo "== fuzz $target:"
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/$target/log" || true
done
exit "$failed"
