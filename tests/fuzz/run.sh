#!/usr/bin/env bash
# Runs each libFuzzer target side by side (each is one process), starting
# from its corpus in tests/fuzz/corpus/TARGET: the seeds (text-format protos
# encoded here with protoc, or raw *.http requests) and found/, the inputs
# earlier long runs kept because they reached code nothing else did. A
# crash, a broken invariant, a leak or a timeout fails the run; the input
# that did it is left in the work directory, printed at the end.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]   (default 20; the test command)
#   tests/fuzz/run.sh --runs=N [--save] BUILD_DIR      (deploy/fuzz.sh)
#
# --runs=N runs each target for N executions instead of a time. --save then
# merges what the run found into tests/fuzz/corpus/TARGET/found: only
# inputs that add coverage beyond the seeds and the inputs already there
# (libFuzzer's -merge=1), named by their SHA-1. Ctrl-C stops a --save run
# early and still keeps what it found (each target says how many executions
# it ran): a long run need not be finished to be worth keeping.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runs=""
save=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --runs=*) runs=${1#--runs=} ;;
    --save) save=1 ;;
    *)
      echo "run.sh: unknown option $1" >&2
      exit 2
      ;;
  esac
  shift
done
build=${1:?usage: run.sh [--runs=N] [--save] BUILD_DIR [SECONDS_PER_TARGET]}
seconds=${2:-20}
work=$(mktemp -d "${TMPDIR:-/tmp}/taskgrid-fuzz.XXXXXX")
keep=0
trap '[[ $keep == 1 ]] || rm -rf "$work"' EXIT

targets=(submit agent http)
# The message each target's *.textproto seeds are (the http target's seeds
# are raw requests).
declare -A type=([submit]=taskgrid.v1.SubmitJobRequest [agent]=taskgrid.v1.AgentBatch)
declare -A proto=([submit]=taskgrid/v1/job_service.proto [agent]=taskgrid/v1/agent_service.proto)

# Fills $2 with target $1's corpus from the repository.
fill() {
  local target=$1 into=$2 seed
  mkdir -p "$into"
  for seed in "$root/tests/fuzz/corpus/$target"/*; do
    [[ -f $seed ]] || continue
    if [[ $seed == *.textproto ]]; then
      protoc -I "$root/proto" -I /usr/include --encode="${type[$target]}" "${proto[$target]}" \
        <"$seed" >"$into/$(basename "$seed" .textproto)"
    else
      cp "$seed" "$into/"
    fi
  done
  if [[ -d $root/tests/fuzz/corpus/$target/found ]]; then
    cp "$root/tests/fuzz/corpus/$target/found/"* "$into/" 2>/dev/null || true
  fi
}

if [[ -n $runs ]]; then
  limit=(-runs="$runs")
  what="$runs executions"
else
  limit=(-max_total_time="$seconds")
  what="${seconds}s"
fi

# Ctrl-C reaches the fuzzers (one process group), which stop with
# libFuzzer's exit code for an interrupted run, 72; with --save this script
# outlives it and goes on to keep what they found.
if [[ $save == 1 ]]; then
  trap ':' INT
fi
declare -A pid
for target in "${targets[@]}"; do
  fill "$target" "$work/$target/corpus"
  mkdir -p "$work/$target/artifacts"
  echo "== fuzz $target: $what from $(ls "$work/$target/corpus" | wc -l) inputs"
  "$build/tests/fuzz/fuzz_$target" "${limit[@]}" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$work/$target/artifacts/" "$work/$target/corpus" 2>"$work/$target/log" &
  pid[$target]=$!
done
failed=0
for target in "${targets[@]}"; do
  rc=0
  # A wait cut short by the trap is waited again.
  while wait "${pid[$target]}" || rc=$?; [[ $rc -gt 128 ]] && kill -0 "${pid[$target]}" 2>/dev/null; do
    rc=0
  done
  if [[ $rc == 72 && $save == 1 ]]; then
    echo "== fuzz $target: stopped by Ctrl-C"
    rc=0
  fi
  if [[ $rc != 0 ]]; then
    keep=1
    failed=1
    tail -n 40 "$work/$target/log"
    echo "fuzz $target failed; the input is in $work/$target/artifacts/" >&2
    continue
  fi
  echo "== fuzz $target:"
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" \
    "$work/$target/log" || true
done
[[ $failed == 0 ]] || exit 1

if [[ $save == 1 ]]; then
  for target in "${targets[@]}"; do
    found=$root/tests/fuzz/corpus/$target/found
    mkdir -p "$found"
    # Merge against the seeds and found/ together, so that only inputs that
    # reach something new are kept; then move the new ones into found/.
    fill "$target" "$work/$target/known"
    before=$(ls "$work/$target/known" | sort)
    "$build/tests/fuzz/fuzz_$target" -merge=1 -max_len=65536 \
      "$work/$target/known" "$work/$target/corpus" 2>"$work/$target/merge.log" || {
      keep=1
      tail -n 20 "$work/$target/merge.log" >&2
      echo "merging the $target corpus failed" >&2
      exit 1
    }
    added=0
    while read -r name; do
      [[ -n $name ]] || continue
      cp "$work/$target/known/$name" "$found/$name"
      added=$((added + 1))
    done < <(comm -13 <(echo "$before") <(ls "$work/$target/known" | sort))
    echo "== fuzz $target: $added inputs that reach new code kept in ${found#"$root"/}"
  done
fi
