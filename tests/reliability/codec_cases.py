"""
The hostile stored data of the codec fuzz test: type names that would run code if anything imported or resolved them,
the places a type tag can sit, and checkpoint rows written straight into a SQLite file as an attacker would.

``python -m reliability.codec_cases`` (with ``tests/`` as the working directory) runs every case in a fresh
interpreter and prints a JSON report: which cases failed to fail cleanly, and which modules got imported while the
cases ran (there must be none).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage, Document

from haystack_state import CodecError
from haystack_state.persistence import SQLiteCheckpointer, decode, encode, extend, registered_names

#: Names of code that runs on import or on call, of modules that do not exist, and tricks on the names of allowed types.
EVIL_NAMES: list[str] = [
    # modules that run code on import
    "antigravity",
    "this",
    "antigravity.geohash",
    "this.s",
    # callables that run commands, load code or unpickle
    "os.system",
    "os.popen",
    "posix.system",
    "nt.system",
    "subprocess.Popen",
    "subprocess.run",
    "subprocess.check_output",
    "pickle.loads",
    "_pickle.loads",
    "marshal.loads",
    "builtins.eval",
    "builtins.exec",
    "builtins.compile",
    "builtins.__import__",
    "builtins.getattr",
    "builtins.open",
    "__builtins__.eval",
    "__builtin__.eval",
    "__import__",
    "eval",
    "exec",
    "importlib.import_module",
    "importlib.__import__",
    "runpy.run_path",
    "runpy.run_module",
    "pydoc.locate",
    "ctypes.CDLL",
    "webbrowser.open",
    "pdb.set_trace",
    "code.interact",
    "shutil.rmtree",
    "socket.socket",
    "sys.exit",
    "operator.attrgetter",
    "functools.partial",
    "copyreg._reconstructor",
    "types.FunctionType",
    "collections.OrderedDict",
    "__main__.Exploit",
    # modules that do not exist
    "nonexistent_module_7f3a",
    "nonexistent_module_7f3a.Thing",
    "nonexistent_module_7f3a.sub.Thing",
    # dotted tricks and look-alikes of allowed names
    ".os.system",
    "os..system",
    "os.system.",
    "os/system",
    "os:system",
    "os.system()",
    "haystack.dataclasses.ChatMessage",
    "haystack.dataclasses.chat_message.ChatMessage",
    "haystack.ChatMessage.from_dict",
    "haystack.ChatMessage.__class__",
    "haystack.ChatMessage ",
    " haystack.ChatMessage",
    "HAYSTACK.ChatMessage",
    "haystack.chatmessage",
    "haystack.",
    "haystack_state.State",
    "haystack_state.persistence.codec.decode",
    "Dict",
    "DICT",
    "dict ",
    "tuple.__class__",
    "bytes.fromhex",
    "set\x00",
    "dict\x00os.system",
    "\u0434ict",  # a Cyrillic letter
    "\uff4f\uff53.system",  # fullwidth "os"
    "",
    "__type__",
    "data",
    "__class__.__mro__[1].__subclasses__()",
    "../../../../etc/passwd",
    "file:///etc/passwd",
    "${jndi:ldap://example.invalid/a}",
    "{{7*7}}",
    "x" * 5000,
]

#: Modules a name above refers to that nothing in haystack-state loads; none may be imported by decoding.
NAMED_MODULES = ["antigravity", "this", "webbrowser", "pdb", "code", "runpy", "pydoc", "nonexistent_module_7f3a"]


def tag(name: Any, data: Any = "echo pwned") -> dict[str, Any]:
    return {"__type__": name, "data": data}


#: Where a type tag can sit in stored data: each builds the stored data around the hostile tag.
POSITIONS: dict[str, Callable[[Any], Any]] = {
    "top-level": lambda t: t,
    "list-item": lambda t: [1, "two", t],
    "nested-dict-value": lambda t: {"a": {"b": [None, t]}},
    "dict-pair-key": lambda t: tag("dict", [[1, "one"], [t, "two"]]),
    "dict-pair-value": lambda t: tag("dict", [[1, t]]),
    "tuple-item": lambda t: tag("tuple", [t]),
    "set-item": lambda t: tag("set", ["a", t]),
    "frozenset-item": lambda t: tag("frozenset", [t]),
    "document-meta": lambda t: tag("haystack.Document", {"id": "d", "content": "x", "meta": {"k": t}}),
    "chat-message-meta": lambda t: tag(
        "haystack.ChatMessage", {"role": "user", "meta": {"k": [t]}, "name": None, "content": [{"text": "hi"}]}
    ),
    "tag-inside-unknown-tag-data": lambda t: tag("os.system", t),
    "deeply-nested": lambda t: _nest(t, 40),
}


def _nest(value: Any, depth: int) -> Any:
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def shown(name: Any) -> str:
    """How an error message shows a stored type name (its repr, maybe shortened): what a test looks for."""
    return repr(name)[:60]


def benign_values() -> list[Any]:
    """Encoded values of every kind the codec loads, to decode before counting imported modules."""
    values = [
        (1, 2.5, "x"),
        {1: "a", (1, 2): frozenset({3})},
        {b"bytes", None},
        float("nan"),
        ChatMessage.from_user("hi", meta={"a": [1]}),
        Document(content="x", meta={"a": 1}),
        uuid.UUID(int=5),
    ]
    return [encode(value) for value in values]


# --- rows written straight into SQLite ----------------------------------------------------------------------------


def _row_payloads(evil: Any) -> dict[str, tuple[dict[str, Any], Any]]:
    """Per row variant: the delta and the metadata of the hostile checkpoint."""
    return {
        "delta-extend-item": ({"notes": {"op": "extend", "items": ["fine", evil]}}, {}),
        "delta-replace-nested": ({"profile": {"op": "replace", "value": {"a": [1, {"b": evil}]}}}, {}),
        "delta-replace-dict-key": ({"profile": {"op": "replace", "value": tag("dict", [[evil, 1]])}}, {}),
        "metadata-value": ({"notes": {"op": "extend", "items": ["fine"]}}, {"pending": [evil]}),
        "metadata-top-level": ({"notes": {"op": "extend", "items": ["fine"]}}, evil),
    }


ROW_VARIANTS = list(_row_payloads(None))


def write_hostile_row(path: Path, thread_id: str, variant: str, evil: Any) -> tuple[str, str]:
    """
    Create a thread with two honest checkpoints, then insert a third one with sqlite3 directly, holding ``evil`` where
    ``variant`` says, and make it the head.

    :returns: The ids of the last honest checkpoint and of the hostile one.
    """
    with SQLiteCheckpointer(path) as cp:
        first = cp.commit(
            thread_id, parent_id=None, expected_head=None, delta={"notes": extend(["n1"])}, step=0, source="input"
        )
        second = cp.commit(
            thread_id,
            parent_id=first.checkpoint_id,
            expected_head=first.checkpoint_id,
            delta={"notes": extend(["n2"])},
            step=1,
            source="model",
        )
    delta, metadata = _row_payloads(evil)[variant]
    hostile = str(uuid.uuid4())
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO haystack_state_checkpoints (thread_id, checkpoint_id, seq, parent_id, step, source, "
            "tool_names, changed_keys, created_at, metadata, delta) VALUES (?, ?, 3, ?, 2, 'tools', '[]', ?, ?, ?, ?)",
            (
                thread_id,
                hostile,
                second.checkpoint_id,
                json.dumps(list(delta)),
                "2030-01-01T00:00:00+00:00",
                json.dumps(metadata),
                json.dumps(delta),
            ),
        )
        conn.execute(
            "UPDATE haystack_state_threads SET head_id = ?, last_seq = 3 WHERE thread_id = ?", (hostile, thread_id)
        )
        conn.execute("COMMIT")
    return second.checkpoint_id, hostile


def read_hostile_row(path: Path, thread_id: str, variant: str, honest_id: str) -> str:
    """
    Read the thread back with a fresh checkpointer: the hostile head must fail to load with a CodecError (its values
    for a hostile delta, its record for hostile metadata), and the honest checkpoint before it must still load.

    :returns: The error message.
    """
    with SQLiteCheckpointer(path, cache_size=0) as cp:
        try:
            if variant.startswith("delta"):
                cp.get(thread_id)
            else:
                cp.history(thread_id)
        except CodecError as error:
            message = str(error)
        else:
            raise AssertionError(f"{variant}: the hostile checkpoint loaded")
        assert cp.get(thread_id, honest_id).values["notes"] == ["n1", "n2"]
    return message


# --- the clean-interpreter run -------------------------------------------------------------------------------------


def run_all() -> dict[str, Any]:
    """Run every case; report those that did not fail with a CodecError naming the type, and new modules."""
    from haystack_state.persistence import loads

    failures: list[str] = []
    cases = 0
    with tempfile.TemporaryDirectory() as folder:
        # Warm up: load every kind of value, and read a SQLite file, before counting modules.
        for data in benign_values():
            decode(data)
        loads(json.dumps(benign_values()))
        write_hostile_row(Path(folder) / "warm.sqlite", "warm", "delta-extend-item", "harmless")
        with SQLiteCheckpointer(Path(folder) / "warm.sqlite") as cp:
            cp.get("warm")
            cp.history("warm")
        registered = set(registered_names())
        absent = [name for name in NAMED_MODULES if name not in sys.modules]
        before = set(sys.modules)
        for name in EVIL_NAMES:
            for position, build in POSITIONS.items():
                cases += 1
                try:
                    decode(build(tag(name)), key="k")
                except CodecError as error:
                    if shown(name) not in str(error) and position != "tag-inside-unknown-tag-data":
                        failures.append(f"{position} {name!r}: the error does not name the type: {error}")
                except Exception as error:
                    failures.append(f"{position} {name!r}: {type(error).__name__}: {error}")
                else:
                    failures.append(f"{position} {name!r}: decoded")
        for index, name in enumerate(EVIL_NAMES[:20]):
            for variant in ROW_VARIANTS:
                cases += 1
                path = Path(folder) / f"{index}-{variant}.sqlite"
                honest, hostile = write_hostile_row(path, "t", variant, tag(name))
                try:
                    message = read_hostile_row(path, "t", variant, honest)
                except Exception as error:
                    failures.append(f"row {variant} {name!r}: {type(error).__name__}: {error}")
                    continue
                if not all(part in message for part in ("'t'", hostile, shown(name))):
                    failures.append(f"row {variant} {name!r}: the error does not name the thread/checkpoint/type")
    return {
        "cases": cases,
        "failures": failures,
        "new_modules": sorted(set(sys.modules) - before),
        "named_modules_absent_before": absent,
        "named_modules_loaded": [name for name in absent if name in sys.modules],
        "registered_names_unchanged": set(registered_names()) == registered,
    }


if __name__ == "__main__":
    print(json.dumps(run_all()))
