"""Admin operations shared by the public HTTP API and the Fluvio admin protocol: create, grow and
delete objects (user spec writes to the KV store) and wait for the controllers' verdict.

No aiohttp here: a failure is an ApiError (HTTP status, code, message) that each front end answers
in its own shape. Never writes a status and never writes the local store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Set
from typing import Any, TypeVar, cast

import pydantic

from controller import context as context_module, placement
from controller.api import admission
from controller.reconcile import actions, partition, spu_group, spu_ids, topic as topic_controller
from store import kv, local, models, spu_index

T = TypeVar("T")
Stored = TypeVar("Stored", bound=models.AnyObject)

# Writes that lose a compare-and-swap to the controllers' status writes are retried this often.
CAS_ATTEMPTS = 5

KIND_LABELS = {"spus": "SPU", "spu-groups": "SPU group", "topics": "topic", "partitions": "partition"}

# A topic is one etcd request (a 100,000-row create of 4 MB is never stored on etcd's default 1.5
# MiB). A topic create (or dry run) may hold the store's request limit and this much more (its
# name, settings and encoding) before it is parsed: what a stored topic holds at least.
TOPIC_BODY_ROOM_BYTES = 64 * 1024


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


def decoded(kind: str, item: kv.KeyValue) -> models.AnyObject | None:
    """An object read straight from the KV store; a malformed value (written by hand) is skipped."""
    try:
        return models.decode(kind, item.value)
    except pydantic.ValidationError:
        return None


def topic_content_limit(kv_store: kv.KVStore) -> int:
    """The most bytes a topic create (or dry run) may hold before it is parsed, in either front end
    (an HTTP body besides JSON's whitespace, a Fluvio frame): one request of ``kv_store``, and
    TOPIC_BODY_ROOM_BYTES. The stored topic holds at least what the create holds (its assignment
    twice: in the spec and as the replica map)."""
    return kv.request_size(kv_store).max_request_bytes + TOPIC_BODY_ROOM_BYTES


def require_synced(context: context_module.Context) -> None:
    if not context.synced.is_set():
        raise ApiError(503, "NotSynced", "the SC is still loading its store; retry shortly (see /healthz)")


# ---------------------------------------------------------------------------- waiting for the controllers


class Waits:
    """Wakes the requests waiting for a verdict on an object of ``table``, from one shared listener
    per table (not one per request), so a change wakes only the requests waiting for that object,
    however many are in flight. Each of ``related`` is another table with the name of the object
    its changes concern (a partition's topic): a change there wakes that object's waiters too.
    """

    def __init__(self, table: local.KindStore[Any], *related: tuple[local.KindStore[Any], Callable[[str], str]]) -> None:
        self.table = table
        self._follows = ((table, _same_name), *related)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        # Set when the SC stops: no verdict will come from it, so no request waits for one.
        self._closed = False

    async def run(self) -> None:
        """Until cancelled. A task group, not gather: if one follower fails the others stop too,
        so that a restart (the supervisor's) does not leave a second copy of them running."""
        async with asyncio.TaskGroup() as group:
            for table, owner in self._follows:
                group.create_task(self._follow(table, owner))

    async def _follow(self, table: local.KindStore[Any], owner: Callable[[str], str]) -> None:
        listener = table.listener(local.Part.ALL)
        try:
            while True:
                await listener.wait()
                if not self._waiters:
                    listener.skip()  # nobody waits: what changed does not matter
                    continue
                changes = listener.changes()
                names: Iterable[str]
                if changes.full:
                    names = list(self._waiters)
                else:
                    names = {owner(entry.name) for entry in changes.updated} | {owner(name) for name in changes.deleted}
                for name in names:
                    for event in self._waiters.get(name, ()):
                        event.set()
        finally:
            listener.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Answer every waiting request now, and any later one at once, with what ``verdict``
        says then (None if undecided, as when its time runs out): the SC is stopping, and a
        request held for a verdict would hold the HTTP server's shutdown until its own timeout
        cancels the request unanswered."""
        self._closed = True
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def wait(self, name: str, verdict: Callable[[], T | None], timeout: float) -> T | None:
        """``verdict()`` once it is not None, checked again on every change of object ``name`` (or
        of what ``related`` ties to it); None when ``timeout`` seconds pass first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = asyncio.Event()
        self._waiters.setdefault(name, set()).add(event)
        try:
            while True:
                # Checked after registering and before awaiting: no change can slip between.
                decided = verdict()
                remaining = deadline - loop.time()
                if decided is not None or remaining <= 0 or self._closed:
                    return decided
                event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await event.wait()
        finally:
            waiters = self._waiters[name]
            waiters.discard(event)
            if not waiters:
                del self._waiters[name]


def _same_name(name: str) -> str:
    return name


def topic_settled(written_revision: int) -> Callable[[local.Entry[models.AnyObject]], bool]:
    """Provisioned with every partition placed, or definitely not, by a write after ours."""

    def settled(entry: local.Entry[models.AnyObject]) -> bool:
        if entry.mod_revision <= written_revision:
            return False
        topic = cast(models.Topic, entry.obj)  # the topics table
        status = topic.status
        if status.resolution is models.TopicResolution.PROVISIONED:
            # Every row below the count, not as many rows: a map with a gap still has one to fill.
            return not topic_controller.short_of_rows(topic)
        if status.resolution is models.TopicResolution.PENDING and status.reason.startswith(topic_controller.REFUSED_PROVISION):
            # The store refuses it (an etcd limit lowered): a verdict until an operator acts, as
            # InsufficientResources is, not a step on the way; the client learns why at once.
            return True
        return status.resolution in (
            models.TopicResolution.INVALID_CONFIG,
            models.TopicResolution.INSUFFICIENT_RESOURCES,
            models.TopicResolution.DELETING,
        )

    return settled


def group_settled(written_revision: int) -> Callable[[local.Entry[models.AnyObject]], bool]:
    def settled(entry: local.Entry[models.AnyObject]) -> bool:
        return (
            entry.mod_revision > written_revision
            and entry.obj.status.resolution is not models.SpuGroupResolution.INIT
        )

    return settled


async def wait_settled(
    waits: Waits,
    written: models.AnyObject,
    written_revision: int,
    settled: Callable[[local.Entry[models.AnyObject]], bool],
    timeout_ms: int,
) -> tuple[models.AnyObject | None, bool]:
    """(the object as it is now, whether it settled); None if it was deleted meanwhile (once the
    store has seen the write at ``written_revision``, the object is gone)."""
    if timeout_ms == 0:
        return written, False
    table = waits.table

    def verdict() -> local.Entry[models.AnyObject] | _Gone | None:
        entry = table.get(written.name)
        if entry is None:
            return _GONE if table.revision >= written_revision else None
        return entry if settled(entry) else None

    decided: local.Entry[models.AnyObject] | _Gone | None = await waits.wait(written.name, verdict, timeout_ms / 1000)
    if isinstance(decided, _Gone):
        return None, False
    entry = decided if decided is not None else table.get(written.name)
    if entry is None:
        # Deleted after our write, or not even mirrored yet when the time ran out.
        return (None, False) if table.revision >= written_revision else (written, False)
    return entry.obj, settled(entry)


# Seconds a waiting drain lets a burst of partition changes land before it looks again: a failover
# writes its elections in batches, and each look goes over every partition.
DRAIN_LOOK_COALESCE = 0.05


async def wait_led_away(
    local_store: local.LocalStore, spu_id: int, blocked: Set[str], timeout: float, stall: float
) -> list[str]:
    """What ``spu_id`` still leads once a drain's wait ends: when that is no more than ``blocked``
    (what could not move from the start), at ``timeout`` seconds, or once it has not changed for
    ``stall`` seconds (what is left has no other replica that may lead now). It looks at the
    partitions again only after they change: a drain that waits costs nothing while nothing does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    listener = local_store["partitions"].listener()
    listener.skip()
    try:
        led = partition.led_by(local_store.snapshot(), spu_id)
        progress_at = loop.time()
        while not set(led) <= blocked:
            wait_until = min(deadline, progress_at + stall)
            if loop.time() >= wait_until:
                break
            try:
                async with asyncio.timeout_at(wait_until):
                    await listener.wait()
                    await asyncio.sleep(DRAIN_LOOK_COALESCE)
            except TimeoutError:
                # A change may have come while the time ran out: say what is led now.
                return partition.led_by(local_store.snapshot(), spu_id) if listener.has_changes() else led
            listener.skip()
            now_led = partition.led_by(local_store.snapshot(), spu_id)
            if now_led != led:
                led, progress_at = now_led, loop.time()
        return led
    finally:
        listener.close()


class _Gone:
    """The verdict on an object deleted after the write waited for."""


_GONE = _Gone()


# ---------------------------------------------------------------------------- creates


async def create(context: context_module.Context, obj: models.AnyObject) -> int:
    """Write a new object (create-if-absent); its store revision."""
    try:
        return await context.kv_store.create(obj.key, models.encode(obj))
    except kv.AlreadyExists:
        raise ApiError(409, "AlreadyExists", f"{label(obj.kind, obj.name)} already exists") from None
    except kv.TooLarge as error:
        raise ApiError(422, "ObjectTooLarge", f"{label(obj.kind, obj.name)} cannot be stored: {error}") from None


async def register_spu(context: context_module.Context, spu: models.Spu, dry_run: bool = False) -> int:
    """Register a custom SPU whose name and id are both unused; its store revision (0 for a dry run,
    which makes every check and writes nothing).

    The SPU and its id's index key (``spu_ids``) are written in one transaction, each compared
    absent (or, for a stale index key, at its revision): of concurrent registrations of one id
    exactly one commits, and the others find the id taken when they look again.
    """
    if spu.spec.spu_type is not models.SpuType.CUSTOM:
        raise ApiError(
            422,
            "InvalidObject",
            f"spec.spuType: only Custom SPUs can be registered; Managed SPUs are created by SPU groups "
            f"(got {spu.spec.spu_type.value!r})",
        )
    index_key = spu_index.index_key(spu.spec.id)
    for _ in range(CAS_ATTEMPTS):
        # The index key before the SPUs: an index key naming an SPU that the later listing lacks
        # is then certainly stale (an SPU and its key are only ever written together).
        stored_index = await context.kv_store.get(index_key)
        listed = await context.kv_store.list(models.object_key("spus", ""))
        others = [obj for obj in (decoded("spus", item) for item in listed.items) if isinstance(obj, models.Spu)]
        if any(other.name == spu.name for other in others):
            raise ApiError(409, "AlreadyExists", f"{label('spus', spu.name)} already exists")
        try:
            claimed = spu_ids.claim(
                spu.name,
                spu.spec.id,
                None if stored_index is None else (stored_index.value, stored_index.mod_revision),
                {other.name: other.spec.id for other in others},
            )
        except spu_ids.IdInUse as used:
            raise ApiError(
                409, "SpuIdInUse", f"SPU id {spu.spec.id} is already used by SPU {used.holder!r}; choose another id"
            ) from None
        assert claimed is not None and claimed.value is not None  # the SPU does not exist, so it holds nothing
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
        try:
            return await context.kv_store.txn(
                [kv.Compare(spu.key, 0), kv.Compare(index_key, claimed.expected_revision or 0)],
                [kv.Put(spu.key, models.encode(spu)), kv.Put(index_key, claimed.value)],
            )
        except kv.Conflict as conflict:
            if conflict.key == spu.key:
                raise ApiError(409, "AlreadyExists", f"{label('spus', spu.name)} already exists") from None
            continue  # the id's index changed since we read it: look again
    raise ApiError(
        409,
        "Conflict",
        f"SPU id {spu.spec.id} kept changing hands while registering {spu.name!r} ({CAS_ATTEMPTS} attempts); retry",
    )


def _group_naming(context: context_module.Context, spu_name: str) -> str | None:
    """The SPU group whose managed SPUs are (or will be) named ``spu_name``, if any."""
    group_name, _, index = spu_name.rpartition("-")
    if not group_name or not index.isdigit():
        return None
    entry = context.local_store["spu-groups"].get(group_name)
    if entry is None or int(index) >= entry.obj.spec.replicas:
        return None
    return group_name


async def create_topic(context: context_module.Context, topic: models.Topic) -> int:
    """Write a new topic whose configuration the controller would accept; its store revision."""
    # What the controller would reject before placing (an invalid assignment or policies, a
    # strategy neither built in nor configured): say so now and write nothing, with the
    # controller's own check and message.
    require_synced(context)
    snapshot = context.local_store.snapshot()
    spus = topic_controller.spu_infos(snapshot)
    problem = topic_controller.validate(topic, spus, context.placers)
    if problem is not None:
        raise ApiError(422, "InvalidConfig", problem.message)
    _check_size(context, topic, spus)
    return await create(context, topic)


def invalid_topic(name: str, reason: str) -> str:
    """What a create answers for a topic the controller made InvalidConfig; its reason says what to do."""
    return f"topic {name!r} is InvalidConfig: {reason}"


def _check_size(context: context_module.Context, topic: models.Topic, spus: tuple[placement.SpuInfo, ...]) -> None:
    """Refuse a topic its controller could not store (one etcd request holds each topic)."""
    problem = topic_controller.too_large(topic, spus, kv.request_size(context.kv_store))
    if problem is not None:
        raise ApiError(422, "TopicTooLarge", problem)


def dry_run_request(
    context: context_module.Context, topic: models.Topic
) -> tuple[placement.PlacementRequest, tuple[placement.SpuInfo, ...]]:
    """What a dry run of a new topic computes (and the SPUs it is computed over), taken from the
    store now; the computing is the caller's (off the event loop: it may be large)."""
    require_synced(context)
    if context.local_store["topics"].get(topic.name) is not None:
        raise ApiError(409, "AlreadyExists", f"{label('topics', topic.name)} already exists")
    snapshot = context.local_store.snapshot()
    _check_size(context, topic, topic_controller.spu_infos(snapshot))  # as the create would
    try:
        request = topic_controller.dry_run_request(snapshot, topic, context.placers)
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
            result = await context.gate.offload(placement.compute, request, context.placers)
        except placement.PlacementError as error:
            raise ApiError(422, error.code, error.message) from None
    return result, spus


# ---------------------------------------------------------------------------- updates


async def add_partitions(context: context_module.Context, name: str, count: int) -> tuple[models.Topic, int]:
    """Grow a computed topic by ``count`` partitions; (the topic as written, its store revision)."""
    if count < 1:
        raise ApiError(422, "InvalidRequest", f"count: the number of partitions to add must be at least 1 (got {count})")

    def grow(topic: models.Topic) -> models.Topic:
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
        grown = topic.model_copy(update={"spec": topic.spec.model_copy(update={"partitions": total})})
        _check_size(context, grown, topic_controller.spu_infos(context.local_store.snapshot()))
        return grown

    return await update_spec(context, models.Topic, name, grow, "adding partitions")


async def set_spu_rack(context: context_module.Context, name: str, rack: str | None) -> models.Spu:
    """Give an SPU a rack (None: no rack) by compare-and-swap on its spec; the SPU as written.

    Topics waiting for racks are placed by their controller once it sees the change. A managed
    SPU has its group's rack: the group controller would put it back, so it is refused.
    """

    def set_rack(spu: models.Spu) -> models.Spu:
        group = spu_group.owning_group(spu)
        group_entry = None if group is None else context.local_store["spu-groups"].get(group)
        if group_entry is not None:
            raise ApiError(
                409,
                "ManagedSpu",
                f"SPU {name!r} is managed by SPU group {group!r}, whose SPUs all have its rack "
                f"({group_entry.obj.spec.rack!r}): it cannot be set on one of them",
            )
        try:
            spec = models.SpuSpec.model_validate({**spu.spec.model_dump(), "rack": rack})
        except pydantic.ValidationError as error:
            raise ApiError(422, "InvalidRequest", models.describe_validation_error(error)) from None
        return spu.model_copy(update={"spec": spec})

    changed, _ = await update_spec(context, models.Spu, name, set_rack, "setting its rack")
    return changed


async def update_spec(
    context: context_module.Context,
    model: type[Stored],
    name: str,
    change: Callable[[Stored], Stored],
    doing: str,
) -> tuple[Stored, int]:
    """Compare-and-swap ``change(current)`` on the object; re-read and re-apply when a controller
    wrote first (``change`` is relative, so it applies on top of the newer state). A change that
    changes nothing writes nothing (the revision is then the object's current one)."""
    kind = model.kind
    key = models.object_key(kind, name)
    for _ in range(CAS_ATTEMPTS):
        stored = await context.kv_store.get(key)
        current = None if stored is None else decoded(kind, stored)
        if stored is None or not isinstance(current, model):
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found")
        changed = change(current)
        if changed == current:
            return current, stored.mod_revision  # already so: a write would only wake everybody
        try:
            return changed, await context.kv_store.update(key, models.encode(changed), stored.mod_revision)
        except kv.Conflict:
            continue
        except kv.TooLarge as error:
            raise ApiError(422, "ObjectTooLarge", f"{label(kind, name)} cannot be stored {doing}: {error}") from None
        except kv.NotFound:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found") from None
    raise ApiError(409, "Conflict", f"{label(kind, name)} kept changing while {doing} ({CAS_ATTEMPTS} attempts); retry")


async def set_drain(context: context_module.Context, name: str, drain: bool) -> models.Spu:
    """Record (or clear) the operator's intent to drain SPU ``name``: its spec.drain, by
    compare-and-swap; the SPU as written (or as it was, when it already said so)."""

    def mark(spu: models.Spu) -> models.Spu:
        return spu.model_copy(update={"spec": spu.spec.model_copy(update={"drain": drain})})

    marked, _ = await update_spec(context, models.Spu, name, mark, "draining it" if drain else "undraining it")
    return marked


# ---------------------------------------------------------------------------- deletes


async def delete(context: context_module.Context, kind: str, name: str) -> tuple[models.AnyObject | None, list[str]]:
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
        released = None
        if isinstance(obj, models.Spu):
            warnings = _spu_delete_checks(context, obj)
            released = await _release_spu_id(context, obj)
        if kind == "spu-groups":
            warnings = group_shrink_warnings(context, name, 0, f"deleting SPU group {name!r} deletes")
        try:
            if released is None:
                await context.kv_store.delete(key, stored.mod_revision)
            else:
                # The SPU's id goes free in the same transaction as the SPU goes.
                await context.kv_store.txn(
                    [kv.Compare(key, stored.mod_revision), kv.Compare(released.key, released.expected_revision or 0)],
                    [kv.Delete(key), kv.Delete(released.key)],
                )
        except kv.Conflict as conflict:
            if conflict.key == key and conflict.actual == 0:
                raise ApiError(404, "NotFound", f"{label(kind, name)} not found") from None
            continue  # its status (or its id's index) changed meanwhile: re-check against the new state
        except kv.NotFound:
            raise ApiError(404, "NotFound", f"{label(kind, name)} not found") from None
        return obj, warnings
    raise ApiError(409, "Conflict", f"{label(kind, name)} kept changing while deleting it ({CAS_ATTEMPTS} attempts); retry")


async def _release_spu_id(context: context_module.Context, spu: models.Spu) -> actions.Write | None:
    """The delete of the SPU's id index key, to go with the SPU's own (None if it names another)."""
    stored = await context.kv_store.get(spu_index.index_key(spu.spec.id))
    return spu_ids.release(spu.name, spu.spec.id, None if stored is None else (stored.value, stored.mod_revision))


def _spu_delete_checks(context: context_module.Context, spu: models.Spu) -> list[str]:
    """Refuse to delete a managed SPU; warn (but allow) when partitions still use the SPU."""
    group = spu_group.owning_group(spu)
    if group is not None and context.local_store["spu-groups"].get(group) is not None:
        raise ApiError(
            409,
            "ManagedSpu",
            f"SPU {spu.name!r} is managed by SPU group {group!r}: scale the group down or delete it instead",
        )
    return _hosting_warnings(context, [spu], "")


def group_shrink_warnings(context: context_module.Context, group: str, replicas: int, doing: str) -> list[str]:
    """What a group shrinking to ``replicas`` SPUs (0: deleted) would delete that partitions still
    use: one warning per such SPU, each starting with ``doing`` ("scaling ... deletes")."""
    removed = [
        spu
        for spu in context.local_store["spus"].objects()
        if spu_group.owning_group(spu) == group and int(spu.name.rpartition("-")[2]) >= replicas
    ]
    return _hosting_warnings(context, removed, doing)


def _hosting_warnings(context: context_module.Context, spus: list[models.Spu], doing: str) -> list[str]:
    """One warning per SPU of ``spus`` that partitions still use (found in one pass)."""
    by_id = {spu.spec.id: spu for spu in spus}
    users: dict[int, list[models.Partition]] = {}
    if by_id:
        for partition in context.local_store["partitions"].objects():
            for replica in partition.spec.replicas:
                if replica in by_id:
                    users.setdefault(replica, []).append(partition)
    warnings = []
    for spu_id in sorted(users):
        spu = by_id[spu_id]
        names = [partition.name for partition in sorted(users[spu_id], key=lambda partition: (partition.topic, partition.index))]
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        who = f"{doing} SPU {spu_id} ({spu.name!r}), which still holds" if doing else f"SPU {spu_id} ({spu.name!r}) still holds"
        warnings.append(
            f"{who} replicas of {len(names)} partition{'s' if len(names) != 1 else ''}: {shown}; they stay assigned "
            f"to id {spu_id} until an SPU with that id is registered again or a rebalance moves them"
        )
    return warnings
