"""The bytes a topic takes in the store with its replica map, and the largest topic one etcd request
holds. Purely computational, no I/O: the topic controller and the admin operations size topics
with it, so what a create accepts is what the controller writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from store import kv, models

# Room kept in every topic for a status reason (cut to REASON_MAX_BYTES) and the longest
# resolution name: a topic that fits Provisioned still fits InvalidConfig with its map and reason.
REASON_MAX_BYTES = 900
STATUS_ROOM = 1024
# The placement chain's value, {"nextStartIndex": N}, at its longest.
CHAIN_VALUE_MAX = 48

_PROVISIONED = models.TopicStatus(resolution=models.TopicResolution.PROVISIONED)
_EMPTY_MAP = 2  # {}


def max_topic_bytes(request_size: kv.RequestSize, name: str, chain_key: str) -> int:
    """The largest stored topic ``name`` the SC writes: alone in a provision transaction with the
    placement chain, within the store's request limit, with room left for any status reason."""
    chain = request_size.writes_bound(1, len(chain_key.encode()), CHAIN_VALUE_MAX)
    key = len(models.object_key("topics", name).encode())
    return request_size.budget - chain - request_size.writes_bound(1, key, 0) - STATUS_ROOM


def bounded_reason(reason: str) -> str:
    """``reason`` cut to REASON_MAX_BYTES (a reason may quote values of any length)."""
    encoded = reason.encode()
    if len(encoded) <= REASON_MAX_BYTES:
        return reason
    return encoded[: REASON_MAX_BYTES - 3].decode(errors="ignore") + "..."


def map_bytes(replica_map: Mapping[int, Sequence[int]]) -> int:
    """The bytes of ``replica_map`` in the stored JSON: ``{"0":[1,2],"1":[2,0]}``."""
    if not replica_map:
        return _EMPTY_MAP
    total = 1 + len(replica_map)  # the braces and the commas between rows
    for index, replicas in replica_map.items():
        # "index":[a,b]
        total += len(str(index)) + 5 + sum(len(str(replica)) for replica in replicas) + len(replicas) - 1
    return total


def least_assignment_bytes(partitions: int, replicas: int) -> int:
    """At least the bytes a manual topic of ``partitions`` rows holding ``replicas`` SPU ids in all
    takes stored Provisioned: each row in the spec (``{"id":0,"replicas":[]}`` less one) and in the
    replica map (``"0":[]`` less one), each id a digit and a comma in both."""
    return 26 * partitions + 4 * replicas


def replication_factor(topic: models.Topic) -> int:
    """The computed topic's, or the manual topic's longest row."""
    spec = topic.spec
    if spec.replica_assignment is not None:
        return max(len(row.replicas) for row in spec.replica_assignment)
    return spec.replication_factor or 0


def stored_bytes(topic: models.Topic, replica_map: Mapping[int, Sequence[int]]) -> int:
    """The bytes of ``topic`` stored Provisioned with ``replica_map`` (no reason)."""
    return _base_bytes(topic) + map_bytes(replica_map)


def provisioned_bytes(topic: models.Topic, partitions: int, replication_factor: int, id_digits: int) -> int:
    """The bytes of ``topic`` stored Provisioned with ``partitions`` rows of ``replication_factor``
    SPU ids of ``id_digits`` digits each: asking for that many partitions if computed, assigning
    those rows (ids 0..partitions-1) if manual."""
    spec = topic.spec
    rows = _rows_bytes(partitions, replication_factor, id_digits)
    if spec.replica_assignment is None:
        own = spec.partitions or 0
        # The spec's own count changes width with the count asked for.
        base = _base_bytes(topic) - len(str(own)) + len(str(partitions))
        return base + rows
    # The assignment is stored twice: in the spec ([{"id":i,"replicas":[...]}, ...]) and as the map.
    base = _base_bytes(topic) - _assignment_bytes(spec.replica_assignment)
    entries = _digits_below(partitions) + partitions * (replication_factor * (id_digits + 1) + 20)
    assignment = 2 + max(partitions - 1, 0) + entries
    return base + assignment + rows


def largest_count(topic: models.Topic, replication_factor: int, id_digits: int, max_bytes: int) -> int:
    """The most partitions ``topic`` may have at ``replication_factor`` (SPU ids of ``id_digits``
    digits) and still take at most ``max_bytes``; 0 if not even one fits."""
    low, high = 0, models.MAX_PARTITIONS
    if provisioned_bytes(topic, high, replication_factor, id_digits) <= max_bytes:
        return high
    while low < high:  # the size grows with the count
        middle = (low + high + 1) // 2
        if provisioned_bytes(topic, middle, replication_factor, id_digits) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return low


def id_digits(spu_ids: Sequence[int], widest: bool) -> int:
    """The digits of the widest (or narrowest) SPU id; 1 when there is none."""
    if not spu_ids:
        return 1
    return len(str(max(spu_ids) if widest else min(spu_ids)))


def too_large(
    topic: models.Topic, size: int, bound: str, max_bytes: int, max_request_bytes: int, digits: int
) -> str:
    """Why ``topic`` cannot be stored: its ``size`` (``bound``: "", "at least " or "up to "), the
    limits, and how many partitions fit at its replication factor."""
    factor = replication_factor(topic)
    fitting = largest_count(topic, factor, digits, max_bytes)
    return (
        f"topic {topic.name!r} with {topic.spec.partition_count()} partitions at replication factor {factor} would take "
        f"{bound}{size} bytes in the store, above the {max_bytes} bytes one topic may take (etcd's request limit, "
        f"etcd_max_request_bytes, is {max_request_bytes} bytes): at replication factor {factor} at most {fitting} "
        f"partitions fit with {digits}-digit SPU ids; use fewer partitions or a lower replication factor"
    )


def _base_bytes(topic: models.Topic) -> int:
    """The stored topic, Provisioned, without its replica map."""
    return len(models.encode(topic.model_copy(update={"status": _PROVISIONED}))) - _EMPTY_MAP


def _rows_bytes(partitions: int, replication_factor: int, id_digits: int) -> int:
    if partitions <= 0:
        return _EMPTY_MAP
    row = 5 + replication_factor * id_digits + replication_factor - 1  # "":[...] around the index
    return 1 + partitions + _digits_below(partitions) + partitions * row


def _assignment_bytes(assignment: Sequence[models.PartitionAssignment]) -> int:
    """The bytes of a manual assignment in the stored spec: ``[{"id":0,"replicas":[0,1]}, ...]``."""
    entries = sum(
        len(str(row.id)) + 21 + sum(len(str(replica)) for replica in row.replicas) + len(row.replicas) - 1
        for row in assignment
    )
    return 1 + len(assignment) + entries


def _digits_below(count: int) -> int:
    """The digits of 0, 1, ..., count - 1 written out."""
    total = min(count, 10)  # 0..9
    width, start = 2, 10
    while start < count:
        end = min(count, start * 10)
        total += (end - start) * width
        width, start = width + 1, start * 10
    return total
