"""deploy/quickstart.sh as a new user runs it, with the build's binaries
(TASKGRID_QUICKSTART_BIN: nothing installed or built) and everything in the
test's own directory and ports: a task runs on its local agent; kill -9 of
the scheduler is followed by a new one, which the agent reconnects to with
its step still running, and the task finishes as its first attempt;
Ctrl-C stops both and leaves nothing behind.

Run through ctest (system.quickstart), or by hand with TASKGRID_SCHEDULER,
TASKGRID_AGENT and TASKGRID_CTL set (all three in one directory).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import binary, processes_with, read_text, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Waits (bounded: 60 s) for the test's "go" file, then ends.
HELD_STEP = r"""
i=0; while [ ! -e "$1/go" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
echo "held step done"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QuickstartTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="taskgrid-quickstart-")
        bin_dir = os.path.dirname(binary("TASKGRID_SCHEDULER"))
        for var in ("TASKGRID_AGENT", "TASKGRID_CTL"):
            self.assertEqual(os.path.dirname(binary(var)), bin_dir,
                             "the quick start takes the three binaries from one directory")
        self.addr = f"127.0.0.1:{free_port()}"
        self.data_dir = os.path.join(self.dir, "data")
        env = dict(os.environ, TASKGRID_ADDR=self.addr, TASKGRID_HTTP_ADDR="127.0.0.1:0",
                   TASKGRID_DATA_DIR=self.data_dir, TASKGRID_LOGS=os.path.join(self.dir, "logs"),
                   TASKGRID_QUICKSTART_BIN=bin_dir, TASKGRID_SLOTS="2")
        self.out = open(os.path.join(self.dir, "quickstart.out"), "w")
        self.err_path = os.path.join(self.dir, "quickstart.err")
        self.err = open(self.err_path, "w")
        self.script = subprocess.Popen([os.path.join(ROOT, "deploy", "quickstart.sh")], env=env,
                                       stdout=self.out, stderr=self.err, start_new_session=True)

    def tearDown(self):
        if self.script.poll() is None:
            os.killpg(self.script.pid, signal.SIGKILL)
            self.script.wait(timeout=30)
        # What it started runs in sessions of its own.
        for pid in processes_with(f"--data_dir={self.data_dir}") + \
                processes_with(f"--work_dir={self.dir}/work"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.out.close()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def ctl(self, *args, check=True):
        res = subprocess.run([binary("TASKGRID_CTL"), f"--addr={self.addr}"] + list(args),
                             capture_output=True, text=True, timeout=60)
        if check and res.returncode != 0:
            raise AssertionError(f"taskgridctl {' '.join(args)} exited {res.returncode}:\n"
                                 f"{res.stdout}\n{res.stderr}\n{self.logs()}")
        return res

    def logs(self):
        text = []
        for name in ("quickstart.out", "quickstart.err", "logs/scheduler.log", "logs/agent.log"):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                text.append(f"----- {name}\n{read_text(path)}")
        return "\n".join(text)

    def state_of(self, task_id):
        res = self.ctl("--json", "get", task_id, check=False)
        return json.loads(res.stdout) if res.returncode == 0 else {}

    def wait_state(self, task_id, state):
        return wait_until(lambda: (t := self.state_of(task_id)).get("state") ==
                          f"TASK_STATE_{state}" and t,
                          timeout=60, interval=0.1, what=f"{task_id} to be {state}")

    def test_a_killed_scheduler_comes_back_and_the_running_task_finishes_as_attempt_1(self):
        out_path = os.path.join(self.dir, "quickstart.out")
        wait_until(lambda: self.script.poll() is not None or
                   "Taskgrid is running." in read_text(out_path),
                   timeout=60, what="the quick start to say it runs")
        self.assertIsNone(self.script.poll(), self.logs())
        self.assertIn(f"scheduler  {self.addr}", read_text(out_path))
        wait_until(lambda: any(a.get("id") == "local-agent" for a in json.loads(
            self.ctl("--json", "agents").stdout).get("agents", [])),
            timeout=60, what="local-agent to connect")

        self.ctl("submit", "--id=hello", "--", "/bin/echo", "hi")
        self.assertEqual(self.wait_state("hello", "SUCCEEDED")["result"]["exit_code"], 0)

        self.ctl("submit", "--id=held", "--", "/bin/sh", "-c", HELD_STEP, "held", self.dir)
        self.wait_state("held", "RUNNING")
        schedulers = processes_with(f"--data_dir={self.data_dir}")
        self.assertEqual(len(schedulers), 1, schedulers)
        os.kill(schedulers[0], signal.SIGKILL)
        wait_until(lambda: "the scheduler is serving again" in read_text(self.err_path),
                   timeout=60, what="the quick start to start the scheduler again")
        self.assertIn("exit code 137", read_text(self.err_path))
        self.assertIsNone(self.script.poll(), self.logs())
        # The step ran on through the restart; it ends only now.
        with open(os.path.join(self.dir, "go"), "w"):
            pass
        task = self.wait_state("held", "SUCCEEDED")
        self.assertEqual(task["attempt"], 1, task)
        self.assertEqual(len(task["attempts"]), 1, task)

        # Ctrl-C: the agent, then the scheduler; the tasks stay.
        os.killpg(self.script.pid, signal.SIGINT)
        self.assertEqual(self.script.wait(timeout=60), 0, self.logs())
        self.assertIn("quickstart: stopped. Tasks kept", read_text(out_path))
        wait_until(lambda: not processes_with(f"--data_dir={self.data_dir}") and
                   not processes_with(f"--work_dir={self.dir}/work"),
                   timeout=30, what="the scheduler and the agent to be gone")


if __name__ == "__main__":
    unittest.main()
