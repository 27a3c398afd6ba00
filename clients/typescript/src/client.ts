// Client: the Taskgrid scheduler's gRPC API (TaskService, JobService,
// ScheduleService, BoardService, ClusterService) from Node, on
// @grpc/grpc-js, with the .proto files loaded at run time by
// @grpc/proto-loader.
//
// Messages are plain objects with the proto field names (snake_case), as
// the scheduler's JSON and `taskgridctl --json` show them: enums as their
// names ("TASK_STATE_SUCCEEDED"), 64-bit integers as strings, bytes as
// Buffers, durations as {seconds, nanos}.
//
// Errors are TaskgridError, with the gRPC status code and the scheduler's
// message. Given several addresses (a leader and its standbys), a call goes
// to whichever leads: a standby's answer names the leader, and an address
// that cannot be reached is left for the next one, for up to failoverMs.
// A call is sent again only when it cannot have run twice: it never
// reached a scheduler, a standby answered it, it reads, or it is a submit
// whose every task has an id and no merge key.
import * as fs from "fs";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

export const LEADER_KEY = "taskgrid-leader";
export const STANDBY_KEY = "taskgrid-standby";
export const WATCH_STARTS_AFTER_KEY = "taskgrid-watch-starts-after";
export const RESUME_AFTER_KEY = "taskgrid-resume-after";

// A message as proto-loader gives it (proto field names).
export type Message = Record<string, any>;

export interface Duration {
  seconds: string | number;
  nanos: number;
}

export interface TaskResult extends Message {
  outcome: string;
  exit_code: number;
  stdout_tail: Buffer;
  stderr_tail: Buffer;
  error: string;
  output?: Buffer | null;
  permanent: boolean;
}

export interface Task extends Message {
  spec: Message & { id: string; queue: string };
  state: string;
  attempt: number;
  attempts_used: number;
  reason: string;
  result: TaskResult | null;
  attempts: Message[];
}

export interface TaskEvent extends Message {
  revision: string;
  task_id: string;
  from_state: string;
  to_state: string;
}

/** One message of TaskService.StreamTaskOutput. */
export interface OutputMessage extends Message {
  kind: string;
  attempt: number;
  stream: string;
  offset: string;
  data: Buffer;
  agent_id: string;
  outcome: string;
  state: string;
  note: string;
}

/** Which tasks a bulk change selects: a queue, a job, or both. */
export interface BulkFilter {
  queue?: string;
  job_id?: string;
  /** By name ("FAILED" or "TASK_STATE_FAILED"); empty: every state the change applies to. */
  states?: string[];
}

/** What a bulk change did over every page. */
export interface BulkResult {
  ids: string[];
  skipped: number;
  skipped_reason: string;
}

export class TaskgridError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly details: string,
    readonly method = "",
  ) {
    super(`${grpc.status[code]}: ${details}${method ? ` (${method})` : ""}`);
    this.name = "TaskgridError";
  }
}

/** "SUCCEEDED" for "TASK_STATE_SUCCEEDED". */
export function stateName(state: string): string {
  return state.replace(/^TASK_STATE_/, "");
}

