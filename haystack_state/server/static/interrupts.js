// A thread that waits on a human: tool calls to review (interrupt_before), questions a tool asked with interrupt(),
// and calls a crashed or cancelled run left stopped.

import { $, el, guarded, pretty, short, state } from "./core.js";
import { renderSendState, streamRun } from "./conversation.js";

// An interrupt_before stop comes as one interrupt in LangChain's human-in-the-loop shape; any other interrupt is a
// question a tool asked (its value is what the tool passed to interrupt()).
const isReview = (interrupt) => Boolean(interrupt.value && typeof interrupt.value === "object"
  && Array.isArray(interrupt.value.action_requests));

export function renderInterrupts(interrupts) {
  const box = $("#interrupt");
  const requests = interrupts.filter(isReview).flatMap((i) => i.value.action_requests);
  const questions = interrupts.filter((i) => !isReview(i));
  state.waiting = requests.length + questions.length > 0;
  box.hidden = !state.waiting;
  const shown = JSON.stringify(interrupts);
  if (shown === box.dataset.shown && state.waiting) { renderSendState(); return; } // keep what the human typed
  box.dataset.shown = state.waiting ? shown : "";
  if (!state.waiting) { box.replaceChildren(); return; }
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
  const submit = el("button", { type: "button", class: "primary", id: "resume", onclick: guarded(() => resume(requests, questions)) },
    questions.length ? (requests.length ? "Submit" : "Send") : "Submit decisions");
  const asked = questions.map((question) => el("div", { class: "question", "data-interrupt-id": question.id || "" },
    typeof question.value === "string" ? el("p", { class: "ask" }, question.value) : el("pre", { class: "ask" }, pretty(question.value)),
    el("textarea", { rows: 2, class: "answer", "aria-label": "answer", placeholder: "Your answer (Ctrl+Enter sends)",
      onkeydown: (event) => { if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) submit.click(); } })));
  box.replaceChildren(
    ...(rows.length ? [el("h3", {}, "Waiting for a human: the run stopped before these tool calls"), ...rows] : []),
    ...(asked.length ? [el("h3", {}, asked.length > 1 ? "Waiting for a human: tools ask" : "Waiting for a human: a tool asks"), ...asked,
      el("p", { class: "muted hint" }, "An answer that is a JSON object or array ({…} or […]) is sent as JSON; anything else as text.")] : []),
    submit);
  renderSendState();
}

// An answer as sent: JSON for a JSON object or array, else the text as typed (trimmed).
export function answerOf(text) {
  const trimmed = text.trim();
  if (/^[[{]/.test(trimmed)) {
    try { return JSON.parse(trimmed); } catch { /* not JSON after all: the text */ }
  }
  return trimmed;
}

// command.resume: {decisions: [...]} for reviews alone; {interrupt_id: answer} for questions alone; with both, one
// object keyed by interrupt ids (answers) and call ids (decisions), as the server reads it.
async function resume(requests, questions) {
  const answers = questions.map((question, index) => {
    const text = document.querySelectorAll("#interrupt .answer")[index].value;
    if (!text.trim()) throw new Error("Type an answer to the question first.");
    return [question.id, answerOf(text)];
  });
  const decisions = requests.map((request, index) => {
    const chosen = document.querySelector(`input[name="decision-${index}"]:checked`).value;
    if (chosen !== "edit") return { type: chosen };
    const text = document.querySelectorAll("#interrupt .args")[index].value;
    let args;
    try { args = JSON.parse(text); } catch { throw new Error(`The arguments of ${request.name} are not valid JSON.`); }
    return { type: "edit", edited_action: { name: request.name, args } };
  });
  const value = !answers.length ? { decisions }
    : { ...Object.fromEntries(answers), ...Object.fromEntries(requests.map((request, index) => [request.id, decisions[index]])) };
  await streamRun({ command: { resume: value } });
}

// Stopped calls: a run stopped after the model asked for tools and before their results (it was cancelled, or its
// process died). The head then waits on "tools" with no interrupt, and no tool message answers the last ai message's calls.
export function stoppedCalls(messages, head) {
  if (!head || !(head.next || []).includes("tools") || (head.interrupts || []).length) return null;
  const answered = new Set(messages.filter((m) => m.type === "tool").map((m) => m.tool_call_id));
  const last = messages.filter((m) => m.type === "ai").pop();
  const calls = ((last && last.tool_calls) || []).filter((c) => !answered.has(c.id));
  return calls.length ? { calls, cancelled: (head.metadata || {}).cancelled || null } : null;
}

export function renderStopped(stopped) {
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
  await streamRun(how === "close" ? { input: null, config: { configurable: { on_unfinished_calls: "close" } } } : { input: null });
}

// What a message typed while calls are stopped will do first, by the Agent's default policy (an Agent may set another).
export function renderSendNote() {
  const note = $("#send-note");
  note.hidden = !state.stopped || !$("#send-input").value.trim();
  if (!state.stopped) return;
  note.textContent = state.stopped.cancelled
    ? "Sending closes the stopped calls first (by default after a cancel: error results, not run), then the model answers."
    : "Sending finishes the stopped calls first (by default after a crash: they run now), then the model answers.";
}
