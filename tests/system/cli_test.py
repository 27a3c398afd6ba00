"""System test of taskgridctl against the real scheduler (and agent).

Each command's output and exit code is checked. Two clusters: one with no
agent (tasks stay where the CLI puts them), one with agent a1 (tasks run).
Every test uses its own queue, so the tests of a class share one cluster.

Run through ctest (system.cli), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import calendar
import collections
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0


def free_port():
    """A port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rfc3339_to_unix(text):
    """Seconds since the epoch of a proto3 JSON timestamp ("...Z", maybe fractional)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", text)
    if not m:
        raise ValueError(f"not a UTC RFC 3339 timestamp: {text!r}")
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))


def table_rows(stdout):
    """A padded table as a list of rows of cells (header first)."""
    return [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines() if line.strip()]


class CliTestCase(unittest.TestCase):
    """One cluster per class. Each test has its own queue; task ids are global
    across queues, so they must also differ between the tests of a class."""

    cluster = None

    @classmethod
    def start_cluster(cls, scheduler_flags=(), agents=()):
        cls.cluster = harness.Cluster(scheduler_flags=scheduler_flags)
        cls.addClassCleanup(cls.cluster.close)
        cls.cluster.start_scheduler()
        for agent_id in agents:
            cls.cluster.start_agent(agent_id, slots=2)

    @property
    def queue(self):
        """This test's own queue."""
        return "q-" + self._testMethodName[len("test_"):]

    def ctl(self, *args, **kw):
        return self.cluster.ctl(*args, **kw)

    def ok(self, *args, **kw):
        """Runs taskgridctl, asserts exit 0, returns stdout."""
        res = self.ctl(*args, **kw)
        self.assertEqual(res.returncode, 0, self.describe(args, res))
        return res.stdout

    def ok_json(self, *args, **kw):
        return json.loads(self.ok("--json", *args, **kw))

    def fails(self, code, *args, **kw):
        """Runs taskgridctl, asserts exit `code`, returns stderr."""
        res = self.ctl(*args, **kw)
        self.assertEqual(res.returncode, code, self.describe(args, res))
        return res.stderr

    def describe(self, args, res):
        log = self.cluster.scheduler.log()[-3000:] if self.cluster.scheduler else ""
        return (f"taskgridctl {' '.join(map(str, args))} exited {res.returncode}\n"
                f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}\nscheduler log tail:\n{log}")

    def queue_ids(self, queue=None):
        got = self.ok_json("list", f"--queue={queue or self.queue}", "--all")
        return [t["spec"]["id"] for t in got["tasks"]]

    def submit_file(self, tasks_json, *args, input=None):
        """Writes tasks_json to a file and runs `submit -f FILE`."""
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.cluster.dir)
        with os.fdopen(fd, "w") as f:
            f.write(tasks_json)
        return self.ctl("submit", "-f", path, *args, input=input), path

    def noop_spec(self, task_id, queue=None, **extra):
        spec = {"id": task_id, "queue": queue or self.queue,
                "steps": [{"builtin": {"name": "noop"}}]}
        spec.update(extra)
        return spec