/** A Duration message of `seconds`. */
export function duration(seconds: number): Duration {
  const whole = Math.floor(seconds);
  return { seconds: String(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

export interface ClientOptions {
  /** PEM file of the CA that signed the scheduler's certificate (TLS). */
  tlsCa?: string;
  /** A client certificate and its key (mTLS). */
  tlsCert?: string;
  tlsKey?: string;
  /** A bearer token, or a file holding one (needs TLS). */
  token?: string;
  tokenFile?: string;
  /** Each call's deadline (default 30 s). */
  timeoutMs?: number;
  /** How long a call looks for a leader that answers (default 30 s). */
  failoverMs?: number;
}

const SERVICES = ["TaskService", "JobService", "ScheduleService", "BoardService", "ClusterService"];

// How a watch stream ends when the scheduler went away (a restart, a
// failover, a cut connection) or dropped a watcher too slow for it: it is
// opened again after the last revision seen (reading again is harmless).
const STREAM_BROKEN = new Set([
  grpc.status.UNAVAILABLE,
  grpc.status.RESOURCE_EXHAUSTED,
  grpc.status.INTERNAL,
  grpc.status.UNKNOWN,
  grpc.status.CANCELLED,
]);

function protoDir(): string {
  // dist/src/client.js -> ../../proto; src/client.ts (ts-node) -> ../proto
  for (const dir of [path.join(__dirname, "..", "..", "proto"), path.join(__dirname, "..", "proto")]) {
    if (fs.existsSync(path.join(dir, "taskgrid", "v1", "task_service.proto"))) return dir;
  }
  throw new Error("taskgrid: the .proto files are missing (npm run build copies them)");
}

let loaded: any = null;
function services(): any {
  if (loaded === null) {
    const dir = protoDir();
    const files = fs
      .readdirSync(path.join(dir, "taskgrid", "v1"))
      .filter((f) => f.endsWith(".proto"))
      .map((f) => `taskgrid/v1/${f}`);
    const def = protoLoader.loadSync(files, {
      includeDirs: [dir],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    loaded = (grpc.loadPackageDefinition(def) as any).taskgrid.v1;
  }
  return loaded;
}

/** Enum names with their prefix: "FAILED" or "TASK_STATE_FAILED" -> "TASK_STATE_FAILED". */
function enumNames(prefix: string, states: string[] | undefined): string[] {
  return (states ?? []).map((s) => (s.startsWith(prefix) ? s : `${prefix}${s.toUpperCase()}`));
}

const taskStates = (states: string[] | undefined) => enumNames("TASK_STATE_", states);

function metadataValue(md: grpc.Metadata | undefined, key: string): string {
  const v = md?.get(key) ?? [];
  return v.length > 0 ? v[0].toString() : "";
}

function notSent(err: grpc.ServiceError): boolean {
  const d = (err.details || "").toLowerCase();
  return d.includes("failed to connect") || d.includes("connection refused") || d.includes("no connection established");
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Client {
  readonly addresses: string[];
  readonly timeoutMs: number;
  readonly failoverMs: number;
  private current = 0;
  private creds: grpc.ChannelCredentials;
  private stubs: Record<string, any> = {};

  /** `addresses`: "HOST:PORT", "A,B,C", or a list of them. */
  constructor(addresses: string | string[] = "127.0.0.1:7070", opts: ClientOptions = {}) {
    const list = typeof addresses === "string" ? addresses.split(",") : addresses;
    this.addresses = list.map((a) => a.trim()).filter((a) => a.length > 0);
    if (this.addresses.length === 0) throw new Error("no scheduler address");
    let token = opts.token;
    if (opts.tokenFile) token = fs.readFileSync(opts.tokenFile, "utf8").trim();
    if (token && !opts.tlsCa) {
      throw new Error("a token needs TLS (tlsCa): it must not cross the network in the clear");
    }
    if (!!opts.tlsCert !== !!opts.tlsKey) throw new Error("tlsCert and tlsKey go together");
    if (opts.tlsCa) {
      let creds = grpc.credentials.createSsl(
        fs.readFileSync(opts.tlsCa),
        opts.tlsKey ? fs.readFileSync(opts.tlsKey) : null,
        opts.tlsCert ? fs.readFileSync(opts.tlsCert) : null,
      );
      if (token) {
        const bearer = token;
        creds = grpc.credentials.combineChannelCredentials(
          creds,
          grpc.credentials.createFromMetadataGenerator((_, done) => {
            const md = new grpc.Metadata();
            md.set("authorization", `Bearer ${bearer}`);
            done(null, md);
          }),
        );
      }
      this.creds = creds;
    } else {
      this.creds = grpc.credentials.createInsecure();
    }
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.failoverMs = opts.failoverMs ?? 30_000;
    this.connect();
  }

  /** The address calls go to now. */
  get address(): string {
    return this.addresses[this.current];
  }

  private connect(): void {
    this.close();
    const v1 = services();
    for (const name of SERVICES) this.stubs[name] = new v1[name](this.address, this.creds);
  }

  close(): void {
    for (const stub of Object.values(this.stubs)) stub.close();
    this.stubs = {};
  }

  private follow(md: grpc.Metadata | undefined): void {
    const leader = metadataValue(md, LEADER_KEY);
    if (leader && this.addresses.includes(leader)) {
      this.current = this.addresses.indexOf(leader);
    } else if (leader) {
      this.addresses.push(leader);
      this.current = this.addresses.length - 1;
    } else {
      this.current = (this.current + 1) % this.addresses.length;
    }
    this.connect();
  }

  private once(service: string, method: string, request: Message, timeoutMs: number): Promise<Message> {
    return new Promise((resolve, reject) => {
      const deadline = new Date(Date.now() + timeoutMs);
      this.stubs[service][method](request, new grpc.Metadata(), { deadline }, (err: grpc.ServiceError | null, resp: Message) =>
        err ? reject(err) : resolve(resp),
      );
    });
  }

  /** One unary call, following the leader. `repeatable`: the call may run
   * twice without harm, so it is sent again after a lost answer. */
  async call(service: string, method: string, request: Message, opts: { repeatable?: boolean; timeoutMs?: number } = {}): Promise<Message> {
    const deadline = Date.now() + this.failoverMs;
    let pause = 100;
    for (;;) {
      try {
        return await this.once(service, method, request, opts.timeoutMs ?? this.timeoutMs);
      } catch (e) {
        const err = e as grpc.ServiceError;
        const fail = new TaskgridError(err.code, err.details ?? String(e), `${service}/${method}`);
        if (err.code !== grpc.status.UNAVAILABLE) throw fail;
        const neverRan = metadataValue(err.metadata, STANDBY_KEY) !== "" || notSent(err);
        if (!(neverRan || opts.repeatable) || Date.now() >= deadline) throw fail;
        this.follow(err.metadata); // a new channel: the old one may wait out a reconnect backoff
        await sleep(pause);
        pause = Math.min(pause * 2, 1000);
      }
    }
  }

  /** A TaskService stream broke with `err`: rejects when it may not be
   * opened again (`reopen` false, or broken for failoverMs since `since`);
   * else follows the leader if need be, waits a little and returns when the
   * outage began, for the caller to open the stream again. */
  private async reopenAfter(err: grpc.ServiceError, method: string, since: number | undefined, reopen: boolean): Promise<number> {
    const fail = new TaskgridError(err.code, err.details ?? String(err), `TaskService/${method}`);
    const start = since ?? Date.now();
    if (!reopen || Date.now() - start >= this.failoverMs) throw fail;
    if (err.code === grpc.status.UNAVAILABLE) this.follow(err.metadata);
    await sleep(200);
    return start;
  }

  // --- tasks ---

  /** Submits one task; returns it as stored. Idempotent by id. */
  async submit(spec: Message): Promise<Task> {
    return (await this.submitMany([spec]))[0];
  }

  /** Submits tasks in one call (all or none). */
  async submitMany(specs: Message[]): Promise<Task[]> {
    const repeatable = specs.every((s) => s.id && !s.merge_key);
    const resp = await this.call("TaskService", "SubmitTasks", { tasks: specs }, { repeatable });
    return resp.tasks as Task[];
  }

  async get(id: string): Promise<Task> {
    return (await this.call("TaskService", "GetTask", { id }, { repeatable: true })) as Task;
  }

  /** The task once it has ended; rejects with a timeout error when it has
   * not within `timeoutMs` (undefined: waits as long as it takes). */
  async wait(id: string, timeoutMs?: number): Promise<Task> {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      const left = deadline === undefined ? 300_000 : Math.max(0, deadline - Date.now());
      const poll = Math.min(left, 30_000);
      const resp = await this.call("TaskService", "WaitTask", { id, timeout: duration(poll / 1000) }, { repeatable: true, timeoutMs: poll + 10_000 });
      if (resp.done) return resp.task as Task;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new Error(`timeout: task ${id} is ${stateName(resp.task.state)} after ${timeoutMs} ms`);
      }
    }
  }

  /** Every task matching, page by page, in submit order or newest first. */
  async *list(
    filter: {
      queue?: string;
      states?: string[];
      job_id?: string;
      id_prefix?: string;
      /** Only tasks carrying every one of these (TaskSpec.labels). */
      labels?: Record<string, string>;
      newest_first?: boolean;
      page_size?: number;
    } = {},
  ): AsyncGenerator<Task> {
    let page_token = "";
    const states = taskStates(filter.states);
    for (;;) {
      const resp = await this.call(
        "TaskService",
        "ListTasks",
        {
          queue: filter.queue ?? "",
          states,
          job_id: filter.job_id ?? "",
          id_prefix: filter.id_prefix ?? "",
          labels: filter.labels ?? {},
          newest_first: filter.newest_first ?? false,
          page_size: filter.page_size ?? 500,
          page_token,
        },
        { repeatable: true },
      );
      for (const t of resp.tasks) yield t as Task;
      page_token = resp.next_page_token;
      if (!page_token) return;
    }
  }

  async cancel(id: string): Promise<Task> {
    return (await this.call("TaskService", "CancelTask", { id }, { repeatable: true })) as Task;
  }

  async retry(id: string): Promise<Task> {
    return (await this.call("TaskService", "RetryTask", { id })) as Task;
  }

  async delete(id: string): Promise<void> {
    await this.call("TaskService", "DeleteTask", { id }, { repeatable: true });
  }

  /** Keeps the task from running until resume(): a waiting one is PAUSED
   * at once; a running one once its agent has stopped the attempt
   * (pause_requested until then; that attempt does not count). */
  async pause(id: string): Promise<Task> {
    return (await this.call("TaskService", "PauseTask", { id }, { repeatable: true })) as Task;
  }

  /** A PAUSED task back to PENDING (SCHEDULED while its not_before is ahead). */
  async resume(id: string): Promise<Task> {
    return (await this.call("TaskService", "ResumeTask", { id }, { repeatable: true })) as Task;
  }

  /** A finished task back to PENDING as if new: its attempt budget and
   * history start over (attempt numbers go on). */
  async reset(id: string): Promise<Task> {
    return (await this.call("TaskService", "ResetTask", { id })) as Task;
  }

  /** The task's output: KIND_OUTPUT messages carry `data`, bytes at
   * `offset` (a string: int64) of what `attempt` wrote on `stream`;
   * KIND_ATTEMPT_STARTED and KIND_ATTEMPT_ENDED say whose output follows
   * and how it ended; KIND_END comes last, with the task's `state`. Without
   * `follow`: what there is now. With `follow`: until the task is finished,
   * across attempts; a stream that breaks (a restart, a failover) is opened
   * again, and what was yielded before is not yielded twice; it gives up
   * after failoverMs without a stream. `stream`: "stdout" or "stderr" only. */
  async *output(id: string, opts: { follow?: boolean; stream?: "stdout" | "stderr" } = {}): AsyncGenerator<OutputMessage> {
    const follow = opts.follow ?? false;
    const req = { id, follow, stream: opts.stream ? `OUTPUT_STREAM_${opts.stream.toUpperCase()}` : "OUTPUT_STREAM_UNSPECIFIED" };
    const sent = new Map<string, number>(); // "attempt/stream" -> end of what was yielded
    const started = new Set<number>();
    const ended = new Set<number>();
    let brokenSince: number | undefined;
    for (;;) {
      const callOpts = follow ? {} : { deadline: new Date(Date.now() + this.timeoutMs) };
      const stream = this.stubs.TaskService.StreamTaskOutput(req, new grpc.Metadata(), callOpts) as grpc.ClientReadableStream<OutputMessage>;
      try {
        for await (const r of stream) {
          brokenSince = undefined;
          if (r.kind === "KIND_OUTPUT") {
            const key = `${r.attempt}/${r.stream}`;
            const done = sent.get(key) ?? 0;
            const offset = Number(r.offset);
            const end = offset + r.data.length;
            if (end <= done) continue; // sent again after a reconnect
            if (offset < done) {
              r.data = r.data.subarray(done - offset);
              r.offset = String(done);
            }
            sent.set(key, end);
          } else if (r.kind === "KIND_ATTEMPT_STARTED") {
            if (started.has(r.attempt)) continue;
            started.add(r.attempt);
          } else if (r.kind === "KIND_ATTEMPT_ENDED") {
            if (ended.has(r.attempt)) continue;
            ended.add(r.attempt);
          }
          yield r;
          if (r.kind === "KIND_END") return;
        }
        return;
      } catch (e) {
        const err = e as grpc.ServiceError;
        brokenSince = await this.reopenAfter(err, "StreamTaskOutput", brokenSince, follow && STREAM_BROKEN.has(err.code));
      } finally {
        stream.cancel();
      }
    }
  }

  /** Cancels every task of `queue` and/or `job_id` (in `states`, if given),
   * a page per call until none is left: every id cancelled, and how many
   * were skipped and the first reason why. */
  async cancelTasks(filter: BulkFilter): Promise<BulkResult> {
    return this.bulk("CancelTasks", filter, true);
  }

  /** Retries the FAILED and CANCELLED tasks selected, as cancelTasks. */
  async retryTasks(filter: BulkFilter): Promise<BulkResult> {
    return this.bulk("RetryTasks", filter, false);
  }

  /** Deletes the finished tasks selected, as cancelTasks. */
  async deleteTasks(filter: BulkFilter): Promise<BulkResult> {
    return this.bulk("DeleteTasks", filter, true);
  }

  private async bulk(method: string, filter: BulkFilter, repeatable: boolean): Promise<BulkResult> {
    const total: BulkResult = { ids: [], skipped: 0, skipped_reason: "" };
    const req: Message = { queue: filter.queue ?? "", job_id: filter.job_id ?? "", states: taskStates(filter.states), page_token: "" };
    for (;;) {
      const resp = await this.call("TaskService", method, req, { repeatable });
      total.ids.push(...resp.ids);
      total.skipped += Number(resp.skipped);
      total.skipped_reason = total.skipped_reason || resp.skipped_reason;
      if (!resp.next_page_token) return total;
      req.page_token = resp.next_page_token;
    }
  }

  /** The state changes of the tasks named (or of a queue, a job, or all),
   * after `after_revision` (undefined: from now), for as long as the caller
   * reads. A stream that breaks is opened again after the last revision
   * seen, so no change is missed or repeated; it gives up after failoverMs
   * without a stream. */
  async *watch(filter: { task_ids?: string[]; queue?: string; job_id?: string; after_revision?: number | string } = {}): AsyncGenerator<TaskEvent> {
    let after: string | undefined = filter.after_revision === undefined ? undefined : String(filter.after_revision);
    let brokenSince: number | undefined;
    for (;;) {
      const req: Message = { task_ids: filter.task_ids ?? [], queue: filter.queue ?? "", job_id: filter.job_id ?? "" };
      if (after !== undefined) req.after_revision = after;
      const stream = this.stubs.TaskService.WatchTasks(req) as grpc.ClientReadableStream<TaskEvent>;
      if (after === undefined) {
        stream.once("metadata", (md: grpc.Metadata) => {
          const v = metadataValue(md, WATCH_STARTS_AFTER_KEY);
          if (v && after === undefined) after = v;
        });
      }
      try {
        for await (const event of stream) {
          brokenSince = undefined;
          after = (event as TaskEvent).revision;
          yield event as TaskEvent;
        }
        return;
      } catch (e) {
        const err = e as grpc.ServiceError;
        const resume = metadataValue(err.metadata, RESUME_AFTER_KEY);
        if (resume) after = resume;
        brokenSince = await this.reopenAfter(err, "WatchTasks", brokenSince, STREAM_BROKEN.has(err.code) || resume !== "");
      } finally {
        stream.cancel();
      }
    }
  }

  // --- jobs ---

  async submitJob(job_id: string, specs: Message[]): Promise<Message> {
    return this.call("JobService", "SubmitJob", { job_id, tasks: specs }, { repeatable: !!job_id });
  }

  async getJob(id: string): Promise<Message> {
    return this.call("JobService", "GetJob", { id }, { repeatable: true });
  }

  async cancelJob(id: string): Promise<Message> {
    return this.call("JobService", "CancelJob", { id }, { repeatable: true });
  }

  /** Every job (in `states`, by name "RUNNING" or "JOB_STATE_RUNNING"), page by page. */
  async *listJobs(filter: { states?: string[]; page_size?: number } = {}): AsyncGenerator<Message> {
    const states = enumNames("JOB_STATE_", filter.states);
    let page_token = "";
    for (;;) {
      const resp = await this.call("JobService", "ListJobs", { states, page_size: filter.page_size ?? 100, page_token }, { repeatable: true });
      for (const j of resp.jobs) yield j;
      page_token = resp.next_page_token;
      if (!page_token) return;
    }
  }

  /** Runs a finished job's FAILED and CANCELLED tasks again, and what they hold up. */
  async retryJob(id: string): Promise<Message> {
    return this.call("JobService", "RetryJob", { id });
  }

  /** Deletes a finished job and its tasks for good. */
  async deleteJob(id: string): Promise<Message> {
    return this.call("JobService", "DeleteJob", { id }, { repeatable: true });
  }

  // --- queues ---

  /** Each queue's counts by state, settings and what holds it back (or
   * `queue`'s alone); `withHistory`: also what it did minute by minute over
   * the last hour (history). */
  async queues(queue = "", opts: { withHistory?: boolean } = {}): Promise<Message[]> {
    return (await this.call("TaskService", "GetQueueStats", { queue, with_history: opts.withHistory ?? false }, { repeatable: true })).queues;
  }

  async pauseQueue(queue: string): Promise<Message> {
    return this.call("TaskService", "PauseQueue", { queue }, { repeatable: true });
  }

  async resumeQueue(queue: string): Promise<Message> {
    return this.call("TaskService", "ResumeQueue", { queue }, { repeatable: true });
  }

  /** Sets every limit as given (0 or unset removes it). */
  async setQueueLimits(queue: string, limits: { max_concurrency?: number; rate_per_second?: number; burst?: number; quota?: Record<string, string> }): Promise<Message> {
    return this.call(
      "TaskService",
      "SetQueueLimits",
      { queue, max_concurrency: limits.max_concurrency ?? 0, rate_per_second: limits.rate_per_second ?? 0, burst: limits.burst ?? 0, quota: limits.quota ?? {} },
      { repeatable: true },
    );
  }

  /** The queue's fair share against other queues; null removes it. */
  async setQueueWeight(queue: string, weight: number | null): Promise<Message> {
    const req: Message = { queue };
    if (weight !== null) req.weight = weight;
    return this.call("TaskService", "SetQueueWeight", req, { repeatable: true });
  }

  // --- schedules ---

  async createSchedule(schedule: Message): Promise<Message> {
    return this.call("ScheduleService", "CreateSchedule", { schedule });
  }

  async getSchedule(id: string): Promise<Message> {
    return this.call("ScheduleService", "GetSchedule", { id }, { repeatable: true });
  }

  async listSchedules(): Promise<Message[]> {
    return (await this.call("ScheduleService", "ListSchedules", {}, { repeatable: true })).schedules;
  }

  async pauseSchedule(id: string): Promise<Message> {
    return this.call("ScheduleService", "PauseSchedule", { id }, { repeatable: true });
  }

  async resumeSchedule(id: string): Promise<Message> {
    return this.call("ScheduleService", "ResumeSchedule", { id }, { repeatable: true });
  }

  async deleteSchedule(id: string): Promise<Message> {
    return this.call("ScheduleService", "DeleteSchedule", { id });
  }

  // --- the board (pull mode) ---

  /** Claims up to `max` tasks of `queue` for `leaseSeconds`; with `taskId`,
   * that task alone, or rejects with a TaskgridError saying why it cannot be
   * claimed now (NOT_FOUND, FAILED_PRECONDITION). */
  async claim(queue: string, owner: string, opts: { max?: number; leaseSeconds?: number; labels?: Record<string, string>; taskId?: string } = {}): Promise<Message[]> {
    const resp = await this.call("BoardService", "Claim", {
      queue,
      owner,
      max: opts.taskId ? 0 : (opts.max ?? 1),
      lease: duration(opts.leaseSeconds ?? 30),
      labels: opts.labels ?? {},
      task_id: opts.taskId ?? "",
    });
    return resp.claims;
  }

  /** How many tasks `queue` holds that these labels may claim, once it holds
   * some or after `timeoutSeconds` (then 0). */
  async waitForWork(queue: string, opts: { labels?: Record<string, string>; timeoutSeconds?: number } = {}): Promise<number> {
    const t = opts.timeoutSeconds ?? 5;
    const resp = await this.call("BoardService", "WaitForWork", { queue, labels: opts.labels ?? {}, timeout: duration(t) }, { repeatable: true, timeoutMs: t * 1000 + 10_000 });
    return Number(resp.ready);
  }

  async extendClaim(claim: Message, leaseSeconds: number): Promise<void> {
    await this.call("BoardService", "ExtendClaim", { claim, lease: duration(leaseSeconds) }, { repeatable: true });
  }

  async completeClaim(claim: Message, result: Message): Promise<Task> {
    return (await this.call("BoardService", "CompleteClaim", { claim, result }, { repeatable: true })).task;
  }

  async abandonClaim(claim: Message, reason = ""): Promise<Task> {
    return (await this.call("BoardService", "AbandonClaim", { claim, reason }, { repeatable: true })).task;
  }

  async trashClaim(claim: Message, reason = ""): Promise<Task> {
    return (await this.call("BoardService", "TrashClaim", { claim, reason }, { repeatable: true })).task;
  }

  /** A TRASHED task back to PENDING. */
  async restore(id: string): Promise<Task> {
    return (await this.call("BoardService", "RestoreTask", { id })).task;
  }

  // --- the cluster ---

  async agents(): Promise<Message[]> {
    return (await this.call("ClusterService", "ListAgents", {}, { repeatable: true })).agents;
  }

  /** The agent finishes what it runs and takes nothing new. */
  async drainAgent(id: string): Promise<Message> {
    return this.call("ClusterService", "DrainAgent", { id }, { repeatable: true });
  }

  async undrainAgent(id: string): Promise<Message> {
    return this.call("ClusterService", "UndrainAgent", { id }, { repeatable: true });
  }

  /** Agents by state, slots, and tasks by state over every queue. */
  async clusterStats(): Promise<Message> {
    return this.call("ClusterService", "GetClusterStats", {}, { repeatable: true });
  }
}
