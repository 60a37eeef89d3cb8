"""Actions: what a controller decided, as data, each with its reason. Applied by the updaters.

Purely computational, no I/O: building an action only encodes the object to write.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from store import kv, models


class Verb(str, enum.Enum):
    CREATE = "create"
    CREATE_PARTITIONS = "create-partitions"  # a topic's missing partitions, each create-if-absent
    UPDATE_STATUS = "update-status"
    UPDATE_SPEC = "update-spec"
    DELETE = "delete"
    PROVISION = "provision"  # topic status + start index + partitions, one transaction
    ELECT = "elect"  # a partition's leader (spec) and status, one write


@dataclass(frozen=True, slots=True)
class Write:
    """One key of an action: written (value) or deleted (None), only if at ``expected_revision``.

    ``expected_revision`` 0 means the key must not exist; None means "whatever it is" (used only
    for deletes that must happen regardless, such as orphan partitions already gone).
    """

    key: str
    value: bytes | None
    expected_revision: int | None


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    name: str
    verb: Verb
    reason: str
    writes: tuple[Write, ...]
    # The KV revision of the state the decision was made from (for the history / audits).
    cause_revision: int = 0
    objects: tuple[models.AnyObject, ...] = field(default=(), compare=False)
    # The work-queue key (at most one action in flight per key); defaults to the object's key.
    queue_key: str = ""
    # Structured cause for the audits, e.g. a leader election's "spu-offline", "preferred-leader",
    # "drain" or "unclean" (the reason is prose for people; scripts must not parse it).
    cause: str = ""
    # Derived once (the dispatcher and the loops look them up for every action, several times).
    key: str = field(init=False, compare=False, repr=False)
    write_keys: tuple[str, ...] = field(init=False, compare=False, repr=False)
    # The bytes of its keys and of its values (the dispatcher fills a transaction by size).
    key_bytes: int = field(init=False, compare=False, repr=False)
    value_bytes: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.queue_key or models.object_key(self.kind, self.name))
        write_keys = tuple(write.key for write in self.writes)
        object.__setattr__(self, "write_keys", write_keys)
        object.__setattr__(self, "key_bytes", sum(len(key.encode()) for key in write_keys))
        object.__setattr__(self, "value_bytes", sum(len(write.value) for write in self.writes if write.value is not None))


def create(
    obj: models.AnyObject, reason: str, cause_revision: int = 0, *, also: Sequence[Write] = ()
) -> Action:
    """Create ``obj`` if absent; ``also``: writes that must commit with it (an SPU's id index key)."""
    writes = (Write(obj.key, models.encode(obj), 0), *also)
    return Action(obj.kind, obj.name, Verb.CREATE, reason, writes, cause_revision, (obj,))


def create_partitions(topic: str, partitions: Sequence[models.Partition], reason: str) -> Action:
    """Partitions of ``topic`` that do not exist yet, each created only if still absent.

    One action (one queue entry, one result) for a topic's partitions rather than one per
    partition: the bookkeeping around an action cost more than writing its key. Queued under
    ``topics/<topic>/partitions/<first index>``, apart from the topic's own key, so a status
    write to the topic does not wait for its partitions. At most 128 partitions per action.
    """
    if not 0 < len(partitions) <= kv.MAX_TXN_WRITES:
        raise ValueError(f"create_partitions takes 1 to {kv.MAX_TXN_WRITES} partitions, got {len(partitions)}")
    writes = tuple(Write(partition.key, models.encode(partition), 0) for partition in partitions)
    return Action(
        "topics", topic, Verb.CREATE_PARTITIONS, reason, writes, 0, tuple(partitions),
        queue_key=f"topics/{topic}/partitions/{partitions[0].index}",
    )


def update_status(
    obj: models.AnyObject, status: object, mod_revision: int, reason: str, cause_revision: int = 0, *, cause: str = ""
) -> Action:
    action = _replace_part(obj, "status", status, Verb.UPDATE_STATUS, mod_revision, reason, cause_revision)
    return dataclasses.replace(action, cause=cause) if cause else action


def update_spec(
    obj: models.AnyObject,
    spec: object,
    mod_revision: int,
    reason: str,
    cause_revision: int = 0,
    *,
    also: Sequence[Write] = (),
) -> Action:
    return _replace_part(obj, "spec", spec, Verb.UPDATE_SPEC, mod_revision, reason, cause_revision, also)


def _replace_part(
    obj: models.AnyObject,
    part: str,
    value: object,
    verb: Verb,
    mod_revision: int,
    reason: str,
    cause_revision: int,
    also: Sequence[Write] = (),
) -> Action:
    updated = obj.model_copy(update={part: value})
    writes = (Write(obj.key, models.encode(updated), mod_revision), *also)
    return Action(obj.kind, obj.name, verb, reason, writes, cause_revision or mod_revision, (updated,))


def elect(
    partition: models.Partition, updated: models.Partition, mod_revision: int, reason: str, cause: str
) -> Action:
    """A leader change: the partition's spec.leader and status in one compare-and-swap."""
    write = Write(partition.key, models.encode(updated), mod_revision)
    return Action(
        partition.kind, partition.name, Verb.ELECT, reason, (write,), mod_revision, (updated,), cause=cause
    )


def move_step(
    partition: models.Partition, updated: models.Partition, mod_revision: int, reason: str, cause: str
) -> Action:
    """A replica move's step that changes the partition's replica list (not its leader): spec and
    status in one compare-and-swap."""
    write = Write(partition.key, models.encode(updated), mod_revision)
    return Action(
        partition.kind, partition.name, Verb.UPDATE_SPEC, reason, (write,), mod_revision, (updated,), cause=cause
    )


def delete(
    kind: str, name: str, mod_revision: int | None, reason: str, cause_revision: int = 0, *, also: Sequence[Write] = ()
) -> Action:
    writes = (Write(models.object_key(kind, name), None, mod_revision), *also)
    return Action(kind, name, Verb.DELETE, reason, writes, cause_revision)


@dataclass(frozen=True, slots=True)
class TopicProvision:
    topic: models.Topic  # with its new status
    topic_revision: int
    partitions: tuple[models.Partition, ...]  # those that fit in this transaction
    reason: str
    value: bytes = b""  # the topic already encoded (the controller sized it); encoded here if empty


def provision(chain_key: str, chain_value: bytes, chain_revision: int, topics: Sequence[TopicProvision]) -> Action:
    """Topic statuses, the placement chain key and the partitions that fit, in one transaction.

    Queued under the chain key, so provisioning is serialised and the chain never forks.
    """
    writes = [Write(chain_key, chain_value, chain_revision)]
    objects: list[models.AnyObject] = []
    for item in topics:
        writes.append(Write(item.topic.key, item.value or models.encode(item.topic), item.topic_revision))
        writes += [Write(partition.key, models.encode(partition), 0) for partition in item.partitions]
        objects += [item.topic, *item.partitions]
    if len(writes) > kv.MAX_TXN_WRITES:
        raise ValueError(f"a provision action holds at most {kv.MAX_TXN_WRITES} writes, got {len(writes)}")
    names = ",".join(item.topic.name for item in topics)
    reasons = "; ".join(f"{item.topic.name}: {item.reason}" for item in topics)
    return Action(
        "topics",
        names,
        Verb.PROVISION,
        reasons,
        tuple(writes),
        max(item.topic_revision for item in topics),
        tuple(objects),
        queue_key=chain_key,
    )
