#!/usr/bin/python3
"""A minimal Taskgrid agent in Python: it runs only `echo` builtin steps.

It speaks AgentService.Connect (proto/taskgrid/v1/agent_service.proto):

  - Hello (id, slots, labels, and the attempts whose result is not yet
    acknowledged after a reconnect), then waits for Welcome;
  - a Heartbeat every Welcome.heartbeat_interval, from a thread that feeds the
    stream's request queue;
  - every Assignment is answered with Accept when all its steps are `echo`
    builtins, else with Reject ("this agent runs only echo");
  - an accepted task runs at once: stdout is the args joined by spaces plus
    "\\n" (or, for an echo without args, the payload on the first step), and a
    Result (SUCCEEDED, exit 0, stdout_tail) is sent and kept until its
    ResultAck: resent every few seconds and after every reconnect;
  - without any message from the scheduler for Welcome.stop_on_lost_after,
    or without a Welcome within 10 s, the stream is dropped and opened again
    (backoff 0.1 s to 1 s, with jitter).
  - SIGINT / SIGTERM: it sends Draining, waits (at most 5 s) for the results
    it holds to be acknowledged, closes the stream and exits 0.

  /usr/bin/python3 clients/python/agent.py --addr=127.0.0.1:7070 --id=py-agent --slots=2

Needs the stubs from clients/python/generate.sh (see README.md here).
"""
import argparse
import logging
import os
import queue
import random
import signal
import socket
import sys
import threading
import time

import taskgrid_stubs

taskgrid_stubs.load()

import grpc  # noqa: E402
from taskgrid.v1 import agent_service_pb2 as apb  # noqa: E402
from taskgrid.v1 import agent_service_pb2_grpc as agrpc  # noqa: E402
from taskgrid.v1 import task_pb2  # noqa: E402

VERSION = "taskgrid-python-agent/1"
WELCOME_TIMEOUT = 10.0      # Hello sent -> Welcome received
RESEND_AFTER = 3.0          # an unacknowledged result is sent again after this
STOP_WAIT = 5.0             # on SIGINT/SIGTERM: longest wait for ResultAcks
DEFAULT_HEARTBEAT = 1.0
DEFAULT_LOST_AFTER = 4.0
ONLY_ECHO = "this agent runs only echo"

log = logging.getLogger("agent")


def seconds(duration, default):
    value = duration.seconds + duration.nanos / 1e9
    return value if value > 0 else default


def run_echo(assignment):
    """The stdout of the assignment's steps, or None when a step is not echo."""
    if not assignment.steps:
        return None
    out = b""
    for index, step in enumerate(assignment.steps):
        if step.WhichOneof("kind") != "builtin" or step.builtin.name != "echo":
            return None
        if step.builtin.args:
            out += (" ".join(step.builtin.args) + "\n").encode()
        elif index == 0:
            out += assignment.payload
    return out


