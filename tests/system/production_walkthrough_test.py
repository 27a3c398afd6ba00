"""System test of the guide's production set-up (docs/production.md), run
from deploy/ itself.

Its "Running it for real" installs deploy/make-certs.sh's files,
deploy/*.flags and deploy/taskgrid-*.service; this test runs what those
files say, read from them rather than copied, so the walkthrough and the
files cannot drift apart:

  - make-certs.sh makes the CA and the certificates into a temporary
    directory (the CA key apart, in its own directory), for two agents
    whose ids are host names (the units' --id=%H);
  - an /etc/taskgrid of its own gets the certificates under the names the
    units load (head.pem, agent.pem, ...), the flags files, and a tokens
    file with a token for each agent (named after its id), a submitter, an
    admin and a Prometheus reader;
  - the scheduler and two agents run with the units' ExecStart lines (with
    a credentials directory made from any LoadCredential= lines, as
    systemd does); only paths (/etc, /var/lib, /usr/local/bin),
    %H and the ports are replaced (gRPC and HTTP on 127.0.0.1, any free
    port);
  - taskgridctl with the client certificate and the submitter's token
    submits a task that runs on an agent; the dashboard, its API and
    /metrics answer over HTTPS with the client certificate and a token, and
    refuse a request without a token;
  - the guide's Prometheus scrape config (HTTPS, tls_config, a token file)
    scrapes /metrics with the files it names;
  - every flag that --help lists is in the guide's flag tables (docs/production.md).

Needs openssl. Run through ctest (system.production_walkthrough), or by
hand with TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import re
import shlex
import shutil
import signal
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
DEPLOY = os.path.join(ROOT, "deploy")
WAIT = 30.0
AGENTS = ("tg-walk-host-1", "tg-walk-host-2")  # host names, so agent ids (%H)


def read_unit(name):
    """{key: [values]} of the [Service] section of deploy/NAME, with
    continuation lines joined."""
    text = harness.read_text(os.path.join(DEPLOY, name)).replace("\\\n", " ")
    service = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            service.setdefault(key, []).append(value.strip())
    return service


def read_flags(name):
    """The flag lines of deploy/NAME, comments and blank lines left out."""
    lines = harness.read_text(os.path.join(DEPLOY, name)).splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


class ProductionWalkthroughTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is not installed")
        cls.dir = d = tempfile.mkdtemp(prefix="taskgrid-walkthrough-")
        cls.addClassCleanup(shutil.rmtree, d, True)
        cls.procs = []
        cls.addClassCleanup(cls.stop_all)
        cls.root = os.path.join(d, "root")  # stands for / in the units' paths
        cls.pki = pki = os.path.join(d, "pki")

        # Certificates, as the guide makes them: agent ids are host names.
        res = subprocess.run(["bash", os.path.join(DEPLOY, "make-certs.sh"), pki, *AGENTS],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise AssertionError(f"make-certs.sh failed:\n{res.stdout}\n{res.stderr}")
        assert not os.path.exists(os.path.join(pki, "ca.key")), "the CA key is beside the certs"
        assert os.path.exists(os.path.join(pki, "ca", "ca.key"))

        # Tokens: one for each agent named after its id, and for clients.
        cls.tokens = {name: os.urandom(32).hex() for name in ("ops", "ci", "prometheus", *AGENTS)}
        roles = {"ops": "admin", "ci": "submitter", "prometheus": "reader"}
        lines = "".join(f"{name} {roles.get(name, 'agent')} {token}\n"
                        for name, token in cls.tokens.items())
        cls.etc = etc = cls.path("/etc/taskgrid")
        write(f"{etc}/tokens", "# name role token\n" + lines, 0o600)
        for name, token in cls.tokens.items():
            write(os.path.join(d, "client", f"{name}.token"), token + "\n", 0o600)

        # The head's files, under the names the scheduler unit loads.
        os.makedirs(f"{etc}/tls")
        for name, mode in (("ca.pem", 0o644), ("head.pem", 0o644), ("head.key", 0o600)):
            shutil.copy(os.path.join(pki, name), f"{etc}/tls/{name}")
            os.chmod(f"{etc}/tls/{name}", mode)

        # Flags files, with only addresses and ports made local.
        cls.port_file = os.path.join(d, "port")
        cls.http_port_file = os.path.join(d, "http-port")
        sched_flags = []
        for flag in read_flags("scheduler.flags"):
            name, _, value = flag.partition("=")
            if name == "--listen":
                value = "127.0.0.1:0"
            elif name in ("--http_listen", "--metrics_listen"):
                cls.http_listen_host = value.rsplit(":", 1)[0]
                value = "127.0.0.1:0"
            sched_flags.append(f"{name}={cls.rewrite(value)}")
        sched_flags += [f"--port_file={cls.port_file}", f"--http_port_file={cls.http_port_file}"]
        write(f"{etc}/scheduler.flags", "\n".join(sched_flags) + "\n")

        cls.scheduler = cls.run_unit("taskgrid-scheduler.service", "scheduler", host="head")
        harness.wait_until(cls.scheduler_serves, timeout=WAIT, what="the scheduler to serve")
        cls.port = int(harness.read_text(cls.port_file))
        cls.http_port = int(harness.read_text(cls.http_port_file))

        cls.agent_flags = read_flags("agent.flags")
        cls.agents = {}
        for agent_id in AGENTS:
            cls.agents[agent_id] = cls.start_agent(agent_id)

    # --- the machinery: what systemd and the guide's install steps do ---

    @classmethod
    def path(cls, absolute):
        return os.path.join(cls.root, absolute.lstrip("/"))

    @classmethod
    def rewrite(cls, value):
        """A value of a unit or flags file with the machine's paths made
        the test's: /etc, /var/lib and /usr/local/bin."""
        for prefix in ("/etc/", "/var/lib/"):
            value = re.sub(r"(^|[=:\s])" + re.escape(prefix),
                           lambda m: m.group(1) + cls.path(prefix).rstrip("/") + "/", value)
        return value

    @classmethod
    def scheduler_serves(cls):
        if not cls.scheduler.alive():
            raise RuntimeError("the scheduler exited:\n" + cls.scheduler.log())
        return os.path.exists(cls.port_file) and os.path.exists(cls.http_port_file)

    @classmethod
    def run_unit(cls, unit, name, host, env=None):
        """Starts the unit's ExecStart as systemd would: %H is `host`, and
        ${CREDENTIALS_DIRECTORY} a directory of the LoadCredential= files."""
        service = read_unit(unit)
        creds = os.path.join(cls.dir, "credentials", name)
        os.makedirs(creds)
        for entry in service.get("LoadCredential", []):
            cred_id, _, source = entry.partition(":")
            shutil.copy(cls.rewrite(source), os.path.join(creds, cred_id))
            os.chmod(os.path.join(creds, cred_id), 0o400)
        assert len(service["ExecStart"]) == 1, service["ExecStart"]
        argv = shlex.split(service["ExecStart"][0])
        binaries = {"/usr/local/bin/taskgrid-scheduler": "TASKGRID_SCHEDULER",
                    "/usr/local/bin/taskgrid-agent": "TASKGRID_AGENT"}
        assert argv[0] in binaries, f"{unit} runs {argv[0]}, not an installed binary"
        argv[0] = harness.binary(binaries[argv[0]])
        argv[1:] = [cls.rewrite(a.replace("${CREDENTIALS_DIRECTORY}", creds).replace("%H", host))
                    for a in argv[1:]]
        for a in argv[1:]:
            assert "$" not in a and "%" not in a, f"{unit}: {a} left unexpanded"
        env = dict(os.environ if env is None else env, CREDENTIALS_DIRECTORY=creds)
        env.pop("TASKGRID_ADDR", None)
        proc = harness.Process(argv, os.path.join(cls.dir, f"{name}.log"), env=env)
        cls.procs.append(proc)
        proc.argv_used = argv
        return proc

    @classmethod
    def start_agent(cls, agent_id):
        """The guide's install on host `agent_id`: its certificate and
        token under the names the unit loads, agent.flags as shipped but
        for the port."""
        host_etc = cls.path(f"/hosts/{agent_id}/etc/taskgrid")
        os.makedirs(f"{host_etc}/tls")
        shutil.copy(os.path.join(cls.pki, "ca.pem"), f"{host_etc}/tls/ca.pem")
        shutil.copy(os.path.join(cls.pki, f"{agent_id}.pem"), f"{host_etc}/tls/agent.pem")
        shutil.copy(os.path.join(cls.pki, f"{agent_id}.key"), f"{host_etc}/tls/agent.key")
        write(f"{host_etc}/agent.token", cls.tokens[agent_id] + "\n", 0o600)
        flags = []
        for flag in cls.agent_flags:
            name, _, value = flag.partition("=")
            if name == "--scheduler":
                host, _, _ = value.rpartition(":")
                value = f"{host}:{cls.port}"  # the head's name as shipped
            elif name == "--work_dir":
                value = cls.path(f"/hosts/{agent_id}{value}")
            flags.append(f"{name}={value}")
        write(f"{host_etc}/agent.flags", "\n".join(flags) + "\n")
        # This host's /etc stands for /etc in its unit.
        saved, cls.root = cls.root, cls.path(f"/hosts/{agent_id}")
        try:
            return cls.run_unit("taskgrid-agent.service", f"agent-{agent_id}", host=agent_id)
        finally:
            cls.root = saved

    @classmethod
    def stop_all(cls):
        for proc in reversed(cls.procs):
            # SIGINT: an agent hands its steps back rather than keeping
            # them for a next agent (--keep_steps); the scheduler stops.
            proc.signal(signal.SIGINT)
        reports = []
        for proc in reversed(cls.procs):
            try:
                proc.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                pass
            proc.close()
            if re.search(r"ERROR: (Address|Leak|UndefinedBehavior)Sanitizer", proc.log()):
                reports.append(f"----- {proc.log_path}\n{proc.log()[-6000:]}")
        if reports:
            raise AssertionError("a sanitizer reported at exit:\n" + "\n".join(reports))

    def dump(self):
        for proc in self.procs:
            print(f"----- {proc.log_path}\n{proc.log()[-4000:]}")

    def ctl(self, *args, token="ci"):
        """taskgridctl as the guide's client set-up has it: the variables."""
        c = os.path.join(self.dir, "client")
        env = dict(os.environ, TASKGRID_ADDR=f"localhost:{self.port}",
                   TASKGRID_TLS_CA=os.path.join(self.pki, "ca.pem"),
                   TASKGRID_TLS_CERT=os.path.join(self.pki, "client.pem"),
                   TASKGRID_TLS_KEY=os.path.join(self.pki, "client.key"),
                   TASKGRID_TOKEN_FILE=os.path.join(c, f"{token}.token"))
        return subprocess.run([harness.binary("TASKGRID_CTL"), "--timeout=20s",
                               *[str(a) for a in args]],
                              capture_output=True, text=True, timeout=WAIT, env=env)

    def https(self, path, token="prometheus", cert=True):
        """GET https://127.0.0.1:HTTP_PORT/path -> (status, body text)."""
        context = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.pem"))
        if cert:
            context.load_cert_chain(os.path.join(self.pki, "client.pem"),
                                    os.path.join(self.pki, "client.key"))
        request = urllib.request.Request(f"https://{self.http_listen_host}:{self.http_port}{path}")
        if token:
            request.add_header("Authorization", f"Bearer {self.tokens[token]}")
        try:
            with urllib.request.urlopen(request, timeout=WAIT, context=context) as res:
                return res.status, res.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    # --- the walkthrough ---

    def test_1_units_and_files_name_the_same_things(self):
        sched = read_unit("taskgrid-scheduler.service")
        self.assertIn("ExecReload", sched, "systemctl reload must reach the scheduler")
        self.assertIn("-HUP", sched["ExecReload"][0])
        self.assertIn("--tokens_file=", sched["ExecStart"][0])
        agent = read_unit("taskgrid-agent.service")
        self.assertIn("--token_file=", agent["ExecStart"][0])
        self.assertIn("--id=%H", agent["ExecStart"][0])
        # Every ${CREDENTIALS_DIRECTORY}/X is a LoadCredential= of the unit.
        for unit in (sched, agent):
            loaded = {c.split(":", 1)[0] for c in unit.get("LoadCredential", [])}
            used = set(re.findall(r"\$\{CREDENTIALS_DIRECTORY\}/([\w.-]+)", unit["ExecStart"][0]))
            self.assertEqual(used, loaded)
        # The guide's production page installs every file the units read.
        readme = harness.read_text(os.path.join(ROOT, "docs", "production.md"))
        section = readme[readme.index("## Running it for real"):readme.index("| scheduler flag |")]
        for unit in (sched, agent):
            files = [c.split(":", 1)[1] for c in unit.get("LoadCredential", [])]
            files += re.findall(r"=(/etc/[\w./-]+)", unit["ExecStart"][0])
            for path in files:
                self.assertIn(path, section, "the guide never installs a file a unit reads")
        # The head's certificate names this machine, as clients may dial it.
        res = subprocess.run(["openssl", "x509", "-in", os.path.join(self.pki, "head.pem"),
                              "-noout", "-ext", "subjectAltName"],
                             capture_output=True, text=True, timeout=WAIT, check=True)
        for name in ("DNS:localhost", "IP Address:127.0.0.1", f"DNS:{socket.gethostname()}"):
            self.assertIn(name, res.stdout)

    def test_2_agents_connect_under_their_host_names(self):
        last = []

        def both():
            res = self.ctl("--json", "agents", token="ops")
            last[:] = [res]
            if res.returncode != 0:
                return False
            ids = {a["id"] for a in json.loads(res.stdout).get("agents", [])}
            return ids >= set(AGENTS) and ids
        try:
            harness.wait_until(both, timeout=WAIT, interval=0.1, what="both agents to connect")
        except TimeoutError:
            self.dump()
            raise AssertionError(f"last taskgridctl agents: {last[0].returncode}\n"
                                 f"{last[0].stdout}\n{last[0].stderr}") from None
        self.assertRegex(self.scheduler.log(), r"mTLS.*token",
                         "the start-up line says mTLS and tokens are on")

    def test_3_a_submit_with_the_client_token_runs_on_an_agent(self):
        self.test_2_agents_connect_under_their_host_names()
        res = self.ctl("submit", "--id=walk-hello", "--wait", "--", "/bin/echo", "hi from prod")
        if res.returncode != 0:
            self.dump()
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        got = self.ctl("--json", "get", "walk-hello")
        self.assertEqual(got.returncode, 0, got.stderr)
        task = json.loads(got.stdout)
        self.assertEqual(task["state"], "TASK_STATE_SUCCEEDED")
        self.assertTrue(any(a in got.stdout for a in AGENTS), got.stdout)
        # The submitter may not drain: roles are on.
        res = self.ctl("drain", AGENTS[0])
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("PERMISSION_DENIED", res.stderr)

    def test_4_dashboard_api_and_metrics_over_https(self):
        status, body = self.https("/")
        self.assertEqual(status, 200, body[:500])
        self.assertIn("<html", body.lower())
        status, body = self.https("/api/v1/cluster")
        self.assertEqual(status, 200, body)
        self.assertIn("slots_total", body)
        status, body = self.https("/metrics")
        self.assertEqual(status, 200, body[:500])
        self.assertIn("taskgrid_build_info", body)
        status, body = self.https("/metrics", token=None)
        self.assertEqual(status, 401, body[:500])
        # Without the client certificate: refused, saying why.
        status, body = self.https("/metrics", cert=False)
        self.assertEqual(status, 403, body[:500])
        self.assertIn("certificate", body)
        # Under /api/ the same refusal is a JSON error whose code matches.
        status, body = self.https("/api/v1/cluster", cert=False)
        self.assertEqual(status, 403, body[:500])
        self.assertEqual(json.loads(body)["code"], "PERMISSION_DENIED", body[:500])

    def test_5_the_guides_prometheus_config_scrapes_it(self):
        readme = harness.read_text(os.path.join(ROOT, "docs", "dashboard-and-metrics.md"))
        section = readme[readme.index("## Metrics"):]
        config = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
        self.assertRegex(config, r"scheme: https")
        files = dict(re.findall(r"(\w+_file): (\S+)", config))
        self.assertEqual(set(files), {"ca_file", "cert_file", "key_file", "credentials_file"})
        # The files it names are the ones the guide copies for Prometheus:
        # the walkthrough's CA, client certificate and key, and reader token.
        ours = {"ca.pem": os.path.join(self.pki, "ca.pem"),
                "client.pem": os.path.join(self.pki, "client.pem"),
                "client.key": os.path.join(self.pki, "client.key"),
                "prometheus.token": os.path.join(self.dir, "client", "prometheus.token")}
        local = {key: ours[os.path.basename(path)] for key, path in files.items()}
        for path in files.values():
            self.assertIn(os.path.basename(path), section, "the guide never copies " + path)
        target = re.search(r'targets: \["([^"]+)"\]', config).group(1)
        self.assertEqual(target.rsplit(":", 1)[0], self.http_listen_host)
        context = ssl.create_default_context(cafile=local["ca_file"])
        context.load_cert_chain(local["cert_file"], local["key_file"])
        request = urllib.request.Request(
            f"https://{self.http_listen_host}:{self.http_port}/metrics",
            headers={"Authorization": "Bearer " + harness.read_text(local["credentials_file"]).strip()})
        with urllib.request.urlopen(request, timeout=WAIT, context=context) as res:
            self.assertEqual(res.status, 200)
            self.assertIn("taskgrid_build_info", res.read().decode())

    def test_6_every_flag_is_in_the_guides_tables(self):
        readme = harness.read_text(os.path.join(ROOT, "docs", "production.md"))
        for binary, header in (("TASKGRID_SCHEDULER", "| scheduler flag |"),
                               ("TASKGRID_AGENT", "| agent flag |")):
            start = readme.index(header)
            table = readme[start:readme.index("\n\n", start)]
            res = subprocess.run([harness.binary(binary), "--help"], capture_output=True,
                                 text=True, timeout=WAIT)
            flags = re.findall(r"^    --(\w+) \(", res.stdout + res.stderr, re.M)
            self.assertTrue(flags, res.stdout + res.stderr)
            missing = [f for f in flags if not re.search(rf"`--{f}`", table)]
            self.assertEqual(missing, [], f"flags of {binary} missing from the guide's table")


if __name__ == "__main__":
    unittest.main()
