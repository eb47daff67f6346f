// The console shell: sign-in, who am I, and a hash router (#/fleet, #/jobs, #/jobs/<id>,
// #/batches, #/playground). Each page is a module whose mount(main, ctx, arg) draws it and
// returns nothing; ctx.signal aborts when the page is left, which stops its polling and
// streams.

import { api, getKey, setKey } from "./api.js";
import { h, replace } from "./dom.js";
import * as fleet from "./fleet.js";
import * as jobs from "./jobs.js";
import * as batches from "./batches.js";
import * as playground from "./playground.js";

const PAGES = { fleet, jobs, batches, playground };
const main = document.getElementById("main");
const login = document.getElementById("login");
let me = null;
let current = null;

function route() {
  const [name, arg] = location.hash.replace(/^#\/?/, "").split("/");
  if (PAGES[name]) return { name, arg: arg ? decodeURIComponent(arg) : undefined };
  return { name: me && me.operator ? "fleet" : "jobs" };
}

function showLogin(message) {
  current?.abort();
  current = null;
  replace(main);
  login.hidden = false;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("key-input").focus();
}

function drawWho() {
  const who = document.getElementById("who");
  const parts = [];
  if (me.tenant) parts.push(h("span", { class: "tenant" }, `tenant ${me.tenant}`));
  if (me.operator) parts.push(h("span", { class: "badge operator" }, "operator"));
  if (me.auth) {
    parts.push(h("button", { class: "link", id: "sign-out", onclick: () => {
      setKey("");
      me = null;
      replace(who);
      showLogin("");
    } }, "sign out"));
  }
  replace(who, parts);
}

function show() {
  if (!me) return;
  current?.abort();
  current = new AbortController();
  const { name, arg } = route();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === name);
  }
  const ctx = { me, signal: current.signal };
  replace(main);
  for (const k of Object.keys(main.dataset)) delete main.dataset[k];
  main.dataset.page = name;
  PAGES[name].mount(main, ctx, arg);
}

async function start() {
  let who;
  try {
    who = await api("/console/api/me");
  } catch (err) {
    replace(main, h("p", { class: "error" }, `cannot reach the gateway: ${err.message}`));
    return;
  }
  if (!who.accepted) {
    showLogin(getKey() ? "That key was not accepted." : "");
    return;
  }
  me = who;
  login.hidden = true;
  drawWho();
  show();
}

document.getElementById("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setKey(document.getElementById("key-input").value.trim());
  document.getElementById("key-input").value = "";
  start();
});
window.addEventListener("hashchange", show);
window.addEventListener("tide:unauthorized", () => {
  if (me) {
    me = null;
    showLogin("The key is no longer accepted.");
  }
});
start();
