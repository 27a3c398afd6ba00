"""The taskgrid Python package: a Client for the scheduler's gRPC API and a
Worker that runs Python functions as tasks (pull mode).

  python3 -m venv --system-site-packages venv   # sees Debian's python3-grpcio
  venv/bin/pip install ./clients/python

The messages and stubs (taskgrid.v1.*_pb2) are generated from proto/ while
the package is built, with Debian's protoc and grpc_python_plugin (packages
protobuf-compiler, protobuf-compiler-grpc), so they always match the
.proto files of this checkout. There is no pyproject.toml on purpose: pip
then builds with the setuptools it has, instead of fetching one into an
isolated build environment, so the install works without a package index.
"""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto")


class BuildWithStubs(build_py):
    """build_py, then protoc into the build tree's taskgrid/v1/."""

    def run(self):
        super().run()
        plugin = os.environ.get("GRPC_PYTHON_PLUGIN", "/usr/bin/grpc_python_plugin")
        for tool in ("protoc", plugin):
            if shutil.which(tool) is None:
                raise SystemExit(f"taskgrid: {tool} not found: apt-get install protobuf-compiler "
                                 "protobuf-compiler-grpc (deploy/install-deps.sh --python)")
        out = os.path.abspath(self.build_lib)
        protos = sorted(os.path.relpath(p, PROTO)
                        for p in glob.glob(os.path.join(PROTO, "taskgrid", "v1", "*.proto")))
        subprocess.run(["protoc", "-I", ".", f"--python_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={plugin}", *protos], cwd=PROTO, check=True)
        open(os.path.join(out, "taskgrid", "v1", "__init__.py"), "a").close()


setup(
    name="taskgrid",
    version="0.1.0",
    description="Client and worker for the Taskgrid task scheduler",
    packages=["taskgrid"],
    python_requires=">=3.9",
    # Debian's python3-grpcio and python3-protobuf (a venv made with
    # --system-site-packages sees them); not fetched from an index.
    install_requires=[],
    cmdclass={"build_py": BuildWithStubs},
)
