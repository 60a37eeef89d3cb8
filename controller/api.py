"""The public HTTP API on port 9003 (API.md): reads from the local store, user spec writes to the KV store.

Never writes a status (a new object carries the default one), never writes the local store, and
answers bad input with 400/404/409/422, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pydantic
import structlog
from aiohttp import web
from prometheus_client import exposition as prometheus_exposition

from controller import context as context_module, openapi, placement, spu_group, topic as topic_controller
from store import kv, local, models

log = structlog.get_logger(__name__)

DEFAULT_WAIT_MS = 30_000
# A create never holds a connection longer than this, whatever ?timeout= asks for.
MAX_WAIT_MS = 600_000
# A watch client that accepts nothing for this long is dropped (its listener would pin tombstones).
WATCH_STALL_SECONDS = 60.0
# How often an idle JSON-lines watch checks that its client is still connected.
WATCH_DISCONNECT_POLL_SECONDS = 1.0
# Events written to a JSON-lines watch per write (bounds one write's size and the loop time it takes).
WATCH_BATCH = 500
# Writes that lose a compare-and-swap to the controllers' status writes are retried this often.
CAS_ATTEMPTS = 5
# Bodies may carry large manual replica assignments.
MAX_BODY_BYTES = 16 * 1024 * 1024

KIND_LABELS = {"spus": "SPU", "spu-groups": "SPU group", "topics": "topic", "partitions": "partition"}

CONTEXT = web.AppKey("context", context_module.Context)
STOPPING = web.AppKey("stopping", asyncio.Event)

# pydantic error types that mean "the JSON value has the wrong type" (400) rather than
# "the value is of the right type but not acceptable" (422).
_TYPE_ERRORS = ("json_invalid", "json_type")


# ---------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An answer in the error shape of API.md: ``{"error": {"code", "message"}}`` (+ extra keys)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra

    def response(self) -> web.Response:
        return error_response(self.status, self.code, self.message, **self.extra)


def error_response(status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}, **extra}, status=status)


def _http_error(error: web.HTTPException, request: web.Request) -> web.Response:
    if isinstance(error, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(error.allowed_methods))
        return error_response(
            405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
        )
    if isinstance(error, web.HTTPNotFound):
        return error_response(404, "NotFound", f"no route for {request.method} {request.path}; see /openapi.json")
    if isinstance(error, web.HTTPRequestEntityTooLarge):
        return error_response(
            413, "RequestTooLarge", f"the request body is larger than {MAX_BODY_BYTES} bytes"
        )
    return error_response(error.status, error.reason.replace(" ", ""), error.text or error.reason)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure answers in the error shape; only a bug gives a 500, logged with a request id."""
    request_id = secrets.token_hex(6)
    try:
        response = await handler(request)
    except ApiError as error:
        response = error.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = _http_error(error, request)
    except kv.Unavailable as error:
        response = error_response(503, "Unavailable", f"the KV store is unavailable ({error}); retry shortly")
    except Exception:
        log.exception("unexpected error in the public API", request_id=request_id, method=request.method, path=request.path)
        response = error_response(
            500, "InternalError", f"internal error (request id {request_id}); the SC log has the details"
        )
    if not response.prepared:
        response.headers["X-Request-Id"] = request_id
    return response


# ---------------------------------------------------------------------------- request parsing


def _kind(request: web.Request) -> str:
    kind = request.match_info["kind"]
    if kind not in models.KINDS:
        raise ApiError(404, "NotFound", f"unknown kind {kind!r}: use one of {', '.join(models.KINDS)}")
    return kind


