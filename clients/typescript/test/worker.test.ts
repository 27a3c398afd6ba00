// Worker against a real scheduler (pull mode: no agent).
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { Client, PermanentError, Worker, stateName } from "../src";
import { Cluster, waitUntil } from "./harness";

const call = (id: string, argv: string[], extra: Record<string, unknown> = {}) => ({
  id,
  queue: "tsq",
  max_attempts: 1,
  steps: [{ exec: { argv } }],
  ...extra,
});

async function withCluster(fn: (client: Client) => Promise<void>): Promise<void> {
  const c = new Cluster();
  let client: Client | null = null;
  try {
    await c.startScheduler();
    client = new Client(c.addr);
    await fn(client);
  } finally {
    client?.close();
    await c.close();
  }
}

test("a function runs as a task and its value is the output", () =>
  withCluster(async (client) => {
    const w = new Worker(client, { queue: "tsq", owner: "w1" });
    w.task("resize", (p: string, size: string, ctx: { payload: Buffer }) => ({ p, size: Number(size), payload: ctx.payload.toString() }));
    await client.submit(call("r1", ["resize", "a.png", "64"], { payload: Buffer.from("pixels") }));
    const running = w.run({ maxTasks: 1 });
    const done = await client.wait("r1", 60_000);
    await running;
    assert.equal(stateName(done.state), "SUCCEEDED");
    assert.equal(done.result!.output!.toString(), '{"p":"a.png","size":64,"payload":"pixels"}');
    assert.equal(w.completed, 1);
  }));

test("a thrown error fails the attempt; a PermanentError ends it", () =>
  withCluster(async (client) => {
    const w = new Worker(client, { queue: "tsq", owner: "w2", concurrency: 2 });
    let doomedCalls = 0;
    w.task("flaky", () => {
      throw new Error("disk on fire");
    });
    w.task("doomed", () => {
      doomedCalls++;
      throw new PermanentError("bad input");
    });
    await client.submit(call("f1", ["flaky"], { max_attempts: 2 }));
    await client.submit(call("d1", ["doomed"], { max_attempts: 3 }));
    const running = w.run();
    try {
      const f1 = await client.wait("f1", 90_000);
      const d1 = await client.wait("d1", 90_000);
      assert.equal(stateName(f1.state), "FAILED");
      assert.equal(f1.attempts_used, 2);
      assert.match(f1.result!.error, /disk on fire/);
      assert.equal(stateName(d1.state), "FAILED");
      assert.equal(d1.attempts_used, 1);
      assert.equal(doomedCalls, 1);
    } finally {
      await w.stop();
      await running;
    }
  }));

test("a step without a function is put aside", () =>
  withCluster(async (client) => {
    const w = new Worker(client, { queue: "tsq", owner: "w3" });
    w.task("known", () => "ok");
    await client.submit(call("u1", ["unknown"]));
    const running = w.run();
    try {
      await waitUntil(async () => stateName((await client.get("u1")).state) === "TRASHED", "u1 to be trashed");
      assert.match((await client.get("u1")).reason, /no function for step "unknown"/);
    } finally {
      await w.stop();
      await running;
    }
  }));

test("the claim is extended while the function runs; stop abandons", () =>
  withCluster(async (client) => {
    const w = new Worker(client, { queue: "tsq", owner: "w4", leaseSeconds: 4 });
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    w.task("long", async () => {
      await released;
      return "finished";
    });
    await client.submit(call("l1", ["long"]));
    const running = w.run({ maxTasks: 1 });
    // Longer than the lease (an extension every lease/3).
    await waitUntil(() => w.extended >= 4, "four extensions");
    release();
    const done = await client.wait("l1", 60_000);
    await running;
    assert.equal(stateName(done.state), "SUCCEEDED");
    assert.equal(done.attempts_used, 1);

    const w2 = new Worker(client, { queue: "tsq", owner: "w5" });
    let started!: () => void;
    const isStarted = new Promise<void>((r) => (started = r));
    w2.task("slow", async () => {
      started();
      await new Promise(() => {}); // never returns by itself
    });
    await client.submit(call("s1", ["slow"]));
    const running2 = w2.run();
    await isStarted;
    await w2.stop();
    await running2;
    const s1 = await client.get("s1");
    assert.equal(stateName(s1.state), "PENDING"); // back on the board
    assert.equal(s1.attempts_used, 0); // not counted
  }));
