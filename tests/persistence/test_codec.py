"""The safe JSON codec: round trips, the allowlist, and errors that say where and what."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import sys
import uuid
from typing import Any, NamedTuple

import pydantic
import pytest
from haystack.dataclasses import (
    ByteStream,
    ChatMessage,
    ChatRole,
    Document,
    FileContent,
    ImageContent,
    ReasoningContent,
    SparseEmbedding,
    TextContent,
    ToolCall,
    ToolCallResult,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_state import values as state_values
from haystack_state.errors import CodecError
from haystack_state.persistence import decode, dumps, encode, loads, register_type, registered_names

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
PDF = "JVBERi0xLjQKJcOkw7zDtsOfCjIgMCBvYmoKPDwvTGVuZ3RoIDMgMCBSPj4Kc3RyZWFtCg=="


def same(a: Any, b: Any) -> bool:
    """Equality that also requires the same types everywhere (1 != 1.0 != True) and the same dict order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a.items(), b.items(), strict=True))
    if isinstance(a, dt.datetime | dt.time):
        return a == b and a.utcoffset() == b.utcoffset()
    return bool(a == b)


def roundtrip(value: Any) -> Any:
    text = dumps(value)
    assert json.loads(text) == encode(value)  # the stored form is plain JSON
    return loads(text)


# --- built-in values -----------------------------------------------------------------------------------------------

hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8) | st.dates(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
fixed_offsets = st.builds(
    dt.timezone,
    st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)),
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.datetimes(timezones=st.none() | st.just(dt.UTC) | fixed_offsets)
    | st.dates()
    | st.times()
    | st.timedeltas()
    | st.decimals(allow_nan=False)
    | st.uuids()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=10), inner, max_size=5)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=25,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(values)
def test_nested_builtin_values_round_trip_exactly(value: Any) -> None:
    assert same(roundtrip(value), value)


