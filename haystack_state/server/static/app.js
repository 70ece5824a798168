// The thread inspector: a page over the server's own Agent Protocol API (no build step, no dependencies). This module
// wires the page; core.js holds its state and the API, and each other module draws one part of it:
// threads.js the thread list and the open thread, conversation.js the messages and runs, interrupts.js what waits on
// a human, inspect.js the state, history and diff views.

import { $, guarded } from "./core.js";
import { send } from "./conversation.js";
import { renderSendNote } from "./interrupts.js";
import { runDiff, showView } from "./inspect.js";
import { loadAssistants, loadThreads, newThread, pickAssistant, selectThread } from "./threads.js";

function init() {
  $("#api-key").value = localStorage.getItem("haystack-state-api-key") || "";
  $("#api-key").addEventListener("change", guarded(async () => {
    localStorage.setItem("haystack-state-api-key", $("#api-key").value.trim());
    await loadAssistants();
    await loadThreads();
  }));
  $("#assistant").addEventListener("change", () => pickAssistant($("#assistant").value));
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
