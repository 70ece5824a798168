"""
``/store``: put, get, delete and search items, and list namespaces, as the Agent Protocol (and LangGraph's SDK)
define them. The router only translates: the app's :class:`~haystack_state.store.Store` does the work, through its
async methods.

With ``auth``, each user has a namespace tree of their own (see :mod:`haystack_state.server._stores`): another user's
items are never found (404, or an empty list), never overwritten and never listed. TTLs travel in minutes, as
LangGraph's SDK sends them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from haystack_state.errors import StoreInputError
from haystack_state.server._context import Server, ServerDep, UserDep
from haystack_state.server._responses import REFUSED, ListNamespaceResponse, SearchItemsResponse, json_answer
from haystack_state.server._responses import Item as ItemAnswer
from haystack_state.server._stores import owned, unowned
from haystack_state.server._text import check_request
from haystack_state.store.base import Store
from haystack_state.store.records import Item, check_key, check_namespace, check_prefix

router = APIRouter(prefix="/store", tags=["Store"], dependencies=[Depends(check_request)], responses=REFUSED)


class StorePut(BaseModel):
    """``PUT /store/items``."""

    model_config = ConfigDict(extra="forbid")
    namespace: list[str]
    key: str
    value: dict[str, Any]
    index: bool | list[str] | None = None
    ttl: float | None = Field(default=None, gt=0, description="Minutes until the item expires.")


class StoreDelete(BaseModel):
    """``DELETE /store/items``."""

    model_config = ConfigDict(extra="forbid")
    namespace: list[str] = Field(default_factory=list)
    key: str


class StoreSearch(BaseModel):
    """``POST /store/items/search``."""

    model_config = ConfigDict(extra="forbid")
    namespace_prefix: list[str] | None = None
    filter: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)
    query: str | None = None
    refresh_ttl: bool | None = None


class StoreNamespaces(BaseModel):
    """``POST /store/namespaces``."""

    model_config = ConfigDict(extra="forbid")
    prefix: list[str] | None = None
    suffix: list[str] | None = None
    max_depth: int | None = Field(default=None, ge=1)
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0)


def _store(server: Server) -> Store:
    if server.store is None:
        raise HTTPException(404, "This server has no store.")
    return server.store


def _checked(namespace: list[str], key: str | None = None) -> tuple[str, ...]:
    try:
        labels = check_namespace(namespace)
    except StoreInputError as error:
        raise _unprocessable("namespace", error) from None
    try:
        if key is not None:
            check_key(key, labels)
    except StoreInputError as error:
        raise _unprocessable("key", error) from None
    return labels


class FieldError(HTTPException):
    """A 422 naming the request field at fault (answered by :func:`unprocessable_response`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(422, message)
        self.field = field


def _unprocessable(field: str, error: StoreInputError) -> FieldError:
    return FieldError(field, str(error))


def _view(user: str, item: Item) -> dict[str, Any]:
    data = item.to_dict()
    data["namespace"] = list(unowned(user, item.namespace))
    return data


def _query_namespace(namespace: list[str] | None) -> list[str]:
    """The namespace of a query string: repeated values, or one dotted value (as LangGraph's SDK sends it)."""
    if not namespace:
        return []
    return namespace[0].split(".") if len(namespace) == 1 else namespace


@router.put("/items", status_code=204)
async def put_item(body: StorePut, server: ServerDep, user: UserDep) -> Response:
    """Insert or replace an item."""
    store = _store(server)
    labels = _checked(body.namespace, body.key)
    try:
        await store.aput(
            owned(user, labels),
            body.key,
            body.value,
            ttl=body.ttl * 60 if body.ttl is not None else None,
            index=body.index,
        )
    except StoreInputError as error:
        raise _unprocessable("value", error) from None
    return Response(status_code=204)


@router.get("/items", response_model=ItemAnswer)
async def get_item(
    server: ServerDep,
    user: UserDep,
    key: str,
    namespace: Annotated[list[str] | None, Query()] = None,
    refresh_ttl: bool | None = None,
) -> Response:
    """One item (404 if there is none for this user)."""
    store = _store(server)
    labels = _checked(_query_namespace(namespace), key)
    item = await store.aget(owned(user, labels), key, refresh_ttl=refresh_ttl is not False)
    if item is None:
        raise HTTPException(404, f"No item with key {key!r} in namespace {list(labels)!r}.")
    return json_answer(_view(user, item))


@router.delete("/items", status_code=204)
async def delete_item(body: StoreDelete, server: ServerDep, user: UserDep) -> Response:
    """Delete an item (404 if there is none for this user)."""
    store = _store(server)
    labels = _checked(body.namespace, body.key)
    if not await store.adelete(owned(user, labels), body.key):
        raise HTTPException(404, f"No item with key {body.key!r} in namespace {list(labels)!r}.")
    return Response(status_code=204)


@router.post("/items/search", response_model=SearchItemsResponse)
async def search_items(body: StoreSearch, server: ServerDep, user: UserDep) -> Response:
    """The user's items under a namespace prefix, filtered, ranked by ``query`` and paged."""
    store = _store(server)
    try:
        prefix = check_prefix(body.namespace_prefix)
        found = await store.asearch(
            owned(user, prefix),
            query=body.query,
            filter=body.filter,
            limit=body.limit,
            offset=body.offset,
            refresh_ttl=body.refresh_ttl is not False,
        )
    except StoreInputError as error:
        raise _unprocessable("filter" if "filter" in str(error) else "namespace_prefix", error) from None
    return json_answer({"items": [_view(user, item) for item in found]})


@router.post("/namespaces", response_model=ListNamespaceResponse)
async def list_namespaces(body: StoreNamespaces, server: ServerDep, user: UserDep) -> Response:
    """The user's namespaces, filtered by prefix and suffix, cut to ``max_depth``, paged."""
    store = _store(server)
    try:
        prefix = check_prefix(body.prefix, "prefix")
        found = await store.alist_namespaces(
            prefix=owned(user, prefix),
            suffix=body.suffix,
            max_depth=body.max_depth + len(owned(user, ())) if body.max_depth is not None else None,
            limit=body.limit,
            offset=body.offset,
        )
    except StoreInputError as error:
        raise _unprocessable("suffix" if "suffix" in str(error) else "prefix", error) from None
    return json_answer({"namespaces": [list(unowned(user, namespace)) for namespace in found]})


def unprocessable_response(error: FieldError) -> JSONResponse:
    """The spec's 422 shape for a :class:`FieldError`: the message, and the field as ``param``."""
    field, message = error.field, str(error.detail)
    return JSONResponse(
        {"detail": message, "param": field, "errors": [{"field": field, "message": message}]}, status_code=422
    )
