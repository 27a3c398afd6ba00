#!/usr/bin/env bash
# Starts or stops the PostgreSQL server the tests use: one per ctest run
# (the ctest fixture "postgres", tests/testing/CMakeLists.txt), never a
# system service. Its data lives in a temporary directory; it listens on a
# unix socket there and on 127.0.0.1 at a free port. The test database
# "taskgrid" belongs to the superuser "taskgrid" (trust authentication:
# the server is reachable from this machine only, for the run's length).
#
#   tests/testing/postgres.sh start DIR   # writes DIR/url: postgresql://taskgrid@127.0.0.1:PORT/taskgrid
#   tests/testing/postgres.sh stop DIR
#
# Without PostgreSQL's server binaries (Debian's postgresql-15) start
# writes no url and the tests that need one skip, unless
# TASKGRID_REQUIRE_POSTGRES=1, when start fails. As root (CI) the server
# runs as the `postgres` user, since initdb refuses root. FSYNC=on keeps
# fsync on (the benchmark's server); tests run without it.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

bin=""
for d in /usr/lib/postgresql/*/bin; do
  if [[ -x $d/initdb ]]; then bin=$d; fi  # the newest, as the glob sorts
done

case "$cmd" in
  start)
    rm -f "$dir/url"
    mkdir -p "$dir"
    if [[ -z $bin ]]; then
      if [[ ${TASKGRID_REQUIRE_POSTGRES:-0} == 1 ]]; then
        echo "postgres.sh: no PostgreSQL server (initdb) under /usr/lib/postgresql/*/bin; install postgresql-15 (deploy/install-deps.sh --postgres)" >&2
        exit 1
      fi
      echo "postgres.sh: no PostgreSQL server installed; the PostgreSQL tests will skip"
      exit 0
    fi
    # A server left by an earlier run that was killed before its stop.
    if [[ -f $dir/datadir ]]; then "$0" stop "$dir" || true; fi
    data=$(mktemp -d /tmp/taskgrid-pg.XXXXXX)
    echo "$data" >"$dir/datadir"
    run=()
    if [[ $(id -u) -eq 0 ]]; then
      chown postgres:postgres "$data"
      run=(runuser -u postgres --)
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${run[@]}" "$bin/initdb" -D "$data/db" -U taskgrid --auth=trust -E UTF8 --locale=C.UTF-8 \
      --no-sync >"$data/initdb.log" 2>&1 || { cat "$data/initdb.log" >&2; exit 1; }
    fsync=off
    if [[ ${FSYNC:-off} == on ]]; then fsync=on; fi
    if ! "${run[@]}" "$bin/pg_ctl" -D "$data/db" -l "$data/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $data -c fsync=$fsync -c max_connections=200" \
      start >/dev/null; then
      cat "$data/server.log" >&2
      exit 1
    fi
    "$bin/psql" -X -q -h 127.0.0.1 -p "$port" -U taskgrid -d postgres -c "CREATE DATABASE taskgrid"
    echo "postgresql://taskgrid@127.0.0.1:$port/taskgrid" >"$dir/url"
    echo "postgres.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (fsync=$fsync), data in $data"
    ;;
  stop)
    rm -f "$dir/url"
    [[ -f $dir/datadir ]] || exit 0
    data=$(cat "$dir/datadir")
    run=()
    if [[ $(id -u) -eq 0 ]]; then run=(runuser -u postgres --); fi
    if [[ -n $bin && -f $data/db/postmaster.pid ]]; then
      "${run[@]}" "$bin/pg_ctl" -D "$data/db" -m immediate -w -t 30 stop >/dev/null || true
    fi
    rm -rf "$data"
    rm -f "$dir/datadir"
    ;;
  *)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