def _int_param(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit():
        raise ApiError(400, "MalformedRequest", f"query parameter {name} must be a whole number, got {raw!r}")
    value = int(raw)
    if value > maximum:
        raise ApiError(422, "InvalidRequest", f"query parameter {name} is at most {maximum}, got {value}")
    return value


def _bool_param(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return False
    lowered = raw.lower()
    if lowered in ("true", "1", ""):
        return True
    if lowered in ("false", "0"):
        return False
    raise ApiError(400, "MalformedRequest", f"query parameter {name} must be true or false, got {raw!r}")


def parse_json_object(raw: bytes, shape: str) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise ApiError(400, "MalformedRequest", f"the request body is empty: send a JSON object {shape}")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "MalformedRequest", "the request body is nested too deeply") from None
    except ValueError as error:
        raise ApiError(400, "MalformedRequest", f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(
            400, "MalformedRequest", f"the request body must be a JSON object {shape}, got {_json_type(body)}"
        )
    return body


def parse_object(kind: str, raw: bytes) -> models.ClusterObject:
    """A user's new object (``{name, spec}``) from a request body, validated strictly.

    Wrong JSON types give 400, values that are not acceptable 422, both naming field and value.
    """
    body = parse_json_object(raw, '{"name": ..., "spec": {...}}')
    if "status" in body:
        raise ApiError(
            422, "InvalidObject", "status: is written by the SC, not by users; send only name and spec"
        )
    try:
        # Strict: "3" is not a partition count and true is not a port. Validating the raw bytes
        # (not a re-serialised copy) keeps pydantic's own limits on deeply nested input.
        return models.model_for_kind(kind).model_validate_json(raw, strict=True)
    except pydantic.ValidationError as error:
        raise _validation_error(error) from None


def _validation_error(error: pydantic.ValidationError) -> ApiError:
    problems = error.errors(include_url=False)
    wrong_type = any(problem["type"].endswith("_type") or problem["type"] in _TYPE_ERRORS for problem in problems)
    message = models.describe_validation_error(error)
    if wrong_type:
        return ApiError(400, "MalformedRequest", message)
    return ApiError(422, "InvalidObject", message)


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _label(kind: str, name: str) -> str:
    return f"{KIND_LABELS[kind]} {name!r}"


def _decoded(kind: str, item: kv.KeyValue) -> models.ClusterObject | None:
    """An object read straight from the KV store; a malformed value (written by hand) is skipped."""
    try:
        return models.decode(kind, item.value)
    except pydantic.ValidationError:
        return None


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


TOPIC_WAITS = web.AppKey("topic_waits", Settlements)
GROUP_WAITS = web.AppKey("group_waits", Settlements)


def _topic_settled(written_revision: int) -> Callable[[local.Entry], bool]:
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


def _group_settled(written_revision: int) -> Callable[[local.Entry], bool]:
    def settled(entry: local.Entry) -> bool:
        return (
            entry.mod_revision > written_revision
            and entry.obj.status.resolution is not models.SpuGroupResolution.INIT  # type: ignore[attr-defined]
        )

    return settled


async def _wait_settled(
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


# ---------------------------------------------------------------------------- handlers: health, metrics, docs


async def healthz(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    if context.synced.is_set():
        return web.json_response({"status": "ok"})
    waiting = [kind for kind, table in context.local_store.tables.items() if not table.synced]
    if not context.local_store.meta.synced:
        waiting.append("meta")
    reason = (
        f"the SC is still loading its store (not synced yet: {', '.join(waiting)})"
        if waiting
        else "the SC has loaded its store and is still starting"
    )
    return web.json_response({"status": "starting", "reason": reason}, status=503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[CONTEXT].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": prometheus_exposition.CONTENT_TYPE_PLAIN_0_0_4})


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


# ---------------------------------------------------------------------------- handlers: reads


def _require_synced(context: context_module.Context) -> None:
    if not context.synced.is_set():
        raise ApiError(503, "NotSynced", "the SC is still loading its store; retry shortly (see /healthz)")


def _sort_key(kind: str) -> Callable[[models.ClusterObject], Any]:
    if kind == "spus":
        return lambda obj: (obj.spec.id, obj.name)  # type: ignore[attr-defined]
    if kind == "partitions":
        return lambda obj: (obj.topic, obj.index)  # type: ignore[attr-defined]
    return lambda obj: obj.name


def _topic_filter(request: web.Request, kind: str) -> Callable[[models.ClusterObject], bool] | None:
    topic_name = request.query.get("topic")
    if topic_name is None:
        return None
    if kind != "partitions":
        raise ApiError(422, "InvalidRequest", f"query parameter topic filters partitions only, not {kind}")
    return lambda obj: obj.topic == topic_name  # type: ignore[attr-defined]


async def list_objects(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    keep = _topic_filter(request, kind)
    _require_synced(context)
    objects = [obj for obj in context.local_store[kind].objects() if keep is None or keep(obj)]
    objects.sort(key=_sort_key(kind))
    # Each object is serialised by pydantic's own encoder: lists of 100,000 partitions stay cheap.
    body = b"[" + b",".join(models.encode(obj) for obj in objects) + b"]"
    return web.Response(body=body, content_type="application/json")


async def get_object(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    name = request.match_info["name"]
    _require_synced(context)
    entry = context.local_store[kind].get(name)
    if entry is None:
        raise ApiError(404, "NotFound", f"{_label(kind, name)} not found")
    return web.Response(body=models.encode(entry.obj), content_type="application/json")


# ---------------------------------------------------------------------------- handlers: writes


async def _create(context: context_module.Context, obj: models.ClusterObject) -> int:
    try:
        return await context.kv_store.create(obj.key, models.encode(obj))
    except kv.AlreadyExists:
        raise ApiError(409, "AlreadyExists", f"{_label(obj.kind, obj.name)} already exists") from None


async def register_spu(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    spu: models.Spu = parse_object("spus", await request.read())  # type: ignore[assignment]
    if spu.spec.spu_type is not models.SpuType.CUSTOM:
        raise ApiError(
            422,
            "InvalidObject",
            f"spec.spuType: only Custom SPUs can be registered; Managed SPUs are created by SPU groups "
            f"(got {spu.spec.spu_type.value!r})",
        )
    listed = await context.kv_store.list(models.object_key("spus", ""))
    others = [obj for obj in (_decoded("spus", item) for item in listed.items) if obj is not None]
    for other in others:
        if other.name == spu.name:
            raise ApiError(409, "AlreadyExists", f"{_label('spus', spu.name)} already exists")
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
    await _create(context, spu)
    return web.json_response(spu.to_json_dict(), status=201)


def _group_naming(context: context_module.Context, spu_name: str) -> str | None:
    """The SPU group whose managed SPUs are (or will be) named ``spu_name``, if any."""
    group_name, _, index = spu_name.rpartition("-")
    if not group_name or not index.isdigit():
        return None
    entry = context.local_store["spu-groups"].get(group_name)
    if entry is None or int(index) >= entry.obj.spec.replicas:  # type: ignore[attr-defined]
        return None
    return group_name


async def create_spu_group(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    group: models.SpuGroup = parse_object("spu-groups", await request.read())  # type: ignore[assignment]
    revision = await _create(context, group)
    current, settled = await _wait_settled(
        request.app[GROUP_WAITS], group, revision, _group_settled(revision), timeout_ms
    )
    if current is None:
        raise ApiError(409, "Conflict", f"{_label('spu-groups', group.name)} was deleted while it was being created")
    resolution = current.status.resolution  # type: ignore[attr-defined]
    if resolution is models.SpuGroupResolution.INVALID:
        raise ApiError(
            422,
            "SpuGroupInvalid",
            f"SPU group {group.name!r} is Invalid: {current.status.reason}; "  # type: ignore[attr-defined]
            f"it was kept so you can see why: delete it and create it again",
            object=current.to_json_dict(),
        )
    return web.json_response(current.to_json_dict(), status=201 if settled else 202)


async def create_topic(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    dry_run = _bool_param(request, "dryRun")
    topic: models.Topic = parse_object("topics", await request.read())  # type: ignore[assignment]
    if dry_run:
        return await _dry_run_topic(context, topic)
    # The controller would reject a configuration no cluster change can fix: say so now and
    # write nothing, with the controller's own check and message.
    _require_synced(context)
    snapshot = context.local_store.snapshot()
    problem = topic_controller.validate(topic, topic_controller.spu_infos(snapshot))
    if problem is not None:
        raise ApiError(422, "InvalidConfig", problem)
    revision = await _create(context, topic)
    return await _topic_answer(request, topic, revision, timeout_ms, created=True)


async def _dry_run_topic(context: context_module.Context, topic: models.Topic) -> web.Response:
    _require_synced(context)
    if context.local_store["topics"].get(topic.name) is not None:
        raise ApiError(409, "AlreadyExists", f"{_label('topics', topic.name)} already exists")
    snapshot = context.local_store.snapshot()
    try:
        result = topic_controller.dry_run(snapshot, topic)
    except placement.PlacementError as error:
        raise ApiError(422, error.code, error.message) from None
    return web.json_response(placement.result_to_json(result, topic_controller.spu_infos(snapshot)))


async def _topic_answer(
    request: web.Request, written: models.Topic, revision: int, timeout_ms: int, created: bool
) -> web.Response:
    current, settled = await _wait_settled(
        request.app[TOPIC_WAITS], written, revision, _topic_settled(revision), timeout_ms
    )
    if current is None:
        raise ApiError(409, "Conflict", f"{_label('topics', written.name)} was deleted while waiting for it")
    status: models.TopicStatus = current.status  # type: ignore[attr-defined]
    if settled and status.resolution is models.TopicResolution.INVALID_CONFIG:
        raise ApiError(
            422,
            "InvalidConfig",
            f"topic {written.name!r} is InvalidConfig: {status.reason}; "
            "it was kept so you can see why: delete it and create it again",
            object=current.to_json_dict(),
        )
    done = settled and status.resolution is models.TopicResolution.PROVISIONED
    return web.json_response(current.to_json_dict(), status=(201 if created else 200) if done else 202)


async def add_partitions(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    name = request.match_info["name"]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    count = _integer_body(await request.read(), "count", "the number of partitions to add")
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

    grown, revision = await _update_spec(context, "topics", name, grow, "adding partitions")
    return await _topic_answer(request, grown, revision, timeout_ms, created=False)  # type: ignore[arg-type]


async def _update_spec(
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
        current = None if stored is None else _decoded(kind, stored)
        if stored is None or current is None:
            raise ApiError(404, "NotFound", f"{_label(kind, name)} not found")
        changed = change(current)
        try:
            return changed, await context.kv_store.update(key, models.encode(changed), stored.mod_revision)
        except kv.Conflict:
            continue
        except kv.NotFound:
            raise ApiError(404, "NotFound", f"{_label(kind, name)} not found") from None
    raise ApiError(409, "Conflict", f"{_label(kind, name)} kept changing while {doing} ({CAS_ATTEMPTS} attempts); retry")


def _integer_body(raw: bytes, field: str, meaning: str) -> int:
    """The one whole number of a ``{"<field>": N}`` body."""
    body = parse_json_object(raw, f'{{"{field}": N}}')
    unknown = sorted(set(body) - {field})
    if unknown:
        raise ApiError(422, "InvalidRequest", f'{unknown[0]}: unknown field (the body is {{"{field}": N}})')
    value = body.get(field)
    if value is None:
        raise ApiError(422, "InvalidRequest", f"{field}: field required ({meaning})")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, "MalformedRequest", f"{field}: must be a whole number (got {value!r})")
    return value


async def scale_spu_group(request: web.Request) -> web.Response:
    """Set a group's replica count; the SPU-group controller creates or deletes its SPUs."""
    context = request.app[CONTEXT]
    name = request.match_info["name"]
    replicas = _integer_body(await request.read(), "replicas", "the number of SPUs the group should have")

    def scale(current: models.ClusterObject) -> models.ClusterObject:
        try:
            spec = models.SpuGroupSpec.model_validate({**current.spec.model_dump(), "replicas": replicas})  # type: ignore[attr-defined]
        except pydantic.ValidationError as error:
            raise ApiError(422, "InvalidRequest", models.describe_validation_error(error)) from None
        return current.model_copy(update={"spec": spec})

    scaled, _ = await _update_spec(context, "spu-groups", name, scale, "scaling it")
    # No verdict to wait for: a group that stays Reserved gets no new status write.
    return web.json_response(scaled.to_json_dict(), status=202)


async def delete_object(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    name = request.match_info["name"]
    key = models.object_key(kind, name)
    for _ in range(CAS_ATTEMPTS):
        stored = await context.kv_store.get(key)
        if stored is None:
            raise ApiError(404, "NotFound", f"{_label(kind, name)} not found")
        obj = _decoded(kind, stored)
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
            raise ApiError(404, "NotFound", f"{_label(kind, name)} not found") from None
        deleted = obj.to_json_dict() if obj is not None else {"name": name}
        return web.json_response({"deleted": deleted, "warnings": warnings})
    raise ApiError(409, "Conflict", f"{_label(kind, name)} kept changing while deleting it ({CAS_ATTEMPTS} attempts); retry")


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
        key=_sort_key("partitions"),
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


# ---------------------------------------------------------------------------- placement


async def compute_placement(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = parse_json_object(await request.read(), "(a placement request, as for `sc placement compute`)")
    live_spus = None
    if "spus" not in body:
        _require_synced(context)
        snapshot = context.local_store.snapshot()
        live_spus = [spu for spu in topic_controller.spu_infos(snapshot) if spu.online]
    try:
        placement_request = placement.request_from_json(body, default_spus=live_spus)
        _check_placement_size(placement_request)
        result = placement.compute(placement_request)
    except placement.PlacementError as error:
        raise ApiError(422, error.code, error.message) from None
    return web.json_response(placement.result_to_json(result, placement_request.spus))


def _check_placement_size(placement_request: placement.PlacementRequest) -> None:
    """The topic limits apply here too: one request must not make the loop build a huge map."""
    for field, value, limit in (
        ("partitions", placement_request.partitions, models.MAX_PARTITIONS),
        ("replicationFactor", placement_request.replication_factor, models.MAX_REPLICATION_FACTOR),
    ):
        if value > limit:
            raise placement.InvalidConfig(f"{field} must be at most {limit}, got {value}")


# ---------------------------------------------------------------------------- watch


def _event_line(event_type: str, revision: int, obj: models.ClusterObject | None) -> bytes:
    encoded = b"null" if obj is None else models.encode(obj)
    return b'{"type":"%s","revision":%d,"object":%s}' % (event_type.encode(), revision, encoded)


def watch_events(
    changes: local.Changes,
    known: dict[str, local.Entry],
    revision: int,
    keep: Callable[[models.ClusterObject], bool] | None,
) -> list[bytes]:
    """The events that bring a client that saw ``known`` up to date; updates ``known``.

    Level-based: intermediate states a slow client did not read are coalesced into the
    latest one, so nothing queues up in the daemon for it.
    """
    lines = []
    if changes.full:
        fresh = {entry.name: entry for entry in changes.updated if keep is None or keep(entry.obj)}
        for name in [name for name in known if name not in fresh]:
            lines.append(_event_line("DELETED", revision, known.pop(name).obj))
        updated: Iterable[local.Entry] = fresh.values()
    else:
        updated = (entry for entry in changes.updated if keep is None or keep(entry.obj))
    for entry in updated:
        previous = known.get(entry.name)
        if previous is None:
            lines.append(_event_line("ADDED", entry.mod_revision, entry.obj))
        elif previous.obj is not entry.obj and previous.obj != entry.obj:
            lines.append(_event_line("MODIFIED", entry.mod_revision, entry.obj))
        known[entry.name] = entry
    for name in changes.deleted:
        gone = known.pop(name, None)
        if gone is not None:
            lines.append(_event_line("DELETED", revision, gone.obj))
    return lines


class _LinesSink:
    """A chunked HTTP response of JSON lines."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request = request
        self.response = response

    async def send(self, lines: list[bytes]) -> None:
        for start in range(0, len(lines), WATCH_BATCH):
            await self.response.write(b"\n".join(lines[start : start + WATCH_BATCH]) + b"\n")

    async def until_gone(self) -> None:
        # aiohttp does not cancel a handler whose client left; look at the transport instead.
        while True:
            transport = self.request.transport
            if transport is None or transport.is_closing():
                return
            await asyncio.sleep(WATCH_DISCONNECT_POLL_SECONDS)

    async def finish(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.response.write_eof()


class _WebSocketSink:
    """One WebSocket text message per event."""

    def __init__(self, websocket: web.WebSocketResponse) -> None:
        self.response = websocket

    async def send(self, lines: list[bytes]) -> None:
        for line in lines:
            await self.response.send_str(line.decode())

    async def until_gone(self) -> None:
        async for _ in self.response:
            pass  # the client has nothing to say; this loop only notices it closing

    async def finish(self) -> None:
        await self.response.close()


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def watch(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    kind = _kind(request)
    keep = _topic_filter(request, kind)
    _require_synced(context)
    websocket = web.WebSocketResponse(heartbeat=30.0)
    sink: _LinesSink | _WebSocketSink
    if websocket.can_prepare(request).ok:
        await websocket.prepare(request)
        sink = _WebSocketSink(websocket)
    else:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        sink = _LinesSink(request, response)
    try:
        await _stream(context.local_store[kind], keep, sink, request.app[STOPPING])
    finally:
        await sink.finish()
    return sink.response


async def _stream(
    table: local.KindStore,
    keep: Callable[[models.ClusterObject], bool] | None,
    sink: _LinesSink | _WebSocketSink,
    stopping: asyncio.Event,
) -> None:
    listener = table.listener(local.Part.ALL)
    stopped = asyncio.ensure_future(stopping.wait())
    gone = asyncio.ensure_future(sink.until_gone())
    known: dict[str, local.Entry] = {}
    first = True
    try:
        while True:
            changes = listener.changes()
            lines = watch_events(changes, known, table.revision, keep)
            if first:
                lines.append(_event_line("SYNC", table.revision, None))
                first = False
            if lines:
                try:
                    async with asyncio.timeout(WATCH_STALL_SECONDS):
                        await sink.send(lines)
                except (ConnectionError, TimeoutError):
                    return
            changed = asyncio.ensure_future(listener.wait())
            try:
                await asyncio.wait((changed, stopped, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _cancel(changed)
            if stopped.done() or gone.done():
                return
    finally:
        listener.close()
        await _cancel(stopped, gone)


# ---------------------------------------------------------------------------- the application


def build_app(context: context_module.Context) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = context
    app[STOPPING] = asyncio.Event()
    app[TOPIC_WAITS] = Settlements(context.local_store["topics"])
    app[GROUP_WAITS] = Settlements(context.local_store["spu-groups"])
    app.cleanup_ctx.append(_settlements)
    app.on_shutdown.append(_stop_streams)
    routes = app.router
    routes.add_get("/healthz", healthz)
    routes.add_get("/metrics", metrics)
    routes.add_get("/openapi.json", openapi_document)
    # Before /v1/{kind}/{name}, which would otherwise take /v1/watch/topics.
    routes.add_get("/v1/watch/{kind}", watch)
    routes.add_post("/v1/placement", compute_placement)
    routes.add_post("/v1/spus", register_spu)
    routes.add_post("/v1/spu-groups", create_spu_group)
    routes.add_post("/v1/spu-groups/{name}/scale", scale_spu_group)
    routes.add_post("/v1/topics", create_topic)
    routes.add_post("/v1/topics/{name}/partitions", add_partitions)
    routes.add_get("/v1/{kind}", list_objects)
    routes.add_get("/v1/{kind}/{name}", get_object)
    routes.add_delete("/v1/{kind}/{name}", delete_object)
    return app


async def _settlements(app: web.Application) -> Any:
    tasks = [
        asyncio.create_task(app[TOPIC_WAITS].run(), name="api-topic-settlements"),
        asyncio.create_task(app[GROUP_WAITS].run(), name="api-group-settlements"),
    ]
    yield
    await _cancel(*tasks)


async def _stop_streams(app: web.Application) -> None:
    app[STOPPING].set()
