#!/usr/bin/env python3
"""taskgridctl and a call whose answer is lost: the call was carried out
(the scheduler committed it) but the connection died before the answer came
back, as when a leader is killed right after its COMMIT.

taskgridctl is given two addresses: first a proxy that passes every call on
to the scheduler and, for the submits, drops the answer (the caller gets
UNAVAILABLE); then the scheduler itself. A submit that is safe to repeat
(every task and job has an id, made by taskgridctl when the user gave none)
is sent again to the second address and finds what the first made: one task,
not two. One that is not (a merge key delivers into a task: twice would
deliver twice) is reported as maybe carried out and not sent again.

Run through ctest (see tests/system/tests.cmake).
"""

import json
import os
import re
import sys
import threading
import unittest
from concurrent import futures

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster  # noqa: E402

# Unary calls whose answer the proxy drops after the scheduler carried them out.
LOSE = {"/taskgrid.v1.TaskService/SubmitTasks", "/taskgrid.v1.JobService/SubmitJob"}
CLIENT_TASK_ID = re.compile(r"^t\d{14}-[0-9a-f]{12}$")
CLIENT_JOB_ID = re.compile(r"^j\d{14}-[0-9a-f]{12}$")


class AnswerLosingProxy(grpc.GenericRpcHandler):
    """Passes unary calls (as bytes) on to `target`; drops the answer of the
    calls in LOSE once the target has answered."""

    def __init__(self, target):
        self.channel = grpc.insecure_channel(target)
        self.lost = []
        self.mu = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def close(self):
        self.server.stop(grace=None)
        self.channel.close()

    def service(self, details):
        method = details.method

        def call(request, context):
            answer = self.channel.unary_unary(method)(request, timeout=30)
            if method in LOSE:
                with self.mu:
                    self.lost.append(method)
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "the connection was lost before the answer came back")
            return answer

        return grpc.unary_unary_rpc_method_handler(call)


class LostAnswerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster()
        cls.cluster.start_scheduler()
        cls.proxy = AnswerLosingProxy(cls.cluster.addr)

    @classmethod
    def tearDownClass(cls):
        cls.proxy.close()
        cls.cluster.close()

    def ctl_through_proxy(self, *args, input=None):
        """taskgridctl with the answer-losing proxy first, the scheduler second."""
        c = self.cluster
        saved = c.ctl_flags
        c.ctl_flags = saved + [f"--addr={self.proxy.addr},{c.addr}"]
        try:
            return c.ctl(*args, input=input)
        finally:
            c.ctl_flags = saved

    def lost_since(self, before):
        with self.proxy.mu:
            return self.proxy.lost[before:]

    def test_a_submit_without_an_id_is_sent_again_and_makes_one_task(self):
        q = "lost-answer-plain"
        before = len(self.proxy.lost)
        res = self.ctl_through_proxy("--json", "submit", f"--queue={q}", "--", "echo", "once")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(self.lost_since(before), ["/taskgrid.v1.TaskService/SubmitTasks"],
                         "the first try did not reach the proxy")
        ids = [t["spec"]["id"] for t in json.loads(res.stdout)["tasks"]]
        self.assertEqual(len(ids), 1, res.stdout)
        self.assertRegex(ids[0], CLIENT_TASK_ID)
        stored = [t["spec"]["id"] for t in self.cluster.tasks(f"--queue={q}")]
        self.assertEqual(stored, ids, "the submit made a second task when it was sent again")

    def test_a_batch_without_ids_is_sent_again_and_makes_each_task_once(self):
        q = "lost-answer-batch"
        specs = [{"queue": q, "steps": [{"exec": {"argv": ["echo", str(n)]}}]} for n in range(3)]
        before = len(self.proxy.lost)
        res = self.ctl_through_proxy("--json", "submit", "-f", "-", input=json.dumps(specs))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(len(self.lost_since(before)), 1)
        ids = sorted(t["spec"]["id"] for t in json.loads(res.stdout)["tasks"])
        self.assertEqual(len(set(ids)), 3, res.stdout)
        self.assertEqual(sorted(t["spec"]["id"] for t in self.cluster.tasks(f"--queue={q}")), ids)

    def test_a_merge_key_submit_is_reported_not_sent_again(self):
        q = "lost-answer-merge"
        before = len(self.proxy.lost)
        res = self.ctl_through_proxy("submit", f"--queue={q}", "--merge_key=k1", "--",
                                     "echo", "merged")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("may have been carried out", res.stderr)
        self.assertIn(self.proxy.addr, res.stderr)
        self.assertEqual(len(self.lost_since(before)), 1)
        # Carried out once, by the first try: the scheduler holds it.
        tasks = self.cluster.tasks(f"--queue={q}")
        self.assertEqual([t["spec"].get("merge_key") for t in tasks], ["k1"])

    def test_a_job_without_an_id_is_sent_again_and_made_once(self):
        tasks = [{"id": "lost-answer-job-a", "steps": [{"builtin": {"name": "noop"}}]},
                 {"depends_on": ["lost-answer-job-a"], "steps": [{"builtin": {"name": "noop"}}]}]
        path = os.path.join(self.cluster.dir, "job.json")
        with open(path, "w") as f:
            json.dump({"tasks": tasks}, f)
        before = len(self.proxy.lost)
        res = self.ctl_through_proxy("--json", "job", "submit", path)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(self.lost_since(before), ["/taskgrid.v1.JobService/SubmitJob"])
        job_id = json.loads(res.stdout)["id"]
        self.assertRegex(job_id, CLIENT_JOB_ID)
        jobs = self.cluster.ctl_json("job", "list").get("jobs", [])
        self.assertEqual([j["id"] for j in jobs], [job_id])


if __name__ == "__main__":
    unittest.main(verbosity=2)
