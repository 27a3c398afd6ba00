// Client against a real scheduler and agent.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as net from "net";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import { Client, Message, OutputMessage, TaskgridError, stateName } from "../src";
import { Cluster, waitUntil } from "./harness";

const echo = (id: string, ...words: string[]) => ({ id, steps: [{ exec: { argv: ["echo", ...words] } }] });

async function withCluster(fn: (c: Cluster, client: Client) => Promise<void>): Promise<void> {
  const c = new Cluster();
  let client: Client | null = null;
  try {
    await c.startScheduler();
    client = new Client(c.addr);
    await fn(c, client);
  } catch (e) {
    console.error(c.log("scheduler"));
    throw e;
  } finally {
    client?.close();
    await c.close();
  }
}

test("submit, wait and get", () =>
  withCluster(async (c, client) => {
    c.startAgent("a1");
    const t = await client.submit(echo("ts-1", "hi"));
    assert.equal(t.spec.id, "ts-1");
    const done = await client.wait("ts-1", 60_000);
    assert.equal(stateName(done.state), "SUCCEEDED");
    assert.equal(done.result!.stdout_tail.toString(), "hi\n");
    assert.equal((await client.get("ts-1")).attempt, 1);
  }));

test("submit is idempotent by id and refuses another spec", () =>
  withCluster(async (_c, client) => {
    const first = await client.submit(echo("ts-2", "a"));
    const again = await client.submit(echo("ts-2", "a"));
    assert.deepEqual(again.create_time, first.create_time);
    await assert.rejects(client.submit(echo("ts-2", "b")), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.ALREADY_EXISTS);
    await assert.rejects(client.get("nope"), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.NOT_FOUND && /nope/.test(e.details));
    await assert.rejects(client.submit({ id: "no-steps" }), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.INVALID_ARGUMENT);
  }));

test("wait times out while nothing runs the task; list pages through all", () =>
  withCluster(async (_c, client) => {
    await client.submitMany(Array.from({ length: 25 }, (_, i) => ({ ...echo(`ts-l${i}`, String(i)), queue: "lq" })));
    await assert.rejects(client.wait("ts-l0", 500), /timeout/);
    const ids: string[] = [];
    for await (const t of client.list({ queue: "lq", states: ["PENDING"], page_size: 10 })) ids.push(t.spec.id);
    assert.equal(ids.length, 25);
    const newest: string[] = [];
    for await (const t of client.list({ queue: "lq", id_prefix: "ts-l1", newest_first: true, page_size: 4 })) newest.push(t.spec.id);
    assert.deepEqual(newest, [...Array.from({ length: 10 }, (_, i) => `ts-l${19 - i}`), "ts-l1"]);
    // By label.
    await client.submit({ ...echo("ts-lab", "x"), queue: "labq", labels: { team: "red", run: "7" } });
    const red: string[] = [];
    for await (const t of client.list({ labels: { team: "red" } })) red.push(t.spec.id);
    assert.deepEqual(red, ["ts-lab"]);
    const none: string[] = [];
    for await (const t of client.list({ labels: { team: "red", run: "8" } })) none.push(t.spec.id);
    assert.deepEqual(none, []);
    assert.equal(stateName((await client.cancel("ts-l0")).state), "CANCELLED");
    // Claim a named task; a second claim of it says why not.
    const claims = await client.claim("", "w1", { taskId: "ts-l7" });
    assert.deepEqual(claims.map((c) => c.assignment.task_id), ["ts-l7"]);
    assert.equal((await client.get("ts-l7")).agent_id, "w1");
    await assert.rejects(client.claim("lq", "w2", { taskId: "ts-l7" }), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.FAILED_PRECONDITION && /claimed by w1/.test(e.details));
    await assert.rejects(client.claim("lq", "w2", { taskId: "ts-l0" }), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.FAILED_PRECONDITION && /CANCELLED/.test(e.details));
  }));

