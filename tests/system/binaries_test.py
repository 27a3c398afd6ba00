"""The binaries as a new user meets them: --help, and bad flags."""
import difflib
import os
import re
import socket
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
        for flag in ("--listen", "--data_dir", "--store", "--durability", "--queue_max_length",
                     "--heartbeat_timeout", "--reconnect_grace", "--standby", "--lease_ttl",
                     "--advertise"):
            self.assertIn(flag, out)

    def test_agent_help_lists_its_flags(self):
        res = run(binary("TASKGRID_AGENT"), "--help")
        out = res.stdout + res.stderr
        for flag in ("--scheduler", "--slots", "--labels", "--id", "--max_output_bytes",
                     "--step_supervisor"):
            self.assertIn(flag, out)

    def test_cli_reference_page_is_what_help_prints(self):
        """docs/cli.md is `taskgridctl help reference`, and each of its
        command sections is what `taskgridctl help NAME` prints: one source
        for the page and the help."""
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        page_path = os.path.join(root, "docs", "cli.md")
        with open(page_path, encoding="utf-8") as f:
            page = f.read()
        res = run(binary("TASKGRID_CTL"), "help", "reference")
        self.assertEqual(res.returncode, 0, res.stderr)
        if res.stdout != page:
            diff = "".join(difflib.unified_diff(
                page.splitlines(keepends=True), res.stdout.splitlines(keepends=True),
                "docs/cli.md", "taskgridctl help reference"))
            self.fail("docs/cli.md is not what taskgridctl prints; write it again with "
                      "`taskgridctl help reference > docs/cli.md`:\n" + diff[:4000])
        sections = re.findall(r"^## ([^\n]+)\n\n```text\n(.*?)```\n", page, re.M | re.S)
        usage = run(binary("TASKGRID_CTL"), "help").stdout
        listed = re.findall(r"^  (\S.*)\n      \S", usage, re.M)
        groups = {line.split(" ")[0] for line in listed if re.match(r"\w+ [a-z]", line)}
        self.assertEqual(groups, {"job", "board", "queue", "schedule"})
        self.assertEqual(len(sections), len(listed) + len(groups),
                         "a section per command taskgridctl help lists, and per group")
        for name, body in sections:
            res = run(binary("TASKGRID_CTL"), "help", *name.split(" "))
            self.assertEqual(res.returncode, 0, name)
            self.assertEqual(res.stdout, body, "taskgridctl help " + name)

    def test_version_names_the_build_and_help_no_build_paths(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for name in ("TASKGRID_SCHEDULER", "TASKGRID_AGENT", "TASKGRID_CTL"):
            res = run(binary(name), "--version")
            self.assertRegex(res.stdout, r"^taskgrid 0\.1\.0 \((Debug|Release|RelWithDebInfo|"
                             r"MinSizeRel|unspecified) build\)\n$", name)
        for name, main in (("TASKGRID_SCHEDULER", "scheduler/main.cc"),
                           ("TASKGRID_AGENT", "agent/main.cc")):
            res = run(binary(name), "--help")
            out = res.stdout + res.stderr
            self.assertIn(f"Flags from {main}:", out)
            self.assertIn("--flagfile=FILE", out, name)
            self.assertNotIn(root.lstrip("/"), out, name)

    def test_scheduler_refuses_bad_flags_with_a_message(self):
        with tempfile.TemporaryDirectory() as d:
            cases = [
                (["--durability=sometimes"], "--durability must be full or normal"),
                (["--store=mysql://db/tasks"], "--store must be sqlite or a postgres:// URL"),
                (["--store=postgres://db/tasks", "--durability=normal"],
                 "--durability is SQLite's"),
                (["--store=postgres://db/tasks", "--lease_ttl=500ms"],
                 "--lease_ttl must be at least 1s, not 500ms"),
                (["--queue_max_length=emails"], "--queue_max_length"),
                (["--queue_max_length=emails=-1"], "--queue_max_length"),
                (["--default_max_attempts=0"], "--default_max_attempts"),
                (["--reconnect_grace=1500ms"], "--reconnect_grace at least 4 times"),
                (["--heartbeat_timeout=1s"], "--heartbeat_timeout must be at least 2"),
                (["--event_retention=0s"], "--event_retention must be at least 1s"),
                (["--max_agent_slots=0"], "--max_agent_slots must be at least 1"),
                (["--max_job_tasks=0"], "--max_job_tasks must be at least 1"),
                (["--max_chain_length=-3"], "--max_chain_length must be at least 1, not -3"),
                (["--max_attempt_history=0"], "--max_attempt_history must be at least 1"),
                (["--default_claim_lease=2h"], "--default_claim_lease must be positive and at most"),
                (["--default_claim_lease=0s"], "--default_claim_lease must be positive"),
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
            # Logged just after the port file is written: waited for.
            harness.wait_until(lambda: "listening on 127.0.0.1:0 only" in c.scheduler.log(),
                               what="the scheduler to say who can reach it")
        with harness.Cluster() as c:
            c.start_scheduler(["--listen=0.0.0.0:0", "--insecure"])
            harness.wait_until(
                lambda: re.search(r"--insecure: 0\.0\.0\.0:0 serves without TLS", c.scheduler.log()),
                what="the scheduler to say it serves without TLS")

    def test_scheduler_and_agent_take_their_defaults_from_the_environment(self):
        # As the guide's restart section relies on: TASKGRID_ADDR and
        # TASKGRID_DATA_DIR stand in for --listen, --scheduler and --data_dir.
        with tempfile.TemporaryDirectory() as d:
            with socket.socket() as probe:  # a free port, released for the scheduler
                probe.bind(("127.0.0.1", 0))
                addr = f"127.0.0.1:{probe.getsockname()[1]}"
            env = dict(os.environ, TASKGRID_ADDR=addr, TASKGRID_DATA_DIR=f"{d}/data")
            procs = []
            try:
                procs.append(harness.Process([binary("TASKGRID_SCHEDULER")], f"{d}/s.log", env=env))
                procs.append(harness.Process([binary("TASKGRID_AGENT"), "--id=from-env"],
                                             f"{d}/a.log", env=env))

                def connected():
                    res = run(binary("TASKGRID_CTL"), f"--addr={addr}", "agents")
                    return res.returncode == 0 and "from-env" in res.stdout
                harness.wait_until(connected, what="the agent to connect through TASKGRID_ADDR")
                self.assertTrue(os.path.exists(f"{d}/data/taskgrid.db"))
            finally:
                for p in procs:
                    p.close()

    def test_agent_refuses_bad_flags_with_a_message(self):
        cases = [
            (["--slots=-1"], "--slots must be at least 1"),
            (["--labels=gpu"], "--labels"),
            (["--resources=cpu=lots"], "--resources: resource cpu=\"lots\""),
            (["--resources=gpu=1,gpu=2"], "--resources: resource gpu is given twice"),
            (["--id=has space"], "--id"),
            # No step supervisor, no steps: the agent would not be able to
            # kill a step's processes should it die.
            (["--step_supervisor=/nonexistent/taskgrid-step-supervisor"],
             "cannot run steps: /nonexistent/taskgrid-step-supervisor is not an executable file"),
        ]
        for flags, message in cases:
            res = run(binary("TASKGRID_AGENT"), "--scheduler=127.0.0.1:1", *flags)
            self.assertEqual(res.returncode, 2, flags)
            self.assertIn(message, res.stderr, flags)


if __name__ == "__main__":
    unittest.main()
