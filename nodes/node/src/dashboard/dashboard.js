// Flotilla's dashboard: reads /api/* of the process that serves it and
// draws the cluster, the jobs, one job and the supervisors. Every text is
// set as text, never as markup. Nothing is loaded from anywhere else.
"use strict";

const REFRESH_MS = 5000;
const view = document.getElementById("view");
const updated = document.getElementById("updated");
let timer = null;

// An element with attributes and children (strings become text).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// A number cell carrying its raw value in data-value.
function num(field, value, shown) {
  const text = shown !== undefined ? shown : value === null || value === undefined ? "–" : String(value);
  return el("td", { class: "num", "data-field": field, "data-value": value }, text);
}

function fixed(x, digits) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

function amounts(a) {
  if (!a) return "–";
  return Object.entries(a).map(([k, v]) => `${k}=${Number(v).toFixed(2).replace(/\.?0+$/, "")}`).join(" ");
}

async function getJson(url) {
  const r = await fetch(url, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function pager(base, page, hasNext) {
  return el("p", { class: "pager" },
    page > 0 ? el("a", { href: `${base}?page=${page - 1}` }, "← previous") : null,
    `page ${page + 1}`,
    hasNext ? el("a", { href: `${base}?page=${page + 1}` }, " next →") : null);
}

function pageOf(hash) {
  const m = /[?&]page=(\d+)/.exec(hash);
  return m ? Number(m[1]) : 0;
}

async function cluster(page) {
  const doc = await getJson(`/api/cluster?page=${page}`);
  const rows = doc.nodes.map((n) => el("tr", { "data-node": n.name },
    el("td", {}, n.name, n.name === doc.head ? " (head, primary)" : ""),
    el("td", { "data-field": "role" }, n.role),
    num("incarnation", n.incarnation),
    el("td", { class: `state-${n.state}`, "data-field": "state" }, n.state),
    num("heard_ms_ago", n.heard_ms_ago ?? null, n.heard_ms_ago == null ? "–" : `${(n.heard_ms_ago / 1000).toFixed(1)} s ago`),
    num("actors", n.actors),
    el("td", { "data-field": "capacity" }, amounts(n.capacity)),
    el("td", { "data-field": "reserved" }, amounts(n.reserved)),
    el("td", { "data-field": "available" }, amounts(n.available)),
    num("objects_bytes", n.objects ? n.objects.bytes : null,
      n.objects ? `${(n.objects.bytes / 1048576).toFixed(1)} / ${(n.objects.capacity / 1048576).toFixed(0)} MiB` : "–")));
  const groups = (doc.groups || []).map((g) => el("tr", { "data-group": g.id },
    el("td", {}, g.id), el("td", {}, g.strategy), el("td", { class: `state-${g.state}` }, g.state),
    el("td", {}, g.owner || "–"),
    el("td", {}, g.bundles.map((b) => `${amounts(b.resources)} @ ${b.node || "unplaced"}`).join("; "))));
  return [
    el("h2", {}, `Members (${doc.members}; head ${doc.head})`),
    table(["name", "role", "incarnation", "state", "last heartbeat", "actors", "capacity", "reserved", "available", "object store"], rows),
    pager("#/cluster", doc.page, doc.page + 1 < doc.pages),
    el("h2", {}, `Placement groups (${doc.group_count})`),
    table(["id", "strategy", "state", "owner", "bundles"], groups),
    pager("#/cluster", doc.page, doc.page + 1 < doc.pages),
  ];
}

async function jobs(page) {
  const doc = await getJson(`/api/jobs?page=${page}`);
  const rows = doc.jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.id)}` }, j.id)),
    el("td", {}, j.owner || "head"),
    el("td", { class: `state-${j.state}`, "data-field": "state" }, j.state),
    num("done", j.done), num("total", j.total),
    num("rows_per_s", j.rows_per_s, fixed(j.rows_per_s, 1)),
    num("tokens_per_s", j.tokens_per_s, fixed(j.tokens_per_s, 0)),
    num("eta_s", j.eta_s, duration(j.eta_s)),
    num("restarts", j.restarts), num("errors", j.errors),
    num("cost", j.cost, fixed(j.cost, 4)),
    el("td", {}, j.description)));
  return [
    el("h2", {}, "Jobs"),
    table(["id", "owner", "state", "done", "total", "rows/s", "tokens/s", "ETA", "restarts", "errors", "cost", "what"], rows),
    pager("#/jobs", doc.page, doc.more),
  ];
}

// Rows/s between successive samples of the last hour, as an SVG line.
function chart(history, key, label) {
  const w = 600, h = 160, pad = 30;
  const points = [];
  for (let i = 1; i < history.length; i++) {
    const dt = history[i - 1].ago_s - history[i].ago_s;
    if (dt > 0) points.push([-history[i].ago_s, (history[i][key] - history[i - 1][key]) / dt]);
  }
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("data-chart", key);
  svg.setAttribute("data-points", points.length);
  const max = Math.max(1, ...points.map((p) => p[1]));
  // The span shown: the samples' own, a minute at least, an hour at most.
  const span = Math.min(3600, Math.max(60, ...history.map((s) => s.ago_s)));
  const x = (t) => pad + ((t + span) / span) * (w - 2 * pad);
  const y = (v) => h - pad - (v / max) * (h - 2 * pad);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
  svg.append(line);
  const text = (tx, ty, s) => {
    const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
    t.setAttribute("x", tx);
    t.setAttribute("y", ty);
    t.textContent = s;
    svg.append(t);
  };
  text(pad, 14, `${label} (max ${max.toFixed(1)})`);
  text(pad, h - 8, span >= 120 ? `−${Math.round(span / 60)} min` : `−${span} s`);
  text(w - pad - 20, h - 8, "now");
  return svg;
}

async function job(id) {
  const doc = await getJson(`/api/job?id=${encodeURIComponent(id)}`);
  const j = doc.job;
  const a = doc.account;
  const out = [
    el("h2", {}, `Job ${j.id}`),
    el("dl", { class: "facts" },
      el("dt", {}, "state"), el("dd", { class: `state-${j.state}`, "data-field": "state" }, j.state),
      el("dt", {}, "what"), el("dd", {}, j.description),
      el("dt", {}, "owner"), el("dd", {}, j.owner || "head"),
      el("dt", {}, "rows"), el("dd", { "data-field": "done", "data-value": j.done }, `${j.done} of ${j.total || "?"}`),
      el("dt", {}, "driver on"), el("dd", {}, j.node || "–"),
      el("dt", {}, "detail"), el("dd", {}, j.detail || "–")),
  ];
  if (a) {
    out.push(
      el("dl", { class: "facts" },
        el("dt", {}, "rows/s"), el("dd", { "data-field": "rows_per_s", "data-value": a.rows_per_s }, fixed(a.rows_per_s, 1)),
        el("dt", {}, "tokens/s"), el("dd", { "data-field": "tokens_per_s", "data-value": a.tokens_per_s }, fixed(a.tokens_per_s, 0)),
        el("dt", {}, "ETA"), el("dd", {}, duration(a.eta_s)),
        el("dt", {}, "in flight / window"), el("dd", { "data-field": "in_flight", "data-value": a.in_flight }, `${a.in_flight} / ${a.window}`),
        el("dt", {}, "waiting for credit"), el("dd", {}, `${a.credit_wait_s.toFixed(1)} s`),
        el("dt", {}, "tokens real / padded"), el("dd", { "data-field": "tokens", "data-value": a.tokens.real }, `${a.tokens.real} / ${a.tokens.padded}`),
        el("dt", {}, "rows skipped / refused"), el("dd", { "data-field": "rejected", "data-value": a.rows.rejected }, `${a.rows.skipped} / ${a.rows.rejected}`),
        el("dt", {}, "CPU"), el("dd", { "data-field": "cpu_s", "data-value": a.cpu_s }, `${a.cpu_s.toFixed(1)} s`),
        el("dt", {}, "cost so far"), el("dd", { "data-field": "cost", "data-value": a.cost },
          a.cost === null ? "– (no node has a price)" : `${fixed(a.cost, 4)} (${fixed(a.cost_per_million_tokens, 4)} per million tokens)`),
        el("dt", {}, "restarts (actors, driver)"), el("dd", {}, `${a.actor_restarts}, ${a.driver_restarts}`),
        el("dt", {}, "since progress"), el("dd", {}, duration(a.since_progress_s))),
      chart(a.history, "rows", "rows/s"),
      chart(a.history, "tokens", "tokens/s"),
      el("h2", {}, "Batch stages (seconds)"),
      table(["stage", "p50", "p99", "batches"], a.stages.map((s) => el("tr", { "data-stage": s.name },
        el("td", {}, s.name), num("p50", s.p50, s.p50.toPrecision(3)), num("p99", s.p99, s.p99.toPrecision(3)), num("count", s.count)))),
      el("h2", {}, "Retries"),
      table(["deadline", "error", "lost member", "hedged"], [el("tr", {},
        num("deadline", a.retries.deadline), num("error", a.retries.error), num("lost", a.retries.lost), num("hedged", a.retries.hedged))]),
      el("h2", {}, "Actors"),
      table(["actor", "node", "batches", "busy"], a.actors.map((x) => el("tr", { "data-actor": x.actor },
        el("td", {}, x.actor), el("td", {}, x.node), num("batches", x.batches), num("busy", x.busy, `${(100 * x.busy).toFixed(0)} %`)))),
      el("h2", {}, "Rows refused (the last lines of errors.jsonl)"),
      el("pre", { class: "log", "data-errors": a.errors.length }, a.errors.length ? a.errors.join("\n") : "none"));
  }
  const log = doc.log;
  out.push(el("h2", {}, "Driver log (last lines)"),
    el("pre", { class: "log", "data-log": log ? log.lines.length : 0 },
      log && log.lines.length ? log.lines.join("\n") : "no lines yet"));
  const groups = [j.group, ...(j.work || [])].filter(Boolean);
  out.push(el("h2", {}, "Placement"),
    table(["group", "state", "strategy", "bundles"], groups.map((g) => el("tr", { "data-group": g.id },
      el("td", {}, g.id), el("td", {}, g.state), el("td", {}, g.strategy),
      el("td", {}, g.bundles.map((b) => `${amounts(b.resources)} @ ${b.node || "unplaced"}`).join("; "))))));
  return out;
}

async function supervisors(page) {
  const doc = await getJson(`/api/supervisors?page=${page}`);
  const out = [el("h2", {}, "Supervisors")];
  for (const n of doc.nodes) {
    if (n.supervisors_error) out.push(el("p", { class: "error" }, `${n.name}: ${n.supervisors_error}`));
    for (const s of n.supervisors || []) {
      out.push(el("h2", {}, `${n.name} / ${s.name} (${s.strategy})${s.gave_up ? " — gave up" : ""}`),
        el("p", { "data-supervisor": s.name, "data-field": "restarts_left", "data-value": s.restarts_left },
          `${s.restarts_left} of ${s.max_restarts} restarts left within ${s.within_s} s`),
        table(["child", "running", "restarts", "node", "last exit"], s.children.map((c) => el("tr", { "data-child": c.id },
          el("td", {}, c.id), el("td", {}, c.running ? "yes" : "no"), num("restarts", c.restarts), el("td", {}, c.node || n.name),
          el("td", {}, c.last_exit || "–")))));
    }
  }
  out.push(pager("#/supervisors", doc.page, doc.page + 1 < doc.pages));
  return out;
}

// Draws the page the address names, then again every few seconds.
async function route() {
  clearTimeout(timer);
  const hash = location.hash || "#/cluster";
  let page = "cluster";
  let draw;
  if (hash.startsWith("#/jobs")) {
    page = "jobs";
    draw = () => jobs(pageOf(hash));
  } else if (hash.startsWith("#/job/")) {
    page = "job";
    draw = () => job(decodeURIComponent(hash.slice("#/job/".length)));
  } else if (hash.startsWith("#/supervisors")) {
    page = "supervisors";
    draw = () => supervisors(pageOf(hash));
  } else {
    draw = () => cluster(pageOf(hash));
  }
  try {
    const parts = await draw();
    view.replaceChildren(...parts);
    view.dataset.page = page;
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    view.replaceChildren(el("p", { class: "error" }, `cannot load: ${e.message}`));
    view.dataset.page = "error";
  }
  // What the page loaded, for whoever checks that it stays on its origin.
  document.getElementById("resources").textContent = [location.href]
    .concat(performance.getEntriesByType("resource").map((r) => r.name)).join("\n");
  timer = setTimeout(route, REFRESH_MS);
}

window.addEventListener("hashchange", route);
route();
