"""parse_object, the request bodies of object creates: a valid body is parsed once, in pydantic-core,
and every body gets the answer the full checks give (Python's parser with its integer bound, the
object shape, ``status``, then the model)."""

from __future__ import annotations

import contextlib
import gc
import json
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings, strategies as st

from controller.api import json_input, routes as api
from store import models
from tests.unit.test_models import python_calls

SHAPE = '{"name": ..., "spec": {...}}'
COMPUTED = b'"spec": {"partitions": 1, "replicationFactor": 1}'
SPU_SPEC = b'"spec": {"id": 1, "publicEndpoint": {"host": "h", "port": 1}, "privateEndpoint": {"host": "h", "port": 2}'
LONG = b"1" * 25
COMPUTED_SPEC = {"partitions": 1, "replicationFactor": 1, "ignoreRackAssignment": False}
NEW_STATUS = {"resolution": "Init", "replicaMap": {}, "reason": ""}


def answer(model: type[models.Model], raw: bytes) -> Any:
    """The object as JSON, or the refusal (status, code, message)."""
    try:
        return api.parse_object(model, raw).to_json_dict()
    except api.ApiError as refused:
        return (refused.status, refused.code, refused.message)


def checked_answer(model: type[models.Model], raw: bytes) -> Any:
    """What the SC answered when it ran every check on every body: the reference."""
    try:
        body = api.parse_json_object(raw, SHAPE)
        if "status" in body:
            raise api.ApiError(422, "InvalidObject", "status: is written by the SC, not by users; send only name and spec")
        try:
            return model.model_validate_json(raw, strict=True).to_json_dict()
        except pydantic.ValidationError as error:
            raise api._validation_error(error) from None
    except api.ApiError as refused:
        return (refused.status, refused.code, refused.message)


def test_a_valid_body_is_parsed_without_a_python_call_per_value() -> None:
    """Python's parser called back into Python for every integer (to bound its digits), and the
    model once per row: 100,000 rows x 3 replicas held the event loop 1.7 s. A valid body is parsed
    once, in pydantic-core; the Python path only explains a refusal."""

    def calls_for(rows: int) -> int:
        assignment = [{"id": index, "replicas": [index % 7, 7 + index % 5, 12 + index % 3]} for index in range(rows)]
        raw = json.dumps({"name": "t", "spec": {"replicaAssignment": assignment}}).encode()
        return python_calls(lambda: api.parse_object(models.Topic, raw))

    assert calls_for(1000) == calls_for(1)


@pytest.mark.parametrize(
    ("model", "raw", "expected"),
    [
        (models.Topic, b"", (400, "MalformedRequest", f"the request body is empty: send a JSON object {SHAPE}")),
        (models.Topic, b"[1]", (400, "MalformedRequest", f"the request body must be a JSON object {SHAPE}, got an array")),
        (models.Topic, b"[" * 50_000, (400, "MalformedRequest", "the request body is nested too deeply")),
        # status is refused even when everything else is a valid object, and when given twice
        (
            models.Topic,
            b'{"name": "t", ' + COMPUTED + b', "status": {}, "status": {}}',
            (422, "InvalidObject", "status: is written by the SC, not by users; send only name and spec"),
        ),
        # a long integer overwritten by a later value of the same key: pydantic-core keeps the last
        # (a valid topic), Python's parser saw the long one
        (
            models.Topic,
            b'{"name": "t", "spec": {"partitions": ' + LONG + b', "partitions": 1, "replicationFactor": 1}}',
            (
                400,
                "MalformedRequest",
                "the request body holds a number of 25 digits at (the document) (111111111111...): "
                "no value here has more than 20 digits",
            ),
        ),
        (
            models.Topic,
            b'{"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [-' + LONG + b"]}]}}",
            (
                400,
                "MalformedRequest",
                "the request body holds a number of 25 digits at spec.replicaAssignment[0].replicas[0] "
                "(-11111111111...): no value here has more than 20 digits",
            ),
        ),
        # 21 digits in a string are no integer: a valid name (the fast path declines, the checks accept)
        (models.Topic, b'{"name": "' + b"1" * 21 + b'", ' + COMPUTED + b"}", {"name": "1" * 21, "spec": COMPUTED_SPEC, "status": NEW_STATUS}),
        # duplicate keys: the last one counts, as before
        (models.Topic, b'{"name": "a", "name": "b", ' + COMPUTED + b"}", {"name": "b", "spec": COMPUTED_SPEC, "status": NEW_STATUS}),
        (models.Topic, b'{"name": "t", "spec": {"partitions": NaN, "replicationFactor": 1}}', (400, "MalformedRequest", "spec.partitions: Input should be a valid integer (got nan)")),
        # Python's parser takes a UTF-8 signature and UTF-16; the model's parser reads UTF-8 only
        (
            models.Topic,
            b'\xef\xbb\xbf{"name": "t", ' + COMPUTED + b"}",
            (400, "MalformedRequest", "(object): Invalid JSON: expected value at line 1 column 1 (got b'\\xef\\xbb\\xbf{\"name\": \"t\", \"spec\": {\"partitions\": 1, \"replicationFactor\": 1}}')"),
        ),
        (
            models.Spu,
            b'{"name": "s1", ' + SPU_SPEC + b', "rack": "\\ud800"}}',
            (400, "MalformedRequest", "(object): Invalid JSON: unexpected end of hex escape at line 1 column 138 (got b'{\"name\": \"s1\", \"spec\": {\"id\": 1, \"publicEndpoint\": {\"host\": \"h\", \"port\": 1}, \"privateEndpoint\": {\"host\": \"h\", \"port\": 2}, \"rack\": \"\\\\ud800\"}}')"),
        ),
        (
            models.Spu,
            b'{"name": "s1", ' + SPU_SPEC + b', "rack": "\xff"}}',
            (400, "MalformedRequest", "the request body is not valid JSON: 'utf-8' codec can't decode byte 0xff in position 131: invalid start byte"),
        ),
        (
            models.Topic,
            b'{"name": "t", ' + COMPUTED + b"}\x0c",
            (400, "MalformedRequest", "the request body is not valid JSON: Extra data: line 1 column 65 (char 64)"),
        ),
    ],
    ids=[
        "empty", "array", "deep", "status", "long-integer-overwritten", "long-integer", "long-digits-in-a-string",
        "duplicate-name", "nan", "utf8-signature", "lone-surrogate", "not-utf8", "form-feed-after",
    ],  # fmt: skip
)
def test_each_body_gets_the_answer_of_the_full_checks(model: type[models.Model], raw: bytes, expected: Any) -> None:
    assert (answer(model, raw), checked_answer(model, raw)) == (expected, expected)


