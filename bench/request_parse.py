"""A topic create's body through `routes.parse_object` against the path it replaced, in the same run.

The baseline is the old parse: Python's parser with its integer bound (a Python call per integer),
the shape and status checks, then `model_validate_json` of a topic model whose rows each had a
Python validator (the old `PartitionAssignment._row_fits`, re-declared here). Three bodies: the
issue's 100,000 partitions x RF 3 (4.4 MB: a create refuses it unread now, parsed here all the
same), the largest body a create parses on the default store (`topic_content_limit`: 1.5 MiB +
64 KiB besides whitespace), and the same with its last row invalid (a refusal takes the Python
checks too), and a body of unknown fields at that limit (pydantic reports each one, and a
refusal read them all out, twice: the worst a client can send). Then the check that refuses a denser body unparsed, on
the 4.4 MB one, and a Fluvio create's assignment of 32,000 rows x 128 (a 16 MiB frame, decoded):
the check that refuses it now against building the model it got before. Last, eight refusals in a
row of a body of nested empty arrays at the limit (the costliest shape to refuse: a Python object
per array, built twice), beside a heap of a million objects made after start, with the cyclic
collector held off during each parse (as `parse_object` does) and without (the baseline): total
and worst. Pure CPU, on the calling thread, as on the event loop, with `sc run`'s collector
threshold (`daemon.GC_GEN0_THRESHOLD`: at Python's default, collections are half of the time);
best of ``--repeat``.

    .venv/bin/python bench/request_parse.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Self

import pydantic

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from controller import daemon  # noqa: E402 (after the path set-up above)
from controller.api import admin_ops, json_input, routes  # noqa: E402
from controller.api.fluvio import admin as fluvio_admin, mapping, objects  # noqa: E402
from store import kv, memory, models  # noqa: E402

REPLICATION_FACTOR = 3
SPUS = 1_000


class RowCheckedAssignment(models.PartitionAssignment):
    """A manual row as it was: a Python validator called for each one."""

    @pydantic.model_validator(mode="after")
    def _row_fits(self) -> Self:
        if len(self.replicas) > models.MAX_REPLICATION_FACTOR:
            raise ValueError(f"partition {self.id} lists {len(self.replicas)} replicas")
        return self


class RowCheckedSpec(models.TopicSpec):
    replica_assignment: Annotated[list[RowCheckedAssignment], pydantic.Field(max_length=models.MAX_PARTITIONS)] | None = None  # type: ignore[assignment]  # the same field, rows of the old model


class RowCheckedTopic(models.ClusterObject[RowCheckedSpec, models.TopicStatus]):
    pass


def old_parse(raw: bytes) -> object:
    """The parse before: both parsers on every body, the Python one first."""
    body = routes.parse_json_object(raw, '{"name": ..., "spec": {...}}')
    if "status" in body:
        raise routes.ApiError(422, "InvalidObject", "status: is written by the SC")
    try:
        return RowCheckedTopic.model_validate_json(raw, strict=True)
    except pydantic.ValidationError as error:
        raise routes.ApiError(422, "InvalidObject", old_describe(error)) from None


def old_describe(error: pydantic.ValidationError) -> str:
    """A refusal's message as it was: every problem read out, twice (the status code's choice, then
    the message), whatever their number."""
    wrong_type = any(problem["type"].endswith("_type") for problem in error.errors(include_url=False))
    problems = error.errors(include_url=False)
    lines = [f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}" for problem in problems[: models.MAX_PROBLEMS_DESCRIBED]]
    return ("400: " if wrong_type else "") + "; ".join(lines)


def new_parse(raw: bytes) -> object:
    return routes.parse_object(models.Topic, raw)


def body(rows: int, invalid_last: bool = False) -> bytes:
    """A manual topic of ``rows`` rows; its last replica is -1 when ``invalid_last``."""
    assignment = [[(index + step) % SPUS for step in range(REPLICATION_FACTOR)] for index in range(rows)]
    if invalid_last:
        assignment[-1][-1] = -1
    rows_json = [{"id": index, "replicas": replicas} for index, replicas in enumerate(assignment)]
    return json.dumps({"name": "large", "spec": {"replicaAssignment": rows_json}}).encode()


def unknown_fields(limit: int) -> bytes:
    """A computed topic followed by as many unknown fields as ``limit`` bytes besides whitespace hold."""
    count = limit // len('"x100000":1,')
    extras = ",".join(f'"x{index}":1' for index in range(count))
    return ('{"name":"t","spec":{"partitions":1,"replicationFactor":1},' + extras + "}").encode()


def content(raw: bytes) -> int:
    """The bytes of ``raw`` besides JSON's whitespace."""
    return len(raw) - sum(raw.count(space) for space in (b" ", b"\n", b"\r", b"\t"))


