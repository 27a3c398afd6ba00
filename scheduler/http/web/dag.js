// The DAG of a job as SVG: each task a box coloured by its state, each
// depends_on an arrow from the dependency to the task. Layered left to
// right by longest path (a task stands one column right of its deepest
// dependency), rows ordered by the mean row of the dependencies so
// arrows cross less. Plain DOM, no library.
"use strict";

const TaskgridDag = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const W = 168, H = 40, GAP_X = 64, GAP_Y = 16, PAD = 16;

  function el(tag, attrs, ...children) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    for (const c of children) n.append(c);
    return n;
  }

  function shortId(id) {
    return id.length > 21 ? id.slice(0, 9) + "…" + id.slice(-11) : id;
  }

  // tasks: [{id, state, deps: [ids]}]; deps outside the list are ignored.
  // Returns {columns: [[id]], pos: Map(id -> {x, y})}.
  function layout(tasks) {
    const byId = new Map(tasks.map((t) => [t.id, t]));
    const depth = new Map();
    // Iterative longest path (the job is acyclic: the scheduler refuses cycles).
    const visit = (start) => {
      const stack = [[start, false]];
      while (stack.length) {
        const [id, done] = stack.pop();
        if (depth.has(id)) continue;
        const deps = byId.get(id).deps.filter((d) => byId.has(d));
        if (done) {
          depth.set(id, deps.reduce((m, d) => Math.max(m, depth.get(d) + 1), 0));
          continue;
        }
        stack.push([id, true]);
        for (const d of deps) if (!depth.has(d)) stack.push([d, false]);
      }
    };
    for (const t of tasks) visit(t.id);
    const columns = [];
    for (const t of tasks) {
      const c = depth.get(t.id);
      (columns[c] = columns[c] || []).push(t.id);
    }
    const row = new Map();
    columns.forEach((col, c) => {
      if (c > 0) {
        const key = (id) => {
          const deps = byId.get(id).deps.filter((d) => row.has(d));
          return deps.length ? deps.reduce((s, d) => s + row.get(d), 0) / deps.length : 0;
        };
        col.sort((a, b) => key(a) - key(b));
      }
      col.forEach((id, r) => row.set(id, r));
    });
    const tallest = Math.max(...columns.map((c) => c.length));
    const pos = new Map();
    columns.forEach((col, c) => {
      const offset = ((tallest - col.length) * (H + GAP_Y)) / 2;
      col.forEach((id, r) => pos.set(id, { x: PAD + c * (W + GAP_X), y: PAD + offset + r * (H + GAP_Y) }));
    });
    return { columns, pos, tallest };
  }

  // Returns the <svg>; each node links to href(id).
  function render(tasks, href) {
    const { columns, pos, tallest } = layout(tasks);
    const width = PAD * 2 + columns.length * W + (columns.length - 1) * GAP_X;
    const height = PAD * 2 + tallest * H + (tallest - 1) * GAP_Y;
    // A group, not an image: each node inside is a link.
    const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group",
      "aria-label": "the job's tasks and their dependencies" });
    svg.append(el("defs", {}, el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
    el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#98a2b3" }))));
    const edges = el("g", {});
    for (const t of tasks) {
      const to = pos.get(t.id);
      for (const d of t.deps) {
        const from = pos.get(d);
        if (!from) continue;
        const x1 = from.x + W, y1 = from.y + H / 2, x2 = to.x - 2, y2 = to.y + H / 2;
        const mid = (x1 + x2) / 2;
        edges.append(el("path", { class: "edge", "data-from": d, "data-to": t.id,
          d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`, "marker-end": "url(#arrow)" }));
      }
    }
    svg.append(edges);
    for (const t of tasks) {
      const p = pos.get(t.id);
      const a = el("a", { href: href(t.id), class: `node s-${t.state}`, "data-task": t.id,
        "data-state": t.state });
      a.append(el("title", {}, `${t.id}: ${t.state}`));
      a.append(el("rect", { x: p.x, y: p.y, width: W, height: H, rx: 6 }));
      a.append(el("text", { x: p.x + 10, y: p.y + 17 }, shortId(t.id)));
      a.append(el("text", { x: p.x + 10, y: p.y + 32, class: "state" }, t.state));
      svg.append(a);
    }
    return svg;
  }

  return { render, layout };
})();
