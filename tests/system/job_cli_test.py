"""System test of `taskgridctl job ...` (and list/watch --job) against the
real scheduler and agent.

Each class starts its own cluster (scheduler, maybe agents) in a temporary
directory and closes it at the end; every wait is bounded. Task ids are
global in a scheduler, so every job of a class uses its own task ids.

Run through ctest (system.job_cli), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 60.0
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DIAMOND = os.path.join(REPO, "examples", "jobs", "diamond.json")
# The exit codes of taskgridctl (tools/ctl/client.h).
EXIT_RPC_FAILED = 1
EXIT_USAGE = 2
EXIT_FAILED = 3  # the job (or a task) ended FAILED or CANCELLED
EXIT_WAIT_TIMED_OUT = 4
# "JOB STATE  N tasks: COUNTS", the line of job submit, cancel and retry.
SUMMARY = re.compile(r"^(\S+) ([A-Z]+)  (\d+) tasks?: (.*)$")


def noop(task_id, *depends_on, **extra):
    spec = {"id": task_id, "steps": [{"builtin": {"name": "noop"}}]}
    if depends_on:
        spec["depends_on"] = list(depends_on)
    spec.update(extra)
    return spec


def sh(task_id, script, *depends_on, **extra):
    spec = {"id": task_id, "steps": [{"exec": {"argv": ["sh", "-c", script]}}]}
    if depends_on:
        spec["depends_on"] = list(depends_on)
    spec.update(extra)
    return spec


def tree_rows(stdout):
    """The task tree of `job get` as a list of dicts: state, id, depth,
    attempt, agent, note (columns found by the header's offsets)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("STATE  "))
    header = lines[start]
    cols = [header.index(name) for name in ("TASK", "ATTEMPT", "AGENT", "NOTE")]
    rows = []
    for line in lines[start + 1:]:
        line = line.ljust(cols[-1])
        cell = line[cols[0]:cols[1]].rstrip()
        m = re.fullmatch(r"( *)(?:\[(\d+)\] )?(\S+)", cell)
        assert m, f"bad tree cell {cell!r} in {line!r}"
        rows.append({
            "state": line[:cols[0]].strip(),
            "id": m.group(3),
            "indent": len(m.group(1)),
            "depth": int(m.group(2)) if m.group(2) else len(m.group(1)) // 2,
            "attempt": line[cols[1]:cols[2]].strip(),
            "agent": line[cols[2]:cols[3]].strip(),
            "note": line[cols[3]:].strip(),
        })
    return rows


def summary(line):
    m = SUMMARY.match(line)
    assert m, f"not a job summary line: {line!r}"
    return {"id": m.group(1), "state": m.group(2), "tasks": int(m.group(3)),
            "counts": m.group(4)}


class JobCliTestCase(unittest.TestCase):
    cluster = None

    @classmethod
    def start_cluster(cls, scheduler_flags=(), agents=()):
        cls.cluster = harness.start_class_cluster(cls, scheduler_flags, agents, slots=4)

    def ctl(self, *args, **kw):
        kw.setdefault("timeout", WAIT)
        return self.cluster.ctl(*args, **kw)

    def run_ok(self, code, *args, **kw):
        """Runs taskgridctl, asserts exit `code`; returns CompletedProcess."""
        res = self.ctl(*args, **kw)
        self.assertEqual(res.returncode, code, self.describe(args, res))
        return res

    def ok(self, *args, **kw):
        return self.run_ok(0, *args, **kw).stdout

    def describe(self, args, res):
        log = self.cluster.scheduler.log()[-3000:] if self.cluster.scheduler else ""
        return (f"taskgridctl {' '.join(map(str, args))} exited {res.returncode}\n"
                f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}\nscheduler log tail:\n{log}")

    def job_file(self, job):
        """Writes `job` (a dict, or text as is) to a file; returns its path."""
        fd, path = tempfile.mkstemp(suffix=".json", dir=self.cluster.dir)
        with os.fdopen(fd, "w") as f:
            f.write(job if isinstance(job, str) else json.dumps(job))
        return path

    def job_json(self, job_id):
        """`job get --json`: (Job, [Task]) from its JSON lines."""
        lines = self.ok("--json", "job", "get", job_id).splitlines()
        return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]

    def wait_job(self, job_id, states, timeout=WAIT):
        states = {states} if isinstance(states, str) else set(states)
        last = {}

        def done():
            nonlocal last
            last = self.job_json(job_id)[0]
            return last["state"].replace("JOB_STATE_", "") in states
        try:
            harness.wait_until(done, timeout=timeout, interval=0.1,
                               what=f"job {job_id} to reach {sorted(states)}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last seen: {json.dumps(last)}") from None
        return last

    def task_stdout(self, task_id):
        task = self.cluster.task(task_id)
        return base64.b64decode(task.get("result", {}).get("stdout_tail", "")).decode()


