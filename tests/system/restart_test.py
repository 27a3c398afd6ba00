"""Invariant 5 with the real binaries: kill -9 the scheduler, restart it on
the same data directory, and find every acknowledged task there, then run.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, binary, wait_until  # noqa: E402


# Runs until the test's "go" file exists (bounded: 60 s), so a step is still
# running when the scheduler is killed however slow the machine is.
HOLD = r"""
i=0; while [ ! -e "$1/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
[ -e "$1/go" ]
"""


def listed_ids(cluster, *filters):
    doc = cluster.ctl_json("list", "--all", *filters)
    return {t["spec"]["id"] for t in doc.get("tasks", [])}


def state_counts(cluster):
    doc = cluster.ctl_json("stats")
    counts = {}
    for q in doc.get("queues", []):
        for state, n in q.get("counts", {}).items():
            counts[state] = counts.get(state, 0) + int(n)
    return counts


class RestartTest(unittest.TestCase):

    def test_acknowledged_submits_survive_kill9_and_then_run(self):
        with Cluster() as c:
            c.start_scheduler()
            acked = []
            # One at a time: each acknowledged (exit 0) before the next.
            for i in range(60):
                res = c.ctl("submit", f"--id=one-{i}", "--builtin=noop")
                self.assertEqual(res.returncode, 0, res.stderr)
                acked.append(f"one-{i}")
            # And a batch of 500 in one call.
            batch = [{"id": f"batch-{i}", "steps": [{"builtin": {"name": "noop"}}]}
                     for i in range(500)]
            res = c.ctl("submit", "-f", "-", input=json.dumps(batch))
            self.assertEqual(res.returncode, 0, res.stderr)
            acked += [t["id"] for t in batch]

            c.scheduler.kill9()  # right after the last acknowledgement
            c.start_scheduler()
            self.assertTrue(set(acked) <= listed_ids(c), "an acknowledged task was lost")

            c.start_agent("a1", slots=8)
            wait_until(lambda: state_counts(c).get("SUCCEEDED", 0) == len(acked),
                       timeout=120, interval=0.5, what="every recovered task to succeed")

    def test_submits_racing_a_kill9_are_durable_when_acknowledged(self):
        with Cluster() as c:
            c.start_scheduler()
            acked, stop = [], threading.Event()

            def submitter(prefix):
                i = 0
                while not stop.is_set():
                    tid = f"{prefix}-{i}"
                    res = c.ctl("submit", f"--id={tid}", "--builtin=noop", "--timeout=5s")
                    if res.returncode == 0:
                        acked.append(tid)
                    i += 1
            threads = [threading.Thread(target=submitter, args=(f"race{n}",)) for n in range(3)]
            for t in threads:
                t.start()
            wait_until(lambda: len(acked) >= 40, timeout=60, what="some acknowledged submits")
            c.scheduler.kill9()  # while submits are in flight
            stop.set()
            for t in threads:
                t.join(timeout=60)
            acked_at_kill = list(acked)
            c.start_scheduler()
            missing = set(acked_at_kill) - listed_ids(c)
            self.assertFalse(missing, f"acknowledged but lost: {sorted(missing)[:10]}")

    def test_in_flight_tasks_finish_after_a_restart(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=4)
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            for i in range(4):
                c.ctl("submit", f"--id=run-{i}", "--", "sh", "-c", HOLD, "hold", d, check=True)
            for i in range(4):
                c.wait_state(f"run-{i}", "RUNNING")
            c.scheduler.kill9()
            c.start_scheduler()
            # The steps ran on through the restart; they end only now.
            with open(os.path.join(d, "go"), "w"):
                pass
            for i in range(4):
                task = c.wait_state(f"run-{i}", "SUCCEEDED", timeout=60)
                # Reclaimed by the reconnecting agent: still its first attempt.
                self.assertEqual(task["attempt"], 1, task)
                self.assertEqual(len(task["attempts"]), 1, task)

    def test_second_scheduler_on_the_same_data_dir_refuses_to_start(self):
        with Cluster() as c:
            c.start_scheduler()
            res = subprocess.run(
                [binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0",
                 f"--data_dir={c.data_dir}"],
                capture_output=True, text=True, timeout=30)
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("in use by another taskgrid-scheduler", res.stderr)
            self.assertIn(f"pid {c.scheduler.pid}", res.stderr)
            self.assertTrue(c.scheduler.alive())
            # The first one still serves.
            c.ctl("submit", "--id=still-here", "--builtin=noop", check=True)

    def test_sigterm_stops_promptly_with_a_wait_in_progress(self):
        with Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=waited", "--builtin=noop", check=True)  # no agent: stays PENDING
            waiter = subprocess.Popen(
                [binary("TASKGRID_CTL"), f"--addr={c.addr}", "wait", "waited", "--timeout=3s"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(1.0)  # the WaitTask call is open on the scheduler
                start = time.monotonic()
                self.assertEqual(c.scheduler.stop(timeout=15), 0, c.scheduler.log())
                self.assertLess(time.monotonic() - start, 5.0, "stopping waited for the open call")
            finally:
                waiter.kill()
                waiter.wait(timeout=30)

    def test_sigterm_stops_cleanly(self):
        with Cluster() as c:
            c.start_scheduler()
            c.ctl("submit", "--id=kept", "--builtin=noop", check=True)
            self.assertEqual(c.scheduler.stop(), 0, c.scheduler.log())
            self.assertIn("stopped", c.scheduler.log())
            c.start_scheduler()
            self.assertIn("kept", listed_ids(c))


if __name__ == "__main__":
    unittest.main()
