// A real scheduler (and agents) for the tests, from the binaries that
// TASKGRID_SCHEDULER and TASKGRID_AGENT name; each test its own directory
// and ports. Every wait is for a condition, bounded.
import { ChildProcess, spawn } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

export async function waitUntil<T>(cond: () => T | Promise<T>, what: string, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function binary(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (the path of the built binary)`);
  return v;
}

export class Cluster {
  readonly dir = fs.mkdtempSync(path.join(os.tmpdir(), "taskgrid-ts-"));
  port = 0;
  private procs: ChildProcess[] = [];
  scheduler: ChildProcess | null = null;

  get addr(): string {
    return `127.0.0.1:${this.port}`;
  }

  async startScheduler(): Promise<void> {
    const portFile = path.join(this.dir, "port");
    fs.rmSync(portFile, { force: true });
    const listen = this.port ? `127.0.0.1:${this.port}` : "127.0.0.1:0";
    const log = fs.openSync(path.join(this.dir, "scheduler.log"), "a");
    const p = spawn(binary("TASKGRID_SCHEDULER"), [`--listen=${listen}`, `--data_dir=${path.join(this.dir, "data")}`, `--port_file=${portFile}`], {
      stdio: ["ignore", log, log],
    });
    this.scheduler = p;
    this.procs.push(p);
    await waitUntil(() => {
      if (p.exitCode !== null) throw new Error(`the scheduler exited: ${this.log("scheduler")}`);
      return fs.existsSync(portFile) && fs.readFileSync(portFile, "utf8").trim().length > 0;
    }, "the scheduler to serve");
    this.port = Number(fs.readFileSync(portFile, "utf8").trim());
  }

  startAgent(id: string, slots = 2): ChildProcess {
    const log = fs.openSync(path.join(this.dir, `agent-${id}.log`), "a");
    const p = spawn(binary("TASKGRID_AGENT"), [`--scheduler=${this.addr}`, `--id=${id}`, `--slots=${slots}`, `--work_dir=${path.join(this.dir, `work-${id}`)}`], {
      stdio: ["ignore", log, log],
    });
    this.procs.push(p);
    return p;
  }

  async kill9Scheduler(): Promise<void> {
    const p = this.scheduler!;
    const gone = new Promise((r) => p.once("exit", r));
    p.kill("SIGKILL");
    await gone;
  }

  log(name: string): string {
    try {
      return fs.readFileSync(path.join(this.dir, `${name}.log`), "utf8").slice(-4000);
    } catch {
      return "";
    }
  }

  async close(): Promise<void> {
    await Promise.all(
      this.procs.map(
        (p) =>
          new Promise<void>((resolve) => {
            if (p.exitCode !== null || p.signalCode !== null) return resolve();
            const t = setTimeout(() => p.kill("SIGKILL"), 10_000);
            p.once("exit", () => {
              clearTimeout(t);
              resolve();
            });
            p.kill("SIGTERM");
          }),
      ),
    );
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
