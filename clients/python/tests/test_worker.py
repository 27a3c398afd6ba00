"""taskgrid.Worker against a real scheduler (pull mode: no agent)."""
import threading

import pytest

import taskgrid
from taskgrid import PermanentError, state_name

from conftest import wait_until


def call(task_id, name, *args, queue="pyq", payload=b"", max_attempts=1):
    spec = {"id": task_id, "queue": queue, "max_attempts": max_attempts,
            "steps": [{"exec": {"argv": [name, *args]}}]}
    if payload:
        import base64
        spec["payload"] = base64.b64encode(payload).decode()
    return spec


def run_in_thread(worker, **kw):
    t = threading.Thread(target=worker.run, kwargs=kw, daemon=True)
    t.start()
    return t


def test_a_function_runs_as_a_task_and_its_value_is_the_output(client):
    w = taskgrid.Worker(client, queue="pyq", owner="w1")

    @w.task("resize")
    def resize(path, size, payload=b""):
        return {"path": path, "size": int(size), "payload": payload.decode()}

    client.submit(call("r1", "resize", "a.png", "64", payload=b"pixels"))
    t = run_in_thread(w, max_tasks=1)
    done = client.wait("r1", timeout=60)
    t.join(30)
    assert state_name(done.state) == "SUCCEEDED"
    assert done.result.output == b'{"path": "a.png", "size": 64, "payload": "pixels"}'
    assert w.completed == 1


def test_an_exception_fails_the_attempt_and_permanent_ends_it(client):
    w = taskgrid.Worker(client, queue="pyq", owner="w2", concurrency=2)
    calls = []

    @w.task("flaky")
    def flaky():
        calls.append("flaky")
        raise RuntimeError("disk on fire")

    @w.task("doomed")
    def doomed():
        calls.append("doomed")
        raise PermanentError("bad input")

    client.submit(call("f1", "flaky", max_attempts=2))
    client.submit(call("d1", "doomed", max_attempts=3))
    t = run_in_thread(w)
    try:
        f1 = client.wait("f1", timeout=90)
        d1 = client.wait("d1", timeout=90)
    finally:
        w.stop()
        t.join(30)
    assert state_name(f1.state) == "FAILED"
    assert f1.attempts_used == 2  # retried once
    assert "disk on fire" in f1.result.error
    assert b"RuntimeError" in f1.result.stderr_tail
    assert state_name(d1.state) == "FAILED"
    assert d1.attempts_used == 1  # permanent: not retried
    assert calls.count("doomed") == 1


def test_a_step_without_a_function_is_put_aside(client):
    w = taskgrid.Worker(client, queue="pyq", owner="w3")

    @w.task("known")
    def known():
        return "ok"

    client.submit(call("u1", "unknown"))
    t = run_in_thread(w)
    try:
        wait_until(lambda: state_name(client.get("u1").state) == "TRASHED",
                   what="u1 to be trashed")
    finally:
        w.stop()
        t.join(30)
    assert "no function for step 'unknown'" in client.get("u1").reason


def test_the_claim_is_extended_while_the_function_runs(client):
    w = taskgrid.Worker(client, queue="pyq", owner="w4", lease=4.0)
    release = threading.Event()

    @w.task("long")
    def long():
        assert release.wait(120)
        return "finished"

    client.submit(call("l1", "long"))
    t = run_in_thread(w, max_tasks=1)
    # Longer than the lease (an extension every lease/3): without the
    # extensions the claim would lapse and the attempt be lost.
    wait_until(lambda: w.extended >= 4, what="four extensions")
    release.set()
    done = client.wait("l1", timeout=60)
    t.join(30)
    assert state_name(done.state) == "SUCCEEDED"
    assert done.attempts_used == 1 and len(done.attempts) == 1


def test_stop_abandons_running_claims_without_counting_them(client):
    w = taskgrid.Worker(client, queue="pyq", owner="w5")
    started = threading.Event()
    release = threading.Event()

    @w.task("slow")
    def slow():
        started.set()
        release.wait(120)
        return "too late"

    client.submit(call("s1", "slow", max_attempts=1))
    t = run_in_thread(w)
    assert started.wait(60)
    w.stop()
    t.join(30)
    release.set()
    task = client.get("s1")
    assert state_name(task.state) == "PENDING"  # back on the board
    assert task.attempts_used == 0               # the abandoned attempt is not counted
    # Another worker takes it and finishes it.
    w2 = taskgrid.Worker(client, queue="pyq", owner="w6")
    w2.task("slow")(lambda: "second")
    t2 = run_in_thread(w2, max_tasks=1)
    done = client.wait("s1", timeout=60)
    t2.join(30)
    assert state_name(done.state) == "SUCCEEDED"
    assert done.result.output == b"second"


def test_bad_settings_are_refused(client):
    with pytest.raises(ValueError):
        taskgrid.Worker(client, concurrency=0)
    with pytest.raises(ValueError):
        taskgrid.Worker(client).run()  # no functions
