#!/usr/bin/python3
"""Submits a few tasks to Taskgrid and watches them until each one is finished.

Three `echo` builtin tasks and one that runs /bin/echo are submitted in one
SubmitTasks batch. Their state changes come from TaskService.WatchTasks
(filtered to these task ids) and each one is printed as it arrives. When all
are SUCCEEDED, FAILED or CANCELLED, each task's result is read with GetTask
and printed. Exit code: 0 only if every task SUCCEEDED; 1 otherwise (a task
did not succeed, an RPC failed, or --timeout passed); 2 a usage error.

  /usr/bin/python3 clients/python/submit_and_wait.py --addr=127.0.0.1:7070

Every wait has a deadline: connecting, SubmitTasks and GetTask 10 s (at most
what is left of --timeout), WatchTasks what is left of --timeout.

The watch (from now on: after_revision unset) is opened before the batch is
submitted, once the channel is connected. A change the scheduler commits
before it has registered the watch is not streamed; so when the stream is
quiet for 2 s while tasks are unfinished, those tasks are read with GetTask
too. A watch that ends early (UNAVAILABLE, or RESOURCE_EXHAUSTED for a slow
reader) is resumed after the last revision seen.

Needs the stubs from clients/python/generate.sh (see README.md here).
"""
import argparse
import os
import queue
import sys
import threading
import time

import taskgrid_stubs

taskgrid_stubs.load()

import grpc  # noqa: E402
from taskgrid.v1 import task_pb2  # noqa: E402
from taskgrid.v1 import task_service_pb2 as tpb  # noqa: E402
from taskgrid.v1 import task_service_pb2_grpc as tgrpc  # noqa: E402

CALL_TIMEOUT = 10.0
RECONCILE_AFTER = 2.0   # a quiet stream for this long: unfinished tasks are read with GetTask
TERMINAL = {task_pb2.TASK_STATE_SUCCEEDED, task_pb2.TASK_STATE_FAILED,
            task_pb2.TASK_STATE_CANCELLED}


def state_name(state):
    """"PENDING"; "-" for UNSPECIFIED (the from_state of a new task)."""
    if state == task_pb2.TASK_STATE_UNSPECIFIED:
        return "-"
    return task_pb2.TaskState.Name(state).replace("TASK_STATE_", "")


def specs(prefix, queue_name, agent_ids):
    """Three echo builtins and one exec of /bin/echo."""
    out = []
    for i in range(1, 4):
        out.append(task_pb2.TaskSpec(
            id=f"{prefix}-echo-{i}", queue=queue_name,
            steps=[task_pb2.Step(builtin=task_pb2.BuiltinStep(
                name="echo", args=["hello", "from", "python", str(i)]))]))
    out.append(task_pb2.TaskSpec(
        id=f"{prefix}-exec", queue=queue_name,
        steps=[task_pb2.Step(exec=task_pb2.ExecStep(argv=["/bin/echo", "hello", "from", "exec"]))]))
    for spec in out:
        spec.placement.agent_ids.extend(agent_ids)
    return out


class Watcher(threading.Thread):
    """Reads WatchTasks into a queue: ("event", TaskEvent) or ("error", text)."""

    def __init__(self, stub, task_ids, deadline):
        super().__init__(name="watch", daemon=True)
        self.stub = stub
        self.task_ids = task_ids
        self.deadline = deadline
        self.events = queue.Queue()
        self._lock = threading.Lock()
        self._call = None
        self._closed = False

    def close(self):
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        self.join(5.0)

    def run(self):
        after = None   # unset: changes from now on; N: resume after revision N
        retries = 0
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return
            with self._lock:
                if self._closed:
                    return
                request = tpb.WatchTasksRequest(task_ids=self.task_ids)
                if after is not None:
                    request.after_revision = after
                self._call = self.stub.WatchTasks(request, timeout=remaining)
            try:
                for event in self._call:
                    after = event.revision
                    retries = 0
                    self.events.put(("event", event))
                self.events.put(("error", "the scheduler ended the watch"))
                return
            except grpc.RpcError as e:
                with self._lock:
                    if self._closed:
                        return
                code = e.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    resume = dict(e.trailing_metadata() or ()).get("taskgrid-resume-after")
                    after = int(resume) if resume else after
                    if after is None:
                        self.events.put(("error", f"WatchTasks: {e.details()}"))
                        return
                    print(f"(the watch fell behind: resuming after revision {after})", flush=True)
                elif code == grpc.StatusCode.UNAVAILABLE:
                    # Until the deadline: e.g. the scheduler restarts.
                    if retries == 0:
                        print(f"(the watch broke: {e.details()}; resuming "
                              f"{'from now' if after is None else f'after revision {after}'})",
                              flush=True)
                    retries += 1
                    time.sleep(max(0.0, min(0.5, self.deadline - time.monotonic())))
                elif code == grpc.StatusCode.UNIMPLEMENTED:
                    self.events.put(("error", "this scheduler has no WatchTasks (too old)"))
                    return
                elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return   # the main loop reports the timeout
                else:
                    self.events.put(("error", f"WatchTasks: {code.name}: {e.details()}"))
                    return


