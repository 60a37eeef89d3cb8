"""The answer to a placement request (`POST /v1/placement`, a topic's dry run): parse, check, place,
encode. Purely computational, no I/O: it runs in the placement worker process (a request body) or in
the gate's worker thread (a dry run's topic, already parsed), never on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from controller import placement
from controller.api import json_input
from store import models

# Rows of a replica map encoded to JSON per call: in the gate's thread (a dry run) each call holds
# the GIL, and the loop gets it back between calls (a 100,000-row map is 0.5 s in one call).
PLACEMENT_ROWS_PER_ENCODE = 2000
REQUEST_SHAPE = "(a placement request, as for `sc placement compute`)"


class Refused(Exception):
    """An answer in the API's error shape: HTTP ``status``, ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message


def for_body(raw: bytes, live_spus: Sequence[placement.SpuInfo] | None, placers: placement.Placers) -> bytes:
    """The answer to a request body; ``live_spus`` stand in when it names no SPUs (None: the SC has
    not loaded its store yet)."""
    try:
        body = json_input.load_object(raw, REQUEST_SHAPE)
    except json_input.JsonInputError as error:
        raise Refused(400, "MalformedRequest", str(error)) from None
    if "spus" not in body and live_spus is None:
        raise Refused(503, "NotSynced", "the SC is still loading its store; retry shortly (see /healthz)")
    try:
        placement_request = placement.request_from_json(body, default_spus=live_spus)
        _check_size(placement_request)
    except placement.PlacementError as error:
        raise Refused(422, error.code, error.message) from None
    return for_request(placement_request, placers)


def for_request(placement_request: placement.PlacementRequest, placers: placement.Placers) -> bytes:
    """Place and encode ``{"replicaMap", "nextStartIndex", "balance"}``."""
    try:
        result = placement.compute(placement_request, placers)
    except placement.PlacementError as error:
        raise Refused(422, error.code, error.message) from None
    answer = placement.result_to_json(result, placement_request.spus)
    rows = answer.pop("replicaMap")
    assert isinstance(rows, list)
    pieces = [
        json.dumps(rows[start : start + PLACEMENT_ROWS_PER_ENCODE])[1:-1]
        for start in range(0, len(rows), PLACEMENT_ROWS_PER_ENCODE)
    ]
    return ('{"replicaMap": [' + ", ".join(pieces) + "], " + json.dumps(answer)[1:]).encode()


def _check_size(placement_request: placement.PlacementRequest) -> None:
    """The topic limits apply here too: one request must not build a huge map."""
    for field, value, limit in (
        ("partitions", placement_request.partitions, models.MAX_PARTITIONS),
        ("replicationFactor", placement_request.replication_factor, models.MAX_REPLICATION_FACTOR),
    ):
        if value > limit:
            raise placement.InvalidConfig(f"{field} must be at most {limit}, got {value}")
