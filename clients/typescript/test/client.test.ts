// Client against a real scheduler and agent.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as net from "net";
import * as grpc from "@grpc/grpc-js";
import { Client, TaskgridError, stateName } from "../src";
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
