"""System test of http steps: the real scheduler, agent and taskgridctl
against an HTTP server of the test's own (Python's http.server on
127.0.0.1, an ephemeral port, on a thread).

A task submitted with `taskgridctl submit -f` POSTs its payload to a hook
that answers 503 twice, then 200: the task is retried by its retry policy
and ends SUCCEEDED on attempt 3. A task against a path that answers 404
ends FAILED after one attempt, however many it was allowed.

Run through ctest (system.http_step), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import datetime
import http.server
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WAIT = 30.0


class Hook:
    """An HTTP server on 127.0.0.1 that records every request. /flaky
    answers 503 twice, then 200; /batch 200; any other path 404."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []  # (method, path, headers as a dict, body); guarded by lock
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hook.lock:
                    hook.requests.append((self.command, self.path,
                                          {k.lower(): v for k, v in self.headers.items()}, body))
                    seen = sum(1 for r in hook.requests if r[1] == self.path)
                if self.path == "/batch":
                    self.answer(200, b"batch taken\n")
                elif self.path != "/flaky":
                    self.answer(404, b"no such hook\n")
                elif seen <= 2:
                    self.answer(503, b"busy, come back\n")
                else:
                    self.answer(200, b"order accepted\n")

            def answer(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def received(self, path):
        with self.lock:
            return [r for r in self.requests if r[1] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=WAIT)


def b64(text):
    return base64.b64encode(text.encode()).decode()


class HttpStepTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.hook = Hook()
        cls.addClassCleanup(cls.hook.close)
        cls.cluster = harness.start_class_cluster(cls, agents=["a1"])

    def submit(self, spec):
        res = self.cluster.ctl("submit", "-f", "-", input=json.dumps(spec))
        self.assertEqual(res.returncode, 0, f"{res.stdout}\n{res.stderr}")

    def spec(self, task_id, path, payload):
        return {
            "id": task_id, "queue": "http",
            "steps": [{"http": {"url": self.hook.url(path),
                                "headers": {"content-type": "application/json"}},
                       "timeout": "10s"}],
            "payload": b64(payload),
            "max_attempts": 3,
            "retry": {"initial_backoff": "0.1s"},
        }

    def test_retried_on_503_until_it_succeeds(self):
        self.submit(self.spec("order-42", "/flaky", '{"order": 42}'))
        task = self.cluster.wait_state("order-42", ["SUCCEEDED", "FAILED"], timeout=WAIT)
        self.assertEqual(task["state"], "TASK_STATE_SUCCEEDED", json.dumps(task))
        self.assertEqual(task["attempt"], 3)
        self.assertEqual(task["attempts_used"], 3)
        result = task["result"]
        self.assertEqual(result["exit_code"], 200)
        self.assertEqual(base64.b64decode(result["stdout_tail"]), b"order accepted\n")
        self.assertFalse(result.get("permanent", False))
        # The two that failed, as the history keeps them.
        failed = task["attempts"][:2]
        for a in failed:
            self.assertEqual(a["result"]["outcome"], "OUTCOME_FAILED")
            self.assertEqual(a["result"]["exit_code"], 503)
            self.assertEqual(a["result"]["error"], "HTTP 503 from POST " + self.hook.url("/flaky"))
        # What the hook got: the payload, three times, as asked.
        got = self.hook.received("/flaky")
        self.assertEqual(len(got), 3)
        for method, _, headers, body in got:
            self.assertEqual(method, "POST")
            self.assertEqual(headers.get("content-type"), "application/json")
            self.assertEqual(body, b'{"order": 42}')
        # The CLI shows the step as its method and URL.
        res = self.cluster.ctl("get", "order-42", check=True)
        self.assertIn("[0] http POST " + self.hook.url("/flaky") + " [timeout 10s]", res.stdout)
        self.assertIn("Exit code: 200", " ".join(res.stdout.split()))

    def test_a_404_fails_after_one_attempt(self):
        self.submit(self.spec("order-43", "/missing", '{"order": 43}'))
        task = self.cluster.wait_state("order-43", ["SUCCEEDED", "FAILED"], timeout=WAIT)
        self.assertEqual(task["state"], "TASK_STATE_FAILED", json.dumps(task))
        self.assertEqual(task["attempts_used"], 1)
        self.assertEqual(task["max_attempts"], 3)
        result = task["result"]
        self.assertEqual(result["exit_code"], 404)
        self.assertTrue(result["permanent"])
        self.assertEqual(base64.b64decode(result["stdout_tail"]), b"no such hook\n")
        self.assertIn("failed for good: HTTP 404 from POST " + self.hook.url("/missing"),
                      task["reason"])
        self.assertEqual(len(self.hook.received("/missing")), 1)

    def test_submits_by_merge_key_arrive_as_one_request_with_every_payload(self):
        ids = set()
        for payload in ('{"n": 1}', '{"n": 2}', "not json"):
            # Each submit fires two seconds from its own time (merge_update
            # always): the three arrive together once they stopped coming.
            when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
            spec = {"queue": "http", "merge_key": "user-9",
                    "not_before": when.isoformat().replace("+00:00", "Z"),
                    "steps": [{"http": {"url": self.hook.url("/batch")}, "timeout": "10s"}],
                    "payload": b64(payload)}
            out = json.loads(self.cluster.ctl("--json", "submit", "-f", "-",
                                              input=json.dumps(spec), check=True).stdout)
            ids.add(out["tasks"][0]["spec"]["id"])
        self.assertEqual(len(ids), 1, "every submit joined the first one's task")
        task = self.cluster.wait_state(ids.pop(), ["SUCCEEDED", "FAILED"], timeout=WAIT)
        self.assertEqual(task["state"], "TASK_STATE_SUCCEEDED", json.dumps(task))
        self.assertEqual(len(task["merged"]["payloads"]), 3)
        got = self.hook.received("/batch")
        self.assertEqual(len(got), 1, "delivered once")
        method, _, headers, body = got[0]
        self.assertEqual(method, "POST")
        self.assertEqual(headers.get("content-type"), "application/json")
        self.assertEqual(json.loads(body), [{"n": 1}, {"n": 2}, "not json"])


if __name__ == "__main__":
    unittest.main()
