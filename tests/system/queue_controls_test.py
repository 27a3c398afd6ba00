"""System tests of the queue controls with the real binaries: a paused
queue kept paused across a kill -9 of the scheduler and resumed, a
concurrency limit that never lets more than N tasks of a queue run, bulk
cancel and retry by filter from taskgridctl, undraining an agent, unique
keys, and the refusals of bad input.

Run through ctest (system.queue_controls), or by hand with
TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0


def state(task):
    return task.get("state", "").replace("TASK_STATE_", "")


class QueueControlsTest(unittest.TestCase):
    def test_a_paused_queue_stays_paused_across_a_crash_and_runs_when_resumed(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=4)
            out = c.ctl("queue", "pause", "mail", check=True).stdout
            self.assertRegex(out, r"(?m)^mail\s+0\s+-\s+paused$")
            for i in range(3):
                c.ctl("submit", f"--id=m{i}", "--queue=mail", "--", "/bin/true", check=True)
            c.ctl("submit", "--id=other", "--queue=other", "--", "/bin/true", check=True)
            c.wait_state("other", "SUCCEEDED", timeout=WAIT)
            time.sleep(0.5)  # long enough for a dispatch, had the queue been open
            self.assertEqual({state(t) for t in c.tasks("--queue=mail")}, {"PENDING"})
            stats = c.ctl("stats", "--queue=mail", check=True).stdout
            self.assertRegex(stats, r"paused \(holding\)")
            c.scheduler.kill9()
            c.start_scheduler()
            stats = c.ctl_json("stats", "--queue=mail")["queues"][0]
            self.assertTrue(stats["settings"]["paused"], "the pause is stored")
            time.sleep(0.5)
            self.assertEqual({state(t) for t in c.tasks("--queue=mail")}, {"PENDING"})
            c.ctl("queue", "resume", "mail", check=True)
            for i in range(3):
                c.wait_state(f"m{i}", "SUCCEEDED", timeout=WAIT)
            self.assertNotIn("settings", c.ctl_json("stats", "--queue=mail")["queues"][0])

    def test_a_concurrency_limit_keeps_at_most_n_running(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=8)
            c.ctl("queue", "limits", "slow", "--max_concurrency=2", check=True)
            for i in range(6):
                c.ctl("submit", f"--id=s{i}", "--queue=slow", "--", "sleep", "0.5", check=True)
            spans = []
            for i in range(6):
                done = c.wait_state(f"s{i}", "SUCCEEDED", timeout=WAIT)
                a = done["attempts"][-1]
                spans.append((harness.unix_time(a["dispatch_time"]), harness.unix_time(a["finish_time"])))
            # The most attempts in flight at once, from dispatch to finish.
            edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans],
                           key=lambda e: (e[0], e[1]))
            most = now = 0
            for _, step in edges:
                now += step
                most = max(most, now)
            self.assertEqual(most, 2, f"at most 2 at once, and 2 used: {spans}")
            out = c.ctl("stats", "--queue=slow", check=True).stdout
            self.assertIn("2 at once", out)

    def test_bulk_cancel_and_retry_by_filter(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            # No agent: everything waits.
            ids = [f"b{i}" for i in range(25)]
            tasks = ",".join(
                f'{{"id": "{i}", "queue": "bulk", "steps": [{{"exec": {{"argv": ["/bin/true"]}}}}]}}'
                for i in ids)
            c.ctl("submit", "-f", "-", input=f"[{tasks}]", check=True)
            c.ctl("submit", "--id=keep", "--queue=bulk2", "--", "/bin/true", check=True)
            # In calls of 10: three calls, all of them cancelled.
            out = c.ctl("cancel", "--queue=bulk", "--limit=10", check=True).stdout
            self.assertEqual(out, "cancelled 25 tasks\n")
            self.assertEqual({state(t) for t in c.tasks("--queue=bulk")}, {"CANCELLED"})
            self.assertEqual(state(c.task("keep")), "PENDING")
            resp = c.ctl_json("retry", "--queue=bulk", "--state=CANCELLED")
            self.assertEqual(resp["ids"], ids)
            self.assertEqual({state(t) for t in c.tasks("--queue=bulk")}, {"PENDING"})
            # Refusals: nothing changes.
            res = c.ctl("cancel", "--queue=bulk", "--state=SUCCEEDED")
            self.assertEqual(res.returncode, 1)
            self.assertIn("a cancel does not apply to SUCCEEDED tasks", res.stderr)
            res = c.ctl("cancel", "--state=PENDING")
            self.assertEqual(res.returncode, 2, res.stderr)
            res = c.ctl("cancel", "b1", "--queue=bulk")
            self.assertEqual(res.returncode, 2)
            self.assertIn("a task ID or --queue/--job, not both", res.stderr)
            res = c.ctl("cancel", "--queue=bulk", "--limit=20000")
            self.assertEqual(res.returncode, 1)
            self.assertIn("limit: 20000 is out of range 1-10000", res.stderr)
            self.assertEqual({state(t) for t in c.tasks("--queue=bulk")}, {"PENDING"})

    def test_an_undrained_agent_takes_work_again(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=2)
            harness.wait_until(lambda: "a1" in c.agents_info(), timeout=WAIT, what="a1")
            self.assertEqual(c.ctl("drain", "a1", check=True).stdout, "a1 DRAINING\n")
            c.ctl("submit", "--id=u1", "--", "/bin/true", check=True)
            time.sleep(0.5)
            self.assertEqual(state(c.task("u1")), "PENDING")
            self.assertEqual(c.ctl("undrain", "a1", check=True).stdout, "a1 ACTIVE\n")
            c.wait_state("u1", "SUCCEEDED", timeout=WAIT)
            res = c.ctl("undrain", "nobody")
            self.assertEqual(res.returncode, 1)
            self.assertIn("NOT_FOUND", res.stderr)

    def test_a_unique_key_returns_the_first_task(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            first = c.ctl_json("submit", "--unique_key=invoice-7", "--unique_ttl=1h", "--",
                               "/bin/true")["tasks"][0]
            again = c.ctl_json("submit", "--id=other-id", "--unique_key=invoice-7",
                               "--unique_ttl=1h", "--", "/bin/false")["tasks"][0]
            self.assertEqual(again["spec"]["id"], first["spec"]["id"])
            self.assertEqual(c.ctl("get", "other-id").returncode, 1, "no second task")
            c.scheduler.kill9()
            c.start_scheduler()
            after = c.ctl_json("submit", "--unique_key=invoice-7", "--unique_ttl=1h", "--",
                               "/bin/true")["tasks"][0]
            self.assertEqual(after["spec"]["id"], first["spec"]["id"], "held across a crash")
            res = c.ctl("submit", "--id=refused", "--unique_key=invoice-7", "--unique_ttl=1h",
                        "--unique_refuse", "--", "/bin/true")
            self.assertEqual(res.returncode, 1, res.stderr)
            self.assertIn("ALREADY_EXISTS", res.stderr)
            self.assertIn(f'unique_key "invoice-7" is held in queue default by task '
                          f'"{first["spec"]["id"]}" (PENDING)', res.stderr)
            self.assertEqual(c.ctl("get", "refused").returncode, 1, "nothing made")
            # It succeeds (an agent runs it): the key is free, also after a
            # kill -9; with --unique_keep it would not be.
            c.start_agent("a1")
            c.wait_state(first["spec"]["id"], "SUCCEEDED")
            c.ctl_json("submit", "--id=kept", "--unique_key=kept", "--unique_ttl=1h",
                       "--unique_keep", "--", "/bin/true")
            c.wait_state("kept", "SUCCEEDED")
            c.scheduler.kill9()
            c.start_scheduler()
            fresh = c.ctl_json("submit", "--id=fresh", "--unique_key=invoice-7",
                               "--unique_ttl=1h", "--", "/bin/true")["tasks"][0]
            self.assertEqual(fresh["spec"]["id"], "fresh", "the holder succeeded: free")
            again = c.ctl_json("submit", "--id=kept-2", "--unique_key=kept", "--unique_ttl=1h",
                               "--", "/bin/true")["tasks"][0]
            self.assertEqual(again["spec"]["id"], "kept", "--unique_keep holds it for the ttl")
            for flag in ("--unique_refuse", "--unique_keep"):
                res = c.ctl("submit", flag, "--", "/bin/true")
                self.assertEqual(res.returncode, 2)
                self.assertIn(f"{flag} needs --unique_key", res.stderr)
            res = c.ctl("submit", "--unique_key=k", "--", "/bin/true")
            self.assertEqual(res.returncode, 2)
            self.assertIn("--unique_key needs --unique_ttl", res.stderr)
            res = c.ctl("submit", "--unique_key=k", "--unique_ttl=1000h", "--", "/bin/true")
            self.assertEqual(res.returncode, 1)
            self.assertIn("unique_ttl is 1000h; with unique_key it must be 1s to 720h", res.stderr)

    def test_bad_queue_controls_are_refused(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            for args, code, text in (
                    (["queue", "pause", "bad name"], 1, "queue"),
                    (["queue", "pause"], 2, "queue pause needs a QUEUE"),
                    (["queue", "limits", "q", "--max_concurrency=-1"], 1,
                     "max_concurrency: -1 is out of range"),
                    (["queue", "limits", "q", "--burst=5"], 1, "burst: needs rate_per_second"),
                    (["queue", "limits", "q", "--rate=nan"], 1, "rate_per_second"),
                    (["queue", "frobnicate", "q"], 2, "unknown command \"queue frobnicate\"")):
                with self.subTest(args):
                    res = c.ctl(*args)
                    self.assertEqual(res.returncode, code, res.stderr)
                    self.assertIn(text, res.stderr)
            self.assertFalse(c.ctl_json("stats").get("queues"), "nothing stored")


if __name__ == "__main__":
    unittest.main()
