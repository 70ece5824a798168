// The state key by key, the history as a timeline whose forks are branches, and the diff of two checkpoints.

import { $, api, el, pretty, quote, short, state, when } from "./core.js";

// A value longer than this shows clipped, with a "more" / "less" toggle.
const LONG_CHARS = 600;
const LONG_LINES = 12;

// --- state -----------------------------------------------------------------------------------------------------

function typeOf(value) {
  if (Array.isArray(value)) return `list[${value.length}]`;
  if (value === null) return "null";
  if (typeof value === "object") return value.__type__ ? value.__type__ : `dict[${Object.keys(value).length}]`;
  return typeof value;
}

// A value as shown: text as it reads (its type column says it is a string), anything else as indented JSON.
function valueCell(key, value) {
  const text = typeof value === "string" ? value : pretty(value);
  const pre = el("pre", {}, text);
  const lines = text.split("\n").length;
  if (text.length <= LONG_CHARS && lines <= LONG_LINES) return el("td", {}, pre);
  const cell = el("td", { class: "clip" }, pre);
  const toggle = el("button", { type: "button", class: "more" });
  const show = (open) => {
    cell.classList.toggle("open", open);
    toggle.textContent = open ? "less" : "more";
    toggle.setAttribute("aria-expanded", String(open));
    toggle.title = open ? "" : `${lines} lines, ${text.length} characters`;
    if (open) state.openKeys.add(key); else state.openKeys.delete(key);
  };
  toggle.addEventListener("click", () => show(!cell.classList.contains("open")));
  show(state.openKeys.has(key)); // a value opened stays open when the thread reloads
  cell.append(toggle);
  return cell;
}

export function renderState(values) {
  const rows = Object.entries(values).map(([key, value]) => el("tr", { "data-key": key },
    el("td", { class: "key" }, key), el("td", { class: "muted" }, typeOf(value)), valueCell(key, value)));
  $("#state-table tbody").replaceChildren(...rows);
}

// --- history: a timeline whose forks are branches --------------------------------------------------------------

export async function loadHistory() {
  const items = await api("POST", `/threads/${quote(state.threadId)}/history`,
    { limit: 1000, select: ["checkpoint", "parent_checkpoint", "metadata", "created_at"] });
  state.history = items.map((item) => ({
    id: item.checkpoint.checkpoint_id,
    parent: item.parent_checkpoint ? item.parent_checkpoint.checkpoint_id : null,
    metadata: item.metadata,
    created: item.created_at,
  }));
  renderHistory();
  renderDiffChoices();
}

// Lay the checkpoints out newest first, one lane per branch (as `git log --graph` does).
function layout(nodes) {
  const children = new Map();
  for (const node of nodes) if (node.parent) children.set(node.parent, (children.get(node.parent) || 0) + 1);
  const lanes = [];
  return nodes.map((node) => {
    let lane = lanes.indexOf(node.id);
    if (lane < 0) { lane = lanes.indexOf(null); if (lane < 0) lane = lanes.length; }
    for (let i = 0; i < lanes.length; i++) if (i !== lane && lanes[i] === node.id) lanes[i] = null; // branches meet
    const active = lanes.map((id) => id !== null);
    lanes[lane] = node.parent;
    active[lane] = true;
    return { ...node, lane, active, fork: (children.get(node.id) || 0) > 1 };
  });
}

