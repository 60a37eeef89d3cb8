"""Admin operations shared by the public HTTP API and the Fluvio admin protocol: create, grow and
delete objects (user spec writes to the KV store) and wait for the controllers' verdict.

No aiohttp here: a failure is an ApiError (HTTP status, code, message) that each front end answers
in its own shape. Never writes a status and never writes the local store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import pydantic

from controller import admission, context as context_module, placement, spu_group, topic as topic_controller
from store import kv, local, models

# Writes that lose a compare-and-swap to the controllers' status writes are retried this often.
CAS_ATTEMPTS = 5

KIND_LABELS = {"spus": "SPU", "spu-groups": "SPU group", "topics": "topic", "partitions": "partition"}


class ApiError(Exception):
    """An answer in the error shape of API.md: ``{"error": {"code", "message"}}`` (+ extra keys)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def label(kind: str, name: str) -> str:
    return f"{KIND_LABELS[kind]} {name!r}"


def decoded(kind: str, item: kv.KeyValue) -> models.ClusterObject | None:
    """An object read straight from the KV store; a malformed value (written by hand) is skipped."""
    try:
        return models.decode(kind, item.value)
    except pydantic.ValidationError:
        return None


def require_synced(context: context_module.Context) -> None:
    if not context.synced.is_set():
        raise ApiError(503, "NotSynced", "the SC is still loading its store; retry shortly (see /healthz)")


# ---------------------------------------------------------------------------- waiting for the controllers


