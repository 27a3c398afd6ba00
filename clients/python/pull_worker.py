#!/usr/bin/python3
"""A Taskgrid pull worker in Python: it claims tasks from a queue (pull mode,
BoardService in proto/taskgrid/v1/board_service.proto) instead of being sent
them over an agent stream, runs them, and completes each claim.

  - Claim (up to --max at once, each held for --lease); with nothing to
    claim, WaitForWork (a long poll) until the queue has work it may take.
  - Each claimed task runs on a thread of its own: exec steps as processes
    (argv, env, cwd; the payload on the first step's stdin; the step's
    timeout), and the builtins noop, echo, sleep and fail. A task with a
    step this worker cannot run (http) is put aside with TrashClaim.
  - While a task runs, its claim is extended every --lease/3, so a long task
    keeps its claim and a worker that dies loses it within one lease.
  - The result goes back with CompleteClaim. When the scheduler is away (a
    restart), the completion is retried until it is taken or --retry_for
    passes: a claim is durable, so it is still this worker's afterwards.
    ABORTED means the claim ended meanwhile (expired, cancelled): the result
    is dropped.
  - SIGINT / SIGTERM: no new claims; running tasks are stopped and their
    claims abandoned (back on the board at once, not counted); exit 0.

  /usr/bin/python3 clients/python/pull_worker.py --addr=127.0.0.1:7070 \\
      --queue=images --owner=py-worker-1 --labels=gpu=1

--max_tasks=N exits after N tasks were completed (for tests and batch use).
Needs the stubs from clients/python/generate.sh (see README.md here).
"""
import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import taskgrid_stubs

taskgrid_stubs.load()

import grpc  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402
from taskgrid.v1 import board_service_pb2 as bpb  # noqa: E402
from taskgrid.v1 import board_service_pb2_grpc as bgrpc  # noqa: E402
from taskgrid.v1 import task_pb2  # noqa: E402

CALL_TIMEOUT = 10.0        # each unary call
WAIT_FOR_WORK = 5.0        # each long poll
MAX_TAIL = 64 << 10        # bytes of stdout / stderr kept, the last ones

log = logging.getLogger("pull_worker")


def duration(seconds):
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def tail(data):
    """(the last MAX_TAIL bytes, how many came before them)."""
    if len(data) <= MAX_TAIL:
        return data, 0
    return data[-MAX_TAIL:], len(data) - MAX_TAIL


