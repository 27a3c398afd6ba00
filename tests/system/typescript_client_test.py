"""The TypeScript client (clients/typescript) as a user builds it: a copy of
the package beside a copy of proto/, `npm ci` (pinned by its
package-lock.json), `npm run build` (tsc), then `npm test` (node's test
runner: the Client, the Worker and the README's examples) against the real
binaries.

Run through ctest (system.typescript_client), or by hand with
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
PACKAGE = os.path.join(ROOT, "clients", "typescript")


class TypescriptClientTest(unittest.TestCase):
    def run_step(self, argv, cwd, timeout):
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ, npm_config_update_notifier="false"))
        sys.stdout.write(res.stdout[-20000:])
        self.assertEqual(res.returncode, 0,
                         f"{' '.join(argv)}:\n{res.stdout[-20000:]}\n{res.stderr[-5000:]}")

    def test_build_and_run_its_tests(self):
        self.assertIsNotNone(shutil.which("npm"), "npm is missing (deploy/install-deps.sh --web)")
        tmp = tempfile.mkdtemp(prefix="taskgrid-ts-")
        self.addCleanup(shutil.rmtree, tmp, True)
        pkg = os.path.join(tmp, "clients", "typescript")
        shutil.copytree(PACKAGE, pkg,
                        ignore=shutil.ignore_patterns("node_modules", "dist", "proto"))
        shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(tmp, "proto"))
        self.run_step(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], pkg, 600)
        self.run_step(["npm", "run", "build"], pkg, 300)
        self.run_step(["npm", "test"], pkg, 900)


if __name__ == "__main__":
    unittest.main(verbosity=2)
