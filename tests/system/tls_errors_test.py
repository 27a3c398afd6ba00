"""System test of what taskgridctl and the agent say when they cannot connect.

gRPC itself says "Socket closed" or "failed to connect to all addresses"
for every cause; the clients probe the connection by hand and name the
cause instead:

  - a scheduler that requires client certificates, and a client without
    one: the TLS handshake failed, the scheduler requires a client
    certificate (taskgridctl and the agent);
  - a scheduler whose certificate does not name the address dialled: the
    name, and the names the certificate has;
  - a plaintext client to a TLS scheduler: the scheduler serves TLS;
  - nothing listening: the connection was refused, is the scheduler
    running? (the only case that asks).

Needs openssl (deploy/make-certs.sh). Run through ctest (system.tls_errors),
or by hand with TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE_CERTS = os.path.join(ROOT, "deploy", "make-certs.sh")
WAIT = 30.0
RUNNING_HINT = "is taskgrid-scheduler running"


def make_certs(test_cls):
    if shutil.which("openssl") is None:
        raise unittest.SkipTest("openssl is not installed")
    d = tempfile.mkdtemp(prefix="taskgrid-tls-errors-")
    test_cls.addClassCleanup(shutil.rmtree, d, True)
    subprocess.run(["bash", MAKE_CERTS, d, "localhost", "w1"], check=True, capture_output=True,
                   timeout=60)
    # A scheduler certificate from the same CA naming only elsewhere.example.
    with open(os.path.join(d, "other.ext"), "w") as f:
        f.write("subjectAltName=DNS:elsewhere.example\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", f"{d}/other.key", "-out", f"{d}/other.csr",
                    "-subj", "/CN=elsewhere.example"], check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "x509", "-req", "-in", f"{d}/other.csr", "-CA", f"{d}/ca.pem",
                    "-CAkey", f"{d}/ca/ca.key", "-CAcreateserial", "-days", "2",
                    "-extfile", f"{d}/other.ext", "-out", f"{d}/other.pem"],
                   check=True, capture_output=True, timeout=60)
    return d


def ctl(addr, *args):
    argv = [harness.binary("TASKGRID_CTL"), f"--addr={addr}", "--timeout=10s", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)


class TlsErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = d = make_certs(cls)
        # Requires client certificates (mTLS).
        cls.mtls = harness.Cluster(scheduler_flags=[
            f"--tls_cert={d}/head.pem", f"--tls_key={d}/head.key", f"--tls_ca={d}/ca.pem"])
        cls.addClassCleanup(cls.mtls.close)
        cls.mtls.start_scheduler()
        # TLS with a certificate that names neither 127.0.0.1 nor localhost.
        cls.misnamed = harness.Cluster(scheduler_flags=[
            f"--tls_cert={d}/other.pem", f"--tls_key={d}/other.key", f"--tls_ca={d}/ca.pem"])
        cls.addClassCleanup(cls.misnamed.close)
        cls.misnamed.start_scheduler()

    def test_no_client_certificate(self):
        res = ctl(self.mtls.addr, f"--tls_ca={self.certs}/ca.pem", "stats")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn(f"TLS handshake with {self.mtls.addr} failed: the scheduler requires a "
                      "client certificate (--tls_cert/--tls_key)", res.stderr)
        self.assertNotIn(RUNNING_HINT, res.stderr)
        # With one it works.
        d = self.certs
        res = ctl(self.mtls.addr, f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/client.pem",
                  f"--tls_key={d}/client.key", "stats")
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_agent_without_a_client_certificate(self):
        agent = self.mtls.start_agent("w1", extra_flags=[f"--tls_ca={self.certs}/ca.pem",
                                                         f"--work_dir={self.certs}/wd-w1"])
        harness.wait_until(lambda: "cannot reach the scheduler" in agent.log(), timeout=WAIT,
                           what="the agent to fail")
        log = agent.log()
        self.assertIn("the scheduler requires a client certificate (--tls_cert/--tls_key)", log)
        self.assertNotIn(RUNNING_HINT, log)
        agent.stop()

    def test_plaintext_client_to_a_tls_scheduler(self):
        res = ctl(self.mtls.addr, "stats")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn(f"the scheduler at {self.mtls.addr} serves TLS", res.stderr)
        self.assertIn("--tls_ca", res.stderr)
        self.assertNotIn(RUNNING_HINT, res.stderr)

    def test_certificate_name_mismatch(self):
        d = self.certs
        res = ctl(self.misnamed.addr, f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/client.pem",
                  f"--tls_key={d}/client.key", "stats")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn(f"TLS handshake with {self.misnamed.addr} failed: the scheduler's "
                      "certificate does not name 127.0.0.1; names it has: elsewhere.example",
                      res.stderr)
        self.assertNotIn(RUNNING_HINT, res.stderr)

    def test_nothing_listening(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # The port is free again: nothing listens there.
        addr = f"127.0.0.1:{port}"
        res = ctl(addr, f"--tls_ca={self.certs}/ca.pem", "stats")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn(f"nothing listens at {addr} (connection refused): {RUNNING_HINT} there?",
                      res.stderr)
        res = ctl(addr, "stats")
        self.assertIn(f"nothing listens at {addr} (connection refused)", res.stderr)


if __name__ == "__main__":
    unittest.main()
