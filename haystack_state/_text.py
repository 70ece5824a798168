"""
Text that can be stored. Every backend keeps text as UTF-8 (SQLite's TEXT, PostgreSQL's text and jsonb), and a
Python ``str`` may hold what UTF-8 cannot encode: a *lone surrogate*, a code point between U+D800 and U+DFFF, half
of a UTF-16 pair rather than a character (JSON's ``"\\ud800"`` escape decodes to one). PostgreSQL's jsonb, and JSON
paths, cannot hold a NUL character (U+0000) either.

- :func:`text_problem` says what is wrong with one string (ASCII text costs one flag test);
- :func:`find_bad_text` finds the first such string in a value, dict keys included, and where it is;
- :func:`repaired` reads stored JSON written before such text was refused: the bad characters become U+FFFD and a
  warning names the thread; :func:`lenient_text` decodes a SQLite cell that is not valid UTF-8 the same way.

Writes refuse such text (a State and the checkpointers with
:class:`~haystack_state.errors.UnstorableTextError`, the server with HTTP 422); reads repair it, so stored data
never fails a read.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from haystack import logging

#: Parsed JSON data (dicts, lists, strings, numbers, booleans, None), as :func:`repair` and :func:`repaired` take it.
J = TypeVar("J")

__all__ = [
    "BadText",
    "find_bad_text",
    "lenient_text",
    "repaired",
    "replace_surrogates",
    "shown",
    "surrogate_at",
    "text_problem",
]

logger = logging.getLogger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def surrogate_at(text: str) -> int:
    """
    Where the first lone surrogate of a string is, or -1 if it has none (ASCII text: one flag test).

    :param text: The string.
    :returns: The position, or -1.
    """
    if text.isascii():
        return -1
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return int(error.start)
    return -1


def text_problem(text: str, *, nul: bool = False) -> str | None:
    """
    What makes a string unstorable, or None.

    :param text: The string.
    :param nul: Refuse NUL characters too (text that a JSON path or PostgreSQL's jsonb must hold).
    :returns: ``"lone surrogate '\\ud800' at position 3 is not valid Unicode text"``, or None.
    """
    if nul:
        at = text.find("\x00")
        if at >= 0:
            return f"NUL character '\\x00' at position {at} cannot be stored or queried (PostgreSQL refuses it)"
    at = surrogate_at(text)
    if at < 0:
        return None
    return f"lone surrogate {text[at]!a} at position {at} is not valid Unicode text"


def shown(text: str, limit: int = 60) -> str:
    """A string as an error message may show it: quoted, at most ``limit`` characters, unprintables escaped."""
    quoted = ascii(text) if not text.isprintable() else repr(text)
    return quoted if len(quoted) <= limit else quoted[: limit - 4] + "...'"


# --- finding it ----------------------------------------------------------------------------------------------------

#: A step into a value: ``("key", k)`` a dict's value, ``("index", i)`` a sequence's item, ``("field", name)`` a
#: dataclass field, ``("member", item)`` a set's member.
Segment = tuple[str, Any]


@dataclasses.dataclass(frozen=True)
class BadText:
    """
    Text found by :func:`find_bad_text`.

    :param path: The steps from the value to the string (to the dict, for a bad key).
    :param problem: What is wrong (naming the key, for a bad key).
    """

    path: tuple[Segment, ...]
    problem: str

    def python_path(self) -> str:
        """The path as Python spells it: ``['notes'][2].text`` (empty for the value itself)."""
        parts = []
        for kind, step in self.path:
            if kind == "field":
                parts.append(f".{step}")
            elif kind == "member":
                parts.append(f"{{{step!r}}}")
            else:
                parts.append(f"[{step!r}]")
        return "".join(parts)

    def wire_path(self, root: str) -> str:
        """The path as the server names request fields, from ``root``: ``input.messages.0.content``."""
        return ".".join(part for part in (root, *(str(step) for _, step in self.path)) if part)


def find_bad_text(value: object, *, nul: bool = False, finite: bool = False) -> BadText | None:
    """
    The first string of a value that cannot be stored: the value itself, dict keys and values, items of lists,
    tuples, sets and deques, and dataclass fields, however deep (other objects are not looked into).

    :param value: The value.
    :param nul: Refuse NUL characters too.
    :param finite: Refuse non-finite floats too (``NaN`` and ``Infinity`` are not JSON numbers).
    :returns: Where it is and what is wrong, or None if every string is fine.
    """
    stack: list[tuple[object, tuple[Segment, ...]]] = [(value, ())]
    seen: set[int] = set()
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item, nul=nul)
            if problem is not None:
                return BadText(path, problem)
            continue
        if isinstance(item, float):
            if finite and not math.isfinite(item):
                number = "NaN" if math.isnan(item) else "Infinity" if item > 0 else "-Infinity"
                return BadText(path, f"{number} is not a JSON number")
            continue
        if item is None or isinstance(item, int | bytes) or id(item) in seen:
            continue
        children: list[tuple[object, tuple[Segment, ...]]] = []
        if isinstance(item, Mapping):
            seen.add(id(item))
            for key, sub in item.items():
                if isinstance(key, str):
                    problem = text_problem(key, nul=nul)
                    if problem is not None:
                        return BadText(path, f"key {shown(key)}: {problem}")
                else:
                    children.append((key, (*path, ("member", key))))
                children.append((sub, (*path, ("key", key))))
        elif isinstance(item, list | tuple | collections.deque):
            seen.add(id(item))
            children = [(sub, (*path, ("index", index))) for index, sub in enumerate(item)]
        elif isinstance(item, set | frozenset):
            seen.add(id(item))
            children = [(sub, (*path, ("member", sub))) for sub in item]
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            seen.add(id(item))
            for field in dataclasses.fields(item):
                if hasattr(item, field.name):
                    children.append((getattr(item, field.name), (*path, ("field", field.name))))
        stack.extend(reversed(children))
    return None


# --- reading what was stored before ----------------------------------------------------------------------------------


def replace_surrogates(text: str) -> str:
    """
    The text with each lone surrogate replaced by U+FFFD (the text itself if it has none; ASCII: one flag test).

    :param text: The string.
    :returns: Text that can be stored.
    """
    return _SURROGATE.sub(_REPLACEMENT, text) if surrogate_at(text) >= 0 else text


def repair(data: J) -> tuple[J, int]:
    """
    Replace every lone surrogate in parsed JSON data (dict keys included) by U+FFFD, in place where it can.

    :param data: Parsed JSON data (dicts, lists, strings, numbers, booleans, None).
    :returns: The data, and how many strings were changed.
    """
    if isinstance(data, str):
        fixed = replace_surrogates(data)
        return cast(J, fixed), int(fixed is not data)
    changed = 0
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if type(node) is list:
            for index, item in enumerate(node):
                if type(item) is str:
                    fixed = replace_surrogates(item)
                    if fixed is not item:
                        node[index] = fixed
                        changed += 1
                elif type(item) in (list, dict):
                    stack.append(item)
        elif type(node) is dict:
            if not all(surrogate_at(key) < 0 for key in node if type(key) is str):
                items = list(node.items())
                node.clear()
                for key, item in items:
                    fixed_key = replace_surrogates(key) if type(key) is str else key
                    changed += fixed_key is not key
                    node[fixed_key] = item
            for key, item in node.items():
                if type(item) is str:
                    fixed = replace_surrogates(item)
                    if fixed is not item:
                        node[key] = fixed  # (a value replaced while iterating: the dict does not change size)
                        changed += 1
                elif type(item) in (list, dict):
                    stack.append(item)
    return data, changed


def repaired(data: J, text: str, *, thread_id: str | None, checkpoint_id: str | None = None, what: str = "data") -> J:
    """
    Stored JSON data as it may be read: text written before lone surrogates were refused holds them as ``\\udXXX``
    escapes (what is written now never does), and they are replaced by U+FFFD, with a warning naming the thread.
    Text without such escapes costs two substring searches.

    :param data: The data parsed from ``text`` (changed in place).
    :param text: The stored JSON text.
    :param thread_id: The thread the data belongs to, for the warning (None if it belongs to none).
    :param checkpoint_id: The checkpoint it belongs to, if any, for the warning.
    :param what: What the data is (``"delta"``, ``"metadata"``), for the warning.
    :returns: The data.
    """
    if "\\ud" not in text and "\\uD" not in text:
        return data
    data, changed = repair(data)
    if changed:
        _warn(thread_id, checkpoint_id, what)
    return data


@functools.lru_cache(maxsize=4096)  # once per thread and place while it stays in memory: reads repeat
def _warn(thread_id: str | None, checkpoint_id: str | None, what: str) -> None:
    subject = "The stored"
    if thread_id is not None:
        at = f", checkpoint {checkpoint_id!r}" if checkpoint_id is not None else ""
        subject = f"Thread {thread_id!r}{at}: the stored"
    logger.warning(
        "{subject} {what} holds text that is not valid Unicode (lone surrogates, written before haystack-state "
        "refused them); it reads with U+FFFD in place of each bad character. Write the value again to store it "
        "repaired.",
        subject=subject,
        what=what,
    )


def lenient_text(raw: bytes) -> str:
    """
    A SQLite text cell that is not valid UTF-8 (written by another program), decoded with each undecodable byte as
    a ``\\udcXX`` JSON escape: in a JSON column, :func:`repaired` then reads it as U+FFFD and names the thread.

    :param raw: The cell's bytes.
    :returns: The text.
    """
    text = raw.decode("utf-8", "surrogateescape")
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
