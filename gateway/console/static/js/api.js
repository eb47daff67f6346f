// The console's only link to the gateway: JSON requests and Server-Sent Events read with
// fetch, both with the key in the Authorization header (never in a URL). The key lives in
// this tab's sessionStorage.

const KEY = "tide.console.key";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) {
    // not JSON: keep the status line
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("tide:unauthorized"));
  return new ApiError(response.status, message);
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: headers() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Read an SSE response (GET path) and call onEvent(type, data) for each event; resolves
// when the stream ends. The parser follows the SSE format: blank-line-separated blocks of
// "event:" and "data:" lines.
export async function streamEvents(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(type, data.join("\n"));
    }
  }
}

// Fetch a file with the key and hand it to the browser as a download.
export async function download(path, filename, signal) {
  const response = await fetch(path, { headers: headers({ Accept: "*/*" }), signal });
  if (!response.ok) throw await errorOf(response);
  const url = URL.createObjectURL(await response.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export function isAbort(err) {
  return err && err.name === "AbortError";
}

function visible(signal) {
  if (!document.hidden) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { document.removeEventListener("visibilitychange", done); resolve(); };
    document.addEventListener("visibilitychange", done);
    signal.addEventListener("abort", done, { once: true });
  });
}

// Call fn every `ms` until the signal aborts; errors go to onError (the loop goes on). A
// tab in the background does not poll: a forgotten console costs the gateway nothing.
export async function poll(fn, ms, signal, onError) {
  while (!signal.aborted) {
    await visible(signal);
    if (signal.aborted) return;
    try {
      await fn();
    } catch (err) {
      if (isAbort(err)) return;
      onError(err);
    }
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
    });
  }
}
