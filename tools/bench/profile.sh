#!/usr/bin/env bash
# Profiles the scheduler that taskgrid-bench starts, during one phase of a
# workload, with `perf record -g` (DWARF call graphs: the build has no frame
# pointers). Used for the profile notes in docs/performance.md.
#
#   tools/bench/profile.sh OUT_PREFIX SECONDS 'LOG PATTERN' BENCH_FLAGS...
#
# Runs <build>/bin/taskgrid-bench with BENCH_FLAGS (stderr to OUT_PREFIX.log),
# waits until a bench log line matches LOG PATTERN (grep -E), attaches perf to
# the scheduler the bench started last for SECONDS, waits for the bench to
# finish, and writes OUT_PREFIX.data and the flat profile OUT_PREFIX.txt
# (self time per function, the scheduler's threads together).
# PERF_FREQ sets the sampling rate (default 499 Hz).
#
# Example (W2's drain of 100,000 tasks):
#   tools/bench/profile.sh /tmp/w2 8 'submitted 100000 tasks' --workloads=w2 --w2_tasks=100000
set -euo pipefail

if [[ $# -lt 4 ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1 seconds=$2 pattern=$3
shift 3
here=$(cd "$(dirname "$0")/../.." && pwd)
bench=${TASKGRID_BENCH:-$here/build-bench/bin/taskgrid-bench}
[[ -x $bench ]] || { echo "no $bench (set TASKGRID_BENCH)" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 2; }

"$bench" "$@" >"$out.stdout" 2>"$out.log" &
bench_pid=$!
stop_bench() { kill -INT "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; }
trap stop_bench INT TERM

# Bounded: 15 minutes for the pattern to appear.
for _ in $(seq 1 9000); do
  if grep -Eq -- "$pattern" "$out.log"; then break; fi
  if ! kill -0 "$bench_pid" 2>/dev/null; then
    echo "the bench ended before '$pattern' appeared; see $out.log" >&2
    exit 1
  fi
  sleep 0.1
done
grep -Eq -- "$pattern" "$out.log" || { echo "'$pattern' did not appear in 15 minutes" >&2; stop_bench; exit 1; }
pid=$(grep -Eo 'scheduler pid [0-9]+' "$out.log" | tail -1 | awk '{print $3}')
[[ -n $pid ]] || { echo "no scheduler pid in $out.log" >&2; stop_bench; exit 1; }
echo "profiling scheduler pid $pid for ${seconds}s" >&2
perf record -F ${PERF_FREQ:-499} -g --call-graph dwarf,16384 -p "$pid" -o "$out.data" -- sleep "$seconds" \
  >"$out.perf.log" 2>&1 || true
wait "$bench_pid" || echo "the bench exited with $?; see $out.log" >&2
trap - INT TERM
perf report -i "$out.data" --no-children --sort dso,symbol --stdio -g none --percent-limit 0.7 \
  2>/dev/null | grep -E '^ +[0-9]|^# Samples' | sed 's/ \{2,\}/  /g' >"$out.txt" || true
perf report -i "$out.data" --children --sort symbol --stdio -g none --percent-limit 3 \
  2>/dev/null | grep -E '^ +[0-9]' | sed 's/ \{2,\}/  /g' >"$out.children.txt" || true
echo "flat profile: $out.txt; inclusive: $out.children.txt" >&2
head -25 "$out.txt"
