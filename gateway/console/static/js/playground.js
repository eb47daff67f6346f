// Playground: a served model (from GET /v1/models), a prompt or a chat, max_tokens and
// temperature; the answer streams in (POST /v1/jobs, then its SSE events) with the bucket
// it went to and the time to first token as this page saw it and as the fleet recorded it.

import { api, isAbort, streamEvents } from "./api.js";
import { dur, h, num, replace } from "./dom.js";
import { fillModels, label, modelOption } from "./models.js";

export function mount(main, ctx) {
  const chat = [];
  const model = h("select", { id: "pg-model" }, ctx.me.models.map((id) => modelOption({ id })));
  const mode = h("select", { id: "pg-mode" }, h("option", { value: "prompt" }, "prompt"),
    h("option", { value: "chat" }, "chat"));
  const text = h("textarea", { id: "pg-input", rows: 5, placeholder: "Once upon a time" });
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, value: 64 });
  const temperature = h("input", { id: "pg-temperature", type: "number", min: 0, max: 2, step: 0.1, value: 0.8 });
  const send = h("button", { id: "pg-send", type: "submit" }, "Send");
  const stop = h("button", { id: "pg-stop", type: "button", class: "danger", disabled: true }, "Stop");
  const conversation = h("div", { class: "conversation", id: "pg-conversation" });
  const answer = h("pre", { class: "output", id: "pg-output" });
  const info = h("dl", { class: "inline", id: "pg-info" });
  const error = h("p", { class: "error", id: "pg-error" });
  let jobId = null;

  const form = h("form", { class: "playground" },
    h("div", { class: "row" }, h("label", {}, "model ", model), h("label", {}, "mode ", mode),
      h("label", {}, "max_tokens ", maxTokens), h("label", {}, "temperature ", temperature)),
    conversation, text, h("div", { class: "actions" }, send, stop), error);
  replace(main, h("div", { class: "page-head" }, h("h2", {}, "Playground"),
    h("p", { class: "status-line" }, "one job per message, at interactive priority")),
  form, info, h("h3", {}, "Answer"), answer);
  fillModels(model, ctx).catch(() => {}); // the names /console/api/me gave stay on failure

  mode.addEventListener("change", () => {
    chat.length = 0;
    replace(conversation);
  });
  stop.addEventListener("click", () => {
    if (jobId) api(`/v1/jobs/${encodeURIComponent(jobId)}`, { method: "DELETE" }).catch(() => {});
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = text.value || text.placeholder;
    const body = { model: model.value, max_tokens: Number(maxTokens.value),
      temperature: Number(temperature.value), metadata: { source: "console" } };
    if (mode.value === "chat") {
      chat.push({ role: "user", content: input });
      body.messages = [...chat];
    } else {
      body.prompt = input;
    }
    error.textContent = "";
    answer.textContent = "";
    send.disabled = true;
    try {
      await run(body);
    } catch (err) {
      if (!isAbort(err)) error.textContent = err.message;
      if (mode.value === "chat") chat.pop();
    } finally {
      send.disabled = false;
      stop.disabled = true;
      jobId = null;
    }
  });

  async function run(body) {
    const t0 = performance.now();
    const accepted = await api("/v1/jobs", { method: "POST", body, signal: ctx.signal });
    jobId = accepted.id;
    stop.disabled = false;
    let firstMs = null;
    let pieces = 0;
    const show = (final) => replace(info,
      fact("job", h("a", { href: `#/jobs/${encodeURIComponent(accepted.id)}`, id: "pg-job" }, accepted.id)),
      fact("model", h("span", { id: "pg-model-used", title: body.model }, label(body.model))),
      fact("bucket", h("span", { id: "pg-bucket" }, accepted.bucket)),
      fact("TTFT (this page)", h("span", { id: "pg-ttft" }, firstMs === null ? "waiting…" : dur(firstMs / 1000))),
      fact("TTFT (fleet)", dur(final?.timings?.ttft_seconds ?? null)),
      fact("tokens", final ? num(final.usage.completion_tokens) : `${pieces} pieces so far`),
      fact("status", h("span", { id: "pg-status" }, final ? final.status : "streaming")));
    show(null);
    let final = null;
    await streamEvents(`/v1/jobs/${encodeURIComponent(accepted.id)}/events`, (type, data) => {
      if (type === "delta") {
        if (firstMs === null) firstMs = performance.now() - t0;
        pieces += 1;
        answer.textContent += JSON.parse(data).text;
        show(null);
      } else if (type === "done") {
        final = JSON.parse(data);
      }
    }, ctx.signal);
    show(final);
    if (final && final.error) error.textContent = final.error;
    if (mode.value === "chat" && final) {
      chat.push({ role: "assistant", content: answer.textContent });
      replace(conversation, chat.map((m) => h("div", { class: `msg ${m.role}` },
        h("b", {}, m.role), " ", m.content)));
      text.value = "";
    }
  }
}

function fact(k, v) {
  return [h("dt", {}, k), h("dd", {}, v)];
}