class Run:
    """One claimed task: its steps, run in order, stoppable from another thread."""

    def __init__(self, assignment):
        self.assignment = assignment
        self.stopped = threading.Event()
        self.proc = None
        self.lock = threading.Lock()

    def stop(self):
        self.stopped.set()
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()

    def run(self):
        """Runs the steps; returns a TaskResult."""
        a = self.assignment
        out, err = b"", b""
        result = task_pb2.TaskResult(outcome=task_pb2.OUTCOME_SUCCEEDED, exit_code=0)
        for index, step in enumerate(a.steps):
            result.step = index
            stdin = a.payload if index == 0 else b""
            kind = step.WhichOneof("kind")
            timeout = step.timeout.seconds + step.timeout.nanos / 1e9 or None
            if kind == "exec":
                code, o, e, why = self.run_exec(step.exec, stdin, timeout)
            elif kind == "builtin":
                code, o, e, why = self.run_builtin(step.builtin, stdin, timeout)
            else:
                raise ValueError(f"step {index} is {kind}, which this worker does not run")
            out += o
            err += e
            if self.stopped.is_set():
                result.outcome, result.exit_code, why = task_pb2.OUTCOME_CANCELLED, -1, "stopped"
            elif why == "timeout":
                result.outcome, result.exit_code = task_pb2.OUTCOME_TIMED_OUT, -1
                why = f"step {index} ran past its timeout"
            elif code != 0:
                result.outcome, result.exit_code = task_pb2.OUTCOME_FAILED, code
            if result.outcome != task_pb2.OUTCOME_SUCCEEDED:
                result.error = why or f"step {index} exited {code}"
                break
        result.stdout_tail, result.stdout_cut_bytes = tail(out)
        result.stderr_tail, result.stderr_cut_bytes = tail(err)
        return result

    def run_exec(self, step, stdin, timeout):
        env = dict(os.environ, **dict(step.env))
        env.update(TASKGRID_TASK_ID=self.assignment.task_id,
                   TASKGRID_ATTEMPT=str(self.assignment.attempt),
                   TASKGRID_QUEUE=self.assignment.queue)
        with self.lock:
            if self.stopped.is_set():
                return -1, b"", b"", "stopped"
            try:
                self.proc = subprocess.Popen(list(step.argv), cwd=step.cwd or None, env=env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
            except OSError as e:
                return -1, b"", b"", f"cannot start {step.argv[0] if step.argv else '?'}: {e}"
        try:
            o, e = self.proc.communicate(stdin, timeout=timeout)
            return self.proc.returncode, o, e, ""
        except subprocess.TimeoutExpired:
            self.proc.kill()
            o, e = self.proc.communicate()
            return -1, o, e, "timeout"

    def run_builtin(self, b, stdin, timeout):
        args = list(b.args)
        if b.name == "noop":
            return 0, b"", b"", ""
        if b.name == "echo":
            return 0, ((" ".join(args) + "\n").encode() if args else stdin), b"", ""
        if b.name == "fail":
            code = int(args[0]) if args else 1
            return code, b"", b"", f"fail {code}"
        if b.name == "sleep":
            seconds = float(args[0]) if args else 0.0
            if timeout is not None and seconds > timeout:
                self.stopped.wait(timeout)
                return -1, b"", b"", "timeout"
            self.stopped.wait(seconds)
            return 0, b"", b"", ""
        return -1, b"", b"", f"unknown builtin {b.name}"


class Worker:
    def __init__(self, args):
        self.args = args
        self.channel = grpc.insecure_channel(args.addr)
        self.board = bgrpc.BoardServiceStub(self.channel)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.running = {}       # task id -> (Run, ClaimRef)
        self.completed = 0
        self.labels = dict(kv.split("=", 1) for kv in args.labels.split(",") if kv)

    def ref(self, a):
        return bpb.ClaimRef(task_id=a.task_id, attempt=a.attempt, owner=self.args.owner)

    def call(self, method, request, retry_for=0.0):
        """A unary call; UNAVAILABLE is tried again for up to retry_for seconds."""
        deadline = time.monotonic() + retry_for
        while True:
            try:
                return method(request, timeout=CALL_TIMEOUT)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    raise
                log.info("scheduler unavailable (%s); trying again", e.details())
                time.sleep(0.5)

    def keep_claims(self):
        """Extends every held claim each lease/3."""
        while not self.stopping.wait(self.args.lease / 3):
            with self.lock:
                held = list(self.running.values())
            for run, ref in held:
                try:
                    self.board.ExtendClaim(bpb.ExtendClaimRequest(claim=ref,
                                                                  lease=duration(self.args.lease)),
                                           timeout=CALL_TIMEOUT)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.ABORTED:
                        log.warning("lost the claim on %s: %s", ref.task_id, e.details())
                        run.stop()

    def work(self, claim):
        a = claim.assignment
        ref = self.ref(a)
        run = Run(a)
        with self.lock:
            self.running[a.task_id] = (run, ref)
        try:
            try:
                result = run.run()
            except ValueError as e:
                self.call(self.board.TrashClaim, bpb.TrashClaimRequest(claim=ref, reason=str(e)),
                          retry_for=self.args.retry_for)
                log.info("%s attempt %d trashed: %s", a.task_id, a.attempt, e)
                return
            if self.stopping.is_set():
                self.call(self.board.AbandonClaim,
                          bpb.AbandonClaimRequest(claim=ref, reason="worker stopping"))
                log.info("%s attempt %d abandoned", a.task_id, a.attempt)
                return
            resp = self.call(self.board.CompleteClaim,
                             bpb.CompleteClaimRequest(claim=ref, result=result),
                             retry_for=self.args.retry_for)
            log.info("%s attempt %d completed: %s", a.task_id, a.attempt,
                     task_pb2.TaskState.Name(resp.task.state))
            with self.lock:
                self.completed += 1
        except grpc.RpcError as e:
            log.warning("%s attempt %d: %s: %s", a.task_id, a.attempt, e.code().name, e.details())
        finally:
            with self.lock:
                del self.running[a.task_id]

    def loop(self):
        threading.Thread(target=self.keep_claims, daemon=True).start()
        threads = []
        while not self.stopping.is_set():
            with self.lock:
                if self.args.max_tasks and self.completed >= self.args.max_tasks:
                    break
                room = self.args.max - len(self.running)
            if room <= 0:
                time.sleep(0.05)
                continue
            try:
                resp = self.call(self.board.Claim, bpb.ClaimRequest(
                    queue=self.args.queue, owner=self.args.owner, max=room,
                    lease=duration(self.args.lease), labels=self.labels),
                    retry_for=self.args.retry_for)
            except grpc.RpcError as e:
                log.error("claim: %s: %s", e.code().name, e.details())
                return 1
            for claim in resp.claims:
                log.info("claimed %s attempt %d", claim.assignment.task_id,
                         claim.assignment.attempt)
                t = threading.Thread(target=self.work, args=(claim,))
                t.start()
                threads.append(t)
            if not resp.claims:
                try:
                    self.board.WaitForWork(bpb.WaitForWorkRequest(
                        queue=self.args.queue, labels=self.labels,
                        timeout=duration(WAIT_FOR_WORK)), timeout=WAIT_FOR_WORK + CALL_TIMEOUT)
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        log.error("wait for work: %s: %s", e.code().name, e.details())
                        return 1
                    time.sleep(0.5)
        self.stopping.set()
        with self.lock:
            for run, _ in self.running.values():
                run.stop()
        for t in threads:
            t.join()
        return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default=os.environ.get("TASKGRID_ADDR", "127.0.0.1:7070"))
    p.add_argument("--queue", default="default")
    p.add_argument("--owner", default=f"py-{os.uname().nodename}-{os.getpid()}",
                   help="this worker's name, shown as the tasks' holder")
    p.add_argument("--labels", default="", help="k=v,...: the labels this worker carries")
    p.add_argument("--max", type=int, default=2, help="tasks run at once")
    p.add_argument("--lease", type=float, default=30.0, help="seconds each claim holds")
    p.add_argument("--retry_for", type=float, default=60.0,
                   help="seconds to keep trying an unreachable scheduler")
    p.add_argument("--max_tasks", type=int, default=0, help="exit after this many (0: never)")
    args = p.parse_args()
    if args.max < 1 or args.lease <= 0:
        p.error("--max must be >= 1 and --lease > 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker = Worker(args)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: worker.stopping.set())
    sys.exit(worker.loop())


if __name__ == "__main__":
    main()
