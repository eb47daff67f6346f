// Building DOM without innerHTML (every text from the server goes in as a text node) and
// formatting numbers, times and durations.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") Object.assign(el.style, v); // CSSOM: allowed by the page's CSP
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function table(headings, rows, empty = "nothing yet") {
  const body = rows.length
    ? rows
    : [h("tr", {}, h("td", { colspan: headings.length, class: "empty" }, empty))];
  return h("table", {}, h("thead", {}, h("tr", {}, headings.map((t) => h("th", {}, t)))),
    h("tbody", {}, body));
}

export function badge(status) {
  return h("span", { class: `badge ${status}` }, status.replace("_", " "));
}

export function num(x, digits = 0) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toLocaleString(undefined, { maximumFractionDigits: digits,
    minimumFractionDigits: digits });
}

export function pct(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`;
}

export function dur(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

export function ago(unix) {
  if (!unix) return "–";
  return `${dur(Math.max(0, Date.now() / 1000 - unix))} ago`;
}

export function since(a, b) {
  return a && b ? b - a : null;
}

export function short(id) {
  return id.length > 16 ? `${id.slice(0, 12)}…${id.slice(-4)}` : id;
}
