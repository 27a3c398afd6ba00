"""The guide's curl examples of the HTTP/JSON API (docs/clients.md), run as written against
the real binaries: the block marked "<!-- runnable: http-api -->" is cut
into its commands (a line ending in a backslash goes on), each run with
bash against this test's scheduler (its HTTP port in place of the quick
start's 127.0.0.1:7080) and an agent, and every "key":value pair the
comment under a command shows must be in what the command printed ("..."
stands for what the page leaves out). A page whose example breaks fails.

Also: a long poll holds its connection while other requests are answered,
and the API's OpenAPI document parses and names the routes the page uses.

Run through ctest (system.http_api), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import re
import subprocess
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = "<!-- runnable: http-api -->"
PAIR = re.compile(r'"(\w+)":("(?:[^"\\]|\\.)*"|true|false|-?\d+)')


def runnable_block(path, marker):
    """The lines of the fenced block that follows `marker` in `path`."""
    with open(path) as f:
        text = f.read()
    at = text.find(marker)
    assert at >= 0, f"{path} has no {marker}"
    lines = text[at:].split("\n")[1:]
    assert lines[0].startswith("```"), f"{marker} is not followed by a code block"
    end = lines.index("```", 1)
    return lines[1:end]


def commands(lines):
    """(prelude, [(command, [expected comment lines])]): assignments go
    in the prelude of every command."""
    prelude, out = [], []
    current = None
    for line in lines:
        if line.startswith("# "):
            assert out, f"a comment before any command: {line}"
            out[-1][1].append(line[2:])
        elif re.match(r"^\w+=", line):
            prelude.append(line)
        elif current is not None:
            current.append(line)
            if not line.endswith("\\"):
                out.append((" \\\n".join(l.rstrip("\\").rstrip() for l in current) + "\n", []))
                current = None
        elif line.strip():
            current = [line]
            if not line.endswith("\\"):
                out.append((line + "\n", []))
                current = None
    return "\n".join(prelude) + "\n", out


class HttpApiTest(unittest.TestCase):
    def test_the_readme_curl_examples_work_as_written(self):
        prelude, cmds = commands(runnable_block(os.path.join(ROOT, "docs", "clients.md"), MARKER))
        self.assertGreaterEqual(len(cmds), 5)
        with harness.Cluster() as c:
            port = c.start_with_http()
            c.start_agent("a1", slots=2)
            base = f"http://127.0.0.1:{port}"
            for cmd, expected in cmds:
                script = (prelude + cmd).replace("http://127.0.0.1:7080", base)
                res = subprocess.run(["bash", "-o", "pipefail", "-c", script],
                                     capture_output=True, text=True, timeout=90)
                shown = f"{cmd}printed {res.stdout!r} {res.stderr!r}"
                for comment in expected:
                    pairs = PAIR.findall(comment)
                    self.assertTrue(pairs, f"nothing to compare in {comment!r}")
                    for key, value in pairs:
                        self.assertIn(f'"{key}":{value}', res.stdout, shown)
                json.loads(res.stdout)  # every answer is JSON
                if not any('"code"' in e for e in expected):
                    self.assertEqual(res.returncode, 0, shown)

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
