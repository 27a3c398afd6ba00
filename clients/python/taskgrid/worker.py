"""taskgrid.Worker: Python functions as tasks, in pull mode.

    worker = taskgrid.Worker(client, queue="images")

    @worker.task("resize")
    def resize(path, size, payload: bytes = b""):
        ...
        return "resized"

    worker.run()

A task for it has steps whose command names a function, and whose other
arguments are the function's:
{"queue": "images", "steps": [{"exec": {"argv": ["resize", "a.png", "64"]}}]}.
(The worker runs no process: argv[0] is looked up among its functions.)

The worker claims tasks from its queue on the board (BoardService, the
scheduler's pull mode: no agent stream), up to `concurrency` at once, and
runs each step's function on a thread with the step's argv[1:] as
positional strings (and, when the function takes them, `payload=` the task's payload
and `task=` the claimed assignment). While a task runs its claim is
extended every lease/3, so a long function keeps it and a worker that
dies loses it within one lease. The last step's return value is the
task's output and stdout (bytes as they are, str as UTF-8, anything else
as JSON);
an exception fails the attempt (its traceback in stderr_tail; retried as
the task's max_attempts allows), and PermanentError fails it for good. A
task with a step the worker has no function for is put aside
(TrashClaim), with a reason naming the step.

stop() (and SIGINT or SIGTERM while run() runs in the main thread) claims
nothing more and abandons the claims of the tasks still running: they go
back on the board at once, the attempt not counted, and what their
functions return afterwards is dropped (a Python thread cannot be killed;
it runs on until its function returns).
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import socket
import threading
import traceback
from typing import Any, Callable, Dict, Optional

import grpc

from taskgrid.client import Client, TaskgridError
from taskgrid.v1 import agent_service_pb2 as agent_pb2
from taskgrid.v1 import board_service_pb2 as board_pb2
from taskgrid.v1 import task_pb2

log = logging.getLogger("taskgrid.worker")

MAX_TAIL = 64 << 10  # bytes of a value or a traceback kept as its tail, the last ones


class PermanentError(Exception):
    """Raised by a task function: the attempt fails and is not retried."""


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


class Worker:
    """Runs registered functions for the tasks of one queue.

    client: the Client it claims with.
    queue: the queue it takes tasks from.
    owner: the name its claims are held under (default: host-pid); with
        tokens, one the token may act as.
    labels: what it offers, for tasks that ask for labels.
    concurrency: tasks run at once.
    lease: seconds a claim lasts unless extended.
    """

    def __init__(self, client: Client, queue: str = "default", *, owner: Optional[str] = None,
                 labels: Optional[Dict[str, str]] = None, concurrency: int = 1,
                 lease: float = 30.0):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease < 1.0:
            raise ValueError("lease must be at least 1 second")
        self.client = client
        self.queue = queue
        self.owner = owner or f"{socket.gethostname()}-{os.getpid()}"
        self.labels = dict(labels or {})
        self.concurrency = concurrency
        self.lease = lease
        self.completed = 0  # tasks completed (succeeded or failed) by this worker
        self.extended = 0   # claim extensions made
        self._functions: Dict[str, Callable[..., Any]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: Dict[str, board_pb2.ClaimRef] = {}  # task id -> its claim
        self._threads: list = []

    def task(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Registers the decorated function for steps whose argv[0] is `name`."""
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._functions:
                raise ValueError(f"a function for {name!r} is registered already")
            self._functions[name] = fn
            return fn
        return register

    def stop(self) -> None:
        """Claims nothing more; abandons the claims of running tasks."""
        self._stop.set()
        with self._lock:
            running = list(self._running.items())
            self._running.clear()
        for task_id, ref in running:
            try:
                self.client.abandon_claim(ref, f"worker {self.owner} stopped")
            except TaskgridError as e:
                log.warning("abandoning %s: %s", task_id, e)

    def run(self, *, max_tasks: Optional[int] = None) -> None:
        """Claims and runs tasks until stop() (or SIGINT/SIGTERM, when called
        from the main thread), or until `max_tasks` were completed."""
        if not self._functions:
            raise ValueError("no task functions: register one with @worker.task(name)")
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        try:
            while not self._stop.is_set():
                if max_tasks is not None and self.completed >= max_tasks:
                    break
                with self._lock:
                    free = self.concurrency - len(self._running)
                if free <= 0:
                    self._stop.wait(0.05)
                    continue
                try:
                    claims = self.client.claim(self.queue, self.owner, max=free,
                                               lease=self.lease, labels=self.labels)
                except TaskgridError as e:
                    log.warning("claim: %s", e)
                    self._stop.wait(1.0)
                    continue
                if not claims:
                    try:
                        self.client.wait_for_work(self.queue, labels=self.labels, timeout=5.0)
                    except TaskgridError as e:
                        log.warning("wait for work: %s", e)
                        self._stop.wait(1.0)
                    continue
                for claimed in claims:
                    self._start(claimed.assignment)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._stop.is_set():
                self.stop()  # what started meanwhile is abandoned too
            else:
                for t in list(self._threads):
                    t.join()

    # --- one task ---

    def _start(self, a: agent_pb2.Assignment) -> None:
        ref = board_pb2.ClaimRef(task_id=a.task_id, attempt=a.attempt, owner=self.owner)
        with self._lock:
            self._running[a.task_id] = ref
        t = threading.Thread(target=self._run_task, args=(a, ref), daemon=True,
                             name=f"task-{a.task_id}")
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _mine(self, ref: board_pb2.ClaimRef) -> bool:
        with self._lock:
            return self._running.get(ref.task_id) == ref

    def _release(self, ref: board_pb2.ClaimRef) -> bool:
        with self._lock:
            if self._running.get(ref.task_id) != ref:
                return False
            del self._running[ref.task_id]
            return True

    def _keep_claim(self, ref: board_pb2.ClaimRef, done: threading.Event) -> None:
        while not done.wait(self.lease / 3):
            if not self._mine(ref):
                return
            try:
                self.client.extend_claim(ref, self.lease)
                self.extended += 1
            except TaskgridError as e:
                if e.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND,
                              grpc.StatusCode.FAILED_PRECONDITION):
                    log.warning("%s: the claim is gone (%s); its result will be dropped",
                                ref.task_id, e.message)
                    self._release(ref)
                    return
                log.warning("extending %s: %s", ref.task_id, e)

    def _run_task(self, a: agent_pb2.Assignment, ref: board_pb2.ClaimRef) -> None:
        missing = [self._name_of(s) for s in a.steps if self._name_of(s) not in self._functions]
        if missing or not a.steps:
            reason = (f"worker {self.owner} has no function for step {missing[0]!r} "
                      f"(it has {', '.join(sorted(self._functions))})" if missing
                      else "the task has no steps")
            if self._release(ref):
                try:
                    self.client.trash_claim(ref, reason)
                except TaskgridError as e:
                    log.warning("trashing %s: %s", a.task_id, e)
            return
        done = threading.Event()
        keeper = threading.Thread(target=self._keep_claim, args=(ref, done), daemon=True)
        keeper.start()
        result = task_pb2.TaskResult(outcome=task_pb2.OUTCOME_SUCCEEDED)
        try:
            for i, step in enumerate(a.steps):
                result.step = i
                value = self._call(self._functions[step.exec.argv[0]], step.exec.argv[1:], a)
                out = _as_bytes(value)
                result.output = out
                result.stdout_tail = out[-MAX_TAIL:]  # what `taskgridctl get` shows
                result.stdout_cut_bytes = max(0, len(out) - MAX_TAIL)
        except Exception as e:  # noqa: BLE001: the task's failure, reported as such
            tb = traceback.format_exc().encode()
            result = task_pb2.TaskResult(
                outcome=task_pb2.OUTCOME_FAILED, exit_code=1, step=result.step,
                error=f"{type(e).__name__}: {e}"[:1000], stderr_tail=tb[-MAX_TAIL:],
                stderr_cut_bytes=max(0, len(tb) - MAX_TAIL),
                permanent=isinstance(e, PermanentError))
        finally:
            done.set()
        if not self._release(ref):
            return  # abandoned (stop) or lost meanwhile: the result is not ours to give
        try:
            self.client.complete_claim(ref, result)
            self.completed += 1
        except TaskgridError as e:
            log.warning("completing %s: %s", a.task_id, e)

    @staticmethod
    def _name_of(step) -> str:
        """The function a step names: its exec argv[0] ("" for other kinds)."""
        if step.WhichOneof("kind") != "exec" or not step.exec.argv:
            return f"({step.WhichOneof('kind')} step)"
        return step.exec.argv[0]

    @staticmethod
    def _call(fn: Callable[..., Any], args, a: agent_pb2.Assignment) -> Any:
        params = inspect.signature(fn).parameters
        kwargs = {}
        if "payload" in params:
            kwargs["payload"] = a.payload
        if "task" in params:
            kwargs["task"] = a
        return fn(*args, **kwargs)
