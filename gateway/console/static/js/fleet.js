// Fleet (operator keys): per model its totals, per LoRA adapter its queue and workers, per
// (model, bucket) the queue, per pool its model and workers by state and the controller's
// decisions, per worker its model, adapters and engine; plots of the last minutes. Polls
// /console/api/fleet every second.

import { api, ApiError, poll } from "./api.js";
import { ago, badge, dur, h, num, pct, replace, table } from "./dom.js";
import { TimeChart } from "./charts.js";
import { label } from "./models.js";

const POLL_MS = 1000;

export function mount(main, ctx) {
  if (!ctx.me.operator) {
    replace(main, h("section", { class: "notice" }, h("h2", {}, "Fleet"),
      h("p", {}, "The fleet view needs an operator key (TIDE_ADMIN_KEYS). Your jobs and " +
        "batches are on the other pages.")));
    return;
  }
  const status = h("p", { class: "status-line" }, "loading…");
  const totals = h("div", { class: "cards" });
  const plots = h("div", { class: "plots" });
  const sections = {
    models: h("div"), adapters: h("div"), buckets: h("div"), pools: h("div"), decisions: h("div"),
    workers: h("div"), tenants: h("div"),
  };
  replace(main,
    h("div", { class: "page-head" }, h("h2", {}, "Fleet"), status),
    totals, plots,
    h("h3", {}, "Models"), sections.models, sections.adapters,
    h("h3", {}, "Queues by model and bucket"), sections.buckets,
    h("h3", {}, "Pools"), sections.pools,
    h("h3", {}, "Controller decisions"), sections.decisions,
    h("h3", {}, "Workers"), sections.workers,
    h("h3", {}, "Tenants"), sections.tenants);
  const cells = [h("div", { class: "plot" }), h("div", { class: "plot" }), h("div", { class: "plot" })];
  plots.append(...cells);
  let charts = null;

  async function tick() {
    const data = await api(`/console/api/fleet${charts ? "" : "?history=1"}`, { signal: ctx.signal });
    if (!charts) {
      charts = [
        new TimeChart(cells[0], "Queued jobs", ["queued"]),
        new TimeChart(cells[1], "Workers", ["live", "desired"]),
        new TimeChart(cells[2], "Tokens / s", ["generated"]),
      ];
      ctx.signal.addEventListener("abort", () => charts.forEach((c) => c.destroy()));
      for (const s of data.history) addPoint(charts, s.t, s.queued, s.workers, s.desired, s.tokens_per_s);
    }
    const live = data.pools.reduce((a, p) => a + p.actual, 0); // starting ones included
    const desired = data.pools.reduce((a, p) => a + (p.desired ?? p.actual), 0);
    addPoint(charts, data.at, data.totals.queued, live, desired, data.totals.tokens_per_s);
    draw(sections, totals, data);
    status.textContent = `live · ${modelsLine(data.models)} · updated ${new Date(data.at * 1000).toLocaleTimeString()}`;
    status.classList.remove("error");
  }
  poll(tick, POLL_MS, ctx.signal, (err) => {
    status.textContent = err instanceof ApiError ? err.message : `cannot reach the gateway (${err.message})`;
    status.classList.add("error");
  });
}

function addPoint(charts, t, queued, workers, desired, tokens) {
  charts[0].push(t, [queued]);
  charts[1].push(t, [workers, desired]);
  charts[2].push(t, [tokens]);
}

function card(name, value) {
  return h("div", { class: "card" }, h("div", { class: "value" }, value), h("div", { class: "label" }, name));
}

function modelsLine(models) {
  const served = models.filter((m) => m.queued !== null);
  return served.length === 1 ? label(served[0].model) : `${served.length} models`;
}

// A model's cell: the last part of a path, all of it in the title.
function modelCell(model) {
  return h("td", { class: "model", title: model || "" }, label(model));
}