def main():
    parser = argparse.ArgumentParser(
        description="Submit three echo tasks and one /bin/echo task, watch them to the end.")
    parser.add_argument("--addr", default=taskgrid_stubs.default_addr(),
                        help="scheduler HOST:PORT (default: $TASKGRID_ADDR or 127.0.0.1:7070)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for every task to finish (default 60)")
    parser.add_argument("--prefix", default=f"py-{int(time.time())}-{os.getpid()}",
                        help="task ids are PREFIX-echo-1..3 and PREFIX-exec")
    parser.add_argument("--queue", default="", help="queue of the tasks (default: default)")
    parser.add_argument("--agent", action="append", default=[],
                        help="run only on this agent id (repeatable; default: any agent)")
    taskgrid_stubs.add_tls_arguments(parser)
    args = parser.parse_args()
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    deadline = time.monotonic() + args.timeout

    def call_timeout():
        return max(0.1, min(CALL_TIMEOUT, deadline - time.monotonic()))

    batch = specs(args.prefix, args.queue, args.agent)
    ids = [s.id for s in batch]
    with taskgrid_stubs.channel(args) as channel:
        connect_timeout = call_timeout()
        try:
            grpc.channel_ready_future(channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            print(f"cannot connect to the scheduler at {args.addr} "
                  f"(waited {connect_timeout:.0f}s)", file=sys.stderr)
            return 1
        stub = tgrpc.TaskServiceStub(channel)
        watcher = Watcher(stub, ids, deadline)
        watcher.start()
        try:
            try:
                submitted = stub.SubmitTasks(tpb.SubmitTasksRequest(tasks=batch),
                                             timeout=call_timeout())
            except grpc.RpcError as e:
                print(f"SubmitTasks to {args.addr}: {e.code().name}: {e.details()}",
                      file=sys.stderr)
                return 1
            state = {}
            for t in submitted.tasks:
                state[t.spec.id] = t.state
                print(f"submitted {t.spec.id}: {state_name(t.state)}", flush=True)

            def reconcile():
                for task_id in ids:
                    if state[task_id] in TERMINAL:
                        continue
                    try:
                        t = stub.GetTask(tpb.GetTaskRequest(id=task_id), timeout=call_timeout())
                    except grpc.RpcError as e:
                        # The scheduler is restarting: the watch resumes
                        # once it is back; read again at the next quiet spell.
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            return
                        raise
                    if t.state != state[task_id]:
                        print(f"{task_id}: {state_name(state[task_id])} -> {state_name(t.state)}"
                              "  (read with GetTask)", flush=True)
                        state[task_id] = t.state

            try:
                while not all(s in TERMINAL for s in state.values()):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        left = [i for i in ids if state[i] not in TERMINAL]
                        print(f"timed out after {args.timeout:g}s; not finished: "
                              f"{', '.join(left)}", file=sys.stderr)
                        return 1
                    try:
                        kind, item = watcher.events.get(timeout=min(remaining, RECONCILE_AFTER))
                    except queue.Empty:
                        reconcile()
                        continue
                    if kind == "error":
                        print(item, file=sys.stderr)
                        return 1
                    ev = item
                    where = f", agent {ev.agent_id}" if ev.agent_id else ""
                    why = f": {ev.reason}" if ev.reason else ""
                    print(f"{ev.task_id}: {state_name(ev.from_state)} -> {state_name(ev.to_state)}"
                          f"  (revision {ev.revision}, attempt {ev.attempt}{where}){why}",
                          flush=True)
                    if state.get(ev.task_id) not in TERMINAL:   # a finished task stays finished
                        state[ev.task_id] = ev.to_state
                failed = 0
                for task_id in ids:
                    t = stub.GetTask(tpb.GetTaskRequest(id=task_id), timeout=call_timeout(),
                                     wait_for_ready=True)
                    r = t.result
                    print(f"{task_id}: {state_name(t.state)}, exit code {r.exit_code}, "
                          f"agent {t.agent_id or (t.attempts[-1].agent_id if t.attempts else '-')},"
                          f" stdout {r.stdout_tail.decode(errors='replace')!r}"
                          + (f", error {r.error!r}" if r.error else ""), flush=True)
                    if t.state != task_pb2.TASK_STATE_SUCCEEDED:
                        failed += 1
            except grpc.RpcError as e:
                print(f"{args.addr}: {e.code().name}: {e.details()}", file=sys.stderr)
                return 1
            if failed:
                print(f"{failed} of {len(ids)} tasks did not succeed", file=sys.stderr)
                return 1
            print(f"all {len(ids)} tasks SUCCEEDED")
            return 0
        finally:
            watcher.close()


if __name__ == "__main__":
    sys.exit(main())
