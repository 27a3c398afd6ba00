"""System test of taskgridctl against the real scheduler (and agent).

Each command's output and exit code is checked. Two clusters: one with no
agent (tasks stay where the CLI puts them), one with agent a1 (tasks run).
Every test uses its own queue, so the tests of a class share one cluster.

Run through ctest (system.cli), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import collections
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0
PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto",
                         "taskgrid", "v1")
# The command of taskgridctl that calls each RPC of TaskService and
# ClusterService (AgentService is the agents' own).
RPC_COMMANDS = {
    "SubmitTasks": "submit", "GetTask": "get", "ListTasks": "list", "CancelTask": "cancel",
    "RetryTask": "retry", "ResetTask": "reset", "PauseTask": "pause", "ResumeTask": "resume",
    "GetQueueStats": "stats", "WaitTask": "wait", "WatchTasks": "watch",
    "StreamTaskOutput": "logs",
    "ListAgents": "agents", "DrainAgent": "drain", "GetClusterStats": "cluster",
    "DeleteByMergeKey": "delete", "CancelTasks": "cancel", "RetryTasks": "retry",
    "PauseQueue": "queue pause", "ResumeQueue": "queue resume", "SetQueueLimits": "queue limits",
    "UndrainAgent": "undrain",
    "Claim": "board claim", "ExtendClaim": "board extend", "CompleteClaim": "board complete",
    "AbandonClaim": "board abandon", "TrashClaim": "board trash", "RestoreTask": "board restore",
    "WaitForWork": "board wait",
    "CreateSchedule": "schedule create", "GetSchedule": "schedule get",
    "ListSchedules": "schedule list", "PauseSchedule": "schedule pause",
    "ResumeSchedule": "schedule resume", "DeleteSchedule": "schedule delete",
    "DeleteTask": "delete", "DeleteTasks": "delete",
    "SetQueueRetention": "queue retention", "SetQueueWeight": "queue weight",
}
# One line of `watch`: REVISION  TIME  TASK  FROM -> TO  attempt N  agent A  [reason]
EVENT_LINE = re.compile(r"^(\d+)  (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d)  (\S+)  "
                        r"(-|[A-Z]+) -> ([A-Z]+)  attempt (\d+)  agent (\S+)(?:  (.*))?$")


def free_port():
    """A port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_of(event):
    """The to_state of a TaskEvent as JSON, without the prefix."""
    return event["to_state"].replace("TASK_STATE_", "")


class Watch:
    """`taskgridctl watch ...` running in the background; its stdout read by
    a thread, line by line."""

    def __init__(self, cluster, *args):
        self.argv = [harness.binary("TASKGRID_CTL"), f"--addr={cluster.addr}", "watch",
                     *map(str, args)]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        self.lines = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def next_line(self, timeout=WAIT):
        """The next line, or None once the output ended."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no line from {' '.join(self.argv)} in {timeout}s") from None

    def interrupt(self):
        """SIGINT (Ctrl-C); returns (exit code, stderr)."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def finish(self):
        """Waits for the exit; returns (exit code, stderr)."""
        try:
            self.proc.wait(timeout=WAIT)
        finally:
            self.close()
        self._reader.join(timeout=WAIT)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode, err

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)


def table_rows(stdout):
    """A padded table as a list of rows of cells (header first)."""
    return [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines() if line.strip()]


