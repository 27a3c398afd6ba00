"""System tests of `taskgridctl logs` with the real binaries: a follow that
shows a running task's lines before it ends and exits 0 when it succeeds,
`logs` of a finished task and of one that does not exist, and kill -9 of
the agent running a followed task: the follow goes on with the next
attempt on another agent, and never waits unbounded; kill -9 of the
scheduler: the follow reconnects to the restarted one and prints every
line once.

Run through ctest (system.logs), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import queue
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0
# Quick loss of a killed agent: silent after 1 s, its tasks move 1.2 s later.
SHORT_LEASES = ["--heartbeat_interval=250ms", "--heartbeat_timeout=1s", "--reconnect_grace=1200ms"]


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


class Follower:
    """`taskgridctl logs -f ID` running, its stdout read line by line on a
    thread (each line with the time it came), its stderr kept."""

    def __init__(self, c, task_id, *flags):
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={c.addr}", "logs", "-f", *flags, task_id]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines = queue.Queue()
        self.err = b""
        self._out = threading.Thread(target=self._read_out, daemon=True)
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out.start()
        self._err.start()

    def _read_out(self):
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.decode()))
        self.lines.put(None)

    def _read_err(self):
        self.err = self.proc.stderr.read()

    def next_line(self, timeout=WAIT):
        item = self.lines.get(timeout=timeout)
        if item is None:
            raise AssertionError(f"logs -f ended early; stderr:\n{self.err.decode()}")
        return item

    def wait(self, timeout=WAIT):
        """The exit code, and every stdout line not read yet."""
        rc = self.proc.wait(timeout=timeout)
        self._out.join(timeout=timeout)
        self._err.join(timeout=timeout)
        rest = []
        while True:
            item = self.lines.get(timeout=timeout)
            if item is None:
                return rc, rest
            rest.append(item[1])

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)


class LogsTest(unittest.TestCase):
    def test_follow_shows_lines_before_the_task_ends_and_exits_0_when_it_succeeds(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1")
            script = 'for i in 1 2 3 4 5 6 7 8; do echo "tick $i"; sleep 0.5; done; echo bye >&2'
            c.ctl("submit", "--id=ticker", "--", "/bin/sh", "-c", script, check=True)
            c.wait_state("ticker", "RUNNING", timeout=WAIT)
            f = Follower(c, "ticker")
            try:
                first_at, first = f.next_line()
                self.assertEqual(first, "tick 1\n")
                self.assertEqual(state(c.task("ticker")), "RUNNING",
                                 "the first line came only once the task had ended")
                _, second = f.next_line()
                self.assertEqual(second, "tick 2\n")
                rc, rest = f.wait()
                ended_at = time.monotonic()
            finally:
                f.close()
            self.assertEqual(rc, 0, f.err.decode())
            self.assertEqual(rest, [f"tick {i}\n" for i in range(3, 9)])
            self.assertIn("bye", f.err.decode())
            self.assertGreater(ended_at - first_at, 1.0, "the lines came all at the end")
            self.assertEqual(state(c.task("ticker")), "SUCCEEDED")

            # Once it is finished, `logs` prints what its result keeps.
            res = c.ctl("logs", "ticker", check=True)
            self.assertEqual(res.stdout, "".join(f"tick {i}\n" for i in range(1, 9)))
            self.assertEqual(res.stderr, "bye\n")
            res = c.ctl("logs", "--stderr", "ticker", check=True)
            self.assertEqual((res.stdout, res.stderr), ("", "bye\n"))

    def test_logs_of_an_unknown_task_is_not_found_and_a_failed_follow_exits_3(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            res = c.ctl("logs", "no-such-task")
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertIn("NOT_FOUND", res.stderr)
            self.assertIn("no-such-task", res.stderr)
            res = c.ctl("logs", "-f", "--stream=both", "x")
            self.assertEqual(res.returncode, 2, res.stderr)

            c.ctl("submit", "--id=later", "--builtin=noop", check=True)  # no agent yet
            res = c.ctl("logs", "later", check=True)
            self.assertIn("later is PENDING: not started yet", res.stderr)
            res = c.ctl("logs", "-f", "--wait_timeout=1s", "later")
            self.assertEqual(res.returncode, 4, res.stderr)

            c.start_agent("a1")
            c.ctl("submit", "--id=sad", "--max_attempts=1", "--", "/bin/sh", "-c",
                  "echo trying; sleep 1; exit 7", check=True)
            res = c.ctl("logs", "-f", "sad", timeout=WAIT)
            self.assertEqual(res.returncode, 3, res.stderr)
            self.assertEqual(res.stdout, "trying\n")
            self.assertIn("--- sad FAILED ---", res.stderr)

    def test_kill9_of_the_agent_goes_on_with_the_next_attempt_on_another(self):
        with harness.Cluster(scheduler_flags=SHORT_LEASES) as c:
            c.start_scheduler()
            c.start_agent("a1", slots=1)
            script = ('for i in 1 2 3 4 5 6; do echo "attempt $TASKGRID_ATTEMPT line $i"; '
                      'sleep 0.5; done')
            c.ctl("submit", "--id=mover", "--max_attempts=3", "--", "/bin/sh", "-c", script,
                  check=True)
            c.wait_state("mover", "RUNNING", timeout=WAIT)
            f = Follower(c, "mover")
            try:
                _, first = f.next_line()
                self.assertEqual(first, "attempt 1 line 1\n")
                c.start_agent("a2", slots=1)
                harness.wait_until(lambda: c.agents_info().get("a2"), timeout=WAIT,
                                   what="a2 to connect")
                c.agents["a1"].kill9()
                # Bounded: the attempt is lost within the heartbeat timeout and
                # the grace, then runs for 3 s on a2.
                rc, rest = f.wait(timeout=60)
            finally:
                f.close()
            err = f.err.decode()
            self.assertEqual(rc, 0, err)
            self.assertIn("--- attempt 1 on agent a1 ended: LOST ---", err)
            self.assertIn("--- attempt 2 on agent a2 ---", err)
            self.assertEqual([line for line in rest if line.startswith("attempt 2")],
                             [f"attempt 2 line {i}\n" for i in range(1, 7)])
            task = c.task("mover")
            self.assertEqual(state(task), "SUCCEEDED")
            self.assertEqual(task["attempts"][-1]["agent_id"], "a2")


    def test_kill9_of_the_scheduler_follows_again_and_prints_each_line_once(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1")
            script = 'for i in $(seq 1 12); do echo "tick $i"; sleep 0.4; done'
            c.ctl("submit", "--id=through", "--", "/bin/sh", "-c", script, check=True)
            c.wait_state("through", "RUNNING", timeout=WAIT)
            f = Follower(c, "through")
            try:
                seen = [f.next_line()[1], f.next_line()[1]]
                c.scheduler.kill9()
                c.start_scheduler()
                rc, rest = f.wait(timeout=60)
            finally:
                f.close()
            err = f.err.decode()
            self.assertEqual(rc, 0, err)
            self.assertIn("the scheduler went away", err)
            self.assertIn("following again", err)
            # What the agent sends again after the reconnect is printed once.
            self.assertEqual(seen + rest, [f"tick {i}\n" for i in range(1, 13)], err)
            task = c.task("through")
            self.assertEqual(state(task), "SUCCEEDED")
            self.assertEqual(len(task["attempts"]), 1, "the attempt went on through the restart")


if __name__ == "__main__":
    unittest.main(verbosity=2)
