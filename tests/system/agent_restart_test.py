"""An agent restarted on purpose keeps its steps (taskgrid-agent
--keep_steps): SIGTERM makes it exit at once while its steps run on under
their supervisors; an agent started again with the same --id and
--work_dir takes them back, and their tasks finish as attempt 1 with all
their output. One that does not come back within the hold: the steps are
killed (with what they started in a new session) before the task starts
elsewhere, and the attempt is not counted.

Every step writes timestamps and pids of its own to files in the test's
directory, so what ran when is read from the steps themselves.

Run through ctest (system.agent_restart), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, alive, read_text as read, unix_time, wait_until, written  # noqa: E402

# Says it started, waits for the test's "go" (bounded: 60 s), writes to
# stdout, stderr and the output file, and ends.
KEPT_STEP = r"""
d="$1"; n="$2"
echo "first $n"; echo $$ > "$d/pid.$n.$TASKGRID_ATTEMPT"
i=0; while [ ! -e "$d/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo "second $n"; echo "err $n" >&2
echo "output $n" > "$TASKGRID_OUTPUT"
"""

# Attempt 1 starts a grandchild in a new session that ticks every 50 ms and
# waits for ever; a later attempt ends at once.
TICKING_STEP = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"
if [ "$a" != 1 ]; then exit 0; fi
setsid sh -c 'echo $$ > "$0/gc"; while :; do date +%s.%N >> "$0/ticks"; sleep 0.05; done' "$d" &
echo $$ > "$d/step"
sleep 600
"""



def b64(field):
    return base64.b64decode(field or "").decode()



class AgentRestartTest(unittest.TestCase):
    def setUp(self):
        self.pids = []

    def tearDown(self):
        for pid in self.pids:  # a failed test must not leave its steps behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def test_restart_keeps_running_steps_and_finishes_them_as_attempt_1(self):
        with Cluster() as c:
            # A short reconnect grace: the agent stays away longer than it.
            c.start_scheduler(extra_flags=["--heartbeat_interval=250ms", "--reconnect_grace=1s"])
            work = os.path.join(c.dir, "work")
            flags = ["--keep_steps=60s", f"--work_dir={work}"]
            c.start_agent("upgraded", slots=2, extra_flags=flags)
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            specs = [
                {"id": "kept-one", "queue": "agent-restart",
                 "steps": [{"exec": {"argv": ["sh", "-c", KEPT_STEP, "step", d, "1"]}}]},
                {"id": "kept-two", "queue": "agent-restart",
                 "steps": [{"exec": {"argv": ["sh", "-c", KEPT_STEP, "step", d, "2"]}},
                           {"exec": {"argv": ["sh", "-c", "echo next step"]}}]},
            ]
            c.ctl("submit", "-f", "-", input=json.dumps(specs), check=True)
            wait_until(lambda: all(written(f"{d}/pid.{n}.1") for n in (1, 2)),
                       what="both steps to start")
            steps = [int(written(f"{d}/pid.{n}.1")) for n in (1, 2)]
            self.pids += steps

            agent = c.agents["upgraded"]
            agent.signal(signal.SIGTERM)
            self.assertEqual(agent.proc.wait(timeout=30), 0)
            self.assertTrue(all(alive(p) for p in steps), "a step went with its agent")
            log = read(agent.log_path)
            self.assertIn("keeping the steps of 2 running task(s)", log)

            # Listed as away, restarting, holding its tasks to the hold's end
            # (60 s granted, plus the 1 s reconnect grace).
            away = c.agents_info()["upgraded"]
            self.assertEqual(away["state"], "AGENT_STATE_LOST")
            self.assertIn("restarting", away["note"])
            left = unix_time(away["grace_end_time"]) - time.time()
            self.assertTrue(30 < left <= 61.5, left)
            self.assertIn("its tasks move in", c.ctl("agents", check=True).stdout)

            # Away longer than the reconnect grace: the tasks stay put.
            time.sleep(2.5)
            for task_id in ("kept-one", "kept-two"):
                self.assertEqual(c.task(task_id)["state"], "TASK_STATE_RUNNING", task_id)
            # The steps write while no agent is there, and one of them ends.
            open(f"{d}/go", "w").close()
            wait_until(lambda: not any(alive(p) for p in steps[:1]),
                       what="the first step to end with no agent")

            c.start_agent("upgraded", slots=2, extra_flags=flags)
            for task_id, n in (("kept-one", 1), ("kept-two", 2)):
                c.wait_state(task_id, ["SUCCEEDED"], timeout=60)
                task = c.task(task_id)
                self.assertEqual(task["attempt"], 1, task_id)
                self.assertEqual(len(task["attempts"]), 1, task_id)
                result = task["result"]
                expected = f"first {n}\nsecond {n}\n" + ("next step\n" if n == 2 else "")
                self.assertEqual(b64(result.get("stdout_tail")), expected, task_id)
                self.assertEqual(b64(result.get("stderr_tail")), f"err {n}\n", task_id)
                self.assertEqual(b64(result.get("output")), f"output {n}\n", task_id)
            self.assertIn("took back 2 running task(s)",
                          read(c.agents["upgraded"].log_path))
            print("\n[agent_restart] SIGTERM with --keep_steps: the agent exited with its 2 "
                  "steps running, stayed away 2.5 s (reconnect grace 1 s), came back and "
                  "finished both as attempt 1 with their output", flush=True)

    def test_no_agent_back_in_time_kills_the_steps_before_the_task_moves(self):
        with Cluster() as c:
            c.start_scheduler(extra_flags=["--heartbeat_interval=250ms", "--reconnect_grace=1s"])
            work = os.path.join(c.dir, "work")
            c.start_agent("never-back", slots=1,
                          extra_flags=["--keep_steps=3s", f"--work_dir={work}"])
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            spec = {"id": "kept-too-long", "queue": "agent-restart", "max_attempts": 1,
                    "steps": [{"exec": {"argv": ["sh", "-c", TICKING_STEP, "step", d]}}]}
            c.ctl("submit", "-f", "-", input=json.dumps([spec]), check=True)
            wait_until(lambda: written(f"{d}/gc") and written(f"{d}/step")
                       and written(f"{d}/ticks"), what="attempt 1's processes")
            step, gc = int(written(f"{d}/step")), int(written(f"{d}/gc"))
            self.pids += [step, gc]

            agent = c.agents["never-back"]
            exit_time = time.time()
            agent.signal(signal.SIGTERM)
            self.assertEqual(agent.proc.wait(timeout=30), 0)
            self.assertTrue(alive(step) and alive(gc), "kept steps went with their agent")
            c.start_agent("heir", slots=1)
            wait_until(lambda: not alive(step) and not alive(gc), timeout=30,
                       what="the kept step and its grandchild to be killed at the hold's end")
            gone_after = time.time() - exit_time

            c.wait_state("kept-too-long", ["SUCCEEDED"], timeout=60)
            start2 = float(written(f"{d}/start.2"))
            last_tick = float(written(f"{d}/ticks").split()[-1])
            self.assertLess(last_tick, start2, "attempt 1 still ran when attempt 2 started")
            task = c.task("kept-too-long")
            self.assertEqual([(a["attempt"], a["agent_id"]) for a in task["attempts"]],
                             [(1, "never-back"), (2, "heir")])
            first = task["attempts"][0]
            self.assertTrue(first.get("interrupted"), first)
            self.assertIn("restarted keeping its steps", first["result"].get("error", ""))
            print(f"\n[agent_restart] --keep_steps=3s and no agent back: the step and its "
                  f"grandchild were killed {gone_after:.1f} s after the agent exited, the task "
                  f"started again {start2 - exit_time:.1f} s after it (last tick "
                  f"{start2 - last_tick:.1f} s before), not counted (max_attempts 1)",
                  flush=True)


if __name__ == "__main__":
    unittest.main()
