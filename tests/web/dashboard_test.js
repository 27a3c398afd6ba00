// The dashboard in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is downloaded). tests/system/web_test.py
// starts a real scheduler and agents, submits the work, and runs this with:
//
//   node dashboard_test.js plain|roles
//
//   TASKGRID_WEB_URL       the dashboard, e.g. http://127.0.0.1:PORT/
//   TASKGRID_WEB_MODULES   the node_modules holding playwright-core
//   TASKGRID_CTL           taskgridctl, with TASKGRID_CTL_ARGS (JSON list:
//                          --addr and TLS flags) for every call
//   TASKGRID_SCREENSHOTS   if set: a directory to write each page's PNG to
//   TASKGRID_READER_TOKEN, TASKGRID_ADMIN_TOKEN   (roles)
//
// plain: every page is loaded and checked against the API, and the page
// acts by clicks (pause a queue, retry a failed task, cancel a running one,
// retry a job, drain an agent), each change seen on the page and through
// taskgridctl; a task submitted meanwhile shows up by the timer's refresh.
// roles: the page asks for a token, a reader is refused an action (and
// nothing changes), an admin's same click goes through.
//
// Every wait is bounded; the browser is closed whatever happens. Prints
// "ok - STEP" per step; exits 1 on the first failure.
"use strict";

const assert = require("node:assert/strict");
const { execFileSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");
const os = require("node:os");

const { chromium } = require(path.join(process.env.TASKGRID_WEB_MODULES, "playwright-core"));

const MODE = process.argv[2];
const BASE = process.env.TASKGRID_WEB_URL;
const CTL = process.env.TASKGRID_CTL;
const CTL_ARGS = JSON.parse(process.env.TASKGRID_CTL_ARGS || "[]");
const SHOTS = process.env.TASKGRID_SCREENSHOTS || "";
const WAIT_MS = 20000;

function ctl(...args) {
  return execFileSync(CTL, [...CTL_ARGS, ...args], { encoding: "utf8", timeout: 30000 });
}
const ctlJson = (...args) => JSON.parse(ctl("--json", ...args));
const state = (s) => (s || "").replace(/^(TASK|JOB|AGENT)_STATE_/, "");

async function api(p, token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const res = await fetch(new URL(`api/v1/${p}`, BASE), { headers, signal: AbortSignal.timeout(WAIT_MS) });
  assert.equal(res.status, 200, `GET ${p}: ${res.status}`);
  return res.json();
}

// Polls f() until it returns a truthy value.
async function until(what, f, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await f();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

// axe-core's checks on the page as it stands: none of serious or critical
// impact may fail (WCAG 2 A and AA rules, best practices included).
const AXE = fs.readFileSync(path.join(process.env.TASKGRID_WEB_MODULES, "axe-core", "axe.min.js"), "utf8");
async function accessible(page, name) {
  // Evaluated through the debugging protocol, which the page's
  // Content-Security-Policy does not govern (it allows only its own files).
  if (!(await page.evaluate(() => typeof window.axe === "object"))) await page.evaluate(AXE);
  const found = await page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
      targets: v.nodes.slice(0, 3).map((n) => `${n.target.join(" ")}: ${(n.any[0] || n.all[0] || {}).message || ""}`) }));
  });
  return found.filter((v) => v.impact === "serious" || v.impact === "critical")
    .map((v) => `${name}: ${v.id} (${v.impact}): ${v.help}: ${v.targets.join(" | ")}`);
}

async function shot(page, name) {
  if (!SHOTS) return;
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: false });
}

async function step(name, f) {
  await f();
  console.log(`ok - ${name}`);
}

// Every confirmation the page asks: accepted, unless a step asks the next
// one to be dismissed; the questions are kept for the steps to check.
const dialogs = { asked: [], dismissNext: false };
function answerDialogs(page) {
  page.on("dialog", async (d) => {
    dialogs.asked.push(d.message());
    if (dialogs.dismissNext) {
      dialogs.dismissNext = false;
      await d.dismiss();
    } else {
      await d.accept();
    }
  });
}
const lastAsked = () => dialogs.asked[dialogs.asked.length - 1] || "";

const badgeOf = (page, scope) => page.locator(`${scope} .badge`).first().getAttribute("data-state");