function draw(s, totals, data) {
  replace(totals,
    card("queued jobs", num(data.totals.queued)),
    card("workers (with heartbeat)", num(data.totals.workers)),
    card("tokens / s", num(data.totals.tokens_per_s, 1)),
    card("pools", num(data.pools.length)));
  replace(s.models, table(["model", "queued", "workers (with heartbeat)", "tokens / s"],
    data.models.map((m) => h("tr", { dataset: { model: m.model } },
      h("td", { title: m.model }, label(m.model), m.default ? " (default)" : ""),
      h("td", { class: "queued" }, m.queued === null ? "not served here" : num(m.queued)),
      h("td", { class: "workers" }, num(m.workers)), h("td", {}, num(m.tokens_per_s, 1))))));
  // Only a fleet serving LoRA adapters has this table (with its heading).
  replace(s.adapters, ...(data.adapters.length ? [h("h3", {}, "LoRA adapters"), table(
    ["adapter", "model", "queued", "workers holding it", "on device", "tokens generated"],
    data.adapters.map((a) => h("tr", { dataset: { adapter: a.adapter } },
      h("td", {}, a.adapter), modelCell(a.model), h("td", { class: "queued" }, num(a.queued)),
      h("td", { class: "workers" }, num(a.workers)), h("td", {}, num(a.on_device)),
      h("td", {}, num(a.generated_tokens)))))] : []));
  replace(s.buckets, table(
    ["model", "bucket", "queued", "interactive msgs", "batch msgs", "backlog tokens", "oldest wait", "arrivals / s", "tokens / s in"],
    data.buckets.map((b) => h("tr", { dataset: { model: b.model, bucket: b.bucket } },
      modelCell(b.model), h("td", {}, b.bucket), h("td", { class: "queued" }, num(b.queued)),
      h("td", {}, num(b.queue_depth.interactive)), h("td", {}, num(b.queue_depth.batch)),
      h("td", {}, num(b.backlog_tokens)), h("td", {}, b.queued ? dur(b.oldest_age_s) : "–"),
      h("td", {}, num(b.arrival_jobs_per_s, 2)), h("td", {}, num(b.arrival_tokens_per_s, 1))))));
  replace(s.pools, table(
    ["pool", "model", "buckets", "starting", "idle", "busy", "draining", "actual", "desired", "last decision"],
    data.pools.map((p) => h("tr", { dataset: { pool: p.pool, model: p.model || "" } },
      h("td", {}, p.pool), modelCell(p.model), h("td", {}, p.buckets.join(", ") || "–"),
      h("td", { class: "starting" }, num(p.workers.starting)), h("td", { class: "idle" }, num(p.workers.idle)),
      h("td", { class: "busy" }, num(p.workers.busy)), h("td", { class: "draining" }, num(p.workers.draining)),
      h("td", { class: "actual" }, num(p.actual)), h("td", { class: "desired" }, num(p.desired)),
      h("td", { class: "reason" }, p.decision ? `${p.decision.action}: ${p.decision.reason}` : "no controller"))),
    "no pool: no worker has sent a heartbeat and no controller runs"));
  replace(s.decisions, table(["when", "pool", "action", "workers", "reason"],
    data.decisions.slice(0, 12).map((d) => h("tr", { dataset: { decisionPool: d.pool, action: d.action } },
      h("td", {}, ago(d.at)), h("td", {}, d.pool), h("td", {}, badge(d.action)),
      h("td", {}, `${d.current} → ${d.desired}`), h("td", {}, d.reason))),
    "no scaling decision yet"));
  replace(s.workers, table(
    ["worker", "pool", "model", "adapters", "state", "running", "waiting", "free slots", "KV used", "tokens / s", "MFU", "MBU", "prefix hits", "beat"],
    data.workers.map((w) => h("tr", { dataset: { worker: w.worker_id, model: w.model } },
      h("td", { title: `${w.host} pid ${w.pid}` }, w.worker_id), h("td", {}, w.pool),
      modelCell(w.model), adaptersCell(w), h("td", {}, badge(w.state)), h("td", {}, num(w.running)),
      h("td", {}, num(w.waiting)), h("td", {}, num(w.free_slots)), h("td", {}, kv(w)), h("td", {}, num(w.tokens_per_s, 1)),
      h("td", {}, pct(w.mfu)), h("td", {}, pct(w.mbu)), h("td", {}, pct(w.prefix_hit_rate)),
      h("td", {}, `${dur(w.beat_age_s)} ago`))),
    "no live worker (a pool at zero starts one when jobs queue)"));
  replace(s.tenants, table(["tenant", "unfinished jobs"],
    data.tenants.map((t) => h("tr", {}, h("td", {}, t.tenant), h("td", {}, num(t.active))))));
}

// A worker's adapters: those in a device slot marked "(on device)", the others in host memory.
function adaptersCell(w) {
  const names = (w.adapters || []).map((a) =>
    (w.adapters_on_device || []).includes(a) ? `${a} (on device)` : a);
  return h("td", { class: "adapters" }, names.join(", ") || "–");
}

function kv(w) {
  if (w.kv_capacity_tokens) {
    return `${num(w.kv_used_tokens)} / ${num(w.kv_capacity_tokens)} tok (${pct(w.kv_cache_usage)})`;
  }
  return pct(w.kv_cache_usage);
}
