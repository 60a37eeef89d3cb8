"""The public HTTP API on port 9003 (API.md): reads from the local store, user spec writes to the KV store.

Never writes a status (a new object carries the default one), never writes the local store, and
answers bad input with 400/404/409/422, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import aiohttp.web_protocol
import pydantic
import structlog
from aiohttp import web
from prometheus_client import exposition as prometheus_exposition

from connection_manager import ratelimit, transport
from controller import admin_ops, context as context_module, openapi, partition, placement, topic as topic_controller
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
# A drain answers once no leadership has moved for this long (the rest cannot move).
DRAIN_STALL_SECONDS = 3.0
# Bodies may carry large manual replica assignments.
MAX_BODY_BYTES = 16 * 1024 * 1024

CONTEXT = web.AppKey("context", context_module.Context)
STOPPING = web.AppKey("stopping", asyncio.Event)

# pydantic error types that mean "the JSON value has the wrong type" (400) rather than
# "the value is of the right type but not acceptable" (422).
_TYPE_ERRORS = ("json_invalid", "json_type")


# ---------------------------------------------------------------------------- errors


# Raised by the shared admin operations too; the names stay importable from here.
ApiError = admin_ops.ApiError
CAS_ATTEMPTS = admin_ops.CAS_ATTEMPTS


class ClientGone(Exception):
    """The client closed its connection in the middle of its request: nobody is left to answer."""


def error_response(status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}, **extra}, status=status)


def _http_error(error: web.HTTPException, request: web.Request) -> web.Response:
    if isinstance(error, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(error.allowed_methods))
        return error_response(
            405, "MethodNotAllowed", f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
        )
    if isinstance(error, web.HTTPNotFound):
        return error_response(
            404, "NotFound", f"no route for {request.method} {_clipped(request.path)}; see /openapi.json"
        )
    if isinstance(error, web.HTTPRequestEntityTooLarge):
        return error_response(
            413, "RequestTooLarge", f"the request body is larger than {MAX_BODY_BYTES} bytes"
        )
    return error_response(error.status, error.reason.replace(" ", ""), _clipped(error.text or error.reason))


def _clipped(text: str) -> str:
    """``text`` as it is when short and printable, else a short escaped excerpt (it may be a client's)."""
    return text if len(text) <= ratelimit.EXCERPT_BYTES and text.isprintable() else ratelimit.excerpt(text)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure answers in the error shape; only a bug gives a 500, logged with a request id."""
    request_id = secrets.token_hex(6)
    try:
        response = await handler(request)
    except ApiError as error:
        response = error_response(error.status, error.code, error.message, **error.extra)
        if error.status in (408, 413):
            response.force_close()  # the rest of its body is not read
    except ClientGone:
        response = error_response(400, "ClientClosedRequest", "the client closed its connection mid-request")
        response.force_close()
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


async def read_body(request: web.Request) -> bytes:
    """The request's body. Refused (413) before a byte is read when its Content-Length is above
    MAX_BODY_BYTES, and cut there when it has none; a body over 64 KiB first waits for room in the
    port's buffered bytes (503 after the body timeout). A pause longer than the body timeout, or a
    body slower than transport.MIN_BODY_BYTES_PER_SECOND on average, gets a 408. A client that
    leaves midway raises ClientGone, the bytes received let go at once: nothing the failure leaves
    behind (an exception, its traceback) holds them until a collection."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise ApiError(
            413, "RequestTooLarge", f"the request body is {length} bytes (Content-Length); the limit is {MAX_BODY_BYTES} bytes"
        )
    guard = transport.guard_of(request.transport)
    pause = request.app[CONTEXT].settings.client_body_timeout
    size = MAX_BODY_BYTES if length is None else length
    loop = asyncio.get_running_loop()
    body = bytearray()
    received = 0
    deadline = math.inf
    try:
        async with contextlib.AsyncExitStack() as holding:
            if guard is not None:
                await _hold(holding, guard.port.budget, size, pause)
            # A declared length is allocated at once: no growing buffer leaves copies behind.
            body = bytearray(length or 0)
            deadline = loop.time() + transport.whole_body_seconds(pause, size)
            while True:
                async with asyncio.timeout_at(min(loop.time() + pause, deadline)):
                    chunk = await request.content.readany()
                if not chunk:
                    return bytes(body)
                end = received + len(chunk)
                if end > MAX_BODY_BYTES:
                    raise ApiError(413, "RequestTooLarge", f"the request body is larger than {MAX_BODY_BYTES} bytes")
                if length is None:
                    body += chunk
                else:
                    body[received:end] = chunk  # aiohttp stops at the declared length
                received = end
    except TimeoutError:
        if guard is not None:
            guard.port.refuse(transport.BODY_TIMEOUT, seconds=pause)
        slow = (
            f"took longer than {transport.whole_body_seconds(pause, size):g} s for its {size} bytes"
            if loop.time() >= deadline
            else f"paused for {pause:g} s (client_body_timeout)"
        )
        raise ApiError(
            408, "RequestTimeout", f"the request body {slow} after {received} bytes; send it without pausing"
        ) from None
    except (ConnectionError, aiohttp.web_protocol.RequestPayloadError) as error:
        body.clear()
        error.__traceback__ = None
        if isinstance(error, aiohttp.web_protocol.RequestPayloadError):
            raise ApiError(400, "MalformedRequest", f"the request body could not be read: {ratelimit.excerpt(str(error))}") from None
        if guard is not None:
            guard.port.abandoned(received)
        raise ClientGone() from None
    finally:
        body.clear()