class CliTestCase(unittest.TestCase):
    """One cluster per class. Each test has its own queue; task ids are global
    across queues, so they must also differ between the tests of a class."""

    cluster = None

    @classmethod
    def start_cluster(cls, scheduler_flags=(), agents=()):
        cls.cluster = harness.start_class_cluster(cls, scheduler_flags, agents, slots=2)

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

    def fails_out(self, code, *args, **kw):
        """Runs taskgridctl, asserts exit `code`, returns stdout."""
        res = self.ctl(*args, **kw)
        self.assertEqual(res.returncode, code, self.describe(args, res))
        return res.stdout

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
                      "--resources=gpu=1,memory=0.5GiB",
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
                                             "agent_ids": ["a1", "a2"], "slots": 2,
                                             "resources": {"gpu": "1", "memory": "512MiB"}})
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
        when = harness.unix_time(self.ok_json("get", "nb-rel")["spec"]["not_before"])
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
        self.assertRegex(out, r"(?m)^Attempt:\s+-$")
        self.assertRegex(out, r"(?m)^Attempts used:\s+0 / 2$")
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
        self.assertEqual(rows[0], ["ID", "QUEUE", "STATE", "ATTEMPTS", "AGENT", "PRIO", "UPDATED",
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

        # Newest first, by id prefix, with the count of every match.
        res = self.ctl("list", f"--queue={q}", "--page_size=2", "--newest_first")
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l5", "l4"])
        self.assertIn("5 tasks match in all", res.stderr)
        m = re.search(r"^more: --page_token=(\S+)$", res.stderr, re.M)
        self.assertTrue(m, res.stderr)
        res = self.ctl("list", f"--queue={q}", "--page_size=2", "--newest_first",
                       f"--page_token={m.group(1)}")
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["l3", "l2"])
        page = json.loads(self.ok("list", "--id_prefix=l", f"--queue={q}", "--newest_first",
                                  "--state=pending", "--json"))
        self.assertEqual([t["spec"]["id"] for t in page["tasks"]], ["l5", "l3", "l1"])
        self.assertEqual(int(page["total_size"]), 3)

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

    def test_labels_find_tasks(self):
        q = self.queue
        self.ok("submit", "--id=lab-1", f"--queue={q}", "--task_labels=team=red,run=7", "--",
                "/bin/true")
        self.ok("submit", "--id=lab-2", f"--queue={q}", "--task_labels=team=blue", "--",
                "/bin/true")
        self.ok("submit", "--id=lab-3", f"--queue={q}", "--", "/bin/true")
        out = self.ok("get", "lab-1")
        self.assertRegex(out, r"(?m)^Labels:\s+run=7,team=red$")
        self.assertNotRegex(self.ok("get", "lab-3"), r"(?m)^Labels:")
        res = self.ctl("list", f"--queue={q}", "--task_labels=team=red")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual([r[0] for r in table_rows(res.stdout)[1:]], ["lab-1"])
        page = json.loads(self.ok("list", "--task_labels=team=red,run=7", "--json"))
        self.assertEqual([t["spec"]["id"] for t in page["tasks"]], ["lab-1"])
        self.assertEqual(int(page["total_size"]), 1)
        self.assertEqual(page["tasks"][0]["spec"]["labels"], {"team": "red", "run": "7"})
        page = json.loads(self.ok("list", "--task_labels=team=green", "--json"))
        self.assertEqual(page.get("tasks", []), [])
        err = self.fails(2, "list", "--task_labels=team")
        self.assertIn("task_labels", err)
        err = self.fails(1, "submit", "--id=lab-4", f"--queue={q}", "--task_labels=bad key=1",
                         "--", "/bin/true")
        self.assertRegex(err, r"^error: INVALID_ARGUMENT: .*labels")

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

    # --- wait ---------------------------------------------------------------

    def test_wait_times_out(self):
        self.ok("submit", "--id=wt-pending", f"--queue={self.queue}", "--builtin=noop")
        start = time.monotonic()
        res = self.ctl("wait", "wt-pending", "--wait_timeout=1s")
        elapsed = time.monotonic() - start
        self.assertEqual(res.returncode, 4, self.describe(["wait"], res))
        self.assertEqual(res.stdout, "wt-pending PENDING\n")
        self.assertIn("--wait_timeout=1s", res.stderr)
        self.assertIn("wt-pending (PENDING)", res.stderr)
        self.assertGreaterEqual(elapsed, 1.0)
        self.assertLess(elapsed, 15)
        # JSON: the WaitTaskResponse, not done.
        res = self.ctl("--json", "wait", "--wait_timeout=200ms", "wt-pending")
        self.assertEqual(res.returncode, 4, res.stderr)
        got = json.loads(res.stdout)
        self.assertEqual((got["done"], got["task"]["state"]), (False, "TASK_STATE_PENDING"))
        # submit --wait times out the same way; the task was submitted.
        res = self.ctl("submit", "--wait", "--wait_timeout=500ms", "--id=wt-sw",
                       f"--queue={self.queue}", "--builtin=noop")
        self.assertEqual(res.returncode, 4, res.stderr)
        self.assertEqual(table_rows(res.stdout),
                         [["ID", "QUEUE", "STATE"], ["wt-sw", self.queue, "PENDING"],
                          ["wt-sw PENDING"]])
        self.assertEqual(self.queue_ids(), ["wt-pending", "wt-sw"])

    def test_wait_cancelled_exits_3(self):
        self.ok("submit", "--id=wc1", f"--queue={self.queue}", "--builtin=noop")
        self.ok("cancel", "wc1")
        res = self.ctl("wait", "wc1")
        self.assertEqual((res.returncode, res.stdout), (3, "wc1 CANCELLED  cancelled by request\n"),
                         res.stderr)
        got = json.loads(self.fails_out(3, "--json", "wait", "wc1"))
        self.assertEqual((got["done"], got["task"]["state"]), (True, "TASK_STATE_CANCELLED"))
        # Several tasks: one JSON document per line.
        self.ok("submit", "--id=wc2", f"--queue={self.queue}", "--builtin=noop")
        self.ok("cancel", "wc2")
        lines = self.fails_out(3, "--json", "wait", "wc1", "wc2").splitlines()
        self.assertEqual([json.loads(line)["task"]["spec"]["id"] for line in lines],
                         ["wc1", "wc2"])

    def test_wait_errors(self):
        err = self.fails(1, "wait", "no-such-task")
        self.assertRegex(err, r"^error: NOT_FOUND: ")
        self.assertIn("needs a task ID", self.fails(2, "wait"))
        for args in (["wait", "x", "--wait_timeout=0s"],
                     ["wait", "x", "--wait_timeout=soon"],
                     ["wait", "x", "--queue=q"],
                     ["wait", "x", "--", "y"],
                     ["submit", "--wait_timeout=5s", f"--queue={self.queue}", "--builtin=noop"],
                     ["submit", "--wait", "--wait_timeout=-1s", f"--queue={self.queue}",
                      "--builtin=noop"]):
            with self.subTest(args=args):
                self.assertTrue(self.fails(2, *args).startswith("error: "))
        self.assertEqual(self.queue_ids(), [])

    # --- watch (no agent) ---------------------------------------------------

    def test_watch_usage_errors(self):
        for args in (["watch", "extra"], ["watch", "--state=sleeping"], ["watch", "--after=-1"],
                     ["watch", "--after=soon"], ["watch", "--count=-1"],
                     ["watch", "--page_size=2"], ["watch", "--wait_timeout=1s"],
                     ["watch", "--", "x"]):
            with self.subTest(args=args):
                self.assertTrue(self.fails(2, *args).startswith("error: "))

    def test_watch_revision_ahead_is_out_of_range(self):
        res = self.ctl("watch", "--after=999999999")
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertEqual(res.stdout, "")
        self.assertRegex(res.stderr, r"^error: OUT_OF_RANGE: ")
        self.assertIn("Watch without --after", res.stderr)
        # Where to resume: the newest change, and nothing was pruned.
        self.assertRegex(res.stderr, r"resume after revision \d+ \(its newest change\)")
        self.assertNotIn("pruned", res.stderr)

    def test_watch_live_and_ctrl_c(self):
        q = self.queue
        watch = Watch(self.cluster, f"--queue={q}")
        try:
            # Live only: probes until the watch is surely subscribed.
            line = None
            for probe in range(40):
                self.ok("submit", f"--id=wl-probe-{probe}", f"--queue={q}", "--builtin=noop")
                try:
                    line = watch.next_line(timeout=0.5)
                    break
                except TimeoutError:
                    continue
            self.assertIsNotNone(line, "watch printed nothing")
            m = EVENT_LINE.match(line)
            self.assertTrue(m, line)
            task_id = m.group(3)
            self.assertRegex(task_id, r"^wl-probe-\d+$")
            self.assertEqual(m.group(4, 5, 6, 7), ("-", "PENDING", "0", "-"))
            self.ok("pause", task_id)
            while True:  # probes submitted meanwhile come first
                m = EVENT_LINE.match(watch.next_line())
                self.assertTrue(m)
                if m.group(3) == task_id:
                    break
                self.assertEqual(m.group(5), "PENDING")
            self.assertEqual(m.group(4, 5), ("PENDING", "PAUSED"))
        finally:
            rc, err = watch.interrupt()
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")

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
                         [["ID", "STATE", "SLOTS", "RESOURCES", "RUNNING", "LABELS",
                           "LAST HEARTBEAT", "VERSION", "NOTE"]])
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
                    "wait", "watch", "stats", "agents", "drain", "cluster", "help"]
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
        # Every command's own help has an example, the same from --help.
        for command in commands:
            with self.subTest(command):
                out = self.ok("help", command)
                self.assertRegex(out, rf"(?m)^\s+\$ taskgridctl {command}\b")
                self.assertEqual(self.ok(command, "--help"), out)
        for command, words in (("wait", ("--wait_timeout", "exit", "0 ", "3 ", "4 ")),
                               ("watch", ("--after", "--count", "--follow", "--id", "--state",
                                          "RESOURCE_EXHAUSTED", "OUT_OF_RANGE", "JSON lines")),
                               ("submit", ("--wait", "--wait_timeout")),
                               ("logs", ("-f", "--stdout", "--stderr", "bytes not shown",
                                         "--wait_timeout", "Exit status"))):
            out = self.ok("help", command)
            for word in words:
                self.assertIn(word, out, f"help {command}")
        self.assertRegex(self.ok("help"), r"3 a task FAILED or was\s+CANCELLED, 4 --wait_timeout")
        self.fails(2, "help", "frobnicate")
        # No command at all: the usage, as an error.
        res = self.ctl()
        self.assertEqual(res.returncode, 2)
        self.assertIn("Commands:", res.stderr)

    def test_every_rpc_has_a_command(self):
        rpcs = {}
        for proto in ("task_service.proto", "cluster_service.proto", "board_service.proto",
                      "schedule_service.proto"):
            with open(os.path.join(PROTO_DIR, proto)) as f:
                for name in re.findall(r"(?m)^\s*rpc\s+(\w+)\s*\(", f.read()):
                    rpcs[name] = proto
        self.assertIn("WaitTask", rpcs)
        self.assertIn("WatchTasks", rpcs)
        self.assertEqual(sorted(rpcs), sorted(RPC_COMMANDS),
                         "an RPC without a taskgridctl command (or a stale entry)")
        usage = self.ok("help")
        for rpc, command in RPC_COMMANDS.items():
            with self.subTest(rpc):
                self.assertRegex(usage, rf"(?m)^  {command}\b")

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
        # Nothing listens there: said so, and only then asked.
        self.assertIn(f"nothing listens at {addr} (connection refused): is taskgrid-scheduler "
                      "running there?", res.stderr)
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

    def test_get_says_when_output_was_cut(self):
        # 70,000 bytes on stdout: the agent keeps the last 64 KiB and says
        # how many went before them.
        self.ok("submit", "--id=chatty", f"--queue={self.queue}", "--", "/bin/sh", "-c",
                "head -c 70000 /dev/zero | tr '\\0' x; echo end")
        task = self.cluster.wait_state("chatty", "SUCCEEDED", timeout=WAIT)
        tail = base64.b64decode(task["result"]["stdout_tail"])
        self.assertEqual((len(tail), tail[-4:]), (65536, b"end\n"))
        self.assertEqual(int(task["result"]["stdout_cut_bytes"]), 70004 - 65536)
        out = self.ok("get", "chatty")
        self.assertRegex(out, r"(?m)^\s+Stdout \(truncated: 4468 earlier bytes cut\):$")
        self.assertRegex(out, r"(?m)^\s+Stderr:\s+\(empty\)$")

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
        # It runs again with a fresh budget: the attempt number goes on (a
        # number never repeats for a task, so the old run's result cannot
        # land on the new one), the budget used starts over.
        def ran_again():
            task = self.ok_json("get", "f1")
            return (task["state"] == "TASK_STATE_FAILED" and len(task["attempts"]) == 1 and
                    task["attempts"][0]["finish_time"] != first["attempts"][0]["finish_time"] and
                    task)
        task = harness.wait_until(ran_again, timeout=WAIT, interval=0.1, what="f1 to fail again")
        self.assertEqual(task["attempt"], 2)
        self.assertEqual(task["attempts_used"], 1)

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
        self.assertRegex(res.stdout, r"^pr1 (PAUSING|PAUSED)\n$")
        if res.stdout == "pr1 PAUSING\n":  # stopping on a1: said on stderr
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
        self.assertRegex(out, r"(?m)^Attempt:\s+1$")
        self.assertRegex(out, r"(?m)^Attempts used:\s+0 / 1$")  # a pause does not count
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


    # --- wait, submit --wait ------------------------------------------------

    def test_wait_succeeded(self):
        self.ok("submit", "--id=ws1", f"--queue={self.queue}", "--builtin=sleep", "--", "0.5")
        res = self.ctl("wait", "ws1")
        self.assertEqual((res.returncode, res.stdout, res.stderr), (0, "ws1 SUCCEEDED\n", ""))
        got = self.ok_json("wait", "ws1", "--wait_timeout=5s")
        self.assertEqual((got["done"], got["task"]["state"]), (True, "TASK_STATE_SUCCEEDED"))
        self.assertEqual(got["task"]["result"]["outcome"], "OUTCOME_SUCCEEDED")
        # Several ids: one line each, in the order given.
        self.ok("submit", "--id=ws2", f"--queue={self.queue}", "--builtin=noop")
        self.assertEqual(self.ok("wait", "ws2", "ws1"), "ws2 SUCCEEDED\nws1 SUCCEEDED\n")

    def test_wait_failed_exits_3(self):
        self.ok("submit", "--id=wf1", f"--queue={self.queue}", "--max_attempts=1",
                "--builtin=fail", "--", "7")
        res = self.ctl("wait", "wf1", "--wait_timeout=30s")
        # The line says why, two spaces after the state.
        failed = "wf1 FAILED  attempt 1 on agent a1 failed: builtin fail; its only attempt used\n"
        self.assertEqual((res.returncode, res.stdout), (3, failed), res.stderr)
        # One failed among succeeded ones: still 3.
        self.ok("submit", "--id=wf2", f"--queue={self.queue}", "--builtin=noop")
        res = self.ctl("wait", "wf2", "wf1")
        self.assertEqual((res.returncode, res.stdout), (3, "wf2 SUCCEEDED\n" + failed))

    def test_wait_running_times_out(self):
        self.ok("submit", "--id=wr1", f"--queue={self.queue}", "--builtin=sleep", "--", "60")
        self.cluster.wait_state("wr1", "RUNNING", timeout=WAIT)
        start = time.monotonic()
        res = self.ctl("wait", "--wait_timeout=1500ms", "wr1")
        elapsed = time.monotonic() - start
        self.assertEqual((res.returncode, res.stdout), (4, "wr1 RUNNING\n"), res.stderr)
        self.assertIn("wr1 (RUNNING)", res.stderr)
        self.assertGreaterEqual(elapsed, 1.5)
        self.assertLess(elapsed, 15)
        self.ok("cancel", "wr1")
        res = self.ctl("wait", "wr1", "--wait_timeout=30s")
        self.assertEqual((res.returncode, res.stdout), (3, "wr1 CANCELLED  cancelled by request\n"),
                         res.stderr)

    def test_submit_wait(self):
        q = self.queue
        res = self.ctl("submit", "--wait", "--id=sw1", f"--queue={q}", "--", "/bin/echo", "hi")
        self.assertEqual(res.returncode, 0, res.stderr)
        rows = table_rows(res.stdout)
        self.assertEqual(rows[0], ["ID", "QUEUE", "STATE"])
        self.assertEqual(rows[1][:2], ["sw1", q])
        self.assertEqual(rows[2:], [["sw1 SUCCEEDED"]])
        self.assertEqual(self.ok_json("get", "sw1")["state"], "TASK_STATE_SUCCEEDED")

        # A file of tasks: each one waited for; one failure makes it exit 3.
        tasks = [self.noop_spec("sw-ok"),
                 {"id": "sw-bad", "queue": q, "max_attempts": 1,
                  "steps": [{"builtin": {"name": "fail", "args": ["2"]}}]},
                 self.noop_spec("sw-ok2")]
        res, _ = self.submit_file(json.dumps(tasks), "--wait")
        self.assertEqual(res.returncode, 3, res.stdout + res.stderr)
        self.assertEqual(res.stdout.splitlines()[-3:],
                         ["sw-ok SUCCEEDED",
                          "sw-bad FAILED  attempt 1 on agent a1 failed: builtin fail; its only "
                          "attempt used",
                          "sw-ok2 SUCCEEDED"])
        # All good: 0. --json: one SubmitTasksResponse with the final states.
        res, _ = self.submit_file(json.dumps([self.noop_spec("sw-j1"), self.noop_spec("sw-j2")]),
                                  "--wait", "--json", "--wait_timeout=30s")
        self.assertEqual(res.returncode, 0, res.stderr)
        got = json.loads(res.stdout)
        self.assertEqual([(t["spec"]["id"], t["state"]) for t in got["tasks"]],
                         [("sw-j1", "TASK_STATE_SUCCEEDED"), ("sw-j2", "TASK_STATE_SUCCEEDED")])
        # Generated ids are waited for too.
        got = self.ok_json("submit", "--wait", f"--queue={q}", "--builtin=noop")
        self.assertTrue(got["tasks"][0]["spec"]["id"])
        self.assertEqual(got["tasks"][0]["state"], "TASK_STATE_SUCCEEDED")
        # Timed out: 4; the task runs on.
        res = self.ctl("submit", "--wait", "--wait_timeout=1s", "--id=sw-slow", f"--queue={q}",
                       "--builtin=sleep", "--", "60")
        self.assertEqual(res.returncode, 4, res.stderr)
        self.assertRegex(res.stdout.splitlines()[-1], r"^sw-slow (DISPATCHED|RUNNING)$")
        self.ok("cancel", "sw-slow")

    # --- watch --------------------------------------------------------------

    def probe_revision(self, queue):
        """Submits a noop task to `queue`, waits for it to finish, and returns
        the revision of its last change (read back from the event history)."""
        task_id = f"probe-{queue}-{time.monotonic_ns()}"
        self.ok("submit", "--wait", f"--id={task_id}", f"--queue={queue}", "--builtin=noop")
        out = self.ok("--json", "watch", "--after=0", f"--id={task_id}",
                      "--state=succeeded", "--count=1")
        return int(json.loads(out)["revision"])

    def test_watch_transitions_in_order(self):
        q = self.queue
        base = self.probe_revision(q + "-probe")
        self.ok("submit", "--wait", "--id=wt1", f"--queue={q}", "--", "/bin/true")
        # Another task in the queue, to be filtered out by --id.
        self.ok("submit", "--wait", "--id=wt-other", f"--queue={q}", "--builtin=noop")

        out = self.ok("watch", f"--after={base}", "--id=wt1", "--count=4")
        lines = out.splitlines()
        self.assertEqual(len(lines), 4, out)
        events = []
        for line in lines:
            m = EVENT_LINE.match(line)
            self.assertTrue(m, line)
            events.append(m.groups())
        self.assertEqual([e[2] for e in events], ["wt1"] * 4)
        self.assertEqual([(e[3], e[4]) for e in events],
                         [("-", "PENDING"), ("PENDING", "DISPATCHED"), ("DISPATCHED", "RUNNING"),
                          ("RUNNING", "SUCCEEDED")])
        revisions = [int(e[0]) for e in events]
        self.assertEqual(revisions, sorted(set(revisions)))
        self.assertGreater(revisions[0], base)
        self.assertEqual([e[5] for e in events], ["0", "1", "1", "1"])
        self.assertEqual([e[6] for e in events[1:3]], ["a1"] * 2)

        # The same as JSON lines, one TaskEvent object per line.
        out = self.ok("--json", "watch", f"--after={base}", "--id=wt1", "--count=4")
        rows = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(rows), 4, out)
        self.assertEqual([int(r["revision"]) for r in rows], revisions)
        self.assertEqual([state_of(r) for r in rows],
                         ["PENDING", "DISPATCHED", "RUNNING", "SUCCEEDED"])
        self.assertEqual({r["task_id"] for r in rows}, {"wt1"})
        self.assertEqual({r["queue"] for r in rows}, {q})
        self.assertEqual(rows[0]["from_state"], "TASK_STATE_UNSPECIFIED")
        self.assertEqual([r["attempt"] for r in rows], [0, 1, 1, 1])
        self.assertEqual(rows[2]["agent_id"], "a1")
        for r in rows:
            harness.unix_time(r["time"])
            self.assertEqual(set(r), {"revision", "task_id", "queue", "from_state", "to_state",
                                      "attempt", "agent_id", "time", "reason", "job_id"})

        # Filters combine: the queue, into SUCCEEDED: both tasks, in order.
        out = self.ok("--json", "watch", f"--after={base}", f"--queue={q}",
                      "--state=Succeeded", "--count=2")
        self.assertEqual([(json.loads(line)["task_id"], state_of(json.loads(line)))
                          for line in out.splitlines()],
                         [("wt1", "SUCCEEDED"), ("wt-other", "SUCCEEDED")])

    def test_watch_after_replays_exactly_what_followed(self):
        q = self.queue
        base = self.probe_revision(q + "-probe")
        self.ok("submit", "-f", "-", "--wait",
                input=json.dumps([self.noop_spec(f"wa{i}") for i in range(3)]))
        out = self.ok("--json", "watch", f"--after={base}", f"--queue={q}", "--count=12")
        events = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(events), 12)
        revisions = [int(e["revision"]) for e in events]
        self.assertEqual(revisions, sorted(set(revisions)))
        # From each revision: exactly the events after it, in order.
        for k in (0, 5, 10):
            with self.subTest(after=revisions[k]):
                out = self.ok("--json", "watch", f"--after={revisions[k]}", f"--queue={q}",
                              f"--count={11 - k}")
                self.assertEqual([json.loads(line) for line in out.splitlines()], events[k + 1:])
        # Per task, its four states in order.
        by_task = collections.defaultdict(list)
        for e in events:
            by_task[e["task_id"]].append(state_of(e))
        self.assertEqual(dict(by_task), {f"wa{i}": ["PENDING", "DISPATCHED", "RUNNING", "SUCCEEDED"]
                                         for i in range(3)})

    def test_watch_live_follows_a_task(self):
        q = self.queue
        watch = Watch(self.cluster, "--json", f"--queue={q}")
        try:
            # Probes until the (live) watch is surely subscribed.
            first = None
            for probe in range(40):
                self.ok("submit", f"--id=wlf-probe-{probe}", f"--queue={q}", "--builtin=noop")
                try:
                    first = json.loads(watch.next_line(timeout=0.5))
                    break
                except TimeoutError:
                    continue
            self.assertIsNotNone(first, "watch printed nothing")
            self.ok("submit", "--id=wlf", f"--queue={q}", "--builtin=sleep", "--", "0.2")
            seen = []
            while "SUCCEEDED" not in seen:
                event = json.loads(watch.next_line())
                if event["task_id"] == "wlf":
                    seen.append(state_of(event))
            self.assertEqual(seen, ["PENDING", "DISPATCHED", "RUNNING", "SUCCEEDED"])
        finally:
            rc, err = watch.interrupt()
        self.assertEqual((rc, err), (0, ""))


