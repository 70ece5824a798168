// Assistants, the thread list (each thread's title, assistant and a live "running" badge), and the open thread.

import { $, api, contentText, el, guarded, quote, state, statusLabel, when } from "./core.js";
import { renderMessages, renderSendState } from "./conversation.js";
import { renderInterrupts, renderStopped, stoppedCalls } from "./interrupts.js";
import { loadHistory, renderState } from "./inspect.js";

const POLL_MS = 1000; // how often the list is checked while a thread runs
const TITLE_CHARS = 60;

// --- assistants ------------------------------------------------------------------------------------------------

export async function loadAssistants() {
  const found = await api("POST", "/assistants/search", { limit: 100 });
  state.assistants = found;
  $("#assistant").replaceChildren(...found.map((a) => el("option", { value: a.assistant_id }, a.name)));
  state.assistant = found.length ? found[0].assistant_id : null;
}

// The assistant a thread belongs to, from the metadata every run stamps (`assistant_id`, `graph_id`): a served
// assistant, or null. `named` is what the metadata names when this server serves no such assistant.
export function assistantOf(metadata) {
  const meta = metadata || {};
  const found = state.assistants.find((a) => a.assistant_id === meta.assistant_id)
    || state.assistants.find((a) => a.graph_id === meta.graph_id) || null;
  return { found, named: meta.graph_id || meta.assistant_id || null };
}

// Where the open thread's runs go: its own assistant; the one picked for new threads only if it has none yet.
export function runAssistant() {
  const { found, named } = assistantOf(state.thread && state.thread.metadata);
  return found ? found.assistant_id : named || state.assistant;
}

function renderThreadAssistant() {
  const { found, named } = assistantOf(state.thread && state.thread.metadata);
  const picked = state.assistants.find((a) => a.assistant_id === state.assistant);
  $("#thread-assistant").textContent = found || named
    ? `assistant: ${found ? found.name : named}`
    : `assistant: ${picked ? picked.name : "none"} (picked for new threads)`;
}

// --- the thread list -------------------------------------------------------------------------------------------

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

// A thread's title: its first human message, on one line, shortened.
function titleOf(values) {
  const first = ((values && values.messages) || []).find((m) => m.type === "human");
  const text = first ? contentText(first.content).replace(/\s+/g, " ").trim() : "";
  return text.length > TITLE_CHARS ? text.slice(0, TITLE_CHARS - 1) + "…" : text;
}

function fullTitleOf(values) {
  const first = ((values && values.messages) || []).find((m) => m.type === "human");
  return first ? contentText(first.content) : "";
}

// The listed threads; null when a later search started meanwhile (its answer is the newer one).
async function searchThreads(withValues) {
  const listing = ++state.listings;
  const { body, idFilter } = searchBody();
  const select = ["thread_id", "status", "updated_at", "metadata", ...(withValues ? ["values"] : [])];
  const found = await api("POST", "/threads/search", { ...body, select });
  if (listing !== state.listings) return null;
  return found.filter((t) => !idFilter || t.thread_id.includes(idFilter));
}

// Load the list with each thread's values (for its title); titles are kept, so that polls can skip the values.
export async function loadThreads() {
  const threads = await searchThreads(true);
  if (!threads) return;
  for (const t of threads) {
    const title = titleOf(t.values);
    if (title) state.titles.set(t.thread_id, { title, full: fullTitleOf(t.values) });
  }
  renderThreads(threads);
}

