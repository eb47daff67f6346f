// The served models, the default first, as GET /v1/models lists them (with their warm
// workers and queued jobs). That endpoint takes a tenant's key: a key that is only an
// operator's keeps the names /console/api/me gave, as does a page whose request failed.

import { api, isAbort } from "./api.js";
import { h } from "./dom.js";

export async function servedModels(ctx) {
  const names = ctx.me.models.map((id) => ({ id }));
  if (!ctx.me.tenant) return names;
  try {
    return (await api("/v1/models", { signal: ctx.signal })).data;
  } catch (err) {
    if (isAbort(err)) throw err;
    return names;
  }
}

// A model's <option>: the last part of a path as its label, the rest in its title.
export function modelOption(card) {
  const facts = card.warm_workers === undefined ? ""
    : ` · ${card.warm_workers} warm workers, ${card.queued_jobs} queued`;
  return h("option", { value: card.id, title: `${card.id}${facts}` }, label(card.id));
}

export function label(model) {
  return model ? model.split("/").pop() : "–";
}

// Fill `select` with the served models (after `keep`, its first options), keeping the one
// chosen if it is still served.
export async function fillModels(select, ctx, keep = 0) {
  const cards = await servedModels(ctx);
  const chosen = select.value;
  while (select.options.length > keep) select.remove(keep);
  select.append(...cards.map(modelOption));
  if (cards.some((c) => c.id === chosen)) select.value = chosen;
}
