// Worker: JavaScript functions as tasks, in pull mode.
//
//   const worker = new Worker(client, { queue: "images" });
//   worker.task("resize", async (path, size) => `resized ${path} to ${size}`);
//   await worker.run();
//
// A task for it has steps whose command names a function, and whose other
// arguments are the function's: {"exec": {"argv": ["resize", "a.png", "64"]}}
// (no process runs: argv[0] is looked up among the functions). The worker
// claims tasks from its queue on the board (BoardService), up to
// `concurrency` at once, and calls each step's function with argv[1:] and
// a context ({payload, task}). While a task runs its claim is extended
// every lease/3, so a long function keeps it and a worker that dies loses
// it within one lease. The last step's value is the task's output and
// stdout (a Buffer as it is, a string as UTF-8, anything else as JSON); a
// thrown error fails the attempt (retried as the task's max_attempts
// allows), and a PermanentError fails it for good. A step naming no
// function puts the task aside (TrashClaim) with a reason.
//
// stop() (and SIGINT or SIGTERM while run({ handleSignals: true }) runs)
// claims nothing more and abandons the claims of running tasks: they go
// back on the board at once, not counted, and what their functions return
// afterwards is dropped.
import * as os from "os";
import * as grpc from "@grpc/grpc-js";
import { Client, Message, TaskgridError } from "./client";

const MAX_TAIL = 64 << 10;

/** Thrown by a task function: the attempt fails and is not retried. */
export class PermanentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "PermanentError";
  }
}

export interface TaskContext {
  payload: Buffer;
  /** The claimed assignment (task_id, attempt, steps, ...). */
  task: Message;
}

export type TaskFunction = (...args: any[]) => unknown;

export interface WorkerOptions {
  queue?: string;
  /** The name claims are held under (default: host-pid). */
  owner?: string;
  labels?: Record<string, string>;
  concurrency?: number;
  leaseSeconds?: number;
}

