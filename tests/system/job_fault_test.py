"""Jobs under faults, with real processes: an agent killed with SIGKILL in
the middle of a chain it was given whole, and the scheduler killed with
SIGKILL in the middle of a job. Nothing that succeeded runs again, nothing
is lost, no task has two committed results.
"""
import base64
import json
import unittest

from harness import Cluster, wait_until


def shell(task_id, script, deps=()):
    spec = {"id": task_id, "steps": [{"exec": {"argv": ["/bin/sh", "-c", script]}}]}
    if deps:
        spec["depends_on"] = list(deps)
    return spec


def submit_job(c, job_id, tasks):
    c.ctl("job", "submit", "-", input=json.dumps({"job_id": job_id, "tasks": tasks}), check=True)


def succeeded_attempts(task):
    return [a for a in task.get("attempts", [])
            if a.get("result", {}).get("outcome") == "OUTCOME_SUCCEEDED"]


class JobFaultTest(unittest.TestCase):

    def test_agent_killed_mid_chain_moves_only_the_unfinished_rest(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("victim", slots=1)
            wait_until(lambda: "victim" in c.agents_info(), what="the agent to connect")
            # c3 sleeps on its first attempt only (TASKGRID_ATTEMPT is 1 there).
            slow = 'test "$TASKGRID_ATTEMPT" -gt 1 || sleep 60'
            tasks = [shell("c1", "true"), shell("c2", "true", ["c1"]), shell("c3", slow, ["c2"]),
                     shell("c4", "true", ["c3"]), shell("c5", "true", ["c4"])]
            submit_job(c, "kchain", tasks)
            running = c.wait_state("c3", "RUNNING")
            self.assertEqual(running["agent_id"], "victim")
            for tid in ("c4", "c5"):  # pushed with the chain, waiting on the agent
                t = c.task(tid)
                self.assertEqual(t["state"], "TASK_STATE_DISPATCHED")
                self.assertEqual(t["agent_id"], "victim")
            c.agents["victim"].kill9()
            c.start_agent("rescuer", slots=1)
            for tid in ("c3", "c4", "c5"):
                c.wait_state(tid, "SUCCEEDED", timeout=60)

            for tid in ("c1", "c2"):  # done before the kill: not run again
                t = c.task(tid)
                self.assertEqual(len(t["attempts"]), 1, t)
                self.assertEqual(t["attempts"][0]["agent_id"], "victim")
            c3 = c.task("c3")
            self.assertEqual([a["agent_id"] for a in c3["attempts"]], ["victim", "rescuer"])
            self.assertEqual(c3["attempts"][0]["result"]["outcome"], "OUTCOME_LOST")
            for tid in ("c4", "c5"):  # never started on the victim: not counted
                t = c.task(tid)
                self.assertEqual(len(t["attempts"]), 2, t)
                self.assertTrue(t["attempts"][0].get("interrupted"), t)
                self.assertNotIn("start_time", t["attempts"][0])
                self.assertEqual(t["attempts"][1]["agent_id"], "rescuer")
            for tid in ("c1", "c2", "c3", "c4", "c5"):
                self.assertEqual(len(succeeded_attempts(c.task(tid))), 1, tid)

    def test_scheduler_killed_mid_job_finishes_it_after_restart(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("w1", slots=2)
            tasks = [shell("a", "echo a"), shell("b", "sleep 2; echo b", ["a"]),
                     shell("side", "true", ["a"]),
                     shell("c", 'cat "$TASKGRID_INPUTS_DIR/b"', ["b", "side"])]
            submit_job(c, "survivor", tasks)
            c.wait_state("b", "RUNNING")
            c.scheduler.kill9()
            c.start_scheduler()
            final = c.wait_state("c", "SUCCEEDED", timeout=60)
            # b's output reached c through the restart.
            self.assertEqual(base64.b64decode(final["result"]["stdout_tail"]), b"b\n")
            for tid in ("a", "b", "side", "c"):
                t = c.task(tid)
                self.assertEqual(t["state"], "TASK_STATE_SUCCEEDED", t)
                self.assertEqual(len(succeeded_attempts(t)), 1, t)
                self.assertEqual(t["spec"].get("job_id"), "survivor")
            self.assertEqual(len(c.task("a")["attempts"]), 1)


if __name__ == "__main__":
    unittest.main()
