"""System test of server reflection and health: `buf curl` (the grpcurl
stand-in, npm @bufbuild/buf) against the real scheduler, with no .proto file:
every schema comes from the scheduler's reflection service.

buf is not installed here: TASKGRID_BUF names the binary (deploy/install-buf.sh
puts it at .taskgrid/npm/node_modules/.bin/buf; ctest sets TASKGRID_BUF).
Without TASKGRID_BUF the tests are skipped; a TASKGRID_BUF that names no
executable fails them.

Run through ctest (system.reflection), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT, TASKGRID_CTL and TASKGRID_BUF set.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0
CALL_TIMEOUT = 30.0   # each buf process

METHODS = {
    "taskgrid.v1.TaskService": ["SubmitTasks", "GetTask", "ListTasks", "CancelTask", "RetryTask",
                                "ResetTask", "PauseTask", "ResumeTask", "GetQueueStats",
                                "WaitTask", "WatchTasks", "StreamTaskOutput", "DeleteByMergeKey",
                                "PauseQueue", "ResumeQueue", "SetQueueLimits", "CancelTasks",
                                "RetryTasks", "DeleteTask", "DeleteTasks", "SetQueueRetention",
                                "SetQueueWeight"],
    "taskgrid.v1.AgentService": ["Connect"],
    "taskgrid.v1.ClusterService": ["ListAgents", "DrainAgent", "UndrainAgent", "GetClusterStats"],
    "taskgrid.v1.ScheduleService": ["CreateSchedule", "GetSchedule", "ListSchedules",
                                    "PauseSchedule", "ResumeSchedule", "DeleteSchedule"],
    "taskgrid.v1.JobService": ["SubmitJob", "GetJob", "ListJobs", "CancelJob", "RetryJob",
                               "DeleteJob"],
    "taskgrid.v1.BoardService": ["Claim", "ExtendClaim", "CompleteClaim", "AbandonClaim",
                                 "TrashClaim", "RestoreTask", "WaitForWork"],
    "grpc.health.v1.Health": ["Check", "Watch"],
}

# buf curl exits with the gRPC code shifted left by 3 when the RPC fails.
CANCELLED = 1 << 3
INVALID_ARGUMENT = 3 << 3
DEADLINE_EXCEEDED = 4 << 3
NOT_FOUND = 5 << 3
ABORTED = 10 << 3


def json_stream(text):
    """The JSON documents printed one after another (a streaming response)."""
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return docs
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)


class ReflectionTest(unittest.TestCase):
    cluster = None

    @classmethod
    def setUpClass(cls):
        buf = os.environ.get("TASKGRID_BUF")
        if not buf:
            raise unittest.SkipTest(
                "TASKGRID_BUF is not set: run deploy/install-buf.sh and set "
                "TASKGRID_BUF=$PWD/.taskgrid/npm/node_modules/.bin/buf")
        if not (os.path.isfile(buf) and os.access(buf, os.X_OK)):
            raise AssertionError(f"TASKGRID_BUF={buf} is not an executable (deploy/install-buf.sh)")
        cls.buf = buf
        cls.tmp = tempfile.mkdtemp(prefix="taskgrid-reflection-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        # buf keeps a cache; keep it out of $HOME.
        cls.env = dict(os.environ, BUF_CACHE_DIR=os.path.join(cls.tmp, "buf-cache"))
        cls.cluster = harness.Cluster()
        cls.addClassCleanup(cls.cluster.close)
        cls.cluster.start_scheduler()
        cls.cluster.start_agent("a1", slots=2)
        cls.url = f"http://{cls.cluster.addr}"

    def curl(self, *args, data=None):
        """Runs `buf curl --protocol grpc --http2-prior-knowledge ARGS`."""
        argv = [self.buf, "curl", "--protocol", "grpc", "--http2-prior-knowledge"]
        if data is not None:
            argv += ["-d", data if isinstance(data, str) else json.dumps(data)]
        argv += list(args)
        return subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT,
                              env=self.env, stdin=subprocess.DEVNULL)

    def call(self, method, data=None, *args):
        """A unary call that must succeed; returns the response as a dict."""
        res = self.curl(*args, f"{self.url}/{method}", data=data)
        self.assertEqual(res.returncode, 0, f"{method}: {res.stdout}{res.stderr}")
        return json.loads(res.stdout)

    def error(self, method, data, exit_code):
        """A unary call that must fail with exit_code; returns the error JSON."""
        res = self.curl(f"{self.url}/{method}", data=data)
        self.assertEqual(res.returncode, exit_code, f"{method}: {res.stdout}{res.stderr}")
        self.assertEqual(res.stdout, "")
        return json.loads(res.stderr)

    def wait_succeeded(self, task_id):
        last = {}

        def done():
            nonlocal last
            last = self.call("taskgrid.v1.TaskService/GetTask", {"id": task_id})
            return last.get("state") == "TASK_STATE_SUCCEEDED" and last
        try:
            return harness.wait_until(done, timeout=WAIT, interval=0.2,
                                      what=f"{task_id} to succeed")
        except TimeoutError as e:
            raise AssertionError(f"{e}; last: {last}") from None

    def test_list_services_and_methods(self):
        res = self.curl("--list-services", self.url)
        self.assertEqual(res.returncode, 0, res.stderr)
        services = res.stdout.split()
        for service in list(METHODS) + ["grpc.reflection.v1alpha.ServerReflection"]:
            self.assertIn(service, services)

        res = self.curl("--list-methods", self.url)
        self.assertEqual(res.returncode, 0, res.stderr)
        methods = set(res.stdout.split())
        for service, names in METHODS.items():
            for name in names:
                self.assertIn(f"{service}/{name}", methods)
        listed = {m for m in methods if m.startswith("taskgrid.v1.TaskService/")}
        self.assertEqual(len(listed), len(METHODS["taskgrid.v1.TaskService"]), sorted(listed))

    def test_health_check_through_reflection(self):
        # The schema of grpc.health.v1.Health comes from reflection (its
        # descriptors are linked into the scheduler); no --schema.
        self.assertEqual(self.call("grpc.health.v1.Health/Check"), {"status": "SERVING"})
        self.assertEqual(self.call("grpc.health.v1.Health/Check", {"service": ""}),
                         {"status": "SERVING"})

    def test_submit_get_list_with_json(self):
        spec = {"id": "from-buf", "queue": "buf",
                "steps": [{"builtin": {"name": "echo", "args": ["hi from buf"]}}]}
        out = self.call("taskgrid.v1.TaskService/SubmitTasks", {"tasks": [spec]})
        self.assertEqual(len(out["tasks"]), 1)
        self.assertEqual(out["tasks"][0]["spec"]["id"], "from-buf")
        self.assertEqual(out["tasks"][0]["spec"]["queue"], "buf")
        self.assertIn(out["tasks"][0]["state"], {"TASK_STATE_PENDING", "TASK_STATE_DISPATCHED",
                                                 "TASK_STATE_RUNNING", "TASK_STATE_SUCCEEDED"})
        # The same submit again returns the existing task (same spec).
        again = self.call("taskgrid.v1.TaskService/SubmitTasks", {"tasks": [spec]})
        self.assertEqual(again["tasks"][0]["createTime"], out["tasks"][0]["createTime"])

        task = self.wait_succeeded("from-buf")
        self.assertEqual(task["result"]["outcome"], "OUTCOME_SUCCEEDED")
        self.assertEqual(base64.b64decode(task["result"]["stdoutTail"]), b"hi from buf\n")
        self.assertEqual(task["attempts"][-1]["agentId"], "a1")

        listed = self.call("taskgrid.v1.TaskService/ListTasks", {"queue": "buf"})
        self.assertEqual([t["spec"]["id"] for t in listed["tasks"]], ["from-buf"])
        listed = self.call("taskgrid.v1.TaskService/ListTasks",
                           {"queue": "buf", "states": ["TASK_STATE_PENDING"]})
        self.assertEqual(listed, {})
        stats = self.call("taskgrid.v1.TaskService/GetQueueStats", {"queue": "buf"})
        self.assertEqual(stats["queues"][0]["counts"], {"SUCCEEDED": "1"})
        agents = self.call("taskgrid.v1.ClusterService/ListAgents")
        self.assertEqual([a["id"] for a in agents["agents"]], ["a1"])

    def test_job_with_json(self):
        job = {"jobId": "buf-job", "tasks": [
            {"id": "buf-up", "queue": "bufjob",
             "steps": [{"builtin": {"name": "echo", "args": ["up"]}}]},
            {"id": "buf-down", "queue": "bufjob", "dependsOn": ["buf-up"],
             "steps": [{"builtin": {"name": "noop"}}]}]}
        out = self.call("taskgrid.v1.JobService/SubmitJob", job)
        self.assertEqual(out["id"], "buf-job")
        self.assertEqual(out["taskCount"], 2)
        self.wait_succeeded("buf-down")
        got = self.call("taskgrid.v1.JobService/GetJob", {"id": "buf-job"})
        self.assertEqual(got["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(got["counts"], {"SUCCEEDED": "2"})
        listed = self.call("taskgrid.v1.TaskService/ListTasks", {"jobId": "buf-job"})
        self.assertEqual([t["spec"]["id"] for t in listed["tasks"]], ["buf-up", "buf-down"])
        err = self.error("taskgrid.v1.JobService/SubmitJob",
                         {"jobId": "bad", "tasks": [{"id": "x", "dependsOn": ["x"],
                                                     "steps": [{"builtin": {"name": "noop"}}]}]},
                         INVALID_ARGUMENT)
        self.assertIn("depends_on[0]", err["message"])

    def test_board_with_json(self):
        # Labels the cluster's agent lacks: the task waits on the board.
        self.call("taskgrid.v1.TaskService/SubmitTasks", {"tasks": [
            {"id": "pulled", "queue": "pull", "placement": {"requiredLabels": {"pull": "1"}},
             "payload": base64.b64encode(b"in").decode(),
             "steps": [{"builtin": {"name": "noop"}}]}]})
        ready = self.call("taskgrid.v1.BoardService/WaitForWork",
                          {"queue": "pull", "labels": {"pull": "1"}, "timeout": "10s"},
                          "--timeout", "15s")
        self.assertEqual(ready, {"ready": "1"})
        claimed = self.call("taskgrid.v1.BoardService/Claim",
                            {"queue": "pull", "owner": "py-7", "lease": "30s",
                             "labels": {"pull": "1"}})
        self.assertEqual(len(claimed["claims"]), 1)
        a = claimed["claims"][0]["assignment"]
        self.assertEqual((a["taskId"], a["attempt"]), ("pulled", 1))
        self.assertEqual(base64.b64decode(a["payload"]), b"in")
        self.assertIn("expireTime", claimed["claims"][0])
        ref = {"taskId": "pulled", "attempt": 1, "owner": "py-7"}
        ext = self.call("taskgrid.v1.BoardService/ExtendClaim", {"claim": ref, "lease": "60s"})
        self.assertIn("expireTime", ext)
        wrong = dict(ref, owner="someone-else")
        err = self.error("taskgrid.v1.BoardService/CompleteClaim",
                         {"claim": wrong, "result": {"outcome": "OUTCOME_SUCCEEDED"}}, ABORTED)
        self.assertIn("not live", err["message"])
        done = self.call("taskgrid.v1.BoardService/CompleteClaim",
                         {"claim": ref, "result": {"outcome": "OUTCOME_SUCCEEDED",
                                                   "stdoutTail": base64.b64encode(b"out").decode()}})
        self.assertEqual(done["task"]["state"], "TASK_STATE_SUCCEEDED")
        self.assertEqual(done["task"]["attempts"][-1]["agentId"], "py-7")
        err = self.error("taskgrid.v1.BoardService/Claim", {"queue": "pull", "owner": ""},
                         INVALID_ARGUMENT)
        self.assertIn("owner", err["message"])

    def test_merge_key_with_json(self):
        spec = {"queue": "merged", "mergeKey": "k-1", "notBefore": "2099-01-01T00:00:00Z",
                "steps": [{"builtin": {"name": "noop"}}]}
        first = self.call("taskgrid.v1.TaskService/SubmitTasks",
                          {"tasks": [dict(spec, payload=base64.b64encode(b"a").decode())]})
        second = self.call("taskgrid.v1.TaskService/SubmitTasks",
                           {"tasks": [dict(spec, payload=base64.b64encode(b"b").decode(),
                                           mergeUpdate="MERGE_UPDATE_ONCE")]})
        task_id = first["tasks"][0]["spec"]["id"]
        self.assertEqual(second["tasks"][0]["spec"]["id"], task_id)
        merged = second["tasks"][0]["merged"]
        self.assertEqual([base64.b64decode(p) for p in merged["payloads"]], [b"a", b"b"])
        deleted = self.call("taskgrid.v1.TaskService/DeleteByMergeKey",
                            {"queue": "merged", "mergeKey": "k-1"})
        self.assertEqual((deleted["spec"]["id"], deleted["state"]),
                         (task_id, "TASK_STATE_CANCELLED"))
        err = self.error("taskgrid.v1.TaskService/DeleteByMergeKey",
                         {"queue": "merged", "mergeKey": "k-1"}, NOT_FOUND)
        self.assertIn("k-1", err["message"])

    def test_wait_and_watch_with_json(self):
        self.call("taskgrid.v1.TaskService/SubmitTasks", {"tasks": [
            {"id": "watched", "queue": "watch",
             "steps": [{"builtin": {"name": "echo", "args": ["watched"]}}]}]})
        waited = self.call("taskgrid.v1.TaskService/WaitTask", {"id": "watched", "timeout": "20s"},
                           "--timeout", "25s")
        self.assertTrue(waited.get("done"), waited)
        self.assertEqual(waited["task"]["state"], "TASK_STATE_SUCCEEDED")

        # A stream: the whole retained history (after_revision 0) of the
        # task, then live changes until the deadline (--timeout) ends it.
        start = time.monotonic()
        res = self.curl("--timeout", "3s", f"{self.url}/taskgrid.v1.TaskService/WatchTasks",
                        data={"task_ids": ["watched"], "after_revision": 0})
        self.assertLess(time.monotonic() - start, 20)
        # The deadline ends it: buf says DEADLINE_EXCEEDED, or CANCELLED when
        # the server's side of the deadline reached it first (seen on a
        # loaded machine). Either way no error of the scheduler's.
        self.assertIn(res.returncode, (DEADLINE_EXCEEDED, CANCELLED), res.stdout + res.stderr)
        self.assertTrue("deadline_exceeded" in res.stderr or "canceled" in res.stderr, res.stderr)
        events = json_stream(res.stdout)
        self.assertTrue(events, res.stdout)
        self.assertTrue(all(e["taskId"] == "watched" for e in events), events)
        self.assertNotIn("fromState", events[0])   # created: from UNSPECIFIED
        self.assertEqual(events[0]["toState"], "TASK_STATE_PENDING")
        self.assertEqual(events[-1]["toState"], "TASK_STATE_SUCCEEDED")
        self.assertEqual([e.get("fromState", "TASK_STATE_UNSPECIFIED") for e in events[1:]],
                         [e["toState"] for e in events[:-1]])
        revisions = [int(e["revision"]) for e in events]
        self.assertEqual(revisions, sorted(set(revisions)))

    def test_bad_requests_name_the_field(self):
        err = self.error("taskgrid.v1.TaskService/SubmitTasks", {"tasks": []}, INVALID_ARGUMENT)
        self.assertEqual(err["code"], "invalid_argument")
        self.assertIn("tasks", err["message"])

        err = self.error("taskgrid.v1.TaskService/SubmitTasks",
                         {"tasks": [{"id": "bad id!", "steps": [{"builtin": {"name": "noop"}}]}]},
                         INVALID_ARGUMENT)
        self.assertEqual(err["code"], "invalid_argument")
        self.assertIn("tasks[0].id", err["message"])

        err = self.error("taskgrid.v1.TaskService/GetTask", {"id": "no-such-task"}, NOT_FOUND)
        self.assertEqual(err["code"], "not_found")
        self.assertIn("no-such-task", err["message"])

        # A field the schema does not have: buf refuses it before calling.
        res = self.curl(f"{self.url}/taskgrid.v1.TaskService/SubmitTasks",
                        data={"tasks": [{"id": "x", "stepz": []}]})
        self.assertNotEqual(res.returncode, 0)
        self.assertIn('unknown field "stepz"', res.stderr)


if __name__ == "__main__":
    unittest.main()
