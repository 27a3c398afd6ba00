// The examples of README.md, run as written: the package is found under
// its name (a node_modules beside the script), and the quick start's
// address is the test scheduler's.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { spawn, spawnSync } from "child_process";
import * as fs from "fs";
import * as path from "path";
import { Client, stateName } from "../src";
import { Cluster } from "./harness";

const PACKAGE = path.join(__dirname, "..", "..");
const README = path.join(PACKAGE, "README.md");

// The code of the fenced block after `marker`, and the lines of the next block.
function block(marker: string): { code: string; shown: string[] } {
  const lines = fs.readFileSync(README, "utf8").split("\n");
  const at = lines.indexOf(marker);
  assert.ok(at >= 0 && lines[at + 1].startsWith("```"), marker);
  const end = lines.indexOf("```", at + 2);
  let next = end + 1;
  while (!lines[next].startsWith("```")) next++;
  const nextEnd = lines.indexOf("```", next + 1);
  return { code: lines.slice(at + 2, end).join("\n") + "\n", shown: lines.slice(next + 1, nextEnd) };
}

// A script that requires the package by its name.
function script(c: Cluster, code: string): { file: string; env: NodeJS.ProcessEnv } {
  const modules = path.join(c.dir, "node_modules", "@taskgrid");
  fs.mkdirSync(modules, { recursive: true });
  if (!fs.existsSync(path.join(modules, "client"))) fs.symlinkSync(PACKAGE, path.join(modules, "client"));
  const file = path.join(c.dir, "example.js");
  fs.writeFileSync(file, code.replace(/127\.0\.0\.1:7070/g, c.addr));
  return { file, env: { ...process.env, NODE_PATH: path.join(c.dir, "node_modules") } };
}

test("the quickstart prints what the page shows", async () => {
  const c = new Cluster();
  try {
    await c.startScheduler();
    c.startAgent("a1", 1);
    const { code, shown } = block("<!-- runnable: ts-quickstart -->");
    assert.ok(code.trim().split("\n").length <= 5);
    const { file, env } = script(c, code);
    const res = spawnSync(process.execPath, [file], { env, encoding: "utf8", timeout: 120_000 });
    assert.equal(res.status, 0, res.stderr);
    assert.deepEqual(res.stdout.trim().split("\n"), shown);
  } finally {
    await c.close();
  }
});

test("the worker example runs the task the page submits", async () => {
  const c = new Cluster();
  const client = () => new Client(c.addr);
  try {
    await c.startScheduler();
    c.startAgent("a1", 1); // it must not take the worker's task
    const { code, shown } = block("<!-- runnable: ts-worker -->");
    const { file, env } = script(c, code);
    const worker = spawn(process.execPath, [file], { env, stdio: "inherit" });
    const exited = new Promise<number | null>((r) => worker.once("exit", (code) => r(code)));
    try {
      const submit = shown.filter((l) => l.startsWith("taskgridctl submit"));
      assert.equal(submit.length, 1);
      const args = submit[0].split(/\s+/).slice(1);
      const ctl = process.env.TASKGRID_CTL;
      assert.ok(ctl, "TASKGRID_CTL is not set");
      const res = spawnSync(ctl, [`--addr=${c.addr}`, ...args], { encoding: "utf8", timeout: 60_000 });
      assert.equal(res.status, 0, res.stderr);
      const id = args.find((a) => a.startsWith("--id="))!.slice("--id=".length);
      const cl = client();
      const task = await cl.wait(id, 60_000);
      cl.close();
      assert.equal(stateName(task.state), "SUCCEEDED");
      assert.equal(task.result!.stdout_tail.toString(), "resized a.png to 64");
      assert.notEqual(task.attempts[0].agent_id, "a1");
      assert.ok(shown.some((l) => l.includes("Stdout: resized a.png to 64")));
      worker.kill("SIGTERM");
      assert.equal(await exited, 0);
    } finally {
      if (worker.exitCode === null) worker.kill("SIGKILL");
    }
  } finally {
    await c.close();
  }
});
