"""System test of tokens changed while everything runs.

  - The scheduler reads --tokens_file again on SIGHUP: a token added works
    at once for taskgridctl, a removed one is refused (UNAUTHENTICATED),
    a connected agent whose token is removed is cut off at its next
    message, and a file that does not parse is logged (file:line) and
    changes nothing.
  - An agent the scheduler refuses (an unknown token, a token without the
    agent role) logs why once, with what to fix, and backs off; the
    scheduler's log does not grow a line per retry. Once its token is in
    the scheduler's file (reloaded), it connects without a restart.
  - taskgridctl and the agent warn about a token file other users may
    read, as the scheduler does about its own.

Needs openssl (deploy/make-certs.sh). Run through ctest (system.token_reload),
or by hand with TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE_CERTS = os.path.join(ROOT, "deploy", "make-certs.sh")
WAIT = 30.0

ADA = "admin-token-ada-0123456789"
RITA = "reader-token-rita-0123456789"
NIA = "reader-token-nia-0123456789"
W1 = "agent-token-w1-0123456789"
W2 = "agent-token-w2-0123456789"


def make_certs(test_cls):
    if shutil.which("openssl") is None:
        raise unittest.SkipTest("openssl is not installed")
    d = tempfile.mkdtemp(prefix="taskgrid-reload-")
    test_cls.addClassCleanup(shutil.rmtree, d, True)
    subprocess.run(["bash", MAKE_CERTS, d, "localhost"], check=True, capture_output=True,
                   timeout=60)
    return d


def write_secret(path, text, mode=0o600):
    # Replaced whole, as an editor or a deploy tool does.
    tmp = path + ".new"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path


def refusal_time(line):
    """Seconds (of the day) of a log line "2026-11-27T06:03:31.123 E agent: ..."."""
    stamp = line.split(" ", 1)[0]
    clock = stamp.split("T", 1)[1]
    h, m, sec = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def lines(**principals):
    """tokens file text: name=(roles, token)."""
    return "".join(f"{n} {r} {t}\n" for n, (r, t) in principals.items())


class ReloadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = d = make_certs(cls)
        cls.tokens = os.path.join(d, "tokens")
        write_secret(cls.tokens, lines(ada=("admin", ADA), rita=("reader", RITA),
                                       w1=("agent", W1)))
        cls.cluster = c = harness.Cluster(scheduler_flags=[
            f"--tls_cert={d}/head.pem", f"--tls_key={d}/head.key", f"--tokens_file={cls.tokens}"])
        cls.addClassCleanup(c.close)
        c.start_scheduler()
        cls.reloads = 0

    def token_file(self, name, token, mode=0o600):
        return write_secret(os.path.join(self.certs, f"{name}.token"), token + "\n", mode)

    def ctl(self, token, *args):
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}", "--timeout=10s",
                f"--tls_ca={self.certs}/ca.pem"]
        if token is not None:
            argv.append(f"--token_file={self.token_file('ctl-' + token, token)}")
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=WAIT)

    def agents(self):
        res = self.ctl(ADA, "--json", "agents")
        self.assertEqual(res.returncode, 0, res.stderr)
        return res.stdout

    def reload(self, text, expect):
        """Writes the tokens file, SIGHUPs the scheduler, and waits for its
        log line saying the outcome (`expect`, e.g. "reloaded")."""
        write_secret(self.tokens, text)
        sched = self.cluster.scheduler
        before = sched.log().count(expect)
        sched.signal(signal.SIGHUP)
        harness.wait_until(lambda: sched.log().count(expect) > before, timeout=WAIT,
                           what=f"the scheduler to log {expect!r}")
        self.assertTrue(sched.alive(), "SIGHUP must not stop the scheduler")
        return sched.log()

    def start_agent(self, agent_id, token, *flags, mode=0o600):
        d = self.certs
        return self.cluster.start_agent(
            agent_id, extra_flags=[f"--tls_ca={d}/ca.pem",
                                   f"--token_file={self.token_file(agent_id, token, mode)}",
                                   f"--work_dir={d}/wd-{agent_id}", "--refused_retry_max=2s",
                                   "--log_level=debug", *flags])

    def test_1_added_token_works_and_removed_one_is_refused_after_sighup(self):
        self.assertIn("UNAUTHENTICATED", self.ctl(NIA, "stats").stderr)
        self.assertEqual(self.ctl(RITA, "stats").returncode, 0)
        log = self.reload(lines(ada=("admin", ADA), nia=("reader", NIA), w1=("agent", W1)),
                          "reloaded 3 bearer tokens")
        self.assertIn("added nia; removed rita; changed none", log)
        self.assertNotIn(NIA, log)
        res = self.ctl(NIA, "stats")
        self.assertEqual(res.returncode, 0, res.stderr)
        res = self.ctl(RITA, "stats")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("UNAUTHENTICATED", res.stderr)
        self.assertIn("unknown bearer token", res.stderr)

    def test_2_a_file_that_does_not_parse_keeps_the_tokens_from_before(self):
        good = lines(ada=("admin", ADA), nia=("reader", NIA), w1=("agent", W1))
        self.reload(good, "reloaded 3 bearer tokens")
        log = self.reload(good + "bob writer writer-token-bob-0123456789\n",
                          "tokens not reloaded")
        self.assertIn(f"{self.tokens}:4: unknown role 'writer'", log)
        self.assertEqual(self.ctl(NIA, "stats").returncode, 0)
        self.assertIn("UNAUTHENTICATED", self.ctl("writer-token-bob-0123456789", "stats").stderr)
        os.unlink(self.tokens)
        sched = self.cluster.scheduler
        before = sched.log().count("tokens not reloaded")
        sched.signal(signal.SIGHUP)
        harness.wait_until(lambda: sched.log().count("tokens not reloaded") > before,
                           timeout=WAIT, what="the unreadable file to be logged")
        self.assertIn(f"--tokens_file {self.tokens}: cannot read it", sched.log())
        self.assertEqual(self.ctl(NIA, "stats").returncode, 0)
        self.reload(good, "reloaded 3 bearer tokens")

    def test_3_a_connected_agent_whose_token_is_removed_is_cut_off(self):
        self.reload(lines(ada=("admin", ADA), w1=("agent", W1)), "reloaded 2 bearer tokens")
        agent = self.start_agent("w1", W1)
        harness.wait_until(lambda: '"w1"' in self.agents(), timeout=WAIT, what="w1 to connect")
        self.reload(lines(ada=("admin", ADA)), "reloaded 1 bearer tokens")
        # Its next heartbeat is refused, and the stream ends.
        harness.wait_until(lambda: "the token of w1 is no longer in the tokens file"
                           in agent.log(), timeout=WAIT, what="w1's stream to be cut off")
        # Retrying, it is refused as any caller with an unknown token.
        harness.wait_until(lambda: "refused this agent (w1)" in agent.log(), timeout=WAIT,
                           what="w1 to be refused")
        # Given back, it comes back without a restart.
        self.reload(lines(ada=("admin", ADA), w1=("agent", W1)), "reloaded 2 bearer tokens")
        harness.wait_until(lambda: "accepts this agent now" in agent.log(), timeout=WAIT,
                           what="w1 to connect again")
        self.assertTrue(agent.alive())
        agent.stop()

    def test_4_a_refused_agent_backs_off_says_why_once_and_connects_once_allowed(self):
        self.reload(lines(ada=("admin", ADA), w1=("agent", W1)), "reloaded 2 bearer tokens")
        sched = self.cluster.scheduler
        sched_refusals = sched.log().count("refused /taskgrid.v1.AgentService/Connect")
        agent = self.start_agent("w2", W2)
        # Several retries (each logged at debug level only).
        harness.wait_until(lambda: agent.log().count("refused this agent again") >= 3,
                           timeout=WAIT, what="w2 to be refused several times")
        log = agent.log()
        self.assertEqual(log.count("refused this agent (w2)"), 1, log)
        self.assertIn("UNAUTHENTICATED: unknown bearer token", log)
        self.assertIn(f"the token in --token_file {self.certs}/w2.token is not one the "
                      "scheduler knows", log)
        self.assertIn("no restart needed", log)
        self.assertNotIn(W2, log)
        # The retries back off: the waits are 0.5-1 s, then 1-2 s (the
        # maximum here is 2 s), not 0.1-1 s as for a lost connection.
        times = [refusal_time(line) for line in log.splitlines()
                 if "refused this agent (w2)" in line or "refused this agent again" in line]
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertGreaterEqual(len(gaps), 3, log)
        self.assertGreaterEqual(gaps[0], 0.45, gaps)
        for gap in gaps[1:]:
            self.assertGreaterEqual(gap, 0.95, gaps)
        # The scheduler wrote at most one line for all of them (none when
        # the same refusal was logged less than a minute before).
        self.assertLessEqual(
            sched.log().count("refused /taskgrid.v1.AgentService/Connect") - sched_refusals, 1,
            sched.log()[-3000:])

        # The scheduler's file gets w2's token: it connects, no restart.
        self.reload(lines(ada=("admin", ADA), w1=("agent", W1), w2=("agent", W2)),
                    "reloaded 3 bearer tokens")
        harness.wait_until(lambda: '"w2"' in self.agents(), timeout=WAIT,
                           what="w2 to connect after the reload")
        self.assertIn("accepts this agent now", agent.log())
        self.assertTrue(agent.alive())
        agent.stop()

    def test_5_an_agent_with_a_reader_token_is_told_it_lacks_role_agent(self):
        self.reload(lines(ada=("admin", ADA), rita=("reader", RITA)), "reloaded 2 bearer tokens")
        agent = self.start_agent("rita", RITA)
        harness.wait_until(lambda: "refused this agent (rita)" in agent.log(), timeout=WAIT,
                           what="the agent to be refused")
        log = agent.log()
        self.assertIn("PERMISSION_DENIED", log)
        self.assertIn(f"the token in --token_file {self.certs}/rita.token lacks role agent", log)
        agent.stop()

    def test_6_clients_warn_about_a_token_file_others_may_read(self):
        self.reload(lines(ada=("admin", ADA), w1=("agent", W1)), "reloaded 2 bearer tokens")
        path = self.token_file("loose", ADA, mode=0o644)
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}", "--timeout=10s",
                f"--tls_ca={self.certs}/ca.pem", f"--token_file={path}", "stats"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn(f"warning: --token_file {path} can be read by other users (mode 644): "
                      "chmod 600 it", res.stderr)
        os.chmod(path, 0o600)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertNotIn("warning", res.stderr)

        agent = self.start_agent("w1", W1, mode=0o640)
        harness.wait_until(
            lambda: f"--token_file {self.certs}/w1.token can be read by other users (mode 640)"
            in agent.log(), timeout=WAIT, what="the agent's warning")
        agent.stop()


if __name__ == "__main__":
    unittest.main()
