"""System test of --metrics_listen with the real binaries: the scheduler
serves GET /metrics in the Prometheus text format (checked line by line
by a small parser), the counts follow tasks run by a real agent, unknown
paths are 404, other methods 405, it stops on SIGTERM, and an address
other machines could reach is refused at start-up without --insecure.

Run through ctest (system.metrics), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({NAME})(\{{(?:{LABEL}(?:,{LABEL})*)?\}})? (\S+)$")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
HELP = re.compile(rf"^# HELP ({NAME}) (.*)$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")


def parse_value(text):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    return float(text)  # raises on anything else


def parse_exposition(text):
    """Parses the text format 0.0.4 strictly. Returns {family: {"type", "help",
    "samples": [(name, {label: value}, float)]}}; raises AssertionError on any
    line that is not valid."""
    assert text.endswith("\n"), "the page must end with a newline"
    families = {}
    current = None
    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n}: {line!r}"
        if m := HELP.match(line):
            assert m.group(1) not in families, f"{where}: family repeated"
            current = families.setdefault(m.group(1), {"help": m.group(2), "samples": []})
            continue
        if m := TYPE.match(line):
            assert current is not None and m.group(1) in families, f"{where}: TYPE before HELP"
            assert "type" not in families[m.group(1)], f"{where}: second TYPE"
            families[m.group(1)]["type"] = m.group(2)
            continue
        assert not line.startswith("#"), f"{where}: unknown comment"
        m = SAMPLE.match(line)
        assert m, f"{where}: not a sample line"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        fam = families.get(family) if family in families else families.get(name)
        assert fam is not None and "type" in fam, f"{where}: sample without HELP and TYPE"
        assert fam is current, f"{where}: sample outside its family's block"
        if fam["type"] != "histogram":
            assert name in families, f"{where}: suffix on a {fam['type']}"
        parsed = dict(LABEL_PAIR.findall(labels))
        fam["samples"].append((name, parsed, parse_value(value)))
    for name, fam in families.items():
        if fam["type"] == "histogram":
            check_histogram(name, fam["samples"])
        if fam["type"] == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
    return families


def check_histogram(name, samples):
    buckets = [(float(l["le"].replace("Inf", "inf")), v) for n, l, v in samples
               if n == name + "_bucket"]
    assert buckets and math.isinf(buckets[-1][0]), f"{name}: no +Inf bucket"
    assert [b for b, _ in buckets] == sorted(b for b, _ in buckets), f"{name}: le out of order"
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), f"{name}: buckets not cumulative"
    count = [v for n, _, v in samples if n == name + "_count"]
    assert count == [counts[-1]], f"{name}: _count {count} is not the +Inf bucket {counts[-1]}"
    assert len([1 for n, _, _ in samples if n == name + "_sum"]) == 1, f"{name}: no _sum"


def value(families, name, **labels):
    """The value of the one sample `name` (a family, or a histogram's _sum or
    _count) with exactly `labels`."""
    family = name if name in families else re.sub(r"_(sum|count)$", "", name)
    found = [v for n, l, v in families[family]["samples"] if n == name and l == labels]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shipped_queries():
    """(where, PromQL) of every query of deploy/grafana's dashboard (panels and
    variables) and of deploy/prometheus's alert rules."""
    with open(os.path.join(ROOT, "deploy/grafana/taskgrid-dashboard.json")) as f:
        dash = json.load(f)
    queries = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            queries.append((f"dashboard panel {p['title']!r}", t["expr"]))
    for v in dash["templating"]["list"]:
        if isinstance(v.get("query"), dict):
            queries.append((f"dashboard variable {v['name']}", v["query"]["query"]))
    rules = os.path.join(ROOT, "deploy/prometheus/taskgrid-alerts.yml")
    with open(rules) as f:
        for n, line in enumerate(f, 1):
            if m := re.match(r"^\s*expr: (.+)$", line):
                queries.append((f"{rules}:{n}", m.group(1)))
    assert len(queries) > 40, f"only {len(queries)} queries found"
    return queries