test("watch sees every change across a kill -9 of the scheduler", () =>
  withCluster(async (c, client) => {
    await client.submit(echo("ts-w", "w"));
    const events: { to: string; revision: number }[] = [];
    const watching = (async () => {
      for await (const ev of client.watch({ task_ids: ["ts-w"], after_revision: 0 })) {
        events.push({ to: stateName(ev.to_state), revision: Number(ev.revision) });
        if (ev.to_state === "TASK_STATE_SUCCEEDED") return;
      }
    })();
    await waitUntil(() => events.length > 0, "the first event");
    await c.kill9Scheduler();
    await c.startScheduler(); // the same port and data directory
    c.startAgent("a1", 1);
    await watching;
    const revisions = events.map((e) => e.revision);
    assert.deepEqual(revisions, [...new Set(revisions)].sort((a, b) => a - b));
    assert.equal(events[0].to, "PENDING");
    assert.equal(events[events.length - 1].to, "SUCCEEDED");
  }));

test("follows to a scheduler that answers", () =>
  withCluster(async (c) => {
    const dead = await new Promise<number>((resolve) => {
      const s = net.createServer();
      s.listen(0, "127.0.0.1", () => {
        const port = (s.address() as net.AddressInfo).port;
        s.close(() => resolve(port));
      });
    });
    const client = new Client([`127.0.0.1:${dead}`, c.addr]);
    try {
      await client.submit(echo("ts-f", "f"));
      assert.equal((await client.get("ts-f")).spec.id, "ts-f");
      assert.equal(client.address, c.addr);
    } finally {
      client.close();
    }
  }));

test("a token needs TLS", () => {
  assert.throws(() => new Client("127.0.0.1:1", { token: "secret-token" }), /needs TLS/);
});

// A task that writes "first", waits (bounded) for the file `go`, then
// writes "second" and "err" on stderr.
const held = (id: string, go: string) => ({
  id,
  steps: [{ exec: { argv: ["sh", "-c", 'echo first; i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo second; echo err >&2', "sh", go] } }],
});

// Output per stream, the attempts started and the END; fails on a gap or a repeat.
function collect(messages: OutputMessage[]): { out: Record<string, string>; started: number[]; end: OutputMessage | undefined } {
  const out: Record<string, string> = { OUTPUT_STREAM_STDOUT: "", OUTPUT_STREAM_STDERR: "" };
  const started: number[] = [];
  let end: OutputMessage | undefined;
  for (const r of messages) {
    if (r.kind === "KIND_OUTPUT") {
      assert.equal(Number(r.offset), out[r.stream].length, `${r.stream} at ${r.offset} after ${JSON.stringify(out[r.stream])}`);
      out[r.stream] += r.data.toString();
    } else if (r.kind === "KIND_ATTEMPT_STARTED") {
      started.push(r.attempt);
    } else if (r.kind === "KIND_END") {
      end = r;
    }
  }
  return { out, started, end };
}