class Session:
    """One Connect stream: a request queue, a reader thread, a heartbeat thread."""

    def __init__(self, agent, channel):
        self.agent = agent
        self.out = queue.Queue()
        self.done = threading.Event()        # the stream ended (either side)
        self.welcomed = threading.Event()
        self.heartbeat_interval = DEFAULT_HEARTBEAT
        self.lost_after = DEFAULT_LOST_AFTER
        self.max_output_bytes = 0
        self.last_heard = time.monotonic()
        self.status = None                   # (grpc.StatusCode, details) once ended
        self.out.put(apb.AgentMessage(hello=agent.hello()))
        # Long-lived on purpose: no deadline; liveness is the watchdog in Agent.run().
        self.call = agrpc.AgentServiceStub(channel).Connect(self._requests())
        self._reader = threading.Thread(target=self._read, name="reader", daemon=True)
        self._beater = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._reader.start()

    def send(self, msg):
        if not self.done.is_set():
            self.out.put(msg)

    def _requests(self):
        while True:
            msg = self.out.get()
            if msg is None:      # half-close
                return
            yield msg

    def half_close(self):
        self.out.put(None)

    def cancel(self):
        self.call.cancel()

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        self._reader.join(timeout)
        if self._beater.is_alive():   # False too when it never started
            self._beater.join(max(0.0, deadline - time.monotonic()))

    def _read(self):
        try:
            for msg in self.call:
                self.last_heard = time.monotonic()
                self._handle(msg)
            self.status = (self.call.code(), self.call.details())
        except grpc.RpcError as e:
            self.status = (e.code(), e.details())
        finally:
            self.done.set()
            self.out.put(None)   # ends _requests, so gRPC's sending thread ends too

    def _beat(self):
        while not self.done.wait(self.heartbeat_interval):
            # Echo tasks finish at once: nothing is ever running between beats.
            self.send(apb.AgentMessage(heartbeat=apb.Heartbeat()))
            self.agent.resend_results(self, only_due=True)

    def _handle(self, msg):
        kind = msg.WhichOneof("msg")
        if kind == "welcome":
            w = msg.welcome
            self.heartbeat_interval = seconds(w.heartbeat_interval, DEFAULT_HEARTBEAT)
            self.lost_after = seconds(w.stop_on_lost_after, DEFAULT_LOST_AFTER)
            self.max_output_bytes = w.max_output_bytes
            log.info("welcome: session %s, heartbeat every %.1fs", w.session_id,
                     self.heartbeat_interval)
            self.welcomed.set()
            self._beater.start()
            self.agent.resend_results(self, only_due=False)
        elif kind == "assign":
            for a in msg.assign.tasks:
                self.agent.run_assignment(self, a)
        elif kind == "cancel":
            log.info("cancel %s attempt %d: nothing runs (echo finishes at once)",
                     msg.cancel.task_id, msg.cancel.attempt)
        elif kind == "result_ack":
            self.agent.acknowledged(msg.result_ack)
        elif kind == "drain":
            log.info("the scheduler drains this agent: no more work")
            self.agent.draining = True
        # heartbeat_ack: contact, noted in last_heard.


