"""The binaries as a new user meets them: --help, and bad flags."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import binary  # noqa: E402


def run(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


class BinariesTest(unittest.TestCase):

    def test_scheduler_help_lists_its_flags(self):
        res = run(binary("TASKGRID_SCHEDULER"), "--help")
        out = res.stdout + res.stderr
        for flag in ("--listen", "--data_dir", "--durability", "--queue_max_length",
                     "--heartbeat_timeout", "--reconnect_grace"):
            self.assertIn(flag, out)

    def test_agent_help_lists_its_flags(self):
        res = run(binary("TASKGRID_AGENT"), "--help")
        out = res.stdout + res.stderr
        for flag in ("--scheduler", "--slots", "--labels", "--id", "--max_output_bytes"):
            self.assertIn(flag, out)

    def test_scheduler_refuses_bad_flags_with_a_message(self):
        with tempfile.TemporaryDirectory() as d:
            cases = [
                (["--durability=sometimes"], "--durability must be full or normal"),
                (["--queue_max_length=emails"], "--queue_max_length"),
                (["--queue_max_length=emails=-1"], "--queue_max_length"),
                (["--default_max_attempts=0"], "--default_max_attempts"),
                (["--reconnect_grace=1500ms"], "--reconnect_grace at least 4 times"),
                (["--heartbeat_timeout=1s"], "--heartbeat_timeout must be at least 2"),
                (["--event_retention=0s"], "--event_retention must be at least 1s"),
                (["--max_agent_slots=0"], "--max_agent_slots must be at least 1"),
                # Reachable from other machines with no TLS or tokens: only
                # when asked for in so many words.
                (["--listen=0.0.0.0:0"], "pass --insecure"),
                (["--listen=[::]:0"], "pass --insecure"),
            ]
            for flags, message in cases:
                res = run(binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0",
                          f"--data_dir={d}/data", *flags)
                self.assertEqual(res.returncode, 2, flags)
                self.assertIn(message, res.stderr, flags)

    def test_scheduler_says_when_it_cannot_listen(self):
        with tempfile.TemporaryDirectory() as d:
            res = run(binary("TASKGRID_SCHEDULER"), "--listen=256.0.0.1:1", "--insecure",
                      f"--data_dir={d}/x")
            self.assertNotEqual(res.returncode, 0)
            self.assertIn("cannot listen on 256.0.0.1:1", res.stderr)

    def test_scheduler_says_who_can_reach_it(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            self.assertIn("listening on 127.0.0.1:0 only", c.scheduler.log())
        with harness.Cluster() as c:
            c.start_scheduler(["--listen=0.0.0.0:0", "--insecure"])
            self.assertRegex(c.scheduler.log(), r"--insecure: 0\.0\.0\.0:0 serves without TLS")

    def test_agent_refuses_bad_flags_with_a_message(self):
        cases = [
            (["--slots=0"], "--slots must be at least 1"),
            (["--labels=gpu"], "--labels"),
            (["--id=has space"], "--id"),
        ]
        for flags, message in cases:
            res = run(binary("TASKGRID_AGENT"), "--scheduler=127.0.0.1:1", *flags)
            self.assertEqual(res.returncode, 2, flags)
            self.assertIn(message, res.stderr, flags)


if __name__ == "__main__":
    unittest.main()