test("output follows a task across a kill -9 of the scheduler without repeating", () =>
  withCluster(async (c, client) => {
    const go = path.join(c.dir, "go-out");
    c.startAgent("a1", 1);
    await client.submit(held("ts-out", go));
    const got: OutputMessage[] = [];
    const following = (async () => {
      for await (const r of client.output("ts-out", { follow: true })) got.push(r);
    })();
    await waitUntil(() => got.some((r) => r.data.length > 0), "the first output");
    // The new scheduler sends what the agent holds (the "first" line) again.
    await c.kill9Scheduler();
    await c.startScheduler();
    await waitUntil(async () => (await client.agents()).some((a) => a.id === "a1"), "a1 back");
    fs.writeFileSync(go, "");
    await following;
    const { out, started, end } = collect(got);
    assert.deepEqual(out, { OUTPUT_STREAM_STDOUT: "first\nsecond\n", OUTPUT_STREAM_STDERR: "err\n" });
    assert.deepEqual(started, [1]);
    assert.equal(end!.state, "TASK_STATE_SUCCEEDED");
    // Finished: the stored tails, one stream if asked.
    const stderr: OutputMessage[] = [];
    for await (const r of client.output("ts-out", { stream: "stderr" })) stderr.push(r);
    assert.deepEqual(collect(stderr).out, { OUTPUT_STREAM_STDOUT: "", OUTPUT_STREAM_STDERR: "err\n" });
    await assert.rejects(
      (async () => {
        for await (const _ of client.output("ts-none"));
      })(),
      (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.NOT_FOUND,
    );
  }));

test("pause, resume and reset a task; queue controls; bulk changes", () =>
  withCluster(async (c, client) => {
    await client.submit(echo("ts-p", "p"));
    assert.equal(stateName((await client.pause("ts-p")).state), "PAUSED");
    c.startAgent("a1", 1);
    assert.equal(stateName((await client.resume("ts-p")).state), "PENDING");
    assert.equal((await client.wait("ts-p", 60_000)).attempt, 1);
    await client.reset("ts-p");
    const again = await client.wait("ts-p", 60_000);
    assert.equal(stateName(again.state), "SUCCEEDED");
    assert.equal(again.attempt, 2);

    await client.pauseQueue("bq"); // before its tasks, so the agent takes none
    await client.submitMany(Array.from({ length: 12 }, (_, i) => ({ ...echo(`ts-b${i}`, String(i)), queue: "bq" })));
    const limited = await client.setQueueLimits("bq", { max_concurrency: 3, rate_per_second: 2.5 });
    assert.equal(limited.settings.max_concurrency, 3);
    assert.equal(limited.settings.rate_per_second, 2.5);
    assert.equal((await client.setQueueWeight("bq", 7)).settings.weight, 7);
    assert.equal((await client.setQueueWeight("bq", null)).settings.weight, undefined);
    const [stats] = await client.queues("bq", { withHistory: true });
    assert.equal(Number(stats.counts.PENDING), 12);
    assert.equal(stats.settings.paused, true);
    assert.equal(stats.history.reduce((n: number, m: Message) => n + Number(m.submitted), 0), 12);
    await assert.rejects(client.cancelTasks({}), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.INVALID_ARGUMENT);
    const cancelled = await client.cancelTasks({ queue: "bq", states: ["PENDING"] });
    assert.equal(cancelled.ids.length, 12);
    assert.equal(stateName((await client.get("ts-p")).state), "SUCCEEDED"); // another queue
    assert.equal((await client.retryTasks({ queue: "bq" })).ids.length, 12);
    await client.cancelTasks({ queue: "bq" });
    assert.equal((await client.deleteTasks({ queue: "bq", states: ["CANCELLED"] })).ids.length, 12);
    assert.equal((await client.resumeQueue("bq")).settings.paused, false);
  }));

test("jobs listed, retried and deleted; an agent drained", () =>
  withCluster(async (c, client) => {
    c.startAgent("a1", 2);
    await client.submitJob("tjr", [
      { id: "tjr-a", max_attempts: 1, steps: [{ exec: { argv: ["false"] } }] },
      { id: "tjr-b", depends_on: ["tjr-a"], steps: [{ builtin: { name: "noop" } }] },
    ]);
    await client.wait("tjr-b", 60_000);
    const failed: string[] = [];
    for await (const j of client.listJobs({ states: ["FAILED"] })) failed.push(j.id);
    assert.deepEqual(failed, ["tjr"]);
    assert.equal((await client.retryJob("tjr")).id, "tjr");
    assert.equal((await client.wait("tjr-a", 60_000)).attempt, 2);
    await client.wait("tjr-b", 60_000);
    assert.equal(Number((await client.deleteJob("tjr")).tasks_deleted), 2);
    await assert.rejects(client.getJob("tjr"), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.NOT_FOUND);

    await waitUntil(async () => (await client.clusterStats()).agents_active === 1, "a1 active");
    assert.equal((await client.drainAgent("a1")).state, "AGENT_STATE_DRAINING");
    const stats = await client.clusterStats();
    assert.deepEqual([stats.agents_active, stats.agents_draining, Number(stats.slots_total)], [0, 1, 2]);
    assert.equal((await client.undrainAgent("a1")).state, "AGENT_STATE_ACTIVE");
    await assert.rejects(client.drainAgent("nobody"), (e: unknown) => e instanceof TaskgridError && e.code === grpc.status.NOT_FOUND);
  }));
