"""Fault tolerance with the real binaries: agents killed, stopped, cut off
and drained, the scheduler killed, running tasks cancelled and paused.

Each test starts its own cluster on 127.0.0.1 (ephemeral ports), bounds
every wait, and checks what a user relies on: every task ends with exactly
one committed result, work moves off a dead agent, late results are refused,
nothing runs twice when nothing had to move, and the processes of a stopped
task are gone.

Run through ctest (system.fault), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set. Shell steps that run long write their
pid to a file; whatever is still alive at the end of a test is killed.
"""
import collections
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, TcpProxy, unix_time, wait_until  # noqa: E402

# Scheduler flags of the tests that wait for a lease to expire (the defaults
# are 5 s each). Agents stop their tasks themselves after hearing nothing for
# max(grace - 1 s, grace / 2) = 1 s here: the heartbeat (default 1 s) must come
# well within that, or a healthy but busy agent (ASan, 2 cores) stops its own
# tasks.
SHORT_LEASES = ["--heartbeat_timeout=2s", "--reconnect_grace=2s", "--heartbeat_interval=400ms"]


# --- reading tasks ----------------------------------------------------------

def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


def outcome(attempt):
    return attempt.get("result", {}).get("outcome", "").replace("OUTCOME_", "")


def by_id(tasks):
    return {t["spec"]["id"]: t for t in tasks}


def history(task):
    """(attempt, agent, outcome, interrupted) of every finished attempt."""
    return [(a.get("attempt"), a.get("agent_id"), outcome(a), a.get("interrupted", False))
            for a in task.get("attempts", [])]


def builtin_sleep(task_id, queue, seconds, **extra):
    spec = {"id": task_id, "queue": queue,
            "steps": [{"builtin": {"name": "sleep", "args": [str(seconds)]}}]}
    spec.update(extra)
    return spec


def shell(task_id, queue, script, **extra):
    spec = {"id": task_id, "queue": queue, "steps": [{"exec": {"argv": ["/bin/sh", "-c", script]}}]}
    spec.update(extra)
    return spec


# --- processes of tasks -----------------------------------------------------

def pid_state(pid):
    """'gone', 'zombie' or 'alive'."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
            return "zombie" if f.read().rsplit(")", 1)[1].split()[0] == "Z" else "alive"
    except (OSError, IndexError):
        return "gone"


def read_pid(path, timeout=30.0):
    """The pid a shell step wrote to `path` ("echo $$ > path")."""
    def written():
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text.endswith("\n") else None
    return wait_until(written, timeout=timeout, what=f"a pid in {path}")


def kill_leftovers(pid_dir):
    """Kills every process a test's shell steps left running (by pid file),
    if it is still the `sleep` the step exec'd (pids are reused)."""
    if not os.path.isdir(pid_dir):
        return
    for name in os.listdir(pid_dir):
        try:
            with open(os.path.join(pid_dir, name)) as f:
                pid = int(f.read())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"sleep" not in f.read():
                    continue
            os.killpg(pid, signal.SIGKILL)  # the step leads its own process group
        except (OSError, ValueError):
            continue