class JobRunTest(JobCliTestCase):
    """One scheduler and agent a1: jobs run to their end."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(agents=["a1"])

    def test_diamond_example_succeeds_and_shows_as_tree(self):
        res = self.run_ok(0, "job", "submit", DIAMOND, "--wait", "--wait_timeout=60s")
        lines = res.stdout.splitlines()
        first, final = summary(lines[0]), summary(lines[-1])
        self.assertEqual(first["id"], "diamond")
        self.assertEqual(first["tasks"], 5)
        self.assertEqual((final["id"], final["state"], final["counts"]),
                         ("diamond", "SUCCEEDED", "SUCCEEDED 5"), res.stdout)

        out = self.ok("job", "get", "diamond")
        self.assertRegex(out, r"(?m)^Job:\s+diamond$")
        self.assertRegex(out, r"(?m)^State:\s+SUCCEEDED$")
        self.assertRegex(out, r"(?m)^Tasks:\s+5 \(SUCCEEDED 5\)$")
        rows = tree_rows(out)
        self.assertEqual([(r["id"], r["depth"]) for r in rows],
                         [("diamond-fetch", 0), ("diamond-double", 1), ("diamond-report", 2),
                          ("diamond-publish", 3), ("diamond-square", 1)], out)
        for r in rows:
            self.assertEqual(r["state"], "SUCCEEDED", out)
            self.assertEqual(r["agent"], "a1", out)
            self.assertRegex(r["attempt"], r"^1/\d+$", out)
        # The sink of the diamond: printed once, under its first dependency.
        report = [r for r in rows if r["id"] == "diamond-report"]
        self.assertEqual(len(report), 1, out)
        self.assertEqual(report[0]["note"], "(also after: diamond-square)", out)
        self.assertEqual(out.count("diamond-report"), 1, out)
        self.assertEqual(out.count("diamond-square"), 2, out)  # its row, report's note

        # The data went downstream (from the agent's inputs, or the fallback).
        self.assertIn("double=42 square=441 sum=483", self.task_stdout("diamond-report"))

        job, tasks = self.job_json("diamond")
        self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(job["task_count"], 5)
        self.assertEqual([t["spec"]["id"] for t in tasks],
                         ["diamond-fetch", "diamond-double", "diamond-square", "diamond-report",
                          "diamond-publish"])
        self.assertTrue(all(t["spec"]["job_id"] == "diamond" for t in tasks))

        # The same job again is the same job (safe to retry), not a new one.
        again = summary(self.ok("job", "submit", DIAMOND).strip())
        self.assertEqual((again["id"], again["state"]), ("diamond", "SUCCEEDED"))

    def test_failed_task_cancels_descendants_then_retry_succeeds(self):
        marker = os.path.join(self.cluster.dir, "fail-marker")
        path = self.job_file({"job_id": "fj", "tasks": [
            noop("fj-root"),
            sh("fj-mid", f"test -e {marker}", "fj-root", max_attempts=1),
            noop("fj-child", "fj-mid"),
            noop("fj-grandchild", "fj-child"),
            noop("fj-side", "fj-root"),
        ]})
        res = self.run_ok(EXIT_FAILED, "job", "submit", path, "--wait", "--wait_timeout=60s")
        final = summary(res.stdout.splitlines()[-1])
        self.assertEqual(final["state"], "FAILED", res.stdout)
        self.assertEqual(final["counts"], "SUCCEEDED 2, FAILED 1, CANCELLED 2", res.stdout)

        out = self.ok("job", "get", "fj")
        rows = {r["id"]: r for r in tree_rows(out)}
        self.assertEqual({i: r["state"] for i, r in rows.items()},
                         {"fj-root": "SUCCEEDED", "fj-mid": "FAILED", "fj-child": "CANCELLED",
                          "fj-grandchild": "CANCELLED", "fj-side": "SUCCEEDED"}, out)
        self.assertEqual(rows["fj-child"]["note"], "upstream task fj-mid failed", out)
        # Further down, the reason names the task above, cancelled in turn.
        self.assertEqual(rows["fj-grandchild"]["note"], "upstream task fj-child was cancelled",
                         out)
        self.assertNotEqual(rows["fj-mid"]["note"], "", out)  # why it failed
        self.assertEqual(rows["fj-side"]["note"], "", out)

        # Fixed (the marker exists): retry runs the failed task and the ones
        # it cancelled; the job ends SUCCEEDED.
        with open(marker, "w"):
            pass
        retried = summary(self.ok("job", "retry", "fj").strip())
        self.assertEqual(retried["id"], "fj")
        self.assertNotIn("FAILED", retried["counts"])
        self.wait_job("fj", "SUCCEEDED")
        rows = {r["id"]: r for r in tree_rows(self.ok("job", "get", "fj"))}
        self.assertTrue(all(r["state"] == "SUCCEEDED" for r in rows.values()), rows)
        # A job retry starts the budget over (1 used) while the attempt
        # number goes on (2): a result of attempt 1 can never be taken for 2.
        self.assertRegex(rows["fj-mid"]["attempt"], r"^1/")
        lines = self.ok("--json", "job", "get", "fj").splitlines()
        docs = [json.loads(line) for line in lines]  # JSON lines: the job, then its tasks
        self.assertEqual(docs[0]["id"], "fj")
        mid = next(d for d in docs[1:] if d["spec"]["id"] == "fj-mid")
        self.assertEqual((mid["attempt"], mid["attempts_used"]), (2, 1), mid)
        # Nothing left to retry: the scheduler says so.
        res = self.run_ok(EXIT_RPC_FAILED, "job", "retry", "fj")
        self.assertIn("FAILED_PRECONDITION", res.stderr)
        self.assertIn("fj", res.stderr)

    def test_cancel_ends_job_and_concurrent_wait(self):
        path = self.job_file({"job_id": "cj", "tasks": [
            {"id": "cj-sleep", "steps": [{"builtin": {"name": "sleep", "args": ["300"]}}]},
            noop("cj-after", "cj-sleep"),
            noop("cj-last", "cj-after"),
        ]})
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}", "job", "submit",
                path, "--wait"]
        waiter = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, text=True)
        try:
            self.cluster.wait_state("cj-sleep", "RUNNING", timeout=WAIT)
            cancelled = summary(self.ok("job", "cancel", "cj").strip())
            self.assertEqual(cancelled["id"], "cj")
            out, err = waiter.communicate(timeout=WAIT)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.communicate(timeout=WAIT)
        self.assertEqual(waiter.returncode, EXIT_FAILED, f"stdout:\n{out}\nstderr:\n{err}")
        final = summary(out.splitlines()[-1])
        self.assertEqual((final["state"], final["counts"]), ("CANCELLED", "CANCELLED 3"), out)
        rows = tree_rows(self.ok("job", "get", "cj"))
        self.assertEqual([(r["id"], r["state"]) for r in rows],
                         [("cj-sleep", "CANCELLED"), ("cj-after", "CANCELLED"),
                          ("cj-last", "CANCELLED")])
        # Cancelling again is fine; retrying is refused (nothing FAILED).
        self.assertEqual(summary(self.ok("job", "cancel", "cj").strip())["state"], "CANCELLED")
        self.assertIn("FAILED_PRECONDITION",
                      self.run_ok(EXIT_RPC_FAILED, "job", "retry", "cj").stderr)

    def test_wait_timeout_leaves_job_running(self):
        path = self.job_file({"job_id": "tj", "tasks": [
            {"id": "tj-sleep", "steps": [{"builtin": {"name": "sleep", "args": ["300"]}}]}]})
        res = self.run_ok(EXIT_WAIT_TIMED_OUT, "job", "submit", path, "--wait",
                          "--wait_timeout=1s")
        self.assertEqual(summary(res.stdout.splitlines()[-1])["state"], "RUNNING")
        self.assertIn("--wait_timeout", res.stderr)
        self.ok("job", "cancel", "tj")
        self.wait_job("tj", "CANCELLED")

    def test_submit_from_stdin_with_id_and_json(self):
        text = json.dumps({"job_id": "ignored", "tasks": [noop("sj-a"), noop("sj-b", "sj-a")]})
        out = self.ok("--json", "job", "submit", "-", "--id=sj", "--wait", input=text)
        job = json.loads(out)
        self.assertEqual((job["id"], job["state"], job["task_count"]),
                         ("sj", "JOB_STATE_SUCCEEDED", 2))
        self.assertEqual(self.cluster.task("sj-b")["spec"]["job_id"], "sj")
        self.assertIn("does not exist", self.run_ok(EXIT_RPC_FAILED, "job", "get",
                                                    "ignored").stderr)
        # A job may wait for a task of another job: drawn as a root here.
        text = json.dumps({"tasks": [noop("sj2-a", "sj-b"), noop("sj2-b", "sj2-a", "sj-a")]})
        job = json.loads(self.ok("--json", "job", "submit", "-", "--wait", input=text))
        self.assertEqual(job["state"], "JOB_STATE_SUCCEEDED")
        self.assertNotEqual(job["id"], "")  # generated
        rows = tree_rows(self.ok("job", "get", job["id"]))
        self.assertEqual([(r["id"], r["depth"], r["note"]) for r in rows],
                         [("sj2-a", 0, "(after: sj-b)"), ("sj2-b", 1, "(also after: sj-a)")])

    def test_task_inputs_pass_downstream(self):
        # A result file wins over stdout; stdout is the output without one.
        path = self.job_file({"job_id": "io", "tasks": [
            sh("io-file", 'printf alpha-7 > "$TASKGRID_OUTPUT"; echo not-this'),
            sh("io-stdout", "echo beta-9"),
            sh("io-join", 'printf "%s+%s" "$(cat "$TASKGRID_INPUTS_DIR/io-file")" '
                          '"$(cat "$TASKGRID_INPUTS_DIR/io-stdout")"', "io-file", "io-stdout"),
        ]})
        self.run_ok(0, "job", "submit", path, "--wait", "--wait_timeout=60s")
        self.assertEqual(self.task_stdout("io-join"), "alpha-7+beta-9")


class JobListTest(JobCliTestCase):
    """A fresh scheduler and agent a1: one job in each state, then the filters."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(agents=["a1"])

    def test_job_list_and_task_filters(self):
        def submit(code, job, *flags):
            self.run_ok(code, "job", "submit", self.job_file(job), *flags)
        submit(0, {"job_id": "l-ok", "tasks": [noop("lo-1"), noop("lo-2", "lo-1")]}, "--wait")
        submit(EXIT_FAILED, {"job_id": "l-bad", "tasks": [
            {"id": "lb-1", "max_attempts": 1, "steps": [{"builtin": {"name": "fail"}}]},
            noop("lb-2", "lb-1")]}, "--wait")
        # No agent has the label: PENDING, and the job RUNNING, for good.
        held = {"required_labels": {"gpu": "1"}}
        submit(0, {"job_id": "l-run", "tasks": [noop("lr-1", placement=held),
                                                noop("lr-2", "lr-1")]})
        submit(0, {"job_id": "l-stop", "tasks": [noop("ls-1", placement=held)]})
        self.ok("job", "cancel", "l-stop")

        def listed(*flags):
            rows = [re.split(r"\s{2,}", line.strip())
                    for line in self.ok("job", "list", *flags).splitlines()]
            self.assertEqual(rows[0][:4], ["ID", "STATE", "TASKS", "COUNTS"])
            return [(r[0], r[1]) for r in rows[1:]]
        self.assertEqual(listed(), [("l-ok", "SUCCEEDED"), ("l-bad", "FAILED"),
                                    ("l-run", "RUNNING"), ("l-stop", "CANCELLED")])
        self.assertEqual(listed("--state=running"), [("l-run", "RUNNING")])
        self.assertEqual(listed("--state=FAILED,cancelled"),
                         [("l-bad", "FAILED"), ("l-stop", "CANCELLED")])
        self.assertIn("BLOCKED 1, PENDING 1", self.ok("job", "list", "--state=running"))
        got = json.loads(self.ok("--json", "job", "list", "--state=succeeded"))
        self.assertEqual([j["id"] for j in got["jobs"]], ["l-ok"])
        # Paging: one job per page, every page with --all.
        res = self.run_ok(0, "job", "list", "--page_size=1")
        self.assertIn("more: --page_token=", res.stderr)
        self.assertEqual(len(res.stdout.splitlines()), 2)
        got = json.loads(self.ok("--json", "job", "list", "--page_size=1", "--all"))
        self.assertEqual(len(got["jobs"]), 4)
        self.assertIn("unknown job state", self.run_ok(EXIT_USAGE, "job", "list",
                                                       "--state=blocked").stderr)

        # list --job: only that job's tasks, in submit order; with --state too.
        def task_ids(*flags):
            got = json.loads(self.ok("--json", "list", "--all", *flags))
            return [t["spec"]["id"] for t in got.get("tasks", [])]
        self.assertEqual(task_ids("--job=l-ok"), ["lo-1", "lo-2"])
        self.assertEqual(task_ids("--job=l-bad"), ["lb-1", "lb-2"])
        self.assertEqual(task_ids("--job=l-run", "--state=blocked"), ["lr-2"])
        self.assertEqual(task_ids("--job=nope"), [])
        rows = self.ok("list", "--job", "l-run").splitlines()
        self.assertEqual([r.split()[0] for r in rows[1:]], ["lr-1", "lr-2"])

        # watch --job: the kept history of that job's tasks only.
        out = self.ok("--json", "watch", "--job=l-bad", "--after=0", "--count=3")
        events = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(events), 3)
        self.assertTrue(all(e["job_id"] == "l-bad" for e in events), events)
        self.assertTrue({e["task_id"] for e in events} <= {"lb-1", "lb-2"}, events)
        out = self.ok("watch", "--job=l-ok", "--after=0", "--state=succeeded", "--count=2")
        self.assertEqual([line.split()[2] for line in out.splitlines()], ["lo-1", "lo-2"])


