#!/usr/bin/env bash
# Generates the Python messages and gRPC stubs of proto/taskgrid/v1/*.proto
# with Debian's protoc and grpc_python_plugin (packages protobuf-compiler and
# protobuf-compiler-grpc; run them with /usr/bin/python3 and python3-grpcio,
# python3-protobuf: deploy/install-deps.sh --python).
#
#   clients/python/generate.sh [OUT]    default OUT: clients/python/taskgrid_pb
#
# OUT gets the package taskgrid/v1/ (task_pb2.py, task_service_pb2_grpc.py,
# ...). Put OUT on sys.path (the scripts here read TASKGRID_PB_DIR, default
# clients/python/taskgrid_pb), then: from taskgrid.v1 import task_service_pb2
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/taskgrid_pb}
plugin=${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}

for tool in protoc "$plugin"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "generate.sh: $tool not found (apt-get install protobuf-compiler protobuf-compiler-grpc)" >&2
    exit 1
  fi
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
# Start clean so a proto that was removed leaves no stale module behind.
rm -rf "$out/taskgrid"
protos=(taskgrid/v1/task.proto taskgrid/v1/task_service.proto
        taskgrid/v1/agent_service.proto taskgrid/v1/cluster_service.proto
        taskgrid/v1/job_service.proto taskgrid/v1/board_service.proto
        taskgrid/v1/schedule_service.proto)
(cd "$root/proto" && protoc -I . --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc="$plugin" "${protos[@]}")
# Regular packages (not namespace packages): `import taskgrid.v1` finds only OUT.
touch "$out/taskgrid/__init__.py" "$out/taskgrid/v1/__init__.py"
modules=("$out"/taskgrid/v1/*_pb2*.py)
echo "generate.sh: wrote ${#modules[@]} modules to $out/taskgrid/v1"
