// LangChain's JavaScript SDK (@langchain/langgraph-sdk) against `haystack-state serve`, as its users write it.
//
//   node client.mjs URL SCENARIO
//
// Runs one scenario against the server at URL and prints what the SDK returned as one JSON object; pytest
// (tests/server/test_js_sdk.py) asserts on it. A failed call exits 1 with the SDK's error on stderr.

import { Client } from "@langchain/langgraph-sdk";

const [url, scenario] = process.argv.slice(2);
const client = new Client({ apiUrl: url });

const human = (text) => ({ messages: [{ type: "human", content: text }] });

async function collect(stream) {
  const parts = [];
  for await (const { event, data } of stream) parts.push({ event, data });
  return parts;
}

/** The SDK's error for a refused call, or null when the call succeeded. */
async function refusal(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { name: error.name, status: error.status ?? null, message: String(error.message) };
  }
}

const scenarios = {
  // A thread, a run waited on, a run streamed in each mode, the thread found by its graph, its state and history.
  async conversation() {
    const thread = await client.threads.create({ metadata: { user: "ada" } });
    const unused = await client.threads.create({ metadata: { user: "ada" } }); // never run: no graph_id yet
    const created = {}; // what the SDK read from each run's Content-Location header
    const waited = await client.runs.wait(thread.thread_id, "agent", {
      input: human("hello"),
      onRunCreated: (run) => (created.wait = run),
    });
    const streams = {};
    for (const mode of ["values", "updates", "messages-tuple"]) {
      streams[mode] = await collect(
        client.runs.stream(thread.thread_id, "agent", {
          input: human(`hi ${mode}`),
          streamMode: mode,
          onRunCreated: (run) => (created[mode] = run),
        }),
      );
    }
    return {
      thread,
      unused,
      waited,
      streams,
      created,
      runs: await client.runs.list(thread.thread_id),
      found: await client.threads.search({ metadata: { graph_id: "agent" } }),
      foundElsewhere: await client.threads.search({ metadata: { graph_id: "other" } }),
      thread_after: await client.threads.get(thread.thread_id),
      state: await client.threads.getState(thread.thread_id),
      history: await client.threads.getHistory(thread.thread_id, { limit: 100 }),
      missing: await refusal(() => client.threads.get("no-such-thread")),
    };
  },

  // The served agents as assistants, and the graph the Agent is drawn as.
  async assistants() {
    const assistants = await client.assistants.search();
    const [first] = assistants;
    return {
      assistants,
      byGraph: await client.assistants.search({ graphId: "agent" }),
      byOtherGraph: await client.assistants.search({ graphId: "other" }),
      byName: await client.assistants.get("agent"),
      graph: await client.assistants.getGraph(first.assistant_id),
      xray: await client.assistants.getGraph(first.assistant_id, { xray: true }),
    };
  },

  // A run that stops before `send_email`, then approved with `command.resume`.
  async interrupt() {
    const { thread_id } = await client.threads.create();
    const stopped = await client.runs.wait(thread_id, "agent", { input: human("email ada@example.com") });
    const interrupted = await client.threads.get(thread_id);
    const state = await client.threads.getState(thread_id);
    const listed = await client.threads.search({ status: "interrupted" });
    const resumed = await client.runs.wait(thread_id, "agent", { command: { resume: "approve" } });
    return { thread_id, stopped, interrupted, state, listed, resumed, after: await client.threads.get(thread_id) };
  },
};

if (!(scenario in scenarios)) {
  console.error(`usage: node client.mjs URL SCENARIO (one of: ${Object.keys(scenarios).join(", ")})`);
  process.exit(2);
}
try {
  process.stdout.write(JSON.stringify(await scenarios[scenario]()));
} catch (error) {
  console.error(`scenario ${scenario} failed against ${url}:`, error);
  process.exit(1);
}
