// Batches: the tenant's recent batches with progress (completed / failed / total), an
// ETA, their output and error files, and cancel. Polls /console/api/batches.

import { api, ApiError, download, isAbort, poll } from "./api.js";
import { ago, badge, dur, h, num, replace, table } from "./dom.js";

const CANCELLABLE = ["validating", "in_progress"];

export function mount(main, ctx) {
  const status = h("p", { class: "status-line" }, "loading…");
  const rows = h("div");
  replace(main, h("div", { class: "page-head" }, h("h2", {}, "Batches"), status), rows);

  function onError(err) {
    if (isAbort(err)) return;
    status.textContent = err instanceof ApiError ? err.message : `cannot reach the gateway (${err.message})`;
    status.classList.add("error");
  }

  async function cancel(id) {
    try {
      await api(`/v1/batches/${encodeURIComponent(id)}/cancel`, { method: "POST", signal: ctx.signal });
      await tick();
    } catch (err) {
      onError(err);
    }
  }

  function fileButton(id, label, fileId) {
    if (!fileId) return null;
    return h("button", { class: "link", dataset: { file: fileId }, onclick: () =>
      download(`/v1/files/${encodeURIComponent(fileId)}/content`, `${id}-${label}.jsonl`, ctx.signal)
        .catch(onError) }, label);
  }

  async function tick() {
    const data = await api("/console/api/batches", { signal: ctx.signal });
    replace(rows, table(["batch", "status", "endpoint", "created", "progress", "ETA", "files", ""],
      data.data.map((b) => {
        const p = b.progress;
        return h("tr", { dataset: { batch: b.id, status: b.status } },
          h("td", { class: "mono", title: b.id }, b.id), h("td", {}, badge(b.status)),
          h("td", {}, b.endpoint), h("td", {}, ago(b.created_at)),
          h("td", {}, bar(p)), h("td", {}, p.eta_s !== null ? dur(p.eta_s) : "–"),
          h("td", {}, fileButton(b.id, "output", b.output_file_id), " ",
            fileButton(b.id, "errors", b.error_file_id)),
          h("td", {}, CANCELLABLE.includes(b.status)
            ? h("button", { class: "danger small", onclick: () => cancel(b.id) }, "Cancel") : null));
      }), "no batch yet: create one with POST /v1/files and /v1/batches (or `tide batch`)"));
    status.textContent = `tenant ${data.tenant} · live`;
    status.classList.remove("error");
  }
  poll(tick, 1500, ctx.signal, onError);
}

function bar(p) {
  const total = Math.max(p.total, 1);
  const percent = Math.round(100 * p.fraction);
  return h("div", { class: "progress", title: `${p.completed} completed, ${p.failed} failed of ${p.total}`,
    dataset: { percent } },
  h("div", { class: "track" },
    h("span", { class: "ok", style: { width: `${(100 * p.completed) / total}%` } }),
    h("span", { class: "bad", style: { width: `${(100 * p.failed) / total}%` } })),
  h("span", { class: "counts" }, `${num(p.completed)} ✓ ${num(p.failed)} ✗ / ${num(p.total)} · ${percent} %`));
}
