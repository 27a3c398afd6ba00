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
import threading
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
                          f"(schema {schema}, schema version ") + r"\d+\)")
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
                # One result stored. On a loaded machine the sleeps can end
                # before the kill, and a queued task be dispatched as the
                # leader dies: its Assign, durable but never delivered, is
                # an attempt the agent comes back without (LOST, never
                # started), and the next one runs it.
                outcomes = [a["result"]["outcome"] for a in task["attempts"]]
                self.assertEqual(outcomes.count("OUTCOME_SUCCEEDED"), 1, task)
                for a in task["attempts"]:
                    if a["result"]["outcome"] != "OUTCOME_SUCCEEDED":
                        self.assertEqual(a["result"]["outcome"], "OUTCOME_LOST", task)
                        self.assertNotIn("start_time", a, task)
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
        self._start_standby(second)
        self.assertRegex(second.scheduler.log(),
                         r"is led by \S+ at \S+:%d \(lease epoch 1, " % first.port)
        self.assertNotIn("serving on port", second.scheduler.log())
        return first, second

    def _start_standby(self, second):
        """Starts `second`'s scheduler as a standby and reads its port once it answers."""
        second.start_scheduler(wait=False)
        # Said once the standby listens (after it said who leads), and
        # after its port file is written.
        wait_until(lambda: "standby: answering on port" in second.scheduler.log(), timeout=30,
                   what="the second scheduler to wait as a standby")
        with open(os.path.join(second.dir, "port")) as f:
            second.port = int(f.read().strip())

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
                         r"lease epoch 1 was superseded by epoch 2|cannot renew the lease|"
                         r"the lease was not renewed in time")
        self.assertNotEqual(second.ctl("get", "by-the-old-leader").returncode, 0,
                            "the old leader committed after the takeover")
        second.wait_state("by-the-new-leader", "SUCCEEDED", timeout=60)
        self.assertTrue(second.scheduler.alive())

    def test_a_leader_whose_database_path_freezes_stops_serving_before_a_standby_leads(self):
        # The leader reaches the server through a relay that then takes every
        # byte and answers none (a hung pooler or proxy): its renewal blocks
        # with no error. It must stop serving by its own clock before its
        # lease may expire, so that agents and clients go to the standby.
        host_port, db = self.base.split("@", 1)[1].split("/", 1)
        user = self.base.split("://", 1)[1].split("@", 1)[0]
        schema, direct = schema_url(self.base, "frozen")
        with TcpProxy(int(host_port.rsplit(":", 1)[1])) as proxy:
            relayed = f"postgres://{user}@{proxy.addr}/{db}?options=-csearch_path%3D{schema}"
            first = Cluster(scheduler_flags=[f"--store={relayed}"])
            second = Cluster(scheduler_flags=[f"--store={direct}"])
            self.addCleanup(second.close)
            self.addCleanup(first.close)
            first.start_scheduler()
            for i in range(5):
                first.ctl("submit", f"--id=acked-{i}", "--builtin=noop", check=True)
            self._start_standby(second)
            both = f"127.0.0.1:{first.port},127.0.0.1:{second.port}"
            first.start_agent("follower", slots=2, scheduler_addr=both)
            wait_until(lambda: "connected to 127.0.0.1:%d" % first.port in
                       first.agents["follower"].log(), what="the agent on the leader")

            proxy.blackhole()
            since = time.monotonic()
            wait_until(lambda: not first.scheduler.alive(), timeout=40,
                       what="the frozen leader to stop")
            stopped = time.monotonic() - since
            self.assertEqual(first.scheduler.proc.returncode, 1, first.scheduler.log())
            self.assertIn("the lease was not renewed in time", first.scheduler.log())
            wait_until(lambda: "serving on port" in second.scheduler.log(), timeout=30,
                       what="the standby to take over")
            # It stopped serving before the standby led: the log times say.
            stop_line = next(line for line in first.scheduler.log().splitlines()
                             if "the lease was not renewed in time" in line)
            lead_line = next(line for line in second.scheduler.log().splitlines()
                             if "(lease epoch 2)" in line)
            self.assertLess(stop_line[:23], lead_line[:23], (stop_line, lead_line))
            # The agent went to the new leader by itself and runs its work.
            wait_until(lambda: "connected to 127.0.0.1:%d" % second.port in
                       first.agents["follower"].log(), timeout=30,
                       what="the agent to follow the new leader")
            second.ctl("submit", "--id=after", "--builtin=noop", check=True)
            for task_id in ["after"] + [f"acked-{i}" for i in range(5)]:
                second.wait_state(task_id, "SUCCEEDED", timeout=60)
            print(f"\n[postgres] a frozen database path: the leader stopped {stopped:.1f} s "
                  f"after the freeze, before the standby led", flush=True)

    def test_a_standby_answers_with_the_leaders_address(self):
        first, second = self._leader_and_standby("answer")
        # The standby listens from the start, on the port it keeps.
        self.assertIn("standby: answering on port %d" % second.port, second.scheduler.log())
        # Given only the standby, taskgridctl is sent on to the leader.
        task = second.ctl_json("get", "acked-0")
        self.assertEqual(task["spec"]["id"], "acked-0")
        # An agent given only the standby is sent on too, and runs the work.
        second.start_agent("a1", slots=4)
        first.wait_state("acked-0", "SUCCEEDED", timeout=60)
        wait_until(lambda: "the leader is at 127.0.0.1:%d" % first.port in
                   second.agents["a1"].log(), timeout=30, what="the agent to hear of the leader")
        self.assertIn("connected to 127.0.0.1:%d" % first.port, second.agents["a1"].log())

    def test_a_standby_behind_tls_and_tokens_names_the_leader_only_to_callers_it_admits(self):
        from tls_test import make_certs, server_tls, write_secret
        d = make_certs(type(self))
        tokens = write_secret(os.path.join(d, "tokens"),
                              "rita reader reader-token-rita-0123456789\n")
        rita = write_secret(os.path.join(d, "rita.token"), "reader-token-rita-0123456789\n")
        _, url = schema_url(self.base, "tls")
        flags = [f"--store={url}", f"--tokens_file={tokens}"] + server_tls(d, ca=False)
        first = Cluster(scheduler_flags=flags)
        second = Cluster(scheduler_flags=flags)
        self.addCleanup(second.close)
        self.addCleanup(first.close)
        first.start_scheduler()
        second.start_scheduler()  # a standby

        def ctl(*args):
            return subprocess.run(
                [binary("TASKGRID_CTL"), f"--addr={second.addr}", "--timeout=10s",
                 f"--tls_ca={d}/ca.pem"] + list(args),
                capture_output=True, text=True, timeout=60)
        # With a token: sent on to the leader over TLS, and answered.
        res = ctl(f"--token_file={rita}", "list")
        self.assertEqual(res.returncode, 0, res.stderr)
        # Without one: refused by the standby, which names no leader.
        res = ctl("list")
        self.assertEqual(res.returncode, 1)
        self.assertIn("UNAUTHENTICATED", res.stderr)
        self.assertNotIn(str(first.port), res.stderr)

    def _failover_under_load(self, tag, freeze):
        """A leader and a standby, two agents and taskgridctl given both
        addresses, long tasks running and a submit load going on while the
        leader is killed (or frozen): every acknowledged task succeeds once,
        and the long tasks are re-adopted, not run again."""
        _, url = schema_url(self.base, tag)
        first = Cluster(scheduler_flags=[f"--store={url}"])
        second = Cluster(scheduler_flags=[f"--store={url}"])
        self.addCleanup(second.close)
        self.addCleanup(first.close)
        try:
            first.start_scheduler()
            second.start_scheduler()  # a standby: its port answers at once
            both = f"{first.addr},{second.addr}"
            for a in ("a1", "a2"):
                first.start_agent(a, slots=4, scheduler_addr=both)
            for i in range(4):
                first.ctl("submit", f"--id=long-{i}", "--builtin=sleep", "--", "15", check=True)
            for i in range(4):
                first.wait_state(f"long-{i}", "RUNNING")
            # A wait that outlasts the loss: with the leader frozen, its
            # connection stays open; the wait must notice and go on.
            waiter = subprocess.Popen(
                [binary("TASKGRID_CTL"), f"--addr={both}", "--timeout=40s", "wait", "long-0"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.addCleanup(lambda: waiter.poll() is None and waiter.kill())
            acked, failed = [], []
            stop = threading.Event()

            def load():
                i = 0
                while not stop.is_set():
                    res = subprocess.run(
                        [binary("TASKGRID_CTL"), f"--addr={both}", "--timeout=20s", "submit",
                         f"--id=load-{i}", "--", "/bin/echo", f"load {i}"],
                        capture_output=True, text=True, timeout=60)
                    if res.returncode == 0:
                        acked.append(f"load-{i}")
                    else:
                        failed.append((f"load-{i}", res.stderr.strip()))
                    i += 1
            loader = threading.Thread(target=load)
            loader.start()
            try:
                wait_until(lambda: len(acked) >= 10, timeout=60, what="submits before the loss")
                before = len(acked)
                since = time.monotonic()
                if freeze:
                    first.scheduler.signal(signal.SIGSTOP)
                else:
                    first.scheduler.kill9()
                wait_until(lambda: "serving on port" in second.scheduler.log(), timeout=30,
                           what="the standby to take over")
                took = time.monotonic() - since
                print(f"took over in {took:.2f}s", file=sys.stderr)
                self.assertLess(took, 10.0)
                # The load goes on through the new leader.
                wait_until(lambda: len(acked) >= before + 10, timeout=60,
                           what="submits after the takeover")
                # The wait ends with the task, while the old leader is
                # still frozen.
                out, err = waiter.communicate(timeout=60)
                self.assertEqual(waiter.returncode, 0, err)
                self.assertEqual(out.strip(), "long-0 SUCCEEDED", err)
            finally:
                stop.set()
                loader.join(timeout=120)
                if freeze:
                    first.scheduler.signal(signal.SIGCONT)
            # taskgridctl rides out the failover: only a submit the old
            # leader had in hand when it went (its answer lost) may fail.
            print(f"{len(acked)} submits acknowledged, {len(failed)} failed", file=sys.stderr)
            self.assertLessEqual(len(failed), 1, failed)
            if freeze:
                # Woken, the old leader finds its lease gone and exits.
                wait_until(lambda: not first.scheduler.alive(), timeout=30,
                           what="the frozen leader to exit once continued")
                self.assertEqual(first.scheduler.proc.returncode, 1)
            for i in range(4):
                task = second.wait_state(f"long-{i}", "SUCCEEDED", timeout=60)
                # Re-adopted through the reconnect grace: still attempt 1.
                self.assertEqual(len(task["attempts"]), 1, task)
            for task_id in acked:
                second.wait_state(task_id, "SUCCEEDED", timeout=60)
            # Every task in the table (acknowledged or not) succeeded, and
            # its result was committed once: one SUCCEEDED event each.
            tasks = second.tasks()
            ids = sorted(t["spec"]["id"] for t in tasks)
            self.assertTrue(set(acked) <= set(ids))
            for t in tasks:
                self.assertEqual(t["state"], "TASK_STATE_SUCCEEDED", t)
            res = second.ctl("watch", "--after=0", "--state=succeeded", f"--count={len(ids)}",
                             "--json", timeout=30, check=True)
            events = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
            self.assertEqual(sorted(e["task_id"] for e in events), ids)
            # The agents followed by themselves.
            for a in ("a1", "a2"):
                self.assertIn(f"connected to {second.addr}", first.agents[a].log())
            return acked
        except BaseException:
            first.dump_logs()
            second.dump_logs()
            raise

    def test_failover_under_load_after_kill9_loses_nothing_and_commits_once(self):
        self._failover_under_load("loadkill", freeze=False)

    def test_failover_under_load_after_sigstop_loses_nothing_and_commits_once(self):
        self._failover_under_load("loadstop", freeze=True)

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
