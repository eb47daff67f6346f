// Jobs: the tenant's recent jobs with filters (#/jobs), and one job (#/jobs/<id>): its
// timings, attempts, webhook, result, a live token stream while it runs, and cancel.

import { api, ApiError, isAbort, poll, streamEvents } from "./api.js";
import { ago, badge, dur, h, num, replace, short, since, table } from "./dom.js";
import { fillModels, label } from "./models.js";

const STATUSES = ["queued", "in_progress", "completed", "failed", "cancelled", "expired"];
const BUCKETS = ["short", "medium", "long"];
const LIVE = ["queued", "in_progress"];

export function mount(main, ctx, id) {
  if (id) detail(main, ctx, id);
  else list(main, ctx);
}

function select(name, options, onchange) {
  return h("label", {}, name, " ", h("select", { name, onchange },
    h("option", { value: "" }, "any"),
    options.map((o) => h("option", { value: o, title: o }, o.split("/").pop()))));
}

function list(main, ctx) {
  const filters = { status: "", bucket: "", model: "" };
  const status = h("p", { class: "status-line" }, "loading…");
  const rows = h("div");
  const refresh = () => tick().catch(onError);
  const models = select("model", ctx.me.models, (e) => { filters.model = e.target.value; refresh(); });
  const form = h("div", { class: "filters" },
    select("status", STATUSES, (e) => { filters.status = e.target.value; refresh(); }),
    select("bucket", BUCKETS, (e) => { filters.bucket = e.target.value; refresh(); }), models);
  replace(main, h("div", { class: "page-head" }, h("h2", {}, "Jobs"), status), form, rows);
  fillModels(models.querySelector("select"), ctx, 1).catch(onError); // after "any"

  async function tick() {
    const q = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    const data = await api(`/console/api/jobs?${q}`, { signal: ctx.signal });
    replace(rows, table(
      ["job", "status", "model", "bucket", "priority", "created", "queued for", "TTFT", "took", "tokens", "attempts"],
      data.data.map((j) => h("tr", { dataset: { job: j.id, status: j.status, model: j.model } },
        h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(j.id)}`, title: j.id }, short(j.id))),
        h("td", {}, badge(j.status)), h("td", { title: j.model }, label(j.model)),
        h("td", {}, j.bucket), h("td", {}, j.priority),
        h("td", {}, ago(j.created_at)), h("td", {}, dur(since(j.created_at, j.started_at))),
        h("td", {}, dur(since(j.created_at, j.first_token_at))),
        h("td", {}, dur(since(j.started_at, j.finished_at))),
        h("td", {}, `${num(j.completion_tokens)} / ${num(j.max_tokens)}`), h("td", {}, num(j.attempts)))),
      "no job yet: try the Playground"));
    status.textContent = `tenant ${data.tenant} · ${data.data.length} shown · live`;
    status.classList.remove("error");
  }
  function onError(err) {
    if (isAbort(err)) return;
    status.textContent = err instanceof ApiError ? err.message : `cannot reach the gateway (${err.message})`;
    status.classList.add("error");
  }
  poll(tick, 1500, ctx.signal, onError);
}

function timeline(t) {
  const steps = [["queued", t.queued_at], ["started", t.started_at], ["first token", t.first_token_at],
    ["finished", t.finished_at]];
  const start = t.queued_at;
  return h("ol", { class: "timeline" }, steps.map(([label, at], i) => h("li", { class: at ? "done" : "" },
    h("span", { class: "step" }, label),
    h("span", { class: "at" }, at ? new Date(at * 1000).toLocaleTimeString() : "–"),
    h("span", { class: "delta" }, i && at && start ? `+${dur(at - start)}` : ""))));
}

function detail(main, ctx, id) {
  const status = h("p", { class: "status-line" }, "loading…");
  const facts = h("div");
  const output = h("pre", { class: "output", id: "job-output" });
  const cancel = h("button", { id: "cancel-job", class: "danger", disabled: true }, "Cancel job");
  let streaming = false;
  let job = null;
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(id)}`, { method: "DELETE", signal: ctx.signal });
      status.textContent = `cancel asked: ${job.status}`;
    } catch (err) {
      if (!isAbort(err)) status.textContent = err.message;
    }
  });
  replace(main, h("div", { class: "page-head" },
    h("h2", {}, h("a", { href: "#/jobs" }, "Jobs"), " / ", h("span", { class: "mono" }, id)), status),
  h("div", { class: "actions" }, cancel), facts, h("h3", {}, "Output"), output);

  function stream() {
    streaming = true;
    output.textContent = "";
    streamEvents(`/v1/jobs/${encodeURIComponent(id)}/events`, (type, data) => {
      if (type === "delta") output.textContent += JSON.parse(data).text;
    }, ctx.signal).catch((err) => {
      if (!isAbort(err)) status.textContent = `stream: ${err.message}`;
    });
  }

  async function tick() {
    job = await api(`/console/api/jobs/${encodeURIComponent(id)}`, { signal: ctx.signal });
    const live = LIVE.includes(job.status);
    cancel.disabled = !live;
    main.dataset.jobStatus = job.status;
    if (live && !streaming) stream();
    if (!live && !streaming && job.result) output.textContent = job.result.text;
    const w = job.webhook;
    replace(facts, h("div", { class: "grid" },
      h("div", {}, h("h3", {}, "Status"), h("p", { id: "job-status" }, badge(job.status)),
        job.error ? h("p", { class: "error" }, job.error) : null,
        h("dl", {}, fact("bucket", job.bucket), fact("priority", job.priority), fact("model", job.model),
          fact("worker", job.worker || "–"), fact("attempts", num(job.attempts)),
          fact("lost before start", num(job.lost_unstarted)),
          fact("tokens", `${num(job.usage.prompt_tokens)} in, ${num(job.usage.completion_tokens)} / ${num(job.max_tokens)} out`),
          fact("finish reason", job.result?.finish_reason || "–"),
          job.batch_id ? fact("batch", job.batch_id) : null)),
      h("div", {}, h("h3", {}, "Timings"), timeline(job.timings),
        h("dl", {}, fact("queue wait", dur(job.timings.queue_seconds)),
          fact("time to first token", dur(job.timings.ttft_seconds)))),
      h("div", {}, h("h3", {}, "Webhook"), w
        ? h("dl", {}, fact("url", w.url), fact("attempts", num(w.attempts)), fact("last outcome", w.status))
        : h("p", { class: "muted" }, "none"))));
    status.textContent = live ? "live" : `finished ${ago(job.timings.finished_at)}`;
  }
  poll(tick, 1000, ctx.signal, (err) => {
    status.textContent = err.message;
  });
}

function fact(k, v) {
  return [h("dt", {}, k), h("dd", {}, v)];
}
