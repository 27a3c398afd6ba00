"""taskgrid.Client against a real scheduler and agent."""
import os
import socket
import threading

import grpc
import pytest

import taskgrid
from taskgrid import TaskgridError, state_name
from taskgrid.v1 import cluster_service_pb2 as cluster_pb2
from taskgrid.v1 import task_pb2

from conftest import harness, wait_until


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


def held(task_id, go, queue="default"):
    """A task that writes "first", waits (bounded) for the file `go`, then
    writes "second" and "err" on stderr."""
    script = ('echo first; i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.05; '
              'i=$((i+1)); done; echo second; echo err >&2')
    return {"id": task_id, "queue": queue,
            "steps": [{"exec": {"argv": ["sh", "-c", script, "sh", go]}}]}


def collect(messages):
    """Output bytes per stream name, the attempts started, and the END."""
    out = {"stdout": b"", "stderr": b""}
    started, end = [], None
    kind = taskgrid.v1.task_service_pb2.StreamTaskOutputResponse
    for r in messages:
        if r.kind == kind.KIND_OUTPUT:
            name = task_pb2.OutputStream.Name(r.stream).replace("OUTPUT_STREAM_", "").lower()
            assert r.offset == len(out[name]), (name, r.offset, out[name])  # no gap, no repeat
            out[name] += r.data
        elif r.kind == kind.KIND_ATTEMPT_STARTED:
            started.append(r.attempt)
        elif r.kind == kind.KIND_END:
            end = r
    return out, started, end


def test_output_follows_a_task_through_a_cut_and_a_restart_without_repeating(cluster):
    go = os.path.join(cluster.dir, "go-out")
    cluster.start_agent("a1", slots=1)
    proxy = harness.TcpProxy(cluster.port)
    client = taskgrid.Client(proxy.addr, timeout=30, failover_for=60)
    try:
        client.submit(held("py-out", go))
        got = []
        first = threading.Event()

        def follow():
            for r in client.output("py-out", follow=True):
                got.append(r)
                if r.data:
                    first.set()
        t = threading.Thread(target=follow, daemon=True)
        t.start()
        assert first.wait(60), got
        # The connection cut: the stream is opened again and the scheduler
        # sends what the agent holds (the "first" line) once more.
        proxy.cut()
        wait_until(lambda: proxy.accepted >= 2, what="the stream opened again")
        # A new scheduler on the same port and data: the same once more.
        cluster.scheduler.kill9()
        cluster.start_scheduler()
        wait_until(lambda: proxy.accepted >= 3, what="the stream opened on the new scheduler")
        with open(go, "w"):
            pass
        t.join(90)
        assert not t.is_alive()
        out, started, end = collect(got)
        assert out == {"stdout": b"first\nsecond\n", "stderr": b"err\n"}
        assert started == [1]
        assert state_name(end.state) == "SUCCEEDED"
    finally:
        client.close()
        proxy.close()

    # Finished: the stored tails, one stream if asked, without follow.
    with taskgrid.Client(cluster.addr) as client:
        out, _, end = collect(client.output("py-out", stream="stderr"))
        assert out == {"stdout": b"", "stderr": b"err\n"}
        assert state_name(end.state) == "SUCCEEDED"
        with pytest.raises(TaskgridError) as e:
            list(client.output("py-none"))
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_pause_resume_and_reset_a_task(cluster, client):
    client.submit(echo("py-p", "p"))
    assert state_name(client.pause("py-p").state) == "PAUSED"
    assert state_name(client.pause("py-p").state) == "PAUSED"  # again: no error
    cluster.start_agent("a1", slots=1)
    assert state_name(client.resume("py-p").state) == "PENDING"
    done = client.wait("py-p", timeout=60)
    assert state_name(done.state) == "SUCCEEDED" and done.attempt == 1
    again = client.reset("py-p")
    assert state_name(again.state) in ("PENDING", "DISPATCHED", "RUNNING", "SUCCEEDED")
    done = client.wait("py-p", timeout=60)
    assert state_name(done.state) == "SUCCEEDED" and done.attempt == 2
    assert done.attempts_used == 1  # the reset renewed the budget
    with pytest.raises(TaskgridError) as e:
        client.resume("py-p")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_queue_controls_and_bulk_changes(client):
    client.submit_many([echo(f"py-b{i}", str(i), queue="bq") for i in range(12)])
    client.submit(echo("py-other", "o", queue="oq"))
    paused = client.pause_queue("bq")
    assert paused.settings.paused and paused.queue == "bq"
    limited = client.set_queue_limits("bq", max_concurrency=3, rate_per_second=2.5)
    assert (limited.settings.max_concurrency, limited.settings.rate_per_second) == (3, 2.5)
    assert client.set_queue_weight("bq", 7).settings.weight == 7
    assert not client.set_queue_weight("bq", None).settings.HasField("weight")
    [stats] = client.queues("bq", with_history=True)
    assert stats.counts["PENDING"] == 12 and stats.settings.paused
    assert stats.history  # the minute the submits were counted in
    assert sum(m.submitted for m in stats.history) == 12
    assert {q.queue for q in client.queues()} >= {"bq", "oq"}
    assert not client.resume_queue("bq").settings.paused

    with pytest.raises(TaskgridError) as e:
        client.cancel_tasks()  # neither a queue nor a job
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    cancelled = client.cancel_tasks(queue="bq", states=["PENDING"])
    assert sorted(cancelled.ids) == sorted(f"py-b{i}" for i in range(12))
    assert state_name(client.get("py-other").state) == "PENDING"  # another queue
    retried = client.retry_tasks(queue="bq")
    assert len(retried.ids) == 12
    client.cancel_tasks(queue="bq")
    deleted = client.delete_tasks(queue="bq", states=["CANCELLED"])
    assert len(deleted.ids) == 12
    assert list(client.list(queue="bq")) == []


def test_jobs_listed_retried_and_deleted(cluster, client):
    cluster.start_agent("a1", slots=2)
    client.submit_job("pjr", [
        {"id": "pjr-a", "max_attempts": 1, "steps": [{"exec": {"argv": ["false"]}}]},
        {"id": "pjr-b", "depends_on": ["pjr-a"], "steps": [{"builtin": {"name": "noop"}}]}])
    client.wait("pjr-b", timeout=60)
    jobs = {j.id: j for j in client.list_jobs(states=["FAILED"])}
    assert "pjr" in jobs and jobs["pjr"].task_count == 2
    assert [j.id for j in client.list_jobs(states=["SUCCEEDED"])] == []
    retried = client.retry_job("pjr")
    assert retried.id == "pjr"
    assert client.wait("pjr-a", timeout=60).attempt == 2
    client.wait("pjr-b", timeout=60)
    deleted = client.delete_job("pjr")
    assert deleted.tasks_deleted == 2
    with pytest.raises(TaskgridError) as e:
        client.get_job("pjr")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_drain_an_agent_and_read_the_cluster(cluster, client):
    cluster.start_agent("a1", slots=3)
    wait_until(lambda: client.cluster_stats().agents_active == 1, what="a1 active")
    drained = client.drain_agent("a1")
    assert cluster_pb2.AgentState.Name(drained.state) == "AGENT_STATE_DRAINING"
    stats = client.cluster_stats()
    assert (stats.agents_active, stats.agents_draining, stats.slots_total) == (0, 1, 3)
    assert cluster_pb2.AgentState.Name(client.undrain_agent("a1").state) == "AGENT_STATE_ACTIVE"
    with pytest.raises(TaskgridError) as e:
        client.drain_agent("nobody")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