async def _hold(holding: contextlib.AsyncExitStack, budget: transport.Budget, size: int, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            await holding.enter_async_context(budget.hold(size))
    except TimeoutError:
        raise ApiError(
            503,
            "Busy",
            f"the SC is receiving {budget.held} bytes of request bodies (max_buffered_request_bytes is "
            f"{budget.capacity}); retry shortly",
        ) from None


def _kind(request: web.Request) -> str:
    kind = request.match_info["kind"]
    if kind not in models.KINDS:
        raise ApiError(404, "NotFound", f"unknown kind {ratelimit.excerpt(kind)}: use one of {', '.join(models.KINDS)}")
    return kind


def _int_param(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit():
        raise ApiError(400, "MalformedRequest", f"query parameter {name} must be a whole number, got {ratelimit.excerpt(raw)}")
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
    raise ApiError(400, "MalformedRequest", f"query parameter {name} must be true or false, got {ratelimit.excerpt(raw)}")


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


TOPIC_WAITS = web.AppKey("topic_waits", admin_ops.Settlements)
GROUP_WAITS = web.AppKey("group_waits", admin_ops.Settlements)


# ---------------------------------------------------------------------------- handlers: health, metrics, docs


async def healthz(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    failing = context.supervisor.failing()
    if failing:
        reason = "; ".join(task.describe() for task in failing)
        return web.json_response({"status": "failing", "reason": reason}, status=503)
    if context.synced.is_set():
        problem = context.active.problem() if context.active is not None else None
        if problem is not None:
            return web.json_response({"status": "inactive", "reason": f"this SC may not write: {problem}"}, status=503)
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
    admin_ops.require_synced(context)
    objects = [_shown(context, obj) for obj in context.local_store[kind].objects() if keep is None or keep(obj)]
    objects.sort(key=_sort_key(kind))
    # Each object is serialised by pydantic's own encoder: lists of 100,000 partitions stay cheap.
    body = b"[" + b",".join(models.encode(obj) for obj in objects) + b"]"
    return web.Response(body=body, content_type="application/json")


async def get_object(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    name = request.match_info["name"]
    admin_ops.require_synced(context)
    entry = context.local_store[kind].get(name)
    if entry is None:
        raise ApiError(404, "NotFound", f"{admin_ops.label(kind, name)} not found")
    return web.Response(body=models.encode(_shown(context, entry.obj)), content_type="application/json")


def _shown(context: context_module.Context, obj: models.ClusterObject) -> models.ClusterObject:
    """Partitions carry their leader's latest offsets, which live in memory, not in the KV store."""
    if obj.kind != "partitions" or context.connections is None:
        return obj
    live = context.connections.live
    return partition.with_live_offsets(obj, live.get(obj.name), live.max_hw(obj.name))  # type: ignore[arg-type]


async def drain_spu(request: web.Request) -> web.Response:
    """Controlled shutdown: record the intent to drain an SPU (spec.drain), refusing up front a
    drain that cannot finish; then wait until its leaderships have moved, and say which did."""
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    force = _bool_param(request, "force")
    admin_ops.require_synced(context)
    name = request.match_info["name"]
    entry = context.local_store["spus"].get(name)
    if entry is None:
        raise ApiError(404, "NotFound", f"{admin_ops.label('spus', name)} not found")
    if context.connections is None:
        raise ApiError(409, "Unavailable", "this SC runs without a connection manager: there is nothing to drain")
    spu: models.Spu = entry.obj  # type: ignore[assignment]
    spu_id = spu.spec.id
    snapshot = context.local_store.snapshot()
    leading_before = partition.led_by(snapshot, spu_id)
    blocked = partition.drain_blockers(snapshot, spu_id, _cluster_view(context))
    if not spu.spec.drain:
        if blocked and not force:
            raise ApiError(
                409,
                "DrainRefused",
                f"SPU {spu_id} ({name!r}) was not drained, nothing was changed: {len(blocked)} of the "
                f"{len(leading_before)} partition(s) it leads could not get another leader now: "
                f"{partition.describe_blockers(blocked)}. Bring a follower online or in sync (or undrain "
                "the other SPU) first, or drain with force=true (`sc spu drain --force`) to move the others and keep these",
                spu=spu_id,
                name=name,
                blocked=_blocked_json(blocked),
            )
        await admin_ops.set_drain(context, name, True)
        log.info("draining SPU", spu=spu_id, name=name, leading=len(leading_before), forced_past=sorted(blocked))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    previous: list[str] = []
    progress_at = loop.time()
    while True:
        led = partition.led_by(context.local_store.snapshot(), spu_id)
        if led != previous:
            previous, progress_at = led, loop.time()
        # Done once what is left is what could not move from the start, or nothing has moved
        # for a while (what is left has no other replica that may lead now).
        if set(led) <= blocked.keys() or loop.time() >= deadline or loop.time() - progress_at >= DRAIN_STALL_SECONDS:
            break
        await asyncio.sleep(0.05)
    snapshot = context.local_store.snapshot()
    partitions = snapshot.entries("partitions")
    # Moved: led by another SPU now (not deleted meanwhile, nor left leaderless by a crash).
    new_leaders = {
        name_before: partitions[name_before].obj.spec.leader  # type: ignore[attr-defined]
        for name_before in leading_before
        if name_before not in led and name_before in partitions
    }
    moved = [{"partition": name_before, "to": leader} for name_before, leader in new_leaders.items() if leader != spu_id]
    body: dict[str, Any] = {"spu": spu_id, "name": name, "draining": True, "drained": not led, "moved": moved, "leading": led}
    if not led:
        return web.json_response(body)
    # Still draining (the operator's intent stays recorded): say what keeps each one.
    stuck = partition.drain_blockers(snapshot, spu_id, _cluster_view(context))
    body["blocked"] = _blocked_json(
        {name_left: stuck.get(name_left, "not moved yet: it has a follower that may lead; the drain goes on") for name_left in led}
    )
    return web.json_response(body, status=202)


async def undrain_spu(request: web.Request) -> web.Response:
    """Cancel a drain: the SPU may lead again (preferred leaderships return to it once in sync)."""
    context = request.app[CONTEXT]
    name = request.match_info["name"]
    spu = await admin_ops.set_drain(context, name, False)
    log.info("drain cancelled", spu=spu.spec.id, name=name)
    return web.json_response({"spu": spu.spec.id, "name": name, "draining": False})


def _cluster_view(context: context_module.Context) -> partition.ClusterView:
    assert context.connections is not None
    connections = context.connections
    return partition.ClusterView(
        health=connections.health.snapshot(),
        live=connections.live.view,
        unclean_election=context.settings.unclean_leader_election,
        incarnations=connections.incarnations,
        confirmed=connections.confirmed,
        max_hw=connections.live.max_hws,
    )


def _blocked_json(blocked: dict[str, str]) -> list[dict[str, str]]:
    return [{"partition": name, "reason": reason} for name, reason in blocked.items()]


# ---------------------------------------------------------------------------- handlers: writes


async def register_spu(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    spu: models.Spu = parse_object("spus", await read_body(request))  # type: ignore[assignment]
    await admin_ops.register_spu(context, spu)
    return web.json_response(spu.to_json_dict(), status=201)


async def create_spu_group(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    group: models.SpuGroup = parse_object("spu-groups", await read_body(request))  # type: ignore[assignment]
    with _budget(timeout_ms) as remaining_ms:
        revision = await admin_ops.create(context, group)
    current, settled = await admin_ops.wait_settled(
        request.app[GROUP_WAITS], group, revision, admin_ops.group_settled(revision), remaining_ms()
    )
    if current is None:
        raise ApiError(409, "Conflict", f"{admin_ops.label('spu-groups', group.name)} was deleted while it was being created")
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
    topic: models.Topic = parse_object("topics", await read_body(request))  # type: ignore[assignment]
    if dry_run:
        result, spus = admin_ops.dry_run_topic(context, topic)
        return web.json_response(placement.result_to_json(result, spus))
    with _budget(timeout_ms) as remaining_ms:
        revision = await admin_ops.create_topic(context, topic)
    return await _topic_answer(request, topic, revision, remaining_ms(), created=True)


@contextlib.contextmanager
def _budget(timeout_ms: int) -> Iterator[Callable[[], int]]:
    """The request's ``?timeout=`` as the budget of its writes to the store (an etcd leader change
    or restart shorter than it costs time, not a failed request); yields what is left of it in ms,
    for the wait for the controllers' verdict (0 stays 0: answer at once)."""
    deadline = asyncio.get_running_loop().time() + timeout_ms / 1000

    def remaining_ms() -> int:
        if timeout_ms == 0:
            return 0
        return max(1, int((deadline - asyncio.get_running_loop().time()) * 1000))

    with kv.budget(timeout_ms / 1000):
        yield remaining_ms


async def _topic_answer(
    request: web.Request, written: models.Topic, revision: int, timeout_ms: int, created: bool
) -> web.Response:
    current, settled = await admin_ops.wait_settled(
        request.app[TOPIC_WAITS], written, revision, admin_ops.topic_settled(revision), timeout_ms
    )
    if current is None:
        raise ApiError(409, "Conflict", f"{admin_ops.label('topics', written.name)} was deleted while waiting for it")
    status: models.TopicStatus = current.status  # type: ignore[attr-defined]
    if settled and status.resolution is models.TopicResolution.INVALID_CONFIG:
        raise ApiError(
            422, "InvalidConfig", admin_ops.invalid_topic(written.name, status.reason), object=current.to_json_dict()
        )
    done = settled and status.resolution is models.TopicResolution.PROVISIONED
    return web.json_response(current.to_json_dict(), status=(201 if created else 200) if done else 202)


async def add_partitions(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    name = request.match_info["name"]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    count = _integer_body(await read_body(request), "count", "the number of partitions to add")
    with _budget(timeout_ms) as remaining_ms:
        grown, revision = await admin_ops.add_partitions(context, name, count)
    return await _topic_answer(request, grown, revision, remaining_ms(), created=False)


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
    replicas = _integer_body(await read_body(request), "replicas", "the number of SPUs the group should have")

    def scale(current: models.ClusterObject) -> models.ClusterObject:
        try:
            spec = models.SpuGroupSpec.model_validate({**current.spec.model_dump(), "replicas": replicas})  # type: ignore[attr-defined]
        except pydantic.ValidationError as error:
            raise ApiError(422, "InvalidRequest", models.describe_validation_error(error)) from None
        return current.model_copy(update={"spec": spec})

    scaled, _ = await admin_ops.update_spec(context, "spu-groups", name, scale, "scaling it")
    # As explicit as deleting an SPU: name the SPUs this deletes that partitions still use.
    warnings = admin_ops.group_shrink_warnings(
        context, name, replicas, f"scaling SPU group {name!r} down to {replicas} deletes"
    )
    # No verdict to wait for: a group that stays Reserved gets no new status write.
    return web.json_response({**scaled.to_json_dict(), "warnings": warnings}, status=202)


async def set_spu_rack(request: web.Request) -> web.Response:
    """Give an SPU a rack, or take it away (``{"rack": null}``); compare-and-swap on its spec."""
    context = request.app[CONTEXT]
    body = parse_json_object(await read_body(request), '{"rack": R}')
    unknown = sorted(set(body) - {"rack"})
    if unknown:
        raise ApiError(422, "InvalidRequest", f'{unknown[0]}: unknown field (the body is {{"rack": R}})')
    if "rack" not in body:
        raise ApiError(422, "InvalidRequest", "rack: field required (the SPU's rack, or null for none)")
    rack = body["rack"]
    if rack is not None and not isinstance(rack, str):
        raise ApiError(400, "MalformedRequest", f"rack: must be a string, or null for no rack (got {rack!r})")
    spu = await admin_ops.set_spu_rack(context, request.match_info["name"], rack)
    return web.json_response(spu.to_json_dict())


async def delete_object(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    name = request.match_info["name"]
    obj, warnings = await admin_ops.delete(context, kind, name)
    deleted = obj.to_json_dict() if obj is not None else {"name": name}
    return web.json_response({"deleted": deleted, "warnings": warnings})


# ---------------------------------------------------------------------------- placement


async def compute_placement(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = parse_json_object(await read_body(request), "(a placement request, as for `sc placement compute`)")
    live_spus = None
    if "spus" not in body:
        admin_ops.require_synced(context)
        snapshot = context.local_store.snapshot()
        live_spus = [spu for spu in topic_controller.spu_infos(snapshot) if spu.online]
    try:
        placement_request = placement.request_from_json(body, default_spus=live_spus)
        _check_placement_size(placement_request)
        result = placement.compute(placement_request, context.placers)
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
    admin_ops.require_synced(context)
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
    app = web.Application(middlewares=[transport.middleware, error_middleware], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = context
    app[STOPPING] = asyncio.Event()
    app[TOPIC_WAITS] = admin_ops.Settlements(context.local_store["topics"])
    app[GROUP_WAITS] = admin_ops.Settlements(context.local_store["spu-groups"])
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
    routes.add_post("/v1/spus/{name}/drain", drain_spu)
    routes.add_post("/v1/spus/{name}/rack", set_spu_rack)
    routes.add_delete("/v1/spus/{name}/drain", undrain_spu)
    routes.add_post("/v1/spu-groups", create_spu_group)
    routes.add_post("/v1/spu-groups/{name}/scale", scale_spu_group)
    routes.add_post("/v1/topics", create_topic)
    routes.add_post("/v1/topics/{name}/partitions", add_partitions)
    routes.add_get("/v1/{kind}", list_objects)
    routes.add_get("/v1/{kind}/{name}", get_object)
    routes.add_delete("/v1/{kind}/{name}", delete_object)
    return app


async def _settlements(app: web.Application) -> Any:
    # Each run starts with a fresh listener, whose first changes wake every waiter to look again.
    spawn = app[CONTEXT].supervisor.spawn
    tasks = [
        spawn("api-topic-settlements", app[TOPIC_WAITS].run),
        spawn("api-group-settlements", app[GROUP_WAITS].run),
    ]
    yield
    await _cancel(*tasks)


async def _stop_streams(app: web.Application) -> None:
    app[STOPPING].set()