class NoAgentTest(CliTestCase):
    """No agent runs: a submitted task stays PENDING until the CLI moves it."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(scheduler_flags=["--queue_max_length=q-stats_limit=7"])

    # --- submit -------------------------------------------------------------

    def test_submit_flags_land_in_spec(self):
        out = self.ok("submit", "--id=s1", f"--queue={self.queue}", "--priority=7",
                      "--max_attempts=4", "--payload=hello", "--env=A=1,B=x=y", "--cwd=/tmp",
                      "--step_timeout=90s", "--attempt_timeout=5m", "--ack_timeout=3s",
                      "--labels=zone=eu,disk=ssd", "--agents=a1,a2", "--slots=2",
                      "--", "/bin/echo", "--not-a-flag", "two words")
        rows = table_rows(out)
        self.assertEqual(rows, [["ID", "QUEUE", "STATE"], ["s1", self.queue, "PENDING"]])

        task = self.ok_json("get", "s1")
        spec = task["spec"]
        self.assertEqual(task["state"], "TASK_STATE_PENDING")
        self.assertEqual(spec["queue"], self.queue)
        self.assertEqual(spec["priority"], 7)
        self.assertEqual(spec["max_attempts"], 4)
        self.assertEqual(base64.b64decode(spec["payload"]), b"hello")
        self.assertEqual(spec["attempt_timeout"], "300s")
        self.assertEqual(spec["ack_timeout"], "3s")
        self.assertEqual(spec["placement"], {"required_labels": {"zone": "eu", "disk": "ssd"},
                                             "agent_ids": ["a1", "a2"], "slots": 2})
        self.assertEqual(len(spec["steps"]), 1)
        step = spec["steps"][0]
        self.assertEqual(step["timeout"], "90s")
        self.assertEqual(step["exec"], {"argv": ["/bin/echo", "--not-a-flag", "two words"],
                                        "env": {"A": "1", "B": "x=y"}, "cwd": "/tmp"})
        self.assertNotIn("not_before", spec)

    def test_submit_not_before(self):
        out = self.ok("submit", "--id=nb-abs", f"--queue={self.queue}",
                      "--not_before=2099-01-02T03:04:05Z", "--", "/bin/true")
        self.assertEqual(table_rows(out)[1], ["nb-abs", self.queue, "SCHEDULED"])
        task = self.ok_json("get", "nb-abs")
        self.assertEqual(task["spec"]["not_before"], "2099-01-02T03:04:05Z")
        self.assertEqual(task["state"], "TASK_STATE_SCHEDULED")

        before = time.time()
        self.ok("submit", "--id=nb-rel", f"--queue={self.queue}", "--not_before=+1h",
                "--", "/bin/true")
        when = rfc3339_to_unix(self.ok_json("get", "nb-rel")["spec"]["not_before"])
        self.assertGreaterEqual(when, int(before) + 3600 - 1)
        self.assertLessEqual(when, time.time() + 3600 + 1)

        # The detail view shows when a SCHEDULED task will run.
        detail = self.ok("get", "nb-abs")
        self.assertRegex(detail, r"(?m)^State:\s+SCHEDULED$")
        self.assertRegex(detail, r"(?m)^Next run:\s+2099-01-0[12]T\d\d:\d\d:\d\d[+-]\d\d:\d\d$")

    def test_submit_builtin(self):
        self.ok("submit", "--id=b-sleep", f"--queue={self.queue}", "--builtin=sleep", "--", "5")
        self.ok("submit", "--id=b-echo", f"--queue={self.queue}", "--builtin=echo", "a", "b")
        self.assertEqual(self.ok_json("get", "b-sleep")["spec"]["steps"],
                         [{"builtin": {"name": "sleep", "args": ["5"]}}])
        self.assertEqual(self.ok_json("get", "b-echo")["spec"]["steps"],
                         [{"builtin": {"name": "echo", "args": ["a", "b"]}}])

    def test_submit_schedule_timeout(self):
        self.ok("submit", "--id=st-1", f"--queue={self.queue}", "--schedule_timeout=90s",
                "--", "/bin/true")
        task = self.ok_json("get", "st-1")
        self.assertEqual(task["spec"]["schedule_timeout"], "90s")
        self.assertRegex(
            self.ok("get", "st-1"),
            r"(?m)^Start by:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d "
            r"\(schedule_timeout 1m30s\)$")
        # Not given: not in the spec (same spec as from JSON).
        self.ok("submit", "--id=st-2", f"--queue={self.queue}", "--", "/bin/true")
        self.assertNotIn("schedule_timeout", self.ok_json("get", "st-2")["spec"])
        self.assertNotRegex(self.ok("get", "st-2"), r"(?m)^Start by:")
        for bad in ("-1s", "soon", "inf"):
            with self.subTest(bad):
                err = self.fails(2, "submit", f"--queue={self.queue}", f"--schedule_timeout={bad}",
                                 "--", "/bin/true")
                self.assertTrue(err.startswith("error: "), err)
        self.assertEqual(self.queue_ids(), ["st-1", "st-2"])

    def test_submit_payload_file_from_stdin(self):
        self.ok("submit", "--id=pf", f"--queue={self.queue}", "--payload_file=-", "--",
                "/bin/cat", input="line 1\nline 2\n")
        spec = self.ok_json("get", "pf")["spec"]
        self.assertEqual(base64.b64decode(spec["payload"]), b"line 1\nline 2\n")

    def test_submit_json_output(self):
        resp = self.ok_json("submit", "--id=js", f"--queue={self.queue}", "--builtin=noop")
        self.assertEqual(len(resp["tasks"]), 1)
        task = resp["tasks"][0]
        self.assertEqual(task["spec"]["id"], "js")
        self.assertEqual(task["state"], "TASK_STATE_PENDING")
        # always_print_primitive_fields: zeros are there too.
        self.assertEqual(task["attempt"], 0)
        self.assertEqual(task["spec"]["priority"], 0)

    def test_submit_without_id_gets_one(self):
        resp = self.ok_json("submit", f"--queue={self.queue}", "--", "/bin/true")
        task_id = resp["tasks"][0]["spec"]["id"]
        self.assertTrue(task_id)
        self.assertEqual(self.queue_ids(), [task_id])

    def test_submit_file_shapes(self):
        q = self.queue
        # 1. A SubmitTasksRequest, lowerCamelCase names.
        request = {"tasks": [self.noop_spec("r1", maxAttempts=5), self.noop_spec("r2")]}
        res, _ = self.submit_file(json.dumps(request))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(table_rows(res.stdout),
                         [["ID", "QUEUE", "STATE"], ["r1", q, "PENDING"], ["r2", q, "PENDING"]])
        self.assertEqual(self.ok_json("get", "r1")["spec"]["max_attempts"], 5)
        # 2. An array of TaskSpec, with --file=.
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.cluster.dir)
        with os.fdopen(fd, "w") as f:
            json.dump([self.noop_spec("a1", priority=3), self.noop_spec("a2")], f)
        self.ok("submit", f"--file={path}")
        self.assertEqual(self.ok_json("get", "a1")["spec"]["priority"], 3)
        # 3. One TaskSpec, snake_case names.
        res, _ = self.submit_file(json.dumps(self.noop_spec("o1", max_attempts=2)))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(self.ok_json("get", "o1")["spec"]["max_attempts"], 2)
        # From stdin, each shape.
        self.ok("submit", "-f", "-", input=json.dumps({"tasks": [self.noop_spec("i1")]}))
        self.ok("submit", "-f", "-", input=json.dumps([self.noop_spec("i2")]))
        resp = self.ok_json("submit", "-f", "-", input=json.dumps(self.noop_spec("i3")))
        self.assertEqual([t["spec"]["id"] for t in resp["tasks"]], ["i3"])

        self.assertEqual(self.queue_ids(), ["r1", "r2", "a1", "a2", "o1", "i1", "i2", "i3"])

    def test_submit_file_malformed_sends_nothing(self):
        cases = {
            "syntax": '[{"id": "m1", "queue": "%s", "steps": [}]' % self.queue,
            "truncated": '{"tasks": [{"id": "m1"',
            "unknown field": json.dumps([self.noop_spec("m1"), self.noop_spec("m2", stepz=[])]),
            "bad value": json.dumps([self.noop_spec("m1", priority="high")]),
            "empty": "[]",
            "not an object": "42",
        }
        for what, text in cases.items():
            with self.subTest(what):
                res, path = self.submit_file(text)
                self.assertEqual(res.returncode, 2, f"{what}: {res.stdout}{res.stderr}")
                self.assertIn(os.path.basename(path), res.stderr)
                self.assertTrue(res.stderr.startswith("error: "), res.stderr)
                self.assertEqual(res.stdout, "")
        res = self.ctl("submit", "-f", "-", input="{not json")
        self.assertEqual(res.returncode, 2)
        self.assertIn("<stdin>", res.stderr)
        self.assertIn("invalid JSON", res.stderr)
        self.assertIn("stepz", self.submit_file(cases["unknown field"])[0].stderr)
        self.assertEqual(self.queue_ids(), [])

    def test_submit_usage_errors(self):
        q = f"--queue={self.queue}"
        for args in (["submit", q],                                 # no program
                     ["submit", q, "/bin/echo", "hi"],              # program not after --
                     ["submit", q, "--builtin=nope"],               # unknown builtin
                     ["submit", q, "--priority=high", "--", "/bin/true"],
                     ["submit", q, "--not_before=tomorrow", "--", "/bin/true"],
                     ["submit", q, "--step_timeout=-5s", "--", "/bin/true"],
                     ["submit", q, "--env=NOEQUALS", "--", "/bin/true"],
                     ["submit", q, "--payload=x", "--payload_file=/dev/null", "--", "/bin/true"],
                     ["submit", q, "--payload_file=/does/not/exist", "--", "/bin/true"],
                     ["submit", q, "--file=/does/not/exist"],
                     ["submit", "-f", "-", q],                      # --queue with --file
                     ["submit", q, "--state=pending", "--", "/bin/true"],  # a list flag
                     ["submit", q, "--bogus_flag", "--", "/bin/true"]):
            with self.subTest(args=args):
                err = self.fails(2, *args, input="[]")
                self.assertTrue(err.startswith("error: "), err)
        self.assertEqual(self.queue_ids(), [])

    def test_submit_refused_by_scheduler(self):
        self.ok("submit", "--id=dup", f"--queue={self.queue}", "--", "/bin/true")
        # Same id and spec: the existing task, safe to retry.
        self.ok("submit", "--id=dup", f"--queue={self.queue}", "--", "/bin/true")
        # Same id, other spec.
        err = self.fails(1, "submit", "--id=dup", f"--queue={self.queue}", "--", "/bin/false")
        self.assertRegex(err, r"^error: ALREADY_EXISTS: ")
        err = self.fails(1, "submit", "--id=bad id!", f"--queue={self.queue}", "--", "/bin/true")
        self.assertRegex(err, r"^error: INVALID_ARGUMENT: ")
        self.assertEqual(self.queue_ids(), ["dup"])

    # --- get ----------------------------------------------------------------

    def test_get_pending_detail(self):
        self.ok("submit", "--id=g1", f"--queue={self.queue}", "--priority=3", "--max_attempts=2",
                "--", "/bin/echo", "hi there")
        out = self.ok("get", "g1")
        self.assertRegex(out, r"(?m)^ID:\s+g1$")
        self.assertRegex(out, rf"(?m)^Queue:\s+{self.queue}$")
        self.assertRegex(out, r"(?m)^State:\s+PENDING$")
        self.assertRegex(out, r"(?m)^Attempt:\s+0 / 2$")
        self.assertRegex(out, r"(?m)^Priority:\s+3$")
        self.assertRegex(out, r"(?m)^Created:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$")
        self.assertRegex(out, r"(?m)^Steps:\s+\[0\] exec /bin/echo 'hi there'$")
        self.assertRegex(out, r"(?m)^Result:\s+none yet$")

    def test_get_unknown_id(self):
        res = self.ctl("get", "no-such-task")
        self.assertEqual(res.returncode, 1)
        self.assertEqual(res.stdout, "")
        self.assertEqual(res.stderr.strip(), 'error: NOT_FOUND: task "no-such-task" does not exist')
        for command in ("cancel", "retry", "reset", "pause", "resume"):
            with self.subTest(command):
                self.assertRegex(self.fails(1, command, "no-such-task"), r"^error: NOT_FOUND: ")

    # --- list ---------------------------------------------------------------

    def test_list_filters_and_paging(self):
        q = self.queue
        other = q + "-other"
        self.ok("submit", "-f", "-", input=json.dumps(
            [self.noop_spec(f"l{i}") for i in range(1, 6)] + [self.noop_spec("x1", queue=other)]))
        self.ok("pause", "l2")
        self.ok("cancel", "l4")

        out = self.ok("list", f"--queue={q}")
        rows = table_rows(out)
        self.assertEqual(rows[0], ["ID", "QUEUE", "STATE", "ATTEMPT", "AGENT", "PRIO", "UPDATED",
                                   "REASON"])
        self.assertEqual([r[0] for r in rows[1:]], ["l1", "l2", "l3", "l4", "l5"])
        self.assertEqual([r[2] for r in rows[1:]],
                         ["PENDING", "PAUSED", "PENDING", "CANCELLED", "PENDING"])
        self.assertEqual(rows[1][1], q)
        self.assertEqual(rows[1][4], "-")  # no agent

        # By state, any spelling.
        out = self.ok("list", f"--queue={q}", "--state=paused,TASK_STATE_CANCELLED")
        self.assertEqual([r[0] for r in table_rows(out)[1:]], ["l2", "l4"])
        out = self.ok("list", "--state=Pending", f"--queue={other}")
        self.assertEqual([r[0] for r in table_rows(out)[1:]], ["x1"])

        # Paging: two per page, the next token on stderr.
        res = self.ctl("list", f"--queue={q}", "--page_size=2")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l1", "l2"])
        m = re.search(r"^more: --page_token=(\S+)$", res.stderr, re.M)
        self.assertTrue(m, res.stderr)
        res = self.ctl("list", f"--queue={q}", "--page_size=2", f"--page_token={m.group(1)}")
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l3", "l4"])
        m = re.search(r"^more: --page_token=(\S+)$", res.stderr, re.M)
        self.assertTrue(m, res.stderr)
        res = self.ctl("list", f"--queue={q}", "--page_size=2", f"--page_token={m.group(1)}")
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l5"])
        self.assertNotIn("more:", res.stderr)

        # --all follows every page.
        res = self.ctl("list", f"--queue={q}", "--page_size=2", "--all")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l1", "l2", "l3", "l4", "l5"])
        self.assertNotIn("more:", res.stderr)
        got = self.ok_json("list", f"--queue={q}", "--page_size=2", "--all")
        self.assertEqual([t["spec"]["id"] for t in got["tasks"]], ["l1", "l2", "l3", "l4", "l5"])
        self.assertEqual(got["next_page_token"], "")
        # JSON of one page carries the token too.
        got = self.ok_json("list", f"--queue={q}", "--page_size=2")
        self.assertEqual(len(got["tasks"]), 2)
        self.assertNotEqual(got["next_page_token"], "")

    def test_list_usage_errors(self):
        err = self.fails(2, "list", "--state=pending,sleeping")
        self.assertIn('"sleeping"', err)
        self.fails(2, "list", "--page_size=-1")
        self.fails(2, "list", "--page_size=many")
        self.fails(2, "list", "extra")

    # --- cancel, pause, resume, retry, reset --------------------------------

    def test_cancel_pending(self):
        self.ok("submit", "--id=c1", f"--queue={self.queue}", "--", "/bin/true")
        self.assertEqual(self.ok("cancel", "c1"), "c1 CANCELLED\n")
        self.assertEqual(self.ok_json("get", "c1")["state"], "TASK_STATE_CANCELLED")
        # Idempotent, and --json gives the Task.
        task = self.ok_json("cancel", "c1")
        self.assertEqual((task["spec"]["id"], task["state"]), ("c1", "TASK_STATE_CANCELLED"))
        # A cancelled task can be retried (attempts left) and runs again later.
        self.assertEqual(self.ok("retry", "c1"), "c1 PENDING\n")

    def test_pause_resume(self):
        self.ok("submit", "--id=p1", f"--queue={self.queue}", "--", "/bin/true")
        self.assertEqual(self.ok("pause", "p1"), "p1 PAUSED\n")
        self.assertEqual(self.ok_json("get", "p1")["state"], "TASK_STATE_PAUSED")
        self.assertEqual(self.ok("resume", "p1"), "p1 PENDING\n")
        err = self.fails(1, "resume", "p1")
        self.assertRegex(err, r"^error: FAILED_PRECONDITION: ")
        task = self.ok_json("pause", "p1")
        self.assertEqual(task["state"], "TASK_STATE_PAUSED")
        # A finished task cannot be paused.
        self.ok("cancel", "p1")
        self.assertRegex(self.fails(1, "pause", "p1"), r"^error: FAILED_PRECONDITION: ")

    def test_reset_refused_while_pending(self):
        self.ok("submit", "--id=rr1", f"--queue={self.queue}", "--", "/bin/true")
        self.assertRegex(self.fails(1, "reset", "rr1"), r"^error: FAILED_PRECONDITION: ")
        self.assertRegex(self.fails(1, "retry", "rr1"), r"^error: FAILED_PRECONDITION: ")

    def test_id_commands_usage_errors(self):
        for command in ("get", "cancel", "retry", "reset", "pause", "resume"):
            with self.subTest(command):
                self.assertIn("needs a task ID", self.fails(2, command))
                self.fails(2, command, "a", "b")
                self.fails(2, command, "a", "--queue=x")  # a flag of another command

    # --- stats --------------------------------------------------------------

    def test_stats(self):
        q = self.queue
        self.ok("submit", "-f", "-", input=json.dumps(
            [self.noop_spec(f"st{i}") for i in range(1, 6)]))
        self.ok("pause", "st1")
        self.ok("cancel", "st2")
        rows = table_rows(self.ok("stats", f"--queue={q}"))
        # Non-zero states only, in TaskState order (PENDING < CANCELLED < PAUSED).
        self.assertEqual(rows, [["QUEUE", "LENGTH", "MAX", "PENDING", "CANCELLED", "PAUSED"],
                                [q, "4", "-", "3", "1", "1"]])
        got = self.ok_json("stats", f"--queue={q}")
        self.assertEqual(got["queues"][0]["counts"], {"PENDING": "3", "CANCELLED": "1",
                                                      "PAUSED": "1"})
        # Every queue: ours is among them.
        rows = table_rows(self.ok("stats"))
        self.assertIn(q, [r[0] for r in rows[1:]])

    def test_stats_limit(self):
        # The scheduler runs with --queue_max_length=q-stats_limit=7.
        self.ok("submit", f"--queue={self.queue}", "--", "/bin/true")
        rows = table_rows(self.ok("stats", f"--queue={self.queue}"))
        self.assertEqual(rows, [["QUEUE", "LENGTH", "MAX", "PENDING"], [self.queue, "1", "7", "1"]])

    # --- agents, drain, cluster (no agent) ------------------------------------

    def test_agents_none(self):
        self.assertEqual(table_rows(self.ok("agents")),
                         [["ID", "STATE", "SLOTS", "RUNNING", "LABELS", "LAST HEARTBEAT",
                           "VERSION"]])
        self.assertEqual(self.ok_json("agents").get("agents", []), [])

    def test_drain_unknown_agent(self):
        res = self.ctl("drain", "no-such-agent")
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertEqual(res.stdout, "")
        self.assertRegex(res.stderr, r"^error: NOT_FOUND: ")
        self.assertIn("no-such-agent", res.stderr)
        self.assertEqual(self.fails(1, "--json", "drain", "no-such-agent"), res.stderr)

    def test_cluster_without_agents(self):
        stats = self.ok_json("cluster")
        for key in ("agents_active", "agents_draining", "agents_lost"):
            self.assertEqual(stats[key], 0, stats)
        self.assertEqual(int(stats["slots_total"]), 0)
        self.assertEqual(int(stats["slots_used"]), 0)
        self.assertEqual(int(stats["stale_messages"]), 0)
        # The same counts as `stats` summed over the queues.
        totals = collections.Counter()
        for q in self.ok_json("stats")["queues"]:
            totals.update({k: int(v) for k, v in q["counts"].items()})
        self.assertEqual({k: int(v) for k, v in stats["tasks"].items() if int(v)},
                         {k: v for k, v in totals.items() if v})
        out = self.ok("cluster")
        self.assertRegex(out, r"(?m)^Agents active:\s+0$")
        self.assertRegex(out, r"(?m)^Agents draining:\s+0$")
        self.assertRegex(out, r"(?m)^Agents lost:\s+0$")
        self.assertRegex(out, r"(?m)^Slots used:\s+0 / 0$")
        self.assertRegex(out, r"(?m)^Stale messages:\s+0$")
        for name, n in totals.items():
            if n:
                self.assertRegex(out, rf"(?m)^  {name}:\s+{n}$")

    def test_cluster_commands_usage_errors(self):
        self.assertIn("needs an agent ID", self.fails(2, "drain"))
        self.assertIn("takes one agent ID", self.fails(2, "drain", "a", "b"))
        self.fails(2, "drain", "a", "--queue=x")
        self.fails(2, "agents", "extra")
        self.fails(2, "agents", "--state=pending")
        self.fails(2, "cluster", "extra")
        self.fails(2, "cluster", "--queue=x")
        self.fails(2, "drain", "a", "--", "b")

    # --- the command line itself --------------------------------------------

    def test_unknown_command(self):
        err = self.fails(2, "frobnicate")
        self.assertIn('unknown command "frobnicate"', err)
        self.assertIn("taskgridctl help", err)

    def test_help(self):
        commands = ["submit", "get", "list", "cancel", "retry", "reset", "pause", "resume",
                    "stats", "agents", "drain", "cluster", "help"]
        for args in (["help"], ["--help"], ["-h"]):
            with self.subTest(args=args):
                out = self.ok(*args)
                for command in commands:
                    self.assertRegex(out, rf"(?m)^  {command}\b")
                    self.assertRegex(out, rf"(?m)^\s+\$ taskgridctl {command}\b")
        out = self.ok("help", "submit")
        for flag in ("--builtin", "--not_before", "--payload_file", "-f FILE", "--labels"):
            self.assertIn(flag, out)
        self.assertEqual(self.ok("submit", "--help"), out)
        self.assertIn("--schedule_timeout", out)
        for command in ("agents", "drain", "cluster"):
            with self.subTest(command):
                out = self.ok("help", command)
                self.assertRegex(out, rf"(?m)^  \$ taskgridctl {command}\b")
                self.assertIn("--json", out)
        self.fails(2, "help", "frobnicate")
        # No command at all: the usage, as an error.
        res = self.ctl()
        self.assertEqual(res.returncode, 2)
        self.assertIn("Commands:", res.stderr)

    def test_addr_from_environment(self):
        ctl = harness.binary("TASKGRID_CTL")
        self.ok("submit", "--id=env1", f"--queue={self.queue}", "--", "/bin/true")
        env = dict(os.environ, TASKGRID_ADDR=self.cluster.addr)
        res = subprocess.run([ctl, "get", "env1"], env=env, capture_output=True, text=True,
                             timeout=WAIT)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertRegex(res.stdout, r"(?m)^ID:\s+env1$")
        # --addr wins over the environment.
        env = dict(os.environ, TASKGRID_ADDR=f"127.0.0.1:{free_port()}")
        res = subprocess.run([ctl, f"--addr={self.cluster.addr}", "get", "env1"], env=env,
                             capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 0, res.stderr)
        res = subprocess.run([ctl, "get", "env1"], env=env, capture_output=True, text=True,
                             timeout=WAIT)
        self.assertEqual(res.returncode, 1)
        self.assertIn(env["TASKGRID_ADDR"], res.stderr)

    def test_unreachable_scheduler(self):
        addr = f"127.0.0.1:{free_port()}"
        res = subprocess.run([harness.binary("TASKGRID_CTL"), f"--addr={addr}", "--timeout=10s",
                              "list"], capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 1)
        self.assertRegex(res.stderr, r"^error: UNAVAILABLE: ")
        self.assertIn(f"(is taskgrid-scheduler running at {addr}?)", res.stderr)
        self.assertEqual(res.stdout, "")

    def test_timeout_bounds_a_silent_server(self):
        # Accepts connections (the kernel does) but never speaks gRPC.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            addr = f"127.0.0.1:{silent.getsockname()[1]}"
            start = time.monotonic()
            res = subprocess.run([harness.binary("TASKGRID_CTL"), f"--addr={addr}",
                                  "--timeout=1s", "get", "x"],
                                 capture_output=True, text=True, timeout=WAIT)
            elapsed = time.monotonic() - start
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertRegex(res.stderr, r"^error: (DEADLINE_EXCEEDED|UNAVAILABLE): ")
        self.assertLess(elapsed, 10)
        self.fails(2, "--timeout=0s", "list")
        self.fails(2, "--timeout=soon", "list")


class WithAgentTest(CliTestCase):
    """Agent a1 runs the tasks. Needs the taskgrid-agent binary."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(agents=["a1"])

    def test_get_succeeded_task(self):
        self.ok("submit", "--id=ok1", f"--queue={self.queue}", "--", "/bin/echo", "hi")
        self.cluster.wait_state("ok1", "SUCCEEDED", timeout=WAIT)
        out = self.ok("get", "ok1")
        self.assertRegex(out, r"(?m)^State:\s+SUCCEEDED$")
        self.assertRegex(out, r"(?m)^\s+Outcome:\s+SUCCEEDED$")
        self.assertRegex(out, r"(?mi)^\s+exit code:\s+0$")
        self.assertRegex(out, r"(?m)^\s+Stdout:\n\s+hi$")
        self.assertRegex(out, r"(?m)^\s+Stderr:\s+\(empty\)$")
        # The attempts table, exit code 0 shown.
        lines = out.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("ATTEMPT"))
        self.assertEqual(table_rows(lines[header])[0],
                         ["ATTEMPT", "AGENT", "OUTCOME", "EXIT", "STARTED", "FINISHED", "ERROR"])
        row = table_rows(lines[header + 1])[0]
        self.assertEqual(row[:4], ["1", "a1", "SUCCEEDED", "0"])

        task = self.ok_json("get", "ok1")
        self.assertEqual(task["result"]["exit_code"], 0)
        self.assertEqual(base64.b64decode(task["result"]["stdout_tail"]), b"hi\n")
        self.assertEqual(len(task["attempts"]), 1)

        rows = table_rows(self.ok("stats", f"--queue={self.queue}"))
        self.assertEqual(rows, [["QUEUE", "LENGTH", "MAX", "SUCCEEDED"],
                                [self.queue, "0", "-", "1"]])

    def test_failed_task_retry_refused_then_reset(self):
        self.ok("submit", "--id=f1", f"--queue={self.queue}", "--builtin=fail",
                "--max_attempts=1", "--", "3")
        first = self.cluster.wait_state("f1", "FAILED", timeout=WAIT)
        self.assertEqual(first["attempt"], 1)
        self.assertEqual(first["result"]["exit_code"], 3)
        out = self.ok("get", "f1")
        self.assertRegex(out, r"(?mi)^\s+exit code:\s+3$")

        err = self.fails(1, "retry", "f1")
        self.assertRegex(err, r"^error: FAILED_PRECONDITION: ")
        self.assertIn("reset", err)

        out = self.ok("reset", "f1")
        self.assertRegex(out, r"^f1 (PENDING|DISPATCHED)\n$")
        # It runs again: a new attempt 1, finished after the first one.
        def ran_again():
            task = self.ok_json("get", "f1")
            return (task["state"] == "TASK_STATE_FAILED" and len(task["attempts"]) == 1 and
                    task["attempts"][0]["finish_time"] != first["attempts"][0]["finish_time"] and
                    task)
        task = harness.wait_until(ran_again, timeout=WAIT, interval=0.1, what="f1 to fail again")
        self.assertEqual(task["attempt"], 1)

    def test_cancel_running(self):
        self.ok("submit", "--id=long", f"--queue={self.queue}", "--builtin=sleep", "--", "60")
        self.cluster.wait_state("long", "RUNNING", timeout=WAIT)
        out = self.ok("cancel", "long")
        self.assertRegex(out, r"^long (CANCELLING|CANCELLED)\n$")
        self.cluster.wait_state("long", "CANCELLED", timeout=WAIT)
        self.assertRegex(self.ok("get", "long"), r"(?m)^\s+Outcome:\s+CANCELLED$")

    def test_pause_running_shows_interrupted_attempt(self):
        self.ok("submit", "--id=pr1", f"--queue={self.queue}", "--max_attempts=1",
                "--builtin=sleep", "--", "60")
        self.cluster.wait_state("pr1", "RUNNING", timeout=WAIT)
        res = self.ctl("pause", "pr1")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertRegex(res.stdout, r"^pr1 (RUNNING|PAUSED)\n$")
        if res.stdout == "pr1 RUNNING\n":  # stopping on a1: said on stderr
            self.assertEqual(res.stderr, "note: pr1 is being stopped on agent a1; it ends PAUSED\n")
        task = self.cluster.wait_state("pr1", "PAUSED", timeout=WAIT)
        self.assertEqual(len(task["attempts"]), 1, task)
        self.assertTrue(task["attempts"][0]["interrupted"], task)
        out = self.ok("get", "pr1")
        lines = out.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("ATTEMPT"))
        row = table_rows(lines[header + 1])[0]
        self.assertEqual(row[:2], ["1", "a1"])
        self.assertRegex(row[2], r"^([A-Z_]+ \(interrupted\)|interrupted)$")
        self.assertRegex(out, r"(?m)^State:\s+PAUSED$")
        # The interrupted attempt does not count: attempt 2 runs (max_attempts=1).
        # Dispatched at once when a1 has room.
        self.assertRegex(self.ok("resume", "pr1"), r"^pr1 (PENDING|DISPATCHED|RUNNING)\n$")
        harness.wait_until(lambda: self.ok_json("get", "pr1")["attempt"] == 2, timeout=WAIT,
                           what="pr1 to run attempt 2")
        self.cluster.wait_state("pr1", "RUNNING", timeout=WAIT)
        self.ok("cancel", "pr1")
        self.cluster.wait_state("pr1", "CANCELLED", timeout=WAIT)

    def test_schedule_timeout_fails_a_task_never_started(self):
        self.ok("submit", "--id=exp1", f"--queue={self.queue}", "--schedule_timeout=1s",
                "--labels=gpu=1", "--builtin=noop")
        task = self.cluster.wait_state("exp1", "FAILED", timeout=WAIT)
        self.assertEqual(task["attempt"], 0, task)
        self.assertIn("expired", task["reason"] + task.get("result", {}).get("error", ""), task)
        # One that starts in time runs normally.
        self.ok("submit", "--id=exp2", f"--queue={self.queue}", "--schedule_timeout=60s",
                "--builtin=noop")
        self.cluster.wait_state("exp2", "SUCCEEDED", timeout=WAIT)

    def test_list_shows_agent_of_running_task(self):
        self.ok("submit", "--id=run1", f"--queue={self.queue}", "--builtin=sleep", "--", "60")
        self.cluster.wait_state("run1", "RUNNING", timeout=WAIT)
        rows = table_rows(self.ok("list", f"--queue={self.queue}", "--state=running"))
        self.assertEqual(rows[1][:5], ["run1", self.queue, "RUNNING", "1/3", "a1"])
        self.ok("cancel", "run1")
        self.cluster.wait_state("run1", "CANCELLED", timeout=WAIT)


