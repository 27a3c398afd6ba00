"""Starts real Taskgrid processes for system tests, and cleans them up.

Binaries come from the environment (ctest sets them):
  TASKGRID_SCHEDULER, TASKGRID_AGENT, TASKGRID_CTL
Every process binds 127.0.0.1 with an ephemeral port; every wait is bounded;
every process started is killed when its Cluster closes.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

DEFAULT_TIMEOUT = 30.0


def binary(name):
    path = os.environ.get(name)
    if not path or not os.path.exists(path):
        raise RuntimeError(f"{name} is not set to an existing binary (run through ctest)")
    return path


def wait_until(pred, timeout=DEFAULT_TIMEOUT, interval=0.05, what="condition"):
    """Polls pred() until it returns a truthy value; raises after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Process:
    """One spawned binary with its log file."""

    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill9(self):
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=DEFAULT_TIMEOUT)

    def stop(self, timeout=DEFAULT_TIMEOUT):
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return self.proc.returncode

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def close(self):
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=DEFAULT_TIMEOUT)
        self._log.close()


class Cluster:
    """A scheduler and any number of agents in one temporary directory."""

    def __init__(self, scheduler_flags=(), keep=False):
        self.dir = tempfile.mkdtemp(prefix="taskgrid-system-")
        self.data_dir = os.path.join(self.dir, "data")
        self.scheduler_flags = list(scheduler_flags)
        self.scheduler = None
        self.port = None
        self.agents = {}
        self._all = []
        self.keep = keep

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.dump_logs()
        self.close()

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start_scheduler(self, extra_flags=(), wait=True):
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        listen = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        argv = [binary("TASKGRID_SCHEDULER"), f"--listen={listen}", f"--data_dir={self.data_dir}",
                f"--port_file={port_file}"] + self.scheduler_flags + list(extra_flags)
        self.scheduler = Process(argv, os.path.join(self.dir, "scheduler.log"))
        self._all.append(self.scheduler)
        if wait:
            def ready():
                if not self.scheduler.alive():
                    raise RuntimeError("scheduler exited:\n" + self.scheduler.log())
                return os.path.exists(port_file)
            wait_until(ready, what="the scheduler to serve")
            with open(port_file) as f:
                self.port = int(f.read().strip())
        return self.scheduler

    def start_agent(self, agent_id, slots=2, labels="", extra_flags=()):
        argv = [binary("TASKGRID_AGENT"), f"--scheduler={self.addr}", f"--id={agent_id}",
                f"--slots={slots}"]
        if labels:
            argv.append(f"--labels={labels}")
        argv += list(extra_flags)
        agent = Process(argv, os.path.join(self.dir, f"agent-{agent_id}.log"))
        self.agents[agent_id] = agent
        self._all.append(agent)
        return agent

    def ctl(self, *args, input=None, timeout=DEFAULT_TIMEOUT, check=False):
        """Runs taskgridctl against this cluster; returns CompletedProcess (text)."""
        argv = [binary("TASKGRID_CTL"), f"--addr={self.addr}"] + [str(a) for a in args]
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def ctl_json(self, *args, **kw):
        res = self.ctl("--json", *args, check=True, **kw)
        return json.loads(res.stdout)

    def task(self, task_id):
        return self.ctl_json("get", task_id)

    def wait_state(self, task_id, states, timeout=DEFAULT_TIMEOUT):
        states = {states} if isinstance(states, str) else set(states)
        last = {}

        def check():
            nonlocal last
            res = self.ctl("get", task_id, "--json")
            if res.returncode != 0:
                return False
            last = json.loads(res.stdout)
            return last.get("state", "").replace("TASK_STATE_", "") in states and last
        try:
            return wait_until(check, timeout=timeout, interval=0.1,
                              what=f"task {task_id} to reach {sorted(states)}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last seen: {json.dumps(last)}") from None

    def dump_logs(self):
        for p in self._all:
            print(f"----- {p.log_path}\n{p.log()[-6000:]}")

    def close(self):
        for p in self._all:
            p.close()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