def at_limit(limit: int) -> int:
    """The most rows whose body holds at most ``limit`` bytes besides whitespace."""
    low, high = 1, models.MAX_PARTITIONS
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if content(body(middle)) <= limit else (low, middle - 1)
    return low


def best(parse: Callable[[bytes], object], raw: bytes, repeat: int) -> float:
    fastest = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            parse(raw)
        except (routes.ApiError, mapping.Refused):
            pass
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gc.set_threshold(daemon.GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    store = memory.MemoryStore()
    limit = admin_ops.topic_content_limit(store)
    fitting = at_limit(limit)
    largest = body(100_000)
    cases = [
        (f"100,000 x RF {REPLICATION_FACTOR}", largest),
        (f"at the limit ({fitting:,} rows)", body(fitting)),
        ("at the limit, last row invalid", body(fitting, invalid_last=True)),
        ("at the limit, unknown fields", unknown_fields(limit)),
    ]
    print(f"default store: read limit {routes.topic_body_limit(store):,} bytes, {limit:,} besides whitespace")
    print(f"{'body':34} {'bytes':>11} {'new (s)':>8} {'old (s)':>8} {'new/old':>8}")
    for label, raw in cases:
        new = best(new_parse, raw, args.repeat)
        old = best(old_parse, raw, args.repeat)
        print(f"{label:34} {len(raw):11,} {new:8.3f} {old:8.3f} {new / old:8.2f}")
    check = best(lambda raw: routes.check_topic_content(raw, store), largest, args.repeat)
    print(f"{'refused unparsed: 100,000 x RF 3':34} {len(largest):11,} {check:8.3f}")
    wide = [objects.PartitionMap(index, [(index + step) % SPUS for step in range(128)]) for index in range(32_000)]
    spec = objects.TopicSpec(objects.AssignedReplicas(wide))
    refused = best(lambda _: fluvio_admin._check_assignment_size("wide", wide, kv.DEFAULT_MAX_REQUEST_BYTES), b"", args.repeat)
    built = best(lambda _: mapping.topic_from_create("wide", spec), b"", args.repeat)
    print(f"{'Fluvio 32,000 x 128: refused / built':34} {'':11} {refused:8.3f} {built:8.3f} {refused / built:8.3f}")
    nested = b'{"name": "x", "spec": {"partitions": [' + b"[]," * (limit // 3 - 20) + b"[]]}}"
    heap = [[index] for index in range(1_000_000)]  # a busy SC's objects made after start
    paused = refusals(nested, paused=True)
    unpaused = refusals(nested, paused=False)
    del heap
    print(f"{'8 x nested empty arrays: total':34} {len(nested):11,} {sum(paused):8.3f} {sum(unpaused):8.3f} {sum(paused) / sum(unpaused):8.2f}")
    print(f"{'  the worst of the 8':34} {'':11} {max(paused):8.3f} {max(unpaused):8.3f} {max(paused) / max(unpaused):8.2f}")
    return 0


def refusals(raw: bytes, paused: bool) -> list[float]:
    """Seconds of eight refusals of ``raw`` in a row, the collector held off during each parse or not."""
    real = json_input.collector_paused
    if not paused:
        json_input.collector_paused = contextlib.nullcontext  # type: ignore[assignment]  # the baseline: no pause
    try:
        gc.collect()
        return [best(new_parse, raw, 1) for _ in range(8)]
    finally:
        json_input.collector_paused = real


if __name__ == "__main__":
    sys.exit(main())