class Agent:
    def __init__(self, addr, agent_id, slots, labels, make_channel=None):
        """make_channel: returns a new channel to the scheduler (default:
        plaintext to addr; taskgrid_stubs.channel for TLS and tokens)."""
        self.addr = addr
        self.make_channel = make_channel or (lambda: grpc.insecure_channel(
            addr, options=taskgrid_stubs.CHANNEL_OPTIONS))
        self.id = agent_id
        self.slots = slots
        self.labels = labels
        self.stopping = threading.Event()
        self.draining = False
        self._lock = threading.Lock()
        self._results = {}   # (task_id, attempt) -> [AgentMessage(result), last sent (monotonic)]

    def hello(self):
        h = apb.Hello(agent_id=self.id, slots=self.slots, version=VERSION,
                      draining=self.draining)
        h.labels.update(self.labels)
        with self._lock:
            for task_id, attempt in self._results:
                h.running.add(task_id=task_id, attempt=attempt)
        return h

    def run_assignment(self, session, a):
        if self.draining or self.stopping.is_set():
            session.send(apb.AgentMessage(reject=apb.Reject(
                task_id=a.task_id, attempt=a.attempt, reason="the agent is draining")))
            log.info("rejected %s attempt %d: draining", a.task_id, a.attempt)
            return
        stdout = run_echo(a)
        if stdout is None:
            session.send(apb.AgentMessage(reject=apb.Reject(
                task_id=a.task_id, attempt=a.attempt, reason=ONLY_ECHO)))
            log.info("rejected %s attempt %d: %s", a.task_id, a.attempt, ONLY_ECHO)
            return
        session.send(apb.AgentMessage(accept=apb.Accept(task_id=a.task_id, attempt=a.attempt)))
        if session.max_output_bytes > 0:
            stdout = stdout[-session.max_output_bytes:]
        result = apb.AgentMessage(result=apb.Result(
            task_id=a.task_id, attempt=a.attempt,
            result=task_pb2.TaskResult(outcome=task_pb2.OUTCOME_SUCCEEDED, exit_code=0,
                                       step=len(a.steps) - 1, stdout_tail=stdout)))
        with self._lock:
            self._results[(a.task_id, a.attempt)] = [result, time.monotonic()]
        session.send(result)
        log.info("ran %s attempt %d: stdout %r", a.task_id, a.attempt, stdout)

    def resend_results(self, session, only_due):
        now = time.monotonic()
        with self._lock:
            due = [entry for entry in self._results.values()
                   if not only_due or now - entry[1] >= RESEND_AFTER]
            for entry in due:
                entry[1] = now
        for msg, _ in due:
            log.info("resending the result of %s attempt %d", msg.result.task_id,
                     msg.result.attempt)
            session.send(msg)

    def acknowledged(self, ack):
        with self._lock:
            held = self._results.pop((ack.task_id, ack.attempt), None)
        if held is not None:
            log.info("result of %s attempt %d acknowledged%s", ack.task_id, ack.attempt,
                     "" if ack.accepted else " as stale (not committed)")

    def holding(self):
        with self._lock:
            return len(self._results)

    def run(self):
        """Connects until stopped; returns the exit code."""
        backoff = 0.1
        while not self.stopping.is_set():
            channel = self.make_channel()
            log.info("connecting to %s as %s (%d slots)", self.addr, self.id, self.slots)
            session = Session(self, channel)
            opened = time.monotonic()
            while not session.done.is_set() and not self.stopping.wait(0.1):
                now = time.monotonic()
                if not session.welcomed.is_set():
                    if now - opened > WELCOME_TIMEOUT:
                        log.warning("no Welcome within %.0fs: reconnecting", WELCOME_TIMEOUT)
                        break
                elif now - session.last_heard > session.lost_after:
                    log.warning("nothing from the scheduler for %.1fs: reconnecting",
                                session.lost_after)
                    break
            if self.stopping.is_set():
                self._stop(session)
                channel.close()
                return 0
            session.cancel()
            session.join(5.0)
            channel.close()
            code, details = session.status or (None, "")
            if session.welcomed.is_set():
                backoff = 0.1
            elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                          grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                log.error("the scheduler refused this agent: %s: %s", code.name, details)
                return 1
            if code is not None:
                log.info("stream ended: %s %s", code.name, details)
            self.stopping.wait(random.uniform(0, backoff))
            backoff = min(1.0, backoff * 2)
        return 0

    def _stop(self, session):
        log.info("stopping")
        self.draining = True
        if session.welcomed.is_set() and not session.done.is_set():
            session.send(apb.AgentMessage(draining=apb.Draining()))
            deadline = time.monotonic() + STOP_WAIT
            while self.holding() and not session.done.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.holding():
                log.warning("%d result(s) not acknowledged", self.holding())
            session.half_close()
            session.done.wait(2.0)
        session.cancel()
        session.join(5.0)
        log.info("stopped")


def parse_labels(text):
    labels = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"label {item!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def main():
    parser = argparse.ArgumentParser(description="A Taskgrid agent that runs only echo steps.")
    parser.add_argument("--addr", default=taskgrid_stubs.default_addr(),
                        help="scheduler HOST:PORT (default: $TASKGRID_ADDR or 127.0.0.1:7070)")
    parser.add_argument("--id", default=f"{socket.gethostname()}-py-{os.getpid()}",
                        help="agent id (default: HOSTNAME-py-PID)")
    parser.add_argument("--slots", type=int, default=2, help="tasks at once (default 2)")
    parser.add_argument("--labels", type=parse_labels, default={}, help="KEY=VALUE,...")
    taskgrid_stubs.add_tls_arguments(parser)
    args = parser.parse_args()
    if args.slots < 1:
        parser.error("--slots must be at least 1")

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.id}: %(message)s")
    agent = Agent(args.addr, args.id, args.slots, args.labels,
                  make_channel=lambda: taskgrid_stubs.channel(args))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stopping.set())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
