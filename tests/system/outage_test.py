"""Running work outlives the scheduler, and never runs twice at once.

With the real binaries, each case in a cluster of its own, side by side
(the outages are long; run one after the other they would take minutes):

- kill -9 of the scheduler while a 60 s task runs, down 45 s, restarted:
  the task finishes SUCCEEDED as attempt 1 with max_attempts=1;
- the same after SIGTERM, restarted from a copy of the binary (an
  upgrade);
- with --restart_grace=15s, an outage past it: the agent stops the task
  itself, and it runs again later without being charged (max_attempts=1
  and still SUCCEEDED, attempt 1 interrupted);
- an agent behind a proxy that blackholes (a partition that drops): its
  step stops before the task starts on another agent, read from the
  steps' own timestamps;
- schedules whose fire falls in a 5 s outage: the one with the default
  misfire policy (catch_up) runs that fire once after the restart, the one
  with skip counts it as skipped.

Run through ctest (system.outage), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import concurrent.futures
import json
import os
import shutil
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, TcpProxy, binary, unix_time, wait_until, written  # noqa: E402

# Each attempt writes when it started and, every 50 ms, a tick from a
# grandchild in a session of its own; attempt 1 runs for FIRST seconds,
# later attempts end at once.
STEP = r"""
d="$1"; a="$TASKGRID_ATTEMPT"; first="$2"
date +%s.%N > "$d/start.$a"
setsid sh -c 'while :; do date +%s.%N >> "$0/ticks.$1"; sleep 0.05; done' "$d" "$a" &
if [ "$a" = 1 ]; then sleep "$first"; fi
date +%s.%N > "$d/end.$a"
"""


def step_spec(task_id, d, first_seconds, **extra):
    spec = {"id": task_id, "queue": "outage", "max_attempts": 1,
            "steps": [{"exec": {"argv": ["sh", "-c", STEP, "step", d, str(first_seconds)]}}]}
    spec.update(extra)
    return spec


def read_float(path):
    """The last number a step wrote to `path`, once it has written one."""
    return float(wait_until(lambda: written(path), what=f"a line in {path}").split()[-1])


def attempts(task):
    """(attempt, agent, outcome, interrupted) of every finished attempt."""
    return [(a.get("attempt"), a.get("agent_id"),
             a.get("result", {}).get("outcome", "").replace("OUTCOME_", ""),
             a.get("interrupted", False)) for a in task.get("attempts", [])]


class OutageTest(unittest.TestCase):

    def setUp(self):
        self.clusters = []

    def tearDown(self):
        for c in self.clusters:
            c.close()

    def cluster(self, name, scheduler_flags=()):
        c = Cluster(scheduler_flags=scheduler_flags)
        self.clusters.append(c)
        c.name = name
        c.steps = os.path.join(c.dir, "steps")
        os.mkdir(c.steps)
        return c

    def submit(self, c, spec):
        c.ctl("submit", "-f", "-", input=json.dumps([spec]), check=True)

    def started(self, c, attempt, timeout=60):
        path = os.path.join(c.steps, f"start.{attempt}")
        wait_until(lambda: written(path), timeout=timeout,
                   what=f"{c.name}: attempt {attempt} to start")
        return read_float(path)

    # --- the cases, each on its own cluster ---------------------------------

    def restart_keeps_the_task(self, c, stop, down, task_seconds, program=None):
        """Stops the scheduler with `stop` ("kill" or "term") while the task
        runs, keeps it down `down` s, starts `program` (default: the same
        binary) on the same data; returns what the task went through."""
        c.start_scheduler()
        c.start_agent("keeper", slots=1)
        self.submit(c, step_spec("long-run", c.steps, task_seconds))
        start = self.started(c, 1)
        c.wait_state("long-run", ["RUNNING"])
        if stop == "kill":
            c.scheduler.kill9()
        else:
            self.assertEqual(c.scheduler.stop(), 0, f"{c.name}: SIGTERM did not stop it cleanly")
        stopped = time.time()
        time.sleep(down)  # the outage itself: what is measured is its length
        self.assertTrue(c.agents["keeper"].alive())
        self.assertFalse(os.path.exists(os.path.join(c.steps, "end.1")),
                         f"{c.name}: the task ended during the outage")
        restarted = time.time()
        c.start_scheduler(program=program)
        done = c.wait_state("long-run", ["SUCCEEDED", "FAILED"], timeout=task_seconds + 60)
        return {"task": done, "start": start, "stopped": stopped, "restarted": restarted,
                "end": read_float(os.path.join(c.steps, "end.1"))}

    def case_kill9(self):
        c = self.cluster("kill9")
        r = self.restart_keeps_the_task(c, "kill", down=45, task_seconds=60)
        return c, r

    def case_upgrade(self):
        c = self.cluster("upgrade")
        # An upgrade: the running binary is replaced by another file.
        upgraded = os.path.join(c.dir, "taskgrid-scheduler-new")
        shutil.copy2(binary("TASKGRID_SCHEDULER"), upgraded)
        r = self.restart_keeps_the_task(c, "term", down=10, task_seconds=30, program=upgraded)
        return c, r

    def case_past_the_restart_grace(self):
        c = self.cluster("past-grace", scheduler_flags=["--restart_grace=15s"])
        c.start_scheduler()
        c.start_agent("keeper", slots=1)
        self.submit(c, step_spec("outlived", c.steps, 600))
        self.started(c, 1)
        c.wait_state("outlived", ["RUNNING"])
        c.scheduler.kill9()
        killed = time.time()
        # The agent holds the task for the restart grace less a second, then
        # stops it itself: its ticks stop.
        ticks = os.path.join(c.steps, "ticks.1")
        wait_until(lambda: time.time() - read_float(ticks) > 1.0, timeout=40,
                   what="past-grace: the agent to stop attempt 1")
        stopped_after = read_float(ticks) - killed
        c.start_scheduler()
        done = c.wait_state("outlived", ["SUCCEEDED", "FAILED"], timeout=60)
        return c, {"task": done, "stopped_after": stopped_after}

    def case_blackholed_agent(self):
        c = self.cluster("blackhole")
        c.start_scheduler()
        proxy = TcpProxy(c.port)
        self.addCleanup(proxy.close)
        c.start_agent("cut-off", slots=1, scheduler_addr=proxy.addr)
        self.submit(c, step_spec("partitioned", c.steps, 600, max_attempts=2))
        self.started(c, 1)
        c.wait_state("partitioned", ["RUNNING"])
        c.start_agent("other", slots=1)
        wait_until(lambda: len(c.agents_info()) == 2, what="blackhole: the other agent")
        proxy.blackhole()
        cut = time.time()
        start2 = self.started(c, 2, timeout=60)
        done = c.wait_state("partitioned", ["SUCCEEDED", "FAILED"], timeout=60)
        last_tick1 = read_float(os.path.join(c.steps, "ticks.1"))
        return c, {"task": done, "cut": cut, "start2": start2, "last_tick1": last_tick1}

    def case_schedule_fire_in_an_outage(self):
        c = self.cluster("schedules")
        c.start_scheduler()
        c.start_agent("runner", slots=2)
        # Minutely cron schedules fire on the same wall-clock minute however
        # far apart they were created (interval schedules count from their
        # creation, and two creates under load may be seconds apart).
        # Created at least 10 s before a minute begins, so their first fire
        # is the one the outage covers.
        wait_until(lambda: time.time() % 60 < 48, timeout=20, interval=0.1,
                   what="schedules: 12 s or more before a minute begins")
        for sid, extra in (("catcher", []), ("skipper", ["--misfire=skip"])):
            c.ctl("schedule", "create", sid, "--cron=* * * * *", "--queue=cron", *extra,
                  "--builtin=noop", check=True)

        def next_fire(sid):
            return unix_time(c.ctl_json("schedule", "get", sid)["next_fire_time"])
        self.assertEqual(next_fire("catcher"), next_fire("skipper"))
        # Stop the scheduler 1.5-4 s before both schedules' first fire, and
        # keep it down 5 s: the fire falls in the outage.
        wait_until(lambda: 1.5 < next_fire("catcher") - time.time() < 4,
                   timeout=70, interval=0.1, what="schedules: the fires to come near")
        fires = {sid: next_fire(sid) for sid in ("catcher", "skipper")}
        c.scheduler.kill9()
        time.sleep(5)  # the outage itself
        c.start_scheduler()

        def fire_id(sid):
            return f"{sid}:" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(fires[sid]))
        done = c.wait_state(fire_id("catcher"), ["SUCCEEDED"], timeout=60)
        catcher = c.ctl_json("schedule", "get", "catcher")
        skipper = c.ctl_json("schedule", "get", "skipper")
        skipped_task = c.ctl("get", fire_id("skipper"))
        return c, {"fires": fires, "done": done, "catcher": catcher, "skipper": skipper,
                   "skipped_task_rc": skipped_task.returncode,
                   "cron_tasks": [t["spec"]["id"] for t in c.tasks("--queue=cron")]}

    # --- the test ------------------------------------------------------------

    def test_outages_side_by_side(self):
        cases = {"kill9": self.case_kill9, "upgrade": self.case_upgrade,
                 "past-grace": self.case_past_the_restart_grace,
                 "blackhole": self.case_blackholed_agent,
                 "schedules": self.case_schedule_fire_in_an_outage}
        results, errors = {}, {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
            futures = {pool.submit(fn): name for name, fn in cases.items()}
            for f in concurrent.futures.as_completed(futures):
                name = futures[f]
                try:
                    results[name] = f.result()
                except Exception as e:  # noqa: BLE001: reported below, with the logs
                    errors[name] = e
        for name, e in errors.items():
            for c in self.clusters:
                if c.name == name:
                    c.dump_logs()
        if errors:
            raise AssertionError("; ".join(f"{n}: {e!r}" for n, e in sorted(errors.items())))

        # kill -9, 45 s down: attempt 1 of a max_attempts=1 task, never stopped.
        for name in ("kill9", "upgrade"):
            c, r = results[name]
            with self.subTest(name):
                t = r["task"]
                self.assertEqual(t["state"].replace("TASK_STATE_", ""), "SUCCEEDED",
                                 f"{name}: {attempts(t)}")
                self.assertEqual(attempts(t), [(1, "keeper", "SUCCEEDED", False)])
                self.assertFalse(os.path.exists(os.path.join(c.steps, "start.2")))
                print(f"\n[outage] {name}: scheduler down for "
                      f"{r['restarted'] - r['stopped']:.0f} s while a task ran: it ended "
                      f"{r['end'] - r['start']:.1f} s after it started, attempt 1", flush=True)

        c, r = results["past-grace"]
        t = r["task"]
        self.assertEqual(t["state"].replace("TASK_STATE_", ""), "SUCCEEDED", attempts(t))
        self.assertEqual([(a, o, i) for a, _, o, i in attempts(t)],
                         [(1, "CANCELLED", True), (2, "SUCCEEDED", False)])
        self.assertIn("refused connections for longer than its restart grace",
                      t["attempts"][0]["result"]["error"])
        # The restart grace is 15 s: the agent stops at 14 s after it lost
        # the scheduler, give or take its timer and the step's own exit.
        self.assertGreater(r["stopped_after"], 12.0)
        self.assertLess(r["stopped_after"], 20.0)
        print(f"\n[outage] past the restart grace (15 s): the agent stopped its task "
              f"{r['stopped_after']:.1f} s after the scheduler died; re-run uncharged", flush=True)

        c, r = results["blackhole"]
        t = r["task"]
        self.assertEqual([(a, g, o) for a, g, o, _ in attempts(t)],
                         [(1, "cut-off", "LOST"), (2, "other", "SUCCEEDED")])
        self.assertLess(r["last_tick1"], r["start2"],
                        "attempt 1 still ran when attempt 2 started elsewhere")
        print(f"\n[outage] agent blackholed: its step's last tick {r['last_tick1'] - r['cut']:.1f}"
              f" s after the cut, the task started elsewhere {r['start2'] - r['cut']:.1f} s after "
              f"it", flush=True)

        c, r = results["schedules"]
        # The fire that fell in the outage ran once, after it, as its own id.
        self.assertEqual(int(r["catcher"].get("fire_count", 0)), 1, r["catcher"])
        self.assertEqual(int(r["catcher"].get("skipped_fires", 0)), 0, r["catcher"])
        self.assertEqual(r["cron_tasks"].count(r["done"]["spec"]["id"]), 1)
        # The skipping one made no task for it, and says it skipped it.
        self.assertEqual(r["skipped_task_rc"], 1, "a task was made for a skipped fire")
        self.assertEqual(int(r["skipper"].get("skipped_fires", 0)), 1, r["skipper"])
        self.assertEqual(unix_time(r["skipper"]["last_skipped_time"]), r["fires"]["skipper"])


if __name__ == "__main__":
    unittest.main()
