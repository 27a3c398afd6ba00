"""The scheduler on PostgreSQL (--store=postgres://...), with the real
binaries: what it prints at start-up, kill -9 in the middle of a run and a
restart (nothing acknowledged lost, each result committed once), a
standby scheduler on the same schema taking over from a leader killed or
stopped (and the stopped one, continued, refused and exiting), and the
one-line refusals of a bad store.

The server is the tests' own (tests/testing/postgres.sh, started by ctest's
fixture "postgres"); each test works in a schema of its own, which the
scheduler makes. Without a server the tests skip, unless
TASKGRID_REQUIRE_POSTGRES=1.
"""
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, TcpProxy, binary, wait_until  # noqa: E402


def server_url():
    path = os.environ.get("TASKGRID_TEST_POSTGRES", "")
    if path and os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    return ""


def schema_url(base, tag):
    schema = f"sys_{tag}_{os.getpid()}_{int(time.time() * 1000) % 100000000}"
    return schema, f"{base}?options=-csearch_path%3D{schema}"


class PostgresTest(unittest.TestCase):

    def setUp(self):
        self.base = server_url()
        if not self.base:
            if os.environ.get("TASKGRID_REQUIRE_POSTGRES") == "1":
                self.fail("no PostgreSQL server (TASKGRID_TEST_POSTGRES) and "
                          "TASKGRID_REQUIRE_POSTGRES=1")
            self.skipTest("no PostgreSQL server: TASKGRID_TEST_POSTGRES names no URL")

    def test_kill9_mid_run_loses_nothing_and_commits_each_result_once(self):
        schema, url = schema_url(self.base, "kill")
        with Cluster(scheduler_flags=[f"--store={url}"]) as c:
            c.start_scheduler()
            port = self.base.rsplit(":", 1)[1].split("/")[0]
            self.assertRegex(
                c.scheduler.log(),
                re.escape(f"task table postgres://127.0.0.1:{port}/taskgrid "
                          f"(schema {schema}, schema version 2)"))
            c.start_agent("a1", slots=4)
            for i in range(4):
                c.ctl("submit", f"--id=run-{i}", "--builtin=sleep", "--", "3", check=True)
            for i in range(4):
                c.wait_state(f"run-{i}", "RUNNING")
            # Waiting behind them (every slot is taken), acknowledged.
            for i in range(30):
                c.ctl("submit", f"--id=queued-{i}", "--", "/bin/echo", f"queued {i}", check=True)
            c.scheduler.kill9()
            c.start_scheduler()
            for i in range(4):
                task = c.wait_state(f"run-{i}", "SUCCEEDED", timeout=60)
                # Reclaimed by the reconnecting agent: still its first
                # attempt, and one result stored for it.
                self.assertEqual(task["attempt"], 1, task)
                self.assertEqual(len(task["attempts"]), 1, task)
            for i in range(30):
                task = c.wait_state(f"queued-{i}", "SUCCEEDED", timeout=60)
                self.assertEqual(len(task["attempts"]), 1, task)
                self.assertEqual(base64.b64decode(task["result"]["stdout_tail"]),
                                 f"queued {i}\n".encode())
            # The history agrees: each task succeeded exactly once.
            res = c.ctl("watch", "--after=0", "--state=succeeded", "--count=34", "--json",
                        timeout=30, check=True)
            events = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
            self.assertEqual(sorted(e["task_id"] for e in events),
                             sorted([f"run-{i}" for i in range(4)] +
                                    [f"queued-{i}" for i in range(30)]))

    def test_losing_the_database_stops_the_scheduler_and_a_restart_recovers(self):
        # The scheduler reaches the server through a relay the test can cut:
        # the database going away, as the scheduler sees it.
        host_port, db = self.base.split("@", 1)[1].split("/", 1)
        user = self.base.split("://", 1)[1].split("@", 1)[0]
        with TcpProxy(int(host_port.rsplit(":", 1)[1])) as proxy:
            schema, _ = schema_url(self.base, "lost")
            url = f"postgres://{user}@{proxy.addr}/{db}?options=-csearch_path%3D{schema}"
            with Cluster(scheduler_flags=[f"--store={url}"]) as c:
                c.start_scheduler()
                for i in range(5):
                    c.ctl("submit", f"--id=before-{i}", "--builtin=noop", check=True)
                self.assertGreater(proxy.cut(), 0)
                # The next commit fails: the submit is refused, not
                # acknowledged, and the scheduler stops (memory would be
                # ahead of the table), saying why.
                res = c.ctl("submit", "--id=during", "--builtin=noop", "--timeout=10s")
                self.assertNotEqual(res.returncode, 0, res.stdout)
                wait_until(lambda: not c.scheduler.alive(), timeout=30,
                           what="the scheduler to stop after losing its database")
                self.assertEqual(c.scheduler.proc.returncode, 1)
                self.assertIn("the connection to PostgreSQL was lost", c.scheduler.log())
                # The database is back (the relay accepts again): a restart
                # has every acknowledged task, and runs them.
                c.start_scheduler()
                c.start_agent("a1", slots=4)
                for i in range(5):
                    c.wait_state(f"before-{i}", "SUCCEEDED", timeout=60)
                res = c.ctl("get", "during")
                self.assertNotEqual(res.returncode, 0, "a refused submit was stored")

    def test_a_second_scheduler_with_standby_false_refuses_to_start(self):
        _, url = schema_url(self.base, "twice")
        with Cluster(scheduler_flags=[f"--store={url}"]) as c:
            c.start_scheduler()
            res = subprocess.run(
                [binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0", f"--store={url}",
                 "--standby=false"],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertRegex(res.stderr, r"is led by \S+ at \S+ \(lease epoch 1\); "
                             r"--standby=false: not waiting")
            self.assertTrue(c.scheduler.alive())
            c.ctl("submit", "--id=still-here", "--builtin=noop", check=True)

    def _leader_and_standby(self, tag):
        """A leader with 20 acknowledged tasks and a standby waiting."""
        _, url = schema_url(self.base, tag)
        first = Cluster(scheduler_flags=[f"--store={url}"])
        second = Cluster(scheduler_flags=[f"--store={url}"])
        self.addCleanup(second.close)
        self.addCleanup(first.close)
        first.start_scheduler()
        for i in range(20):
            first.ctl("submit", f"--id=acked-{i}", "--", "/bin/echo", f"acked {i}", check=True)
        second.start_scheduler(wait=False)
        wait_until(lambda: "standby: " in second.scheduler.log(), timeout=30,
                   what="the second scheduler to wait as a standby")
        self.assertRegex(second.scheduler.log(),
                         r"is led by \S+ at \S+:%d \(lease epoch 1, " % first.port)
        self.assertNotIn("serving on port", second.scheduler.log())
        return first, second

    def _takes_over(self, second, since):
        # Within the bound: --lease_ttl (6 s) + a standby's poll (1 s).
        wait_until(lambda: "serving on port" in second.scheduler.log(), timeout=30,
                   what="the standby to take over")
        took = time.monotonic() - since
        with open(os.path.join(second.dir, "port")) as f:
            second.port = int(f.read().strip())
        print(f"took over in {took:.2f}s", file=sys.stderr)
        self.assertLess(took, 10.0, second.scheduler.log())
        self.assertIn("(lease epoch 2)", second.scheduler.log())
        # Every acknowledged task is there, and runs on an agent pointed at
        # the new leader.
        second.start_agent("a1", slots=4)
        for i in range(20):
            task = second.wait_state(f"acked-{i}", "SUCCEEDED", timeout=60)
            self.assertEqual(base64.b64decode(task["result"]["stdout_tail"]),
                             f"acked {i}\n".encode())
        return took

    def test_a_standby_takes_over_from_a_killed_leader_with_every_acknowledged_task(self):
        first, second = self._leader_and_standby("kill9")
        since = time.monotonic()
        first.scheduler.kill9()
        self._takes_over(second, since)

    def test_a_stopped_leader_is_replaced_and_once_continued_cannot_commit(self):
        first, second = self._leader_and_standby("stop")
        since = time.monotonic()
        first.scheduler.signal(signal.SIGSTOP)
        try:
            self._takes_over(second, since)
            second.ctl("submit", "--id=by-the-new-leader", "--builtin=noop", check=True)
        finally:
            first.scheduler.signal(signal.SIGCONT)
        # Woken, it finds its lease gone (at its next renewal or its next
        # commit, whichever comes first) and exits rather than serve.
        first.ctl("submit", "--id=by-the-old-leader", "--builtin=noop", "--timeout=5s")
        wait_until(lambda: not first.scheduler.alive(), timeout=30,
                   what="the stopped leader to exit once continued")
        self.assertEqual(first.scheduler.proc.returncode, 1, first.scheduler.log())
        self.assertRegex(first.scheduler.log(),
                         r"lease epoch 1 was superseded by epoch 2|cannot renew the lease")
        self.assertNotEqual(second.ctl("get", "by-the-old-leader").returncode, 0,
                            "the old leader committed after the takeover")
        second.wait_state("by-the-new-leader", "SUCCEEDED", timeout=60)
        self.assertTrue(second.scheduler.alive())

    def test_a_bad_store_is_refused_in_one_line_without_the_password(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        for store, code, says in [
                (f"postgres://ann:s3cret@127.0.0.1:{port}/tasks", 1,
                 f"cannot connect to PostgreSQL at postgres://127.0.0.1:{port}/tasks"),
                ("postgres://ann:s3cret@127.0.0.1:notaport/tasks", 1, "postgres://"),
                ("mysql://ann:s3cret@db/tasks", 2, "--store must be sqlite or a postgres:// URL"),
        ]:
            res = subprocess.run(
                [binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0", f"--store={store}"],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(res.returncode, code, (store, res.stderr))
            self.assertIn(says, res.stderr, store)
            self.assertNotIn("s3cret", res.stderr + res.stdout, store)
            errors = [l for l in res.stderr.splitlines() if re.search(r" [EC] ", l)]
            self.assertEqual(len(errors), 1, res.stderr)


if __name__ == "__main__":
    unittest.main()
