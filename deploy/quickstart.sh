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
#   TASKGRID_LOGS      where the logs go             (default <repo>/.taskgrid/logs;
#                      the port files go beside it)
#   TASKGRID_QUICKSTART_BIN  a directory that already holds the three
#                      binaries: nothing is installed or built (the tests
#                      run this script so)
#
# A scheduler that exits on its own (killed, or stopped on a failed commit)
# is started again, as systemd's Restart=on-failure would; the agent
# reconnects and what it runs goes on. Kill -9 the scheduler to see it.
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
logs=${TASKGRID_LOGS:-$root/.taskgrid/logs}
state=$(dirname "$logs")

if [[ -n ${TASKGRID_QUICKSTART_BIN:-} ]]; then
  bin=$TASKGRID_QUICKSTART_BIN
else
  "$root/deploy/install-deps.sh"
  echo "quickstart: building (Release) in $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTASKGRID_TESTS=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)"
fi

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

port_file=$state/port
http_port_file=$state/http-port
# Starts the scheduler (pids[0]) and waits until it serves.
start_scheduler() {
  rm -f "$port_file" "$http_port_file"
  # setsid: Ctrl-C reaches only this script, which stops the agent first.
  setsid "$bin/taskgrid-scheduler" --listen="$addr" --data_dir="$data_dir" \
    --port_file="$port_file" --http_listen="$http_addr" --http_port_file="$http_port_file" \
    >>"$logs/scheduler.log" 2>&1 &
  pids[0]=$!
  for _ in $(seq 1 100); do
    [[ -s $port_file ]] && return 0
    if ! kill -0 "${pids[0]}" 2>/dev/null; then
      echo "quickstart: the scheduler did not start:" >&2
      tail -n 20 "$logs/scheduler.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "quickstart: the scheduler did not start in 10 s" >&2
  return 1
}
: >"$logs/scheduler.log"
start_scheduler || exit 1
# The HTTP server starts before gRPC, so its port file is there by now.
dashboard="http://${http_addr%:*}:$(cat "$http_port_file")/"

setsid "$bin/taskgrid-agent" --scheduler="$addr" --id=local-agent --slots="$slots" \
  --work_dir="$state/work" >"$logs/agent.log" 2>&1 &
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

# Wait until Ctrl-C. A scheduler that exits on its own is started again
# (at most 5 times in a row within a minute of each start: one that cannot
# stay up is left down); an agent that dies (kill -9 it to see its work
# move) leaves the scheduler running: its tasks go to the next agent that
# connects.
restarts=0
while true; do
  wait -n "${pids[@]}" 2>/dev/null || true  # (bash would print "Killed" for a kill -9)
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    code=0
    wait "${pids[0]}" 2>/dev/null || code=$?
    if ((code == 0)); then
      echo "quickstart: the scheduler stopped (exit code 0); see $logs/scheduler.log" >&2
      exit 1
    fi
    if ((SECONDS - ${started_at:-0} > 60)); then restarts=0; fi
    if ((restarts >= 5)); then
      echo "quickstart: the scheduler exited $restarts times in a row; see $logs/scheduler.log" >&2
      exit 1
    fi
    restarts=$((restarts + 1))
    echo "quickstart: the scheduler exited (exit code $code); starting it again: the agent" \
      "reconnects and what it runs goes on" >&2
    start_scheduler || exit 1
    started_at=$SECONDS
    echo "quickstart: the scheduler is serving again on $addr" >&2
    continue
  fi
  if ((${#pids[@]} > 1)) && ! kill -0 "${pids[1]}" 2>/dev/null; then
    echo "quickstart: the agent local-agent exited (see $logs/agent.log); the scheduler keeps" \
      "running: start an agent (taskgrid-agent --id=NAME) to take its work. Ctrl-C stops it." >&2
    wait "${pids[1]}" 2>/dev/null || true
    pids=("${pids[0]}")
  fi
done