async function plain(page) {
  await step("queues page shows each queue as the API does", async () => {
    await page.goto(`${BASE}#/queues`);
    await page.locator("table#queues").waitFor();
    const stats = await api("queues");
    assert.ok(stats.queues.length >= 3);
    for (const q of stats.queues) {
      const row = page.locator(`tr[data-queue="${q.queue}"]`);
      await row.waitFor();
      assert.equal((await row.locator("td").nth(1).textContent()).trim(), String(Number(q.length)), q.queue);
      const pending = Number((q.counts || {}).PENDING || 0);
      assert.equal((await row.locator('td[data-col="backlog"]').textContent()).trim(), String(pending), q.queue);
      const oldest = (await row.locator('td[data-col="oldest"]').textContent()).trim();
      assert.ok(pending ? /\d+ (s|min|h|d)/.test(oldest) : oldest === "—", `${q.queue} oldest: ${oldest}`);
    }
    // Each queue's last hour: what finished and failed, as the API counts it.
    await until("the last hour of every queue as the API has it", async () => {
      const now = await api("queues?history=true");
      for (const q of now.queues) {
        let done = 0, failed = 0;
        for (const m of q.history || []) {
          done += Number(m.succeeded || 0) + Number(m.failed || 0);
          failed += Number(m.failed || 0);
        }
        const shown = (await page.locator(`tr[data-queue="${q.queue}"] [data-field="hour"]`).textContent().catch(() => "")).trim();
        if (!shown.startsWith(`${done} done · ${failed} failed`)) return false;
      }
      return true;
    });
    // The failed task of "default" shows as a red bar.
    const hour = await api("queues?queue=default&history=true");
    assert.ok(hour.queues[0].history.some((m) => Number(m.failed || 0) > 0), JSON.stringify(hour));
    assert.ok(await page.locator('tr[data-queue="default"] svg.hour rect.bad').count() >= 1);
  });

  await step("a destructive action asks first, saying what it does; dismissed, nothing changes", async () => {
    const row = page.locator('tr[data-queue="emails"]');
    const asked = dialogs.asked.length;
    dialogs.dismissNext = true;
    await row.getByRole("button", { name: "Pause" }).click();
    await until("the question", () => dialogs.asked.length === asked + 1);
    assert.match(lastAsked(), /^Pause queue emails\? No task of it starts until it is resumed \(\d+ ready now\)/);
    // Nothing was sent: the button is still there, enabled, and the queue runs.
    assert.ok(await row.getByRole("button", { name: "Pause" }).isEnabled());
    assert.equal(await page.locator("#flash").isVisible(), false);
    const emails = ctlJson("stats").queues.find((q) => q.queue === "emails");
    assert.ok(!(emails.settings || {}).paused);
  });

  await step("pause a queue by its button: PAUSED on the page and in taskgridctl", async () => {
    const row = page.locator('tr[data-queue="emails"]');
    await row.getByRole("button", { name: "Pause" }).click();
    await page.locator("#flash.ok").filter({ hasText: "queue emails: paused" }).waitFor();
    await row.locator(".badge.s-PAUSED").waitFor();
    const emails = ctlJson("stats").queues.find((q) => q.queue === "emails");
    assert.equal(emails.settings.paused, true);
    await row.getByRole("button", { name: "Resume" }).waitFor();
    await shot(page, "queues");
  });

  await step("agents page shows each agent and the cluster; drain one by its button", async () => {
    await page.getByRole("link", { name: "Agents", exact: true }).click();
    await page.locator("table#agents").waitFor();
    const agents = (await api("agents")).agents;
    assert.equal(await page.locator("table#agents tbody tr").count(), agents.length);
    for (const a of agents) {
      const row = page.locator(`tr[data-agent="${a.id}"]`);
      assert.equal(await row.getAttribute("data-state"), state(a.state));
      assert.equal((await row.locator('td[data-col="slots"]').textContent()).trim(), `${a.slots_used}/${a.slots}`);
      // web-a offers cpu and memory (its tasks ask for none); the others offer nothing.
      assert.equal((await row.locator('td[data-col="resources"]').textContent()).trim(),
        a.id === "web-a" ? "cpu=0/2, memory=0/4GiB" : "—", a.id);
      const running = (await row.locator('td[data-col="running"]').textContent()).trim();
      assert.equal(running, (a.running || []).join(", ") || "—", a.id);
    }
    assert.ok((await api("agents")).agents.some((a) => (a.running || []).includes("long")));
    const cluster = await api("cluster");
    assert.ok((await page.locator("#cluster").textContent()).includes(`${Number(cluster.slots_used)} / ${Number(cluster.slots_total)}`));
    assert.ok((await page.locator("#cluster").textContent()).includes("cpu=0/2, memory=0/4GiB"));
    const row = page.locator('tr[data-agent="web-b"]');
    await row.getByRole("button", { name: "Drain" }).click();
    await page.locator("#flash.ok").filter({ hasText: "drain web-b: now DRAINING" }).waitFor();
    assert.match(lastAsked(), /^Drain agent web-b\? It takes no new task; the \d+ it runs finish there\.$/);
    await until("DRAINING on the page", async () => (await row.getAttribute("data-state")) === "DRAINING");
    assert.equal(state(ctlJson("agents").agents.find((a) => a.id === "web-b").state), "DRAINING");
    await shot(page, "agents");
  });

  // The tasks page without a filter, once it has replaced the filtered
  // one: a hash change renders after its fetch, and until then the old
  // form (with its filter) is still the one on the page.
  async function unfilteredTasks() {
    await page.goto(`${BASE}#/tasks`);
    await until("the unfiltered tasks page", async () =>
      (await page.locator("table#tasks").count()) === 1 &&
      (await page.locator('input[name="id"]').inputValue()) === "" &&
      (await page.locator('input[name="label"]').inputValue()) === "");
  }

  await step("tasks page lists what the API lists, and filters by state in the URL", async () => {
    await page.getByRole("link", { name: "Tasks", exact: true }).click();
    await until("the tasks hash", () => page.url().endsWith("#/tasks"));
    await page.locator("table#tasks").waitFor();
    // Newest first by default, with the count of every match.
    const rowIds = () => page.locator("table#tasks tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.task));
    const list = await api("tasks?page_size=50&newest_first=true");
    assert.deepEqual(await rowIds(), list.tasks.map((t) => t.spec.id));
    assert.ok(list.tasks.length >= 2);
    assert.ok(Date.parse(list.tasks[0].create_time) >= Date.parse(list.tasks[list.tasks.length - 1].create_time));
    assert.match(await page.locator("#task-count").textContent(), new RegExp(`^${Number(list.total_size)} tasks match`));
    // Nothing a page leaves out shows as a word.
    assert.doesNotMatch(await page.locator("#main").innerText(), /\b(null|undefined)\b/);
    // Oldest first, and by id prefix: what the API lists the same way.
    await page.locator('select[name="order"]').selectOption("oldest");
    await page.locator('input[name="id"]').fill("b1-");
    await page.getByRole("button", { name: "Filter" }).click();
    await until("the prefix and order in the URL", () => page.url().includes("id=b1-") && page.url().includes("order=oldest"));
    const b1 = await api("tasks?id_prefix=b1-");
    assert.equal(Number(b1.total_size), 5);
    await until("only b1- tasks, oldest first", async () =>
      JSON.stringify(await rowIds()) === JSON.stringify(b1.tasks.map((t) => t.spec.id)));
    assert.match(await page.locator("#task-count").textContent(), /^5 tasks match · 5 on this page · oldest first/);
    // By label: what the API finds; the task page links each label back to its search.
    await unfilteredTasks();
    await page.locator('input[name="label"]').fill("team=web");
    await page.getByRole("button", { name: "Filter" }).click();
    await until("the label in the URL", () => page.url().includes("label=team%3Dweb"));
    const web = await api("tasks?label=team%3Dweb&newest_first=true");
    assert.deepEqual(web.tasks.map((t) => t.spec.id).sort(), ["b1-lint", "hello"]);
    await until("only the labelled tasks", async () =>
      JSON.stringify(await rowIds()) === JSON.stringify(web.tasks.map((t) => t.spec.id)));
    assert.match(await page.locator("#task-count").textContent(), /^2 tasks match/);
    await page.locator('tr[data-task="hello"] a').first().click();
    const labels = page.locator('[data-field="labels"]');
    await labels.waitFor();
    assert.equal(await labels.innerText(), "kind=greeting, team=web");
    await labels.getByRole("link", { name: "kind=greeting" }).click();
    await until("the one greeting", async () => JSON.stringify(await rowIds()) === '["hello"]');
    await unfilteredTasks();
    // Several states at once.
    await page.locator('select[name="state"]').selectOption(["FAILED", "CANCELLED"]);
    await page.getByRole("button", { name: "Filter" }).click();
    await until("the filter in the URL", () => page.url().includes("state=FAILED%2CCANCELLED"));
    const ended = [...ctlJson("list", "--state=failed").tasks, ...(ctlJson("list", "--state=cancelled").tasks || [])]
      .map((t) => t.spec.id);
    await until("only FAILED and CANCELLED rows", async () => {
      const rows = await page.locator("table#tasks tbody tr").evaluateAll((rs) => rs.map((r) => [r.dataset.task, r.dataset.state]));
      return rows.length === ended.length && rows.every(([id, s]) => ["FAILED", "CANCELLED"].includes(s) && ended.includes(id));
    });
    // The state of the page is in its URL: a reload (a shared link) shows the same.
    await page.reload();
    await page.locator("table#tasks").waitFor();
    assert.deepEqual(await page.locator('select[name="state"]').evaluate((e) => [...e.selectedOptions].map((o) => o.value)),
      ["FAILED", "CANCELLED"]);
    await page.goto(`${BASE}#/tasks`);
    await page.locator("table#tasks").waitFor();
    await shot(page, "tasks");
  });

  await step("bulk cancel, retry and delete what a filter selects, each after saying how many", async () => {
    const later = new Date(Date.now() + 3600e3).toISOString().replace(/\.\d+Z$/, "Z");
    for (const i of [1, 2, 3]) ctl("submit", `--id=bulk-${i}`, "--queue=bulk", `--not_before=${later}`, "--", "/bin/true");
    const states = () => [1, 2, 3].map((i) => state(ctlJson("get", `bulk-${i}`).state));
    const bulkButton = (what) => page.locator(`#bulk [data-action="bulk-${what}"]`);
    await page.goto(`${BASE}#/tasks?queue=bulk`);
    await until("Cancel 3", async () => (await bulkButton("cancel").textContent()) === "Cancel 3");
    assert.ok(await bulkButton("retry").isDisabled(), "nothing to retry yet");
    await bulkButton("cancel").click();
    await page.locator("#flash.ok").filter({ hasText: "cancelled 3 tasks" }).waitFor();
    assert.match(lastAsked(), /^Cancel the 3 tasks of queue bulk in state SCHEDULED, .*\? Running ones are stopped/);
    assert.deepEqual(states(), ["CANCELLED", "CANCELLED", "CANCELLED"]);
    // With a state filter, only those: retried, they wait for their not_before again.
    await page.goto(`${BASE}#/tasks?queue=bulk&state=CANCELLED`);
    await until("Retry 3", async () => (await bulkButton("retry").textContent()) === "Retry 3");
    assert.ok(await bulkButton("cancel").isDisabled(), "a CANCELLED task cannot be cancelled");
    await bulkButton("retry").click();
    await page.locator("#flash.ok").filter({ hasText: "retried 3 tasks" }).waitFor();
    assert.deepEqual(states(), ["SCHEDULED", "SCHEDULED", "SCHEDULED"]);
    await page.goto(`${BASE}#/tasks?queue=bulk`);
    await until("Cancel 3 again", async () => (await bulkButton("cancel").textContent()) === "Cancel 3");
    await bulkButton("cancel").click();
    await page.locator("#flash.ok").filter({ hasText: "cancelled 3 tasks" }).waitFor();
    await until("Delete 3", async () => (await bulkButton("delete").textContent()) === "Delete 3");
    await bulkButton("delete").click();
    await page.locator("#flash.ok").filter({ hasText: "deleted 3 tasks" }).waitFor();
    assert.match(lastAsked(), /^Delete the 3 tasks of queue bulk in state .*\? Their records, attempts and output are removed/);
    assert.equal((ctlJson("list", "--queue=bulk").tasks || []).length, 0);
    await page.goto(`${BASE}#/tasks`);
    await page.locator("table#tasks").waitFor();
  });

  await step("a task page shows its spec, state, reason, attempts and result", async () => {
    await page.locator('tr[data-task="flaky"] a').first().click();
    await until("the task's hash", () => page.url().endsWith("#/task/flaky"));
    await page.locator("#facts").waitFor();
    const t = ctlJson("get", "flaky");
    assert.equal(await badgeOf(page, "h1"), state(t.state));
    assert.equal(state(t.state), "FAILED");
    assert.ok((await page.locator("#facts").textContent()).includes(t.reason));
    assert.equal((await page.locator('[data-field="exit_code"]').textContent()).trim(), "3");
    assert.ok((await page.locator('.panel pre[data-tail="stderr"]').textContent()).includes("no input yet"));
    assert.ok((await page.locator('.panel pre[data-tail="stdout"]').textContent()).includes("trying flaky attempt 1"));
    assert.equal(await page.locator("#attempts tbody tr").count(), t.attempts.length);
    assert.ok((await page.locator("pre.json").textContent()).includes('"non_retryable_exit_codes"'));
  });

  await step("retry a failed task by its button: a new attempt, on the page and in taskgridctl", async () => {
    const before = ctlJson("get", "flaky").attempt;
    await page.getByRole("button", { name: "Retry" }).click();
    await page.locator("#flash.ok").filter({ hasText: "retry flaky" }).waitFor();
    const after = await until("attempt 2 to end", () => {
      const t = ctlJson("get", "flaky");
      return t.attempt > before && state(t.state) === "FAILED" && t;
    });
    await until("two attempts on the page", async () => (await page.locator("#attempts tbody tr").count()) === after.attempts.length);
    assert.equal(after.attempts.length, 2);
    // Every attempt's output, not only the last: unfolded, it stays so
    // through the page's refreshes.
    for (const n of [1, 2]) {
      const out = page.locator(`#attempts details[data-output="${n}"]`);
      await out.locator("summary").click();
      await out.locator('pre[data-tail="stdout"]').filter({ hasText: `trying flaky attempt ${n}` }).waitFor();
    }
    const refreshed = await page.locator("#updated").textContent();
    await until("a refresh", async () => (await page.locator("#updated").textContent()) !== refreshed, 10000);
    assert.equal(await page.locator("#attempts details[data-output]:not([open])").count(), 0);
    // The keyboard focus and the scroll position survive a refresh too.
    // (Once the retry's message is gone: its going would move the page.)
    await page.locator("#flash").waitFor({ state: "hidden" });
    await page.locator('#attempts details[data-output="1"] summary').focus();
    await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
    const scrolled = await page.evaluate(() => window.scrollY);
    assert.ok(scrolled > 0, "the page is taller than the window");
    const shown = await page.locator("#updated").textContent();
    await until("another refresh", async () => (await page.locator("#updated").textContent()) !== shown, 10000);
    assert.equal(await page.evaluate(() => window.scrollY), scrolled);
    assert.ok(await page.evaluate(() => document.activeElement.tagName === "SUMMARY" &&
      document.activeElement.closest("details").dataset.output === "1"), "focus kept");
    await shot(page, "task");
  });

  await step("a running task's page shows its output live, as it grows", async () => {
    ctl("submit", "--id=ticker", "--queue=live", "--", "/bin/sh", "-c",
      "i=0; while [ $i -lt 120 ]; do i=$((i+1)); echo tick $i; echo warn $i >&2; sleep 0.5; done");
    await page.goto(`${BASE}#/task/ticker`);
    const out = page.locator('#live-output pre[data-live="stdout"]');
    const ticks = async () => {
      const m = (await out.textContent().catch(() => "")).match(/tick (\d+)\n?$/);
      return m ? Number(m[1]) : 0;
    };
    await until("the first ticks on the page", async () => (await ticks()) >= 2);
    const first = await ticks();
    // More comes without a reload, the same lines logs would show.
    await until("later ticks", async () => (await ticks()) >= first + 3);
    assert.match(await page.locator('#live-output pre[data-live="stderr"]').textContent(), /warn 1\n/);
    assert.match(await page.locator("#live-output").textContent(), /attempt 1 on web-[ab]/);
    await shot(page, "live-output");
    ctl("cancel", "ticker");
    await until("no live panel once it ended", async () =>
      (await badgeOf(page, "h1")) === "CANCELLED" && (await page.locator("#live-output").count()) === 0);
  });

  await step("cancel a running task by its button", async () => {
    await page.goto(`${BASE}#/task/long`);
    await until("long to run", async () => (await badgeOf(page, "h1")) === "RUNNING");
    await page.getByRole("button", { name: "Cancel" }).click();
    await page.locator("#flash.ok").filter({ hasText: "cancel long" }).waitFor();
    assert.equal(lastAsked(), "Cancel task long? Its running attempt is stopped. It ends CANCELLED.");
    await until("CANCELLED on the page", async () => (await badgeOf(page, "h1")) === "CANCELLED");
    assert.equal(state(ctlJson("get", "long").state), "CANCELLED");
  });

  await step("delete a finished task by its button", async () => {
    await page.goto(`${BASE}#/task/long`);
    await until("long CANCELLED", async () => (await badgeOf(page, "h1")) === "CANCELLED");
    await page.getByRole("button", { name: "Delete" }).click();
    await page.locator("#flash.ok").filter({ hasText: "deleted long" }).waitFor();
    assert.equal(lastAsked(), "Delete task long for good? Its record, attempts and output are removed.");
    await until("back on its queue's task list", async () => page.url().includes("#/tasks"));
    let refused;
    try {
      ctl("get", "long");
    } catch (e) {
      refused = e;
    }
    assert.ok(refused, "get of a deleted task fails");
    assert.match(String(refused.stderr), /NOT_FOUND/);
  });

  await step("a task submitted meanwhile appears by the timer's refresh", async () => {
    await page.goto(`${BASE}#/tasks?queue=late`);
    await page.locator(".empty").waitFor();
    ctl("submit", "--id=late-1", "--queue=late", "--builtin=echo", "--", "late");
    await page.locator('tr[data-task="late-1"]').waitFor({ timeout: 10000 });
  });

  await step("jobs page and a job's DAG match the API", async () => {
    await page.getByRole("link", { name: "Jobs", exact: true }).click();
    await page.locator('tr[data-job="build-1"]').waitFor();
    await shot(page, "jobs");
    const job = await api("jobs/build-1");
    assert.equal(await badgeOf(page, 'tr[data-job="build-1"]'), state(job.state));
    await page.locator('tr[data-job="build-1"] a').first().click();
    await until("the job's hash", () => page.url().endsWith("#/job/build-1"));
    await page.locator("#dag svg").waitFor();
    const tasks = (await api("tasks?job=build-1&page_size=1000")).tasks;
    assert.equal(await page.locator("#dag .node").count(), tasks.length);
    for (const t of tasks) {
      assert.equal(await page.locator(`#dag .node[data-task="${t.spec.id}"]`).getAttribute("data-state"), state(t.state), t.spec.id);
    }
    const deps = tasks.reduce((n, t) => n + (t.spec.depends_on || []).length, 0);
    assert.equal(await page.locator("#dag path.edge").count(), deps);
    assert.equal(await page.locator('#dag path.edge[data-from="b1-fetch"][data-to="b1-compile"]').count(), 1);
    await shot(page, "job");
    // Zoom: in by a quarter, fitted to the box's width, back to 100 %; a
    // refresh keeps the setting.
    const svg = page.locator("#dag svg");
    const width = async () => Number(await svg.getAttribute("width"));
    const natural = await width();
    await page.locator('#dag-zoom [data-action="zoom-in"]').click();
    await until("125 %", async () => (await width()) === Math.round(natural * 1.25));
    assert.equal((await page.locator("#dag-zoom-level").textContent()).trim(), "125 %");
    await page.locator('#dag-zoom [data-action="fit"]').click();
    const box = await page.locator("#dag").evaluate((e) => e.clientWidth - 16);
    await until("fitted to the width", async () => Math.abs((await width()) - box) <= 1);
    const shown = await page.locator("#updated").textContent();
    await until("a refresh", async () => (await page.locator("#updated").textContent()) !== shown, 10000);
    await until("still fitted", async () => Math.abs((await width()) - box) <= 1);
    await page.locator('#dag-zoom [data-action="actual"]').click();
    await until("100 %", async () => (await width()) === natural);
  });

  await step("retry a failed job by its button", async () => {
    assert.equal(state((await api("jobs/build-1")).state), "FAILED");
    await page.getByRole("button", { name: "Retry" }).click();
    await page.locator("#flash.ok").filter({ hasText: "retry job build-1" }).waitFor();
    // b1-lint runs again (and fails again): its attempt number grows.
    await until("b1-lint's second attempt", () => ctlJson("get", "b1-lint").attempt >= 2);
  });

  await step("schedules page shows each schedule as the API does; pause and resume by buttons", async () => {
    ctl("schedule", "create", "web-beat", "--every=1h", "--queue=emails", "--", "/bin/true");
    ctl("schedule", "create", "web-nightly", "--cron=0 3 * * *", "--tz=Europe/Berlin", "--paused",
      "--", "/bin/true");
    await page.goto(`${BASE}#/schedules`);
    await page.locator("table#schedules").waitFor();
    const listed = await until("both schedules in the API", async () => {
      const res = await fetch(new URL("api/v1/ScheduleService/ListSchedules", BASE), {
        method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
        signal: AbortSignal.timeout(WAIT_MS) });
      const body = await res.json();
      return (body.schedules || []).length >= 2 && body.schedules;
    });
    for (const x of listed) {
      const row = page.locator(`tr[data-schedule="${x.id}"]`);
      await row.waitFor();
      assert.equal(await row.getAttribute("data-state"), x.paused ? "PAUSED" : "ACTIVE", x.id);
      assert.equal((await row.locator('td[data-col="fires"]').textContent()).trim(), String(Number(x.fire_count || 0)), x.id);
      assert.equal((await row.locator('td[data-col="skipped"]').textContent()).trim(), String(Number(x.skipped_fires || 0)), x.id);
      const next = (await row.locator('td[data-col="next"]').textContent()).trim();
      // An active schedule's next fire is ahead; a paused one has none.
      assert.ok(x.paused ? next === "—" : /\(in \d+ (s|min|h|d)/.test(next), `${x.id} next: ${next}`);
    }
    const beat = page.locator('tr[data-schedule="web-beat"]');
    assert.match(await beat.locator("td").nth(1).textContent(), /every 3600s/);
    await beat.getByRole("button", { name: "Pause" }).click();
    await page.locator("#flash.ok").filter({ hasText: "schedule web-beat: paused" }).waitFor();
    await beat.locator(".badge.s-PAUSED").waitFor();
    assert.equal(ctlJson("schedule", "get", "web-beat").paused, true);
    const nightly = page.locator('tr[data-schedule="web-nightly"]');
    assert.match(await nightly.locator("td").nth(1).textContent(), /0 3 \* \* \* \(Europe\/Berlin\)/);
    await nightly.getByRole("button", { name: "Resume" }).click();
    await page.locator("#flash.ok").filter({ hasText: "schedule web-nightly: active" }).waitFor();
    await until("web-nightly active on the page", async () =>
      (await nightly.getAttribute("data-state")) === "ACTIVE");
    assert.ok(!ctlJson("schedule", "get", "web-nightly").paused);
    await shot(page, "schedules");
  });

  await step("times name their zone; the header switches them between local and UTC", async () => {
    // The browser runs in Europe/Berlin (main): web-nightly fires at 03:00
    // there, which is 02:00 UTC in winter (GMT+1), 01:00 in summer (GMT+2).
    await page.goto(`${BASE}#/schedules`);
    const next = page.locator('tr[data-schedule="web-nightly"] td[data-col="next"]');
    const local = await until("the local time", async () =>
      (await next.textContent()).match(/ 03:00:00 GMT\+([12]) \(in /));
    assert.match((await page.locator("#zone").textContent()).trim(), /^Times: local \(GMT\+[12]\)$/);
    await page.locator("#zone").click();
    const utc = new RegExp(` 0${3 - Number(local[1])}:00:00 UTC \\(in `);
    await until("the UTC time", async () => utc.test(await next.textContent()));
    assert.equal((await page.locator("#zone").textContent()).trim(), "Times: UTC");
    assert.match(await page.locator("#updated").textContent(), / UTC/);
    await page.locator("#zone").click();
    await until("local again", async () => / 03:00:00 GMT\+[12] /.test(await next.textContent()));
  });

  await step("every page passes axe-core's serious and critical checks", async () => {
    const failures = [];
    for (const [name, hash, ready] of [
      ["queues", "#/queues", "table#queues"], ["tasks", "#/tasks", "table#tasks"],
      ["a task", "#/task/flaky", "#facts"], ["jobs", "#/jobs", "table#jobs"],
      ["a job", "#/job/build-1", "#dag"], ["schedules", "#/schedules", "table#schedules"],
      ["agents", "#/agents", "table#agents"]]) {
      await page.goto(`${BASE}${hash}`);
      await page.locator(ready).waitFor();
      failures.push(...(await accessible(page, name)));
    }
    assert.deepEqual(failures, []);
  });

  await step("every page is reachable by a link", async () => {
    await page.goto(`${BASE}#/queues`);
    await page.locator('tr[data-queue="emails"] a').first().click();
    await until("the queue's tasks", () => page.url().includes("#/tasks?queue=emails"));
    await page.locator('tr[data-task] a').first().waitFor();
    for (const [name, hash] of [["Queues", "#/queues"], ["Jobs", "#/jobs"], ["Schedules", "#/schedules"], ["Agents", "#/agents"], ["Tasks", "#/tasks"]]) {
      await page.getByRole("link", { name, exact: true }).click();
      await until(`${name} in the URL`, () => page.url().endsWith(hash));
      await page.locator("main h1").filter({ hasText: name }).waitFor();
    }
  });
}

async function roles(page) {
  await step("the page asks for a token", async () => {
    await page.goto(`${BASE}#/task/guarded`);
    await page.locator("#signin").waitFor({ state: "visible" });
    assert.deepEqual(await accessible(page, "the token form"), []);
    await shot(page, "signin");
    await page.locator("#token").fill(process.env.TASKGRID_READER_TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.locator("#facts").waitFor();
    assert.ok(await page.locator("#signin").isHidden());
  });

  await step("a reader is refused an action, and nothing changes", async () => {
    const before = state(ctlJson("get", "guarded").state);
    await page.getByRole("button", { name: "Cancel" }).click();
    const refused = page.locator("#flash.err");
    await refused.waitFor();
    const text = await refused.textContent();
    assert.ok(text.includes("PERMISSION_DENIED") && text.includes("needs role submitter"), text);
    await shot(page, "refused");
    assert.equal(state(ctlJson("get", "guarded").state), before);
    assert.notEqual(before, "CANCELLED");
  });

  await step("an admin's same click goes through", async () => {
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#signin").waitFor({ state: "visible" });
    await page.locator("#token").fill(process.env.TASKGRID_ADMIN_TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.locator("#facts").waitFor();
    await page.getByRole("button", { name: "Cancel" }).click();
    await page.locator("#flash.ok").filter({ hasText: "cancel guarded" }).waitFor();
    await until("guarded to end CANCELLED", () => state(ctlJson("get", "guarded").state) === "CANCELLED");
  });
}

async function main() {
  // A fresh profile each run. Without the flags below Chromium's own
  // background connections fail on a closed network (and slow every start).
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "taskgrid-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    timeout: 30000,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 820 },
    timezoneId: "Europe/Berlin",  // not UTC, so local and UTC times differ
    ignoreHTTPSErrors: true,
  });
  let failed = false;
  try {
    const page = context.pages()[0] || (await context.newPage());
    page.setDefaultTimeout(WAIT_MS);
    page.on("pageerror", (e) => { console.log(`page error: ${e.message}`); failed = true; });
    answerDialogs(page);
    if (MODE === "plain") await plain(page);
    else if (MODE === "roles") await roles(page);
    else throw new Error(`unknown mode ${MODE}: plain or roles`);
    assert.ok(!failed, "the page threw an error (above)");
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().then(() => console.log(`${MODE}: all steps passed`), (e) => {
  console.log(`not ok - ${e.stack || e}`);
  process.exitCode = 1;
});
