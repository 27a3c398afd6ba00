"""taskgrid-bench: every workload runs in --smoke size and reports
sane figures; nothing it started outlives it, also after SIGINT.

No timing thresholds are asserted: this machine is shared and small. The
bench is found beside TASKGRID_SCHEDULER (both are in <build>/bin).
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import binary, processes_with, wait_until  # noqa: E402

# Every figure each workload must report, and what its value must be.
POSITIVE = "positive"
ZERO = "zero"
FINITE = "finite"
EXPECTED = {
    "W1": {"submit_one_at_a_time": POSITIVE, "submit_64_in_flight": POSITIVE,
           "submit_batch_100": POSITIVE},
    "W2": {"drain_rate": POSITIVE, "drain_seconds": POSITIVE},
    "W3": {"latency_p50": POSITIVE, "latency_p99": POSITIVE, "latency_max": POSITIVE},
    "W4": {"recovery_seconds": POSITIVE, "requeue_after_kill_seconds": POSITIVE,
           "tasks_lost": ZERO, "double_commits": ZERO},
    "W5": {"restart_to_serving": POSITIVE, "recovery_logged": FINITE,
           "scheduler_rss_after_start": POSITIVE, "dispatch_rate_large_table": POSITIVE,
           "restart_to_serving_small_table": POSITIVE, "scheduler_rss_small_table": POSITIVE,
           "dispatch_rate_small_table": POSITIVE, "dispatch_rate_large_vs_small": POSITIVE},
    "W6": {"agents_connected": POSITIVE, "connect_seconds": POSITIVE, "agents_held": POSITIVE,
           "scheduler_rss": POSITIVE, "scheduler_peak_rss": POSITIVE, "scheduler_cpu": FINITE,
           "sim_late_heartbeats": FINITE, "sim_max_heartbeat_delay": FINITE,
           "agent_heartbeat_interval": POSITIVE, "heartbeats_per_second": POSITIVE},
    "W7": {"claim_complete_rate": POSITIVE, "claim_p50": POSITIVE, "claim_p99": POSITIVE,
           "double_claims": ZERO},
    "W8": {"merge_submit_rate": POSITIVE},
    "W10": {"placement_rate_resources": POSITIVE, "connect_and_fill_resources": POSITIVE,
            "fair_share_error_mean_resources": FINITE, "fair_share_error_max_resources": FINITE,
            "placement_rate_slots_only": POSITIVE, "connect_and_fill_slots_only": POSITIVE,
            "fair_share_error_mean_slots_only": FINITE,
            "fair_share_error_max_slots_only": FINITE},
}


def bench_binary():
    path = os.path.join(os.path.dirname(binary("TASKGRID_SCHEDULER")), "taskgrid-bench")
    if not os.path.exists(path):
        raise RuntimeError(f"{path} does not exist: build the taskgrid-bench target")
    return path


class BenchTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="taskgrid-bench-test-")
        self.marker = f"TASKGRID_BENCH_TEST={uuid.uuid4().hex}"
        self.env = dict(os.environ)
        key, value = self.marker.split("=", 1)
        self.env[key] = value

    def tearDown(self):
        for pid in processes_with(self.marker, "environ"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", self.tmp], check=False)

    def assert_nothing_left(self, work_dir):
        deadline = time.monotonic() + 10
        left = processes_with(self.marker, "environ")
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = processes_with(self.marker, "environ")
        self.assertEqual(left, [], "processes started by the bench outlived it")
        self.assertEqual(os.listdir(work_dir), [], "the bench left temporary directories")

    def test_smoke_reports_every_workload_with_sane_figures(self):
        res = subprocess.run([bench_binary(), "--smoke", "--json", f"--tmp_dir={self.tmp}"],
                             capture_output=True, text=True, timeout=280, env=self.env)
        self.assertEqual(res.returncode, 0, f"stderr:\n{res.stderr[-8000:]}")
        figures = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
        by_workload = {}
        for f in figures:
            for key in ("workload", "metric", "value", "unit", "n", "settings"):
                self.assertIn(key, f, f)
            self.assertIsInstance(f["n"], int, f)
            self.assertGreater(f["n"], 0, f)
            self.assertTrue(f["unit"], f)
            self.assertIsInstance(f["settings"], dict, f)
            if f["workload"] == "W10":
                # The scheduler's core in the bench's process: no store.
                self.assertEqual(f["settings"].get("store"), "none (in process)", f)
            else:
                self.assertEqual(f["settings"].get("durability"), "full", f)
                for key in ("heartbeat_interval", "heartbeat_timeout", "reconnect_grace"):
                    self.assertIn(key, f["settings"], f)
            self.assertIsInstance(f["value"], (int, float), f)
            self.assertTrue(math.isfinite(f["value"]), f)
            by_workload.setdefault(f["workload"], {})[f["metric"]] = f
        self.assertEqual(sorted(by_workload), sorted(EXPECTED))
        for workload, metrics in EXPECTED.items():
            got = by_workload[workload]
            for metric, rule in metrics.items():
                self.assertIn(metric, got, f"{workload} did not report {metric}")
                value = got[metric]["value"]
                if rule == POSITIVE:
                    self.assertGreater(value, 0, got[metric])
                elif rule == ZERO:
                    self.assertEqual(value, 0, got[metric])
                else:
                    self.assertGreaterEqual(value, 0, got[metric])
        w1 = by_workload["W1"]
        self.assertEqual(w1["submit_64_in_flight"]["settings"]["in_flight"], 64)
        self.assertEqual(w1["submit_batch_100"]["settings"]["batch"], 100)
        w2 = by_workload["W2"]["drain_rate"]["settings"]
        self.assertEqual((w2["agents"], w2["slots"]), (2, 100))
        w3 = by_workload["W3"]
        self.assertLessEqual(w3["latency_p50"]["value"], w3["latency_p99"]["value"])
        self.assertLessEqual(w3["latency_p99"]["value"], w3["latency_max"]["value"])
        self.assertEqual(by_workload["W7"]["claim_complete_rate"]["settings"]["claimers"], 16)
        w10 = by_workload["W10"]["placement_rate_resources"]["settings"]
        self.assertEqual((w10["agents"], w10["tasks"], w10["queues"]), (200, 20000, 10))
        # Every sample of fair share was taken while all ten queues waited.
        self.assertGreater(by_workload["W10"]["fair_share_error_mean_resources"]["n"], 20)
        held = by_workload["W6"]["agents_held"]
        self.assertEqual(held["value"], held["n"], "not every simulated agent stayed connected")
        # The table goes to stderr with --json.
        self.assertIn("METRIC", res.stderr)
        self.assert_nothing_left(self.tmp)

    def test_sigint_stops_everything_it_started(self):
        log_path = os.path.join(self.tmp, "bench.log")
        work = os.path.join(self.tmp, "work")
        os.mkdir(work)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([bench_binary(), "--smoke", "--workloads=w4",
                                     f"--tmp_dir={work}"], stdout=subprocess.DEVNULL,
                                    stderr=log, env=self.env)
        try:
            def log_text():
                with open(log_path, errors="replace") as f:
                    return f.read()
            # Interrupt while the victim's tasks run (or it was just killed).
            wait_until(lambda: "tasks run on" in log_text(), timeout=60,
                       what="the W4 tasks to run on the victim")
            proc.send_signal(signal.SIGINT)
            self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGINT, log_text()[-4000:])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        self.assert_nothing_left(work)

    def test_rpc_floor_reports_each_server_api_and_leaves_nothing(self):
        # taskgrid-rpc-floor: the server it forks and the files it writes
        # are gone when it returns, for every API and both disks.
        floor = os.path.join(os.path.dirname(bench_binary()), "taskgrid-rpc-floor")
        work = os.path.join(self.tmp, "floor")
        os.mkdir(work)
        env = dict(self.env, TMPDIR=work)
        runs = [["--server=callback", "--write_bytes=4096"], ["--server=sync", "--write_bytes=0"],
                ["--server=cq", "--write_bytes=4096"], ["--server=callback", "--sqlite"],
                ["--server=cq", "--log"]]
        for flags in runs:
            res = subprocess.run([floor, "--calls=100", *flags], capture_output=True, text=True,
                                 timeout=120, env=env)
            self.assertEqual(res.returncode, 0, f"{flags}: {res.stderr}")
            m = re.match(r"server=(\w+) (sqlite|log|write_bytes=\d+): 100 calls in [0-9.]+ s, "
                         r"(\d+) /s, ([0-9.]+) us a call$", res.stdout.strip())
            self.assertIsNotNone(m, f"{flags}: {res.stdout!r}")
            self.assertEqual(m.group(1), flags[0].split("=")[1])
            self.assertEqual(m.group(2), flags[1].lstrip("-"))
            self.assertGreater(int(m.group(3)), 0)
            self.assertGreater(float(m.group(4)), 0)
        self.assert_nothing_left(work)
        res = subprocess.run([floor, "--server=async"], capture_output=True, text=True,
                             timeout=30, env=env)
        self.assertEqual(res.returncode, 2)
        self.assertIn("--server must be callback, sync or cq, not 'async'", res.stderr)
        res = subprocess.run([floor, "--sqlite", "--log"], capture_output=True, text=True,
                             timeout=30, env=env)
        self.assertEqual(res.returncode, 2)
        self.assertIn("--sqlite and --log are two disks", res.stderr)
        self.assert_nothing_left(work)

    def test_unknown_workload_is_a_usage_error(self):
        res = subprocess.run([bench_binary(), "--workloads=w1,w99"], capture_output=True,
                             text=True, timeout=30, env=self.env)
        self.assertEqual(res.returncode, 2)
        self.assertIn("unknown workload 'w99'", res.stderr)


if __name__ == "__main__":
    unittest.main()
