"""System test of the trust boundary: TLS, mTLS agent identity, bearer tokens.

The certificates come from deploy/make-certs.sh (so it is tested too), made
into a temporary directory with openssl:

  - mTLS: a scheduler that requires client certificates runs a task end to
    end for an agent with its own certificate, driven by taskgridctl with
    TLS flags (and with the TASKGRID_TLS_* variables); a plaintext client
    and a TLS client without a certificate are refused; an agent whose
    Hello id is not a name of its certificate is refused PERMISSION_DENIED,
    also when it claims the id of a connected agent (the check comes before
    the id is registered, so not ALREADY_EXISTS).
  - tokens (TLS, no client certificates): each role calls what it may and
    gets PERMISSION_DENIED for a call of each other service; no or an
    unknown token is UNAUTHENTICATED; health answers without a token; an
    agent without the agent role is refused.
  - start-up: tokens without TLS, a bad tokens file (named with its line),
    and a non-loopback --listen with TLS but no client authentication are
    refused before serving.

Needs openssl and /usr/bin/python3 with python3-grpcio (for the health call).
Run through ctest (system.tls), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE_CERTS = os.path.join(ROOT, "deploy", "make-certs.sh")
WAIT = 30.0


def make_certs(test_cls, *agents):
    """A temp dir with ca.pem, head.*, client.* and AGENT.* for `agents`."""
    if shutil.which("openssl") is None:
        raise unittest.SkipTest("openssl is not installed")
    d = tempfile.mkdtemp(prefix="taskgrid-tls-")
    test_cls.addClassCleanup(shutil.rmtree, d, True)
    subprocess.run(["bash", MAKE_CERTS, d, *agents], check=True,
                   capture_output=True, timeout=60)
    return d


def write_secret(path, text):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    return path


def server_tls(d, ca=True):
    flags = [f"--tls_cert={d}/head.pem", f"--tls_key={d}/head.key"]
    return flags + ([f"--tls_ca={d}/ca.pem"] if ca else [])


def wait_log(process, text, what):
    harness.wait_until(lambda: text in process.log(), timeout=WAIT, interval=0.1, what=what)


class MutualTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = d = make_certs(cls, "w1", "w2")
        client = [f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/client.pem",
                  f"--tls_key={d}/client.key"]
        cls.cluster = c = harness.Cluster(scheduler_flags=server_tls(d), ctl_flags=client)
        cls.addClassCleanup(c.close)
        c.start_scheduler()
        c.start_agent("w1", extra_flags=[f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/w1.pem",
                                         f"--tls_key={d}/w1.key"])
        harness.wait_until(lambda: "w1" in c.agents_info(), what="agent w1 to connect")

    def run_ctl(self, *args, env=None):
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}", "--timeout=10s",
                *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT, env=env)

    def test_task_runs_end_to_end_over_mtls(self):
        c = self.cluster
        c.ctl("submit", "--id=mtls-e2e", "--agents=w1", "--wait", "--", "/bin/echo", "over tls",
              check=True)
        task = c.task("mtls-e2e")
        self.assertEqual(task["state"], "TASK_STATE_SUCCEEDED")
        self.assertIn("w1", json.dumps(task))

    def test_ctl_reads_the_tls_variables(self):
        d = self.certs
        env = dict(os.environ, TASKGRID_TLS_CA=f"{d}/ca.pem",
                   TASKGRID_TLS_CERT=f"{d}/client.pem", TASKGRID_TLS_KEY=f"{d}/client.key")
        res = self.run_ctl("--json", "agents", env=env)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("w1", res.stdout)

    def test_clients_without_a_certificate_are_refused(self):
        plain = self.run_ctl("stats")
        self.assertEqual(plain.returncode, 1, plain.stdout + plain.stderr)
        self.assertIn("UNAVAILABLE", plain.stderr)
        no_cert = self.run_ctl(f"--tls_ca={self.certs}/ca.pem", "stats")
        self.assertEqual(no_cert.returncode, 1, no_cert.stdout + no_cert.stderr)
        self.assertIn("UNAVAILABLE", no_cert.stderr)
        # A token or certificate without a CA is a usage error: never sent in plaintext.
        bad = self.run_ctl(f"--tls_cert={self.certs}/client.pem",
                           f"--tls_key={self.certs}/client.key", "stats")
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--tls_ca", bad.stderr)

    def start_impostor(self, name, cert, agent_id):
        d = self.certs
        return self.cluster.start_agent(
            agent_id, extra_flags=[f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/{cert}.pem",
                                   f"--tls_key={d}/{cert}.key", f"--work_dir={d}/wd-{name}"])

    def test_agent_id_not_in_its_certificate_is_refused(self):
        # Certificate w1, Hello id w2.
        impostor = self.start_impostor("w2-as-w1", "w1", "w2")
        wait_log(impostor, "PERMISSION_DENIED", "the agent to be refused")
        self.assertIn("agent id w2 is not a name of the client certificate (its names: w1)",
                      impostor.log())
        impostor.stop()
        self.assertNotIn("w2", self.cluster.agents_info())

    def test_agent_cannot_take_over_a_connected_agents_id(self):
        # Certificate w2 claiming w1, which is connected: refused for the
        # certificate, before the id could clash (not ALREADY_EXISTS).
        impostor = self.start_impostor("w1-as-w2", "w2", "w1")
        wait_log(impostor, "PERMISSION_DENIED", "the agent to be refused")
        self.assertIn("agent id w1 is not a name of the client certificate (its names: w2)",
                      impostor.log())
        self.assertNotIn("ALREADY_EXISTS", impostor.log())
        impostor.stop()
        self.assertIn("w1", self.cluster.agents_info())


ROLES = {
    "rita": ("reader", "reader-token-rita-0123456789"),
    "sam": ("submitter", "submitter-token-sam-0123456789"),
    "w1": ("agent", "agent-token-w1-0123456789"),
    "ada": ("admin", "admin-token-ada-0123456789"),
}


class TokenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = d = make_certs(cls)
        lines = "".join(f"{n} {r} {t}\n" for n, (r, t) in ROLES.items())
        tokens = write_secret(os.path.join(d, "tokens"), "# test principals\n\n" + lines)
        cls.token_files = {n: write_secret(os.path.join(d, f"{n}.token"), t + "\n")
                           for n, (_, t) in ROLES.items()}
        cls.cluster = c = harness.Cluster(
            scheduler_flags=server_tls(d, ca=False) + [f"--tokens_file={tokens}"])
        cls.addClassCleanup(c.close)
        c.start_scheduler()
        env = dict(os.environ, TASKGRID_TOKEN_FILE=cls.token_files["w1"],
                   CREDENTIALS_DIRECTORY=d, TG_VISIBLE="yes")
        c.start_agent("w1", extra_flags=[f"--tls_ca={d}/ca.pem",
                                         f"--token_file={cls.token_files['w1']}"], env=env)
        harness.wait_until(lambda: "w1" in cls.as_("ada", "--json", "agents").stdout,
                           what="agent w1 to connect")

    @classmethod
    def as_(cls, who, *args):
        """taskgridctl as principal `who` (None: TLS, no token)."""
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={cls.cluster.addr}", "--timeout=10s",
                f"--tls_ca={cls.certs}/ca.pem"]
        if who is not None:
            argv.append(f"--token_file={cls.token_files[who]}")
        return subprocess.run(argv + [str(a) for a in args], capture_output=True, text=True,
                              timeout=WAIT)

    def assertDenied(self, res, who, role):
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("PERMISSION_DENIED", res.stderr)
        self.assertIn(f"{who} (", res.stderr)
        self.assertIn(f"needs role {role}", res.stderr)
        self.assertNotIn(ROLES[who][1], res.stderr)

    def test_reader(self):
        for args in (("stats",), ("agents",), ("list",), ("job", "list")):
            res = self.as_("rita", *args)
            self.assertEqual(res.returncode, 0, res.stderr)
        self.assertDenied(self.as_("rita", "submit", "--builtin=noop"), "rita", "submitter")
        self.assertDenied(self.as_("rita", "drain", "w1"), "rita", "admin")

    def test_submitter_runs_a_task_end_to_end(self):
        res = self.as_("sam", "submit", "--id=token-e2e", "--wait", "--", "/bin/echo", "hi")
        self.assertEqual(res.returncode, 0, res.stderr)
        got = self.as_("sam", "--json", "get", "token-e2e")
        self.assertEqual(json.loads(got.stdout)["state"], "TASK_STATE_SUCCEEDED")
        # A task no agent may run, cancelled.
        res = self.as_("sam", "submit", "--id=token-cancel", "--agents=nobody", "--builtin=noop")
        self.assertEqual(res.returncode, 0, res.stderr)
        res = self.as_("sam", "cancel", "token-cancel")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertDenied(self.as_("sam", "drain", "w1"), "sam", "admin")

    def test_agent_token_only_serves_agents(self):
        self.assertDenied(self.as_("w1", "list"), "w1", "reader")
        self.assertDenied(self.as_("w1", "submit", "--builtin=noop"), "w1", "submitter")
        self.assertDenied(self.as_("w1", "drain", "w1"), "w1", "admin")

    def test_admin_calls_everything(self):
        self.assertEqual(self.as_("ada", "stats").returncode, 0)
        res = self.as_("ada", "submit", "--id=admin-task", "--builtin=noop")
        self.assertEqual(res.returncode, 0, res.stderr)
        # Past the role check: an unknown agent is NOT_FOUND.
        res = self.as_("ada", "drain", "no-such-agent")
        self.assertEqual(res.returncode, 1)
        self.assertIn("NOT_FOUND", res.stderr)

    def test_an_agent_token_acts_only_as_its_own_agent_id(self):
        d = self.certs
        impostor = self.cluster.start_agent(
            "w2", extra_flags=[f"--tls_ca={d}/ca.pem", f"--token_file={self.token_files['w1']}",
                               f"--work_dir={d}/wd-w2"])
        wait_log(impostor, "PERMISSION_DENIED", "the agent to be refused")
        self.assertIn("agent id w2 is not one the token of w1 may act as", impostor.log())
        impostor.stop()
        self.assertNotIn("w2", self.as_("ada", "agents").stdout)
        # Nor may it claim from the board as another owner.
        res = self.as_("w1", "board", "claim", "--owner=w2", "--queue=nothing-here")
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("owner w2 is not one the token of w1 may act as", res.stderr)
        res = self.as_("w1", "board", "claim", "--owner=w1", "--queue=nothing-here")
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)

    def test_tasks_do_not_inherit_the_agents_credentials(self):
        # w1 runs with TASKGRID_TOKEN_FILE and CREDENTIALS_DIRECTORY set
        # (setUpClass), as under systemd or after exporting taskgridctl's.
        res = self.as_("sam", "submit", "--id=env-probe", "--agents=w1", "--wait", "--",
                       "sh", "-c", "env")
        self.assertEqual(res.returncode, 0, res.stderr)
        task = json.loads(self.as_("sam", "--json", "get", "env-probe").stdout)
        out = base64.b64decode(task["result"]["stdout_tail"]).decode()
        self.assertIn("TG_VISIBLE=yes", out)
        self.assertIn("TASKGRID_TASK_ID=env-probe", out)
        self.assertNotIn("TASKGRID_TOKEN_FILE", out)
        self.assertNotIn("CREDENTIALS_DIRECTORY", out)
        self.assertNotIn(ROLES["w1"][1], out)

    def test_agent_needs_the_agent_role(self):
        d = self.certs
        reader_agent = self.cluster.start_agent(
            "rita-agent", extra_flags=[f"--tls_ca={d}/ca.pem",
                                       f"--token_file={self.token_files['rita']}",
                                       f"--work_dir={d}/wd-rita"])
        wait_log(reader_agent, "PERMISSION_DENIED", "the agent to be refused")
        self.assertIn("needs role agent", reader_agent.log())
        reader_agent.stop()
        self.assertNotIn("rita-agent", self.as_("ada", "agents").stdout)

    def test_missing_or_unknown_token_is_unauthenticated(self):
        res = self.as_(None, "stats")
        self.assertEqual(res.returncode, 1)
        self.assertIn("UNAUTHENTICATED", res.stderr)
        bogus = write_secret(os.path.join(self.certs, "bogus.token"), "not-a-token-0123456789")
        argv = [harness.binary("TASKGRID_CTL"), f"--addr={self.cluster.addr}", "--timeout=10s",
                f"--tls_ca={self.certs}/ca.pem", f"--token_file={bogus}", "stats"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)
        self.assertEqual(res.returncode, 1)
        self.assertIn("UNAUTHENTICATED", res.stderr)

    def test_health_needs_no_token(self):
        try:
            import grpc
        except ImportError:
            self.skipTest("no python3-grpcio")
        with open(os.path.join(self.certs, "ca.pem"), "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        with grpc.secure_channel(self.cluster.addr, creds) as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            # HealthCheckResponse{status: SERVING}, serialized.
            self.assertEqual(check(b"", timeout=WAIT), b"\x08\x01")
            with self.assertRaises(grpc.RpcError) as cm:
                ch.unary_unary("/taskgrid.v1.ClusterService/GetClusterStats")(b"", timeout=WAIT)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


class StartupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = make_certs(cls)
        cls.dir = tempfile.mkdtemp(prefix="taskgrid-tls-start-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)

    def start(self, *flags):
        argv = [harness.binary("TASKGRID_SCHEDULER"), f"--data_dir={self.dir}/data", *flags]
        return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT)

    def test_refusals(self):
        d = self.certs
        tokens = write_secret(os.path.join(d, "tokens"),
                              "ada admin admin-token-0123456789\n# c\nbob writer x-0123456789abcdef\n")
        good = write_secret(os.path.join(d, "good-tokens"), "ada admin admin-token-0123456789\n")
        cases = [
            ([f"--tokens_file={good}", "--listen=127.0.0.1:0"], "--tokens_file needs --tls_cert"),
            (server_tls(d, ca=False) + [f"--tokens_file={tokens}", "--listen=127.0.0.1:0"],
             f"{tokens}:3: unknown role 'writer'"),
            (server_tls(d, ca=False) + ["--listen=192.0.2.1:0"],
             "has TLS but neither client certificates nor tokens"),
            (["--listen=192.0.2.1:0"], "has no TLS or tokens"),
            ([f"--tls_ca={d}/ca.pem", "--listen=127.0.0.1:0"], "--tls_ca (client certificates)"),
            ([f"--tls_cert={d}/client.key", f"--tls_key={d}/head.key", "--listen=127.0.0.1:0"],
             f"--tls_cert (certificate) {d}/client.key: not a PEM certificate"),
        ]
        for flags, message in cases:
            with self.subTest(flags=flags):
                res = self.start(*flags)
                self.assertNotEqual(res.returncode, 0, res.stderr)
                self.assertIn(message, res.stdout + res.stderr)
                self.assertNotIn("admin-token-0123456789", res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
