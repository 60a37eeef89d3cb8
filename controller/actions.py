"""Actions: what a controller decided, as data, each with its reason. Applied by the updaters.

Purely computational, no I/O: building an action only encodes the object to write.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from store import kv, models


class Verb(str, enum.Enum):
    CREATE = "create"
    UPDATE_STATUS = "update-status"
    UPDATE_SPEC = "update-spec"
    DELETE = "delete"
    PROVISION = "provision"  # topic status + start index + partitions, one transaction


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
    objects: tuple[models.ClusterObject, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """The work-queue key: at most one write in flight per primary object."""
        return models.object_key(self.kind, self.name)


def create(obj: models.ClusterObject, reason: str, cause_revision: int = 0) -> Action:
    return Action(obj.kind, obj.name, Verb.CREATE, reason, (Write(obj.key, models.encode(obj), 0),), cause_revision, (obj,))


def update_status(
    obj: models.ClusterObject, status: object, mod_revision: int, reason: str, cause_revision: int = 0
) -> Action:
    updated = obj.model_copy(update={"status": status})
    return Action(
        obj.kind,
        obj.name,
        Verb.UPDATE_STATUS,
        reason,
        (Write(obj.key, models.encode(updated), mod_revision),),
        cause_revision or mod_revision,
        (updated,),
    )


def update_spec(
    obj: models.ClusterObject, spec: object, mod_revision: int, reason: str, cause_revision: int = 0
) -> Action:
    updated = obj.model_copy(update={"spec": spec})
    return Action(
        obj.kind,
        obj.name,
        Verb.UPDATE_SPEC,
        reason,
        (Write(obj.key, models.encode(updated), mod_revision),),
        cause_revision or mod_revision,
        (updated,),
    )


def delete(kind: str, name: str, mod_revision: int | None, reason: str, cause_revision: int = 0) -> Action:
    return Action(
        kind, name, Verb.DELETE, reason, (Write(models.object_key(kind, name), None, mod_revision),), cause_revision
    )


def provision(
    topic: models.Topic,
    topic_revision: int,
    extra_writes: Sequence[Write],
    partitions: Sequence[models.Partition],
    reason: str,
) -> Action:
    """The topic's new status, the placement chain key and the partitions that fit, atomically."""
    writes = [Write(topic.key, models.encode(topic), topic_revision), *extra_writes]
    writes += [Write(partition.key, models.encode(partition), 0) for partition in partitions]
    if len(writes) > kv.MAX_TXN_OPS:
        raise ValueError(f"a provision action holds at most {kv.MAX_TXN_OPS} writes, got {len(writes)}")
    return Action(
        topic.kind, topic.name, Verb.PROVISION, reason, tuple(writes), topic_revision, (topic, *partitions)
    )
