"""System tests of finished tasks on disk and retention, with the real
binaries: finished tasks leave the scheduler's memory and read the same
from disk, before and after a kill -9; a new task can depend on one and
gets its output; retention deletes them on time, per queue and for the
dead letter; taskgridctl delete, job delete and queue retention, and their
refusals.

Run through ctest (system.retention), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import os
import re
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 60.0


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


def start(cluster):
    """The scheduler, with its HTTP port (for /metrics) written to a file."""
    port_file = os.path.join(cluster.dir, "http.port")
    cluster.start_scheduler(
        extra_flags=["--http_listen=127.0.0.1:0", f"--http_port_file={port_file}"])
    def port():
        if not os.path.exists(port_file):
            return ""
        with open(port_file) as f:
            return f.read().strip()

    harness.wait_until(port, what="the HTTP port file")
    return int(port())


def stdout_of(task):
    return base64.b64decode(task["result"].get("stdout_tail", "")).decode()


def records(http_port):
    """taskgrid_task_records by where they are kept."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'(?m)^taskgrid_task_records\{where="(\w+)"\} (\S+)$', text)}


class FinishedTasksTest(unittest.TestCase):
    def test_finished_tasks_read_the_same_from_disk_across_a_crash(self):
        with harness.Cluster(scheduler_flags=["--finished_in_memory=0s"]) as c:
            http = start(c)
            c.start_agent("a1", slots=4)
            for i in range(12):
                c.ctl("submit", f"--id=d{i}", "--", "/bin/echo", f"out {i}", check=True)
            c.ctl("submit", "--id=bad", "--max_attempts=1", "--", "/bin/sh", "-c", "exit 3",
                  check=True)
            for i in range(12):
                c.wait_state(f"d{i}", "SUCCEEDED", timeout=WAIT)
            c.wait_state("bad", "FAILED", timeout=WAIT)
            harness.wait_until(lambda: records(http).get("disk") == 13, timeout=WAIT,
                               what="13 finished tasks on disk")
            self.assertEqual(records(http).get("memory"), 0)
            before = c.task("d5")
            self.assertEqual(stdout_of(before), "out 5\n")
            listed = [t["spec"]["id"] for t in c.tasks()]
            self.assertEqual(listed, [f"d{i}" for i in range(12)] + ["bad"])

            # A new task depending on one on disk gets its output as input.
            c.ctl("submit", "-f", "-", check=True,
                  input='{"id": "after", "depends_on": ["d3"], "steps": [{"exec": {"argv": '
                        '["/bin/sh", "-c", "cat $TASKGRID_INPUTS_DIR/d3"]}}]}')
            done = c.wait_state("after", "SUCCEEDED", timeout=WAIT)
            self.assertEqual(stdout_of(done), "out 3\n")

            c.scheduler.kill9()
            http = start(c)
            harness.wait_until(lambda: records(http).get("disk") == 14, timeout=WAIT,
                               what="every finished task on disk after the restart")
            self.assertEqual(c.task("d5"), before, "read back from disk as it was")
            # Changing one reads it back into memory first. The reset
            # dispatches at once when a1 is back by then (it reconnects on its
            # own), so the answer is PENDING or already DISPATCHED.
            retried = c.ctl_json("reset", "bad")
            self.assertIn(state(retried), ("PENDING", "DISPATCHED", "RUNNING"))
            c.wait_state("bad", "FAILED", timeout=WAIT)
            self.assertEqual(c.task("bad")["attempt"], 2)


class RetentionTest(unittest.TestCase):
    def test_retention_and_deletes(self):
        flags = ["--finished_in_memory=0s", "--retention=3s", "--failed_retention=1h"]
        with harness.Cluster(scheduler_flags=flags) as c:
            c.start_scheduler()
            c.start_agent("a1", slots=4)
            out = c.ctl("queue", "retention", "keep", "--retention=0s", check=True).stdout
            self.assertRegex(out, r"keeps forever")
            c.ctl("submit", "--id=short", "--", "/bin/true", check=True)
            c.ctl("submit", "--id=kept", "--queue=keep", "--", "/bin/true", check=True)
            c.ctl("submit", "--id=dead", "--max_attempts=1", "--", "/bin/false", check=True)
            c.ctl("submit", "--id=long", "--", "sleep", "30", check=True)
            for task_id, st in (("short", "SUCCEEDED"), ("kept", "SUCCEEDED"),
                                ("dead", "FAILED")):
                c.wait_state(task_id, st, timeout=WAIT)
            c.wait_state("long", "RUNNING", timeout=WAIT)

            # The setting survives a crash.
            c.scheduler.kill9()
            c.start_scheduler()
            stats = c.ctl_json("stats", "--queue=keep")["queues"][0]
            self.assertEqual(stats["settings"]["retention"], "0s")

            harness.wait_until(lambda: c.ctl("get", "short").returncode == 1, timeout=WAIT,
                               what="short deleted by retention")
            gone = c.ctl("get", "short")
            self.assertIn("NOT_FOUND", gone.stderr)
            self.assertEqual(state(c.task("kept")), "SUCCEEDED", "its queue keeps it")
            self.assertEqual(state(c.task("dead")), "FAILED", "the dead letter is kept longer")

            # Deletes: refused with a reason, or done.
            res = c.ctl("delete", "long")
            self.assertEqual(res.returncode, 1)
            self.assertIn("FAILED_PRECONDITION", res.stderr)
            self.assertIn("cancel it first", res.stderr)
            self.assertEqual(c.ctl("delete").returncode, 2)
            out = c.ctl("delete", "dead", check=True).stdout
            self.assertEqual(out, "deleted dead\n")
            self.assertEqual(c.ctl("get", "dead").returncode, 1)
            for i in range(5):
                c.ctl("submit", f"--id=k{i}", "--queue=keep", "--", "/bin/true", check=True)
            for i in range(5):
                c.wait_state(f"k{i}", "SUCCEEDED", timeout=WAIT)
            out = c.ctl("delete", "--queue=keep", "--limit=2", check=True).stdout
            self.assertEqual(out, "deleted 6 tasks\n")
            self.assertEqual(c.tasks("--queue=keep"), [])
            # An id deleted is free again.
            c.ctl("submit", "--id=dead", "--", "/bin/true", check=True)
            c.wait_state("dead", "SUCCEEDED", timeout=WAIT)

            # A job goes whole.
            c.ctl("job", "submit", "-", check=True,
                  input='{"job_id": "j1", "tasks": ['
                        '{"id": "j1-a", "steps": [{"exec": {"argv": ["/bin/true"]}}]},'
                        ' {"id": "j1-b", "depends_on": ["j1-a"],'
                        '  "steps": [{"exec": {"argv": ["/bin/true"]}}]}]}')
            c.wait_state("j1-b", "SUCCEEDED", timeout=WAIT)
            res = c.ctl("delete", "j1-a")
            self.assertEqual(res.returncode, 1)
            self.assertIn("job \"j1\"", res.stderr)
            out = c.ctl("job", "delete", "j1", check=True).stdout
            self.assertEqual(out, "deleted job j1 and its 2 tasks\n")
            self.assertEqual(c.ctl("job", "get", "j1").returncode, 1)


if __name__ == "__main__":
    unittest.main()
