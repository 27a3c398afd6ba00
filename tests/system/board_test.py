"""System tests of pull mode (BoardService) with the real binaries: claims
that outlive a kill -9 of the scheduler, claims that run out while it is
down, and the Python pull worker (clients/python/pull_worker.py) running
tasks, completing across a scheduler restart, and giving its claims back
on SIGTERM.

Run through ctest (system.board), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set, with /usr/bin/python3 (grpcio).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT = os.path.join(ROOT, "clients", "python")


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


class BoardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise AssertionError(f"{sys.executable} has no grpc module: install python3-grpcio "
                                 "(deploy/install-deps.sh --python) and run with /usr/bin/python3")
        cls.tmp = tempfile.mkdtemp(prefix="taskgrid-board-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.stubs = os.path.join(cls.tmp, "stubs")
        res = subprocess.run([os.path.join(CLIENT, "generate.sh"), cls.stubs],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise AssertionError(f"generate.sh exited {res.returncode}:\n{res.stdout}{res.stderr}")
        cls.env = dict(os.environ, TASKGRID_PB_DIR=cls.stubs, PYTHONDONTWRITEBYTECODE="1")

    def submit(self, cluster, specs):
        path = os.path.join(cluster.dir, "tasks.json")
        with open(path, "w") as f:
            json.dump(specs, f)
        cluster.ctl("submit", "-f", path, check=True)

    def start_worker(self, cluster, owner, *flags):
        argv = [sys.executable, "-u", os.path.join(CLIENT, "pull_worker.py"),
                f"--addr={cluster.addr}", "--queue=pull", f"--owner={owner}"] + list(flags)
        worker = harness.Process(argv, os.path.join(cluster.dir, f"worker-{owner}.log"),
                                 env=self.env)
        cluster._all.append(worker)
        return worker

    def claim(self, cluster, owner, *flags):
        out = cluster.ctl_json("board", "claim", "--queue=pull", f"--owner={owner}", *flags)
        return [c["assignment"] for c in out.get("claims", [])]

    def test_a_claim_outlives_a_kill9_of_the_scheduler(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=job-0", "--queue=pull", "--priority=5", "--", "/bin/true",
                  check=True)
            c.ctl("submit", "--id=job-1", "--queue=pull", "--", "/bin/true", check=True)
            res = c.ctl("board", "claim", "--queue=pull", "--owner=w1", "job-1", "job-2")
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn('unexpected "job-2" after board claim', res.stderr)
            # The task named, not the queue's best (job-0).
            claims = self.claim(c, "w1", "--lease=5m", "job-1")
            self.assertEqual([(a["task_id"], a["attempt"]) for a in claims], [("job-1", 1)])
            res = c.ctl("board", "claim", "--owner=w2", "job-1")
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertIn("FAILED_PRECONDITION", res.stderr)
            self.assertIn('task "job-1" cannot be claimed: it is attempt 1 claimed by w1',
                          res.stderr)
            self.assertEqual(state(c.task("job-0")), "PENDING")
            c.scheduler.kill9()
            c.start_scheduler()
            task = c.task("job-1")
            self.assertEqual(state(task), "RUNNING")
            self.assertEqual(task["agent_id"], "w1")
            self.assertIn("claim_expire_time", task)
            res = c.ctl("board", "complete", "job-1", "1", "--owner=w1", "--stdout=made it")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertEqual(res.stdout.strip(), "job-1 SUCCEEDED")
            task = c.task("job-1")
            self.assertEqual(task["attempt"], 1)
            self.assertEqual(len(task["attempts"]), 1)

    def test_a_claim_that_runs_out_while_the_scheduler_is_down_goes_back(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=short", "--queue=pull", "--", "/bin/true", check=True)
            self.assertEqual(len(self.claim(c, "w1", "--lease=2s")), 1)
            c.scheduler.kill9()
            time.sleep(2.5)   # the claim's stored end passes while nothing runs
            c.start_scheduler()
            task = c.wait_state("short", "PENDING")
            self.assertEqual(task["result"]["outcome"], "OUTCOME_LOST")
            self.assertIn("the claim by w1 ran out", task["result"]["error"])
            self.assertEqual(task["attempts_used"], 1)
            res = c.ctl("board", "complete", "short", "1", "--owner=w1")
            self.assertEqual(res.returncode, 1)
            self.assertIn("ABORTED", res.stderr)
            self.assertEqual([a["attempt"] for a in self.claim(c, "w2")], [2])

    def test_the_python_worker_runs_what_it_claims(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            self.submit(c, [
                {"id": "hello", "queue": "pull",
                 "steps": [{"exec": {"argv": ["/bin/echo", "hello from a pull worker"]}}]},
                {"id": "stdin", "queue": "pull", "payload": "cGF5bG9hZA==",   # "payload"
                 "steps": [{"builtin": {"name": "echo"}}, {"exec": {"argv": ["/bin/cat"]}}]},
                {"id": "fails", "queue": "pull", "max_attempts": 1,
                 "steps": [{"exec": {"argv": ["/bin/sh", "-c", "echo oops >&2; exit 7"]}}]},
                {"id": "gpu-only", "queue": "pull",
                 "placement": {"required_labels": {"gpu": "1"}},
                 "steps": [{"builtin": {"name": "noop"}}]},
            ])
            worker = self.start_worker(c, "py-1", "--max_tasks=3")
            for task_id, want in (("hello", "SUCCEEDED"), ("stdin", "SUCCEEDED"),
                                  ("fails", "FAILED")):
                task = c.wait_state(task_id, want)
                self.assertEqual(task["attempts"][-1]["agent_id"], "py-1", task_id)
            import base64
            self.assertEqual(base64.b64decode(c.task("hello")["result"]["stdout_tail"]),
                             b"hello from a pull worker\n")
            failed = c.task("fails")["result"]
            self.assertEqual(failed["exit_code"], 7)
            self.assertEqual(base64.b64decode(failed["stderr_tail"]), b"oops\n")
            harness.wait_until(lambda: not worker.alive(), timeout=WAIT,
                               what="the worker to exit after 3 tasks")
            self.assertEqual(state(c.task("gpu-only")), "PENDING",
                             "a worker without the label leaves it alone")

    def test_the_python_worker_completes_across_a_scheduler_restart(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=slow", "--queue=pull", "--", "/bin/sh", "-c",
                  "sleep 2; echo done", check=True)
            worker = self.start_worker(c, "py-2", "--max_tasks=1", "--lease=20")
            c.wait_state("slow", "RUNNING")
            c.scheduler.kill9()
            c.start_scheduler()
            task = c.wait_state("slow", "SUCCEEDED")
            self.assertEqual(task["attempt"], 1, "the claim held over the restart")
            harness.wait_until(lambda: not worker.alive(), timeout=WAIT,
                               what="the worker to exit")
            self.assertIn("slow attempt 1 completed", worker.log())

    def test_sigterm_gives_the_workers_claims_back_uncounted(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=long", "--queue=pull", "--max_attempts=1", "--",
                  "/bin/sleep", "60", check=True)
            worker = self.start_worker(c, "py-3")
            c.wait_state("long", "RUNNING")
            worker.signal(signal.SIGTERM)
            task = c.wait_state("long", "PENDING")
            self.assertEqual(task["attempts_used"], 0)
            self.assertTrue(task["attempts"][-1]["interrupted"])
            harness.wait_until(lambda: not worker.alive(), timeout=WAIT,
                               what="the worker to exit")


if __name__ == "__main__":
    unittest.main(verbosity=2)