@pytest.mark.parametrize(
    "value",
    [
        math.inf,
        -math.inf,
        -0.0,
        1e308,
        5e-324,
        2**200,
        -(2**70),
        "\ud800 lone surrogate",
        "\x00 nul and ünïcödé ✓",
        bytearray(b"\x00\xff"),
        {"__type__": "haystack.ChatMessage", "data": {}},  # a user dict that looks like a tag
        {"__type__": 1, "other": [{"__type__": "x"}]},
        {1: "int key", "1": "str key", (1, 2): "tuple key", None: "none key", frozenset({1}): "set key"},
        dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
        decimal.Decimal("1.2300"),
        decimal.Decimal("-Infinity"),
        [(), set(), frozenset(), {}, [], b""],
    ],
)
def test_edge_values_round_trip(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_nan_round_trips_as_tagged_json() -> None:
    text = dumps([math.nan])
    assert "NaN" not in text  # strict JSON: no bare NaN literals
    assert math.isnan(loads(text)[0])


def test_sets_encode_deterministically() -> None:
    assert dumps({3, "a", (1, 2), b"x", None}) == dumps({None, b"x", (1, 2), "a", 3})


class FrozenDict(dict[str, Any]):
    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError("read-only")


class FrozenList(list[Any]):
    def append(self, item: Any) -> None:
        raise TypeError("read-only")


def test_read_only_state_containers_encode_as_dict_and_list() -> None:
    value = state_values.FrozenDict(items=state_values.FrozenList([1, state_values.FrozenDict(a=2)]))
    assert encode(value) == {"items": [1, {"a": 2}]}
    back = roundtrip(value)
    assert type(back) is dict and type(back["items"]) is list and back == {"items": [1, {"a": 2}]}
    message = ChatMessage.from_user("hi", meta=state_values.FrozenDict(tags=state_values.FrozenList(["a"])))
    assert roundtrip(message) == ChatMessage.from_user("hi", meta={"tags": ["a"]})


def test_collections_types_keep_their_type() -> None:
    cases = [
        collections.Counter({"a": 2, 5: 1}),
        collections.OrderedDict([("b", 1), ("a", [2])]),
        collections.defaultdict(list, {"a": [1]}),
        collections.defaultdict(collections.Counter, {"a": collections.Counter(x=1)}),
        collections.deque([1, (2, 3)], maxlen=4),
        collections.deque(),
    ]
    for value in cases:
        back = roundtrip(value)
        assert type(back) is type(value) and back == value
        assert getattr(back, "default_factory", None) == getattr(value, "default_factory", None)
        assert getattr(back, "maxlen", None) == getattr(value, "maxlen", None)
    assert list(roundtrip(collections.OrderedDict([("b", 1), ("a", 2)]))) == ["b", "a"]


def test_other_dict_and_list_subclasses_are_refused_naming_the_key() -> None:
    for value, kind in ((FrozenDict(a=1), "dict"), (FrozenList([1]), "list")):
        with pytest.raises(CodecError, match=rf"State key 'k'.*{type(value).__name__}.*{kind} subclass"):
            encode(value, key="k")
    with pytest.raises(CodecError, match="default_factory"):
        encode(collections.defaultdict(lambda: 0), key="k")
    for stored in (
        {"__type__": "defaultdict", "data": {"factory": "os.system", "items": {}}},
        {"__type__": "deque", "data": {"items": [], "maxlen": -1}},
        {"__type__": "Counter", "data": [1, 2]},
    ):
        with pytest.raises(CodecError, match="invalid stored"):
            decode(stored, key="k")


# --- haystack dataclasses ------------------------------------------------------------------------------------------

CALL = ToolCall(
    tool_name="search", arguments={"query": "q", "filters": {"year": (2020, 2024)}}, id="c1", extra={"x": 1}
)
HAYSTACK_VALUES = [
    ChatMessage.from_user("hello", meta={"at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)}, name="alice"),
    ChatMessage.from_system("be brief"),
    ChatMessage.from_assistant(
        "thinking done",
        tool_calls=[CALL],
        reasoning=ReasoningContent(reasoning_text="hmm", extra={"sig": b"\x01"}),
        meta={"usage": {"prompt_tokens": 3}},
    ),
    ChatMessage.from_tool("result text", origin=CALL),
    ChatMessage.from_tool("boom", origin=CALL, error=True),
    ChatMessage.from_user(
        content_parts=[
            TextContent("look"),
            ImageContent(base64_image=PNG, mime_type="image/png", detail="low", meta={"n": 1}),
            FileContent(base64_data=PDF, mime_type="application/pdf", filename="a.pdf"),
        ]
    ),
    ChatMessage(
        _role=ChatRole.TOOL,
        _content=[
            ToolCallResult(result=[TextContent("part"), ImageContent(base64_image=PNG)], origin=CALL, error=False)
        ],
    ),
    TextContent("plain"),
    CALL,
    ToolCallResult(result="r", origin=CALL, error=False),
    ReasoningContent(reasoning_text="why"),
    ImageContent(base64_image=PNG, mime_type="image/png"),
    FileContent(base64_data=PDF, mime_type="application/pdf"),
    Document(content="text", meta={"source": "a", "page": 3, "when": dt.date(2024, 1, 2)}, score=0.5),
    Document(
        content="emb",
        embedding=[0.1, 0.2],
        sparse_embedding=SparseEmbedding(indices=[1, 5], values=[0.5, 0.25]),
        blob=ByteStream(data=b"\x00\x01\xff", meta={"m": (1,)}, mime_type="application/octet-stream"),
        meta={"id": "collides with a field", "content": "also"},
    ),
    Document(id="explicit-id", content="x"),
    ByteStream(data=b"bytes", meta={"k": "v"}, mime_type="text/plain"),
    SparseEmbedding(indices=[0], values=[1.0]),
    ChatRole.ASSISTANT,
]


@pytest.mark.parametrize("value", HAYSTACK_VALUES, ids=lambda v: type(v).__name__)
def test_haystack_dataclasses_round_trip(value: Any) -> None:
    back = roundtrip([value, {"nested": value}])
    assert back == [value, {"nested": value}]
    assert type(back[0]) is type(value)


def test_haystack_values_carry_short_type_tags() -> None:
    encoded = encode([ChatMessage.from_user("hi"), Document(content="d")])
    assert [item["__type__"] for item in encoded] == ["haystack.ChatMessage", "haystack.Document"]
    assert encode(ByteStream(data=b"\x00" * 30))["data"]["data"] == {"__type__": "bytes", "data": "A" * 40}
    assert {"haystack.ChatMessage", "haystack.Document", "haystack.ToolCall"} <= set(registered_names())


# --- registered application types ----------------------------------------------------------------------------------


@register_type
class Color(enum.Enum):
    RED = "red"
    BLUE = (0, 0, 255)


@register_type
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float
    label: str | None = None
    color: Color = Color.RED


@register_type(name="app.Note")
@dataclasses.dataclass
class Note:
    text: str
    tags: set[str] = dataclasses.field(default_factory=set)
    points: list[Point] = dataclasses.field(default_factory=list)
    message: ChatMessage | None = None
    cached: int = dataclasses.field(default=0, init=False)


class Address(pydantic.BaseModel):
    city: str


@register_type
class Person(pydantic.BaseModel):
    name: str
    born: dt.date
    address: Address
    tags: frozenset[str] = frozenset()
    nick: str | None = pydantic.Field(default=None, alias="nickName")
    message: ChatMessage | None = None


@register_type
class Money:
    def __init__(self, amount: decimal.Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.amount, self.currency) == (other.amount, other.currency)

    def to_dict(self) -> dict[str, Any]:
        return {"amount": self.amount, "currency": self.currency}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Money:
        return cls(data["amount"], data["currency"])


@register_type
class Pair(NamedTuple):
    left: int
    right: Point


def test_registered_types_round_trip() -> None:
    note = Note("n", {"a", "b"}, [Point(1, 2.5, "p", Color.BLUE)], ChatMessage.from_user("hi"))
    person = Person(name="Ada", born=dt.date(1815, 12, 10), address=Address(city="London"), nickName="A")
    value = [note, person, Money(decimal.Decimal("9.99"), "EUR"), Pair(1, Point(0, 0.0)), Color.BLUE, {Color.RED: 1}]
    back = roundtrip(value)
    assert back == value
    assert [type(v) for v in back] == [type(v) for v in value]
    assert back[1].nick == "A" and type(back[1].address) is Address


def test_registered_type_tags_use_their_names() -> None:
    assert encode(Point(1, 2.0))["__type__"] == "Point"
    assert encode(Note("n"))["__type__"] == "app.Note"
    assert encode(Color.BLUE) == {"__type__": "Color", "data": {"__type__": "tuple", "data": [0, 0, 255]}}
    assert "cached" not in encode(Note("n"))["data"]  # fields with init=False are not stored


def test_registration_is_idempotent_and_guarded() -> None:
    assert register_type(Point) is Point
    assert register_type(Note, name="app.Note") is Note

    @dataclasses.dataclass
    class Other:
        x: int

    with pytest.raises(CodecError, match="already registered"):
        register_type(Other, name="Point")
    with pytest.raises(CodecError, match="already registered under the name 'Point'"):
        register_type(Point, name="Point2")
    with pytest.raises(CodecError, match="reserved"):
        register_type(Other, name="tuple")
    with pytest.raises(CodecError, match="reserved"):
        register_type(Other, name="haystack.Other")
    with pytest.raises(TypeError, match="dataclass, a pydantic model"):
        register_type(type("Plain", (), {}))
    with pytest.raises(TypeError, match="expects a class"):
        register_type(Point(1, 2.0))  # type: ignore[type-var]


# --- the allowlist: loading never imports ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "subprocess.Popen",
        "pickle.loads",
        "antigravity",
        "this",
        "builtins.eval",
        "importlib.import_module",
        "haystack.core.pipeline.Pipeline",
        "haystack.components.generators.chat.OpenAIChatGenerator",
        "haystack_state.persistence.codec._Failure",
        "__main__.Point",
        "tests.persistence.test_codec.Point",
        "Plain",
        "",
        "haystack.chatmessage",
        "Point ",
        "../../etc/passwd",
    ],
)
def test_unknown_stored_types_neither_import_nor_load(name: str) -> None:
    payloads = [
        {"__type__": name, "data": {}},
        {"__type__": name, "data": ["ls -la"]},
        {"__type__": name, "data": "cos\nsystem\n(S'echo hacked'\ntR."},
        [1, {"k": {"__type__": name, "data": None}}],
        {"__type__": "dict", "data": [[{"__type__": name, "data": 1}, 2]]},
    ]
    loads(dumps(ChatMessage.from_user("warm-up")))  # let any lazy import of the happy path happen first
    before = set(sys.modules)
    for payload in payloads:
        with pytest.raises(CodecError) as raised:
            loads(json.dumps(payload), key="documents")
        assert "State key 'documents'" in str(raised.value)
        assert "unknown stored type" in str(raised.value) and repr(name)[:40] in str(raised.value)
    assert set(sys.modules) == before
    assert "antigravity" not in sys.modules and "this" not in sys.modules


def test_an_unknown_type_error_names_the_path() -> None:
    data = {"items": [1, {"meta": {"x": {"__type__": "evil.Thing", "data": 1}}}]}
    with pytest.raises(CodecError, match=r"'evil\.Thing' at state\['items'\]\[1\]\['meta'\]\['x'\]"):
        decode(data, key="state")


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"__type__": "tuple", "data": [1], "extra": 1}, "malformed tagged object"),
        ({"__type__": 3, "data": 1}, "malformed tagged object"),
        ({"__type__": "bytes", "data": "not base64!"}, "invalid stored bytes"),
        ({"__type__": "float", "data": "1e999"}, "invalid stored float"),
        ({"__type__": "datetime", "data": 5}, "invalid stored datetime"),
        ({"__type__": "dict", "data": [[1]]}, "expected a \\[key, value\\] pair"),
        ({"__type__": "dict", "data": [[[1], 2]]}, "unhashable dict key"),
        ({"__type__": "set", "data": [[1]]}, "invalid stored set"),
        (
            {"__type__": "haystack.ChatMessage", "data": {"content": []}},
            "cannot rebuild stored type 'haystack.ChatMessage'",
        ),
        ({"__type__": "Point", "data": {"x": 1}}, "cannot rebuild stored type 'Point'"),
    ],
)
def test_malformed_stored_data_is_a_codec_error(payload: Any, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        loads(json.dumps(payload))


@pytest.mark.parametrize("text", ["{", "[NaN]", "[Infinity]", '{"a": 1} x', ""])
def test_invalid_json_is_a_codec_error(text: str) -> None:
    with pytest.raises(CodecError, match="not valid JSON"):
        loads(text)


# --- unencodable values say where they are --------------------------------------------------------------------------


class Foo:
    pass


def test_unencodable_value_names_key_path_and_type() -> None:
    documents = [Document(content=str(i)) for i in range(3)] + [Document(content="3", meta={"x": Foo()})]
    with pytest.raises(CodecError) as raised:
        encode(documents, key="documents")
    assert str(raised.value).startswith(
        "State key 'documents': cannot encode value of type Foo at documents[3].meta['x']: "
        "register it with register_type(Foo)"
    )


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        ({"a": [1, (2, Foo())]}, "value['a'][1][1]", "Foo"),
        (ChatMessage.from_user("hi", meta={"deep": {"k": [Foo()]}}), "value.meta['deep']['k'][0]", "Foo"),
        (
            ChatMessage.from_assistant(tool_calls=[ToolCall("t", {"arg": Foo()})]),
            "value.content[0]['tool_call']",
            "Foo",
        ),
        ({Foo(): 1}, "value<key", "Foo"),
        (Point(1, 2.0, label=Foo()), "value.label", "Foo"),  # type: ignore[arg-type]
        ([lambda: None], "value[0]", "function"),
        ({"s": {1, object()}}, "value['s']{", "object"),
    ],
)
def test_unencodable_paths(value: Any, path: str, type_name: str) -> None:
    with pytest.raises(CodecError) as raised:
        encode(value)
    message = str(raised.value)
    assert message.startswith(f"Cannot encode value of type {type_name} at ") and path in message