def selectors(expr):
    """The Taskgrid and process metrics `expr` names (up, Prometheus's own, is
    left out), each with the label names its selector matches on."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # no names inside strings
    found = []
    for m in re.finditer(r"\b((?:taskgrid|process)_[a-zA-Z0-9_]+)(\{[^}]*\})?", expr):
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2) or ""))
        found.append((m.group(1), labels))
    return found


def http(method, url):
    req = urllib.request.Request(url, method=method, data=b"x" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, dict(res.headers), res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


class MetricsTest(unittest.TestCase):
    def start(self, *flags):
        cluster = harness.Cluster()
        self.addCleanup(cluster.close)
        self.port_file = os.path.join(cluster.dir, "metrics-port")
        cluster.scheduler_flags += ["--metrics_listen=127.0.0.1:0",
                                    f"--metrics_port_file={self.port_file}", *flags]
        cluster.start_scheduler()
        harness.wait_until(lambda: os.path.exists(self.port_file), what="the metrics port")
        with open(self.port_file) as f:
            self.url = f"http://127.0.0.1:{int(f.read())}"
        return cluster

    def scrape(self):
        status, headers, body = http("GET", self.url + "/metrics")
        self.assertEqual(status, 200, body)
        self.assertEqual(headers.get("Content-Type"), "text/plain; version=0.0.4; charset=utf-8")
        return parse_exposition(body)

    def test_counts_follow_tasks_run_by_an_agent(self):
        cluster = self.start()
        families = self.scrape()  # a fresh scheduler: valid, no queue counted yet
        self.assertEqual(families["taskgrid_tasks_submitted_total"]["samples"], [])
        self.assertEqual(value(families, "taskgrid_build_info", version="0.1.0",
                               build_type=families["taskgrid_build_info"]["samples"][0][1]
                               ["build_type"]), 1)

        cluster.start_agent("m1", slots=2)
        harness.wait_until(lambda: value(self.scrape(), "taskgrid_agents", state="ACTIVE") == 1,
                           what="the agent in the metrics")
        for i in range(3):
            cluster.ctl("submit", f"--id=ok{i}", "--queue=mq", "--", "/bin/true", check=True)
        cluster.ctl("submit", "--id=bad", "--queue=mq", "--max_attempts=1", "--", "/bin/false",
                    check=True)
        # No agent carries this label: it stays PENDING in its queue.
        cluster.ctl("submit", "--id=held", "--queue=held", "--labels=gpu=1", "--", "/bin/true",
                    check=True)
        for i in range(3):
            cluster.wait_state(f"ok{i}", "SUCCEEDED")
        cluster.wait_state("bad", "FAILED")

        f = self.scrape()
        # The task counters by queue: a failure rate per queue is one query.
        self.assertEqual(value(f, "taskgrid_tasks_submitted_total", queue="mq"), 4)
        self.assertEqual(value(f, "taskgrid_tasks_submitted_total", queue="held"), 1)
        self.assertEqual(value(f, "taskgrid_tasks_dispatched_total", queue="mq"), 4)
        self.assertEqual(value(f, "taskgrid_tasks_dispatched_total", queue="held"), 0)
        completed = {(q, o): value(f, "taskgrid_tasks_completed_total", queue=q, outcome=o)
                     for q in ("mq", "held") for o in ("SUCCEEDED", "FAILED", "CANCELLED")}
        self.assertEqual(completed, {("mq", "SUCCEEDED"): 3, ("mq", "FAILED"): 1,
                                     ("mq", "CANCELLED"): 0, ("held", "SUCCEEDED"): 0,
                                     ("held", "FAILED"): 0, ("held", "CANCELLED"): 0})
        self.assertEqual(value(f, "taskgrid_tasks", queue="mq", state="SUCCEEDED"), 3)
        self.assertEqual(value(f, "taskgrid_tasks", queue="mq", state="FAILED"), 1)
        self.assertEqual(value(f, "taskgrid_tasks", queue="held", state="PENDING"), 1)
        self.assertEqual(value(f, "taskgrid_queue_backlog_tasks", queue="held"), 1)
        self.assertEqual(value(f, "taskgrid_queue_backlog_tasks", queue="mq"), 0)
        self.assertGreaterEqual(value(f, "taskgrid_queue_oldest_pending_age_seconds",
                                      queue="held"), 0)
        self.assertEqual(value(f, "taskgrid_queue_oldest_pending_age_seconds", queue="mq"), 0)
        self.assertEqual(value(f, "taskgrid_task_start_latency_seconds_count"), 4)
        self.assertEqual(value(f, "taskgrid_attempt_run_seconds_count"), 4)
        self.assertEqual(value(f, "taskgrid_agents", state="ACTIVE"), 1)
        self.assertEqual(value(f, "taskgrid_agent_slots"), 2)
        self.assertEqual(value(f, "taskgrid_agent_slots_free"), 2)
        self.assertGreater(value(f, "taskgrid_store_commits_total"), 0)
        self.assertGreater(value(f, "taskgrid_store_commit_rows_count"), 0)
        self.assertEqual(value(f, "taskgrid_watchers"), 0)
        self.assertEqual(value(f, "taskgrid_output_follows"), 0)
        self.assertEqual(value(f, "taskgrid_waiters", call="WaitTask"), 0)
        self.assertEqual(value(f, "taskgrid_task_submit_to_start_seconds_count"), 4)
        self.assertGreater(value(f, "process_start_time_seconds"), 1.6e9)
        self.assertGreater(value(f, "process_resident_memory_bytes"), 1 << 20)
        self.assertGreater(value(f, "process_cpu_seconds_total"), 0)
        self.assertGreater(value(f, "process_open_fds"), 3)
        # The calls this test made over gRPC, by method and code.
        self.assertGreaterEqual(
            value(f, "taskgrid_grpc_requests_total", service="taskgrid.v1.TaskService",
                  method="SubmitTasks", code="OK"), 1)

        # The page agrees with the gRPC stats it is built from.
        stats = cluster.cluster_stats()
        self.assertEqual(stats["tasks"].get("SUCCEEDED"),
                         value(f, "taskgrid_tasks", queue="mq", state="SUCCEEDED"))

        # The Grafana dashboard and the alert rules in deploy/ ask only for
        # series this page has, with labels it gives them.
        for where, expr in shipped_queries():
            for name, labels in selectors(expr):
                family = name if name in f else re.sub(r"_(bucket|sum|count)$", "", name)
                self.assertIn(family, f, f"{where}: {name} is not on the page: {expr}")
                if name != family:
                    self.assertEqual(f[family]["type"], "histogram", f"{where}: {name}")
                seen = {k for n, l, _ in f[family]["samples"] for k in l} | {"instance", "job"}
                if f[family]["samples"]:
                    self.assertLessEqual(labels, seen, f"{where}: labels of {name}: {expr}")

    def test_shipped_rules_and_dashboard_are_valid_promql(self):
        """promtool checks the alert rules, runs their unit tests, and parses
        every dashboard query (Grafana's variables stood in for)."""
        promtool = os.environ.get("TASKGRID_PROMTOOL", "")
        if not os.access(promtool, os.X_OK):
            if os.environ.get("TASKGRID_REQUIRE_PROMTOOL") == "1":
                self.fail(f"TASKGRID_PROMTOOL={promtool!r} is not an executable "
                          "(deploy/install-promtool.sh)")
            self.skipTest("no promtool: run deploy/install-promtool.sh")
        rules = os.path.join(ROOT, "deploy/prometheus")

        def run(*args):
            r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120,
                               cwd=rules)
            self.assertEqual(r.returncode, 0, f"promtool {args}: {r.stdout}{r.stderr}")
            return r.stdout

        self.assertIn("SUCCESS: 9 rules found", run("check", "rules", "taskgrid-alerts.yml"))
        self.assertIn("SUCCESS", run("test", "rules", "taskgrid-alerts.test.yml"))
        # The dashboard's queries as recording rules: promtool parses each.
        standins = {"$__rate_interval": "1m", "$instance": ".*", "$queue": ".*", "$job": ".*"}
        lines = ["groups:", "  - name: dashboard", "    rules:"]
        for n, (where, expr) in enumerate(shipped_queries()):
            if not where.startswith("dashboard panel"):
                continue
            for var, value in standins.items():
                expr = expr.replace(var, value)
            self.assertNotIn("$", expr, f"{where}: a variable without a stand-in")
            lines += [f"      - record: dashboard_query_{n}", f"        expr: {json.dumps(expr)}"]
        path = os.path.join(tempfile.mkdtemp(prefix="taskgrid-promql-"), "dashboard.yml")
        self.addCleanup(shutil.rmtree, os.path.dirname(path), ignore_errors=True)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.assertRegex(run("check", "rules", path), r"SUCCESS: \d+ rules found")

    def test_unknown_paths_and_other_methods(self):
        self.start()
        status, _, body = http("GET", self.url + "/nope")
        self.assertEqual(status, 404)
        self.assertIn("not found", body)
        status, headers, _ = http("POST", self.url + "/metrics")
        self.assertEqual(status, 405)
        self.assertEqual(headers.get("Allow"), "GET, HEAD")

    def test_stops_on_sigterm(self):
        cluster = self.start()
        self.scrape()
        self.assertEqual(cluster.scheduler.stop(), 0)
        with self.assertRaises(urllib.error.URLError):
            urllib.request.urlopen(self.url + "/metrics", timeout=5)

    def run_refused(self, *flags):
        cluster = harness.Cluster()
        self.addCleanup(cluster.close)
        argv = [harness.binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0",
                f"--data_dir={cluster.data_dir}", *flags]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    def test_a_reachable_address_needs_insecure(self):
        for addr in ("0.0.0.0:0", "[::]:0", "192.0.2.1:9090"):
            res = self.run_refused(f"--metrics_listen={addr}")
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn(f"--metrics_listen={addr} can be reached from other machines",
                          res.stderr)
            self.assertIn("--insecure", res.stderr)

    def test_a_malformed_address_is_refused(self):
        res = self.run_refused("--metrics_listen=127.0.0.1")
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--metrics_listen=127.0.0.1: no port", res.stderr)


class ParserTest(unittest.TestCase):
    """The parser above must refuse what Prometheus would."""

    def test_refuses_invalid_pages(self):
        good = "# HELP a_total x\n# TYPE a_total counter\na_total 1\n"
        parse_exposition(good)
        for bad in (good[:-1],                                   # no final newline
                    "a_total 1\n",                               # no HELP/TYPE
                    good + "a_total{q=\"x} 1\n",                 # broken label
                    good + "a_total{q=\"a\nb\"} 1\n",            # raw newline in a value
                    good + "a_total one\n",                      # not a number
                    "# HELP a x\n# TYPE a counter\na 1\n",       # counter without _total
                    "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                    "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"):  # not cumulative
            with self.assertRaises((AssertionError, ValueError), msg=repr(bad)):
                parse_exposition(bad)


if __name__ == "__main__":
    unittest.main()
