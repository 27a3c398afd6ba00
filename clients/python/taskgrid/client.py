"""taskgrid.Client: the scheduler's gRPC API (TaskService, JobService,
ScheduleService, BoardService, ClusterService) from Python.

Messages are the generated ones (taskgrid.v1.task_pb2, ...); where a call
takes a message it also takes a dict in the proto3 JSON form, so

    client.submit({"id": "hello", "steps": [{"exec": {"argv": ["echo", "hi"]}}]})

works as well as a task_pb2.TaskSpec.

Errors are TaskgridError, with the gRPC status code and the scheduler's
message. Given several addresses (a leader and its standbys), a call goes
to whichever leads: a standby's answer names the leader, and an address
that cannot be reached is left for the next one, for up to `failover_for`
seconds. A call is sent again only when it cannot have run twice: it
never reached the scheduler, a standby answered it (standbys run nothing),
or it reads, or it is a submit whose every task has an id and no merge key.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message

from taskgrid.v1 import board_service_pb2 as board_pb2
from taskgrid.v1 import board_service_pb2_grpc as board_grpc
from taskgrid.v1 import cluster_service_pb2 as cluster_pb2
from taskgrid.v1 import cluster_service_pb2_grpc as cluster_grpc
from taskgrid.v1 import job_service_pb2 as job_pb2
from taskgrid.v1 import job_service_pb2_grpc as job_grpc
from taskgrid.v1 import schedule_service_pb2 as schedule_pb2
from taskgrid.v1 import schedule_service_pb2_grpc as schedule_grpc
from taskgrid.v1 import task_pb2
from taskgrid.v1 import task_service_pb2 as task_service_pb2
from taskgrid.v1 import task_service_pb2_grpc as task_grpc

LEADER_KEY = "taskgrid-leader"
STANDBY_KEY = "taskgrid-standby"
WATCH_STARTS_AFTER_KEY = "taskgrid-watch-starts-after"
RESUME_AFTER_KEY = "taskgrid-resume-after"

SpecLike = Union[task_pb2.TaskSpec, Mapping[str, Any]]


class TaskgridError(Exception):
    """A call the scheduler refused or could not answer: `code` is the gRPC
    status code (grpc.StatusCode), `message` what the scheduler said."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = ""):
        super().__init__(f"{code.name}: {message}" + (f" ({method})" if method else ""))
        self.code = code
        self.message = message
        self.method = method


