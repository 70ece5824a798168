// The thread inspector: a page over the server's own Agent Protocol API (no build step, no dependencies).
"use strict";

const $ = (selector) => document.querySelector(selector);
const state = { assistant: null, threadId: null, thread: null, stopped: null, history: [], view: "conversation" };

// --- the API ---------------------------------------------------------------------------------------------------

function headers() {
  const key = $("#api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { "x-api-key": key } : {}) };
}

async function api(method, path, body) {
  const response = await fetch(path, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error((data && data.detail) || `${response.status} ${response.statusText}`);
  return data;
}

function showError(error) {
  const box = $("#error");
  box.textContent = String(error.message || error);
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

const quote = (value) => encodeURIComponent(value);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
};
const pretty = (value) => JSON.stringify(value, null, 2);
const short = (id) => (id ? id.slice(0, 8) + "…" + id.slice(-4) : "");
const when = (text) => (text ? new Date(text).toLocaleString() : "");

// --- assistants and threads ------------------------------------------------------------------------------------

async function loadAssistants() {
  const found = await api("POST", "/assistants/search", { limit: 100 });
  const select = $("#assistant");
  select.replaceChildren(...found.map((a) => el("option", { value: a.assistant_id }, a.name)));
  state.assistant = found.length ? found[0].assistant_id : null;
}

function searchBody() {
  const text = $("#thread-search").value.trim();
  const body = { limit: 100, sort_by: "updated_at", sort_order: "desc" };
  if ($("#thread-status").value) body.status = $("#thread-status").value;
  if (text.includes("=")) {
    body.metadata = {};
    for (const pair of text.split(/[,\s]+/).filter(Boolean)) {
      const [key, ...rest] = pair.split("=");
      const raw = rest.join("=");
      try { body.metadata[key] = JSON.parse(raw); } catch { body.metadata[key] = raw; }
    }
  }
  return { body, idFilter: text.includes("=") ? "" : text };
}

async function loadThreads() {
  const { body, idFilter } = searchBody();
  const threads = (await api("POST", "/threads/search", { ...body, select: ["thread_id", "status", "updated_at", "metadata"] }))
    .filter((t) => !idFilter || t.thread_id.includes(idFilter));
  $("#thread-list").replaceChildren(...threads.map((t) => el("li",
    { "data-thread-id": t.thread_id, class: t.thread_id === state.threadId ? "selected" : "", onclick: () => selectThread(t.thread_id) },
    el("div", { class: "tid", title: t.thread_id }, t.thread_id),
    el("div", { class: "sub" }, el("span", { class: `badge ${t.status}` }, t.status), el("span", {}, when(t.updated_at))),
  )));
}

async function newThread() {
  const thread = await api("POST", "/threads", { metadata: { source: "inspector" } });
  await loadThreads();
  await selectThread(thread.thread_id);
}

async function selectThread(threadId) {
  state.threadId = threadId;
  for (const item of document.querySelectorAll("#thread-list li")) item.classList.toggle("selected", item.dataset.threadId === threadId);
  $("#empty").hidden = true;
  $("#thread").hidden = false;
  await refresh();
}

async function refresh() {
  const thread = await api("GET", `/threads/${quote(state.threadId)}`);
  state.thread = thread;
  $("#thread-title").textContent = thread.thread_id;
  const badge = $("#thread-status-badge");
  badge.textContent = thread.status;
  badge.className = `badge ${thread.status}`;
  $("#thread-meta").textContent = Object.keys(thread.metadata || {}).length ? JSON.stringify(thread.metadata) : "";
  const messages = (thread.values && thread.values.messages) || [];
  const head = thread.values && thread.status !== "busy"
    ? await api("GET", `/threads/${quote(state.threadId)}/state?select=next&select=metadata&select=interrupts`) : null;
  renderMessages(messages);
  renderInterrupts(Object.values(thread.interrupts || {}).flat());
  renderStopped(stoppedCalls(messages, head));
  renderState(thread.values || {});
  if (state.view === "history" || state.view === "diff") await loadHistory();
}

// --- the conversation ------------------------------------------------------------------------------------------

function contentText(content) {
  if (typeof content === "string") return content;
  return (content || []).map((block) => (block.type === "text" ? block.text : `[${block.type}]`)).join("\n");
}

function renderMessages(messages) {
  $("#messages").replaceChildren(...messages.map((m) => {
    const failed = m.type === "tool" && m.status === "error";
    return el("li", { class: `message ${m.type}${failed ? " failed" : ""}` },
      el("div", { class: "role" }, m.type === "tool" ? `tool · ${m.name || ""}${failed ? " · error" : ""}` : m.type),
      contentText(m.content) ? el("div", { class: "body" }, contentText(m.content)) : null,
      (m.tool_calls || []).map((c) => el("div", { class: "call" }, `${c.name}(${JSON.stringify(c.args)})  #${c.id || ""}`)),
    );
  }));
}

function renderInterrupts(interrupts) {
  const box = $("#interrupt");
  const requests = interrupts.flatMap((i) => (i.value && i.value.action_requests) || []);
  box.hidden = requests.length === 0;
  $("#send-input").disabled = requests.length > 0;
  $("#send-button").disabled = requests.length > 0;
  if (!requests.length) { box.replaceChildren(); return; }
  const rows = requests.map((request, index) => {
    const name = `decision-${index}`;
    const args = el("textarea", { rows: 3, class: "args", "aria-label": `arguments of ${request.name}`, disabled: true }, pretty(request.args));
    const choice = (value, label) => el("label", {},
      el("input", { type: "radio", name, value, checked: value === "approve", onchange: () => { args.disabled = value !== "edit"; } }), ` ${label}`);
    return el("div", { class: "action", "data-call-id": request.id || "" },
      el("div", {}, el("strong", {}, request.name), el("span", { class: "muted" }, `  #${request.id || ""}`)),
      el("div", { class: "choices" }, choice("approve", "Approve"), choice("reject", "Reject"), choice("edit", "Edit")),
      args);
  });
  const submit = el("button", { type: "button", class: "primary", id: "resume", onclick: () => resume(requests) }, "Submit decisions");
  box.replaceChildren(el("h3", {}, "Waiting for a human: the run stopped before these tool calls"), ...rows, submit);
}

async function resume(requests) {
  const decisions = [];
  for (const [index, request] of requests.entries()) {
    const chosen = document.querySelector(`input[name="decision-${index}"]:checked`).value;
    if (chosen === "edit") {
      const text = document.querySelectorAll("#interrupt .args")[index].value;
      let args;
      try { args = JSON.parse(text); } catch { throw new Error(`The arguments of ${request.name} are not valid JSON.`); }
      decisions.push({ type: "edit", edited_action: { name: request.name, args } });
    } else decisions.push({ type: chosen });
  }
  await streamRun({ command: { resume: { decisions } } });
}

// Stopped calls: a run stopped after the model asked for tools and before their results (it was cancelled, or its
// process died). The head then waits on "tools" with no interrupt, and no tool message answers the last ai message's calls.
function stoppedCalls(messages, head) {
  if (!head || !(head.next || []).includes("tools") || (head.interrupts || []).length) return null;
  const answered = new Set(messages.filter((m) => m.type === "tool").map((m) => m.tool_call_id));
  const last = messages.filter((m) => m.type === "ai").pop();
  const calls = ((last && last.tool_calls) || []).filter((c) => !answered.has(c.id));
  return calls.length ? { calls, cancelled: (head.metadata || {}).cancelled || null } : null;
}

function renderStopped(stopped) {
  state.stopped = stopped;
  const box = $("#stopped");
  box.hidden = !stopped;
  renderSendNote();
  if (!stopped) { box.replaceChildren(); return; }
  const why = stopped.cancelled ? `the run ${short(stopped.cancelled.run_id)} was cancelled` : "the run crashed";
  const rows = stopped.calls.map((call) => el("div", { class: "action", "data-call-id": call.id || "" },
    el("div", {}, el("strong", {}, call.name), el("span", { class: "muted" }, `  #${call.id || ""}`)),
    el("pre", {}, pretty(call.args))));
  box.replaceChildren(el("h3", {}, `Stopped calls: ${why} before these tool calls returned`), ...rows,
    el("p", { class: "muted" }, "Finish runs them now; Close answers them with errors saying the run stopped, without running them. "
      + "Either way, the model then answers."),
    el("div", { class: "buttons" },
      el("button", { type: "button", class: "primary", id: "finish-calls", onclick: guarded(() => settle("finish")) }, "Finish"),
      el("button", { type: "button", id: "close-calls", onclick: guarded(() => settle("close")) }, "Close")));
}

// A run without input settles the stopped calls: it finishes them, or closes them with the on_unfinished_calls policy.
async function settle(how) {
  const buttons = document.querySelectorAll("#stopped button");
  for (const button of buttons) button.disabled = true;
  try {
    await streamRun(how === "close" ? { input: null, config: { configurable: { on_unfinished_calls: "close" } } } : { input: null });
  } finally {
    for (const button of buttons) button.disabled = false;
  }
}

// What a message typed while calls are stopped will do first, by the Agent's default policy (an Agent may set another).
function renderSendNote() {
  const note = $("#send-note");
  note.hidden = !state.stopped || !$("#send-input").value.trim();
  if (!state.stopped) return;
  note.textContent = state.stopped.cancelled
    ? "Sending closes the stopped calls first (by default after a cancel: error results, not run), then the model answers."
    : "Sending finishes the stopped calls first (by default after a crash: they run now), then the model answers.";
}

// Runs stream their values and the model's tokens over SSE (POST /threads/{id}/runs/stream): tokens grow a reply
// in place as they come, and each values event (after every checkpoint) re-renders the conversation.
async function streamRun(body) {
  const status = $("#run-status");
  status.textContent = "running…";
  const response = await fetch(`/threads/${quote(state.threadId)}/runs/stream`, {
    method: "POST", headers: headers(),
    body: JSON.stringify({ assistant_id: state.assistant, stream_mode: ["values", "messages"], ...body }),
  });
  if (!response.ok) {
    status.textContent = "";
    const data = await response.json().catch(() => null);
    throw new Error((data && data.detail) || `${response.status} ${response.statusText}`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      handleEvent(block);
    }
  }
  status.textContent = "";
  await refresh();
  await loadThreads();
}

function handleEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  if (event === "values") renderMessages(payload.messages || []);
  else if (event === "messages") streamToken(payload[0]);
  else if (event === "error") showError(new Error(`${payload.error}: ${payload.message}`));
  else if (event === "metadata") $("#run-status").textContent = `run ${short(payload.run_id)} running…`;
}

function streamToken(chunk) {
  if (!chunk || chunk.type !== "AIMessageChunk" || !chunk.content) return;
  let item = [...document.querySelectorAll("#messages li.streaming")].find((li) => li.dataset.id === chunk.id);
  if (!item) {
    item = el("li", { class: "message ai streaming", "data-id": chunk.id }, el("div", { class: "role" }, "ai"), el("div", { class: "body" }, ""));
    $("#messages").append(item);
  }
  item.querySelector(".body").textContent += chunk.content;
}

async function send(event) {
  event.preventDefault();
  const input = $("#send-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  renderSendNote();
  const known = ((state.thread && state.thread.values && state.thread.values.messages) || []).slice();
  renderMessages([...known, { type: "human", content: text }]);
  await streamRun({ input: { messages: [{ type: "human", content: text }] } });
}

// --- state -----------------------------------------------------------------------------------------------------

function typeOf(value) {
  if (Array.isArray(value)) return `list[${value.length}]`;
  if (value === null) return "null";
  if (typeof value === "object") return value.__type__ ? value.__type__ : `dict[${Object.keys(value).length}]`;
  return typeof value;
}

function renderState(values) {
  const rows = Object.entries(values).map(([key, value]) => el("tr", { "data-key": key },
    el("td", { class: "key" }, key), el("td", { class: "muted" }, typeOf(value)), el("td", {}, el("pre", {}, pretty(value)))));
  $("#state-table tbody").replaceChildren(...rows);
}

// --- history: a timeline whose forks are branches --------------------------------------------------------------

async function loadHistory() {
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

async function runDiff() {
  const a = $("#diff-a").value, b = $("#diff-b").value;
  if (!a || !b) return;
  const [before, after] = await Promise.all([a, b].map((id) => api("GET", `/threads/${quote(state.threadId)}/state/${quote(id)}`)));
  const changes = diffValues(before.values || {}, after.values || {});
  $("#diff-result").replaceChildren(...(changes.length ? changes.map((c) => el("div", { class: "change", "data-key": c.key },
    el("h4", {}, c.key, el("span", { class: "kind" }, c.kind)),
    "before" in c ? el("pre", { class: "before" }, pretty(c.before)) : null,
    "after" in c ? el("pre", { class: "after" }, pretty(c.after)) : null)) : [el("p", { class: "muted" }, "No differences.")]));
}

// --- wiring ----------------------------------------------------------------------------------------------------

async function showView(view) {
  state.view = view;
  for (const tab of document.querySelectorAll(".tabs button")) tab.classList.toggle("active", tab.dataset.view === view);
  for (const name of ["conversation", "state", "history", "diff"]) $(`#view-${name}`).hidden = name !== view;
  if ((view === "history" || view === "diff") && state.threadId) await loadHistory();
}

const guarded = (fn) => (...args) => Promise.resolve(fn(...args)).catch(showError);

function init() {
  $("#api-key").value = localStorage.getItem("haystack-state-api-key") || "";
  $("#api-key").addEventListener("change", guarded(async () => {
    localStorage.setItem("haystack-state-api-key", $("#api-key").value.trim());
    await loadAssistants();
    await loadThreads();
  }));
  $("#assistant").addEventListener("change", () => { state.assistant = $("#assistant").value; });
  let timer = null;
  $("#thread-search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(guarded(loadThreads), 200); });
  $("#thread-status").addEventListener("change", guarded(loadThreads));
  $("#new-thread").addEventListener("click", guarded(newThread));
  $("#send").addEventListener("submit", guarded(send));
  $("#send-input").addEventListener("input", renderSendNote);
  $("#send-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("#send").requestSubmit();
  });
  for (const tab of document.querySelectorAll(".tabs button")) tab.addEventListener("click", guarded(() => showView(tab.dataset.view)));
  $("#diff-run").addEventListener("click", guarded(runDiff));
  guarded(async () => {
    await loadAssistants();
    await loadThreads();
    const wanted = new URLSearchParams(location.search).get("thread");
    if (wanted) await selectThread(wanted);
  })();
}

init();
