"""System test of certificates renewed while everything runs.

A scheduler (gRPC with mTLS, and the HTTPS dashboard, API and /metrics)
and an agent run with --tls_reload=1s, the agent behind a TCP relay that
can cut its connection. Nothing is restarted:

  - A renewed scheduler certificate (reissued by the same CA with
    deploy/make-certs.sh, moved into place) is what both ports present to
    the next connection; the agent's open stream goes on running tasks.
  - A new CA for everything (the scheduler's certificate and CA file, the
    agent's certificate and CA file, the clients'): once the files are in
    place, the next connection of each side uses them. The agent, cut off,
    connects again with its new certificate (the scheduler now takes only
    certificates of the new CA, and the agent trusts only the new CA, so
    a side that kept its old files could not connect) and runs a task;
    taskgridctl and HTTPS with the new client certificate are served, and
    with the old one refused.

Needs openssl (deploy/make-certs.sh). Run through ctest (system.cert_renewal),
or by hand with TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE_CERTS = os.path.join(ROOT, "deploy", "make-certs.sh")
WAIT = 30.0


def make_certs(into, ca_dir, *agents):
    subprocess.run(["bash", MAKE_CERTS, f"--ca-dir={ca_dir}", into, *agents], check=True,
                   capture_output=True, timeout=60)


def install(staged, live, names):
    """Moves each staged file into place whole, as a deploy tool does."""
    for name in names:
        tmp = os.path.join(live, name + ".new")
        shutil.copy2(os.path.join(staged, name), tmp)
        os.replace(tmp, os.path.join(live, name))


def der(pem_path):
    with open(pem_path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def served_cert(port, d, client="client", h2=False):
    """The certificate (DER) the server on `port` presents, connecting with
    d/ca.pem's trust and d/CLIENT.pem; None when the handshake fails."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # what is presented, trusted or not
    ctx.load_cert_chain(f"{d}/{client}.pem", f"{d}/{client}.key")
    if h2:
        ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                return tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def https_get(port, path, d, client_dir=None):
    """(status, body) of GET https://127.0.0.1:port/path trusting d's CA,
    with the client certificate of client_dir (default: d)."""
    ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
    c = client_dir or d
    ctx.load_cert_chain(f"{c}/client.pem", f"{c}/client.key")
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx,
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class CertRenewalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls.tmp = t = tempfile.mkdtemp(prefix="taskgrid-renew-")
        cls.addClassCleanup(shutil.rmtree, t, True)
        cls.live = d = os.path.join(t, "live")
        make_certs(d, os.path.join(t, "ca1"), "w1")
        port_file = os.path.join(t, "http_port")
        cls.cluster = c = harness.Cluster(
            scheduler_flags=[f"--tls_cert={d}/head.pem", f"--tls_key={d}/head.key",
                             f"--tls_ca={d}/ca.pem", "--tls_reload=1s",
                             "--http_listen=127.0.0.1:0", f"--http_port_file={port_file}"],
            ctl_flags=[f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/client.pem",
                       f"--tls_key={d}/client.key"])
        cls.addClassCleanup(c.close)
        c.start_scheduler()
        harness.wait_until(lambda: harness.read_text(port_file).strip() != "", timeout=WAIT,
                           what="the HTTP port file")
        cls.http_port = int(harness.read_text(port_file))
        cls.proxy = harness.TcpProxy(c.port)
        cls.addClassCleanup(cls.proxy.close)
        cls.agent = c.start_agent(
            "w1", scheduler_addr=cls.proxy.addr,
            extra_flags=[f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/w1.pem",
                         f"--tls_key={d}/w1.key", "--tls_reload=1s",
                         f"--work_dir={t}/wd-w1"])
        harness.wait_until(lambda: "w1" in c.agents_info(), timeout=WAIT,
                           what="agent w1 to connect")

    def run_task(self, task_id):
        c = self.cluster
        res = c.ctl("submit", f"--id={task_id}", "--", "/bin/echo", task_id)
        self.assertEqual(res.returncode, 0, res.stderr)
        c.wait_state(task_id, ["SUCCEEDED"], timeout=WAIT)

    def test_1_a_renewed_scheduler_certificate_is_served_on_both_ports(self):
        d, c = self.live, self.cluster
        old = der(f"{d}/head.pem")
        self.assertEqual(served_cert(c.port, d, h2=True), old)
        self.assertEqual(served_cert(self.http_port, d), old)
        staged = os.path.join(self.tmp, "renewed")
        make_certs(staged, os.path.join(self.tmp, "ca1"))  # the same CA
        new = der(f"{staged}/head.pem")
        self.assertNotEqual(new, old)
        install(staged, d, ["head.key", "head.pem"])
        harness.wait_until(lambda: served_cert(c.port, d, h2=True) == new, timeout=WAIT,
                           interval=0.2, what="the gRPC port to present the renewed certificate")
        harness.wait_until(lambda: served_cert(self.http_port, d) == new, timeout=WAIT,
                           interval=0.2, what="the HTTPS port to present the renewed certificate")
        self.assertIn("HTTPS: serving the renewed", c.scheduler.log())
        # The agent's stream, opened before, goes on.
        self.run_task("renew-1")
        self.assertEqual(https_get(self.http_port, "/api/v1/tasks/renew-1", d)[0], 200)
        self.assertTrue(c.scheduler.alive())

    def test_2_a_new_ca_is_taken_by_both_sides_without_a_restart(self):
        d, c = self.live, self.cluster
        old_client = os.path.join(self.tmp, "old-client")
        os.makedirs(old_client)
        for name in ["ca.pem", "client.pem", "client.key"]:
            shutil.copy2(os.path.join(d, name), old_client)
        staged = os.path.join(self.tmp, "ca2-files")
        make_certs(staged, os.path.join(self.tmp, "ca2"), "w1")
        new_head = der(f"{staged}/head.pem")
        # Keys first: a certificate whose key is not in place yet is not taken.
        install(staged, d, ["head.key", "head.pem", "w1.key", "w1.pem", "client.key",
                            "client.pem", "ca.pem"])
        harness.wait_until(lambda: served_cert(c.port, d, h2=True) == new_head, timeout=WAIT,
                           interval=0.2, what="the gRPC port to present the new CA's certificate")
        harness.wait_until(lambda: served_cert(self.http_port, d) == new_head, timeout=WAIT,
                           interval=0.2, what="the HTTPS port to present the new CA's certificate")
        # Waits out the client CA's reload on the HTTPS port too.
        harness.wait_until(lambda: https_get(self.http_port, "/api/v1/cluster", d)[0] == 200,
                           timeout=WAIT, interval=0.2,
                           what="HTTPS to take the new CA's client certificate")
        status, body = https_get(self.http_port, "/api/v1/cluster", d, client_dir=old_client)
        self.assertEqual(status, 403, body)
        self.assertIn("client CA", body)

        # The agent's open stream was opened with the old files; a new one
        # needs the new ones on both sides.
        connects = self.agent.log().count("connected to")
        self.assertGreaterEqual(self.proxy.cut(), 1)
        harness.wait_until(lambda: self.agent.log().count("connected to") > connects,
                           timeout=WAIT, what="the agent to connect again")
        self.run_task("renew-2")
        self.assertTrue(self.agent.alive())

        res = subprocess.run(
            [harness.binary("TASKGRID_CTL"), f"--addr={c.addr}", "--timeout=5s",
             f"--tls_ca={d}/ca.pem", f"--tls_cert={old_client}/client.pem",
             f"--tls_key={old_client}/client.key", "get", "renew-2"],
            capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertNotIn("renew-2", res.stdout)


if __name__ == "__main__":
    unittest.main()