class ClusterTest(CliTestCase):
    """agents and cluster: a1 (3 slots, labels) and a2 (2 slots)."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = harness.Cluster()
        cls.addClassCleanup(cls.cluster.close)
        cls.cluster.start_scheduler()
        cls.cluster.start_agent("a1", slots=3, labels="zone=eu,disk=ssd")
        cls.cluster.start_agent("a2", slots=2)

    def wait_agents(self, expected):
        """Waits until `agents --json` lists exactly the ids of `expected`
        ({id: state}); returns {id: Agent}."""
        def listed():
            got = {a["id"]: a for a in self.ok_json("agents").get("agents", [])}
            states = {k: a["state"].replace("AGENT_STATE_", "") for k, a in got.items()}
            return states == expected and got
        return harness.wait_until(listed, timeout=WAIT, interval=0.1,
                                  what=f"agents to be {expected}")

    def run_on(self, task_id, agent_id):
        """A 60 s sleep pinned to agent_id, RUNNING when this returns."""
        self.ok("submit", f"--id={task_id}", f"--queue={self.queue}", f"--agents={agent_id}",
                "--builtin=sleep", "--", "60")
        self.cluster.wait_state(task_id, "RUNNING", timeout=WAIT)

    def test_agents(self):
        agents = self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})
        a1 = agents["a1"]
        self.assertEqual(a1["labels"], {"zone": "eu", "disk": "ssd"})
        self.assertEqual((a1["slots"], a1["slots_used"]), (3, 0))
        self.assertEqual(a1.get("running", []), [])
        self.assertTrue(a1["version"])
        self.assertIn("last_heartbeat_time", a1)

        rows = table_rows(self.ok("agents"))
        self.assertEqual(rows[0], ["ID", "STATE", "SLOTS", "RUNNING", "LABELS", "LAST HEARTBEAT",
                                   "VERSION"])
        self.assertEqual([r[0] for r in rows[1:]], ["a1", "a2"])  # by id
        self.assertEqual(rows[1][:5], ["a1", "ACTIVE", "0/3", "0", "disk=ssd,zone=eu"])
        self.assertRegex(rows[1][5], r"^\d+(\.\d)?s ago$")
        self.assertEqual(rows[1][6], a1["version"])
        self.assertEqual(rows[2][:5], ["a2", "ACTIVE", "0/2", "0", "-"])

        # A running task shows in its agent's slots and RUNNING.
        self.run_on("ag-run", "a1")
        rows = table_rows(self.ok("agents"))
        self.assertEqual(rows[1][:4], ["a1", "ACTIVE", "1/3", "1"])
        self.assertEqual(rows[2][:4], ["a2", "ACTIVE", "0/2", "0"])
        a1 = self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})["a1"]
        self.assertEqual((a1["slots_used"], a1["running"]), (1, ["ag-run"]))
        self.ok("cancel", "ag-run")
        self.cluster.wait_state("ag-run", "CANCELLED", timeout=WAIT)

    def test_cluster(self):
        self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})
        self.run_on("cl-run", "a2")
        stats = self.ok_json("cluster")
        self.assertEqual((stats["agents_active"], stats["agents_draining"], stats["agents_lost"]),
                         (2, 0, 0), stats)
        self.assertEqual((int(stats["slots_used"]), int(stats["slots_total"])), (1, 5), stats)
        self.assertEqual(int(stats["stale_messages"]), 0, stats)
        every = self.ok_json("list", "--all")["tasks"]
        want = collections.Counter(t["state"].replace("TASK_STATE_", "") for t in every)
        self.assertEqual({k: int(v) for k, v in stats["tasks"].items() if int(v)}, dict(want))
        self.assertGreaterEqual(want["RUNNING"], 1)

        out = self.ok("cluster")
        self.assertRegex(out, r"(?m)^Agents active:\s+2$")
        self.assertRegex(out, r"(?m)^Agents draining:\s+0$")
        self.assertRegex(out, r"(?m)^Agents lost:\s+0$")
        self.assertRegex(out, r"(?m)^Slots used:\s+1 / 5$")
        self.assertRegex(out, r"(?m)^Stale messages:\s+0$")
        self.assertRegex(out, r"(?m)^Tasks:$")
        self.assertRegex(out, rf"(?m)^  RUNNING:\s+{want['RUNNING']}$")
        self.ok("cancel", "cl-run")
        self.cluster.wait_state("cl-run", "CANCELLED", timeout=WAIT)


class DrainTest(CliTestCase):
    """drain: d1 is drained while it runs a task; d2 takes the new work."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(agents=["d1", "d2"])

    def agent_states(self):
        return {a["id"]: a["state"].replace("AGENT_STATE_", "")
                for a in self.ok_json("agents").get("agents", [])}

    def test_drain(self):
        q = self.queue
        harness.wait_until(lambda: self.agent_states() == {"d1": "ACTIVE", "d2": "ACTIVE"},
                           timeout=WAIT, what="d1 and d2 to be ACTIVE")
        self.ok("submit", "--id=dr-running", f"--queue={q}", "--agents=d1", "--builtin=sleep",
                "--", "3")
        self.cluster.wait_state("dr-running", "RUNNING", timeout=WAIT)

        self.assertEqual(self.ok("drain", "d1"), "d1 DRAINING\n")
        self.assertEqual(self.agent_states(), {"d1": "DRAINING", "d2": "ACTIVE"})
        rows = table_rows(self.ok("agents"))
        self.assertEqual(rows[1][:4], ["d1", "DRAINING", "1/2", "1"])
        # Again, as JSON: the Agent.
        agent = self.ok_json("drain", "d1")
        self.assertEqual((agent["id"], agent["state"]), ("d1", "AGENT_STATE_DRAINING"))
        self.assertEqual(self.ok_json("cluster")["agents_draining"], 1)
        self.assertRegex(self.ok("cluster"), r"(?m)^Agents draining:\s+1$")

        # New work goes to d2 only; work only d1 may run waits.
        self.ok("submit", "-f", "-", input=json.dumps(
            [self.noop_spec(f"dr-new-{i}") for i in range(6)] +
            [self.noop_spec("dr-pinned", placement={"agent_ids": ["d1"]})]))
        for i in range(6):
            task = self.cluster.wait_state(f"dr-new-{i}", "SUCCEEDED", timeout=WAIT)
            self.assertEqual([a["agent_id"] for a in task["attempts"]], ["d2"], task)
        # The task it ran when drained finishes there.
        task = self.cluster.wait_state("dr-running", "SUCCEEDED", timeout=WAIT)
        self.assertEqual([a["agent_id"] for a in task["attempts"]], ["d1"], task)
        time.sleep(1)  # d1 has free slots now: still nothing for it
        task = self.ok_json("get", "dr-pinned")
        self.assertEqual((task["state"], task["attempt"]), ("TASK_STATE_PENDING", 0), task)
        self.assertEqual(self.agent_states(), {"d1": "DRAINING", "d2": "ACTIVE"})
        self.ok("cancel", "dr-pinned")


if __name__ == "__main__":
    unittest.main()
