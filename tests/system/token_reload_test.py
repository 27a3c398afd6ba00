"""System test of tokens changed while everything runs.

  - The scheduler reads --tokens_file again on SIGHUP: a token added works
    at once for taskgridctl, a removed one is refused (UNAUTHENTICATED),
    and a file that does not parse is logged (file:line) and
    changes nothing.

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


if __name__ == "__main__":
    unittest.main()