class JobBadInputTest(JobCliTestCase):
    """A scheduler with no agent: what is refused creates nothing."""

    @classmethod
    def setUpClass(cls):
        cls.start_cluster()

    def test_bad_jobs_are_refused_and_create_nothing(self):
        # Not JSON: the file and the place are named; nothing is sent.
        path = self.job_file('{"job_id": "b1",\n "tasks": [{"id": "x" "steps": []}]}')
        err = self.run_ok(EXIT_USAGE, "job", "submit", path).stderr
        self.assertIn(path, err)
        self.assertIn("invalid JSON", err)
        self.assertIn("line 2", err)
        self.assertIn("Nothing was submitted", err)
        err = self.run_ok(EXIT_USAGE, "job", "submit", "-", input="[1, 2").stderr
        self.assertIn("<stdin>: invalid JSON", err)
        # JSON, but not a job: the field is named.
        err = self.run_ok(EXIT_USAGE, "job", "submit", self.job_file(
            {"job_id": "b2", "tasks": [noop("b2-a"), {"id": "b2-b", "stepz": []}]})).stderr
        self.assertIn("tasks[1]", err)
        self.assertIn("stepz", err)
        err = self.run_ok(EXIT_USAGE, "job", "submit", self.job_file(
            {"job": "b3", "tasks": [noop("b3-a")]})).stderr
        self.assertIn('unknown field "job"', err)
        err = self.run_ok(EXIT_USAGE, "job", "submit", self.job_file(
            {"job_id": "b4", "tasks": []})).stderr
        self.assertIn("empty", err)
        err = self.run_ok(EXIT_USAGE, "job", "submit",
                          os.path.join(self.cluster.dir, "missing.json")).stderr
        self.assertIn("missing.json", err)
        # The scheduler refuses: a cycle (its tasks named), an unknown
        # dependency, a repeated task id.
        err = self.run_ok(EXIT_RPC_FAILED, "job", "submit", self.job_file(
            {"job_id": "b5", "tasks": [noop("b5-a", "b5-c"), noop("b5-b", "b5-a"),
                                       noop("b5-c", "b5-b"), noop("b5-d")]})).stderr
        self.assertIn("INVALID_ARGUMENT", err)
        self.assertIn("cycle", err)
        for task_id in ("b5-a", "b5-b", "b5-c"):
            self.assertIn(task_id, err)
        err = self.run_ok(EXIT_RPC_FAILED, "job", "submit", self.job_file(
            {"job_id": "b6", "tasks": [noop("b6-a"), noop("b6-b", "b6-nope")]})).stderr
        self.assertIn("INVALID_ARGUMENT", err)
        self.assertIn("b6-nope", err)
        err = self.run_ok(EXIT_RPC_FAILED, "job", "submit", self.job_file(
            {"job_id": "b7", "tasks": [noop("b7-a"), noop("b7-a")]})).stderr
        self.assertIn("repeats", err)
        err = self.run_ok(EXIT_RPC_FAILED, "job", "submit", self.job_file(
            {"job_id": "bad id!", "tasks": [noop("b8-a")]})).stderr
        self.assertIn("job_id", err)

        # Nothing was created.
        self.assertEqual(self.ok("job", "list").splitlines(),
                         ["ID  STATE  TASKS  COUNTS  CREATED  UPDATED"])
        self.assertEqual(json.loads(self.ok("--json", "list", "--all")).get("tasks", []), [])
        self.assertIn('NOT_FOUND: job "b5" does not exist',
                      self.run_ok(EXIT_RPC_FAILED, "job", "get", "b5").stderr)

    def test_usage_errors(self):
        self.assertIn("job needs a command", self.run_ok(EXIT_USAGE, "job").stderr)
        self.assertIn('unknown command "job frob"', self.run_ok(EXIT_USAGE, "job", "frob").stderr)
        self.assertIn("needs a FILE", self.run_ok(EXIT_USAGE, "job", "submit").stderr)
        self.assertIn("needs a job ID", self.run_ok(EXIT_USAGE, "job", "get").stderr)
        self.assertIn("takes one job ID", self.run_ok(EXIT_USAGE, "job", "cancel", "a", "b").stderr)
        self.assertIn("--queue does not apply to job submit",
                      self.run_ok(EXIT_USAGE, "job", "submit", "f.json", "--queue=q").stderr)
        self.assertIn("--wait_timeout needs --wait",
                      self.run_ok(EXIT_USAGE, "job", "submit", "f.json",
                                  "--wait_timeout=1s").stderr)
        self.assertIn("--job does not apply to get",
                      self.run_ok(EXIT_USAGE, "get", "x", "--job=j").stderr)
        self.run_ok(EXIT_USAGE, "job", "retry", "j", "--", "x")

    def test_help_lists_the_job_commands(self):
        usage = self.ok("help")
        for command in ("job submit", "job get", "job list", "job cancel", "job retry"):
            self.assertRegex(usage, rf"(?m)^  {command}\b")
            self.assertRegex(usage, rf"(?m)^\s+\$ taskgridctl {command}\b")
            own = self.ok("help", *command.split())
            self.assertRegex(own, rf"(?m)^  \$ taskgridctl {command}\b")
            self.assertEqual(self.ok(*command.split(), "--help"), own)
        self.assertRegex(usage, r"job submit --wait: 3 the job FAILED")
        overview = self.ok("help", "job")
        self.assertEqual(self.ok("job", "--help"), overview)
        self.assertIn("list --job=JOB", overview)
        for word in ("depends_on", "--wait_timeout", "--id=JOB", "exit 2"):
            self.assertIn(word, self.ok("help", "job", "submit"))
        self.assertIn("--job=JOB", self.ok("help", "list"))
        self.assertIn("--job=JOB", self.ok("help", "watch"))


