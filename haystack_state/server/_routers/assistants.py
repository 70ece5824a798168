"""``/assistants``: the served agents (search, count, get, schemas)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Response
from pydantic import TypeAdapter

from haystack_state.server._assistants import Assistant
from haystack_state.server._context import ServerDep, UserDep
from haystack_state.server._models import AssistantCount, AssistantSearch
from haystack_state.server._responses import REFUSED, Graph, GraphSchema, json_answer
from haystack_state.server._responses import Assistant as AssistantAnswer
from haystack_state.server._text import check_request
from haystack_state.server._views import select

router = APIRouter(prefix="/assistants", tags=["Assistants"], dependencies=[Depends(check_request)], responses=REFUSED)


def _matches(assistant: Assistant, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None) -> bool:
    view = assistant.view()
    if graph_id is not None and view["graph_id"] != graph_id:
        return False
    if name is not None and name.lower() not in view["name"].lower():
        return False
    return all(view["metadata"].get(key) == value for key, value in (metadata or {}).items())


@router.post("/search", response_model=list[AssistantAnswer])
async def search_assistants(body: AssistantSearch, server: ServerDep, _: UserDep) -> Response:
    """
    The assistants matching the filters, paged (``X-Pagination-Next`` holds the next page's offset); with ``select``,
    only the fields it names.
    """
    found = [a.view() for a in server.assistants if _matches(a, body.graph_id, body.name, body.metadata)]
    if body.sort_by is not None:
        found.sort(key=lambda item: str(item[body.sort_by or "name"]), reverse=body.sort_order == "desc")
    page = found[body.offset : body.offset + body.limit]
    answer = json_answer([select(item, body.select) for item in page])
    if body.offset + body.limit < len(found):
        answer.headers["X-Pagination-Next"] = str(body.offset + body.limit)
    return answer


@router.post("/count", response_model=int)
async def count_assistants(body: AssistantCount, server: ServerDep, _: UserDep) -> Response:
    """How many assistants match the filters."""
    return json_answer(sum(_matches(a, body.graph_id, body.name, body.metadata) for a in server.assistants))


def _assistant(server: ServerDep, assistant_id: str) -> Assistant:
    assistant = server.assistants.resolve(assistant_id)
    if assistant is None:
        raise HTTPException(404, f"Assistant '{assistant_id}' not found.")
    return assistant


@router.get("/{assistant_id}", response_model=AssistantAnswer)
async def get_assistant(assistant_id: str, server: ServerDep, _: UserDep) -> Response:
    """One assistant, by id or name."""
    return json_answer(_assistant(server, assistant_id).view())


@router.get("/{assistant_id}/schemas", response_model=GraphSchema)
async def get_assistant_schemas(assistant_id: str, server: ServerDep, _: UserDep) -> Response:
    """The JSON schemas of the assistant's state (its input and output are state keys)."""
    assistant = _assistant(server, assistant_id)
    agent = assistant.agent
    properties: dict[str, Any] = {"messages": {"type": "array", "items": {"type": "object"}}}
    for key, entry in agent.state_schema.items():
        try:
            properties[key] = TypeAdapter(entry["type"]).json_schema()
        except Exception:  # a type pydantic cannot describe: say only that it exists
            properties[key] = {}
        if entry.get("description"):
            properties[key]["description"] = entry["description"]
    state_schema = {"title": assistant.name, "type": "object", "properties": properties}
    return json_answer(
        {
            "graph_id": assistant.name,
            "input_schema": state_schema,
            "output_schema": state_schema,
            "state_schema": state_schema,
            "config_schema": None,
            "context_schema": None,
        }
    )


@router.get("/{assistant_id}/graph", response_model=Graph)
async def get_assistant_graph(assistant_id: str, server: ServerDep, _: UserDep, xray: bool | int = False) -> Response:
    """
    The assistant drawn as LangGraph draws an agent: ``__start__`` → ``model`` ⇄ ``tools`` → ``__end__`` (the
    model's edges are conditional: to the tools when it calls some, else to the end). ``tools`` is left out for an
    agent without tools; ``xray`` adds nothing (an Agent has no subgraphs).
    """
    agent = _assistant(server, assistant_id).agent
    nodes: list[dict[str, Any]] = [
        {"id": "__start__", "type": "schema", "data": "__start__"},
        {"id": "model", "type": "runnable", "data": {"id": ["haystack_state", "Agent", "model"], "name": "model"}},
        {"id": "__end__", "type": "schema", "data": "__end__"},
    ]
    edges: list[dict[str, Any]] = [{"source": "__start__", "target": "model", "conditional": False}]
    if agent.tools:
        nodes.insert(
            2,
            {"id": "tools", "type": "runnable", "data": {"id": ["haystack_state", "Agent", "tools"], "name": "tools"}},
        )
        edges += [
            {"source": "model", "target": "tools", "conditional": True},
            {"source": "model", "target": "__end__", "conditional": True},
            {"source": "tools", "target": "model", "conditional": True},
            {"source": "tools", "target": "__end__", "conditional": True},
        ]
    else:
        edges.append({"source": "model", "target": "__end__", "conditional": False})
    return json_answer({"nodes": nodes, "edges": edges})


@router.get("/{assistant_id}/subgraphs", response_model=dict[str, GraphSchema])
@router.get("/{assistant_id}/subgraphs/{namespace}", response_model=dict[str, GraphSchema])
async def get_assistant_subgraphs(
    assistant_id: str, server: ServerDep, _: UserDep, namespace: str | None = None, recurse: bool = False
) -> Response:
    """An Agent has no subgraphs: ``{}`` (a subgraph's schemas by its namespace)."""
    _assistant(server, assistant_id)
    return json_answer({})
