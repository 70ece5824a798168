// A small chat page on its own origin that talks to `haystack-state serve` through @langchain/langgraph-sdk, as a
// browser app does: it creates a thread on the first message, streams the reply (values and messages-tuple, the
// modes LangGraph's useStream asks for), lists the user's conversations by graph_id, and approves an interrupt.
// The server's URL is the page's `?api=` parameter. Each step writes into the DOM; body[data-state] tells where
// the page is ("ready", "streaming", "interrupted", or "error" with the error in #error), body[data-runs] how many
// runs it has finished.

import { Client } from "@langchain/langgraph-sdk";

const client = new Client({ apiUrl: new URLSearchParams(location.search).get("api") });
const $ = (id) => document.getElementById(id);
let threadId = null;
let runs = 0;

function showMessages(messages) {
  $("messages").replaceChildren(
    ...messages.map((message) => {
      const item = document.createElement("li");
      item.dataset.type = message.type;
      item.dataset.id = message.id ?? "";
      item.textContent = typeof message.content === "string" ? message.content : JSON.stringify(message.content);
      return item;
    }),
  );
}

async function showThreads() {
  const threads = await client.threads.search({ metadata: { graph_id: "agent" } });
  $("threads").replaceChildren(
    ...threads.map((thread) => {
      const item = document.createElement("li");
      item.dataset.threadId = thread.thread_id;
      item.dataset.assistantId = thread.metadata.assistant_id ?? "";
      item.textContent = `${thread.thread_id} (${thread.status})`;
      return item;
    }),
  );
}

/** Stream one run, drawing the reply as its tokens arrive and the conversation at each checkpoint. */
async function run(payload) {
  document.body.dataset.state = "streaming";
  $("interrupt").hidden = true;
  $("reply").textContent = "";
  delete $("reply").dataset.createdRunId;
  delete $("reply").dataset.messageId;
  const events = [];
  let interrupts = [];
  const stream = client.runs.stream(threadId, "agent", {
    ...payload,
    streamMode: ["values", "messages-tuple"],
    onRunCreated: ({ run_id }) => ($("reply").dataset.createdRunId = run_id), // read from Content-Location
  });
  for await (const { event, data } of stream) {
    events.push(event);
    if (event === "metadata") {
      $("reply").dataset.runId = data.run_id;
    } else if (event === "messages") {
      const [chunk, metadata] = data;
      if (metadata.langgraph_node === "model" && typeof chunk.content === "string") {
        $("reply").textContent += chunk.content;
        $("reply").dataset.messageId = chunk.id;
      }
    } else if (event === "values") {
      showMessages(data.messages ?? []);
      interrupts = data.__interrupt__ ?? [];
    } else if (event === "error") {
      throw new Error(`the run failed: ${JSON.stringify(data)}`);
    }
  }
  $("reply").dataset.events = [...new Set(events)].join(" ");
  await showThreads();
  if (interrupts.length > 0) {
    const [request] = interrupts[0].value.action_requests;
    $("interrupt-tool").textContent = request.name;
    $("interrupt-args").textContent = JSON.stringify(request.args);
    $("interrupt").hidden = false;
    document.body.dataset.state = "interrupted";
  } else {
    document.body.dataset.state = "ready";
  }
  document.body.dataset.runs = String(++runs);
}

function guarded(action) {
  return (event) => {
    event?.preventDefault();
    action().catch((error) => {
      $("error").textContent = String(error?.stack ?? error);
      document.body.dataset.state = "error";
    });
  };
}

$("composer").addEventListener(
  "submit",
  guarded(async () => {
    const text = $("prompt").value;
    $("prompt").value = "";
    if (threadId === null) {
      threadId = (await client.threads.create()).thread_id;
      $("thread").textContent = threadId;
    }
    await run({ input: { messages: [{ type: "human", content: text }] } });
  }),
);
$("approve").addEventListener("click", guarded(() => run({ command: { resume: "approve" } })));
guarded(async () => {
  await showThreads();
  document.body.dataset.state = "ready";
})();
