"""Agents of different sizes (taskgrid-agent --resources): a task goes only
where what it asks for is free, packed best fit; what each agent holds
stays exact through a kill -9 of the scheduler (the agents come back
holding what they run), a kill -9 of an agent (its task waits for room on
the other one, then runs there) and the tasks' ends; a request no agent
could hold says so. A queue's quota caps what its tasks hold at once, and
queues with weights share the agents in proportion. A gang's replicas start
together or not at all, and start again together when one of them is lost.

Run through ctest (system.resources), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, wait_until  # noqa: E402

# Runs until the test's "go" file exists (bounded: 60 s).
BLOCK = r"""
i=0; while [ ! -e "$1/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
[ -e "$1/go" ]
"""

QUEUE = "resources-test"


class ResourcesTest(unittest.TestCase):
    def test_agents_of_different_sizes(self):
        with Cluster() as c:
            flags = ["--heartbeat_interval=250ms", "--reconnect_grace=1s"]
            c.start_scheduler(extra_flags=flags)
            c.start_agent("small", slots=4, extra_flags=["--resources=cpu=1,memory=2GiB"])
            c.start_agent("big", slots=4, extra_flags=["--resources=cpu=4,memory=8GiB,gpu=1"])
            wait_until(lambda: {a: i["state"] for a, i in c.agents_info().items()} ==
                       {"small": "AGENT_STATE_ACTIVE", "big": "AGENT_STATE_ACTIVE"},
                       what="both agents to be active")
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)

            def spec(task_id, resources):
                return {"id": task_id, "queue": QUEUE, "max_attempts": 3,
                        "placement": {"resources": resources},
                        "steps": [{"exec": {"argv": ["sh", "-c", BLOCK, "block", d]}}]}

            specs = [spec(f"r{i}", {"cpu": "1"}) for i in range(6)]
            specs.append(spec("g2", {"gpu": "2"}))
            path = os.path.join(c.dir, "specs.json")
            with open(path, "w") as f:
                json.dump(specs, f)
            c.ctl("submit", "-f", path, check=True)

            # Best fit: r0 fills the small agent exactly; r1-r4 take the big
            # one's four cores; r5 waits for a core, g2 for an agent that
            # could ever hold it.
            for i in range(5):
                c.wait_state(f"r{i}", "RUNNING")
            self.assertEqual(c.task("r0")["agent_id"], "small")
            self.assertEqual({c.task(f"r{i}")["agent_id"] for i in range(1, 5)}, {"big"})
            self.assertEqual(c.task("r5")["state"], "TASK_STATE_PENDING")
            self.assertEqual(c.task("r5")["reason"], "waiting: for cpu=1 to be free on one agent")
            self.assertEqual(c.task("g2")["reason"],
                             "waiting: needs gpu=2; the largest agent has gpu=1")
            held = {"small": {"cpu": "1"}, "big": {"cpu": "4"}}
            self.assertEqual({a: i.get("resources_used", {}) for a, i in c.agents_info().items()},
                             held)
            stats = c.ctl_json("cluster")
            self.assertEqual(stats["resources_total"], {"cpu": "5", "memory": "10GiB", "gpu": "1"})
            self.assertEqual(stats["resources_used"], {"cpu": "5"})

            # kill -9 of the scheduler: the agents come back with what they
            # run, and hold exactly that again.
            c.scheduler.kill9()
            c.start_scheduler(extra_flags=flags)

            def held_again():
                info = c.agents_info()
                states = {a: i["state"] for a, i in info.items()}
                return (states == {"small": "AGENT_STATE_ACTIVE", "big": "AGENT_STATE_ACTIVE"} and
                        {a: i.get("resources_used", {}) for a, i in info.items()} == held)
            wait_until(held_again, what="both agents back, holding what they ran")
            for i in range(5):
                t = c.task(f"r{i}")
                self.assertEqual((t["state"], t["attempt"]), ("TASK_STATE_RUNNING", 1), t)
            self.assertEqual(c.task("r5")["state"], "TASK_STATE_PENDING")

            # kill -9 of the small agent: r0 moves, and waits for a core on
            # the big one (never two copies: the small one's step died
            # with it).
            c.agents["small"].kill9()
            wait_until(lambda: c.agents_info()["small"]["state"] == "AGENT_STATE_LOST",
                       what="the small agent to be lost")
            wait_until(lambda: c.task("r0")["state"] in ("TASK_STATE_PENDING",
                                                          "TASK_STATE_SCHEDULED"),
                       what="r0 to move")
            self.assertEqual(c.agents_info()["small"].get("resources_used", {}), {})

            # Everything ends: r0 and r5 get their cores on the big agent.
            with open(os.path.join(d, "go"), "w"):
                pass
            for i in range(6):
                c.wait_state(f"r{i}", "SUCCEEDED")
            self.assertEqual([a["agent_id"] for a in c.task("r0")["attempts"]], ["small", "big"])
            self.assertEqual([a["agent_id"] for a in c.task("r5")["attempts"]], ["big"])
            wait_until(lambda: not c.agents_info()["big"].get("resources_used"),
                       what="the big agent to hold nothing")
            self.assertEqual(c.task("g2")["state"], "TASK_STATE_PENDING")
            c.ctl("cancel", "g2", check=True)

    def test_queue_quota(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("wide", slots=8, extra_flags=["--resources=cpu=8"])
            wait_until(lambda: c.agents_info().get("wide", {}).get("state") == "AGENT_STATE_ACTIVE",
                       what="the agent to be active")
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            queue = "quota-test"
            out = c.ctl("queue", "limits", queue, "--quota=cpu=2", check=True).stdout
            self.assertIn("quota cpu=0/2", out)
            for i in range(3):
                c.ctl("submit", f"--id=q{i}", f"--queue={queue}", "--resources=cpu=1", "--",
                      "sh", "-c", BLOCK, "block", d, check=True)
            c.wait_state("q0", "RUNNING")
            c.wait_state("q1", "RUNNING")
            t = c.task("q2")
            self.assertEqual(t["state"], "TASK_STATE_PENDING")
            self.assertEqual(t["reason"],
                             f"waiting: queue {queue} is at its quota of cpu=2 "
                             "(2 held; this task needs 1)")
            stats = c.ctl_json("stats", f"--queue={queue}")["queues"][0]
            self.assertEqual((stats["resources_held"], stats["settings"]["quota"], stats["held"]),
                             ({"cpu": "2"}, {"cpu": "2"}, True))
            out = c.ctl("stats", f"--queue={queue}", check=True).stdout
            self.assertIn("quota cpu=2/2 (holding)", out)
            # Kept across a restart of the scheduler.
            c.scheduler.kill9()
            c.start_scheduler()
            wait_until(lambda: c.ctl_json("stats", f"--queue={queue}")["queues"][0].get(
                "resources_held") == {"cpu": "2"}, what="the queue to hold cpu=2 again")
            self.assertEqual(c.task("q2")["state"], "TASK_STATE_PENDING")
            # A larger quota lets the third start at once.
            c.ctl("queue", "limits", queue, "--quota=cpu=3", check=True)
            c.wait_state("q2", "RUNNING")
            res = c.ctl("queue", "limits", queue, "--quota=cpu=lots")
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn("cpu", res.stderr)
            with open(os.path.join(d, "go"), "w"):
                pass
            for i in range(3):
                c.wait_state(f"q{i}", "SUCCEEDED")
            wait_until(lambda: not c.ctl_json("stats", f"--queue={queue}")["queues"][0].get(
                "resources_held"), what="the queue to hold nothing")

    def test_fair_share(self):
        # Each task runs until its own "go-ID" file (or "go-all") exists.
        step = (r'i=0; while [ ! -e "$1/go-$TASKGRID_TASK_ID" ] && [ ! -e "$1/go-all" ] && '
                r'[ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done')
        with Cluster() as c:
            c.start_scheduler()
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            c.ctl("queue", "weight", "fs-a", "--weight=1", check=True)
            out = c.ctl("queue", "weight", "fs-b", "--weight=3", check=True).stdout
            self.assertIn("weight 3", out)
            res = c.ctl("queue", "weight", "fs-b", "--weight=-1")
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertIn("weight: -1 is out of range", res.stderr)
            c.start_agent("four", slots=4)
            for q, n in (("fs-a", 6), ("fs-b", 6)):
                for i in range(n):
                    c.ctl("submit", f"--id={q}-{i}", f"--queue={q}", "--", "sh", "-c", step,
                          "step", d, check=True)
                if q == "fs-a":
                    # Alone, fs-a takes all four slots.
                    for i in range(4):
                        c.wait_state(f"fs-a-{i}", "RUNNING")

            def running():
                return {t["spec"]["id"] for t in c.tasks("--state=running")}
            # Each slot fs-a gives back goes to the queue furthest below its
            # share: three to fs-b, then the fourth back to fs-a (1:3).
            for i in range(4):
                with open(os.path.join(d, f"go-fs-a-{i}"), "w"):
                    pass
                c.wait_state(f"fs-a-{i}", "SUCCEEDED")
                wait_until(lambda: len(running()) == 4, what="the freed slot to be taken")
            self.assertEqual(running(), {"fs-a-4", "fs-b-0", "fs-b-1", "fs-b-2"})
            stats = {q["queue"]: q for q in c.ctl_json("stats")["queues"]}
            self.assertEqual((stats["fs-a"]["share"], stats["fs-a"]["fair_share"]), (0.25, 0.25))
            self.assertEqual((stats["fs-b"]["share"], stats["fs-b"]["fair_share"]), (0.75, 0.75))
            out = c.ctl("stats", check=True).stdout
            self.assertRegex(out, r"(?m)^fs-b .* 75% of 75% +weight 3$")
            with open(os.path.join(d, "go-all"), "w"):
                pass
            for q in ("fs-a", "fs-b"):
                for i in range(6):
                    c.wait_state(f"{q}-{i}", "SUCCEEDED")
            # Without a weight of its own fs-b goes back to 1 beside fs-a.
            out = c.ctl("queue", "weight", "fs-b", check=True).stdout
            self.assertNotIn("weight 3", out)


    def test_gang_starts_whole_and_again_whole(self):
        with Cluster() as c:
            c.start_scheduler(extra_flags=["--heartbeat_interval=250ms", "--reconnect_grace=1s"])
            for name in ("ga", "gb", "gc"):
                c.start_agent(name, extra_flags=["--resources=gpu=1"])
            wait_until(lambda: len([a for a in c.agents_info().values()
                                    if a["state"] == "AGENT_STATE_ACTIVE"]) == 3,
                       what="three agents to be active")
            d = os.path.join(c.dir, "steps")
            os.mkdir(d)
            blocker = os.path.join(d, "blocker")
            os.mkdir(blocker)
            c.ctl("submit", "--id=busy", "--resources=gpu=1", "--", "sh", "-c", BLOCK, "block",
                  blocker, check=True)
            c.wait_state("busy", "RUNNING")
            # Each replica notes each start, then runs until "go".
            step = 'echo "$TASKGRID_ATTEMPT" >> "$1/started-$TASKGRID_TASK_ID"; ' + BLOCK
            c.ctl("submit", "--id=gang", "--replicas=3", "--gang", "--gang_wait=10m",
                  "--resources=gpu=1", "--max_attempts=3", "--", "sh", "-c", step, "gang", d,
                  check=True)
            wait_until(lambda: "room reserved on" in c.task("gang:r1").get("reason", ""),
                       what="the gang to reserve room")
            self.assertIn("waiting: gang of 3 starts together: 2 of 3 fit now",
                          c.task("gang:r1")["reason"])
            # Room reserved for the gang is not given to a later task.
            c.ctl("submit", "--id=later", "--resources=gpu=1", "--builtin=noop", check=True)
            wait_until(lambda: "reserved" in c.ctl("get", "gang:r3", check=True).stdout,
                       what="the gang's reason in get")
            self.assertEqual(c.task("later")["state"], "TASK_STATE_PENDING")
            self.assertEqual([f for f in os.listdir(d) if f.startswith("started-")], [],
                             "no replica started alone")
            # The blocker ends: all three start, one per agent.
            with open(os.path.join(blocker, "go"), "w"):
                pass
            for r in ("gang:r1", "gang:r2", "gang:r3"):
                c.wait_state(r, "RUNNING")
            agents = {c.task(r)["agent_id"] for r in ("gang:r1", "gang:r2", "gang:r3")}
            self.assertEqual(agents, {"ga", "gb", "gc"})
            self.assertEqual(c.task("later")["state"], "TASK_STATE_PENDING")
            c.ctl("cancel", "later", check=True)
            # kill -9 of one replica's agent: the other two are stopped
            # (not counted) and the gang waits whole for a third agent.
            lost = c.task("gang:r2")["agent_id"]
            c.agents[lost].kill9()
            wait_until(lambda: all(c.task(r)["state"] == "TASK_STATE_PENDING"
                                   for r in ("gang:r1", "gang:r2", "gang:r3")),
                       what="the whole gang to wait again")
            self.assertIn("only 2 connected agents could run one each",
                          c.task("gang:r1")["reason"])
            for r in ("gang:r1", "gang:r3"):
                attempts = c.task(r)["attempts"]
                self.assertEqual(len(attempts), 1, attempts)
                self.assertTrue(attempts[0].get("interrupted"), attempts)
            c.start_agent("gd", extra_flags=["--resources=gpu=1"])
            for r in ("gang:r1", "gang:r2", "gang:r3"):
                c.wait_state(r, "RUNNING")
            for r in ("gang:r1", "gang:r2", "gang:r3"):
                with open(os.path.join(d, f"started-{r}")) as f:
                    self.assertEqual(f.read().split(), ["1", "2"], r)
            with open(os.path.join(d, "go"), "w"):
                pass
            c.wait_state("gang", "SUCCEEDED")


if __name__ == "__main__":
    unittest.main()
