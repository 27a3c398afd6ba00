"""System test of the web dashboard in headless Chromium.

A real taskgrid-scheduler (with --http_listen on 127.0.0.1, an ephemeral
port) and real agents; taskgridctl submits tasks, a job and a failing
task; then tests/web/dashboard_test.js (node, playwright-core driving
Debian's /usr/bin/chromium) loads each page, checks it against the API,
acts by clicks and checks each change on the page and through
taskgridctl. A second scheduler serves HTTPS with bearer tokens: the page
asks for a token, a reader is refused an action, an admin is not.

TASKGRID_SCREENSHOTS=DIR writes a PNG of each page to DIR (the guide's
docs/dashboard/ come from it). Needs node, /usr/bin/chromium and
playwright-core in .taskgrid/web (deploy/install-deps.sh --web,
deploy/install-web.sh); without them the test is skipped, unless
TASKGRID_REQUIRE_BROWSER=1 (deploy/test.sh) makes that a failure.

Run through ctest (system.web), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import json
import os
import shutil
import signal
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
SCRIPT = os.path.join(ROOT, "tests", "web", "dashboard_test.js")
MODULES = os.path.join(ROOT, ".taskgrid", "web", "node_modules")
CHROMIUM = "/usr/bin/chromium"
NODE_TIMEOUT = 240


def need_browser():
    missing = [what for what, ok in (
        ("node", shutil.which("node") is not None),
        (CHROMIUM, os.access(CHROMIUM, os.X_OK)),
        ("playwright-core (deploy/install-web.sh)",
         os.path.exists(os.path.join(MODULES, "playwright-core", "package.json"))),
    ) if not ok]
    if missing:
        why = "missing: " + ", ".join(missing)
        if os.environ.get("TASKGRID_REQUIRE_BROWSER") == "1":
            raise AssertionError(why)
        raise unittest.SkipTest(why)


def run_node(cluster, mode, url, env_extra=()):
    """Runs dashboard_test.js in its own process group, bounded in time;
    fails the test with its output unless it exits 0."""
    env = dict(os.environ)
    env.update({
        "TASKGRID_WEB_URL": url,
        "TASKGRID_WEB_MODULES": MODULES,
        "TASKGRID_CTL": harness.binary("TASKGRID_CTL"),
        "TASKGRID_CTL_ARGS": json.dumps([f"--addr={cluster.addr}"] + cluster.ctl_flags),
    })
    env.update(dict(env_extra))
    proc = subprocess.Popen(["node", SCRIPT, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=NODE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"dashboard_test.js {mode} ran past {NODE_TIMEOUT}s:\n{out}")
    finally:
        # The browser is the node process's child: nothing of it may outlive the test.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(out)
    if proc.returncode != 0:
        cluster.dump_logs()
        raise AssertionError(f"dashboard_test.js {mode} exited {proc.returncode}:\n{out}")


FLAKY = {"id": "flaky", "max_attempts": 3, "retry": {"non_retryable_exit_codes": [3]},
         "steps": [{"exec": {"argv": ["/bin/sh", "-c",
                                      "echo trying flaky attempt $TASKGRID_ATTEMPT; "
                                      "echo no input yet >&2; exit 3"]}}]}

JOB = {"job_id": "build-1", "tasks": [
    {"id": "b1-fetch", "steps": [{"exec": {"argv": ["/bin/sh", "-c", "echo v1.2"]}}]},
    {"id": "b1-compile", "depends_on": ["b1-fetch"], "steps": [{"builtin": {"name": "noop"}}]},
    {"id": "b1-test", "depends_on": ["b1-fetch"], "steps": [{"builtin": {"name": "noop"}}]},
    {"id": "b1-lint", "depends_on": ["b1-fetch"], "max_attempts": 1, "labels": {"team": "web"},
     "steps": [{"builtin": {"name": "fail", "args": ["2"]}}]},
    {"id": "b1-package", "depends_on": ["b1-compile", "b1-test"],
     "steps": [{"builtin": {"name": "noop"}}]},
]}


class DashboardTest(unittest.TestCase):
    def test_pages_and_actions(self):
        need_browser()
        with harness.Cluster() as c:
            port = c.start_with_http()
            c.start_agent("web-a", slots=2, extra_flags=["--resources=cpu=2,memory=4GiB"])
            c.start_agent("web-b", slots=1, labels="zone=eu")
            harness.wait_until(lambda: len(c.agents_info()) == 2, what="both agents")
            spec = os.path.join(c.dir, "flaky.json")
            with open(spec, "w") as f:
                json.dump(FLAKY, f)
            c.ctl("submit", "-f", spec, check=True)
            job = os.path.join(c.dir, "job.json")
            with open(job, "w") as f:
                json.dump(JOB, f)
            c.ctl("job", "submit", job, check=True)
            c.ctl("submit", "--id=hello", "--builtin=echo", "--task_labels=team=web,kind=greeting",
                  "--", "hi", check=True)
            c.ctl("submit", "--id=long", "--queue=slow", "--builtin=sleep", "--", "300",
                  check=True)
            for n in (1, 2):  # no agent has smtp=1: they wait PENDING, the backlog
                c.ctl("submit", f"--id=mail-{n}", "--queue=emails", "--labels=smtp=1",
                      "--builtin=noop", check=True)
            c.wait_state("flaky", "FAILED")
            c.wait_state("b1-lint", "FAILED")
            c.wait_state("b1-package", "SUCCEEDED")
            c.wait_state("long", "RUNNING")
            run_node(c, "plain", f"http://127.0.0.1:{port}/")


class DashboardRolesTest(unittest.TestCase):
    def test_a_reader_is_refused_an_action(self):
        need_browser()
        if shutil.which("openssl") is None:
            self.skipTest("openssl is not installed")
        certs = tempfile.mkdtemp(prefix="taskgrid-web-tls-")
        self.addCleanup(shutil.rmtree, certs, True)
        subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-certs.sh"), certs],
                       check=True, capture_output=True, timeout=60)
        tokens = {"reader": "reader-" + "r" * 24, "admin": "admin-" + "a" * 24,
                  "agent": "agent-" + "g" * 24}

        def secret(name, text):
            path = os.path.join(certs, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(text)
            return path

        tokens_file = secret("tokens", "".join(
            f"{role}-1 {role} {token}{' ids=web-tls' if role == 'agent' else ''}\n"
            for role, token in tokens.items()))
        admin_file = secret("admin.token", tokens["admin"] + "\n")
        agent_file = secret("agent.token", tokens["agent"] + "\n")
        ca = os.path.join(certs, "ca.pem")
        flags = [f"--tls_cert={certs}/head.pem", f"--tls_key={certs}/head.key",
                 f"--tokens_file={tokens_file}"]
        with harness.Cluster(scheduler_flags=flags,
                             ctl_flags=[f"--tls_ca={ca}", f"--token_file={admin_file}"]) as c:
            port = c.start_with_http()
            c.start_agent("web-tls", extra_flags=[f"--tls_ca={ca}", f"--token_file={agent_file}"])
            harness.wait_until(lambda: "web-tls" in c.agents_info(), what="the agent")
            # /metrics, over HTTPS too, needs a reader's token.
            context = ssl.create_default_context(cafile=ca)
            url = f"https://127.0.0.1:{port}/metrics"
            with self.assertRaises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10, context=context)
            self.assertEqual(refused.exception.code, 401)
            scrape = urllib.request.Request(url, headers={
                "Authorization": f"Bearer {tokens['reader']}"})
            with urllib.request.urlopen(scrape, timeout=10, context=context) as res:
                self.assertIn("taskgrid_agents", res.read().decode())
            c.ctl("submit", "--id=guarded", "--builtin=sleep", "--", "300", check=True)
            c.wait_state("guarded", "RUNNING")
            run_node(c, "roles", f"https://127.0.0.1:{port}/", {
                "NODE_EXTRA_CA_CERTS": ca,
                "TASKGRID_READER_TOKEN": tokens["reader"],
                "TASKGRID_ADMIN_TOKEN": tokens["admin"],
            }.items())


class HttpFlagsTest(unittest.TestCase):
    """Start-up rules of --http_listen (no browser needed)."""

    def run_scheduler(self, *flags, wait=False):
        cluster = harness.Cluster()
        self.addCleanup(cluster.close)
        argv = [harness.binary("TASKGRID_SCHEDULER"), "--listen=127.0.0.1:0",
                f"--data_dir={cluster.data_dir}", *flags]
        if not wait:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30)
        cluster.scheduler_flags += list(flags)
        return cluster

    def test_the_former_name_must_agree(self):
        res = self.run_scheduler("--http_listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:1")
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--metrics_listen is the former name of --http_listen", res.stderr)

    def test_a_reachable_address_needs_protection_or_insecure(self):
        res = self.run_scheduler("--http_listen=0.0.0.0:0")
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--http_listen=0.0.0.0:0 can be reached from other machines", res.stderr)
        self.assertIn("cancel tasks and drain agents", res.stderr)

    def test_with_client_certificates_https_requires_one(self):
        if shutil.which("openssl") is None:
            self.skipTest("openssl is not installed")
        d = tempfile.mkdtemp(prefix="taskgrid-web-mtls-")
        self.addCleanup(shutil.rmtree, d, True)
        subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-certs.sh"), d],
                       check=True, capture_output=True, timeout=60)
        cluster = self.run_scheduler(f"--tls_cert={d}/head.pem", f"--tls_key={d}/head.key",
                                     f"--tls_ca={d}/ca.pem", wait=True)
        port = cluster.start_with_http()
        url = f"https://127.0.0.1:{port}/api/v1/cluster"
        anonymous = ssl.create_default_context(cafile=f"{d}/ca.pem")
        with self.assertRaises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url, timeout=10, context=anonymous).read()
        with self.assertRaises((urllib.error.URLError, ConnectionError)):  # no plaintext either
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/cluster", timeout=10).read()
        client = ssl.create_default_context(cafile=f"{d}/ca.pem")
        client.load_cert_chain(f"{d}/client.pem", f"{d}/client.key")
        with urllib.request.urlopen(url, timeout=10, context=client) as res:
            self.assertIn('"agents_active"', res.read().decode())
        self.assertIn(f"dashboard on https://127.0.0.1:{port}/", cluster.scheduler.log())

    def test_the_dashboard_is_served_at_the_root(self):
        cluster = self.run_scheduler(wait=True)
        port = cluster.start_with_http()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as res:
            self.assertEqual(res.headers.get("Content-Type"), "text/html; charset=utf-8")
            self.assertIn("<title>Taskgrid</title>", res.read().decode())
        self.assertIn(f"dashboard on http://127.0.0.1:{port}/", cluster.scheduler.log())


if __name__ == "__main__":
    unittest.main()