def test_unregistered_classes_ask_to_be_registered() -> None:
    class Mood(enum.Enum):
        HAPPY = 1

    @dataclasses.dataclass
    class Unregistered:
        x: int

    class Row(NamedTuple):
        a: int

    for value, name in [(Mood.HAPPY, "Mood"), (Unregistered(1), "Unregistered"), (Row(1), "Row")]:
        with pytest.raises(CodecError, match=rf"register_type\({name}\)"):
            encode({"v": value}, key="k")


def test_self_referencing_values_are_a_codec_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(CodecError, match="nested too deeply or contains itself"):
        encode(loop, key="loop")


def test_a_failing_to_dict_is_reported_with_its_path() -> None:
    bad = ToolCallResult(result=[object()], origin=CALL, error=False)  # type: ignore[list-item]
    with pytest.raises(CodecError, match=r"ToolCallResult at value\[0\]: converting it failed with ValueError"):
        encode([bad])


def test_datetime_time_zone_offsets_survive() -> None:
    moment = dt.datetime(2024, 3, 31, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    back = roundtrip(moment)
    assert back == moment and back.utcoffset() == dt.timedelta(hours=2)
    assert roundtrip(dt.datetime(2024, 1, 1)).tzinfo is None
    assert roundtrip(uuid.UUID(int=5)) == uuid.UUID(int=5)


def test_every_builtin_tag_is_reserved() -> None:
    from haystack_state.persistence._registry import BUILTIN_TAGS

    samples = [{1: 2}, (1,), {1}, frozenset({1}), b"", bytearray(), math.nan, dt.datetime(2020, 1, 1)]
    samples += [dt.date(2020, 1, 1), dt.time(1), dt.timedelta(1), decimal.Decimal(1), uuid.UUID(int=1)]
    samples += [collections.Counter(), collections.OrderedDict(), collections.defaultdict(list), collections.deque()]
    assert {encode(sample)["__type__"] for sample in samples} == BUILTIN_TAGS


# --- decoding freshly parsed data in place (owned=True, what cold reads do) -------------------------------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(values)
def test_owned_decoding_gives_the_same_values(value: Any) -> None:
    text = dumps(value)
    assert same(decode(json.loads(text), owned=True), value)
    assert same(decode(json.loads(text), owned=True), decode(json.loads(text)))


@pytest.mark.parametrize("value", HAYSTACK_VALUES, ids=lambda v: type(v).__name__)
def test_owned_decoding_of_haystack_values(value: Any) -> None:
    decoded = decode(json.loads(dumps(value)), owned=True)
    assert type(decoded) is type(value) and decoded == value


def test_owned_decoding_reuses_the_parsed_containers_and_names_a_bad_path() -> None:
    data = json.loads(dumps({"plain": {"a": [1, 2]}, "tagged": [(1, 2)]}))
    plain = data["plain"]
    decoded = decode(data, owned=True)
    assert decoded["plain"] is plain  # plain data is not copied
    assert decoded["tagged"] == [(1, 2)]
    bad = {"items": [1, {"meta": {"x": {"__type__": "evil.Thing", "data": 1}}}]}
    with pytest.raises(CodecError, match=r"'evil\.Thing' at state\['items'\]\[1\]\['meta'\]\['x'\]"):
        decode(bad, key="state", owned=True)


def test_owned_decoding_of_a_message_the_fast_path_gives_up_on_halfway() -> None:
    # Its tool call (with a tuple argument) is read before its image part, which the fast path does not cover: the
    # general path then reads the stored data as it was, not as the fast path left it.
    call = ToolCall(tool_name="t", arguments={"when": (1, 2)}, id="c1")
    message = ChatMessage(_role=ChatRole.ASSISTANT, _content=[call, ImageContent(base64_image=PNG)])
    decoded = decode(json.loads(dumps(message)), owned=True)
    assert decoded == message and decoded.tool_calls[0].arguments == {"when": (1, 2)}
