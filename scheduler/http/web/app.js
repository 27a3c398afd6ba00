// The Taskgrid dashboard: one page, hash routes, the JSON API under
// /api/v1/ (the gRPC messages with their proto field names). Plain modern
// JavaScript, no framework. Every text from the API goes into the page as
// text (never as HTML). The page refreshes on a timer while it is visible.
"use strict";

(() => {
  const REFRESH_MS = 3000;
  const TOKEN_KEY = "taskgrid.token";
  const TASK_STATES = ["SCHEDULED", "BLOCKED", "PENDING", "DISPATCHED", "RUNNING", "CANCELLING",
    "PAUSED", "SUCCEEDED", "FAILED", "CANCELLED", "TRASHED"];
  const JOB_STATES = ["RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "TRASHED"]);

  // ---- DOM helpers ----
  function h(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else if (k === "class") n.className = v;
      else if (v === true) n.setAttribute(k, "");
      else n.setAttribute(k, v);
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      n.append(c instanceof Node ? c : String(c));
    }
    return n;
  }
  const $ = (sel) => document.querySelector(sel);

  // ---- names and values as the API gives them ----
  const taskState = (s) => (s || "").replace(/^TASK_STATE_/, "");
  const jobState = (s) => (s || "").replace(/^JOB_STATE_/, "");
  const agentState = (s) => (s || "").replace(/^AGENT_STATE_/, "");
  const outcome = (s) => (s || "").replace(/^OUTCOME_/, "");
  const num = (v) => Number(v || 0);

  function badge(state, href) {
    const attrs = { class: `badge s-${state}`, "data-state": state };
    return href ? h("a", { ...attrs, href }, state) : h("span", attrs, state);
  }

  // Times in this browser's zone (the default) or in UTC, as the header's
  // switch says (kept in local storage); every time names its zone.
  const ZONE_KEY = "taskgrid.zone";
  const inUtc = () => localStorage.getItem(ZONE_KEY) === "utc";
  function zoneName(d) {
    const part = new Intl.DateTimeFormat("en-US", { timeZoneName: "short" })
      .formatToParts(d).find((p) => p.type === "timeZoneName");
    return part ? part.value : "local";
  }
  function when(ts) {
    if (!ts) return "—";
    const d = new Date(ts);
    const pad = (n) => String(n).padStart(2, "0");
    const u = inUtc();
    const [y, mo, da, ho, mi, se] = u
      ? [d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()]
      : [d.getFullYear(), d.getMonth(), d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()];
    return `${y}-${pad(mo + 1)}-${pad(da)} ${pad(ho)}:${pad(mi)}:${pad(se)} ${u ? "UTC" : zoneName(d)}`;
  }
  function renderZone() {
    $("#zone").textContent = inUtc() ? "Times: UTC" : `Times: local (${zoneName(new Date())})`;
  }

  function age(seconds) {
    if (seconds < 0) seconds = 0;
    if (seconds < 60) return `${Math.floor(seconds)} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
    return `${Math.floor(seconds / 86400)} d ${Math.floor((seconds % 86400) / 3600)} h`;
  }
  const since = (ts) => (ts ? age((Date.now() - new Date(ts).getTime()) / 1000) : "—");
  const ago = (ts) => (ts ? `${since(ts)} ago` : "—");

  // bytes (base64 in proto3 JSON): the bytes, and as text
  function bytes64(b64) {
    const bin = b64 ? atob(b64) : "";
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return bytes;
  }
  const text64 = (b64) => new TextDecoder().decode(bytes64(b64));

  function link(route, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v) q.set(k, v);
    const s = q.toString();
    return `#/${route}${s ? "?" + s : ""}`;
  }
  const taskLink = (id) => `#/task/${encodeURIComponent(id)}`;
  const jobLink = (id) => `#/job/${encodeURIComponent(id)}`;

  // ---- the API ----
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, { method = "GET", query, body } = {}) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    // An action carries the header a form of another site cannot send.
    if (method === "POST") headers["X-Taskgrid-Request"] = "1";
    let url = `api/v1/${path}`;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        // An array is a repeated parameter (label=a=1&label=b=2).
        if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
        else if (v !== undefined && v !== "") q.set(k, v);
      }
      if (q.toString()) url += `?${q}`;
    }
    let res;
    try {
      res = await fetch(url, { method, headers, cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      // The scheduler is down or restarting; the timer tries again.
      throw new ApiError(0, "UNAVAILABLE", `the scheduler did not answer (${e.message})`);
    }
    let answer = null;
    try {
      answer = await res.json();
    } catch (e) {
      answer = null;
    }
    if (!res.ok) {
      const err = new ApiError(res.status, answer && answer.code ? answer.code : `HTTP ${res.status}`,
        answer && answer.message ? answer.message : res.statusText);
      if (res.status === 401) showSignIn(err.message);
      throw err;
    }
    return answer;
  }

  // ---- session: the token, kept in this tab only ----
  function showSignIn(message) {
    const form = $("#signin");
    form.hidden = false;
    $("#signin-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? message : "";
    if (document.activeElement !== $("#token")) $("#token").focus();
  }

  function renderSession() {
    const s = $("#session");
    s.replaceChildren();
    if (sessionStorage.getItem(TOKEN_KEY)) {
      s.append("signed in with a token",
        h("button", { type: "button", onclick: () => {
          sessionStorage.removeItem(TOKEN_KEY);
          renderSession();
          refresh();
        } }, "Sign out"));
    }
  }

  // ---- messages after an action ----
  let flashTimer = null;
  function flash(message, ok) {
    const f = $("#flash");
    f.textContent = message;
    f.className = ok ? "ok" : "err";
    f.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { f.hidden = true; }, ok ? 6000 : 15000);
  }

  // Runs an action (a POST), says how it went, and refreshes the page.
  // `then`, if given, runs after a success instead of the refresh (a
  // delete leaves nothing to refresh).
  async function act(what, path, describe, then, body) {
    try {
      const result = await api(path, { method: "POST", body });
      flash(`${what}: ${describe(result)}`, true);
      if (then) return then(result);
    } catch (e) {
      flash(`${what} refused: ${e.code}: ${e.message}`, false);
    }
    await refresh();
  }

  // A button that POSTs `path`. opts: danger (styled as such), confirm (a
  // question the user must accept first: every destructive action has
  // one, saying what it changes), then (see act), body (JSON to send).
  function actionButton(label, enabled, what, path, describe, opts = {}) {
    return h("button", { type: "button", class: opts.danger ? "danger" : undefined, disabled: !enabled,
      "data-action": label.toLowerCase(), onclick: (ev) => {
        if (opts.confirm && !window.confirm(opts.confirm)) return;  // nothing sent
        ev.target.disabled = true;
        act(what, path, describe, opts.then, opts.body);
      } }, label);
  }

  // ---- routing: the whole state of a page is in the hash ----
  function route() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, query] = hash.split("?");
    const parts = path.split("/").map(decodeURIComponent);
    return { name: parts[0] || "queues", arg: parts[1] || "", params: new URLSearchParams(query || "") };
  }

  function stateChips(counts, order, hrefOf) {
    const entries = order.filter((s) => num(counts && counts[s]) > 0);
    if (!entries.length) return h("span", { class: "muted" }, "none");
    return h("div", { class: "chips" }, entries.map((s) => h("a", {
      class: `chip s-${s} s-any`, href: hrefOf ? hrefOf(s) : undefined, "data-state": s,
    }, s, " ", h("b", {}, num(counts[s])))));
  }

  // ---- pages ----
  async function queuesPage() {
    const [stats, cluster] = await Promise.all([api("queues", { query: { history: "true" } }), api("cluster")]);
    const queues = stats.queues || [];
    const tasks = cluster.tasks || {};
    const cards = h("div", { class: "cards" },
      card("Queues", queues.length),
      card("Pending", num(tasks.PENDING), "ready, waiting for a slot"),
      card("Running", num(tasks.RUNNING) + num(tasks.DISPATCHED)),
      card("Failed", num(tasks.FAILED)),
      card("Agents", cluster.agents_active, `${num(cluster.slots_used)} of ${num(cluster.slots_total)} slots used`));
    if (!queues.length) {
      return [h("h1", {}, "Queues"), cards, h("div", { class: "empty" }, "No queue holds tasks yet.")];
    }
    const rows = queues.map((q) => {
      const s = q.settings || {};
      const controls = [];
      if (s.paused) controls.push(h("span", { class: "badge s-PAUSED" }, "PAUSED"));
      if (s.max_concurrency) controls.push(h("span", { class: "chip" }, `${s.max_concurrency} at once`));
      if (s.rate_per_second) controls.push(h("span", { class: "chip" }, `${s.rate_per_second}/s burst ${s.burst || Math.max(1, s.rate_per_second)}`));
      if (s.quota && Object.keys(s.quota).length) controls.push(h("span", { class: "chip" }, `quota ${resourcesText(q.resources_held, s.quota)}`));
      if (s.weight !== undefined) controls.push(h("span", { class: "chip" }, `weight ${s.weight}`));
      if (q.fair_share) controls.push(h("span", { class: "chip" }, `share ${Math.round(100 * (q.share || 0))}% of ${Math.round(100 * q.fair_share)}%`));
      if (q.held) controls.push(h("span", { class: "chip" }, "holding"));
      const kept = (d) => (d === "0s" ? "forever" : d);
      if (s.retention) controls.push(h("span", { class: "chip" }, `keeps ${kept(s.retention)}`));
      if (s.failed_retention) controls.push(h("span", { class: "chip" }, `keeps failed ${kept(s.failed_retention)}`));
      const pending = num(q.counts && q.counts.PENDING);
      return h("tr", { "data-queue": q.queue },
        h("td", {}, h("a", { href: link("tasks", { queue: q.queue }) }, q.queue)),
        h("td", { class: "num" }, num(q.length)),
        h("td", { class: "num" }, num(q.max_length) || "—"),
        h("td", {}, stateChips(q.counts, TASK_STATES, (st) => link("tasks", { queue: q.queue, state: st }))),
        h("td", { class: "num", "data-col": "backlog" }, pending),
        h("td", { "data-col": "oldest" }, q.oldest_pending_time ? since(q.oldest_pending_time) : "—"),
        h("td", { "data-col": "hour" }, hourChart(q)),
        h("td", {}, controls.length ? h("div", { class: "chips" }, controls) : h("span", { class: "muted" }, "running")),
        h("td", {}, h("div", { class: "actions" },
          s.paused
            ? actionButton("Resume", true, `queue ${q.queue}`, `queues/${encodeURIComponent(q.queue)}/resume`,
              (r) => (r.settings && r.settings.paused ? "paused" : "resumed"))
            : actionButton("Pause", true, `queue ${q.queue}`, `queues/${encodeURIComponent(q.queue)}/pause`,
              (r) => (r.settings && r.settings.paused ? "paused" : "running"),
              { confirm: `Pause queue ${q.queue}? No task of it starts until it is resumed (${num(q.counts && q.counts.PENDING)} ready now); running ones go on.` }))));
    });
    return [h("h1", {}, "Queues"), cards,
      h("table", { class: "list", id: "queues" },
        h("thead", {}, h("tr", {}, h("th", {}, "Queue"), h("th", { class: "num" }, "Length"),
          h("th", { class: "num" }, "Max"), h("th", {}, "Tasks by state"), h("th", { class: "num" }, "Backlog"),
          h("th", {}, "Oldest pending"), h("th", {}, "Last hour"), h("th", {}, "Controls"), h("th", {}, ""))),
        h("tbody", {}, rows))];
  }

  // A queue's last hour, a bar a minute: tasks finished (succeeded, and
  // failed in red on top), with the totals and the failure rate in words.
  const SVG = "http://www.w3.org/2000/svg";
  function hourChart(q) {
    const minutes = q.history || [];
    if (!minutes.length) return h("span", { class: "muted" }, "—");
    let done = 0, failed = 0, submitted = 0, peak = 1;
    for (const m of minutes) {
      done += num(m.succeeded) + num(m.failed);
      failed += num(m.failed);
      submitted += num(m.submitted);
      peak = Math.max(peak, num(m.succeeded) + num(m.failed));
    }
    const W = 120, H = 28, bar = W / 60;
    const now = Date.now();
    const svg = document.createElementNS(SVG, "svg");
    const words = `${done} finished, ${failed} failed${done ? ` (${Math.round((100 * failed) / done)}%)` : ""}, ${submitted} submitted in the last hour`;
    for (const [k, v] of Object.entries({ width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "hour", role: "img", "aria-label": words })) {
      svg.setAttribute(k, v);
    }
    const rect = (x, y, width, height, cls) => {
      const r = document.createElementNS(SVG, "rect");
      for (const [k, v] of Object.entries({ x, y, width, height, class: cls })) r.setAttribute(k, v);
      svg.appendChild(r);
    };
    rect(0, H - 1, W, 1, "axis");
    for (const m of minutes) {
      // Minutes ago, from the right edge.
      const back = Math.floor((now - new Date(m.start_time).getTime()) / 60000);
      if (back < 0 || back >= 60) continue;
      const x = W - (back + 1) * bar;
      const ok = (num(m.succeeded) / peak) * (H - 2);
      const bad = (num(m.failed) / peak) * (H - 2);
      const w = Math.max(1, bar - 0.5);
      if (ok) rect(x, H - 1 - ok, w, ok, "ok");
      if (bad) rect(x, H - 1 - ok - bad, w, bad, "bad");
    }
    return h("div", { class: "hour" }, svg, h("div", { class: "muted small", "data-field": "hour" },
      `${done} done · ${failed} failed${done ? ` (${((100 * failed) / done).toFixed(1)}%)` : ""}`));
  }

  function card(label, value, sub) {
    return h("div", { class: "card" }, h("div", { class: "label" }, label),
      h("div", { class: "value" }, value ?? 0), sub ? h("div", { class: "sub" }, sub) : null);
  }

  async function tasksPage(params) {
    const filter = { queue: params.get("queue") || "", state: params.get("state") || "",
      job: params.get("job") || "", id: params.get("id") || "", label: params.get("label") || "",
      order: params.get("order") || "", page_token: params.get("page_token") || "" };
    // Labels as the CLI takes them: key=value, several separated by commas.
    const labels = filter.label.split(",").map((l) => l.trim()).filter(Boolean);
    const chosen = filter.state ? filter.state.split(",") : [];
    const oldestFirst = filter.order === "oldest";
    const [page, stats, job] = await Promise.all([
      api("tasks", { query: { queue: filter.queue, state: filter.state, job: filter.job,
        id_prefix: filter.id, label: labels, newest_first: oldestFirst ? "" : "true",
        page_token: filter.page_token, page_size: 50 } }),
      api("queues").catch(() => ({ queues: [] })),
      filter.job ? api(`jobs/${encodeURIComponent(filter.job)}`).catch(() => null) : null,
    ]);
    const form = h("form", { class: "filters", id: "task-filters", onsubmit: (ev) => {
      ev.preventDefault();
      const f = new FormData(ev.target);
      location.hash = link("tasks", { id: f.get("id").trim(), queue: f.get("queue").trim(),
        state: f.getAll("state").join(","), job: f.get("job").trim(), label: f.get("label").trim(),
        order: f.get("order") });
    } },
    h("label", {}, "ID starts with", h("input", { name: "id", value: filter.id, placeholder: "any", spellcheck: "false" })),
    h("label", {}, "Queue", h("input", { name: "queue", value: filter.queue, list: "queue-names", placeholder: "any" }),
      h("datalist", { id: "queue-names" }, (stats.queues || []).map((q) => h("option", { value: q.queue })))),
    h("label", {}, "States", h("select", { name: "state", multiple: true, size: 4,
      title: "Ctrl-click or Shift-click for several; none: any" },
    TASK_STATES.map((s) => h("option", { value: s, selected: chosen.includes(s) }, s)))),
    h("label", {}, "Job", h("input", { name: "job", value: filter.job, placeholder: "any" })),
    h("label", {}, "Labels", h("input", { name: "label", value: filter.label, placeholder: "key=value,…",
      spellcheck: "false", title: "Tasks carrying every one of these labels" })),
    h("label", {}, "Order", h("select", { name: "order" },
      h("option", { value: "", selected: !oldestFirst }, "newest first"),
      h("option", { value: "oldest", selected: oldestFirst }, "oldest first"))),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("a", { href: "#/tasks" }, "Clear"));
    const tasks = page.tasks || [];
    const body = tasks.length ? h("table", { class: "list", id: "tasks" },
      h("thead", {}, h("tr", {}, ["ID", "Queue", "Job", "State", "Attempts", "Agent", "Updated", "Reason"].map((t) => h("th", {}, t)))),
      h("tbody", {}, tasks.map((t) => {
        const st = taskState(t.state);
        return h("tr", { "data-task": t.spec.id, "data-state": st },
          h("td", { class: "mono" }, h("a", { href: taskLink(t.spec.id) }, t.spec.id)),
          h("td", {}, h("a", { href: link("tasks", { queue: t.spec.queue }) }, t.spec.queue)),
          h("td", {}, t.spec.job_id ? h("a", { href: jobLink(t.spec.job_id) }, t.spec.job_id) : "—"),
          h("td", {}, badge(st)),
          h("td", { class: "num" }, `${t.attempts_used}/${t.max_attempts}`),
          h("td", {}, t.agent_id || "—"),
          h("td", {}, ago(t.update_time)),
          h("td", { class: "reason", title: t.reason }, t.reason || ""));
      }))) : h("div", { class: "empty" }, "No task matches.");
    const total = num(page.total_size);
    const pager = h("div", { class: "pager" },
      h("span", { id: "task-count" }, `${total.toLocaleString("en-US")} task${total === 1 ? "" : "s"} match`,
        ` · ${tasks.length} on this page · ${oldestFirst ? "oldest" : "newest"} first`),
      filter.page_token ? h("a", { href: link("tasks", { ...filter, page_token: "" }) }, "First page") : null,
      page.next_page_token ? h("a", { id: "next-page", href: link("tasks", { ...filter, page_token: page.next_page_token }) }, "Next page →") : null);
    return [h("h1", {}, "Tasks"), form, bulkActions(filter, chosen, stats, job), body, pager];
  }

  // Cancel, retry or delete every task the filter selects (a queue or a
  // job is needed, as the API wants), after a confirmation saying how many.
  const CANCELLABLE = ["SCHEDULED", "BLOCKED", "PENDING", "DISPATCHED", "RUNNING", "PAUSED"];
  const BULK = [
    { label: "Cancel", rpc: "CancelTasks", states: CANCELLABLE, verb: "cancelled",
      warn: " Running ones are stopped; each ends CANCELLED." },
    { label: "Retry", rpc: "RetryTasks", states: ["FAILED", "CANCELLED"], verb: "retried",
      warn: " Each runs again (those out of attempts are skipped)." },
    { label: "Delete", rpc: "DeleteTasks", states: [...TERMINAL], verb: "deleted",
      warn: " Their records, attempts and output are removed for good." },
  ];
  function bulkActions(filter, chosen, stats, job) {
    // The bulk calls select by queue or job and states only.
    if ((!filter.queue && !filter.job) || filter.id || filter.label) return null;
    // The counts by state of what the filter names: the job's, else the queue's.
    const queue = (stats.queues || []).find((q) => q.queue === filter.queue);
    const counts = (job ? job.counts : queue && queue.counts) || {};
    const where = [filter.queue ? `queue ${filter.queue}` : "", filter.job ? `job ${filter.job}` : ""]
      .filter(Boolean).join(", ");
    return h("div", { class: "actions", id: "bulk" }, h("span", { class: "muted" }, `All matching (${where}):`),
      BULK.map((b) => {
        const states = chosen.length ? b.states.filter((st) => chosen.includes(st)) : b.states;
        const n = states.reduce((sum, st) => sum + num(counts[st]), 0);
        const body = { queue: filter.queue, job_id: filter.job, states: states.map((st) => `TASK_STATE_${st}`), limit: 1000 };
        return h("button", { type: "button", class: b.label === "Retry" ? undefined : "danger",
          "data-action": `bulk-${b.label.toLowerCase()}`, disabled: !states.length || !n,
          onclick: async (ev) => {
            if (!window.confirm(`${b.label} the ${n} task${n === 1 ? "" : "s"} of ${where} in state ${states.join(", ")}?${b.warn}`)) return;
            ev.target.disabled = true;
            await bulk(b, body);
          } }, `${b.label} ${n}`);
      }));
  }
  async function bulk(b, body) {
    let changed = 0, skipped = 0, why = "";
    try {
      // A page of at most `limit` a call; bounded, as every loop here.
      for (let pages = 0, token = ""; pages < 100; pages++) {
        const r = await api(`TaskService/${b.rpc}`, { method: "POST", body: { ...body, page_token: token } });
        changed += (r.ids || []).length;
        skipped += num(r.skipped);
        why = why || r.skipped_reason || "";
        token = r.next_page_token;
        if (!token) break;
      }
      flash(`${b.verb} ${changed} task${changed === 1 ? "" : "s"}${skipped ? `; ${skipped} skipped (${why})` : ""}`, true);
    } catch (e) {
      flash(`${b.label.toLowerCase()} refused after ${changed}: ${e.code}: ${e.message}`, false);
    }
    await refresh();
  }

  function steps(spec) {
    return h("ol", { class: "steps", start: 0 }, (spec.steps || []).map((s) => {
      let what;
      if (s.exec) what = ["exec ", h("code", {}, (s.exec.argv || []).join(" "))];
      else if (s.builtin) what = ["builtin ", h("code", {}, [s.builtin.name, ...(s.builtin.args || [])].join(" "))];
      else if (s.http) what = ["http ", h("code", {}, `${s.http.method || "POST"} ${s.http.url}`)];
      else what = ["(unknown step)"];
      return h("li", {}, what, s.timeout ? h("span", { class: "muted" }, ` (timeout ${s.timeout})`) : null);
    }));
  }

  function tail(label, b64, cut) {
    const text = text64(b64);
    return [h("h2", {}, label, cut && num(cut) ? h("span", { class: "muted" }, ` (${num(cut)} earlier bytes cut)`) : null),
      // tabindex: a scrolled box must take the keyboard focus to scroll.
      text ? h("pre", { class: "out", tabindex: 0, "data-tail": label.toLowerCase() }, text) : h("div", { class: "muted" }, "(empty)")];
  }

  const openOutputs = new Set();  // "TASK#ATTEMPT" whose output is unfolded

  // A running task's output as its agent holds it now (the newest 64 KiB
  // of each stream), from the same source as `taskgridctl logs -f`; the
  // panel is fetched again every second while the task runs.
  async function liveOutput(id) {
    const snap = await api(`tasks/${encodeURIComponent(id)}/output`)
      .catch((e) => ({ error: `${e.code}: ${e.message}` }));
    const streams = { STDOUT: "", STDERR: "" };
    const ends = { STDOUT: -1, STDERR: -1 };
    const notes = [];
    let attempt = "";
    for (const m of snap.messages || []) {
      const kind = (m.kind || "").replace(/^KIND_/, "");
      if (kind === "ATTEMPT_STARTED") {
        attempt = `attempt ${m.attempt} on ${m.agent_id || "?"}`;
        streams.STDOUT = streams.STDERR = "";
        ends.STDOUT = ends.STDERR = -1;
      }
      if (m.note) notes.push(m.note);
      if (kind !== "OUTPUT") continue;
      const which = (m.stream || "").replace(/^OUTPUT_STREAM_/, "") === "STDERR" ? "STDERR" : "STDOUT";
      const offset = num(m.offset);
      const data = bytes64(m.data);
      if (ends[which] >= 0 && offset > ends[which]) streams[which] += `\n[… ${offset - ends[which]} bytes not held …]\n`;
      else if (ends[which] < 0 && offset > 0) streams[which] += `[… ${offset} earlier bytes not held …]\n`;
      streams[which] += new TextDecoder().decode(data);
      ends[which] = offset + data.length;
    }
    const box = (label, text) => [h("h3", {}, label),
      text ? h("pre", { class: "out", tabindex: 0, "data-live": label.toLowerCase() }, text) : h("div", { class: "muted" }, "(nothing yet)")];
    return h("div", { class: "panel", id: "live-output", "data-task": id },
      h("div", { class: "muted" }, attempt || "waiting for its attempt to start", " · updated every second"),
      snap.error ? h("div", { class: "error" }, snap.error) : null,
      notes.map((n) => h("div", { class: "muted", "data-field": "note" }, n)),
      box("Stdout", streams.STDOUT), box("Stderr", streams.STDERR));
  }

  async function taskPage(id) {
    const t = await api(`tasks/${encodeURIComponent(id)}`);
    const st = taskState(t.state);
    const spec = t.spec || {};
    const path = `tasks/${encodeURIComponent(id)}`;
    const describe = (r) => `now ${taskState(r.state)}`;
    const actions = h("div", { class: "actions" },
      actionButton("Cancel", !TERMINAL.has(st) && st !== "CANCELLING", `cancel ${id}`, `${path}/cancel`, describe,
        { danger: true, confirm: `Cancel task ${id}?${["DISPATCHED", "RUNNING"].includes(st) ? " Its running attempt is stopped." : ""} It ends CANCELLED.` }),
      actionButton("Retry", st === "FAILED" || st === "CANCELLED", `retry ${id}`, `${path}/retry`, describe),
      actionButton("Reset", TERMINAL.has(st), `reset ${id}`, `${path}/reset`, describe,
        { confirm: `Reset task ${id}? It runs again with a fresh attempt budget; its last result is replaced when the new attempt ends.` }),
      actionButton("Pause", ["PENDING", "SCHEDULED", "BLOCKED", "DISPATCHED", "RUNNING"].includes(st) && !t.pause_requested,
        `pause ${id}`, `${path}/pause`, describe),
      actionButton("Resume", st === "PAUSED", `resume ${id}`, `${path}/resume`, describe),
      actionButton("Delete", TERMINAL.has(st) && !spec.job_id && !spec.replica_of, `delete ${id}`,
        `${path}/delete`, (r) => `deleted ${(r.ids || []).join(", ")}`, {
          danger: true,
          confirm: `Delete task ${id} for good? Its record, attempts and output are removed.`,
          then: () => {
            keepFlash = true;  // "deleted ..." stays on the list it goes back to
            location.hash = link("tasks", { queue: spec.queue });
          },
        }));
    const facts = [
      ["State", badge(st)],
      ["Reason", t.reason || "—"],
      ["Queue", h("a", { href: link("tasks", { queue: spec.queue }) }, spec.queue)],
      ["Labels", Object.keys(spec.labels || {}).length ? h("span", { "data-field": "labels" },
        Object.entries(spec.labels).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, v], i) =>
          [i ? ", " : "", h("a", { href: link("tasks", { label: `${k}=${v}` }) }, `${k}=${v}`)])) : "—"],
      ["Job", spec.job_id ? h("a", { href: jobLink(spec.job_id) }, spec.job_id) : "—"],
      ["Depends on", (spec.depends_on || []).length ? h("span", {}, spec.depends_on.map((d, i) => [i ? ", " : "", h("a", { href: taskLink(d) }, d)])) : "—"],
      ["Agent", t.agent_id || "—"],
      ["Attempt", `${t.attempt} (${t.attempts_used} of ${t.max_attempts} used${t.attempts_dropped ? `, ${t.attempts_dropped} older dropped` : ""})`],
      ["Priority", spec.priority || 0],
      ["Created", when(t.create_time)],
      ["Updated", `${when(t.update_time)} (${ago(t.update_time)})`],
    ];
    if (t.next_run_time) facts.push(["Next run", when(t.next_run_time)]);
    if (t.claim_expire_time) facts.push(["Claim expires", when(t.claim_expire_time)]);
    if (t.pause_requested) facts.push(["Pause", "requested: the agent is stopping it"]);
    const r = t.result || {};
    const hasResult = r.outcome && r.outcome !== "OUTCOME_UNSPECIFIED";
    const result = hasResult ? [
      h("dl", { class: "facts", id: "result" },
        h("dt", {}, "Outcome"), h("dd", {}, outcome(r.outcome)),
        h("dt", {}, "Exit code"), h("dd", { "data-field": "exit_code" }, r.exit_code),
        h("dt", {}, "Step"), h("dd", {}, r.step),
        h("dt", {}, "Error"), h("dd", { class: r.error ? "error" : "", "data-field": "error" }, r.error || "—")),
      tail("Stdout", r.stdout_tail, r.stdout_cut_bytes),
      tail("Stderr", r.stderr_tail, r.stderr_cut_bytes),
    ] : h("div", { class: "muted" }, "No attempt has finished yet.");
    const attempts = (t.attempts || []).slice().reverse();
    // Each finished attempt's output, folded; what is unfolded stays so
    // through the refreshes.
    const output = (a) => {
      const r = a.result || {};
      if (!r.stdout_tail && !r.stderr_tail) return h("span", { class: "muted" }, "none");
      const key = `${id}#${a.attempt}`;
      return h("details", { open: openOutputs.has(key), "data-output": a.attempt,
        ontoggle: (ev) => (ev.target.open ? openOutputs.add(key) : openOutputs.delete(key)) },
      h("summary", {}, "show"), tail("Stdout", r.stdout_tail, r.stdout_cut_bytes),
      tail("Stderr", r.stderr_tail, r.stderr_cut_bytes));
    };
    const history = attempts.length ? h("table", { class: "list", id: "attempts" },
      h("thead", {}, h("tr", {}, ["#", "Agent", "Dispatched", "Started", "Finished", "Outcome", "Exit", "Error", "Output"].map((x) => h("th", {}, x)))),
      h("tbody", {}, attempts.map((a) => h("tr", { "data-attempt": a.attempt },
        h("td", {}, a.attempt, a.interrupted ? h("span", { class: "muted" }, " (interrupted)") : null),
        h("td", {}, a.agent_id || "—"), h("td", {}, when(a.dispatch_time)), h("td", {}, when(a.start_time)),
        h("td", {}, when(a.finish_time)), h("td", {}, outcome(a.result && a.result.outcome)),
        h("td", { class: "num" }, a.result ? a.result.exit_code : ""),
        h("td", { class: "reason", title: a.result && a.result.error }, (a.result && a.result.error) || ""),
        h("td", {}, output(a))))))
      : h("div", { class: "muted" }, "No finished attempt.");
    const running = ["DISPATCHED", "RUNNING", "CANCELLING"].includes(st);
    return [
      h("h1", {}, "Task ", h("span", { class: "id" }, id), badge(st)),
      actions,
      ...(running ? [h("h2", {}, "Live output"), await liveOutput(id)] : []),
      h("div", { class: "grid2" },
        h("div", {}, h("h2", {}, "Status"), h("div", { class: "panel" }, h("dl", { class: "facts", id: "facts" },
          facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])))),
        h("div", {}, h("h2", {}, "Last result"), h("div", { class: "panel" }, result))),
      h("h2", {}, "Attempts"), history,
      h("h2", {}, "Steps"), h("div", { class: "panel" }, steps(spec)),
      h("h2", {}, "Spec"), h("pre", { class: "json", tabindex: 0 }, JSON.stringify(spec, null, 2)),
    ];
  }

  async function jobsPage(params) {
    const filter = { state: params.get("state") || "", page_token: params.get("page_token") || "" };
    const page = await api("jobs", { query: { ...filter, page_size: 50 } });
    const form = h("form", { class: "filters", onsubmit: (ev) => {
      ev.preventDefault();
      location.hash = link("jobs", { state: new FormData(ev.target).get("state") });
    } },
    h("label", {}, "State", h("select", { name: "state" }, h("option", { value: "" }, "any"),
      JOB_STATES.map((s) => h("option", { value: s, selected: s === filter.state }, s)))),
    h("button", { type: "submit", class: "primary" }, "Filter"));
    const jobs = page.jobs || [];
    const body = jobs.length ? h("table", { class: "list", id: "jobs" },
      h("thead", {}, h("tr", {}, ["ID", "State", "Tasks", "By state", "Created", "Updated"].map((x) => h("th", {}, x)))),
      h("tbody", {}, jobs.map((j) => h("tr", { "data-job": j.id },
        h("td", { class: "mono" }, h("a", { href: jobLink(j.id) }, j.id)),
        h("td", {}, badge(jobState(j.state))),
        h("td", { class: "num" }, j.task_count),
        h("td", {}, stateChips(j.counts, TASK_STATES, (s) => link("tasks", { job: j.id, state: s }))),
        h("td", {}, when(j.create_time)), h("td", {}, ago(j.update_time))))))
      : h("div", { class: "empty" }, "No job yet.");
    const pager = h("div", { class: "pager" },
      filter.page_token ? h("a", { href: link("jobs", { state: filter.state }) }, "First page") : null,
      page.next_page_token ? h("a", { href: link("jobs", { ...filter, page_token: page.next_page_token }) }, "Next page →") : null);
    return [h("h1", {}, "Jobs"), form, body, pager];
  }

  const MAX_DRAWN = 400;

  // The DAG's zoom: a factor of its natural size, or "fit" (the width of
  // its box). Kept across refreshes and jobs, as a viewer's setting.
  let dagZoom = 1;
  function zoomed(svg) {
    const w = Number(svg.getAttribute("width")), hgt = Number(svg.getAttribute("height"));
    svg.dataset.width = w;
    const apply = () => {
      const box = svg.parentElement;
      // The box's inner width (less its padding) when fitting.
      const f = dagZoom === "fit" ? Math.max(0.1, (box ? box.clientWidth - 16 : w) / w) : dagZoom;
      svg.setAttribute("width", Math.round(w * f));
      svg.setAttribute("height", Math.round(hgt * f));
    };
    // Once in the page, where the box has a width to fit.
    requestAnimationFrame(apply);
    apply();
    return svg;
  }
  function dagZoomBar() {
    const set = (z) => () => {
      dagZoom = z;
      const svg = $("#dag svg");
      if (svg) {
        svg.setAttribute("width", svg.dataset.width);  // zoomed() measures from here
        zoomed(svg);
      }
      $("#dag-zoom-level").textContent = zoomText();
    };
    const step = (k) => () => {
      const svg = $("#dag svg");
      const now = svg ? Number(svg.getAttribute("width")) / Number(svg.dataset.width) : 1;
      set(Math.min(4, Math.max(0.25, Math.round(now * k * 100) / 100)))();
    };
    return h("div", { class: "actions", id: "dag-zoom" },
      h("button", { type: "button", "data-action": "fit", onclick: set("fit") }, "Fit to width"),
      h("button", { type: "button", "data-action": "zoom-out", "aria-label": "Zoom out", onclick: step(1 / 1.25) }, "−"),
      h("button", { type: "button", "data-action": "zoom-in", "aria-label": "Zoom in", onclick: step(1.25) }, "+"),
      h("button", { type: "button", "data-action": "actual", onclick: set(1) }, "100 %"),
      h("span", { class: "muted", id: "dag-zoom-level" }, zoomText()));
  }
  const zoomText = () => (dagZoom === "fit" ? "fitted to the width" : `${Math.round(dagZoom * 100)} %`);

  async function jobPage(id) {
    const job = await api(`jobs/${encodeURIComponent(id)}`);
    const tasks = [];
    let token = "";
    // The job's tasks, a page at a time, up to what is worth drawing.
    for (let pages = 0; pages < 10; pages++) {
      const page = await api("tasks", { query: { job: id, page_size: 1000, page_token: token } });
      tasks.push(...(page.tasks || []));
      token = page.next_page_token;
      if (!token || tasks.length > MAX_DRAWN) break;
    }
    const st = jobState(job.state);
    const path = `jobs/${encodeURIComponent(id)}`;
    const describe = (r) => `now ${jobState(r.state)}`;
    const anyFailed = num(job.counts && job.counts.FAILED) + num(job.counts && job.counts.CANCELLED) > 0;
    const nodes = tasks.map((t) => ({ id: t.spec.id, state: taskState(t.state), deps: t.spec.depends_on || [] }));
    const drawn = tasks.length <= MAX_DRAWN
      ? h("div", {}, dagZoomBar(), h("div", { class: "dag", id: "dag" }, zoomed(TaskgridDag.render(nodes, taskLink))))
      : h("div", { class: "empty" }, `${job.task_count} tasks: too many to draw; the table lists them.`);
    const present = new Set(nodes.map((n) => n.state));
    return [
      h("h1", {}, "Job ", h("span", { class: "id" }, id), badge(st)),
      h("div", { class: "actions" },
        actionButton("Cancel", st === "RUNNING", `cancel job ${id}`, `${path}/cancel`, describe,
          { danger: true, confirm: `Cancel job ${id}? Its ${num(job.task_count) - [...TERMINAL].reduce((n, s) => n + num(job.counts && job.counts[s]), 0)} unfinished tasks end CANCELLED, running ones stopped.` }),
        actionButton("Retry", anyFailed, `retry job ${id}`, `${path}/retry`, describe)),
      h("h2", {}, `${job.task_count} tasks`),
      stateChips(job.counts, TASK_STATES, (s) => link("tasks", { job: id, state: s })),
      h("h2", {}, "Graph"),
      h("div", { class: "legend" }, TASK_STATES.filter((s) => present.has(s)).map((s) => badge(s))),
      drawn,
      h("h2", {}, "Tasks"),
      h("table", { class: "list", id: "job-tasks" },
        h("thead", {}, h("tr", {}, ["ID", "State", "Depends on", "Reason"].map((x) => h("th", {}, x)))),
        h("tbody", {}, tasks.map((t) => h("tr", { "data-task": t.spec.id },
          h("td", { class: "mono" }, h("a", { href: taskLink(t.spec.id) }, t.spec.id)),
          h("td", {}, badge(taskState(t.state))),
          h("td", { class: "mono" }, (t.spec.depends_on || []).join(", ") || "—"),
          h("td", { class: "reason", title: t.reason }, t.reason || ""))))),
      h("div", { class: "pager" }, "Created ", when(job.create_time), " · updated ", ago(job.update_time)),
    ];
  }

  // "cpu=1.5/4, memory=1GiB/8GiB": held / offered per resource name.
  function resourcesText(used, offered) {
    used = used || {};
    offered = offered || {};
    const names = [...new Set([...Object.keys(offered), ...Object.keys(used)])].sort();
    return names.map((k) => `${k}=${used[k] || "0"}/${offered[k] || "0"}`).join(", ");
  }

  async function agentsPage() {
    const [list, c] = await Promise.all([api("agents"), api("cluster")]);
    const agents = list.agents || [];
    const used = num(c.slots_used), total = num(c.slots_total);
    const cards = h("div", { class: "cards", id: "cluster" },
      card("Active agents", c.agents_active || 0, `${c.agents_draining || 0} draining, ${c.agents_lost || 0} lost`),
      card("Slots used", `${used} / ${total}`, total ? `${Math.round((100 * used) / total)} %` : "no slots"),
      Object.keys(c.resources_total || {}).length
        ? card("Resources used", resourcesText(c.resources_used, c.resources_total), "held / offered, connected agents")
        : null,
      card("Heartbeat", c.heartbeat_interval || "—", "interval told to agents"),
      card("Stale messages", num(c.stale_messages), "late results refused by fencing"));
    const byState = h("div", {}, h("h2", {}, "Tasks by state, every queue"),
      stateChips(c.tasks, TASK_STATES, (s) => link("tasks", { state: s })));
    const table = agents.length ? h("table", { class: "list", id: "agents" },
      h("thead", {}, h("tr", {}, ["Agent", "State", "Slots", "Resources", "Labels", "Running", "Last heartbeat", "Connected", "Version", ""].map((x) => h("th", {}, x)))),
      h("tbody", {}, agents.map((a) => {
        const st = agentState(a.state);
        const meter = h("span", { class: "meter" }, h("span", {}));
        meter.firstChild.style.width = `${a.slots ? Math.round((100 * a.slots_used) / a.slots) : 0}%`;
        const labels = Object.entries(a.labels || {});
        return h("tr", { "data-agent": a.id, "data-state": st },
          h("td", { class: "mono" }, a.id),
          h("td", { "data-col": "state" }, badge(st), a.note
            ? h("div", { class: "muted" }, a.note + (a.grace_end_time ? `; its tasks move ${relative(a.grace_end_time)} unless it is back` : ""))
            : null),
          h("td", { "data-col": "slots" }, meter, `${a.slots_used}/${a.slots}`),
          h("td", { class: "mono", "data-col": "resources" }, resourcesText(a.resources_used, a.resources) || "—"),
          h("td", {}, labels.length ? h("div", { class: "chips" }, labels.map(([k, v]) => h("span", { class: "chip" }, `${k}=${v}`))) : "—"),
          h("td", { class: "mono", "data-col": "running" }, (a.running || []).length ? a.running.map((id, i) => [i ? ", " : "", h("a", { href: taskLink(id) }, id)]) : "—"),
          h("td", {}, ago(a.last_heartbeat_time)),
          h("td", {}, when(a.connect_time)),
          h("td", {}, a.version || "—"),
          h("td", {}, h("div", { class: "actions" }, st === "DRAINING"
            ? actionButton("Undrain", true, `undrain ${a.id}`, `agents/${encodeURIComponent(a.id)}/undrain`, (r) => `now ${agentState(r.state)}`)
            : actionButton("Drain", st === "ACTIVE", `drain ${a.id}`, `agents/${encodeURIComponent(a.id)}/drain`, (r) => `now ${agentState(r.state)}`,
              { danger: true, confirm: `Drain agent ${a.id}? It takes no new task; the ${(a.running || []).length} it runs finish there.` }))));
      }))) : h("div", { class: "empty" }, "No agent is connected.");
    return [h("h1", {}, "Agents"), cards, table, byState];
  }

  // "in 4 min 10 s" / "3 s ago": a time against now.
  function relative(ts) {
    if (!ts) return "";
    const s = (new Date(ts).getTime() - Date.now()) / 1000;
    return s >= 0 ? `in ${age(s)}` : `${age(-s)} ago`;
  }

  async function schedulesPage(params) {
    const token = params.get("page_token") || "";
    const page = await api("ScheduleService/ListSchedules",
      { method: "POST", body: { page_size: 100, page_token: token } });
    const list = page.schedules || [];
    const paused = list.filter((x) => x.paused).length;
    const cards = h("div", { class: "cards" },
      card("Schedules", list.length, token ? "on this page" : undefined),
      card("Paused", paused),
      card("Skipped fires", list.reduce((n, x) => n + num(x.skipped_fires), 0), "by misfire policy or a stall"),
      card("Failing", list.filter((x) => x.last_error).length, "last fire refused"));
    if (!list.length) {
      return [h("h1", {}, "Schedules"), cards,
        h("div", { class: "empty" }, "No schedule yet (taskgridctl schedule create)." )];
    }
    const rows = list.map((x) => {
      const tpl = x.task_template || {};
      const trigger = x.cron
        ? [h("code", {}, x.cron), x.time_zone && x.time_zone !== "UTC" ? ` (${x.time_zone})` : ""]
        : ["every ", h("code", {}, x.interval || "?")];
      const verb = x.paused ? "resume" : "pause";
      return h("tr", { "data-schedule": x.id, "data-state": x.paused ? "PAUSED" : "ACTIVE" },
        h("td", { class: "mono" }, x.id),
        h("td", {}, trigger),
        h("td", {}, h("a", { href: link("tasks", { queue: tpl.queue }) }, tpl.queue || "default")),
        h("td", {}, x.paused ? badge("PAUSED") : h("span", { class: "muted" }, "active")),
        h("td", { "data-col": "next" }, x.paused || !x.next_fire_time ? "—"
          : [when(x.next_fire_time), h("span", { class: "muted" }, ` (${relative(x.next_fire_time)})`)]),
        h("td", { "data-col": "last" }, x.last_fire_time
          ? [when(x.last_fire_time), " ", x.last_task_id ? h("a", { href: taskLink(x.last_task_id) }, "task") : null]
          : "—"),
        h("td", { class: "num", "data-col": "fires" }, num(x.fire_count)),
        h("td", { class: "num", "data-col": "skipped",
          title: x.last_skipped_time ? `the last at ${when(x.last_skipped_time)}` : undefined }, num(x.skipped_fires)),
        h("td", { class: x.last_error ? "reason error" : "reason", title: x.last_error }, x.last_error || ""),
        h("td", {}, h("div", { class: "actions" },
          actionButton(x.paused ? "Resume" : "Pause", true, `schedule ${x.id}`,
            `ScheduleService/${x.paused ? "Resume" : "Pause"}Schedule`,
            (r) => (r.paused ? "paused" : "active"), { body: { id: x.id } }))));
    });
    const pager = h("div", { class: "pager" },
      token ? h("a", { href: link("schedules", {}) }, "First page") : null,
      page.next_page_token ? h("a", { href: link("schedules", { page_token: page.next_page_token }) }, "Next page →") : null);
    return [h("h1", {}, "Schedules"), cards,
      h("table", { class: "list", id: "schedules" },
        h("thead", {}, h("tr", {}, ["ID", "Trigger", "Queue", "State", "Next fire", "Last fire", "Fires", "Skipped", "Last error", ""]
          .map((t, i) => h("th", { class: [6, 7].includes(i) ? "num" : undefined }, t)))),
        h("tbody", {}, rows)),
      pager];
  }

  // ---- rendering and refresh ----
  let rendering = 0;
  let lastGood = "";

  async function refresh() {
    const r = route();
    const seq = ++rendering;
    document.querySelectorAll("header nav a").forEach((a) => {
      const target = { task: "tasks", job: "jobs" }[r.name] || r.name;
      a.classList.toggle("active", a.dataset.nav === target);
    });
    let content;
    try {
      switch (r.name) {
        case "queues": content = await queuesPage(); break;
        case "tasks": content = await tasksPage(r.params); break;
        case "task": content = await taskPage(r.arg); break;
        case "jobs": content = await jobsPage(r.params); break;
        case "job": content = await jobPage(r.arg); break;
        case "agents": content = await agentsPage(); break;
        case "schedules": content = await schedulesPage(r.params); break;
        default: content = [h("h1", {}, "Not found"), h("p", {}, "No page ", h("code", {}, location.hash), ". ",
          h("a", { href: "#/queues" }, "Queues"), ".")];
      }
      $("#signin").hidden = true;
      lastGood = when(new Date().toISOString());
      $("#updated").textContent = `Updated ${lastGood} · refreshing every ${REFRESH_MS / 1000} s while visible`;
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      if (e.status === 401) {
        content = [h("p", { class: "muted" }, "Sign in to see this page.")];
      } else {
        content = [h("h1", {}, { 0: "No answer", 404: "Not found" }[e.status] || "Error"),
          h("p", { class: "error", id: "page-error" }, `${e.code}: ${e.message}`)];
      }
      $("#updated").textContent = lastGood ? `Last updated ${lastGood}` : "";
    }
    if (seq !== rendering) return;  // a newer render started meanwhile
    // The new page replaces the old one: the keyboard focus goes to the
    // same control in it, and the scroll position stays.
    const focus = focusKey(document.activeElement);
    const [x, y] = [window.scrollX, window.scrollY];
    $("#main").replaceChildren(...[content].flat().filter((n) => n !== null && n !== undefined));
    window.scrollTo(x, y);
    $("#main").querySelectorAll("#live-output pre").forEach((p) => { p.scrollTop = p.scrollHeight; });
    if (focus) {
      const again = [...$("#main").querySelectorAll(focus.tag)].find((n) => focusKey(n)?.key === focus.key);
      if (again) again.focus({ preventScroll: true });
    }
    renderSession();
  }

  // What names a focused control of the page across renders: its tag, its
  // data-* attributes and text, and those of the rows and boxes it is in.
  function focusKey(n) {
    if (!n || n === document.body || !$("#main").contains(n)) return null;
    const parts = [];
    for (let e = n; e && e.id !== "main"; e = e.parentElement) {
      const data = Object.entries(e.dataset).map(([k, v]) => `${k}=${v}`).join(",");
      if (e === n || data) parts.push(`${e.tagName}[${data}]${e === n ? e.textContent.trim() : ""}`);
    }
    return { tag: n.tagName.toLowerCase(), key: parts.join("<") };
  }

  // Not while the user types in a filter or selects text to copy.
  function busy() {
    const a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "SELECT")) return true;
    const sel = window.getSelection();
    return sel && !sel.isCollapsed;
  }

  setInterval(() => {
    if (document.visibilityState === "visible" && $("#signin").hidden && !busy()) refresh();
  }, REFRESH_MS);
  // A running task's live output, between the page's refreshes.
  setInterval(async () => {
    const panel = $("#live-output");
    if (!panel || document.visibilityState !== "visible" || busy()) return;
    const seq = rendering;
    const next = await liveOutput(panel.dataset.task);
    const now = $("#live-output");
    if (seq !== rendering || !now || now.dataset.task !== next.dataset.task) return;
    // Scrolled to the end, a box follows what comes; else it stays put.
    const follow = [...now.querySelectorAll("pre")].map((p) => p.scrollTop + p.clientHeight >= p.scrollHeight - 4);
    now.replaceWith(next);
    next.querySelectorAll("pre").forEach((p, i) => { if (follow[i] !== false) p.scrollTop = p.scrollHeight; });
  }, 1000);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refresh();
  });
  let keepFlash = false;  // set by an action that moves to another page itself
  window.addEventListener("hashchange", () => {
    if (!keepFlash) $("#flash").hidden = true;  // it spoke of the page before
    keepFlash = false;
    window.scrollTo(0, 0);
    refresh();
  });
  $("#signin").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
    $("#token").value = "";
    refresh();
  });
  $("#zone").addEventListener("click", () => {
    localStorage.setItem(ZONE_KEY, inUtc() ? "local" : "utc");
    renderZone();
    refresh();
  });
  renderZone();
  if (!location.hash) history.replaceState(null, "", "#/queues");
  refresh();
})();