class Settlements:
    """Wakes API requests waiting for an object of one kind to settle, from one shared listener.

    One listener per kind (not one per request), so a status change wakes only the requests
    waiting for that object, however many creates are in flight.
    """

    def __init__(self, table: local.KindStore) -> None:
        self.table = table
        self._waiters: dict[str, set[asyncio.Event]] = {}

    async def run(self) -> None:
        listener = self.table.listener(local.Part.ALL)
        try:
            while True:
                await listener.wait()
                changes = listener.changes()
                names: Iterable[str]
                if changes.full:
                    names = list(self._waiters)
                else:
                    names = [entry.name for entry in changes.updated] + changes.deleted
                for name in names:
                    for event in self._waiters.get(name, ()):
                        event.set()
        finally:
            listener.close()

    async def wait(
        self, name: str, written_revision: int, settled: Callable[[local.Entry], bool], timeout: float
    ) -> local.Entry | None:
        """The object once ``settled(entry)`` holds, or as it is when ``timeout`` seconds pass.

        None once the store has seen the write at ``written_revision`` and then lost the object.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = asyncio.Event()
        self._waiters.setdefault(name, set()).add(event)
        try:
            while True:
                # Checked after registering and before awaiting: no change can slip between.
                entry = self.table.get(name)
                if entry is None and self.table.revision >= written_revision:
                    return None
                remaining = deadline - loop.time()
                if (entry is not None and settled(entry)) or remaining <= 0:
                    return entry
                event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await event.wait()
        finally:
            waiters = self._waiters[name]
            waiters.discard(event)
            if not waiters:
                del self._waiters[name]


def topic_settled(written_revision: int) -> Callable[[local.Entry], bool]:
    """Provisioned with every partition placed, or definitely not, by a write after ours."""

    def settled(entry: local.Entry) -> bool:
        if entry.mod_revision <= written_revision:
            return False
        status: models.TopicStatus = entry.obj.status  # type: ignore[attr-defined]
        if status.resolution is models.TopicResolution.PROVISIONED:
            return len(status.replica_map) >= entry.obj.spec.partition_count()  # type: ignore[attr-defined]
        return status.resolution in (
            models.TopicResolution.INVALID_CONFIG,
            models.TopicResolution.INSUFFICIENT_RESOURCES,
            models.TopicResolution.DELETING,
        )

    return settled


def group_settled(written_revision: int) -> Callable[[local.Entry], bool]:
    def settled(entry: local.Entry) -> bool:
        return (
            entry.mod_revision > written_revision
            and entry.obj.status.resolution is not models.SpuGroupResolution.INIT  # type: ignore[attr-defined]
        )

    return settled


async def wait_settled(
    waits: Settlements,
    written: models.ClusterObject,
    written_revision: int,
    settled: Callable[[local.Entry], bool],
    timeout_ms: int,
) -> tuple[models.ClusterObject | None, bool]:
    """(the object as it is now, whether it settled); None if it was deleted meanwhile."""
    if timeout_ms == 0:
        return written, False
    entry = await waits.wait(written.name, written_revision, settled, timeout_ms / 1000)
    if entry is None:
        # Deleted after our write, or not even mirrored yet when the time ran out.
        return (None, False) if waits.table.revision >= written_revision else (written, False)
    return entry.obj, settled(entry)


# ---------------------------------------------------------------------------- creates


async def create(context: context_module.Context, obj: models.ClusterObject) -> int:
    """Write a new object (create-if-absent); its store revision."""
    try:
        return await context.kv_store.create(obj.key, models.encode(obj))
    except kv.AlreadyExists:
        raise ApiError(409, "AlreadyExists", f"{label(obj.kind, obj.name)} already exists") from None


async def register_spu(context: context_module.Context, spu: models.Spu, dry_run: bool = False) -> int:
    """Register a custom SPU whose name and id are both unused; its store revision (0 for a dry run,
    which makes every check and writes nothing)."""
    if spu.spec.spu_type is not models.SpuType.CUSTOM:
        raise ApiError(
            422,
            "InvalidObject",
            f"spec.spuType: only Custom SPUs can be registered; Managed SPUs are created by SPU groups "
            f"(got {spu.spec.spu_type.value!r})",
        )
    listed = await context.kv_store.list(models.object_key("spus", ""))
    others = [obj for obj in (decoded("spus", item) for item in listed.items) if obj is not None]
    for other in others:
        if other.name == spu.name:
            raise ApiError(409, "AlreadyExists", f"{label('spus', spu.name)} already exists")
    for other in others:
        if other.spec.id == spu.spec.id:  # type: ignore[attr-defined]
            raise ApiError(
                409,
                "SpuIdInUse",
                f"SPU id {spu.spec.id} is already used by SPU {other.name!r}; choose another id",
            )
    group = _group_naming(context, spu.name)
    if group is not None:
        raise ApiError(
            409,
            "AlreadyExists",
            f"SPU name {spu.name!r} belongs to SPU group {group!r} (its managed SPUs are named {group}-N); "
            "choose another name",
        )
    if dry_run:
        return 0
    return await create(context, spu)


def _group_naming(context: context_module.Context, spu_name: str) -> str | None:
    """The SPU group whose managed SPUs are (or will be) named ``spu_name``, if any."""
    group_name, _, index = spu_name.rpartition("-")
    if not group_name or not index.isdigit():
        return None
    entry = context.local_store["spu-groups"].get(group_name)
    if entry is None or int(index) >= entry.obj.spec.replicas:  # type: ignore[attr-defined]
        return None
    return group_name


async def create_topic(context: context_module.Context, topic: models.Topic) -> int:
    """Write a new topic whose configuration the controller would accept; its store revision."""
    # The controller would reject a configuration no cluster change can fix: say so now and
    # write nothing, with the controller's own check and message.
    require_synced(context)
    snapshot = context.local_store.snapshot()
    problem = topic_controller.validate(topic, topic_controller.spu_infos(snapshot))
    if problem is not None:
        raise ApiError(422, "InvalidConfig", problem)
    return await create(context, topic)


def dry_run_request(
    context: context_module.Context, topic: models.Topic
) -> tuple[placement.PlacementRequest, tuple[placement.SpuInfo, ...]]:
    """What a dry run of a new topic computes (and the SPUs it is computed over), taken from the
    store now; the computing is the caller's (off the event loop: it may be large)."""
    require_synced(context)
    if context.local_store["topics"].get(topic.name) is not None:
        raise ApiError(409, "AlreadyExists", f"{label('topics', topic.name)} already exists")
    snapshot = context.local_store.snapshot()
    try:
        request = topic_controller.dry_run_request(snapshot, topic)
    except placement.PlacementError as error:
        raise ApiError(422, error.code, error.message) from None
    return request, topic_controller.spu_infos(snapshot)


async def dry_run_topic(
    context: context_module.Context, topic: models.Topic
) -> tuple[placement.PlacementResult, tuple[placement.SpuInfo, ...]]:
    """The placement a new topic would get now (and the SPUs it was computed over); writes nothing.
    Takes a slot of the expensive-work gate (admission.Busy when none is free in time)."""
    async with context.gate.slot(admission.DRY_RUN):
        request, spus = dry_run_request(context, topic)
        try:
            result = await context.gate.offload(placement.compute, request)
        except placement.PlacementError as error:
            raise ApiError(422, error.code, error.message) from None
    return result, spus


# ---------------------------------------------------------------------------- updates


