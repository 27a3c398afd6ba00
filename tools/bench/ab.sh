#!/usr/bin/env bash
# A/B of two builds with taskgrid-bench, in one sitting: builds an older
# commit beside the current tree, runs the chosen workloads alternating old
# and new for N rounds, and prints, per figure, the median of each side with
# its spread and new/old.
#
#   tools/bench/ab.sh [--rounds=N] [--out=DIR] OLD [NEW] [-- BENCH_FLAGS...]
#
# OLD and NEW are anything `git rev-parse` takes (a commit, a branch, HEAD~3).
# NEW defaults to the working tree as it is, uncommitted changes included,
# built in build-bench/. A commit is exported with `git archive` into
# build-ab/src-<sha>/ and built in build-ab/build-<sha>/ (RelWithDebInfo;
# kept, so a second A/B against the same commit starts at once). Each side
# runs its own taskgrid-bench, scheduler and agents, with the same
# BENCH_FLAGS (default: --workloads=w1,w2,w3).
#
# Rounds run old then new, then new then old (ABBA), so a machine that
# slows down or speeds up over the sitting weighs on both sides alike.
# Keep the machine otherwise idle. Every run's JSON lines, logs and the
# summary stay in DIR (default: a new /tmp/taskgrid-ab.XXXXXX).
#
# The summary marks a figure "differs" when the two sides' ranges do not
# overlap, and "~" when they do: with 3 rounds, a change inside the spread
# is not shown by this sitting. Whether higher is better depends on the
# figure (tasks/s: higher; s, ms, MiB: lower).
#
# Examples:
#   tools/bench/ab.sh HEAD~1                                  # the last commit's effect, W1-W3
#   tools/bench/ab.sh --rounds=4 main -- --workloads=w1 --w1_modes=one
#   tools/bench/ab.sh 43e4071 HEAD -- --workloads=w5
set -euo pipefail

usage() {
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

rounds=3
out=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds=*) rounds=${1#*=} ;;
    --out=*) out=${1#*=} ;;
    -h | --help) usage ;;
    --) break ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) break ;;
  esac
  shift
done
[[ $# -ge 1 && $1 != -- ]] || usage
old_ref=$1
shift
new_ref=""
if [[ $# -gt 0 && $1 != -- ]]; then
  new_ref=$1
  shift
fi
[[ $# -gt 0 && $1 == -- ]] && shift
bench_flags=("$@")
[[ ${#bench_flags[@]} -gt 0 ]] || bench_flags=(--workloads=w1,w2,w3)
[[ $rounds =~ ^[1-9][0-9]*$ && $rounds -le 50 ]] || { echo "--rounds must be 1-50" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is needed for the summary" >&2; exit 2; }

here=$(cd "$(dirname "$0")/../.." && pwd)
ab_dir=${TASKGRID_AB_DIR:-$here/build-ab}
targets=(taskgrid-bench taskgrid-scheduler taskgrid-agent)
cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
command -v ninja >/dev/null || { echo "ninja is not installed (deploy/install-deps.sh)" >&2; exit 2; }
command -v mold >/dev/null && cmake_flags+=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=mold)

# Prints the bin/ directory of a build of $1 (a commit, or "" for the
# working tree), building it first where needed.
build() {
  local ref=$1 src build sha
  if [[ -z $ref ]]; then
    src=$here
    build=$here/build-bench
  else
    sha=$(git -C "$here" rev-parse --verify "$ref^{commit}") || { echo "no commit $ref" >&2; exit 2; }
    src=$ab_dir/src-${sha:0:12}
    build=$ab_dir/build-${sha:0:12}
    if [[ ! -f $src/CMakeLists.txt ]]; then
      rm -rf "$src"
      mkdir -p "$src"
      git -C "$here" archive "$sha" | tar -x -C "$src"
    fi
  fi
  echo "building ${ref:-the working tree} in $build" >&2
  [[ -f $build/build.ninja ]] || cmake -S "$src" -B "$build" "${cmake_flags[@]}" >&2
  ninja -C "$build" -j"$(nproc)" "${targets[@]}" >&2
  echo "$build/bin"
}

old_bin=$(build "$old_ref")
new_bin=$(build "$new_ref")
old_name=$(git -C "$here" rev-parse --short "$old_ref^{commit}")
if [[ -n $new_ref ]]; then
  new_name=$(git -C "$here" rev-parse --short "$new_ref^{commit}")
else
  new_name="working tree ($(git -C "$here" rev-parse --short HEAD)"
  git -C "$here" diff --quiet HEAD -- && new_name+=")" || new_name+=" + changes)"
fi

[[ -n $out ]] || out=$(mktemp -d /tmp/taskgrid-ab.XXXXXX)
mkdir -p "$out"
{
  echo "old: $old_name ($old_bin)"
  echo "new: $new_name ($new_bin)"
  echo "bench flags: ${bench_flags[*]}"
  echo "rounds: $rounds"
} | tee "$out/setup.txt" >&2

run() {  # side round
  local side=$1 round=$2 bin
  [[ $side == old ]] && bin=$old_bin || bin=$new_bin
  echo "$(date +%H:%M:%S) round $round: $side" >&2
  if ! "$bin/taskgrid-bench" --json "${bench_flags[@]}" >"$out/$side.$round.json" \
    2>"$out/$side.$round.log"; then
    echo "the $side bench failed in round $round; see $out/$side.$round.log" >&2
    exit 1
  fi
}

for ((r = 1; r <= rounds; r++)); do
  if ((r % 2 == 1)); then
    run old "$r"
    run new "$r"
  else
    run new "$r"
    run old "$r"
  fi
done

python3 - "$out" "$rounds" "$old_name" "$new_name" <<'EOF' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds, old_name, new_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
values = {}  # (workload, metric, unit) -> side -> [values]
order = []
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        with open(f"{out}/{side}.{r}.json") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                fig = json.loads(line)
                if fig.get("value") is None:
                    continue
                key = (fig["workload"], fig["metric"], fig.get("unit", ""))
                if key not in values:
                    values[key] = {"old": [], "new": []}
                    order.append(key)
                values[key][side].append(float(fig["value"]))

def fmt(v):
    if v == int(v) and abs(v) < 1e12:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"

def side(vs):
    if not vs:
        return "-", None
    m = statistics.median(vs)
    return f"{fmt(m)} [{fmt(min(vs))}..{fmt(max(vs))}]", m

print(f"old = {old_name}, new = {new_name}, {rounds} round(s) each; median [min..max]")
rows = [("WL", "METRIC", "UNIT", "OLD", "NEW", "NEW/OLD", "")]
for key in order:
    o, n = values[key]["old"], values[key]["new"]
    os_, om = side(o)
    ns, nm = side(n)
    ratio = f"{nm / om:.3f}" if om and nm is not None else "-"
    verdict = ""
    if o and n:
        verdict = "differs" if min(n) > max(o) or max(n) < min(o) else "~"
    rows.append((key[0], key[1], key[2], os_, ns, ratio, verdict))
widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
EOF
echo "runs and logs: $out" >&2
