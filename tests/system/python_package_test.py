"""The Python package (clients/python) as a user installs it: a fresh venv
made with --system-site-packages (Debian's python3-grpcio, python3-protobuf
and python3-pytest), `pip install ./clients/python` with no package index,
then its pytest suite (clients/python/tests: the Client, the Worker and the
README's examples) against the real binaries.

Run through ctest (system.python_package), or by hand with
TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "clients", "python")


class PythonPackageTest(unittest.TestCase):
    def test_install_and_run_its_tests(self):
        tmp = tempfile.mkdtemp(prefix="taskgrid-python-")
        self.addCleanup(shutil.rmtree, tmp, True)
        venv = os.path.join(tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                       check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        # A copy of the package beside a copy of proto/, as in the checkout:
        # the build writes into its directory, never into the source tree.
        src = os.path.join(tmp, "src")
        shutil.copytree(PACKAGE, os.path.join(src, "clients", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                      "taskgrid_pb"))
        shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(src, "proto"))
        res = subprocess.run([python, "-m", "pip", "install", "-q",
                              os.path.join(src, "clients", "python")],
                             capture_output=True, text=True, env=env, timeout=300)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        res = subprocess.run([python, "-c", "import taskgrid, taskgrid.v1.task_pb2; "
                              "print(taskgrid.__version__)"],
                             capture_output=True, text=True, timeout=60, cwd=tmp)
        self.assertEqual(res.returncode, 0, res.stderr)
        # The tests run from the checkout, against the installed package.
        res = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              os.path.join(PACKAGE, "tests")],
                             capture_output=True, text=True, timeout=900, cwd=tmp,
                             env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        sys.stdout.write(res.stdout[-20000:])
        self.assertEqual(res.returncode, 0, res.stdout[-20000:] + res.stderr[-5000:])


if __name__ == "__main__":
    unittest.main(verbosity=2)
