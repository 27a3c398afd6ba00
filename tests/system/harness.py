"""Starts real Taskgrid processes for system tests, and cleans them up.

Binaries come from the environment (ctest sets them):
  TASKGRID_SCHEDULER, TASKGRID_AGENT, TASKGRID_CTL
Every process binds 127.0.0.1 with an ephemeral port; every wait is bounded;
every process started is killed when its Cluster closes.
"""
import calendar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

DEFAULT_TIMEOUT = 30.0


def binary(name):
    path = os.environ.get(name)
    if not path or not os.path.exists(path):
        raise RuntimeError(f"{name} is not set to an existing binary (run through ctest)")
    return path


def unix_time(text):
    """Seconds since the epoch of a proto3 JSON timestamp ("...Z", maybe fractional)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", text)
    if not m:
        raise ValueError(f"not a UTC RFC 3339 timestamp: {text!r}")
    return (calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) +
            float(m.group(2) or 0))


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


def read_text(path):
    with open(path) as f:
        return f.read()


def written(path):
    """The complete lines of `path`: "" while it does not exist or its
    writer (a step's `date > file`, say) has not finished its first line."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        return ""
    return text[:text.rfind("\n") + 1]


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def processes_with(text, where="cmdline"):
    """Pids of live processes whose /proc/PID/`where` (cmdline, environ)
    holds `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{where}", "rb") as f:
                if text.encode() in f.read() and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


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


def start_class_cluster(test_cls, scheduler_flags=(), agents=(), slots=2):
    """For a unittest class's setUpClass: a started Cluster with `agents`
    (each with `slots`), closed by the class cleanup."""
    cluster = Cluster(scheduler_flags=scheduler_flags)
    test_cls.addClassCleanup(cluster.close)
    cluster.start_scheduler()
    for agent_id in agents:
        cluster.start_agent(agent_id, slots=slots)
    return cluster


class Cluster:
    """A scheduler and any number of agents in one temporary directory."""

    def __init__(self, scheduler_flags=(), keep=False, ctl_flags=()):
        """ctl_flags: added to every taskgridctl call (e.g. --tls_ca=...)."""
        self.dir = tempfile.mkdtemp(prefix="taskgrid-system-")
        self.ctl_flags = list(ctl_flags)
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

    def start_scheduler(self, extra_flags=(), wait=True, program=None):
        """program: the scheduler binary to run (default: the build's)."""
        port_file = os.path.join(self.dir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        listen = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        argv = [program or binary("TASKGRID_SCHEDULER"), f"--listen={listen}",
                f"--data_dir={self.data_dir}",
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

    def start_with_http(self):
        """Starts the scheduler with --http_listen=127.0.0.1:0 too; returns
        the HTTP port."""
        port_file = os.path.join(self.dir, "http-port")
        self.scheduler_flags += ["--http_listen=127.0.0.1:0", f"--http_port_file={port_file}"]
        self.start_scheduler()
        wait_until(lambda: os.path.exists(port_file), what="the HTTP port file")
        with open(port_file) as f:
            return int(f.read().strip())

    def start_agent(self, agent_id, slots=2, labels="", extra_flags=(), scheduler_addr=None,
                    env=None):
        """scheduler_addr: where the agent connects (default: the scheduler
        itself; e.g. a TcpProxy's addr). env: the agent's environment
        (default: the test's)."""
        argv = [binary("TASKGRID_AGENT"), f"--scheduler={scheduler_addr or self.addr}",
                f"--id={agent_id}", f"--slots={slots}"]
        if labels:
            argv.append(f"--labels={labels}")
        argv += list(extra_flags)
        if not any(f.startswith("--work_dir=") for f in argv):
            # Its own, not /tmp/taskgrid-agent-<id>, which an agent of the same
            # id in a test running alongside would share.
            argv.append(f"--work_dir={os.path.join(self.dir, 'work-' + agent_id)}")
        agent = Process(argv, os.path.join(self.dir, f"agent-{agent_id}.log"), env=env)
        self.agents[agent_id] = agent
        self._all.append(agent)
        return agent

    def ctl(self, *args, input=None, timeout=DEFAULT_TIMEOUT, check=False):
        """Runs taskgridctl against this cluster; returns CompletedProcess (text)."""
        argv = ([binary("TASKGRID_CTL"), f"--addr={self.addr}"] + self.ctl_flags +
                [str(a) for a in args])
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def ctl_json(self, *args, **kw):
        res = self.ctl("--json", *args, check=True, **kw)
        return json.loads(res.stdout)

    def task(self, task_id):
        return self.ctl_json("get", task_id)

    def tasks(self, *filters):
        """Every task (all pages), e.g. tasks("--queue=q", "--state=running")."""
        return self.ctl_json("list", "--all", "--page_size=1000", *filters).get("tasks", [])

    def agents_info(self):
        """`taskgridctl agents --json`: {agent id: Agent as a dict}."""
        return {a["id"]: a for a in self.ctl_json("agents").get("agents", [])}

    def cluster_stats(self):
        """`taskgridctl cluster --json`: ClusterStats as a dict (int64 as int)."""
        stats = self.ctl_json("cluster")
        for key in ("slots_total", "slots_used", "stale_messages"):
            stats[key] = int(stats.get(key, 0))
        stats["tasks"] = {k: int(v) for k, v in stats.get("tasks", {}).items()}
        return stats

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


class TcpProxy:
    """A TCP relay on 127.0.0.1 to (host, port), for cutting connections.

    Every accepted connection is relayed to the target by two threads (one
    per direction). cut() drops every current connection at once (both ends
    see their stream end) and keeps accepting new ones; blackhole() makes
    it a network that stops delivering (what a partition with a DROP rule
    does): the connections stay open, nothing more crosses them, and new
    ones are accepted but never reach the target; close() stops accepting,
    drops everything and joins every thread.
    """

    def __init__(self, target_port, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._live = []       # [(client, upstream)] still relaying; guarded by _lock
        self._sockets = []    # every socket opened, closed by close(); guarded by _lock
        self._pumps = {}      # pair -> its two pump threads; guarded by _lock
        self._stop = threading.Event()
        self._blackhole = threading.Event()
        self.accepted = 0     # connections accepted so far; guarded by _lock
        self._acceptor = threading.Thread(target=self._accept_loop, name="proxy-accept",
                                          daemon=True)
        self._acceptor.start()

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def connections(self):
        """How many connections are relayed now."""
        with self._lock:
            return len(self._live)

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self._blackhole.is_set():
                with self._lock:
                    self._sockets.append(client)  # held open, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            pair = (client, upstream)
            with self._lock:
                self._sockets += [client, upstream]
                if self._stop.is_set():
                    break
                self._live.append(pair)
                self.accepted += 1
                self._pumps[pair] = [
                    threading.Thread(target=self._pump, args=(src, dst, pair), name="proxy-pump",
                                     daemon=True)
                    for src, dst in ((client, upstream), (upstream, client))]
                for t in self._pumps[pair]:
                    t.start()

    def _pump(self, src, dst, pair):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._blackhole.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _drop(self, pair):
        """Ends both sides of `pair`; wakes its pumps blocked in recv()."""
        for sock in pair:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            if pair in self._live:
                self._live.remove(pair)

    def _join_pumps(self, pairs, timeout):
        deadline = time.monotonic() + timeout
        for pair in pairs:
            with self._lock:
                threads = self._pumps.pop(pair, [])
            for t in threads:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    raise TimeoutError("a proxy thread did not stop")

    def blackhole(self):
        """From now on nothing crosses: see the class comment."""
        self._blackhole.set()

    def cut(self, timeout=DEFAULT_TIMEOUT):
        """Drops every current connection; returns how many there were."""
        with self._lock:
            pairs = list(self._live)
        for pair in pairs:
            self._drop(pair)
        self._join_pumps(pairs, timeout)
        return len(pairs)

    def close(self):
        self._stop.set()
        self._acceptor.join(timeout=DEFAULT_TIMEOUT)
        self._listener.close()
        self.cut()
        with self._lock:
            finished = list(self._pumps)
        self._join_pumps(finished, DEFAULT_TIMEOUT)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()