async def add_partitions(context: context_module.Context, name: str, count: int) -> tuple[models.Topic, int]:
    """Grow a computed topic by ``count`` partitions; (the topic as written, its store revision)."""
    if count < 1:
        raise ApiError(422, "InvalidRequest", f"count: the number of partitions to add must be at least 1 (got {count})")

    def grow(current: models.ClusterObject) -> models.ClusterObject:
        topic: models.Topic = current  # type: ignore[assignment]
        if topic.spec.is_manual:
            raise ApiError(
                422,
                "ManualTopic",
                f"topic {name!r} has a manual replicaAssignment: partitions cannot be added to it",
            )
        total = topic.spec.partition_count() + count
        if total > models.MAX_PARTITIONS:
            raise ApiError(
                422,
                "InvalidRequest",
                f"count: topic {name!r} has {topic.spec.partition_count()} partitions; adding {count} would make "
                f"{total}, above the limit of {models.MAX_PARTITIONS}",
            )
        return topic.model_copy(update={"spec": topic.spec.model_copy(update={"partitions": total})})

    grown, revision = await update_spec(context, "topics", name, grow, "adding partitions")
    return grown, revision  # type: ignore[return-value]


async def update_spec(
    context: context_module.Context,
    kind: str,
    name: str,
    change: Callable[[models.ClusterObject], models.ClusterObject],
    doing: str,
) -> tuple[models.ClusterObject, int]:
    """Compare-and-swap ``change(current)`` on the object; re-read and re-apply when a controller
    wrote first (``change`` is relative, so it applies on top of the newer state)."""
    key = models.object_key(kind, name)
    for _ in range(CAS_ATTEMPTS):
        stored = await context.kv_store.get(key)
        current = None if stored is None else decoded(kind, stored)
        if stored is None or current is None:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found")
        changed = change(current)
        try:
            return changed, await context.kv_store.update(key, models.encode(changed), stored.mod_revision)
        except kv.Conflict:
            continue
        except kv.NotFound:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found") from None
    raise ApiError(409, "Conflict", f"{label(kind, name)} kept changing while {doing} ({CAS_ATTEMPTS} attempts); retry")


# ---------------------------------------------------------------------------- deletes


async def delete(context: context_module.Context, kind: str, name: str) -> tuple[models.ClusterObject | None, list[str]]:
    """Delete an object (a topic's partitions follow through its controller).

    (the object as it was, None if its stored value was unreadable; warnings for the user).
    """
    key = models.object_key(kind, name)
    for _ in range(CAS_ATTEMPTS):
        stored = await context.kv_store.get(key)
        if stored is None:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found")
        obj = decoded(kind, stored)
        warnings: list[str] = []
        if kind == "partitions":
            topic_name = name.rpartition("-")[0]
            raise ApiError(
                422,
                "PartitionOwnedByTopic",
                f"partition {name!r} belongs to topic {topic_name!r}: partitions go with their topic "
                "(delete the topic instead)",
            )
        if kind == "spus" and obj is not None:
            warnings = _spu_delete_checks(context, obj)  # type: ignore[arg-type]
        try:
            await context.kv_store.delete(key, stored.mod_revision)
        except kv.Conflict:
            continue  # its status changed meanwhile: re-check against the new state
        except kv.NotFound:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found") from None
        return obj, warnings
    raise ApiError(409, "Conflict", f"{label(kind, name)} kept changing while deleting it ({CAS_ATTEMPTS} attempts); retry")


def _spu_delete_checks(context: context_module.Context, spu: models.Spu) -> list[str]:
    """Refuse to delete a managed SPU; warn (but allow) when partitions still use the SPU."""
    group = spu_group.owning_group(spu)
    if group is not None and context.local_store["spu-groups"].get(group) is not None:
        raise ApiError(
            409,
            "ManagedSpu",
            f"SPU {spu.name!r} is managed by SPU group {group!r}: scale the group down or delete it instead",
        )
    users = sorted(
        (partition for partition in context.local_store["partitions"].objects() if spu.spec.id in partition.spec.replicas),  # type: ignore[attr-defined]
        key=lambda partition: (partition.topic, partition.index),  # type: ignore[attr-defined]
    )
    if not users:
        return []
    names = [partition.name for partition in users]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return [
        f"SPU {spu.spec.id} ({spu.name!r}) still holds replicas of {len(names)} partition"
        f"{'s' if len(names) != 1 else ''}: {shown}; they stay assigned to id {spu.spec.id} "
        "until an SPU with that id is registered again"
    ]
