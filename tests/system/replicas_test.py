"""System tests of one task on N workers (TaskSpec.replicas) with the real
binaries: replicas on distinct agents, an agent killed -9 mid-run whose
replica is placed again on another agent, a quorum that ends the task and
cancels the replica still running, cancel of the task, a restart of the
scheduler, and taskgridctl's flags.

Run through ctest (system.replicas), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0
# An agent silent for 2 s is lost (grace 2 s): its tasks move in seconds.
SHORT_LEASES = ["--heartbeat_timeout=2s", "--reconnect_grace=2s", "--heartbeat_interval=400ms"]


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


def replicas(task):
    return {r["task_id"]: r for r in task.get("replicas", [])}


class ReplicasTest(unittest.TestCase):
    def test_a_replica_lost_with_its_agent_runs_again_on_another(self):
        with harness.Cluster(scheduler_flags=SHORT_LEASES) as c:
            c.start_scheduler()
            for a in ("a1", "a2"):
                c.start_agent(a, slots=4)
            c.ctl("submit", "--id=v", "--replicas=2", "--success=all", "--max_attempts=3", "--",
                  "sh", "-c", "sleep 3; echo ok", check=True)
            task = c.task("v")
            self.assertEqual(state(task), "BLOCKED")
            self.assertEqual(sorted(replicas(task)), ["v:r1", "v:r2"])

            def both_running():
                reps = replicas(c.task("v"))
                return (all(state(r) == "RUNNING" for r in reps.values()) and reps)
            reps = harness.wait_until(both_running, timeout=WAIT, what="both replicas to run")
            holders = {r["agent_id"] for r in reps.values()}
            self.assertEqual(holders, {"a1", "a2"}, "one replica per agent")
            victim = reps["v:r1"]["agent_id"]
            c.agents[victim].kill9()
            c.start_agent("a3", slots=4)
            # v:r1 comes back PENDING when its agent is lost, and runs on a3:
            # not on the agent that holds v:r2.
            done = c.wait_state("v", "SUCCEEDED", timeout=WAIT)
            reps = replicas(done)
            self.assertEqual(reps["v:r1"]["agent_id"], "a3")
            self.assertEqual(reps["v:r1"]["attempt"], 2)
            self.assertNotEqual(reps["v:r2"]["agent_id"], "a3")
            first = c.task("v:r1")
            self.assertEqual(first["attempts"][0]["agent_id"], victim)
            self.assertEqual(first["attempts"][0]["result"]["outcome"], "OUTCOME_LOST")
            self.assertEqual(first["spec"]["replica_of"], "v")
            self.assertIn("2 of 2 replicas succeeded", done["reason"])
            # `get` shows each replica.
            out = c.ctl("get", "v", check=True).stdout
            self.assertRegex(out, r"(?m)^Replicas:\s+2, success: all$")
            self.assertRegex(out, r"(?m)^\s+v:r1\s+SUCCEEDED\s+2\s+a3\b")

    def test_a_quorum_ends_the_task_and_cancels_the_replica_still_running(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            for a in ("a1", "a2", "a3"):
                c.start_agent(a, slots=2)
            # Two replicas finish at once; the third runs until cancelled.
            c.ctl("submit", "--id=q", "--replicas=3", "--success=quorum:2", "--",
                  "sh", "-c", 'case "$TASKGRID_TASK_ID" in *:r3) exec sleep 60;; esac; echo ok',
                  check=True)
            done = c.wait_state("q", "SUCCEEDED", timeout=WAIT)
            self.assertIn("2 of 3 replicas succeeded (success: quorum 2)", done["reason"])
            r3 = c.wait_state("q:r3", "CANCELLED", timeout=WAIT)
            self.assertEqual(r3["reason"].startswith("not needed") or "cancel" in r3["reason"],
                             True, r3["reason"])
            agents = {r["agent_id"] for r in replicas(c.task("q")).values()}
            self.assertEqual(len(agents), 3, "three replicas, three agents")

    def test_cancel_stops_every_replica_and_a_restart_keeps_them(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            for a in ("a1", "a2"):
                c.start_agent(a, slots=2)
            c.ctl("submit", "--id=k", "--replica_agents=a2,a1", "--", "sleep", "60", check=True)
            c.wait_state("k:r1", "RUNNING", timeout=WAIT)
            c.wait_state("k:r2", "RUNNING", timeout=WAIT)
            self.assertEqual(c.task("k:r1")["agent_id"], "a2")
            self.assertEqual(c.task("k:r2")["agent_id"], "a1")
            c.scheduler.kill9()
            c.start_scheduler()
            task = c.task("k")
            self.assertEqual(state(task), "BLOCKED")
            self.assertEqual(sorted(replicas(task)), ["k:r1", "k:r2"])
            c.ctl("cancel", "k", check=True)
            self.assertEqual(state(c.task("k")), "CANCELLED")
            c.wait_state("k:r1", "CANCELLED", timeout=WAIT)
            c.wait_state("k:r2", "CANCELLED", timeout=WAIT)
            res = c.ctl("pause", "k")
            self.assertEqual(res.returncode, 1)

    def test_the_cli_refuses_bad_replica_flags_and_the_scheduler_bad_specs(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            for flags, word in ((["--replicas=-1"], "--replicas"),
                                (["--replicas=2", "--success=most"], "--success"),
                                (["--replicas=2", "--success=quorum:x"], "--success"),
                                (["--success=any"], "--success"),
                                (["--gang"], "--gang needs --replicas"),
                                (["--replicas=2", "--gang_wait=1m"], "--gang_wait needs --gang")):
                res = c.ctl("submit", "--id=bad", *flags, "--", "/bin/true")
                self.assertEqual(res.returncode, 2, (flags, res.stderr))
                self.assertIn(word, res.stderr)
            res = c.ctl("submit", "--id=bad", "--replicas=2", "--success=quorum:3", "--", "/bin/true")
            self.assertEqual(res.returncode, 1)
            self.assertIn("replicas.quorum is 3; with 2 replicas it must be in [1, 2]", res.stderr)
            res = c.ctl("submit", "--id=bad", "--replicas=2", "--gang", "--gang_wait=25h", "--",
                        "/bin/true")
            self.assertEqual(res.returncode, 1)
            self.assertIn("replicas.gang_wait is 25h; the limit is 24h", res.stderr)
            res = c.ctl("submit", "--id=bad", "--replicas=101", "--", "/bin/true")
            self.assertEqual(res.returncode, 1)
            self.assertIn("INVALID_ARGUMENT", res.stderr)
            self.assertEqual(c.tasks(), [], "nothing stored")


if __name__ == "__main__":
    unittest.main()