function asBuffer(v: unknown): Buffer {
  if (v === undefined || v === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(v)) return v;
  if (typeof v === "string") return Buffer.from(v);
  return Buffer.from(JSON.stringify(v));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Worker {
  readonly queue: string;
  readonly owner: string;
  readonly labels: Record<string, string>;
  readonly concurrency: number;
  readonly leaseSeconds: number;
  /** Tasks completed by this worker, and claim extensions made. */
  completed = 0;
  extended = 0;
  private functions = new Map<string, TaskFunction>();
  private running = new Map<string, Message>(); // task id -> its claim
  private stopped = false;
  private wake: (() => void) | null = null;

  constructor(
    readonly client: Client,
    opts: WorkerOptions = {},
  ) {
    this.queue = opts.queue ?? "default";
    this.owner = opts.owner ?? `${os.hostname()}-${process.pid}`;
    this.labels = opts.labels ?? {};
    this.concurrency = opts.concurrency ?? 1;
    this.leaseSeconds = opts.leaseSeconds ?? 30;
    if (this.concurrency < 1) throw new Error("concurrency must be at least 1");
    if (this.leaseSeconds < 1) throw new Error("leaseSeconds must be at least 1");
  }

  /** Registers `fn` for steps whose argv[0] is `name`. */
  task(name: string, fn: TaskFunction): this {
    if (this.functions.has(name)) throw new Error(`a function for "${name}" is registered already`);
    this.functions.set(name, fn);
    return this;
  }

  /** Claims nothing more; abandons the claims of running tasks. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.wake?.();
    const running = [...this.running.entries()];
    this.running.clear();
    await Promise.all(
      running.map(([id, ref]) =>
        this.client.abandonClaim(ref, `worker ${this.owner} stopped`).catch((e) => console.warn(`abandoning ${id}: ${e}`)),
      ),
    );
  }

  /** Claims and runs tasks until stop() (or a signal, with handleSignals),
   * or until `maxTasks` were completed. */
  async run(opts: { maxTasks?: number; handleSignals?: boolean } = {}): Promise<void> {
    if (this.functions.size === 0) throw new Error('no task functions: register one with worker.task(name, fn)');
    const onSignal = () => void this.stop();
    if (opts.handleSignals) {
      process.on("SIGINT", onSignal);
      process.on("SIGTERM", onSignal);
    }
    const tasks = new Set<Promise<void>>();
    try {
      while (!this.stopped && (opts.maxTasks === undefined || this.completed < opts.maxTasks)) {
        const free = this.concurrency - this.running.size;
        if (free <= 0) {
          await new Promise<void>((r) => (this.wake = r));
          continue;
        }
        let claims: Message[];
        try {
          claims = await this.client.claim(this.queue, this.owner, { max: free, leaseSeconds: this.leaseSeconds, labels: this.labels });
        } catch (e) {
          console.warn(`claim: ${e}`);
          await sleep(1000);
          continue;
        }
        if (claims.length === 0) {
          try {
            await this.client.waitForWork(this.queue, { labels: this.labels, timeoutSeconds: 5 });
          } catch (e) {
            console.warn(`wait for work: ${e}`);
            await sleep(1000);
          }
          continue;
        }
        for (const c of claims) {
          const p = this.runTask(c.assignment).finally(() => {
            tasks.delete(p);
            this.wake?.();
          });
          tasks.add(p);
        }
      }
      if (!this.stopped) await Promise.all(tasks);
    } finally {
      if (opts.handleSignals) {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
    }
  }

  private nameOf(step: Message): string {
    if (step.kind !== "exec" || !step.exec?.argv?.length) return `(${step.kind} step)`;
    return step.exec.argv[0];
  }

  private release(ref: Message): boolean {
    const mine = this.running.get(ref.task_id);
    if (mine !== ref) return false;
    this.running.delete(ref.task_id);
    return true;
  }

  private async runTask(a: Message): Promise<void> {
    const ref = { task_id: a.task_id, attempt: a.attempt, owner: this.owner };
    this.running.set(a.task_id, ref);
    const missing = (a.steps as Message[]).map((s) => this.nameOf(s)).filter((n) => !this.functions.has(n));
    if (missing.length > 0 || a.steps.length === 0) {
      const reason =
        missing.length > 0
          ? `worker ${this.owner} has no function for step "${missing[0]}" (it has ${[...this.functions.keys()].sort().join(", ")})`
          : "the task has no steps";
      if (this.release(ref)) await this.client.trashClaim(ref, reason).catch((e) => console.warn(`trashing ${a.task_id}: ${e}`));
      return;
    }
    const keeper = setInterval(() => {
      if (this.running.get(a.task_id) !== ref) {
        clearInterval(keeper); // released (stop, a lost claim): nothing to keep
        return;
      }
      this.client
        .extendClaim(ref, this.leaseSeconds)
        .then(() => this.extended++)
        .catch((e: unknown) => {
          if (e instanceof TaskgridError && [grpc.status.ABORTED, grpc.status.NOT_FOUND, grpc.status.FAILED_PRECONDITION].includes(e.code)) {
            this.release(ref); // the claim is gone: the result will be dropped
          }
        });
    }, (this.leaseSeconds * 1000) / 3);
    let result: Message = { outcome: "OUTCOME_SUCCEEDED", exit_code: 0, step: 0 };
    try {
      for (let i = 0; i < a.steps.length; i++) {
        result.step = i;
        const step = a.steps[i];
        const value = await this.functions.get(step.exec.argv[0])!(...step.exec.argv.slice(1), { payload: a.payload, task: a } as TaskContext);
        const out = asBuffer(value);
        result.output = out;
        result.stdout_tail = out.subarray(Math.max(0, out.length - MAX_TAIL));
        result.stdout_cut_bytes = String(Math.max(0, out.length - MAX_TAIL));
      }
    } catch (e) {
      const err = e instanceof Error ? e : new Error(String(e));
      const tb = Buffer.from(err.stack ?? String(err));
      result = {
        outcome: "OUTCOME_FAILED",
        exit_code: 1,
        step: result.step,
        error: `${err.name}: ${err.message}`.slice(0, 1000),
        stderr_tail: tb.subarray(Math.max(0, tb.length - MAX_TAIL)),
        permanent: err instanceof PermanentError,
      };
    } finally {
      clearInterval(keeper);
    }
    if (!this.release(ref)) return; // abandoned (stop) or lost meanwhile
    try {
      await this.client.completeClaim(ref, result);
      this.completed++;
    } catch (e) {
      console.warn(`completing ${a.task_id}: ${e}`);
    }
  }
}
