"""The Fluvio object writes (Create, Delete, Update) as Status answers, through the same admin
operations as the HTTP API, so both validate and write exactly alike.

Every semantic failure is a Status with a code the client decodes; nothing here closes a connection.
"""

from __future__ import annotations

import asyncio
import enum
import operator
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from connection_manager import ratelimit
from controller import context as context_module
from controller.api import admin_ops, admission, auth
from controller.api.fluvio import forward, mapping, messages, objects
from controller.reconcile import topic_size
from store import attribution, kv, local, models

log = structlog.get_logger(__name__)

# The client gives up on a reply after 60 s: a create answers well before (fluvio-wire.md §6, R2).
CREATE_WAIT_SECONDS = 30.0
# A write a standby sends on waits for the leader's answer this much longer than a create waits.
FORWARD_MARGIN_SECONDS = 5.0

Error = messages.Error


class Readiness(enum.Enum):
    """When a Fluvio topic create answers OK (Fluvio's own SC waits for ONLINE).

    PROVISIONED: the topic is placed and every partition of its replica map is in the store with
    those replicas. ONLINE: and every partition is Online, which needs SPUs that report partition
    status; switch the daemon to it once they do.
    """

    PROVISIONED = "provisioned"
    ONLINE = "online"


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a create ended: OK, or the error the client sees."""

    code: Error
    message: str = ""


def ready_partitions(
    topic: models.Topic, partitions: local.KindStore[models.Partition], readiness: Readiness
) -> tuple[int, int]:
    """(partitions of the topic's replica map that are ready, partitions the topic wants)."""
    wanted = topic.spec.partition_count()
    ready = 0
    for index, replicas in topic.status.replica_map.items():
        entry = partitions.get(models.partition_name(topic.name, index))
        if entry is None or list(entry.obj.spec.replicas) != list(replicas):
            continue
        if readiness is Readiness.ONLINE and entry.obj.status.resolution is not models.PartitionResolution.ONLINE:
            continue
        ready += 1
    return ready, wanted


def _forward_tls(context: context_module.Context) -> Callable[[], ssl.SSLContext | None]:
    """How a standby connects to the leader's public port: TLS when this SC serves TLS (the SCs of
    a store are configured alike), verified with tls_client_ca (else the system's CAs); with
    tls_client_ca, presenting this SC's own certificate. Read from the files at each connection."""
    settings = context.settings

    def build() -> ssl.SSLContext | None:
        if settings.tls_cert is None or settings.tls_key is None:
            return None
        ca = None if settings.tls_client_ca is None else str(settings.tls_client_ca)
        tls = ssl.create_default_context(cafile=ca)
        if settings.tls_client_ca is not None:
            tls.load_cert_chain(settings.tls_cert, settings.tls_key)
        return tls

    return build


def _check_assignment_size(name: str, rows: list[objects.PartitionMap], max_request_bytes: int) -> None:
    """Building our model of a 16 MiB assignment takes seconds on the event loop: one that can never
    be stored (a topic is one etcd request) is refused first (TopicError, as TopicTooLarge), its
    replicas counted in C."""
    replicas = sum(map(len, map(_REPLICAS, rows)))
    least = topic_size.least_assignment_bytes(len(rows), replicas)
    if least > max_request_bytes:
        raise mapping.Refused(
            Error.TOPIC_ERROR,
            f"topic {name!r} assigns {len(rows)} partitions {replicas} replicas, at least {least} bytes in the store: "
            f"above the {max_request_bytes} bytes of one etcd request (etcd_max_request_bytes), which holds the whole "
            "topic; use fewer partitions or replicas, or raise etcd_max_request_bytes",
        )


def failure(name: str, code: Error, message: str) -> messages.Status:
    args = (message,) if code is Error.OTHER else ()
    return messages.Status(name, messages.ErrorCode(code, args), message)


_REPLICAS = operator.attrgetter("replicas")
# What an admin operation's error (its API.md code) is for the Fluvio client, per object type.
_TOPIC_ERRORS = {"AlreadyExists": Error.TOPIC_ALREADY_EXISTS, "NotFound": Error.TOPIC_NOT_FOUND, "ManualTopic": Error.TOPIC_INVALID_REPLICA_TYPE}
_SPU_ERRORS = {"AlreadyExists": Error.SPU_ALREADY_EXISTS, "SpuIdInUse": Error.SPU_ALREADY_EXISTS, "NotFound": Error.SPU_NOT_FOUND}
_GROUP_ERRORS = {"NotFound": Error.SPU_NOT_FOUND}
_Handler = Callable[..., Awaitable[messages.Status]] | None


class Admin:
    """Answers the object writes of every Fluvio connection of one daemon."""

    def __init__(
        self,
        context: context_module.Context,
        readiness: Readiness = Readiness.PROVISIONED,
        create_wait: float = CREATE_WAIT_SECONDS,
    ) -> None:
        self.context = context
        self.readiness = readiness
        self.create_wait = create_wait
        # A topic is ready once its partitions are: their changes wake the topic's waiters too.
        self.topic_waits = admin_ops.Waits(context.local_store["topics"], (context.local_store["partitions"], _topic_of))
        self.group_waits = admin_ops.Waits(context.local_store["spu-groups"])
        # Where this SC's writes go instead of its store: None while it may write (it leads);
        # the leader's public HOST:PORT while it is a standby ("" when none leads now).
        self.forward_to: Callable[[], str | None] = lambda: None
        self.forwarder = forward.Forwarder(create_wait + FORWARD_MARGIN_SECONDS, _forward_tls(context))

    async def run(self) -> None:
        """The shared listeners that wake waiting creates; runs until cancelled (or one fails,
        which stops the others: see admin_ops.Waits.run)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.topic_waits.run())
            group.create_task(self.group_waits.run())

    async def answer(
        self,
        request: messages.CreateRequest | messages.DeleteRequest | messages.UpdateRequest,
        who: auth.Principal | auth.Unauthenticated | None = None,
        version: int = messages.OBJECT_MAX_VERSION,
    ) -> messages.Status:
        """The Status for one write by ``who`` (its principal, or why the connection has none; None:
        not checked), sent in the client's ``version``; never raises (a bug answers
        UnknownServerError and is logged). A standby checks the rights, then sends the request on
        to the leader and answers with its Status."""
        name = _request_name(request)
        if isinstance(who, auth.Unauthenticated):
            return failure(name, Error.PERMISSION_DENIED, str(who))
        if who is not None and not (isinstance(request, messages.CreateRequest) and request.dry_run):
            try:
                auth.check(who, auth.Right(auth.ADMIN, name if request.label == objects.TOPIC else None))
            except auth.Forbidden as forbidden:
                return failure(name, Error.PERMISSION_DENIED, str(forbidden))
        leader = self.forward_to()
        if leader is not None:
            if not leader:
                return failure(name, Error.OTHER, "this SC is a standby and no SC leads the store now (an election is under way); try again shortly")
            # The name is the client's, unchecked here (up to 32 KB): the log gets an excerpt.
            log.info("fluvio write sent on to the leader", leader=leader, name=ratelimit.excerpt(name), by=None if who is None else who.name)
            return await self.forwarder.forward(leader, request, version, name)
        if who is None:
            return await self._answer(request, name)
        with attribution.acting(attribution.Actor(who.name, who.address)):
            return await self._answer(request, name)

    async def _answer(
        self, request: messages.CreateRequest | messages.DeleteRequest | messages.UpdateRequest, name: str
    ) -> messages.Status:
        if isinstance(request, messages.CreateRequest):
            handler, errors, default = self._create_handler(request.label)
        elif isinstance(request, messages.DeleteRequest):
            handler, errors, default = self._delete_handler(request.label)
        else:
            handler, errors, default = self._update_handler(request.label)
        if handler is None:
            return failure(name, default, f"{type(request).__name__.removesuffix('Request')} of {request.label!r} objects is not supported by this SC")
        try:
            return await handler(request)
        except mapping.Refused as refused:
            return failure(name, refused.code, refused.message)
        except admin_ops.ApiError as error:
            if error.status == 503:
                return failure(name, Error.OTHER, error.message)
            return failure(name, errors.get(error.code, default), error.message)
        except kv.NoSpace as error:
            return failure(name, Error.OTHER, f"the KV store refuses writes: {error}")
        except kv.Unavailable as error:
            return failure(name, Error.OTHER, f"the KV store is unavailable ({error}); retry shortly")
        except admission.Busy as busy:
            return failure(name, Error.OTHER, busy.message)
        except Exception:
            request_id = secrets.token_hex(6)
            log.exception("unexpected error answering a Fluvio request", request_id=request_id, request=repr(request)[:500])
            return failure(name, Error.UNKNOWN_SERVER_ERROR, f"internal error (request id {request_id}); the SC log has the details")

    def _create_handler(self, label: str) -> tuple[_Handler, dict[str, Error], Error]:
        return {
            objects.TOPIC: (self._create_topic, _TOPIC_ERRORS, Error.TOPIC_ERROR),
            objects.CUSTOM_SPU: (self._register_spu, _SPU_ERRORS, Error.SPU_ERROR),
            objects.SPU_GROUP: (self._create_spu_group, _GROUP_ERRORS, Error.SPU_ERROR),
        }.get(label, (None, {}, Error.INVALID_CREATE_REQUEST))

    def _delete_handler(self, label: str) -> tuple[_Handler, dict[str, Error], Error]:
        return {
            objects.TOPIC: (self._delete_topic, _TOPIC_ERRORS, Error.TOPIC_ERROR),
            objects.CUSTOM_SPU: (self._unregister_spu, _SPU_ERRORS, Error.SPU_ERROR),
            objects.SPU_GROUP: (self._delete_spu_group, _GROUP_ERRORS, Error.SPU_ERROR),
        }.get(label, (None, {}, Error.INVALID_DELETE_REQUEST))

    def _update_handler(self, label: str) -> tuple[_Handler, dict[str, Error], Error]:
        if label == objects.TOPIC:
            return self._update_topic, _TOPIC_ERRORS, Error.TOPIC_ERROR
        return None, {}, Error.OTHER

    # ------------------------------------------------------------------ topics

    async def _create_topic(self, request: messages.CreateRequest) -> messages.Status:
        """Fluvio's order: name, existence, storage settings, replicas; then dry run or write and wait."""
        name = request.name
        mapping.check_topic_name(name)
        admin_ops.require_synced(self.context)
        if self.context.local_store["topics"].get(name) is not None:
            return failure(name, Error.TOPIC_ALREADY_EXISTS, f"Topic {name!r} already exists")
        mapping.check_topic_config(request.spec)
        rows = mapping.assigned_rows(request.spec)
        if rows is not None:
            _check_assignment_size(name, rows, kv.request_size(self.context.kv_store).max_request_bytes)
        topic = mapping.topic_from_create(name, request.spec)
        if request.dry_run:
            await admin_ops.dry_run_topic(self.context, topic)
            return messages.Status(name)
        with kv.budget(self.create_wait):  # an etcd leader change costs time, not the create
            revision = await admin_ops.create_topic(self.context, topic)
        verdict = await self.topic_waits.wait(name, lambda: self._topic_verdict(name, revision), self.create_wait)
        if verdict is None:
            return failure(name, Error.TOPIC_NOT_PROVISIONED, self._not_ready_message(name))
        if verdict.code is Error.NONE:
            return messages.Status(name)
        return failure(name, verdict.code, verdict.message)

    def _topic_verdict(self, name: str, written_revision: int) -> Verdict | None:
        topics = self.context.local_store["topics"]
        entry = topics.get(name)
        if entry is None:
            if topics.revision >= written_revision:
                return Verdict(Error.TOPIC_ERROR, f"topic {name!r} was deleted while its create waited for it")
            return None
        if entry.mod_revision <= written_revision:
            return None  # the controller has not judged our write yet
        topic: models.Topic = entry.obj
        resolution = topic.status.resolution
        if resolution is models.TopicResolution.INVALID_CONFIG:
            return Verdict(Error.TOPIC_INVALID_CONFIGURATION, admin_ops.invalid_topic(name, topic.status.reason))
        if resolution is models.TopicResolution.INSUFFICIENT_RESOURCES:
            return Verdict(
                Error.TOPIC_NOT_PROVISIONED,
                f"topic {name!r} is InsufficientResources: {topic.status.reason}; it was kept and is placed "
                "as soon as enough SPUs are online",
            )
        if resolution is models.TopicResolution.DELETING:
            return Verdict(Error.TOPIC_ERROR, f"topic {name!r} is being deleted")
        if resolution is models.TopicResolution.PROVISIONED:
            ready, wanted = ready_partitions(topic, self.context.local_store["partitions"], self.readiness)
            if ready >= wanted:
                return Verdict(Error.NONE)
        return None

    def stop(self) -> None:
        """The SC is stopping: every create waiting for a verdict is answered now with what it has
        (a verdict will not come from this SC), and any later one at once."""
        self.topic_waits.close()
        self.group_waits.close()

    def _not_ready_message(self, name: str) -> str:
        entry = self.context.local_store["topics"].get(name)
        if entry is None:
            if self.topic_waits.closed:
                return f"topic {name!r} was created but the SC stopped before it saw it"
            return f"topic {name!r} was created but the SC has not seen it within {self.create_wait:g} s"
        topic: models.Topic = entry.obj
        ready, wanted = ready_partitions(topic, self.context.local_store["partitions"], self.readiness)
        if self.topic_waits.closed:
            return (
                f"only {ready} out of {wanted} partitions of topic {name!r} are {self.readiness.value} when the SC "
                f"stopped (topic {topic.status.resolution.value}); the topic stays and is completed by the SC that leads next"
            )
        return (
            f"only {ready} out of {wanted} partitions of topic {name!r} are {self.readiness.value} after "
            f"{self.create_wait:g} s (topic {topic.status.resolution.value}); the topic stays and is completed in the background"
        )

    async def _delete_topic(self, request: messages.DeleteRequest) -> messages.Status:
        name = request.key
        try:
            await admin_ops.delete(self.context, "topics", name)
        except admin_ops.ApiError as error:
            if error.code == "NotFound":
                return failure(name, Error.TOPIC_NOT_FOUND, f"Topic {name!r} not found")
            raise
        return messages.Status(name)

    async def _update_topic(self, request: messages.UpdateRequest) -> messages.Status:
        name = request.key
        action = request.action
        if isinstance(action, messages.AddMirror):
            return failure(name, Error.TOPIC_INVALID_REPLICA_TYPE, f"topic {name!r}: mirrors are not supported by this SC")
        try:
            await admin_ops.add_partitions(self.context, name, action.count)
        except admin_ops.ApiError as error:
            if error.code == "NotFound":
                return failure(name, Error.TOPIC_NOT_FOUND, f"Topic {name!r} not found")
            raise
        return messages.Status(name)  # Fluvio answers without waiting for the new partitions

    # ------------------------------------------------------------------ SPUs and SPU groups

    async def _register_spu(self, request: messages.CreateRequest) -> messages.Status:
        spu = mapping.spu_from_create(request.name, request.spec)
        await admin_ops.register_spu(self.context, spu, dry_run=request.dry_run)
        # Fluvio answers a dry run with an empty name.
        return messages.Status("" if request.dry_run else spu.name)

    async def _unregister_spu(self, request: messages.DeleteRequest) -> messages.Status:
        key = request.key
        spus = self.context.local_store["spus"]
        if isinstance(key, messages.SpuKeyName):
            shown = key.name
            entry = spus.get(key.name)
        else:
            shown = f"spu-{key.id}"
            entry = next((entry for entry in spus if entry.obj.spec.id == key.id), None)
        if entry is None:
            return failure(shown, Error.SPU_NOT_FOUND, f"SPU {shown!r} not found")
        spu: models.Spu = entry.obj
        if spu.spec.spu_type is not models.SpuType.CUSTOM:
            return failure(spu.name, Error.SPU_ERROR, f"expected 'Custom' spu, found '{spu.spec.spu_type.value}' spu ({spu.name!r})")
        await admin_ops.delete(self.context, "spus", spu.name)
        return messages.Status(spu.name)

    async def _create_spu_group(self, request: messages.CreateRequest) -> messages.Status:
        group = mapping.spu_group_from_create(request.name, request.spec)
        if request.dry_run:
            if self.context.local_store["spu-groups"].get(group.name) is not None:
                return failure(group.name, Error.SPU_ERROR, f"{admin_ops.label('spu-groups', group.name)} already exists")
            return messages.Status(group.name)
        revision = await admin_ops.create(self.context, group)
        wait_ms = min(request.timeout_ms if request.timeout_ms is not None else 120_000, int(self.create_wait * 1000))
        current, _ = await admin_ops.wait_settled(self.group_waits, group, revision, admin_ops.group_settled(revision), wait_ms)
        if current is not None and current.status.resolution is models.SpuGroupResolution.INVALID:
            return failure(
                group.name,
                Error.SPU_ERROR,
                f"SPU group {group.name!r} is Invalid: {current.status.reason}; "
                "it is kept, and reserves its range by itself once nothing collides: unregister the SPUs named, or delete the group and create it with another minId",
            )
        return messages.Status(group.name)

    async def _delete_spu_group(self, request: messages.DeleteRequest) -> messages.Status:
        await admin_ops.delete(self.context, "spu-groups", request.key)
        return messages.Status(request.key)


def _topic_of(partition_name: str) -> str:
    return partition_name.rpartition("-")[0]


def _request_name(request: messages.CreateRequest | messages.DeleteRequest | messages.UpdateRequest) -> str:
    if isinstance(request, messages.CreateRequest):
        return request.name
    key = request.key
    if isinstance(key, messages.SpuKeyName):
        return key.name
    if isinstance(key, messages.SpuKeyId):
        return f"spu-{key.id}"
    return key if isinstance(key, str) else ""
