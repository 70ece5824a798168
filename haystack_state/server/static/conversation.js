// The conversation: its messages, the send box, and runs streamed from the server as they go.

import { $, contentText, el, headers, quote, short, showError, state } from "./core.js";
import { renderSendNote } from "./interrupts.js";
import { loadThreads, refresh, renderStatus, renderTitle, runAssistant } from "./threads.js";

export function renderMessages(messages) {
  $("#messages").replaceChildren(...messages.map((m) => {
    const failed = m.type === "tool" && m.status === "error";
    return el("li", { class: `message ${m.type}${failed ? " failed" : ""}`, "data-id": m.id || null },
      el("div", { class: "role" }, m.type === "tool" ? `tool · ${m.name || ""}${failed ? " · error" : ""}` : m.type),
      contentText(m.content) ? el("div", { class: "body" }, contentText(m.content)) : null,
      (m.tool_calls || []).map((c) => el("div", { class: "call" }, `${c.name}(${JSON.stringify(c.args)})  #${c.id || ""}`)),
    );
  }));
}

// Send is off while this page streams a run (one at a time), while the open thread runs from elsewhere, and while
// it waits on a human (answer in the box above instead).
export function renderSendState() {
  const streaming = state.streaming !== null;
  const elsewhere = !streaming && Boolean(state.thread && state.thread.status === "busy");
  $("#send-input").disabled = state.waiting;
  $("#send-button").disabled = streaming || elsewhere || state.waiting;
  for (const button of document.querySelectorAll("#interrupt button, #stopped button")) button.disabled = streaming;
  if (streaming && state.streaming !== state.threadId) {
    $("#run-status").textContent = "A run streams on another thread; send when it ends.";
  } else if (!streaming) {
    $("#run-status").textContent = elsewhere ? "A run is going on this thread; its messages show when it ends." : "";
  }
}

// Runs stream their values and the model's tokens over SSE (POST /threads/{id}/runs/stream) to the thread's own
// assistant: tokens grow a reply in place as they come, and each values event (after every checkpoint) re-renders
// the conversation. The thread and the list are reloaded at the end, whether the run ended well or not.
export async function streamRun(body) {
  if (state.streaming !== null) throw new Error("A run is streaming already; wait for its end.");
  const threadId = state.threadId;
  state.streaming = threadId;
  renderSendState();
  $("#run-status").textContent = "running…";
  let failed = null;
  try {
    const response = await fetch(`/threads/${quote(threadId)}/runs/stream`, {
      method: "POST", headers: headers(),
      body: JSON.stringify({ assistant_id: runAssistant(), stream_mode: ["values", "messages-tuple"], ...body }),
    });
    if (!response.ok) {
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
        handleEvent(block, threadId);
      }
    }
  } catch (error) {
    failed = error;
  } finally {
    state.streaming = null;
    renderSendState();
  }
  if (state.threadId === threadId) await refresh();
  await loadThreads();
  if (failed) throw failed;
}

function handleEvent(block, threadId) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (!data.length) return;
  const payload = JSON.parse(data.join("\n"));
  if (event === "error") showError(new Error(`${payload.error}: ${payload.message}`));
  if (event === "metadata") loadThreads().catch(showError); // the list shows the thread running
  if (state.threadId !== threadId) return; // another thread is open: its view is not this run's
  if (event === "values") {
    renderMessages(payload.messages || []);
    renderTitle(payload);
  } else if (event === "messages") streamToken(payload[0]);
  else if (event === "metadata") {
    $("#run-status").textContent = `run ${short(payload.run_id)} running…`;
    renderStatus("busy");
  }
}

function streamToken(chunk) {
  if (!chunk || chunk.type !== "AIMessageChunk" || !chunk.content) return;
  const id = chunk.id || ""; // a chunk without an id grows the one reply streaming without an id
  let item = [...document.querySelectorAll("#messages li.streaming")].find((li) => (li.dataset.id || "") === id);
  if (!item) {
    item = el("li", { class: "message ai streaming", "data-id": chunk.id }, el("div", { class: "role" }, "ai"), el("div", { class: "body" }, ""));
    $("#messages").append(item);
  }
  item.querySelector(".body").textContent += chunk.content;
}

export async function send(event) {
  event.preventDefault();
  if ($("#send-button").disabled) return; // Ctrl+Enter submits the form even when the button is off
  const input = $("#send-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  renderSendNote();
  const known = ((state.thread && state.thread.values && state.thread.values.messages) || []).slice();
  renderMessages([...known, { type: "human", content: text }]);
  await streamRun({ input: { messages: [{ type: "human", content: text }] } });
}