function renderHistory() {
  const rows = layout(state.history);
  const width = Math.max(1, ...rows.map((r) => r.active.length));
  const headId = state.history.length ? state.history[0].id : null; // the newest checkpoint is the head
  $("#history").replaceChildren(...rows.map((row) => {
    const lanes = Array.from({ length: width }, (_, i) => el("span",
      { class: `lane${row.active[i] ? "" : " empty"}${i === row.lane && row.fork ? " fork" : ""}` },
      i === row.lane ? el("span", { class: "dot", title: row.fork ? "fork point" : "" }) : null));
    const meta = row.metadata || {};
    const detail = [meta.tool_names && meta.tool_names.length ? `tools: ${meta.tool_names.join(", ")}` : null,
      meta.changed_keys && meta.changed_keys.length ? `changed: ${meta.changed_keys.join(", ")}` : null].filter(Boolean).join(" · ");
    const pick = (which) => el("label", {}, el("input", { type: "radio", name: `pick-${which}`, value: row.id,
      onchange: () => { $(`#diff-${which.toLowerCase()}`).value = row.id; } }), ` ${which}`);
    return el("div", { class: `node${row.id === headId ? " head" : ""}`, "data-checkpoint-id": row.id, "data-lane": row.lane, style: `--lanes: ${width * 18}px` },
      el("span", { class: "lanes" }, lanes),
      el("span", { class: "label" }, el("span", { class: "src" }, meta.source || ""), ` step ${meta.step ?? ""} `,
        el("code", { title: row.id }, short(row.id)), el("span", { class: "muted" }, `  ${detail}  ${when(row.created)}`)),
      el("span", { class: "pick" }, pick("A"), pick("B")));
  }));
}

// --- diff of two checkpoints -----------------------------------------------------------------------------------

function renderDiffChoices() {
  const options = () => state.history.map((h) => el("option", { value: h.id },
    `${short(h.id)} · ${(h.metadata || {}).source || ""} · step ${(h.metadata || {}).step ?? ""}`));
  const a = $("#diff-a"), b = $("#diff-b");
  const keepA = a.value, keepB = b.value;
  a.replaceChildren(...options());
  b.replaceChildren(...options());
  const ids = state.history.map((h) => h.id);
  a.value = ids.includes(keepA) ? keepA : ids[Math.min(1, ids.length - 1)] || "";
  b.value = ids.includes(keepB) ? keepB : ids[0] || "";
}

function diffValues(before, after) {
  const changes = [];
  for (const key of [...new Set([...Object.keys(before), ...Object.keys(after)])]) {
    const had = key in before, has = key in after;
    if (!had) { changes.push({ key, kind: "added", after: after[key] }); continue; }
    if (!has) { changes.push({ key, kind: "removed", before: before[key] }); continue; }
    if (JSON.stringify(before[key]) === JSON.stringify(after[key])) continue;
    const a = before[key], b = after[key];
    if (Array.isArray(a) && Array.isArray(b) && b.length > a.length && JSON.stringify(b.slice(0, a.length)) === JSON.stringify(a)) {
      changes.push({ key, kind: `appended ${b.length - a.length}`, after: b.slice(a.length) });
    } else changes.push({ key, kind: "replaced", before: a, after: b });
  }
  return changes;
}

export async function runDiff() {
  const a = $("#diff-a").value, b = $("#diff-b").value;
  if (!a || !b) return;
  const [before, after] = await Promise.all([a, b].map((id) => api("GET", `/threads/${quote(state.threadId)}/state/${quote(id)}`)));
  const changes = diffValues(before.values || {}, after.values || {});
  $("#diff-result").replaceChildren(...(changes.length ? changes.map((c) => el("div", { class: "change", "data-key": c.key },
    el("h4", {}, c.key, el("span", { class: "kind" }, c.kind)),
    "before" in c ? el("pre", { class: "before" }, pretty(c.before)) : null,
    "after" in c ? el("pre", { class: "after" }, pretty(c.after)) : null)) : [el("p", { class: "muted" }, "No differences.")]));
}

export async function showView(view) {
  state.view = view;
  for (const tab of document.querySelectorAll(".tabs button")) tab.classList.toggle("active", tab.dataset.view === view);
  for (const name of ["conversation", "state", "history", "diff"]) $(`#view-${name}`).hidden = name !== view;
  if ((view === "history" || view === "diff") && state.threadId) await loadHistory();
}
