"""The HTTP/JSON API against the real binaries, beyond the guide's curl
examples (docs/clients.md, which system.docs runs as the page shows them):
a long poll holds its connection while other requests are answered, and
the API's OpenAPI document parses and names the routes the page uses.

Run through ctest (system.http_api), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import re
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


class HttpApiTest(unittest.TestCase):
    def test_a_long_poll_waits_while_others_are_answered(self):
        with harness.Cluster() as c:
            port = c.start_with_http()
            base = f"http://127.0.0.1:{port}/api/v1"

            def call(path, body=None):
                req = urllib.request.Request(
                    base + path, data=None if body is None else json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=90) as r:
                    return json.loads(r.read())

            call("/tasks", {"tasks": [{"id": "lp", "steps": [{"builtin": {"name": "noop"}}]}]})
            results = {}
            threads = [threading.Thread(target=lambda i=i: results.__setitem__(
                i, call("/tasks/lp/wait?timeout=60s"))) for i in range(8)]
            for t in threads:
                t.start()
            # No agent yet: the waits hold their connections; the server
            # still answers (it has fewer threads than waits).
            def waiting():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                    m = re.search(r'^taskgrid_waiters\{call="WaitTask"\} (\S+)$',
                                  r.read().decode(), re.M)
                return m is not None and float(m.group(1)) == 8
            harness.wait_until(waiting, timeout=60, what="8 WaitTask calls waiting")
            self.assertEqual(call("/tasks/lp")["state"], "TASK_STATE_PENDING")
            c.start_agent("a1", slots=1)
            for t in threads:
                t.join(timeout=90)
            self.assertEqual(len(results), 8)
            for r in results.values():
                self.assertTrue(r["done"], r)
                self.assertEqual(r["task"]["state"], "TASK_STATE_SUCCEEDED")

            doc = call("/openapi.json")
            self.assertEqual(doc["openapi"][:2], "3.")
            for path in ("/api/v1/tasks", "/api/v1/tasks/{id}/wait",
                         "/api/v1/TaskService/SubmitTasks", "/api/v1/BoardService/Claim"):
                self.assertIn(path, doc["paths"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
