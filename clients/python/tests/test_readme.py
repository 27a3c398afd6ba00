"""The examples of clients/python/README.md, run as written (the quick
start's address replaced by the test scheduler's)."""
import os
import signal
import subprocess
import sys

from taskgrid import state_name


README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def block(marker):
    """The code of the fenced block after `marker`, and the block after it."""
    with open(README) as f:
        lines = f.read().split("\n")
    at = lines.index(marker)
    assert lines[at + 1].startswith("```"), marker
    end = lines.index("```", at + 2)
    code = "\n".join(lines[at + 2:end]) + "\n"
    after_start = next(i for i in range(end + 1, len(lines)) if lines[i].startswith("```"))
    after_end = lines.index("```", after_start + 1)
    return code, lines[after_start + 1:after_end]


def test_the_quickstart_prints_what_the_page_shows(cluster):
    code, shown = block("<!-- runnable: python-quickstart -->")
    assert len(code.strip().split("\n")) <= 5
    cluster.start_agent("a1", slots=1)
    res = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:7070", cluster.addr)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().split("\n") == shown


def test_the_output_example_prints_the_task_s_output(cluster):
    code, shown = block("<!-- runnable: python-output -->")
    cluster.start_agent("a1", slots=1)
    res = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:7070", cluster.addr)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().split("\n") == shown


def test_the_worker_example_runs_the_task_the_page_submits(cluster, client):
    code, shown = block("<!-- runnable: python-worker -->")
    cluster.start_agent("a1", slots=1)  # it must not take the worker's task
    worker = subprocess.Popen([sys.executable, "-c", code.replace("127.0.0.1:7070", cluster.addr)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        submit = [line for line in shown if line.startswith("taskgridctl submit")]
        assert len(submit) == 1
        args = submit[0].split()[2:]
        cluster.ctl("submit", *args, check=True)
        task_id = [a for a in args if a.startswith("--id=")][0][len("--id="):]
        task = client.wait(task_id, timeout=60)
        assert state_name(task.state) == "SUCCEEDED"
        assert task.result.output == b"resized a.png to 64"
        assert task.attempts[0].agent_id != "a1"  # claimed by the worker, not run by the agent
        shown_get = [line for line in shown if line.startswith("taskgridctl get")][0]
        got = cluster.ctl("get", task_id, check=True).stdout
        assert "resized a.png to 64" in got and "SUCCEEDED" in got, got
        assert "resized a.png to 64" in shown_get
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
