"""JSON from outside the SC (request bodies, hand-written history records): Python's json parser with
integers bounded before ``int()`` sees them. Purely computational, no I/O.

Python refuses to convert an integer of more than 4,300 digits (``sys.get_int_max_str_digits``),
so ``json.loads`` of such a number raises a ValueError that names no field; here every integer
longer than any value the SC accepts is refused with the path where it was found.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import threading
from collections.abc import Iterator
from typing import Any

# No number the SC accepts has more digits: 64-bit integers have at most 19.
MAX_INTEGER_DIGITS = 20


class JsonInputError(ValueError):
    """The text cannot be taken as JSON. The message reads after a subject: "the request body <message>"."""


class _LongInteger(str):
    """Stands in for an integer too long to convert, so that its place can be found afterwards."""


_paused = 0
_paused_lock = threading.Lock()
_enabled_before = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a body from outside is parsed.

    Parsing builds one Python object per JSON value; each array or object is a container the
    collector tracks, and every 700 of them (gen0) it runs, walking the young containers and,
    each time they have grown by a quarter, all the unfrozen ones: a 1.5 MB topic body of empty
    arrays took pydantic 0.54-0.94 s to refuse and Python's parser 0.17-0.39 s beside a large
    heap, 0.13 s and 0.10 s without collections. Parsers hold the interpreter lock all the while,
    so that was the event loop's time. Nested pauses (the event loop's thread and another) end
    when the last one does; what cycles the parse left are collected at the next collection."""
    global _paused, _enabled_before
    with _paused_lock:
        if _paused == 0:
            _enabled_before = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _enabled_before:
                gc.enable()


def loads(text: bytes | str, max_digits: int | None = MAX_INTEGER_DIGITS) -> Any:
    """The JSON value of ``text``; JsonInputError if it is not JSON, too deep, or holds an integer of
    more than ``max_digits`` digits (None: as many as Python converts)."""
    limit = max_digits if max_digits is not None else sys.get_int_max_str_digits() or sys.maxsize
    long_integers: list[_LongInteger] = []

    def parse_int(digits: str) -> int | _LongInteger:
        if len(digits.removeprefix("-")) > limit:
            long_integers.append(_LongInteger(digits))
            return long_integers[-1]
        return int(digits)

    try:
        with collector_paused():
            value = json.loads(text, parse_int=parse_int)
    except RecursionError:
        raise JsonInputError("is nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError included
        raise JsonInputError(f"is not valid JSON: {error}") from None
    if long_integers:
        found = long_integers[0]
        digits = len(found.removeprefix("-"))
        raise JsonInputError(
            f"holds a number of {digits} digits at {path_of(value, found)} ({found[:12]}...): "
            f"no value here has more than {limit} digits"
        )
    return value


def path_of(document: Any, target: object) -> str:
    """Where ``target`` (compared by identity) is in ``document``: ``spec.replicaAssignment[0].id``;
    ``(the document)`` for the document itself or when it is not found."""
    # Depth first with a stack of its own: the document may be as deep as the parser allowed.
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        node, steps = stack.pop()
        if node is target:
            return _dotted(steps)
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((child, (*steps, key)) for key, child in children)
    return _dotted(())


def _dotted(steps: tuple[str | int, ...]) -> str:
    text = ""
    for step in steps:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text or "(the document)"


def load_object(raw: bytes, shape: str) -> dict[str, Any]:
    """The request body ``raw`` as a JSON object; JsonInputError with the whole sentence (what is
    wrong, and ``shape``, the object expected) otherwise."""
    if not raw.strip():
        raise JsonInputError(f"the request body is empty: send a JSON object {shape}")
    try:
        body = loads(raw)
    except JsonInputError as error:
        raise JsonInputError(f"the request body {error}") from None
    if not isinstance(body, dict):
        raise JsonInputError(f"the request body must be a JSON object {shape}, got {json_type(body)}")
    return body


def json_type(value: object) -> str:
    """How a parsed JSON value is named in a message: "an array", "a number", "null"..."""
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
