"""
LangGraph parity on what clients send, through ``langgraph-sdk`` (sync and async clients) against real servers, on
SQLite and PostgreSQL:

- every streamed event has an id, and ``join_stream(last_event_id=...)`` resumes after it, with no event lost or
  repeated: in the process that runs the run, and through another process (the database relay);
- ``stream_mode="messages"`` sends ``messages/metadata``, ``messages/partial`` and ``messages/complete`` as LangGraph's
  platform does (``messages-tuple`` is tested in test_streams.py);
- the ``checkpoints``, ``tasks`` and ``debug`` modes, in LangGraph's shapes;
- ``multitask_strategy="interrupt"`` and ``"rollback"``: a new run on a busy thread cancels its runs (the running one
  and the pending ones), in one process and across two, then answers.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError
from langgraph_sdk.schema import StreamPart

from server.conftest import Backend, Served, ServeProcess
from server.test_streams import contents, human, wait_for_input

pytestmark = pytest.mark.slow

MODES = ["values", "updates", "messages-tuple"]


def numbered(parts: list[StreamPart]) -> list[tuple[str | None, str]]:
    """The ``(id, event)`` of each part but ``metadata``."""
    return [(part.id, part.event) for part in parts if part.event != "metadata"]


def seqs(parts: list[StreamPart]) -> list[int]:
    return [int(str(part.id).split("-")[1]) for part in parts if part.event != "metadata"]


def read_some(url: str, thread_id: str, body: dict[str, Any], count: int) -> tuple[str, list[tuple[str, str]]]:
    """Start a streamed run, read its first ``count`` events after ``metadata`` (id and name), and hang up."""
    seen: list[tuple[str, str]] = []
    with (
        httpx.Client(base_url=url, timeout=30) as http,
        http.stream("POST", f"/threads/{thread_id}/runs/stream", json=body) as response,
    ):
        run_id = response.headers["content-location"].rsplit("/", 1)[1]
        number = ""
        for line in response.iter_lines():
            if line.startswith("id: "):
                number = line[4:]
            elif line.startswith("event: ") and line != "event: metadata":
                seen.append((number, line[7:]))
            elif not line and len(seen) == count:
                break
    return run_id, seen


# --- Last-Event-ID ---------------------------------------------------------------------------------------------------


def test_join_stream_resumes_after_the_last_event_id(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    stream = client.runs.stream(thread_id, "agent", input=human("drip a b c d e f g h"), stream_mode=MODES)
    first = [next(stream) for _ in range(5)]  # metadata; the input's update and values; two chunks
    stream.close()  # the client hangs up; the run goes on
    run_id = first[0].data["run_id"]
    assert client.runs.get(thread_id, run_id)["status"] == "running"
    rest = list(client.runs.join_stream(thread_id, run_id, last_event_id=first[-1].id))
    assert rest[0].event != "metadata"  # a resumed stream goes on from the event after the last one seen
    whole = list(client.runs.join_stream(thread_id, run_id))  # the run ended: all of it, from the first
    assert numbered(first) + numbered(rest) == numbered(whole)
    assert seqs(whole) == list(range(len(whole) - 1)) and {p.id.split("-")[0] for p in whole[1:]} == {"1"}
    assert [p.data for p in first[1:] + rest] == [p.data for p in whole[1:]]
    assert "".join(p.data[0]["content"] for p in whole if p.event == "messages") == "dripped: a b c d e f g h"
    # Past the end: nothing more; in some modes only: the rest of those.
    assert list(client.runs.join_stream(thread_id, run_id, last_event_id=whole[-1].id)) == []
    values = list(client.runs.join_stream(thread_id, run_id, stream_mode="values", last_event_id=first[2].id))
    assert numbered(values) == [(p.id, p.event) for p in rest if p.event == "values"]
    # A run that streamed nothing (runs/wait) ends with its values, numbered as its first event.
    client.runs.wait(thread_id, "agent", input=human("hi"))
    [waited] = [run for run in client.runs.list(thread_id) if run["kwargs"]["stream_mode"] == []]
    [metadata, final] = client.runs.join_stream(thread_id, waited["run_id"])
    assert (metadata.event, final.event, final.id) == ("metadata", "values", "1-0")
    assert list(client.runs.join_stream(thread_id, waited["run_id"], last_event_id="1-0")) == []
    bad = served.http().get(f"/threads/{thread_id}/runs/{run_id}/stream", headers={"Last-Event-ID": "seven"})
    assert bad.status_code == 422 and bad.json()["param"] == "Last-Event-ID"


def test_a_reconnect_with_the_header_gets_the_rest(served: Served) -> None:
    """
    What ``runs.stream`` does itself after its connection drops, and a browser's ``EventSource``: ``GET`` the stream's
    ``Location`` with ``Last-Event-ID``. Nothing is repeated, nothing is lost.
    """
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    run_id, seen = read_some(
        served.url, thread_id, {"assistant_id": "agent", "input": human("drip x y z"), "stream_mode": MODES}, 3
    )
    response = served.http().get(
        f"/threads/{thread_id}/runs/{run_id}/stream", headers={"Last-Event-ID": seen[-1][0]}, timeout=30
    )
    names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    numbers = [line[4:] for line in response.text.splitlines() if line.startswith("id: ")]
    whole = list(client.runs.join_stream(thread_id, run_id))
    assert seen + list(zip(numbers, names, strict=True)) == numbered(whole)


def test_join_stream_resumes_through_another_process(backend: Backend) -> None:
    """A run streamed by one process, its client gone, resumed through the other (async client): the relay."""
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05"]
    first, second = ServeProcess(*args), ServeProcess(*args)
    try:
        first.wait_ready()
        second.wait_ready()
        with get_sync_client(url=first.url, api_key=None) as a:
            thread_id = a.threads.create()["thread_id"]
            body = {"assistant_id": "agent", "input": human("drip one two three"), "stream_mode": MODES}
            run_id, seen = read_some(first.url, thread_id, body, 4)

            async def resume() -> tuple[list[StreamPart], list[StreamPart]]:
                b = get_client(url=second.url, api_key=None)
                try:
                    rest = [p async for p in b.runs.join_stream(thread_id, run_id, last_event_id=seen[-1][0])]
                    late = [p async for p in b.runs.join_stream(thread_id, run_id, last_event_id=seen[1][0])]
                    return rest, late
                finally:
                    await b.aclose()

            rest, late = asyncio.run(resume())
            whole = list(a.runs.join_stream(thread_id, run_id))  # from the process that ran it, from memory
            assert seen + numbered(rest) == numbered(whole)
            assert [p.data for p in rest] == [p.data for p in whole[len(seen) + 1 :]]
            assert numbered(late) == numbered(whole)[2:]  # after the end too: the relayed events stay a while
            assert "".join(p.data[0]["content"] for p in whole if p.event == "messages") == "dripped: one two three"
    finally:
        first.stop()
        second.stop()


# --- messages ---------------------------------------------------------------------------------------------------------


def test_messages_mode_sends_metadata_partials_and_complete_messages(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("note a long cup of tea"), stream_mode="messages"))
    state = client.threads.get_state(thread_id)["values"]["messages"]
    _, call, result, answer = state
    assert {p.event for p in parts[1:]} == {"messages/metadata", "messages/partial", "messages/complete"}
    # metadata: once per message, before its first piece
    metadata = [p.data for p in parts if p.event == "messages/metadata"]
    assert [next(iter(m)) for m in metadata] == [call["id"], result["id"], answer["id"]]
    assert [m[next(iter(m))]["metadata"]["langgraph_node"] for m in metadata] == ["model", "tools", "model"]
    # partial: the reply so far, one message in a list
    partial = {m["id"]: m for p in parts if p.event == "messages/partial" for m in p.data}
    by_id: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        if part.event == "messages/partial":
            [message] = part.data
            assert message["type"] == "AIMessageChunk"
            by_id.setdefault(message["id"], []).append(message)
    assert set(by_id) == {call["id"], answer["id"]} and set(partial) == set(by_id)
    texts = [m["content"] for m in by_id[answer["id"]]]
    assert len(texts) > 2 and all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == answer["content"] == 'Done: {"note": "a long cup of tea"}'
    calls = [m["tool_calls"] for m in by_id[call["id"]]]
    call_id = call["tool_calls"][0]["id"]
    expected = {"name": "remember", "args": {"text": "a long cup of tea"}, "id": call_id, "type": "tool_call"}
    assert calls[-1] == [expected]
    assert calls[0][0]["name"] == "remember"  # parsed while the arguments were still coming
    # complete: each finished message as stored (the reply that streamed, the tool result, the answer)
    complete = [m for p in parts if p.event == "messages/complete" for m in p.data]
    assert [m["id"] for m in complete] == [call["id"], result["id"], answer["id"]]
    assert complete[1] == result and complete[2]["content"] == answer["content"]
    assert complete[0]["tool_calls"] == call["tool_calls"]
    # The SDK's v2 parts name them too.
    v2 = list(client.runs.stream(thread_id, "agent", input=human("hi"), stream_mode="messages", version="v2"))
    assert [p["type"] for p in v2[1:3]] == ["messages/metadata", "messages/partial"]
    assert v2[-1]["type"] == "messages/complete" and v2[-1]["data"][0]["content"] == "echo: hi"


# --- checkpoints, tasks, debug ----------------------------------------------------------------------------------------


def test_checkpoints_tasks_and_debug_modes(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    modes = ["checkpoints", "tasks", "debug"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("note tea"), stream_mode=modes))
    history = list(reversed(client.threads.get_history(thread_id)))
    checkpoints = [p.data for p in parts if p.event == "checkpoints"]
    ids = [c["config"]["configurable"]["checkpoint_id"] for c in checkpoints]
    assert ids == [h["checkpoint"]["checkpoint_id"] for h in history]
    assert [c["parent_config"] for c in checkpoints[1:]] == [c["config"] for c in checkpoints[:-1]]
    assert checkpoints[0]["parent_config"] is None
    assert [c["next"] for c in checkpoints] == [["model"], ["tools"], ["model"], []]
    assert [c["metadata"]["source"] for c in checkpoints] == ["input", "model", "tools", "model"]
    assert [c["values"] for c in checkpoints] == [h["values"] for h in history]
    assert checkpoints[1]["tasks"] == [{"id": ids[1], "name": "tools", "interrupts": [], "state": None}]
    tasks = [p.data for p in parts if p.event == "tasks"]
    starts, results = tasks[0::2], tasks[1::2]
    assert [(t["id"], t["name"]) for t in starts] == [(ids[0], "model"), (ids[1], "tools"), (ids[2], "model")]
    assert [(t["id"], t["name"]) for t in results] == [(t["id"], t["name"]) for t in starts]
    assert starts[0]["input"] == checkpoints[0]["values"] and starts[0]["triggers"] == ["branch:to:model"]
    assert [r["error"] for r in results] == [None] * 3 and [r["interrupts"] for r in results] == [[]] * 3
    [(key, [message])] = results[0]["result"]
    assert key == "messages" and message["tool_calls"][0]["name"] == "remember"
    assert dict((k, v) for k, v in results[1]["result"])["notes"] == ["tea"]
    debug = [p.data for p in parts if p.event == "debug"]
    kinds = ["task", "task_result", "checkpoint"]
    assert [d["type"] for d in debug] == ["checkpoint", *kinds * 3]
    assert [d["payload"] for d in debug if d["type"] != "checkpoint"] == tasks
    assert [d["step"] for d in debug] == [0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    wrapped = debug[3]["payload"]  # the model's checkpoint, as LangGraph's platform sends it in debug
    assert wrapped["checkpoint"]["checkpoint_id"] == ids[1] and wrapped["parent_checkpoint"]["checkpoint_id"] == ids[0]
    assert wrapped["tasks"] == [{"id": ids[1], "name": "tools", "interrupts": [], "checkpoint": None}]
    # LangGraph's order in a step: the task's result, then its checkpoint
    names = [p.event for p in parts[1:]]
    assert names[:4] == ["checkpoints", "debug", "tasks", "debug"]
    # A run that stops before a reviewed call: the model's task, then a checkpoint whose next task is the tools'.
    stopped = list(
        client.runs.stream(thread_id, "agent", input=human("email ada@x.org"), stream_mode=["tasks", "checkpoints"])
    )
    assert [t.data["name"] for t in stopped if t.event == "tasks"] == ["model", "model"]
    assert [c.data["next"] for c in stopped if c.event == "checkpoints"] == [["model"], ["tools"]]
    # join_stream in one of the run's modes
    joined = list(client.runs.join_stream(thread_id, parts[0].data["run_id"], stream_mode="checkpoints"))
    assert [p.data for p in joined[1:]] == checkpoints


def test_a_failing_model_ends_its_task_with_the_error(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    parts = list(client.runs.stream(thread_id, "agent", input=human("fail"), stream_mode=["tasks"]))
    start, result = (p.data for p in parts if p.event == "tasks")
    assert (start["name"], result["name"], result["id"]) == ("model", "model", start["id"])
    assert "the model is down" in result["error"] and parts[-1].event == "error"


# --- multitask_strategy -----------------------------------------------------------------------------------------------


def test_multitask_interrupt_stops_the_running_run_and_answers(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, "agent", input=human("first"))
    long = client.runs.create(thread_id, "agent", input=human("sleep 5"))
    queued = client.runs.create(thread_id, "agent", input=human("queued"), multitask_strategy="enqueue")
    wait_for_input(client, thread_id, "sleep 5")
    values = client.runs.wait(thread_id, "agent", input=human("hi"), multitask_strategy="interrupt")
    # The long run stopped before its answer, keeping what it committed; the new run answered.
    assert contents(values) == ["first", "echo: first", "sleep 5", "hi", "echo: hi"]
    assert client.runs.get(thread_id, long["run_id"])["status"] == "interrupted"
    assert client.runs.get(thread_id, queued["run_id"])["status"] == "interrupted"  # pending runs too
    assert client.threads.get(thread_id)["status"] == "idle"


def test_multitask_rollback_restores_the_thread_and_deletes_the_run(served: Served) -> None:
    async def main() -> None:
        client = get_client(url=served.url, api_key=None)
        try:
            thread_id = (await client.threads.create())["thread_id"]
            await client.runs.wait(thread_id, "agent", input=human("first"))
            long = await client.runs.create(thread_id, "agent", input=human("sleep 5"))
            queued = await client.runs.create(thread_id, "agent", input=human("queued"), multitask_strategy="enqueue")
            await asyncio.to_thread(wait_for_input, served.client(), thread_id, "sleep 5")
            parts = [
                p
                async for p in client.runs.stream(
                    thread_id, "agent", input=human("hi"), stream_mode="values", multitask_strategy="rollback"
                )
            ]
            assert contents(parts[-1].data) == ["first", "echo: first", "hi", "echo: hi"]  # no "sleep 5"
            for gone in (long, queued):
                try:
                    await client.runs.get(thread_id, gone["run_id"])
                except NotFoundError:
                    continue
                raise AssertionError(f"run {gone['run_id']} was not deleted")
            assert [r["status"] for r in await client.runs.list(thread_id)] == ["success", "success"]
        finally:
            await client.aclose()

    asyncio.run(main())


def test_multitask_strategies_across_two_processes(backend: Backend) -> None:
    """A run on one process, interrupted (one thread) and rolled back (another) by a run sent to the other."""
    args = ["server.agents:serve_agents", *backend.serve_args, "--poll-interval", "0.05"]
    first, second = ServeProcess(*args), ServeProcess(*args)
    try:
        first.wait_ready()
        second.wait_ready()
        with get_sync_client(url=first.url, api_key=None) as a, get_sync_client(url=second.url, api_key=None) as b:
            for strategy, expected in (
                ("interrupt", ["sleep 5", "hi", "echo: hi"]),
                ("rollback", ["hi", "echo: hi"]),
            ):
                thread_id = a.threads.create()["thread_id"]
                stream = a.runs.stream(thread_id, "agent", input=human("sleep 5"), stream_mode="values")
                run_id = next(stream).data["run_id"]  # it runs on the first process
                wait_for_input(b, thread_id, "sleep 5")
                values = b.runs.wait(thread_id, "agent", input=human("hi"), multitask_strategy=strategy)
                assert contents(values) == expected, strategy
                rest = list(stream)  # the first process's stream of the cancelled run ends
                assert rest and rest[-1].event == "values", strategy
                if strategy == "interrupt":
                    assert b.runs.get(thread_id, run_id)["status"] == "interrupted"
                else:
                    try:
                        b.runs.get(thread_id, run_id)
                    except NotFoundError:
                        pass
                    else:
                        raise AssertionError("the rolled back run was not deleted")
    finally:
        first.stop()
        second.stop()


def test_an_unknown_strategy_is_refused(served: Served) -> None:
    client = served.client()
    thread_id = client.threads.create()["thread_id"]
    try:
        client.runs.create(thread_id, "agent", input=human("x"), multitask_strategy="replace")  # type: ignore[arg-type]
    except UnprocessableEntityError as error:
        assert error.body["param"] == "multitask_strategy"
    else:
        raise AssertionError("an unknown strategy was accepted")
