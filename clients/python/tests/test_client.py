"""taskgrid.Client against a real scheduler and agent."""
import socket
import threading

import grpc
import pytest

import taskgrid
from taskgrid import TaskgridError, state_name
from taskgrid.v1 import task_pb2

from conftest import wait_until


def echo(task_id, *words, queue="default"):
    return {"id": task_id, "queue": queue, "steps": [{"exec": {"argv": ["echo", *words]}}]}


def test_submit_wait_and_get(cluster, client):
    cluster.start_agent("a1", slots=2)
    t = client.submit(echo("py-1", "hi"))
    assert t.spec.id == "py-1"
    assert isinstance(t, task_pb2.Task)
    done = client.wait("py-1", timeout=60)
    assert state_name(done.state) == "SUCCEEDED"
    assert done.result.stdout_tail == b"hi\n"
    assert client.get("py-1").attempt == 1


def test_submit_is_idempotent_by_id_and_refuses_another_spec(client):
    first = client.submit(echo("py-2", "a"))
    again = client.submit(echo("py-2", "a"))
    assert again.create_time == first.create_time
    with pytest.raises(TaskgridError) as e:
        client.submit(echo("py-2", "b"))
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert list(client.get("py-2").spec.steps[0].exec.argv) == ["echo", "a"]


def test_a_message_or_a_dict(client):
    spec = task_pb2.TaskSpec(id="py-msg", queue="q")
    spec.steps.add().builtin.name = "noop"
    assert client.submit(spec).spec.queue == "q"
    with pytest.raises(Exception):
        client.submit({"id": "py-bad", "stepz": []})  # not a TaskSpec field
    with pytest.raises(TaskgridError) as e:
        client.get("py-bad")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_errors_name_the_code_and_the_message(client):
    with pytest.raises(TaskgridError) as e:
        client.submit({"id": "no-steps"})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "step" in e.value.message
    with pytest.raises(TaskgridError) as e:
        client.cancel("nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_claim_a_named_task_or_learn_why_not(client):
    client.submit_many([echo(f"py-c{i}", str(i), queue="cq") for i in range(3)])
    claims = client.claim("", "w1", task_id="py-c2")
    assert [c.assignment.task_id for c in claims] == ["py-c2"]
    assert client.get("py-c2").agent_id == "w1"
    with pytest.raises(TaskgridError) as e:
        client.claim("cq", "w2", task_id="py-c2")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "claimed by w1" in e.value.message
    with pytest.raises(TaskgridError) as e:
        client.claim("cq", "w2", task_id="py-nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert state_name(client.get("py-c0").state) == "PENDING"


def test_wait_times_out_while_nothing_runs_it(client):
    client.submit(echo("py-idle", "x"))
    with pytest.raises(TimeoutError):
        client.wait("py-idle", timeout=0.5)
    assert state_name(client.cancel("py-idle").state) == "CANCELLED"
    assert state_name(client.wait("py-idle", timeout=30).state) == "CANCELLED"


def test_list_pages_through_everything(client):
    client.submit_many([echo(f"py-l{i}", str(i), queue="lq") for i in range(25)])
    ids = [t.spec.id for t in client.list(queue="lq", states=["PENDING"], page_size=10)]
    assert sorted(ids) == sorted(f"py-l{i}" for i in range(25))
    assert list(client.list(queue="lq", states=["SUCCEEDED"])) == []
    newest = [t.spec.id for t in client.list(queue="lq", id_prefix="py-l1", newest_first=True,
                                             page_size=4)]
    assert newest == [f"py-l{i}" for i in range(19, 9, -1)] + ["py-l1"]


def test_list_finds_tasks_by_label(client):
    client.submit_many([
        {"id": "py-lab-1", "labels": {"team": "red", "run": "7"},
         "steps": [{"builtin": {"name": "noop"}}], "queue": "labq"},
        {"id": "py-lab-2", "labels": {"team": "blue"}, "steps": [{"builtin": {"name": "noop"}}],
         "queue": "labq"}])
    assert [t.spec.id for t in client.list(labels={"team": "red"})] == ["py-lab-1"]
    assert [t.spec.id for t in client.list(labels={"team": "red", "run": "8"})] == []
    assert dict(client.get("py-lab-2").spec.labels) == {"team": "blue"}


def test_a_job_runs_in_dependency_order(cluster, client):
    cluster.start_agent("a1", slots=2)
    job = client.submit_job("pj", [
        {"id": "pj-a", "steps": [{"builtin": {"name": "noop"}}]},
        {"id": "pj-b", "depends_on": ["pj-a"], "steps": [{"builtin": {"name": "noop"}}]}])
    assert job.id == "pj"
    assert state_name(client.wait("pj-b", timeout=60).state) == "SUCCEEDED"
    a, b = client.get("pj-a"), client.get("pj-b")
    assert a.attempts[0].finish_time.ToNanoseconds() <= b.attempts[0].start_time.ToNanoseconds()


def test_watch_sees_every_change_across_a_restart(cluster, client):
    events = []
    seen = threading.Event()

    def watch():
        for ev in client.watch(task_ids=["py-w"], after_revision=0):
            events.append((state_name(ev.from_state) if ev.from_state else "-",
                           state_name(ev.to_state), ev.revision))
            if ev.to_state == task_pb2.TASK_STATE_SUCCEEDED:
                seen.set()
                return
    client.submit(echo("py-w", "w"))
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    wait_until(lambda: events, what="the first event")
    cluster.scheduler.kill9()
    cluster.start_scheduler()  # the same port and data directory
    cluster.start_agent("a1", slots=1)
    assert seen.wait(90), events
    t.join(30)
    revisions = [r for _, _, r in events]
    assert revisions == sorted(set(revisions)), events  # none missed twice, in order
    assert [e[1] for e in events][-1] == "SUCCEEDED"
    assert events[0][1] == "PENDING"


def test_follows_to_a_scheduler_that_answers(cluster):
    # The first address has nothing listening: calls go to the second.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    with taskgrid.Client([dead, cluster.addr], failover_for=30) as c:
        c.submit(echo("py-f", "f"))
        assert c.get("py-f").spec.id == "py-f"
        assert c.address == cluster.addr


def test_a_token_needs_tls():
    with pytest.raises(ValueError):
        taskgrid.Client("127.0.0.1:1", token="secret-token")