ROW = st.fixed_dictionaries({"id": st.integers(0, 3), "replicas": st.lists(st.integers(-1, 3), max_size=3)})
SPEC = st.fixed_dictionaries(
    {},
    optional={
        "partitions": st.integers(0, 3) | st.integers(10**19, 10**21),
        "replicationFactor": st.integers(1, 2),
        "replicaAssignment": st.lists(ROW, max_size=3),
        "ignoreRackAssignment": st.booleans(),
    },
)
TOPIC_BODY = st.fixed_dictionaries(
    {"name": st.sampled_from(["t", "a-1", "Bad"])}, optional={"spec": SPEC, "status": st.just({})}
)
# Pieces where the two parsers or the checks may differ: long integers, repeated keys, NaN, bytes
# that are not UTF-8, a UTF-8 signature, escapes, whitespace Python does not skip.
PIECES = [
    b" ", b"\n", b"\x0c", b"NaN", b"-Infinity", LONG, b"0", b"-", b".5", b"e3", b'"status": {}, ', b'"name": "t", ',
    b'"partitions": 2, ', b"\xef\xbb\xbf", b"\xff", b"\xed\xa0\x80", b'"\\ud800"', b",", b"{", b"}", b"[", b"]",
]  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    raw = json.dumps(draw(TOPIC_BODY)).encode()
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from(PIECES)) + raw[at:]
    return raw


@settings(max_examples=400, deadline=None)
@given(raw=bodies())
def test_any_body_gets_the_answer_of_the_full_checks(raw: bytes) -> None:
    assert answer(models.Topic, raw) == checked_answer(models.Topic, raw)


# ---------------------------------------------------------------------------- the collector held off


def collections_during(call: Any) -> int:
    """How many cyclic garbage collections start while ``call()`` runs (it may raise)."""
    started = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        started += phase == "start"

    gc.callbacks.append(count)
    try:
        with contextlib.suppress(api.ApiError, json_input.JsonInputError):
            call()
    finally:
        gc.callbacks.remove(count)
    return started


# 200,000 containers: about 285 collections of the young generation at the default threshold.
EMPTY_ARRAYS = b"[" + b"[]," * 200_000 + b"[]]"


def test_a_refused_body_of_empty_arrays_is_parsed_without_a_collection() -> None:
    # Each collection walks the young containers, and at times every unfrozen one: that was most
    # of the event loop's time to refuse such a body (up to 1.5 MB, from the read role's dry runs).
    assert gc.isenabled()
    topic = b'{"name": "x", "spec": {"partitions": ' + EMPTY_ARRAYS + b"}}"
    assert answer(models.Topic, topic)[:2] == (400, "MalformedRequest")
    # At most the one that the allocations meanwhile start when the collector is back.
    assert collections_during(lambda: api.parse_object(models.Topic, topic)) <= 1
    assert collections_during(lambda: json_input.loads(EMPTY_ARRAYS)) <= 1
    assert gc.isenabled()


def test_the_collector_is_held_off_until_the_last_pause_ends_and_left_as_it_was() -> None:
    assert gc.isenabled()
    with json_input.collector_paused():
        with json_input.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with json_input.collector_paused():
            pass
        assert not gc.isenabled()  # an operator's (or a process's) choice is kept
    finally:
        gc.enable()


def test_a_refused_body_leaves_nothing_behind_for_the_collector() -> None:
    # The refusal's traceback held the frame that held the refusal, and with it the whole input:
    # 200,000 lists per refused body, kept until a full collection.
    topic = b'{"name": "x", "spec": {"partitions": ' + EMPTY_ARRAYS + b"}}"
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        assert answer(models.Topic, topic)[:2] == (400, "MalformedRequest")
        left = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert left < 1_000, left
