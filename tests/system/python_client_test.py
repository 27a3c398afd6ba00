"""System test of the Python client (clients/python) against the real scheduler.

The stubs are generated at test time by clients/python/generate.sh into a
temporary directory (nothing generated is committed), and the scripts find
them through TASKGRID_PB_DIR:

  - clients/python/agent.py runs as a process; echo tasks pinned to it
    (placement.agent_ids) succeed with the right stdout, an exec task is
    rejected, it comes back after a scheduler kill -9, and SIGTERM stops it.
  - agent.py against a scripted AgentService in this process: heartbeats,
    a result resent until its ResultAck (also in Hello after a reconnect),
    Draining on SIGTERM.
  - clients/python/submit_and_wait.py runs against a scheduler with a real C++
    agent: it prints each transition from WatchTasks and exits 0 when all its
    tasks succeed; its watch resumes after a scheduler kill -9; with no agent
    it times out and exits 1; with no scheduler it exits 1.

Needs /usr/bin/python3 with python3-grpcio and python3-protobuf
(deploy/install-deps.sh --python), protoc and grpc_python_plugin.
Run through ctest (system.python_client), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CLIENT = os.path.join(ROOT, "clients", "python")
WAIT = 30.0


def stdout_of(task):
    return base64.b64decode(task.get("result", {}).get("stdout_tail", "")).decode()


class FakeScheduler:
    """A scripted AgentService on 127.0.0.1 (grpcio server in this process).

    Stream 1: Welcome (heartbeats every 0.2 s), Assign t1 (echo, payload) and t2
    (exec); every heartbeat is answered; after the second Result (the agent's
    resend) the stream ends, unacknowledged. Stream 2: Welcome, heartbeats
    answered, every Result acknowledged; ends when the agent half-closes."""

    def __init__(self):
        import grpc
        from google.protobuf import duration_pb2
        from taskgrid.v1 import agent_service_pb2, agent_service_pb2_grpc, task_pb2
        self.grpc, self.apb, self.task_pb2 = grpc, agent_service_pb2, task_pb2
        self.duration_pb2 = duration_pb2
        self.cond = threading.Condition()
        self.log = []          # (stream number, kind, AgentMessage)
        self.streams = 0
        self.acked = False
        fake = self

        class Servicer(agent_service_pb2_grpc.AgentServiceServicer):
            def Connect(self, requests, context):
                return fake.connect(requests)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        agent_service_pb2_grpc.add_AgentServiceServicer_to_server(Servicer(), self.server)

    def start(self):
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return port

    def stop(self):
        self.server.stop(grace=None).wait(10)

    def record(self, n, msg):
        with self.cond:
            self.log.append((n, msg.WhichOneof("msg"), msg))
            self.cond.notify_all()

    def of(self, n, kind):
        with self.cond:
            return [m for s, k, m in self.log if s == n and k == kind]

    def kinds(self):
        with self.cond:
            return [(s, k) for s, k, _ in self.log]

    def wait_for(self, pred, what):
        deadline = time.monotonic() + WAIT
        with self.cond:
            while not pred(self.log):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what}; seen {self.kinds()}")
                self.cond.wait(left)

    def connect(self, requests):
        apb, tpb = self.apb, self.task_pb2
        with self.cond:
            self.streams += 1
            n = self.streams
        self.record(n, next(requests))
        yield apb.SchedulerMessage(welcome=apb.Welcome(
            session_id=f"fake/{n}", heartbeat_interval=self.duration_pb2.Duration(nanos=200000000),
            stop_on_lost_after=self.duration_pb2.Duration(seconds=30), max_output_bytes=1024))
        if n == 1:
            echo = tpb.Step(builtin=tpb.BuiltinStep(name="echo"))
            echo_args = tpb.Step(builtin=tpb.BuiltinStep(name="echo", args=["c"]))
            yield apb.SchedulerMessage(assign=apb.Assign(tasks=[
                apb.Assignment(task_id="t1", attempt=1, steps=[echo, echo_args], payload=b"a b\n"),
                apb.Assignment(task_id="t2", attempt=1,
                               steps=[tpb.Step(exec=tpb.ExecStep(argv=["/bin/true"]))])]))
        results = 0
        for msg in requests:
            self.record(n, msg)
            kind = msg.WhichOneof("msg")
            if kind == "heartbeat":
                yield apb.SchedulerMessage(heartbeat_ack=apb.HeartbeatAck())
            elif kind == "result":
                results += 1
                if n == 1 and results == 2:
                    return
                if n > 1:
                    yield apb.SchedulerMessage(result_ack=apb.ResultAck(
                        task_id=msg.result.task_id, attempt=msg.result.attempt, accepted=True))
                    with self.cond:
                        self.acked = True
                        self.cond.notify_all()


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise AssertionError(f"{sys.executable} has no grpc module: install python3-grpcio "
                                 "(deploy/install-deps.sh --python) and run with /usr/bin/python3")
        cls.tmp = tempfile.mkdtemp(prefix="taskgrid-pyclient-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.stubs = os.path.join(cls.tmp, "stubs")
        res = subprocess.run([os.path.join(CLIENT, "generate.sh"), cls.stubs],
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise AssertionError(f"generate.sh exited {res.returncode}:\n{res.stdout}{res.stderr}")
        cls.env = dict(os.environ, TASKGRID_PB_DIR=cls.stubs, PYTHONDONTWRITEBYTECODE="1")
        cls.env.pop("TASKGRID_ADDR", None)

    def test_generated_stubs_import(self):
        code = ("from taskgrid.v1 import task_service_pb2_grpc as t, agent_service_pb2_grpc as a, "
                "cluster_service_pb2_grpc as c; print(t.TaskServiceStub.__name__)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=WAIT, cwd=self.tmp, env=dict(self.env, PYTHONPATH=self.stubs))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stdout.strip(), "TaskServiceStub")

    def start_py_agent(self, cluster, agent_id, slots=2):
        argv = [sys.executable, "-u", os.path.join(CLIENT, "agent.py"), f"--addr={cluster.addr}",
                f"--id={agent_id}", f"--slots={slots}", "--labels=lang=python"]
        agent = harness.Process(argv, os.path.join(cluster.dir, f"pyagent-{agent_id}.log"),
                                env=self.env)
        cluster._all.append(agent)
        return agent

    def wait_agent_active(self, cluster, agent_id):
        return harness.wait_until(
            lambda: cluster.agents_info().get(agent_id, {}).get("state") == "AGENT_STATE_ACTIVE"
            and cluster.agents_info()[agent_id],
            timeout=WAIT, interval=0.1, what=f"agent {agent_id} to be ACTIVE")

    def submit(self, cluster, specs):
        path = os.path.join(cluster.dir, "tasks.json")
        with open(path, "w") as f:
            json.dump(specs, f)
        cluster.ctl("submit", "-f", path, check=True)

    def test_python_agent_runs_echo_tasks(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            agent = self.start_py_agent(c, "py-agent", slots=3)
            info = self.wait_agent_active(c, "py-agent")
            self.assertEqual(info.get("slots"), 3)
            self.assertEqual(info.get("labels"), {"lang": "python"})
            self.assertEqual(info.get("version"), "taskgrid-python-agent/1")

            pin = {"agent_ids": ["py-agent"]}
            self.submit(c, [
                {"id": "words", "placement": pin,
                 "steps": [{"builtin": {"name": "echo", "args": ["hello", "from", "python"]}}]},
                {"id": "payload", "placement": pin, "payload": base64.b64encode(b"from stdin\n").decode(),
                 "steps": [{"builtin": {"name": "echo"}},
                           {"builtin": {"name": "echo", "args": ["second", "step"]}}]},
                {"id": "exec", "placement": pin, "max_attempts": 1,
                 "steps": [{"exec": {"argv": ["/bin/echo", "no"]}}]},
            ])
            words = c.wait_state("words", "SUCCEEDED", timeout=WAIT)
            self.assertEqual(stdout_of(words), "hello from python\n")
            self.assertEqual(words["attempts"][-1]["agent_id"], "py-agent")
            self.assertEqual(words["result"]["outcome"], "OUTCOME_SUCCEEDED")
            self.assertEqual(words["result"].get("exit_code", 0), 0)

            payload = c.wait_state("payload", "SUCCEEDED", timeout=WAIT)
            self.assertEqual(stdout_of(payload), "from stdin\nsecond step\n")
            self.assertEqual(payload["attempts"][-1]["agent_id"], "py-agent")
            self.assertEqual(payload["result"].get("step", 0), 1)

            rejected = c.wait_state("exec", "FAILED", timeout=WAIT)
            self.assertIn("this agent runs only echo", rejected.get("reason", ""))

            # kill -9 of the scheduler: the agent reconnects and runs new work.
            c.scheduler.kill9()
            c.start_scheduler()
            self.wait_agent_active(c, "py-agent")
            self.submit(c, [{"id": "after-restart", "placement": pin,
                             "steps": [{"builtin": {"name": "echo", "args": ["back"]}}]}])
            after = c.wait_state("after-restart", "SUCCEEDED", timeout=WAIT)
            self.assertEqual(stdout_of(after), "back\n")
            self.assertEqual(after["attempts"][-1]["agent_id"], "py-agent")

            self.assertEqual(agent.stop(timeout=15), 0, agent.log())
            log = agent.log()
            self.assertIn("ran words attempt 1", log)
            self.assertIn("result of words attempt 1 acknowledged", log)
            self.assertIn("rejected exec attempt 1: this agent runs only echo", log)
            self.assertIn("stopped", log)
            self.assertNotIn("Traceback", log)

    def test_python_agent_protocol(self):
        """Against a scripted AgentService: heartbeats at Welcome's interval, a
        result resent until its ResultAck (on the same stream, then in Hello and
        again after a reconnect), Draining and exit 0 on SIGTERM."""
        sys.path.insert(0, self.stubs)
        try:
            fake = FakeScheduler()
        finally:
            sys.path.remove(self.stubs)
        port = fake.start()
        self.addCleanup(fake.stop)
        log_dir = tempfile.mkdtemp(prefix="taskgrid-pyagent-", dir=self.tmp)
        argv = [sys.executable, "-u", os.path.join(CLIENT, "agent.py"), f"--addr=127.0.0.1:{port}",
                "--id=scripted", "--slots=4", "--labels=a=1,b=2"]
        agent = harness.Process(argv, os.path.join(log_dir, "agent.log"), env=self.env)
        self.addCleanup(agent.close)
        try:
            # Stream 1: t1 accepted and its result sent twice (no ack), t2 rejected.
            fake.wait_for(lambda log: len(fake.of(1, "result")) >= 2, what="a resent result")
            hello = fake.of(1, "hello")[0].hello
            self.assertEqual((hello.agent_id, hello.slots, dict(hello.labels), hello.version),
                             ("scripted", 4, {"a": "1", "b": "2"}, "taskgrid-python-agent/1"))
            self.assertEqual(list(hello.running), [])
            self.assertEqual([(m.accept.task_id, m.accept.attempt) for m in fake.of(1, "accept")],
                             [("t1", 1)])
            rejects = fake.of(1, "reject")
            self.assertEqual([(m.reject.task_id, m.reject.reason) for m in rejects],
                             [("t2", "this agent runs only echo")])
            first, second = fake.of(1, "result")[:2]
            self.assertEqual(first, second)
            r = first.result
            self.assertEqual((r.task_id, r.attempt, r.result.outcome, r.result.exit_code,
                              r.result.step, r.result.stdout_tail),
                             ("t1", 1, fake.task_pb2.OUTCOME_SUCCEEDED, 0, 1, b"a b\nc\n"))
            self.assertGreaterEqual(len(fake.of(1, "heartbeat")), 5)   # every 0.2 s

            # Stream 2 (the scheduler ended stream 1): Hello still holds t1,
            # the result is sent again and acknowledged.
            fake.wait_for(lambda log: fake.acked, what="the result acknowledged on stream 2")
            hello2 = fake.of(2, "hello")[0].hello
            self.assertEqual([(a.task_id, a.attempt) for a in hello2.running], [("t1", 1)])
            self.assertEqual(fake.of(2, "result")[0], first)

            agent.signal(signal.SIGTERM)
            agent.proc.wait(timeout=15)
            self.assertEqual(agent.proc.returncode, 0, agent.log())
            self.assertTrue(fake.of(2, "draining"), fake.kinds())
            self.assertNotIn("Traceback", agent.log())
            self.assertNotIn("not acknowledged", agent.log())
        except BaseException:
            print(agent.log())
            raise

    def run_submit_and_wait(self, cluster, *args, timeout=90):
        argv = [sys.executable, "-u", os.path.join(CLIENT, "submit_and_wait.py"),
                f"--addr={cluster.addr}"] + list(args)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env)

    def test_submit_and_wait_with_cpp_agent(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            c.start_agent("cpp-agent", slots=2)
            res = self.run_submit_and_wait(c, "--prefix=sw", "--timeout=60")
            out = res.stdout
            self.assertEqual(res.returncode, 0, f"{out}\n{res.stderr}")
            ids = ["sw-echo-1", "sw-echo-2", "sw-echo-3", "sw-exec"]
            for task_id in ids:
                self.assertRegex(out, rf"(?m)^submitted {task_id}: ")
                # The last transition is printed, from the watch (or GetTask
                # when it happened before the watch was registered).
                self.assertRegex(out, rf"(?m)^{task_id}: \w+ -> SUCCEEDED ")
            # The stream gave at least one transition with its revision.
            self.assertRegex(out, r"(?m)^sw-[a-z0-9-]+: \w+ -> \w+  \(revision \d+, attempt \d")
            for i in (1, 2, 3):
                self.assertIn(f"sw-echo-{i}: SUCCEEDED, exit code 0, agent cpp-agent, "
                              f"stdout 'hello from python {i}\\n'", out)
            self.assertIn("sw-exec: SUCCEEDED, exit code 0, agent cpp-agent, "
                          "stdout 'hello from exec\\n'", out)
            self.assertTrue(out.rstrip().endswith("all 4 tasks SUCCEEDED"), out)
            for task_id in ids:
                self.assertEqual(c.task(task_id)["state"], "TASK_STATE_SUCCEEDED")

            # Revisions in the printed transitions increase.
            revs = [int(r) for r in re.findall(r"\(revision (\d+),", out)]
            self.assertEqual(revs, sorted(revs), out)

            # Again with the same ids: the tasks exist, already finished.
            again = self.run_submit_and_wait(c, "--prefix=sw", "--timeout=30")
            self.assertEqual(again.returncode, 0, f"{again.stdout}\n{again.stderr}")
            self.assertIn("all 4 tasks SUCCEEDED", again.stdout)

    def test_submit_and_wait_resumes_after_scheduler_restart(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            out_path = os.path.join(c.dir, "submit_and_wait.out")
            argv = [sys.executable, "-u", os.path.join(CLIENT, "submit_and_wait.py"),
                    f"--addr={c.addr}", "--prefix=rs", "--timeout=60"]
            with open(out_path, "w") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env)
            try:
                def output():
                    with open(out_path) as f:
                        return f.read()
                # No agent yet: the tasks wait PENDING; the watch saw them created.
                harness.wait_until(lambda: output().count(" -> PENDING  (revision") == 4,
                                   timeout=WAIT, what="the watch to show 4 new tasks")
                c.scheduler.kill9()
                c.start_scheduler()
                c.start_agent("cpp-agent", slots=2)
                proc.wait(timeout=90)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=WAIT)
            text = output()
            self.assertEqual(proc.returncode, 0, text)
            self.assertRegex(text, r"\(the watch broke: .*; resuming after revision \d+\)")
            self.assertIn("all 4 tasks SUCCEEDED", text)
            revs = [int(r) for r in re.findall(r"\(revision (\d+),", text)]
            self.assertEqual(revs, sorted(set(revs)), text)   # no gap in order, no duplicate
            for task_id in ("rs-echo-1", "rs-echo-2", "rs-echo-3", "rs-exec"):
                self.assertRegex(text, rf"(?m)^{task_id}: RUNNING -> SUCCEEDED  \(revision")

    def test_submit_and_wait_fails_without_agents(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            res = self.run_submit_and_wait(c, "--prefix=nobody", "--timeout=3", timeout=60)
            self.assertEqual(res.returncode, 1, f"{res.stdout}\n{res.stderr}")
            self.assertIn("timed out after 3s; not finished: nobody-echo-1", res.stderr)

    def test_submit_and_wait_unreachable(self):
        with harness.Cluster() as c:
            c.start_scheduler()
            addr = c.addr
            c.scheduler.kill9()
            argv = [sys.executable, os.path.join(CLIENT, "submit_and_wait.py"), f"--addr={addr}",
                    "--timeout=5"]
            res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=self.env)
            self.assertEqual(res.returncode, 1, f"{res.stdout}\n{res.stderr}")
            self.assertIn(f"cannot connect to the scheduler at {addr} (waited 5s)", res.stderr)


if __name__ == "__main__":
    unittest.main()