function renderThreads(threads) {
  state.listed = threads.map(({ thread_id, status, updated_at, metadata }) => ({ thread_id, status, updated_at, metadata }));
  $("#thread-list").replaceChildren(...state.listed.map((t) => {
    const title = state.titles.get(t.thread_id);
    const { found, named } = assistantOf(t.metadata);
    return el("li",
      { "data-thread-id": t.thread_id, class: t.thread_id === state.threadId ? "selected" : "", onclick: guarded(() => selectThread(t.thread_id)) },
      el("div", { class: `title${title ? "" : " untitled"}`, title: title ? title.full : "" }, title ? title.title : "(no messages yet)"),
      el("div", { class: "tid", title: t.thread_id }, t.thread_id),
      el("div", { class: "sub" },
        el("span", { class: `badge ${t.status}` }, statusLabel(t.status)),
        el("span", { class: "assistant" }, found ? found.name : named || ""),
        el("span", { class: "when" }, when(t.updated_at))),
    );
  }));
  schedulePoll();
}

// While a listed thread (or the open one) runs, check the list every second without values: a status that changed
// reloads the list (a new title may have come) and, for the open thread, the thread itself.
export function schedulePoll() {
  clearTimeout(state.pollTimer);
  const running = state.listed.some((t) => t.status === "busy") || (state.thread && state.thread.status === "busy");
  state.pollTimer = running ? setTimeout(guarded(poll), POLL_MS) : null;
}

async function poll() {
  const threads = await searchThreads(false);
  if (!threads) return;
  const before = new Map(state.listed.map((t) => [t.thread_id, t.status]));
  const changed = threads.length !== before.size || threads.some((t) => before.get(t.thread_id) !== t.status);
  const open = state.threadId && state.thread && state.streaming !== state.threadId ? state.threadId : null;
  const openNow = open && threads.find((t) => t.thread_id === open);
  if (open && (openNow ? openNow.status !== state.thread.status : state.thread.status === "busy")) await refresh();
  if (changed) await loadThreads();
  else renderThreads(threads);
}

export async function newThread() {
  const picked = state.assistants.find((a) => a.assistant_id === state.assistant);
  const thread = await api("POST", "/threads", { metadata: { source: "inspector", ...(picked ? { graph_id: picked.graph_id } : {}) } });
  await loadThreads();
  await selectThread(thread.thread_id);
}

// --- the open thread -------------------------------------------------------------------------------------------

export async function selectThread(threadId) {
  if (threadId !== state.threadId) state.openKeys.clear();
  state.threadId = threadId;
  for (const item of document.querySelectorAll("#thread-list li")) item.classList.toggle("selected", item.dataset.threadId === threadId);
  $("#empty").hidden = true;
  $("#thread").hidden = false;
  await refresh();
}

export async function refresh() {
  const threadId = state.threadId;
  const thread = await api("GET", `/threads/${quote(threadId)}`);
  const messages = (thread.values && thread.values.messages) || [];
  const head = thread.values && thread.status !== "busy"
    ? await api("GET", `/threads/${quote(threadId)}/state?select=next&select=metadata&select=interrupts`) : null;
  if (state.threadId !== threadId) return; // another thread was opened meanwhile
  state.thread = thread;
  renderTitle(thread.values);
  renderStatus(thread.status);
  $("#thread-id").textContent = thread.thread_id;
  renderThreadAssistant();
  $("#thread-meta").textContent = Object.keys(thread.metadata || {}).length ? JSON.stringify(thread.metadata) : "";
  renderMessages(messages);
  renderInterrupts(Object.values(thread.interrupts || {}).flat());
  renderStopped(stoppedCalls(messages, head));
  renderState(thread.values || {});
  renderSendState();
  schedulePoll();
  if (state.view === "history" || state.view === "diff") await loadHistory();
}

// The open thread's title and status; a run this page streams shows them as they change.
export function renderTitle(values) {
  $("#thread-title").textContent = titleOf(values) || "New thread";
  $("#thread-title").title = fullTitleOf(values);
}

export function renderStatus(status) {
  const badge = $("#thread-status-badge");
  badge.textContent = statusLabel(status);
  badge.className = `badge ${status}`;
}

export function pickAssistant(assistantId) {
  state.assistant = assistantId;
  if (state.thread) renderThreadAssistant();
}