def state_name(state: int) -> str:
    """"SUCCEEDED" for task_pb2.TASK_STATE_SUCCEEDED, and so on."""
    return task_pb2.TaskState.Name(state).replace("TASK_STATE_", "")


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _message(cls, value):
    """`value` as a message of `cls`: the message itself, or a dict in the
    proto3 JSON form."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Message):
        raise TypeError(f"expected {cls.DESCRIPTOR.full_name}, got {type(value).__name__}")
    return json_format.ParseDict(dict(value), cls())


def _metadata(err: grpc.RpcError, key: str) -> str:
    for k, v in (err.trailing_metadata() or ()):
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


class Client:
    """A connection to a Taskgrid scheduler (or a leader and its standbys).

    addresses: "HOST:PORT", "A,B,C", or a list of them.
    tls_ca: PEM file of the CA that signed the scheduler's certificate
        (TLS); tls_cert and tls_key: a client certificate (mTLS).
    token or token_file: a bearer token (needs TLS, as on the scheduler).
    timeout: seconds each call may take.
    failover_for: seconds a call keeps looking for a leader that answers.
    """

    def __init__(self, addresses: Union[str, Sequence[str]] = "127.0.0.1:7070", *,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, timeout: float = 30.0,
                 failover_for: float = 30.0):
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",")]
        self.addresses: List[str] = [a for a in addresses if a]
        if not self.addresses:
            raise ValueError("no scheduler address")
        if token_file:
            with open(token_file) as f:
                token = f.read().strip()
        if token and not tls_ca:
            raise ValueError("a token needs TLS (tls_ca): it must not cross the network in the clear")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_cert and tls_key go together")
        self._creds = None
        if tls_ca:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            self._creds = grpc.ssl_channel_credentials(
                read(tls_ca), read(tls_key) if tls_key else None,
                read(tls_cert) if tls_cert else None)
            if token:
                self._creds = grpc.composite_channel_credentials(
                    self._creds, grpc.access_token_call_credentials(token))
        self.timeout = timeout
        self.failover_for = failover_for
        self._current = 0
        self._channel: Optional[grpc.Channel] = None
        self._connect()

    # --- connection ---

    @property
    def address(self) -> str:
        """The address calls go to now."""
        return self.addresses[self._current]

    def _connect(self) -> None:
        if self._channel is not None:
            self._channel.close()
        target = self.address
        if self._creds is None:
            self._channel = grpc.insecure_channel(target)
        else:
            self._channel = grpc.secure_channel(target, self._creds)
        ch = self._channel
        self._stubs = {
            "TaskService": task_grpc.TaskServiceStub(ch),
            "JobService": job_grpc.JobServiceStub(ch),
            "ScheduleService": schedule_grpc.ScheduleServiceStub(ch),
            "BoardService": board_grpc.BoardServiceStub(ch),
            "ClusterService": cluster_grpc.ClusterServiceStub(ch),
        }

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _follow(self, err: grpc.RpcError) -> None:
        """Moves to the leader the answer named, else to the next address
        (the same one when there is one), on a new channel."""
        leader = _metadata(err, LEADER_KEY)
        if leader and leader in self.addresses:
            self._current = self.addresses.index(leader)
        elif leader:
            self.addresses.append(leader)
            self._current = len(self.addresses) - 1
        else:
            self._current = (self._current + 1) % len(self.addresses)
        self._connect()

    def call(self, service: str, method: str, request: Message, *, repeatable: bool = False,
             timeout: Optional[float] = None) -> Message:
        """One unary call, following the leader. `repeatable`: the call may
        run twice without harm, so it is sent again after a lost answer."""
        deadline = time.monotonic() + self.failover_for
        pause = 0.1
        while True:
            fn = getattr(self._stubs[service], method)
            try:
                return fn(request, timeout=timeout or self.timeout)
            except grpc.RpcError as err:
                code = err.code()
                if code != grpc.StatusCode.UNAVAILABLE:
                    raise TaskgridError(code, err.details() or "", f"{service}/{method}") from None
                never_ran = bool(_metadata(err, STANDBY_KEY)) or _not_sent(err)
                if not (never_ran or repeatable) or time.monotonic() >= deadline:
                    raise TaskgridError(code, err.details() or "", f"{service}/{method}") from None
                # A new channel: the old one may wait out a reconnect backoff.
                self._follow(err)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _reopen_after(self, err: grpc.RpcError, method: str, deadline: Optional[float],
                      reopen: bool) -> float:
        """A TaskService stream broke with `err`: raises TaskgridError when it
        may not be opened again (`reopen` false, or `deadline`, failover_for
        after the outage began, has passed); else follows the leader if need
        be, waits a little and returns the deadline, for the caller to open
        the stream again."""
        now = time.monotonic()
        deadline = deadline or now + self.failover_for
        if not reopen or now >= deadline:
            raise TaskgridError(err.code(), err.details() or "", f"TaskService/{method}") from None
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            self._follow(err)
        time.sleep(0.2)
        return deadline

    # --- tasks ---

    def submit(self, spec: SpecLike) -> task_pb2.Task:
        """Submits one task; returns it as stored. Idempotent by id: the same
        spec under the same id again returns the task submitted first."""
        return self.submit_many([spec])[0]

    def submit_many(self, specs: Iterable[SpecLike]) -> List[task_pb2.Task]:
        """Submits tasks in one call (all or none)."""
        req = task_service_pb2.SubmitTasksRequest(
            tasks=[_message(task_pb2.TaskSpec, s) for s in specs])
        repeatable = all(t.id and not t.merge_key for t in req.tasks)
        return list(self.call("TaskService", "SubmitTasks", req, repeatable=repeatable).tasks)

    def get(self, task_id: str) -> task_pb2.Task:
        return self.call("TaskService", "GetTask", task_service_pb2.GetTaskRequest(id=task_id),
                         repeatable=True)

    def wait(self, task_id: str, timeout: Optional[float] = None) -> task_pb2.Task:
        """The task once it has ended (SUCCEEDED, FAILED, CANCELLED); raises
        TimeoutError when it has not within `timeout` seconds (None: waits
        as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 300.0 if deadline is None else max(0.0, deadline - time.monotonic())
            poll = min(left, 30.0)
            resp = self.call("TaskService", "WaitTask",
                             task_service_pb2.WaitTaskRequest(id=task_id, timeout=duration(poll)),
                             repeatable=True, timeout=poll + 10.0)
            if resp.done:
                return resp.task
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} is {state_name(resp.task.state)} after "
                                   f"{timeout} s")

    def list(self, queue: str = "", states: Sequence[Union[str, int]] = (), job_id: str = "",
             page_size: int = 500, *, id_prefix: str = "", newest_first: bool = False,
             labels: Optional[Dict[str, str]] = None) -> Iterator[task_pb2.Task]:
        """Every task matching, page by page, in submit order or newest first.
        `states` by name ("FAILED") or value; `id_prefix`: only ids starting
        with it; `labels`: only tasks carrying every one (TaskSpec.labels)."""
        token = ""
        while True:
            resp = self.call("TaskService", "ListTasks", task_service_pb2.ListTasksRequest(
                queue=queue, states=_task_states(states), job_id=job_id, id_prefix=id_prefix,
                labels=labels or {}, newest_first=newest_first, page_size=page_size,
                page_token=token),
                repeatable=True)
            yield from resp.tasks
            token = resp.next_page_token
            if not token:
                return

    def cancel(self, task_id: str) -> task_pb2.Task:
        return self.call("TaskService", "CancelTask",
                         task_service_pb2.CancelTaskRequest(id=task_id), repeatable=True)

    def retry(self, task_id: str) -> task_pb2.Task:
        return self.call("TaskService", "RetryTask",
                         task_service_pb2.RetryTaskRequest(id=task_id))

    def delete(self, task_id: str) -> None:
        self.call("TaskService", "DeleteTask", task_service_pb2.DeleteTaskRequest(id=task_id),
                  repeatable=True)

    def watch(self, task_ids: Sequence[str] = (), queue: str = "", job_id: str = "",
              after_revision: Optional[int] = None) -> Iterator[task_service_pb2.TaskEvent]:
        """The state changes of the tasks named (or of a queue, a job, or all),
        from `after_revision` on (None: from now), for as long as the caller
        reads. A stream that breaks (a restart, a failover, a watcher too
        slow) is opened again after the last revision seen, so no change is
        missed or repeated; it gives up after failover_for seconds without
        a stream."""
        after = after_revision
        deadline = None
        while True:
            req = task_service_pb2.WatchTasksRequest(queue=queue, task_ids=list(task_ids),
                                                      job_id=job_id)
            if after is not None:
                req.after_revision = after
            stream = self._stubs["TaskService"].WatchTasks(req)
            try:
                if after is None:
                    for k, v in stream.initial_metadata() or ():
                        if k == WATCH_STARTS_AFTER_KEY:
                            after = int(v)
                for event in stream:
                    deadline = None
                    after = event.revision
                    yield event
                return
            except grpc.RpcError as err:
                resume = _metadata(err, RESUME_AFTER_KEY)
                if resume:
                    after = int(resume)
                deadline = self._reopen_after(err, "WatchTasks", deadline,
                                              err.code() in _STREAM_BROKEN or bool(resume))
            finally:
                stream.cancel()

    def pause(self, task_id: str) -> task_pb2.Task:
        """Keeps the task from running until resume(): a waiting one is
        PAUSED at once; a running one once its agent has stopped the attempt
        (pause_requested until then; that attempt does not count against
        max_attempts)."""
        return self.call("TaskService", "PauseTask",
                         task_service_pb2.PauseTaskRequest(id=task_id), repeatable=True)

    def resume(self, task_id: str) -> task_pb2.Task:
        """A PAUSED task back to PENDING (SCHEDULED while its not_before is
        ahead)."""
        return self.call("TaskService", "ResumeTask",
                         task_service_pb2.ResumeTaskRequest(id=task_id), repeatable=True)

    def reset(self, task_id: str) -> task_pb2.Task:
        """A finished task back to PENDING as if new: its attempt budget and
        history start over (attempt numbers go on)."""
        return self.call("TaskService", "ResetTask", task_service_pb2.ResetTaskRequest(id=task_id))

    def output(self, task_id: str, *, follow: bool = False, stream: Union[str, int] = ""
               ) -> Iterator[task_service_pb2.StreamTaskOutputResponse]:
        """The task's output (a generator of StreamTaskOutputResponse):
        KIND_OUTPUT messages carry `data`, bytes [offset, offset + len) of
        what `attempt` wrote on `stream`; KIND_ATTEMPT_STARTED and
        KIND_ATTEMPT_ENDED say whose output follows and how it ended;
        KIND_END comes last, with the task's `state`. Without `follow`: what
        there is now (a finished task's stored tails, a running attempt's
        newest output). With `follow`: until the task is finished, across
        attempts; a stream that breaks (a restart, a failover) is opened
        again, and what was yielded before is not yielded twice; it gives up
        after failover_for seconds without a stream. `stream`: "stdout" or
        "stderr" only."""
        which = stream if isinstance(stream, int) else (
            task_pb2.OutputStream.Value("OUTPUT_STREAM_" + stream.upper()) if stream else 0)
        req = task_service_pb2.StreamTaskOutputRequest(id=task_id, follow=follow, stream=which)
        kind = task_service_pb2.StreamTaskOutputResponse
        sent: Dict[tuple, int] = {}  # (attempt, stream) -> end of what was yielded
        started, ended = set(), set()
        deadline = None
        while True:
            call = self._stubs["TaskService"].StreamTaskOutput(
                req, timeout=None if follow else self.timeout)
            try:
                for r in call:
                    deadline = None
                    if r.kind == kind.KIND_OUTPUT:
                        key = (r.attempt, r.stream)
                        done = sent.get(key, 0)
                        end = r.offset + len(r.data)
                        if end <= done:
                            continue  # sent again after a reconnect
                        if r.offset < done:
                            r.data = r.data[done - r.offset:]
                            r.offset = done
                        sent[key] = end
                    elif r.kind == kind.KIND_ATTEMPT_STARTED:
                        if r.attempt in started:
                            continue
                        started.add(r.attempt)
                    elif r.kind == kind.KIND_ATTEMPT_ENDED:
                        if r.attempt in ended:
                            continue
                        ended.add(r.attempt)
                    yield r
                    if r.kind == kind.KIND_END:
                        return
                return
            except grpc.RpcError as err:
                deadline = self._reopen_after(err, "StreamTaskOutput", deadline,
                                              follow and err.code() in _STREAM_BROKEN)
            finally:
                call.cancel()

    def cancel_tasks(self, *, queue: str = "", job_id: str = "",
                     states: Sequence[Union[str, int]] = ()
                     ) -> task_service_pb2.BulkTasksResponse:
        """Cancels every task of `queue` and/or `job_id` (in `states`, if
        given), a page per call until none is left; the answer holds every id
        cancelled, and how many were skipped and the first reason why."""
        return self._bulk("CancelTasks", queue, job_id, states, repeatable=True)

    def retry_tasks(self, *, queue: str = "", job_id: str = "",
                    states: Sequence[Union[str, int]] = ()
                    ) -> task_service_pb2.BulkTasksResponse:
        """Retries the FAILED and CANCELLED tasks selected, as cancel_tasks."""
        return self._bulk("RetryTasks", queue, job_id, states, repeatable=False)

    def delete_tasks(self, *, queue: str = "", job_id: str = "",
                     states: Sequence[Union[str, int]] = ()
                     ) -> task_service_pb2.BulkTasksResponse:
        """Deletes the finished tasks selected, as cancel_tasks."""
        return self._bulk("DeleteTasks", queue, job_id, states, repeatable=True)

    def _bulk(self, method: str, queue: str, job_id: str, states: Sequence[Union[str, int]],
              repeatable: bool) -> task_service_pb2.BulkTasksResponse:
        req = task_service_pb2.BulkTasksRequest(queue=queue, job_id=job_id,
                                                states=_task_states(states))
        total = task_service_pb2.BulkTasksResponse()
        while True:
            resp = self.call("TaskService", method, req, repeatable=repeatable)
            total.ids.extend(resp.ids)
            total.skipped += resp.skipped
            total.skipped_reason = total.skipped_reason or resp.skipped_reason
            if not resp.next_page_token:
                return total
            req.page_token = resp.next_page_token

    # --- queues ---

    def queues(self, queue: str = "", *, with_history: bool = False
               ) -> List[task_service_pb2.QueueStats]:
        """Each queue's counts by state, settings and what holds it back (or
        `queue`'s alone); `with_history`: also what it did minute by minute
        over the last hour (QueueStats.history)."""
        return list(self.call("TaskService", "GetQueueStats",
                              task_service_pb2.GetQueueStatsRequest(
                                  queue=queue, with_history=with_history),
                              repeatable=True).queues)

    def pause_queue(self, queue: str) -> task_service_pb2.QueueStats:
        return self.call("TaskService", "PauseQueue",
                         task_service_pb2.PauseQueueRequest(queue=queue), repeatable=True)

    def resume_queue(self, queue: str) -> task_service_pb2.QueueStats:
        return self.call("TaskService", "ResumeQueue",
                         task_service_pb2.ResumeQueueRequest(queue=queue), repeatable=True)

    def set_queue_limits(self, queue: str, *, max_concurrency: int = 0,
                         rate_per_second: float = 0.0, burst: int = 0,
                         quota: Optional[Dict[str, str]] = None) -> task_service_pb2.QueueStats:
        """Sets every limit as given (0 or None removes it)."""
        return self.call("TaskService", "SetQueueLimits", task_service_pb2.SetQueueLimitsRequest(
            queue=queue, max_concurrency=max_concurrency, rate_per_second=rate_per_second,
            burst=burst, quota=quota or {}), repeatable=True)

    def set_queue_weight(self, queue: str, weight: Optional[int]) -> task_service_pb2.QueueStats:
        """The queue's fair share against other queues; None removes it."""
        req = task_service_pb2.SetQueueWeightRequest(queue=queue)
        if weight is not None:
            req.weight = weight
        return self.call("TaskService", "SetQueueWeight", req, repeatable=True)

    # --- jobs ---

    def submit_job(self, job_id: str, specs: Iterable[SpecLike]) -> job_pb2.Job:
        """Submits tasks that depend on each other (depends_on) as one job."""
        req = job_pb2.SubmitJobRequest(job_id=job_id,
                                       tasks=[_message(task_pb2.TaskSpec, s) for s in specs])
        return self.call("JobService", "SubmitJob", req, repeatable=bool(job_id))

    def get_job(self, job_id: str) -> job_pb2.Job:
        return self.call("JobService", "GetJob", job_pb2.GetJobRequest(id=job_id),
                         repeatable=True)

    def cancel_job(self, job_id: str) -> job_pb2.Job:
        return self.call("JobService", "CancelJob", job_pb2.CancelJobRequest(id=job_id),
                         repeatable=True)

    def list_jobs(self, states: Sequence[Union[str, int]] = (), page_size: int = 100
                  ) -> Iterator[job_pb2.Job]:
        """Every job (in `states`, by name "RUNNING" or value), page by page."""
        enum = _enum_values(job_pb2.JobState, "JOB_STATE_", states)
        token = ""
        while True:
            resp = self.call("JobService", "ListJobs", job_pb2.ListJobsRequest(
                states=enum, page_size=page_size, page_token=token), repeatable=True)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def retry_job(self, job_id: str) -> job_pb2.Job:
        """Runs a finished job's FAILED and CANCELLED tasks again, and what
        they hold up."""
        return self.call("JobService", "RetryJob", job_pb2.RetryJobRequest(id=job_id))

    def delete_job(self, job_id: str) -> job_pb2.DeleteJobResponse:
        """Deletes a finished job and its tasks for good."""
        return self.call("JobService", "DeleteJob", job_pb2.DeleteJobRequest(id=job_id),
                         repeatable=True)

    # --- schedules ---

    def create_schedule(self, schedule: Union[schedule_pb2.Schedule, Mapping[str, Any]]
                        ) -> schedule_pb2.Schedule:
        req = schedule_pb2.CreateScheduleRequest(
            schedule=_message(schedule_pb2.Schedule, schedule))
        return self.call("ScheduleService", "CreateSchedule", req)

    def get_schedule(self, schedule_id: str) -> schedule_pb2.Schedule:
        return self.call("ScheduleService", "GetSchedule",
                         schedule_pb2.GetScheduleRequest(id=schedule_id), repeatable=True)

    def list_schedules(self) -> List[schedule_pb2.Schedule]:
        return list(self.call("ScheduleService", "ListSchedules",
                              schedule_pb2.ListSchedulesRequest(), repeatable=True).schedules)

    def pause_schedule(self, schedule_id: str) -> schedule_pb2.Schedule:
        return self.call("ScheduleService", "PauseSchedule",
                         schedule_pb2.PauseScheduleRequest(id=schedule_id), repeatable=True)

    def resume_schedule(self, schedule_id: str) -> schedule_pb2.Schedule:
        return self.call("ScheduleService", "ResumeSchedule",
                         schedule_pb2.ResumeScheduleRequest(id=schedule_id), repeatable=True)

    def delete_schedule(self, schedule_id: str) -> schedule_pb2.Schedule:
        return self.call("ScheduleService", "DeleteSchedule",
                         schedule_pb2.DeleteScheduleRequest(id=schedule_id))

    # --- the board (pull mode) ---

    def claim(self, queue: str, owner: str, *, max: int = 1, lease: float = 30.0,
              labels: Optional[Dict[str, str]] = None,
              task_id: str = "") -> List[board_pb2.ClaimedTask]:
        """Claims up to `max` tasks of `queue` for `lease` seconds; with
        `task_id`, that task alone (`queue` may then be ""), or raises
        TaskgridError saying why it cannot be claimed now (NOT_FOUND,
        FAILED_PRECONDITION)."""
        return list(self.call("BoardService", "Claim", board_pb2.ClaimRequest(
            queue=queue, owner=owner, max=0 if task_id else max, lease=duration(lease),
            labels=labels or {}, task_id=task_id)).claims)

    def wait_for_work(self, queue: str, *, labels: Optional[Dict[str, str]] = None,
                      timeout: float = 5.0) -> int:
        """How many tasks `queue` holds that these labels may claim, once it
        holds some or after `timeout` seconds (then 0)."""
        return self.call("BoardService", "WaitForWork", board_pb2.WaitForWorkRequest(
            queue=queue, labels=labels or {}, timeout=duration(timeout)),
            repeatable=True, timeout=timeout + 10.0).ready

    def extend_claim(self, ref: board_pb2.ClaimRef, lease: float) -> None:
        self.call("BoardService", "ExtendClaim",
                  board_pb2.ExtendClaimRequest(claim=ref, lease=duration(lease)),
                  repeatable=True)

    def complete_claim(self, ref: board_pb2.ClaimRef, result: task_pb2.TaskResult
                       ) -> task_pb2.Task:
        return self.call("BoardService", "CompleteClaim",
                         board_pb2.CompleteClaimRequest(claim=ref, result=result),
                         repeatable=True).task

    def abandon_claim(self, ref: board_pb2.ClaimRef, reason: str = "") -> task_pb2.Task:
        return self.call("BoardService", "AbandonClaim",
                         board_pb2.AbandonClaimRequest(claim=ref, reason=reason),
                         repeatable=True).task

    def trash_claim(self, ref: board_pb2.ClaimRef, reason: str = "") -> task_pb2.Task:
        return self.call("BoardService", "TrashClaim",
                         board_pb2.TrashClaimRequest(claim=ref, reason=reason),
                         repeatable=True).task

    def restore(self, task_id: str) -> task_pb2.Task:
        """A TRASHED task back to PENDING."""
        return self.call("BoardService", "RestoreTask",
                         board_pb2.RestoreTaskRequest(id=task_id)).task

    # --- the cluster ---

    def agents(self) -> List[cluster_pb2.Agent]:
        return list(self.call("ClusterService", "ListAgents", cluster_pb2.ListAgentsRequest(),
                              repeatable=True).agents)

    def drain_agent(self, agent_id: str) -> cluster_pb2.Agent:
        """The agent finishes what it runs and takes nothing new."""
        return self.call("ClusterService", "DrainAgent",
                         cluster_pb2.DrainAgentRequest(id=agent_id), repeatable=True)

    def undrain_agent(self, agent_id: str) -> cluster_pb2.Agent:
        return self.call("ClusterService", "UndrainAgent",
                         cluster_pb2.UndrainAgentRequest(id=agent_id), repeatable=True)

    def cluster_stats(self) -> cluster_pb2.ClusterStats:
        """Agents by state, slots, and tasks by state over every queue."""
        return self.call("ClusterService", "GetClusterStats",
                         cluster_pb2.GetClusterStatsRequest(), repeatable=True)


# How a watch stream ends when the scheduler went away (a restart, a
# failover, a connection cut) or dropped a watcher too slow for it: opened
# again after the last revision seen (reading again is harmless).
_STREAM_BROKEN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                  grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED)


def _enum_values(enum, prefix: str, states: Sequence[Union[str, int]]) -> List[int]:
    """Values of `enum` by name ("FAILED", "<prefix>FAILED") or value."""
    return [s if isinstance(s, int) else enum.Value(
        s if s.startswith(prefix) else prefix + s.upper()) for s in states]


def _task_states(states: Sequence[Union[str, int]]) -> List[int]:
    """Task states by name ("FAILED", "TASK_STATE_FAILED") or value."""
    return _enum_values(task_pb2.TaskState, "TASK_STATE_", states)


def _not_sent(err: grpc.RpcError) -> bool:
    """Whether the call failed before it reached a scheduler (nothing ran)."""
    details = (err.details() or "").lower()
    return "failed to connect" in details or "connection refused" in details