class FaultTest(unittest.TestCase):

    def setUp(self):
        # Pid files of shell steps, outside the cluster's directory (which is
        # removed first): cleanups run last-in first-out.
        self.pid_dir = tempfile.mkdtemp(prefix="taskgrid-fault-pids-")
        self.addCleanup(shutil.rmtree, self.pid_dir, True)
        self.addCleanup(kill_leftovers, self.pid_dir)

    # --- helpers -------------------------------------------------------------

    def submit(self, c, specs):
        c.ctl("submit", "-f", "-", input=json.dumps(specs), check=True)

    def wait_all(self, c, queue, states, count, timeout):
        """Waits until `count` tasks of `queue` are in `states`; returns them all."""
        states = {states} if isinstance(states, str) else set(states)
        last = []

        def done():
            nonlocal last
            last = c.tasks(f"--queue={queue}")
            return (len(last) == count and all(state(t) in states for t in last)) and last
        try:
            return wait_until(done, timeout=timeout, interval=0.25,
                              what=f"{count} tasks of {queue} to be {sorted(states)}")
        except TimeoutError as e:
            counts = collections.Counter(state(t) for t in last)
            raise TimeoutError(f"{e}; states now: {dict(counts)}") from None

    def assert_one_commit(self, task):
        """SUCCEEDED, with exactly one SUCCEEDED attempt in its history: the last."""
        tid = task["spec"]["id"]
        self.assertEqual(state(task), "SUCCEEDED", f"{tid}: {history(task)}")
        successes = [a for a in task["attempts"] if outcome(a) == "SUCCEEDED"]
        self.assertEqual(len(successes), 1, f"{tid} committed {len(successes)} results: "
                                            f"{history(task)}")
        self.assertIs(successes[0], task["attempts"][-1], f"{tid}: {history(task)}")
        self.assertEqual(successes[0]["attempt"], task["attempt"], f"{tid}: {history(task)}")
        self.assertEqual(outcome(task), "SUCCEEDED")  # Task.result

    def stale_messages(self, c):
        """ClusterStats.stale_messages, or None when `cluster` is not served."""
        res = c.ctl("--json", "cluster")
        if res.returncode != 0:
            return None
        return int(json.loads(res.stdout).get("stale_messages", 0))

    # --- 1. kill -9 an agent ---------------------------------------------------

    def test_kill9_agent_moves_its_tasks_and_commits_each_once(self):
        queue, n = "kill9", 200
        # Default heartbeat timeout and grace: the recovery time printed below
        # is the one a user sees.
        with Cluster() as c:
            c.start_scheduler()
            for agent_id in ("a1", "a2"):
                c.start_agent(agent_id, slots=25)
            self.submit(c, [builtin_sleep(f"k{i:03d}", queue, 2) for i in range(n)])

            def both_busy():
                running = c.tasks(f"--queue={queue}", "--state=running")
                per_agent = collections.Counter(t["agent_id"] for t in running)
                return len(per_agent) == 2 and min(per_agent.values()) >= 10 and per_agent
            per_agent = wait_until(both_busy, timeout=60, interval=0.1,
                                   what="both agents to run tasks")
            victim = per_agent.most_common(1)[0][0]
            survivor = "a2" if victim == "a1" else "a1"
            kill_time = time.time()
            c.agents[victim].kill9()
            # What the victim held once the messages it sent before dying are
            # read: a result already on its way commits attempt 1.
            time.sleep(0.5)
            held = {t["spec"]["id"] for t in c.tasks(f"--queue={queue}")
                    if t["agent_id"] == victim and state(t) in ("RUNNING", "DISPATCHED")}
            self.assertTrue(held, f"{victim} held nothing at the kill")

            tasks = by_id(self.wait_all(c, queue, "SUCCEEDED", n, timeout=180))
            for t in tasks.values():
                self.assert_one_commit(t)
            for tid in sorted(held):
                t = tasks[tid]
                self.assertEqual(t["attempt"], 2, f"{tid}: {history(t)}")
                first, last = t["attempts"][0], t["attempts"][-1]
                self.assertEqual((first["attempt"], first["agent_id"], outcome(first)),
                                 (1, victim, "LOST"), f"{tid}: {history(t)}")
                self.assertEqual(last["agent_id"], survivor, f"{tid}: {history(t)}")

            def since_kill(field, index):
                return max(unix_time(tasks[tid]["attempts"][index][field]) for tid in held) - \
                    kill_time
            print(f"\n[fault] kill -9 of {victim} holding {len(held)} running tasks: the last of "
                  f"them succeeded on {survivor} {since_kill('finish_time', -1):.1f} s after the "
                  f"kill (tasks of 2 s; heartbeat_timeout and reconnect_grace at their defaults; "
                  f"attempts 1 declared lost by {since_kill('finish_time', 0):.1f} s, attempts 2 "
                  f"all started by {since_kill('start_time', -1):.1f} s)", flush=True)

    # --- 2. SIGSTOP an agent past its lease -------------------------------------

    def test_stopped_agent_late_results_are_refused(self):
        queue, n = "stopped", 4
        with Cluster(scheduler_flags=SHORT_LEASES) as c:
            c.start_scheduler()
            a1 = c.start_agent("a1", slots=n)
            self.submit(c, [builtin_sleep(f"s{i}", queue, 3) for i in range(n)])
            self.wait_all(c, queue, "RUNNING", n, timeout=30)
            self.assertEqual({t["agent_id"] for t in c.tasks(f"--queue={queue}")}, {"a1"})
            c.start_agent("a2", slots=n)
            stale_before = self.stale_messages(c)

            a1.signal(signal.SIGSTOP)
            try:
                tasks = self.wait_all(c, queue, "SUCCEEDED", n, timeout=60)
            finally:
                a1.signal(signal.SIGCONT)
            for t in tasks:
                self.assertEqual(t["attempts"][-1]["agent_id"], "a2", history(t))

            # a1 wakes up with results of attempts that are no longer its own.
            def refused():
                stale = self.stale_messages(c)
                grew = stale is not None and stale_before is not None and stale > stale_before
                return (grew or "stale" in a1.log()) and (stale, "stale" in a1.log())
            stale_now, logged = wait_until(refused, timeout=30, interval=0.2,
                                           what="a1's late results to be answered stale")
            print(f"\n[fault] stale_messages {stale_before} -> {stale_now}; "
                  f"a1 logged 'stale': {logged}", flush=True)
            time.sleep(1)  # any other late message of a1 is handled by now
            for t in c.tasks(f"--queue={queue}"):
                self.assert_one_commit(t)
                self.assertEqual(t["attempts"][-1]["agent_id"], "a2", history(t))
                for a in t["attempts"]:
                    if a["agent_id"] == "a1":
                        self.assertNotEqual(outcome(a), "SUCCEEDED", history(t))
            self.assertTrue(a1.alive(), "a1 exited after SIGCONT:\n" + a1.log()[-3000:])

    # --- 3. connection cut, back within the grace ----------------------------------

    def test_reconnect_within_grace_runs_nothing_twice(self):
        queue, n = "cut", 30
        with Cluster() as c:
            c.start_scheduler()
            proxy = TcpProxy(c.port)
            self.addCleanup(proxy.close)
            c.start_agent("a1", slots=10, scheduler_addr=proxy.addr)
            c.start_agent("a2", slots=10)
            run_log = os.path.join(c.dir, "runs.log")
            script = f'echo "$TASKGRID_TASK_ID $TASKGRID_ATTEMPT" >> {run_log}; sleep 2'
            self.submit(c, [shell(f"c{i:02d}", queue, script) for i in range(n)])

            held = set()
            for cut in range(2):
                def a1_runs():
                    return {t["spec"]["id"] for t in c.tasks(f"--queue={queue}", "--state=running")
                            if t["agent_id"] == "a1"}
                held |= wait_until(a1_runs, timeout=30, interval=0.1, what="a1 to run tasks")
                accepted = proxy.accepted
                self.assertGreaterEqual(proxy.cut(), 1, "a1 had no connection to cut")
                wait_until(lambda: proxy.accepted > accepted and proxy.connections() > 0,
                           timeout=10, what="a1 to reconnect through the proxy")
                time.sleep(0.5)

            tasks = self.wait_all(c, queue, "SUCCEEDED", n, timeout=120)
            for t in tasks:
                self.assert_one_commit(t)
                self.assertEqual((t["attempt"], len(t["attempts"])), (1, 1), history(t))
            for tid in held:
                self.assertEqual(by_id(tasks)[tid]["attempts"][0]["agent_id"], "a1",
                                 history(by_id(tasks)[tid]))
            with open(run_log) as f:
                runs = [tuple(line.split()) for line in f if line.strip()]
            started = collections.Counter(tid for tid, _ in runs)
            twice = {tid: k for tid, k in started.items() if k != 1}
            self.assertFalse(twice, f"ran more than once: {twice}")
            self.assertEqual(set(started), {t["spec"]["id"] for t in tasks})
            self.assertEqual({attempt for _, attempt in runs}, {"1"})

    # --- 4. kill -9 the scheduler ----------------------------------------------------

    def test_scheduler_kill9_commits_each_task_once(self):
        queue, n = "sched-kill", 40
        with Cluster() as c:
            c.start_scheduler()
            for agent_id in ("a1", "a2"):
                c.start_agent(agent_id, slots=8)
            self.submit(c, [builtin_sleep(f"r{i:02d}", queue, 2) for i in range(n)])
            for kill in range(2):
                before = {t["spec"]["id"] for t in c.tasks(f"--queue={queue}", "--state=succeeded")}
                wait_until(lambda: len(c.tasks(f"--queue={queue}", "--state=running")) >= 8,
                           timeout=60, interval=0.1, what="tasks running on the agents")
                c.scheduler.kill9()
                time.sleep(0.5)
                c.start_scheduler()  # same data dir, same port
                self.assertTrue(before <= {t["spec"]["id"] for t in c.tasks(
                    f"--queue={queue}", "--state=succeeded")}, "a committed result was lost")
            tasks = self.wait_all(c, queue, "SUCCEEDED", n, timeout=120)
            for t in tasks:
                self.assert_one_commit(t)
            rerun = sorted(t["spec"]["id"] for t in tasks if t["attempt"] > 1)
            print(f"\n[fault] after 2 scheduler kills: {len(rerun)} of {n} tasks took more than "
                  f"one attempt {rerun[:5]}", flush=True)

    # --- 5. cancel and pause a running process --------------------------------------

    def test_cancel_and_pause_stop_the_running_process(self):
        queue = "stop-proc"
        script = (f'echo $$ > {self.pid_dir}/$TASKGRID_TASK_ID.$TASKGRID_ATTEMPT.pid; '
                  'exec sleep 600')
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=2)

            # Cancel: CANCELLED, and the process is gone (reaped by the agent).
            self.submit(c, [shell("cancel-me", queue, script)])
            c.wait_state("cancel-me", "RUNNING")
            pid = read_pid(f"{self.pid_dir}/cancel-me.1.pid")
            self.assertEqual(pid_state(pid), "alive")
            c.ctl("cancel", "cancel-me", check=True)
            task = c.wait_state("cancel-me", "CANCELLED", timeout=30)
            self.assertEqual(outcome(task["attempts"][-1]), "CANCELLED", history(task))
            wait_until(lambda: pid_state(pid) == "gone", timeout=10,
                       what=f"pid {pid} of cancel-me to be gone (state {pid_state(pid)})")
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)

            # Pause: PAUSED, process gone, the attempt interrupted; resume runs
            # attempt 2 although max_attempts is 1.
            self.submit(c, [shell("pause-me", queue, script, max_attempts=1)])
            c.wait_state("pause-me", "RUNNING")
            pid = read_pid(f"{self.pid_dir}/pause-me.1.pid")
            self.assertEqual(pid_state(pid), "alive")
            c.ctl("pause", "pause-me", check=True)
            task = c.wait_state("pause-me", "PAUSED", timeout=30)
            wait_until(lambda: pid_state(pid) == "gone", timeout=10,
                       what=f"pid {pid} of pause-me to be gone (state {pid_state(pid)})")
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)
            task = c.wait_state("pause-me", "PAUSED")  # the attempt is in the history now
            self.assertEqual(task["attempt"], 1, history(task))
            self.assertTrue(task["attempts"], "no attempt in the history of the paused task")
            last = task["attempts"][-1]
            self.assertEqual((last["attempt"], last["agent_id"]), (1, "a1"), history(task))
            self.assertTrue(last.get("interrupted"), f"not interrupted: {history(task)}")
            detail = c.ctl("get", "pause-me", check=True).stdout
            self.assertRegex(detail, r"(?m)^1\s+a1\s+(\S+ \(interrupted\)|interrupted)\s")

            c.ctl("resume", "pause-me", check=True)

            def second_attempt_runs():
                t = c.task("pause-me")
                return state(t) == "RUNNING" and t["attempt"] == 2 and t
            task = wait_until(second_attempt_runs, timeout=30, interval=0.1,
                              what="pause-me to run attempt 2")
            pid2 = read_pid(f"{self.pid_dir}/pause-me.2.pid")
            self.assertEqual(pid_state(pid2), "alive")
            c.ctl("cancel", "pause-me", check=True)
            c.wait_state("pause-me", "CANCELLED", timeout=30)
            wait_until(lambda: pid_state(pid2) == "gone", timeout=10,
                       what=f"pid {pid2} of pause-me attempt 2 to be gone")

    # --- 6. SIGTERM: drain -------------------------------------------------------------

    def test_sigterm_drains_the_agent(self):
        queue, new_queue = "drain", "drain-new"
        drain_timeout = 3.0
        long_script = ('if [ "$TASKGRID_ATTEMPT" = 1 ]; then '
                       f'echo $$ > {self.pid_dir}/$TASKGRID_TASK_ID.pid; exec sleep 600; fi')
        longs, shorts = ["long-0", "long-1"], ["short-0", "short-1", "short-2"]
        news = [f"new-{i}" for i in range(4)]
        # Default leases (5 s + 5 s): a re-queue by lease expiry would come far
        # later than the drain's.
        with Cluster() as c:
            c.start_scheduler()
            a1 = c.start_agent("a1", slots=5, extra_flags=[f"--drain_timeout={drain_timeout:g}s"])
            self.submit(c, [shell(tid, queue, long_script) for tid in longs] +
                        [builtin_sleep(tid, queue, 2) for tid in shorts])
            self.wait_all(c, queue, "RUNNING", len(longs) + len(shorts), timeout=30)
            pids = {tid: read_pid(f"{self.pid_dir}/{tid}.pid") for tid in longs}

            sigterm_time = time.time()
            a1.signal(signal.SIGTERM)
            self.submit(c, [builtin_sleep(tid, new_queue, 1) for tid in news])

            # The short ones finish on a1.
            for tid in shorts:
                t = c.wait_state(tid, "SUCCEEDED", timeout=10)
                self.assertEqual(history(t), [(1, "a1", "SUCCEEDED", False)])
            # a1 has free slots now; still nothing new reaches it.
            time.sleep(0.5)
            for t in c.tasks(f"--queue={new_queue}"):
                self.assertEqual((state(t), t["attempt"]), ("PENDING", 0),
                                 f"{t['spec']['id']} went to {t['agent_id']}: {history(t)}")
            c.start_agent("a2", slots=5)

            # The long ones: stopped at the drain timeout, re-queued at once.
            def released():
                got = by_id(c.tasks(f"--queue={queue}"))
                return all(got[tid]["attempts"] for tid in longs) and got
            got = wait_until(released, timeout=30, interval=0.1,
                             what="a1 to release the long tasks")
            for tid in longs:
                first = got[tid]["attempts"][0]
                self.assertEqual((first["attempt"], first["agent_id"]), (1, "a1"),
                                 history(got[tid]))
                self.assertTrue(first.get("interrupted"),
                                f"{tid}: a released attempt is not interrupted: "
                                f"{history(got[tid])}")
                after = unix_time(first["finish_time"]) - sigterm_time
                self.assertGreater(after, drain_timeout - 0.5,
                                   f"{tid} released {after:.1f} s after SIGTERM: before the "
                                   f"drain timeout")
                self.assertLess(after, drain_timeout + 3,
                                f"{tid} released {after:.1f} s after SIGTERM: not at once")
                print(f"\n[fault] {tid} released {after:.1f} s after SIGTERM "
                      f"(--drain_timeout={drain_timeout:g}s)", flush=True)
                wait_until(lambda: pid_state(pids[tid]) != "alive", timeout=10,
                           what=f"the process of {tid} to be gone")

            self.assertEqual(a1.proc.wait(timeout=30), 0, a1.log()[-3000:])
            for pid in pids.values():
                self.assertNotEqual(pid_state(pid), "alive")

            for tid, t in by_id(self.wait_all(c, queue, "SUCCEEDED", len(longs) + len(shorts),
                                              timeout=30)).items():
                self.assert_one_commit(t)
                if tid in longs:
                    self.assertEqual(t["attempts"][-1]["agent_id"], "a2", history(t))
                    self.assertEqual(t["attempt"], 2, history(t))
            for t in self.wait_all(c, new_queue, "SUCCEEDED", len(news), timeout=30):
                self.assert_one_commit(t)
                self.assertNotIn("a1", [a["agent_id"] for a in t["attempts"]], history(t))

    # --- placement ------------------------------------------------------------------------

    def test_pending_reason_names_the_missing_label(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=1, labels="zone=a")
            c.ctl("submit", "--id=needs-gpu", "--labels=gpu=1", "--builtin=noop", check=True)
            c.ctl("submit", "--id=any-agent", "--builtin=noop", check=True)
            c.wait_state("any-agent", "SUCCEEDED")  # a1 is up and placing works

            def explained():
                t = c.task("needs-gpu")
                return "gpu" in t.get("reason", "") and t
            task = wait_until(explained, timeout=10, interval=0.1,
                              what="a reason naming the label gpu")
            self.assertEqual(state(task), "PENDING")
            detail = c.ctl("get", "needs-gpu", check=True).stdout
            reason = re.search(r"(?m)^Reason:\s+(.*)$", detail)
            self.assertIsNotNone(reason, detail)
            self.assertIn("gpu", reason.group(1))
            self.assertEqual(reason.group(1), task["reason"])


if __name__ == "__main__":
    unittest.main()