class WatchHistoryTest(CliTestCase):
    """watch against a scheduler that keeps 1 s of history, and one that
    restarts under a watch."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(scheduler_flags=["--event_retention=1s"], agents=["h1"])

    def test_pruned_revision_is_out_of_range(self):
        self.ok("submit", "--wait", "--id=old1", f"--queue={self.queue}", "--builtin=noop")
        first = int(json.loads(self.ok("--json", "watch", "--after=0", "--id=old1",
                                       "--count=1"))["revision"])
        # Past the retention, the scheduler prunes (on its tick).
        def pruned():
            res = self.ctl("watch", f"--after={first}", "--count=1", timeout=5)
            return res.returncode == 1 and res
        res = harness.wait_until(lambda: (self.ctl("submit", f"--queue={self.queue}",
                                                   "--builtin=noop"), pruned())[1],
                                 timeout=WAIT, interval=0.5, what="the history to be pruned")
        self.assertEqual(res.stdout, "")
        self.assertRegex(res.stderr, r"^error: OUT_OF_RANGE: ")
        self.assertIn("--after=0", res.stderr)
        self.assertIn("--event_retention", res.stderr)
        # Where to resume comes from the scheduler's metadata: past the
        # revision asked for, and the command it prints works.
        m = re.search(r"resume after revision (\d+) \(what was pruned before it is lost\)",
                      res.stderr)
        self.assertIsNotNone(m, res.stderr)
        self.assertGreaterEqual(int(m.group(1)), first)
        self.assertIn(f"taskgridctl watch --after={m.group(1)}", res.stderr)


class WatchFollowTest(CliTestCase):
    """watch --follow across a scheduler restart."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(agents=["f1"])

    def restart_scheduler(self):
        self.cluster.scheduler.stop()
        self.cluster.start_scheduler()

    def test_follow_survives_a_restart(self):
        q = self.queue
        self.ok("submit", "--wait", "--id=fo1", f"--queue={q}", "--builtin=noop")
        plain = Watch(self.cluster, "--json", f"--queue={q}", "--after=0")
        follow = Watch(self.cluster, "--json", f"--queue={q}", "--after=0", "--follow")
        try:
            for w in (plain, follow):  # the history: fo1's four changes
                got = [json.loads(w.next_line()) for _ in range(4)]
                self.assertEqual([(e["task_id"], state_of(e)) for e in got],
                                 [("fo1", "PENDING"), ("fo1", "DISPATCHED"), ("fo1", "RUNNING"),
                                  ("fo1", "SUCCEEDED")])
            last = int(got[-1]["revision"])
            self.restart_scheduler()
            # Without --follow the watch ends, saying how to resume.
            rc, err = plain.finish()
            self.assertEqual(rc, 1, err)
            self.assertIn(f"taskgridctl watch --after={last} --queue={q} --json", err)
            self.assertIsNone(plain.next_line())
            # With it, the watch goes on: fo2's changes, once each, in order.
            self.ok("submit", "--wait", "--id=fo2", f"--queue={q}", "--builtin=noop")
            got = [json.loads(follow.next_line()) for _ in range(4)]
            self.assertEqual([(e["task_id"], state_of(e)) for e in got],
                             [("fo2", "PENDING"), ("fo2", "DISPATCHED"), ("fo2", "RUNNING"),
                              ("fo2", "SUCCEEDED")])
            revisions = [int(e["revision"]) for e in got]
            self.assertEqual(revisions, sorted(set(revisions)))
            self.assertGreater(revisions[0], last)
            with self.assertRaises(TimeoutError):  # nothing else, nothing twice
                follow.next_line(timeout=1)
        finally:
            plain.close()
            rc, err = follow.interrupt()
        self.assertEqual(rc, 0, err)
        self.assertIn(f"reconnecting after revision {last}", err)

    def test_wait_survives_a_scheduler_restart(self):
        self.ok("submit", "--id=wsr", f"--queue={self.queue}", "--builtin=sleep", "--", "4")
        self.cluster.wait_state("wsr", "RUNNING", timeout=WAIT)
        wait = subprocess.Popen([harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}",
                                 "wait", "wsr"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            time.sleep(0.5)
            self.cluster.scheduler.kill9()
            self.cluster.start_scheduler()
            out, err = wait.communicate(timeout=WAIT)
        finally:
            if wait.poll() is None:
                wait.kill()
                wait.communicate()
        self.assertEqual((wait.returncode, out), (0, "wsr SUCCEEDED\n"), err)
        self.assertIn("note: lost the scheduler while waiting for wsr", err)

    def test_follow_gives_up_without_a_scheduler(self):
        follow = Watch(self.cluster, "--timeout=2s", "--follow")
        try:
            time.sleep(0.5)
            self.cluster.scheduler.stop()
            start = time.monotonic()
            rc, err = follow.finish()
            elapsed = time.monotonic() - start
        finally:
            follow.close()
            self.cluster.start_scheduler()
        self.assertEqual(rc, 1, err)
        self.assertIn("no scheduler at", err)
        self.assertIn("--follow", err)
        self.assertLess(elapsed, 20)


class ClusterTest(CliTestCase):
    """agents and cluster: a1 (3 slots, labels, resources) and a2 (2 slots)."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = harness.Cluster()
        cls.addClassCleanup(cls.cluster.close)
        cls.cluster.start_scheduler()
        cls.cluster.start_agent("a1", slots=3, labels="zone=eu,disk=ssd",
                                extra_flags=["--resources=memory=8GiB,cpu=4"])
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

    def run_on(self, task_id, agent_id, *flags):
        """A 60 s sleep pinned to agent_id, RUNNING when this returns."""
        self.ok("submit", f"--id={task_id}", f"--queue={self.queue}", f"--agents={agent_id}",
                *flags, "--builtin=sleep", "--", "60")
        self.cluster.wait_state(task_id, "RUNNING", timeout=WAIT)

    def test_agents(self):
        agents = self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})
        a1 = agents["a1"]
        self.assertEqual(a1["labels"], {"zone": "eu", "disk": "ssd"})
        self.assertEqual((a1["slots"], a1["slots_used"]), (3, 0))
        self.assertEqual(a1.get("running", []), [])
        self.assertTrue(a1["version"])
        self.assertIn("last_heartbeat_time", a1)
        self.assertEqual(a1["resources"], {"cpu": "4", "memory": "8GiB"})
        self.assertEqual(a1.get("resources_used", {}), {})

        rows = table_rows(self.ok("agents"))
        self.assertEqual(rows[0], ["ID", "STATE", "SLOTS", "RESOURCES", "RUNNING", "LABELS",
                                   "LAST HEARTBEAT", "VERSION", "NOTE"])
        self.assertEqual([r[0] for r in rows[1:]], ["a1", "a2"])  # by id
        self.assertEqual(rows[1][:6], ["a1", "ACTIVE", "0/3", "cpu=0/4,memory=0/8GiB", "0",
                                       "disk=ssd,zone=eu"])
        self.assertRegex(rows[1][6], r"^\d+(\.\d)?s ago$")
        self.assertEqual(rows[1][7:], [a1["version"], "-"])  # nothing to say of it
        self.assertEqual(rows[2][:6], ["a2", "ACTIVE", "0/2", "-", "0", "-"])

        # A running task shows in its agent's slots, resources and RUNNING.
        self.run_on("ag-run", "a1", "--resources=cpu=1500m,memory=1024MiB")
        rows = table_rows(self.ok("agents"))
        self.assertEqual(rows[1][:5], ["a1", "ACTIVE", "1/3", "cpu=1.5/4,memory=1GiB/8GiB", "1"])
        self.assertEqual(rows[2][:5], ["a2", "ACTIVE", "0/2", "-", "0"])
        a1 = self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})["a1"]
        self.assertEqual((a1["slots_used"], a1["running"]), (1, ["ag-run"]))
        self.assertEqual(a1["resources_used"], {"cpu": "1.5", "memory": "1GiB"})
        # Asked as spelled, kept in the one spelling.
        self.assertEqual(self.ok_json("get", "ag-run")["spec"]["placement"]["resources"],
                         {"cpu": "1.5", "memory": "1GiB"})
        self.ok("cancel", "ag-run")
        self.cluster.wait_state("ag-run", "CANCELLED", timeout=WAIT)
        # Its end gives back what it held.
        harness.wait_until(
            lambda: not self.wait_agents({"a1": "ACTIVE", "a2": "ACTIVE"})["a1"].get(
                "resources_used"),
            timeout=WAIT, interval=0.1, what="a1's resources to be free again")

        # More than any agent offers: waits, saying so; nothing bad was stored.
        res = self.ctl("submit", f"--queue={self.queue}", "--resources=gpu=0", "--", "/bin/true")
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("gpu", res.stderr)
        self.ok("submit", "--id=ag-big", f"--queue={self.queue}", "--resources=cpu=6",
                "--builtin=noop")
        self.assertEqual(self.ok_json("get", "ag-big")["reason"],
                         "waiting: needs cpu=6; the largest agent has cpu=4")
        self.ok("cancel", "ag-big")

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
        self.assertRegex(out, r"(?m)^Resources used:\s+cpu=0/4,memory=0/8GiB$")
        self.assertRegex(out, r"(?m)^Stale messages:\s+0$")
        self.assertRegex(out, r"(?m)^Heartbeat every:\s+1s$")
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
        self.assertEqual(rows[1][:5], ["d1", "DRAINING", "1/2", "-", "1"])
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
