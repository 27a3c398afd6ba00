#!/usr/bin/env bash
# Quick start: installs what is missing, builds a Release build, and runs a
# scheduler with one local agent (2 slots) until Ctrl-C.
#
#   deploy/quickstart.sh
#
# Environment (all optional):
#   TASKGRID_ADDR      where the scheduler listens   (default 127.0.0.1:7070)
#   TASKGRID_HTTP_ADDR where the web dashboard is    (default 127.0.0.1:7080)
#   TASKGRID_DATA_DIR  its data directory            (default <repo>/.taskgrid/data)
#   TASKGRID_STORE     postgres://... keeps the task table in PostgreSQL
#                      instead (read by the scheduler itself)
#   TASKGRID_SLOTS     the local agent's slots       (default 2)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
addr=${TASKGRID_ADDR:-127.0.0.1:7070}
http_addr=${TASKGRID_HTTP_ADDR:-127.0.0.1:7080}
data_dir=${TASKGRID_DATA_DIR:-$root/.taskgrid/data}
slots=${TASKGRID_SLOTS:-2}
# Where the task table is, as printed (a URL's password left out).
where="data: $data_dir"
if [[ ${TASKGRID_STORE:-sqlite} == postgres* ]]; then
  where="store: $(sed -E 's#//([^:@/]*):[^@/]*@#//\1@#' <<<"$TASKGRID_STORE")"
fi
build=$root/build/release
bin=$build/bin
logs=$root/.taskgrid/logs

"$root/deploy/install-deps.sh"

echo "quickstart: building (Release) in $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTASKGRID_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"

mkdir -p "$data_dir" "$logs"
pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "quickstart: stopping the agent and the scheduler"
  # Agent first: SIGINT makes it release what it runs at once (re-queued,
  # not counted) and hand its last results over; then the scheduler.
  if ((${#pids[@]} > 1)); then
    kill -INT "${pids[1]}" 2>/dev/null || true
    wait "${pids[1]}" 2>/dev/null || true
  fi
  kill -TERM "${pids[0]}" 2>/dev/null || true
  wait "${pids[0]}" 2>/dev/null || true
  echo "quickstart: stopped. Tasks kept ($where)"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

port_file=$root/.taskgrid/port
http_port_file=$root/.taskgrid/http-port
rm -f "$port_file" "$http_port_file"
# setsid: Ctrl-C reaches only this script, which stops the agent first.
setsid "$bin/taskgrid-scheduler" --listen="$addr" --data_dir="$data_dir" --port_file="$port_file" \
  --http_listen="$http_addr" --http_port_file="$http_port_file" \
  >"$logs/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  [[ -s $port_file ]] && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "quickstart: the scheduler did not start:" >&2
    cat "$logs/scheduler.log" >&2
    exit 1
  fi
  sleep 0.1
done
[[ -s $port_file ]] || { echo "quickstart: the scheduler did not start in 10 s" >&2; exit 1; }
# The HTTP server starts before gRPC, so its port file is there by now.
dashboard="http://${http_addr%:*}:$(cat "$http_port_file")/"

setsid "$bin/taskgrid-agent" --scheduler="$addr" --id=local-agent --slots="$slots" \
  >"$logs/agent.log" 2>&1 &
pids+=($!)

cat <<TXT

Taskgrid is running.
  scheduler  $addr   $where   log: $logs/scheduler.log
  agent      local-agent, $slots slots          log: $logs/agent.log
  dashboard  $dashboard   (open it in a browser on this machine)

In another terminal:
  export PATH="$bin:\$PATH" TASKGRID_ADDR=$addr
  taskgridctl submit --id hello -- /bin/echo hi
  taskgridctl get hello
  taskgridctl list
  taskgridctl stats

Ctrl-C stops both.
TXT

# Wait until Ctrl-C, or until the scheduler exits on its own. An agent that
# dies (kill -9 it to see its work move) leaves the scheduler running: its
# tasks go to the next agent that connects.
wait -n "${pids[@]}" || true
if kill -0 "${pids[0]}" 2>/dev/null; then
  echo "quickstart: the agent local-agent exited (see $logs/agent.log); the scheduler keeps" \
    "running: start an agent (taskgrid-agent --id=NAME) to take its work. Ctrl-C stops it." >&2
  pids=("${pids[0]}")
  wait "${pids[0]}" || true
fi
echo "quickstart: the scheduler exited on its own; see $logs/scheduler.log" >&2
exit 1
