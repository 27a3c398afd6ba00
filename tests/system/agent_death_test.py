"""A step never outlives its agent: kill -9 of an agent kills each of its
steps, with every process the step started (also those that moved to a
session of their own), before the scheduler gives the task to another
agent; and a step's leftovers go when the step ends.

Every step here writes timestamps of its own (`date +%s.%N`) to files in
the test's directory, so what ran when is read from the steps themselves,
not from the scheduler's view.

Run through ctest (system.agent_death), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, alive, read_text as read, wait_until, written  # noqa: E402

# The first attempt starts a grandchild in a new session that ticks every
# 50 ms, then waits for ever; a later attempt does the same, but ends after
# a second (its grandchild must go with it).
STEP = r"""
d="$1"; a="$TASKGRID_ATTEMPT"
date +%s.%N > "$d/start.$a"
setsid sh -c 'echo $$ > "$0/gc.$1"; while :; do date +%s.%N >> "$0/ticks.$1"; sleep 0.05; done' "$d" "$a" &
echo $$ > "$d/step.$a"
if [ "$a" = 1 ]; then sleep 600; else sleep 1; fi
"""




class AgentDeathTest(unittest.TestCase):
    def setUp(self):
        self.pids = []

    def tearDown(self):
        for pid in self.pids:  # a failed test must not leave its steps behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run_step_then_add_heir(self, c, first, heir, task_id, queue):
        """Starts the scheduler and agent `first`, runs STEP as `task_id` on
        it until attempt 1's step and grandchild tick, then connects agent
        `heir`. Returns the steps' directory and attempt 1's two pids."""
        c.start_scheduler()
        c.start_agent(first, slots=1)
        d = os.path.join(c.dir, "steps")
        os.mkdir(d)
        spec = {"id": task_id, "queue": queue,
                "steps": [{"exec": {"argv": ["sh", "-c", STEP, "step", d]}}]}
        c.ctl("submit", "-f", "-", input=json.dumps([spec]), check=True)
        wait_until(lambda: written(f"{d}/gc.1") and written(f"{d}/step.1")
                   and written(f"{d}/ticks.1"), what="attempt 1's processes")
        step1, gc1 = int(written(f"{d}/step.1")), int(written(f"{d}/gc.1"))
        self.pids += [step1, gc1]
        c.start_agent(heir, slots=1)
        wait_until(lambda: len(c.agents_info()) == 2, what="the heir to connect")
        return d, step1, gc1

    def test_kill9_agent_kills_its_steps_before_the_task_moves(self):
        with Cluster() as c:
            d, step1, gc1 = self.run_step_then_add_heir(c, "doomed", "heir", "survivor-of-kill",
                                                        "agent-death")
            self.assertTrue(alive(step1) and alive(gc1))
            self.assertNotEqual(os.getsid(gc1), os.getsid(step1), "the grandchild left the session")

            kill_time = time.time()
            c.agents["doomed"].kill9()
            wait_until(lambda: not alive(step1) and not alive(gc1), timeout=5,
                       what="attempt 1's step and grandchild to die with their agent")
            gone_after = time.time() - kill_time

            # The task moves after the reconnect grace and runs on the heir.
            wait_until(lambda: written(f"{d}/start.2"), timeout=60,
                       what="attempt 2 to start on the heir")
            c.wait_state("survivor-of-kill", ["SUCCEEDED"], timeout=60)
            start2 = float(written(f"{d}/start.2"))
            last_tick1 = float(written(f"{d}/ticks.1").split()[-1])
            self.assertLess(last_tick1, start2, "attempt 1 still ran when attempt 2 started")
            self.assertLess(last_tick1 - kill_time, 2.0,
                            "attempt 1's grandchild ticked on well after its agent died")
            task = c.task("survivor-of-kill")
            self.assertEqual(task["attempt"], 2)
            self.assertEqual([(a["attempt"], a["agent_id"]) for a in task["attempts"]],
                             [(1, "doomed"), (2, "heir")])

            # Attempt 2's grandchild went with its step.
            gc2 = int(wait_until(lambda: written(f"{d}/gc.2"), what="attempt 2's grandchild"))
            self.pids.append(gc2)
            wait_until(lambda: not alive(gc2), timeout=5, what="attempt 2's grandchild to go")
            print(f"\n[agent_death] kill -9 of an agent: its step and a grandchild in a new "
                  f"session gone {gone_after * 1000:.0f} ms after the kill (last tick "
                  f"{(last_tick1 - kill_time) * 1000:.0f} ms after it); the task started again "
                  f"{start2 - kill_time:.1f} s after the kill", flush=True)

    def test_a_frozen_agents_steps_die_before_the_task_moves(self):
        """SIGSTOP of an agent: it cannot stop its steps itself, and its
        lifeline stays open; the step supervisors stop them when the lease
        the agent told them passes, before the scheduler gives the task to
        another agent. Continued, the agent goes on without them."""
        with Cluster() as c:
            d, step1, gc1 = self.run_step_then_add_heir(c, "frozen", "thawed-heir",
                                                        "survivor-of-freeze", "agent-freeze")

            frozen = c.agents["frozen"]
            stop_time = time.time()
            frozen.signal(signal.SIGSTOP)
            try:
                wait_until(lambda: written(f"{d}/start.2"), timeout=90,
                           what="attempt 2 to start on the heir")
                start2 = float(written(f"{d}/start.2"))
                # Before attempt 2 began, attempt 1 and what it started were
                # gone, the agent still frozen.
                last_tick1 = float(written(f"{d}/ticks.1").split()[-1])
                self.assertLess(last_tick1, start2, "attempt 1 still ran when attempt 2 started")
                self.assertFalse(alive(step1) or alive(gc1), "attempt 1 outlived the move")
            finally:
                frozen.signal(signal.SIGCONT)
            c.wait_state("survivor-of-freeze", ["SUCCEEDED"], timeout=60)
            task = c.task("survivor-of-freeze")
            self.assertEqual([a["agent_id"] for a in task["attempts"]], ["frozen", "thawed-heir"])
            # Thawed, the agent learns its attempt is gone, and stays up.
            wait_until(lambda: c.agents_info().get("frozen", {}).get("state") == "AGENT_STATE_ACTIVE",
                       timeout=60, what="the thawed agent to be back")
            self.assertTrue(frozen.alive(), frozen.log()[-3000:])
            print(f"\n[agent_death] SIGSTOP of an agent: its step's last tick "
                  f"{last_tick1 - stop_time:.1f} s after the stop, attempt 2 started "
                  f"{start2 - stop_time:.1f} s after it", flush=True)


if __name__ == "__main__":
    unittest.main()
