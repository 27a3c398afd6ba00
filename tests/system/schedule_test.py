"""Periodic tasks with the real binaries: an interval schedule's fires are
run by an agent, survive kill -9 of the scheduler without a fire made twice,
stop while paused; bad schedules are refused with clear messages.
"""
import calendar
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, wait_until  # noqa: E402

FIRE_ID = re.compile(r"^beat:(\d{8}T\d{6}Z)$")


def fire_time(task_id):
    """Seconds since the epoch of a fire's task id ("beat:20261125T030000Z")."""
    m = FIRE_ID.match(task_id)
    if not m:
        raise AssertionError(f"{task_id!r} is not a fire's task id")
    return calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H%M%SZ"))


class ScheduleTest(unittest.TestCase):

    def fire_ids(self, c):
        return [t["spec"]["id"] for t in c.tasks("--queue=sched")]

    def schedule(self, c, sid="beat"):
        s = c.ctl_json("schedule", "get", sid)
        s["fire_count"] = int(s.get("fire_count", 0))
        return s

    def test_interval_fires_run_survive_kill9_and_stop_while_paused(self):
        with Cluster() as c:
            c.start_scheduler()
            c.start_agent("a1", slots=4)
            res = c.ctl("schedule", "create", "beat", "--every=1s", "--queue=sched",
                        "--misfire=skip", "--builtin=noop")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertRegex(res.stdout, r"^beat ACTIVE  next fire \d{4}-\d\d-\d\dT")
            # Fires become tasks, and the agent runs them.
            wait_until(lambda: len(c.tasks("--queue=sched", "--state=succeeded")) >= 3,
                       timeout=30, interval=0.2, what="three fires to succeed")

            # kill -9, down for a while (SKIP: those fires are dropped), restart.
            c.scheduler.kill9()
            killed = time.time()
            time.sleep(3)
            restarted = time.time()
            c.start_scheduler()
            before = len(self.fire_ids(c))
            wait_until(lambda: len(self.fire_ids(c)) >= before + 3, timeout=30, interval=0.2,
                       what="three fires after the restart")

            # Pause: no more fires.
            res = c.ctl("schedule", "pause", "beat")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertEqual(res.stdout, "beat PAUSED  next fire -\n")
            paused = self.fire_ids(c)
            time.sleep(2.5)
            self.assertEqual(self.fire_ids(c), paused, "a paused schedule fired")
            s = self.schedule(c)
            self.assertTrue(s["paused"])
            self.assertNotIn("next_fire_time", s)

            # No fire doubled: one task per fire time, each a whole second
            # apart, as many as the schedule counted, none while it was down.
            ids = self.fire_ids(c)
            self.assertEqual(len(ids), len(set(ids)))
            times = sorted(fire_time(i) for i in ids)
            self.assertEqual(len(times), len(set(times)))
            self.assertEqual(s["fire_count"], len(ids))
            self.assertEqual(s["last_task_id"], max(ids))
            down = [t for t in times if killed + 1 < t < restarted - 1]
            self.assertEqual(down, [], "a fire was made for a time the scheduler was down")
            self.assertGreaterEqual(max(b - a for a, b in zip(times, times[1:])), 3)

            # Every task ran (one dispatched as the scheduler died may run
            # again after its ack timeout: at least once, committed once).
            wait_until(lambda: all(t["state"] == "TASK_STATE_SUCCEEDED"
                                   for t in c.tasks("--queue=sched")),
                       timeout=60, interval=0.2, what="every fire's task to succeed")

            # Resume: fires again; the table and detail views say so.
            res = c.ctl("schedule", "resume", "beat")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertRegex(res.stdout, r"^beat ACTIVE  next fire \d{4}-")
            wait_until(lambda: len(self.fire_ids(c)) > len(ids), timeout=10, interval=0.2,
                       what="a fire after the resume")
            out = c.ctl("schedule", "list", check=True).stdout
            self.assertRegex(out, r"(?m)^ID\s+STATE\s+TRIGGER\s+NEXT FIRE\s+LAST TASK")
            self.assertRegex(out, r"(?m)^beat\s+ACTIVE\s+every 1s\s+")
            out = c.ctl("schedule", "get", "beat", check=True).stdout
            self.assertRegex(out, r"(?m)^Trigger:\s+every 1s$")
            self.assertRegex(out, r"(?m)^Misfire:\s+SKIP$")
            # What fell while it was down was dropped, and says so.
            self.assertRegex(out, r"(?m)^Skipped:\s+\d+ fire\(s\), the last at \d{4}-")
            self.assertRegex(out, r"(?m)^Last task:\s+beat:\d{8}T\d{6}Z$")

            # Delete: gone, its tasks stay.
            res = c.ctl("schedule", "delete", "beat")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertRegex(res.stdout, r"^beat deleted \(\d+ fires?; its tasks stay\)$")
            kept = self.fire_ids(c)
            time.sleep(1.5)
            self.assertEqual(self.fire_ids(c), kept)
            res = c.ctl("schedule", "get", "beat")
            self.assertEqual(res.returncode, 1)
            self.assertIn("NOT_FOUND", res.stderr)

    def test_bad_schedules_are_refused_and_nothing_is_stored(self):
        with Cluster() as c:
            c.start_scheduler()
            cases = [
                (["--cron=0 25 * * *"],
                 'INVALID_ARGUMENT: schedule.cron "0 25 * * *": hour: 25 is out of range 0-23'),
                (["--cron=0 0 * * * *"], "has 6 fields; expected 5"),
                (["--cron=garbage"], 'schedule.cron "garbage": has 1 fields'),
                (["--cron=0 0 31 2 *"], "never fires"),
                (["--cron=@daily", "--tz=Mars/Base"],
                 'schedule.time_zone "Mars/Base" is not a known IANA time zone'),
                (["--every=500ms"], "schedule.interval is 500ms: give whole seconds"),
                (["--every=0s"], "schedule.interval is 0s; the least is 1s"),
            ]
            for flags, message in cases:
                with self.subTest(flags=flags):
                    res = c.ctl("schedule", "create", "bad", *flags, "--builtin=noop")
                    self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
                    self.assertIn(message, res.stderr)
            # The template is checked as a submitted task is.
            res = c.ctl("schedule", "create", "bad", "--every=5s", "--builtin=sleep", "--",
                        "soon")
            self.assertEqual(res.returncode, 1)
            self.assertIn("schedule.task_template.steps[0].builtin.args", res.stderr)
            res = c.ctl("schedule", "create", "x" * 112, "--every=5s", "--builtin=noop")
            self.assertEqual(res.returncode, 1)
            self.assertIn("schedule.id is 112 characters long; the limit is 111", res.stderr)
            # Usage errors never reach the scheduler.
            for flags in (["--builtin=noop"], ["--every=1s", "--cron=@daily", "--builtin=noop"],
                          ["--every=1s", "--misfire=sometimes", "--builtin=noop"]):
                with self.subTest(flags=flags):
                    res = c.ctl("schedule", "create", "bad", *flags)
                    self.assertEqual(res.returncode, 2, res.stderr)
            self.assertEqual(c.ctl_json("schedule", "list").get("schedules", []), [])

            # Creating again is safe; another definition under the id is not.
            first = c.ctl("schedule", "create", "nightly", "--cron=0 3 * * *",
                          "--tz=Europe/Berlin", "--misfire=run_once", "--paused",
                          "--builtin=noop")
            self.assertEqual(first.returncode, 0, first.stderr)
            self.assertEqual(first.stdout, "nightly PAUSED  next fire -\n")
            again = c.ctl("schedule", "create", "nightly", "--cron=0 3 * * *",
                          "--tz=Europe/Berlin", "--misfire=run_once", "--paused",
                          "--builtin=noop")
            self.assertEqual(again.returncode, 0, again.stderr)
            other = c.ctl("schedule", "create", "nightly", "--cron=0 4 * * *",
                          "--tz=Europe/Berlin", "--builtin=noop")
            self.assertEqual(other.returncode, 1)
            self.assertIn('ALREADY_EXISTS: schedule "nightly" already exists', other.stderr)
            s = c.ctl_json("schedule", "get", "nightly")
            self.assertEqual(s["cron"], "0 3 * * *")
            self.assertEqual(s["time_zone"], "Europe/Berlin")
            self.assertEqual(s["misfire_policy"], "MISFIRE_POLICY_RUN_ONCE")
            res = c.ctl("schedule", "resume", "nightly")
            self.assertEqual(res.returncode, 0, res.stderr)
            # 03:00 in Berlin is 01:00Z or 02:00Z, depending on the season.
            s = c.ctl_json("schedule", "get", "nightly")
            self.assertRegex(s["next_fire_time"], r"T0[12]:00:00Z$")


if __name__ == "__main__":
    unittest.main()