class JobDeepChainTest(JobCliTestCase):
    """A chain of 100,000 tasks (no agent): job get stays flat and complete."""

    LENGTH = 100_000

    @classmethod
    def setUpClass(cls):
        cls.start_cluster(scheduler_flags=[f"--max_job_tasks={cls.LENGTH}"])

    def test_long_chain_tree_is_capped(self):
        tasks = [noop("c0")] + [noop(f"c{i}", f"c{i - 1}") for i in range(1, self.LENGTH)]
        path = self.job_file({"job_id": "chain", "tasks": tasks})
        # One call carries 100,000 tasks: under the sanitizers, with builds
        # beside it, that takes longer than taskgridctl's default deadline
        # (30 s), so each call gets the bound the process has.
        deadline = "--timeout=110s"
        first = summary(self.ok(deadline, "job", "submit", path, timeout=120).strip())
        self.assertEqual((first["id"], first["tasks"]), ("chain", self.LENGTH))
        out = self.ok(deadline, "job", "get", "chain", timeout=120)
        rows = tree_rows(out)
        self.assertEqual(len(rows), self.LENGTH)
        self.assertEqual([r["id"] for r in rows[:3]], ["c0", "c1", "c2"])
        self.assertEqual((rows[0]["state"], rows[1]["state"]), ("PENDING", "BLOCKED"))
        for i in (0, 1, 19, 20, 21, 500, self.LENGTH - 1):
            self.assertEqual((rows[i]["id"], rows[i]["depth"]), (f"c{i}", i))
            self.assertEqual(rows[i]["indent"], 2 * min(i, 20))
        self.assertIn(f"[{self.LENGTH - 1}] c{self.LENGTH - 1}", out.splitlines()[-1])
        self.ok(deadline, "job", "cancel", "chain", timeout=120)


if __name__ == "__main__":
    unittest.main()
