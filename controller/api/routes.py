"""The public HTTP API on port 9003 (API.md): reads from the local store, user spec writes to the KV store.

Never writes a status (a new object carries the default one), never writes the local store, and
answers bad input with 400/404/409/422, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web_protocol
import pydantic
import structlog
from aiohttp import hdrs, web
from prometheus_client import exposition as prometheus_exposition

from connection_manager import ratelimit, tls, transport
from controller import context as context_module
from controller.api import admin_ops, admission, auth, cluster, credentials, fanout, json_input, listing, openapi, placement_answer, rebalance_ops
from controller.reconcile import partition, topic as topic_controller
from store import active_sc, attribution, kv, models
from store import supervisor as supervisor_module

log = structlog.get_logger(__name__)

DEFAULT_WAIT_MS = 30_000
# A create never holds a connection longer than this, whatever ?timeout= asks for.
MAX_WAIT_MS = 600_000
# How often an idle JSON-lines watch checks that its client is still connected.
WATCH_DISCONNECT_POLL_SECONDS = 1.0
# The largest message a watch WebSocket takes from its client, which has nothing to say (a
# message is kept whole until its last byte: aiohttp's default, 4 MiB, per watcher).
WATCH_MAX_CLIENT_MESSAGE_BYTES = 1024
# A large answer is written in pieces of this size, each waiting for the client to take the previous
# ones: a client that reads slowly holds one piece in the SC's memory, not a copy of the answer.
WRITE_CHUNK = 64 * 1024
# A drain answers once no leadership has moved for this long (the rest cannot move).
DRAIN_STALL_SECONDS = 3.0
# Bodies may carry large manual replica assignments.
MAX_BODY_BYTES = 16 * 1024 * 1024
# What JSON skips between tokens: a body's bytes besides these are at most what its topic stores.
_JSON_WHITESPACE = (b" ", b"\n", b"\r", b"\t")
# The body of a route that takes a few fields (an SPU, a group, a count, a rack, a move limit):
# parsing 16 MiB of JSON is seconds on the event loop before a field is looked at.
MAX_SMALL_BODY_BYTES = 64 * 1024
# An error message names the values it refuses, each cut where the message is written; this bounds
# what any refusal sends back (kept whole until the client takes it) whatever it quotes. Above the
# longest message of ours: ten validation problems, each with its field and value shortened.
MAX_ERROR_MESSAGE_CHARS = 8192
# Kept from a message's end when it is cut: messages end with the limit or the way out.
ERROR_MESSAGE_TAIL_CHARS = 1024

CONTEXT = web.AppKey("context", context_module.Context)
STOPPING = web.AppKey("stopping", asyncio.Event)
FEEDS = web.AppKey("feeds", fanout.Feeds)
# The principal of the request being handled, and the credential it presented (set by auth_middleware).
PRINCIPAL = web.RequestKey("principal", auth.Principal)
PRESENTED = web.RequestKey("presented", auth.Presented)

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
    return web.json_response({"error": {"code": code, "message": _bounded(message)}, **extra}, status=status)


def _bounded(message: str) -> str:
    """``message``, or its start and end around how much was left out when it is longer than
    MAX_ERROR_MESSAGE_CHARS (a value it quotes whole: a megabyte key, a long list)."""
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    head = MAX_ERROR_MESSAGE_CHARS - ERROR_MESSAGE_TAIL_CHARS - 64  # room for the note
    left_out = len(message) - head - ERROR_MESSAGE_TAIL_CHARS
    return f"{message[:head]} ... ({left_out} characters left out) ... {message[-ERROR_MESSAGE_TAIL_CHARS:]}"


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
    except admission.Busy as busy:
        response = error_response(429, "TooManyRequests", busy.message)
        response.headers["Retry-After"] = str(busy.retry_after)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = _http_error(error, request)
    except kv.NoSpace as error:
        # Not "retry shortly": it lasts until an operator frees space, as the message says.
        response = error_response(503, "Unavailable", f"the KV store refuses writes: {error}")
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


@web.middleware
async def auth_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Who is asking (a bearer token, else a client certificate), whether they may, and the writes
    made for them attributed to them in the history (401, 403 in the error shape otherwise)."""
    authenticator = request.app[CONTEXT].authenticator
    right = auth.http_right(request.method, request.path, request.query.get("dryRun", "false").lower() in ("true", "1", ""))
    if right is None:
        return await handler(request)
    websocket = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
    refusal = auth.cross_site_refusal(
        request.method, websocket, request.headers.get(hdrs.ORIGIN), request.headers.get("Sec-Fetch-Site"), request.host
    )
    # Only while the port listens on loopback for want of credentials: an operator who serves it
    # unauthenticated on purpose (behind a proxy, whose Host is its own) chose whom it trusts.
    if refusal is None and not authenticator.enabled and not request.app[CONTEXT].settings.public_bind_without_auth:
        refusal = auth.anonymous_host_refusal(request.headers.get(hdrs.HOST))
    if refusal is not None:
        return error_response(403, "Forbidden", refusal)
    common_name, _ = tls.peer_names(tls.peercert_of(request.transport))
    try:
        authorization = request.headers.get("Authorization")
        protocols = request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL)
        if protocols is not None and request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
            authorization = authorization or auth.websocket_authorization(protocols)
            # The handshake logs the subprotocols it does not know: the token must not be among them.
            headers = request.headers.copy()
            del headers[hdrs.SEC_WEBSOCKET_PROTOCOL]
            if kept := auth.without_websocket_token(protocols):
                headers[hdrs.SEC_WEBSOCKET_PROTOCOL] = kept
            request = request.clone(headers=headers)
        principal = authenticator.authenticate(authorization, common_name, request.remote)
        # Creating a topic names it in the body: create_topic checks a per-prefix admin there.
        if not (principal.grant.topic_prefix is not None and request.method == "POST" and request.path == "/v1/topics"):
            auth.check(principal, right)
    except auth.Unauthenticated as error:
        response = error_response(401, "Unauthenticated", str(error))
        response.headers["WWW-Authenticate"] = 'Bearer realm="sc"'
        return response
    except auth.Forbidden as error:
        return error_response(403, "Forbidden", str(error))
    request[PRINCIPAL] = principal
    request[PRESENTED] = auth.Presented(authorization, common_name, request.remote)
    with attribution.acting(attribution.Actor(principal.name, request.remote)):
        return await handler(request)


@web.middleware
async def standby_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A standby SC applies no write: it answers each with 307 to the same path and query on the
    leader (a client sends it again there, method, body and credentials unchanged), or 503 when no
    SC leads the store right now. Reads (dry runs too) are served from its mirror."""
    context = request.app[CONTEXT]
    active = context.active
    if active is None or active.state is active_sc.State.ACTIVE:
        return await handler(request)
    dry_run = request.query.get("dryRun", "false").lower() in ("true", "1", "")
    right = auth.http_right(request.method, request.path, dry_run)
    if right is None or right.role != auth.ADMIN:
        return await handler(request)
    leader = cluster.leader_of(context)
    identity = active.identity
    # A claim of this very address is this SC's own or an earlier process's here (gone: this one
    # holds its port): sending the client back here would loop.
    if leader is None or (identity is not None and (leader.host, leader.address) == (identity.host, identity.address)):
        raise ApiError(
            503, "NoLeader",
            "this SC is a standby and no live SC leads its store right now (the claim is being taken over, or "
            f"is an earlier process's at this address); retry in a few seconds (the claim's lease lasts {active.ttl} s)",
        )  # fmt: skip
    location = f"{request.scheme}://{leader.address}{request.rel_url}"
    response = error_response(
        307, "NotLeader", f"this SC is a standby: send writes to the leader, SC {leader.id} at {leader.address}",
        leader={"id": leader.id, "address": leader.address},
    )  # fmt: skip
    response.headers["Location"] = location
    return response


def _check_topic_right(request: web.Request, topic_name: str) -> None:
    principal: auth.Principal | None = request.get(PRINCIPAL)
    if principal is not None:
        try:
            auth.check(principal, auth.Right(auth.ADMIN, topic_name))
        except auth.Forbidden as error:
            raise ApiError(403, "Forbidden", str(error)) from None


# ---------------------------------------------------------------------------- request parsing


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES, why: str = "") -> bytes:
    """The request's body. Refused (413) before a byte is read when its Content-Length is above
    ``limit``, and cut there when it has none (``why`` follows the limit in the message); a body
    over 64 KiB first waits for room in the
    port's buffered bytes (503 after the body timeout). A pause longer than the body timeout, or a
    body slower than transport.MIN_BODY_BYTES_PER_SECOND on average, gets a 408. A client that
    leaves midway raises ClientGone, the bytes received let go at once: nothing the failure leaves
    behind (an exception, its traceback) holds them until a collection. A compressed body
    (Content-Encoding) is read decompressed: its Content-Length does not say how large it grows, so
    it is counted as a body without one."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise ApiError(
            413, "RequestTooLarge", f"the request body is {declared} bytes (Content-Length); the limit is {limit} bytes{why}"
        )
    length = declared if request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower() == "identity" else None
    guard = transport.guard_of(request.transport)
    pause = request.app[CONTEXT].settings.client_body_timeout
    size = limit if length is None else length
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
                if end > limit:
                    raise ApiError(413, "RequestTooLarge", f"the request body is larger than {limit} bytes{why}")
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
    """A whole number from 0 to ``maximum``; anything else is malformed (400, as API.md says)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit():
        raise ApiError(400, "MalformedRequest", f"query parameter {name} must be a whole number, got {ratelimit.excerpt(raw)}")
    # Counted before int(), which raises past 4,300 digits (leading zeros included): no longer
    # number is in range anyway.
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        # Only ASCII digits here: shown as they are, cut if long (a message must not echo megabytes).
        shown = raw if len(raw) <= 40 else f"{raw[:20]}... ({len(raw)} characters)"
        raise ApiError(400, "MalformedRequest", f"query parameter {name} is at most {maximum}, got {shown}")
    return int(digits)


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
    try:
        return json_input.load_object(raw, shape)
    except json_input.JsonInputError as error:
        raise ApiError(400, "MalformedRequest", str(error)) from None


Parsed = TypeVar("Parsed", bound=models.Model)
# More digits than json_input takes in an integer.
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (json_input.MAX_INTEGER_DIGITS + 1))


def parse_object(model: type[Parsed], raw: bytes) -> Parsed:
    """A user's new object (``{name, spec}``) from a request body, validated strictly.

    Wrong JSON types give 400, values that are not acceptable 422, both naming field and value.
    A valid body is parsed once, by pydantic-core; only a refused one goes through Python's parser
    too (json_input), whose checks come first and say what is wrong (tests/unit/test_request_parse.py
    holds the two paths to the same answers).
    """
    # A refusal builds the whole input as Python objects, more than once (pydantic's error, Python's
    # parser, the problems listed): without collections meanwhile (json_input.collector_paused).
    with json_input.collector_paused():
        return _parse_object(model, raw)


def _parse_object(model: type[Parsed], raw: bytes) -> Parsed:
    refusal: pydantic.ValidationError | None = None
    try:
        # Strict: "3" is not a partition count and true is not a port. Validating the raw bytes
        # (not a re-serialised copy) keeps pydantic's own limits on deeply nested input.
        parsed = model.model_validate_json(raw, strict=True)
    except pydantic.ValidationError as error:
        # Without its traceback: its frame (this one) holds it, a cycle that kept the whole input
        # (a Python object per JSON value) until a full collection.
        refusal = error.with_traceback(None)
    else:
        # What pydantic-core takes but the checks refuse: a status, and a long integer (under a key
        # given twice, pydantic-core keeps the last value, Python's parser still sees the first).
        # Digits in a string match too: they only take the slow path.
        if "status" not in parsed.model_fields_set and _LONG_DIGITS.search(raw) is None:
            return parsed
    body = parse_json_object(raw, '{"name": ..., "spec": {...}}')
    if "status" in body:
        raise ApiError(
            422, "InvalidObject", "status: is written by the SC, not by users; send only name and spec"
        )
    if refusal is not None:
        raise _validation_error(refusal) from None
    return parsed


def _validation_error(error: pydantic.ValidationError) -> ApiError:
    problems = models.validation_problems(error) or []  # too many to read: InvalidObject
    wrong_type = any(problem["type"].endswith("_type") or problem["type"] in _TYPE_ERRORS for problem in problems)
    message = models.describe_validation_error(error)
    if wrong_type:
        return ApiError(400, "MalformedRequest", message)
    return ApiError(422, "InvalidObject", message)


TOPIC_WAITS = web.AppKey("topic_waits", admin_ops.Waits)
GROUP_WAITS = web.AppKey("group_waits", admin_ops.Waits)
REBALANCE_PROGRESS = web.AppKey("rebalance_progress", rebalance_ops.Progress)


# ---------------------------------------------------------------------------- handlers: health, metrics, docs


async def healthz(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    stopped = context.kv_store.stopped()
    if stopped is not None:
        # Before the tasks: they fail because of it, and restarting them cannot help.
        return web.json_response({"status": "store-stopped", "reason": str(stopped)}, status=503)
    failing = context.supervisor.failing()
    if failing:
        reason = "; ".join(task.describe() for task in failing)
        return web.json_response({"status": "failing", "reason": reason}, status=503)
    active = context.active
    if context.synced.is_set() and active is not None and not active.settled.is_set():
        reason = "this SC is first in line to lead its store and waits for the previous leader's claim to end"
        return web.json_response({"status": "starting", "reason": reason}, status=503)
    if context.synced.is_set():
        # A standby is healthy: it serves reads from its mirror and sends writes to the leader.
        problem = active.problem() if active is not None and active.state is not active_sc.State.STANDBY else None
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


# ---------------------------------------------------------------------------- the live page

UI_DIRECTORY = Path(__file__).parent / "ui"
# Path -> (file in UI_DIRECTORY, its content type). auth.UI_PATHS names the same paths.
UI_FILES = {
    "/ui": ("index.html", "text/html"),
    "/ui/app.js": ("app.js", "text/javascript"),
    "/ui/app.css": ("app.css", "text/css"),
}
# The page runs only its own files and talks only to this SC: what it shows comes from the store,
# which anyone with a write credential may have filled, and is only ever set as text.
UI_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
UI_CACHE = web.AppKey("ui_cache", dict[str, bytes])


async def ui_file(request: web.Request) -> web.Response:
    """The live page's files (shipped in the package, read once): no credential needed, no data in them."""
    file_name, content_type = UI_FILES[request.path]
    cache = request.app[UI_CACHE]
    body = cache.get(file_name)
    if body is None:
        try:
            body = cache[file_name] = await asyncio.to_thread((UI_DIRECTORY / file_name).read_bytes)
        except OSError as error:
            raise ApiError(
                503, "Unavailable", f"the live page's file {file_name} cannot be read ({error.strerror}): reinstall the SC's package"
            ) from None
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=UI_HEADERS)


# ---------------------------------------------------------------------------- handlers: reads


def _topic_name(request: web.Request, kind: str) -> str | None:
    topic_name = request.query.get("topic")
    if topic_name is not None and kind != "partitions":
        raise ApiError(422, "InvalidRequest", f"query parameter topic filters partitions only, not {kind}")
    if topic_name is not None:
        try:
            models.validate_name(topic_name)
        except ValueError as error:
            raise ApiError(400, "MalformedRequest", f"query parameter topic must be a topic name: {error}") from None
    return topic_name


def _limit(request: web.Request) -> int | None:
    if "limit" not in request.query:
        return None
    limit = _int_param(request, "limit", 0, listing.MAX_LIMIT)
    if limit < 1:
        # Not a number in its range: malformed, as API.md says of every query parameter.
        raise ApiError(400, "MalformedRequest", f"query parameter limit is the page size, at least 1, got {limit}")
    return limit


def _after(request: web.Request, kind: str, topic_name: str | None, limit: int | None) -> listing.SortKey | None:
    token = request.query.get("continue")
    if token is None:
        return None
    if limit is None:
        raise ApiError(
            422, "InvalidRequest", "query parameter continue needs limit (the page size): pass ?limit=N&continue=TOKEN"
        )
    try:
        return listing.decode_token(token, kind, topic_name)
    except listing.TokenError as error:
        raise ApiError(
            400, "MalformedRequest", f"query parameter continue: {error}; start the listing again without continue"
        ) from None


async def list_objects(request: web.Request) -> web.StreamResponse:
    """The objects of a kind in list order: all at once (a bare array, shared by identical concurrent
    lists), or with ?limit= one page, whose X-Continue header resumes after its last object."""
    context = request.app[CONTEXT]
    kind = _kind(request)
    topic_name = _topic_name(request, kind)
    limit = _limit(request)
    after = _after(request, kind, topic_name, limit)
    admin_ops.require_synced(context)
    shown = functools.partial(_shown, context)
    if limit is None:
        answer = await context.lists.whole(kind, topic_name, shown, _shown_version(context, kind))
    else:
        answer = await context.lists.page(kind, topic_name, after, limit, shown)
    headers = {"X-Revision": str(answer.revision)}
    if answer.next_after is not None:
        headers["X-Continue"] = listing.encode_token(kind, topic_name, answer.next_after)
    if len(answer.body) <= WRITE_CHUNK:
        return _small_json(answer.body, headers)
    # Writing a large answer is expensive work too, even a shared one: a thousand clients each
    # taking the same 5 MB keep the loop busy with nothing else.
    async with context.gate.slot(admission.LIST):
        return await _send_json(request, answer.body, headers)


def _small_json(body: bytes, headers: dict[str, str]) -> web.Response:
    return web.Response(body=body, content_type="application/json", headers=headers)


async def _send_json(request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """A JSON answer, written in pieces as the client takes them; a client that takes nothing for
    client_stall_seconds is dropped (its connection aborted, not closed politely: that would wait
    for it too)."""
    if len(body) <= WRITE_CHUNK:
        return _small_json(body, headers)
    response = web.StreamResponse(headers=headers)
    response.content_type = "application/json"
    response.content_length = len(body)
    await response.prepare(request)
    stall = request.app[CONTEXT].settings.client_stall_seconds
    view = memoryview(body)
    try:
        for start in range(0, len(body), WRITE_CHUNK):
            async with asyncio.timeout(stall):
                await response.write(view[start : start + WRITE_CHUNK])
        await response.write_eof()
    except TimeoutError:
        log.info("dropping a client that took nothing of an answer", peer=request.remote, seconds=stall)
        _abort(request)
    except ConnectionError:
        pass
    return response


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def get_object(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    kind = _kind(request)
    name = request.match_info["name"]
    admin_ops.require_synced(context)
    entry = context.local_store[kind].get(name)
    if entry is None:
        raise ApiError(404, "NotFound", f"{admin_ops.label(kind, name)} not found")
    return web.Response(body=models.encode(_shown(context, entry.obj)), content_type="application/json")


def _shown(context: context_module.Context, obj: models.AnyObject) -> models.AnyObject:
    """Partitions carry their leader's latest offsets, which live in memory, not in the KV store."""
    if not isinstance(obj, models.Partition) or context.connections is None:
        return obj
    live = context.connections.live
    return partition.with_live_offsets(obj, live.get(obj.name), live.max_hw(obj.name))


def _shown_version(context: context_module.Context, kind: str) -> Hashable:
    """Changes whenever ``_shown`` would show some object of ``kind`` differently."""
    if kind != "partitions" or context.connections is None:
        return 0
    return context.connections.live.reports


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
    spu: models.Spu = entry.obj
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
    led = await admin_ops.wait_led_away(context.local_store, spu_id, blocked.keys(), timeout_ms / 1000, DRAIN_STALL_SECONDS)
    snapshot = context.local_store.snapshot()
    partitions = snapshot.entries("partitions")
    # Moved: led by another SPU now (not deleted meanwhile, nor left leaderless by a crash).
    new_leaders = {
        name_before: partitions[name_before].obj.spec.leader
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


def _optional_body(raw: bytes, shape: str) -> dict[str, Any] | None:
    return parse_json_object(raw, shape) if raw.strip() else None


def _dry_run(request: web.Request) -> bool:
    """``?dryRun=true|false`` exactly (any case): a plan is written unless it says true, so nothing
    else is taken for either (the document's type is boolean)."""
    raw = request.query.get("dryRun")
    if raw is None or raw.lower() == "false":
        return False
    if raw.lower() == "true":
        return True
    raise ApiError(400, "MalformedRequest", f"query parameter dryRun must be true or false, got {ratelimit.excerpt(raw)}")


async def rebalance(request: web.Request) -> web.Response:
    """Plan a rebalance from the cluster as it is; unless ?dryRun=true, store the plan and start it."""
    context = request.app[CONTEXT]
    dry_run = _dry_run(request)
    body = _optional_body(await read_body(request, MAX_SMALL_BODY_BYTES), rebalance_ops.BODY_SHAPE)
    limit = rebalance_ops.max_moves_per_spu(body, context.settings.rebalance_max_moves_per_spu)
    status, answer = await rebalance_ops.rebalance(context, limit, dry_run)
    return web.json_response(answer, status=status)


async def rebalance_progress(request: web.Request) -> web.Response:
    return web.json_response(request.app[REBALANCE_PROGRESS].answer(request.app[CONTEXT]))


async def cancel_rebalance(request: web.Request) -> web.Response:
    return web.json_response(await rebalance_ops.cancel(request.app[CONTEXT]))


async def decommission_spu(request: web.Request) -> web.Response:
    """Move every replica off an SPU (a run like a rebalance's); its status says when it is empty.
    ``?dryRun=true``: the plan only (the read role may ask for it), nothing written."""
    context = request.app[CONTEXT]
    dry_run = _dry_run(request)
    body = _optional_body(await read_body(request, MAX_SMALL_BODY_BYTES), rebalance_ops.BODY_SHAPE)
    limit = rebalance_ops.max_moves_per_spu(body, context.settings.rebalance_max_moves_per_spu)
    status, answer = await rebalance_ops.decommission(context, request.match_info["name"], limit, dry_run)
    return web.json_response(answer, status=status)


async def register_spu(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    spu = parse_object(models.Spu, await read_body(request, MAX_SMALL_BODY_BYTES))
    await admin_ops.register_spu(context, spu)
    return web.json_response(spu.to_json_dict(), status=201)


async def create_spu_group(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    group = parse_object(models.SpuGroup, await read_body(request, MAX_SMALL_BODY_BYTES))
    with _budget(timeout_ms) as remaining_ms:
        revision = await admin_ops.create(context, group)
    current, settled = await admin_ops.wait_settled(
        request.app[GROUP_WAITS], group, revision, admin_ops.group_settled(revision), remaining_ms()
    )
    if current is None:
        raise ApiError(409, "Conflict", f"{admin_ops.label('spu-groups', group.name)} was deleted while it was being created")
    resolution = current.status.resolution
    if resolution is models.SpuGroupResolution.INVALID:
        raise ApiError(
            422,
            "SpuGroupInvalid",
            f"SPU group {group.name!r} is Invalid: {current.status.reason}; "
            "it is kept, and reserves its range by itself once nothing collides: unregister the SPUs named, or delete the group and create it with another minId",
            object=current.to_json_dict(),
        )
    return web.json_response(current.to_json_dict(), status=201 if settled else 202)


async def create_topic(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    timeout_ms = _int_param(request, "timeout", DEFAULT_WAIT_MS, MAX_WAIT_MS)
    dry_run = _bool_param(request, "dryRun")
    raw = await read_body(request, topic_body_limit(context.kv_store), _topic_body_why(context.kv_store))
    check_topic_content(raw, context.kv_store)
    topic = parse_object(models.Topic, raw)
    if dry_run:
        async with context.gate.slot(admission.DRY_RUN):
            placement_request, _ = admin_ops.dry_run_request(context, topic)
            try:
                body = await context.gate.offload(placement_answer.for_request, placement_request, context.placers)
            except placement_answer.Refused as refused:
                raise ApiError(refused.status, refused.code, refused.message) from None
            return await _send_json(request, body, {})
    _check_topic_right(request, topic.name)
    with _budget(timeout_ms) as remaining_ms:
        revision = await admin_ops.create_topic(context, topic)
    return await _topic_answer(request, topic, revision, remaining_ms(), created=True)


def topic_body_limit(kv_store: kv.KVStore) -> int:
    """The largest topic create (or dry run) body read: what one request of ``kv_store`` holds,
    twice, and TOPIC_BODY_ROOM_BYTES (at most MAX_BODY_BYTES): the largest topic a store holds, as
    json.dumps writes it, takes at most the limit, so an indent of two spaces fits too."""
    return min(MAX_BODY_BYTES, 2 * kv.request_size(kv_store).max_request_bytes + admin_ops.TOPIC_BODY_ROOM_BYTES)


def _topic_body_why(kv_store: kv.KVStore) -> str:
    max_request_bytes = kv.request_size(kv_store).max_request_bytes
    if topic_body_limit(kv_store) == MAX_BODY_BYTES:
        return ""
    return (
        f" for a topic: a topic is stored in one etcd request of at most {max_request_bytes} bytes "
        f"(etcd_max_request_bytes), and its body may take twice that and {admin_ops.TOPIC_BODY_ROOM_BYTES} bytes more; "
        "send it without indentation, or raise etcd_max_request_bytes for a larger topic"
    )


def check_topic_content(raw: bytes, kv_store: kv.KVStore) -> None:
    """Refuse (413), before it is parsed, a topic body that could never be stored."""
    # Counted in C, a pass per character: a few ms for 3 MiB.
    content = len(raw) - sum(raw.count(space) for space in _JSON_WHITESPACE)
    limit = admin_ops.topic_content_limit(kv_store)
    if content > limit:
        raise ApiError(
            413,
            "RequestTooLarge",
            f"the request body holds {content} bytes besides whitespace; the limit is {limit} bytes for a topic: "
            f"a topic is stored in one etcd request of at most {kv.request_size(kv_store).max_request_bytes} bytes "
            "(etcd_max_request_bytes), its replica assignment twice; raise etcd_max_request_bytes for a larger topic",
        )


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
    status: models.TopicStatus = current.status
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
    count = _integer_body(await read_body(request, MAX_SMALL_BODY_BYTES), "count", "the number of partitions to add")
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
    replicas = _integer_body(await read_body(request, MAX_SMALL_BODY_BYTES), "replicas", "the number of SPUs the group should have")

    def scale(current: models.SpuGroup) -> models.SpuGroup:
        try:
            spec = models.SpuGroupSpec.model_validate({**current.spec.model_dump(), "replicas": replicas})
        except pydantic.ValidationError as error:
            raise ApiError(422, "InvalidRequest", models.describe_validation_error(error)) from None
        return current.model_copy(update={"spec": spec})

    scaled, _ = await admin_ops.update_spec(context, models.SpuGroup, name, scale, "scaling it")
    # As explicit as deleting an SPU: name the SPUs this deletes that partitions still use.
    warnings = admin_ops.group_shrink_warnings(
        context, name, replicas, f"scaling SPU group {name!r} down to {replicas} deletes"
    )
    # No verdict to wait for: a group that stays Reserved gets no new status write.
    return web.json_response({**scaled.to_json_dict(), "warnings": warnings}, status=202)


async def set_spu_rack(request: web.Request) -> web.Response:
    """Give an SPU a rack, or take it away (``{"rack": null}``); compare-and-swap on its spec."""
    context = request.app[CONTEXT]
    body = parse_json_object(await read_body(request, MAX_SMALL_BODY_BYTES), '{"rack": R}')
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


async def compute_placement(request: web.Request) -> web.StreamResponse:
    """Parsing, placing and encoding run in the placement worker, a process of its own
    (controller/api/placement_worker.py): a 16 MiB body, 100,000 partitions at RF 32, are seconds of
    CPU and hundreds of MB, which must not stop the loop (SPU heartbeats, /healthz) or swell the SC."""
    context = request.app[CONTEXT]
    raw = await read_body(request)
    live_spus = None
    if context.synced.is_set():
        snapshot = context.local_store.snapshot()
        live_spus = [spu for spu in topic_controller.spu_infos(snapshot) if spu.online]
    async with context.gate.slot(admission.PLACEMENT):
        try:
            body = await context.placement_worker.answer(raw, live_spus)
        except placement_answer.Refused as refused:
            raise ApiError(refused.status, refused.code, refused.message) from None
        return await _send_json(request, body, {})


# ---------------------------------------------------------------------------- watch


class _LinesSink:
    """A chunked HTTP response of JSON lines."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request = request
        self.response = response

    async def send_lines(self, lines: list[bytes]) -> None:
        await self.response.write(b"\n".join(lines) + b"\n")

    async def send_batch(self, batch: fanout.Batch) -> None:
        await self.response.write(batch.chunk)  # the same bytes for every JSON-lines watcher

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
    """One WebSocket text message per event; or, for a client that picked auth.WEBSOCKET_PROTOCOL
    (the live page), one message per batch of events, one per line: 10,000 partitions are then
    20 messages, not 10,000, which is most of the time a page takes to load."""

    def __init__(self, websocket: web.WebSocketResponse) -> None:
        self.response = websocket
        self.batched = websocket.ws_protocol == auth.WEBSOCKET_PROTOCOL

    async def send_lines(self, lines: list[bytes]) -> None:
        if self.batched:
            await self.response.send_frame(b"\n".join(lines) + b"\n", web.WSMsgType.TEXT)
            return
        for line in lines:
            await self.response.send_frame(line, web.WSMsgType.TEXT)

    async def send_batch(self, batch: fanout.Batch) -> None:
        if self.batched:
            await self.response.send_frame(batch.chunk, web.WSMsgType.TEXT)  # the bytes every watcher shares
            return
        await self.send_lines(batch.lines)

    async def until_gone(self) -> None:
        async for _ in self.response:
            pass  # the client has nothing to say; this loop only notices it closing

    async def finish(self) -> None:
        await self.response.close()


async def watch(request: web.Request) -> web.StreamResponse:
    context = request.app[CONTEXT]
    kind = _kind(request)
    topic_name = _topic_name(request, kind)
    admin_ops.require_synced(context)
    keep = None if topic_name is None else functools.partial(_of_topic, topic_name)

    async def subscribe(buffer_bytes: int, dropped: Callable[[str], None]) -> fanout.Subscriber:
        return await request.app[FEEDS].subscribe(kind, topic_name, keep, buffer_bytes, dropped)

    return await _serve_watch(request, kind, subscribe)


async def cluster_status(request: web.Request) -> web.Response:
    """The SCs of this store, as this SC sees them (controller/api/cluster.py)."""
    return web.json_response(cluster.describe(request.app[CONTEXT]))


async def watch_events(request: web.Request) -> web.StreamResponse:
    """This SC's latest decisions (decisions.RING_DECISIONS of them), a SYNC marker, then each new one."""
    return await _serve_watch(request, "events", request.app[CONTEXT].decisions.subscribe)


async def _serve_watch(
    request: web.Request,
    kind: str,
    subscribe: Callable[[int, Callable[[str], None]], Awaitable[fanout.Subscriber]],
) -> web.StreamResponse:
    """A watch stream as JSON lines, or as WebSocket messages when the client asks for an upgrade."""
    context = request.app[CONTEXT]
    # Not compressed: compressing would cost every watcher its own CPU for the same bytes. The one
    # subprotocol is the live page's (auth.WEBSOCKET_PROTOCOL): a browser that offers subprotocols
    # closes a WebSocket that picks none.
    websocket = web.WebSocketResponse(
        heartbeat=30.0, compress=False, protocols=(auth.WEBSOCKET_PROTOCOL,), max_msg_size=WATCH_MAX_CLIENT_MESSAGE_BYTES
    )
    upgrade = websocket.can_prepare(request).ok
    watcher = context.watchers.admit("websocket" if upgrade else "http", kind, request.remote or "unknown")
    try:

        def dropped(reason: str) -> None:
            watcher.dropped(reason)
            log.info("dropping a watch stream that fell behind", peer=request.remote, kind=kind, reason=reason)
            _abort(request)

        subscriber = await subscribe(context.settings.watch_buffer_bytes, dropped)
        try:
            sink: _LinesSink | _WebSocketSink
            if upgrade:
                await websocket.prepare(request)
                sink = _WebSocketSink(websocket)
            else:
                response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await response.prepare(request)
                sink = _LinesSink(request, response)
            await _stream(subscriber, sink, request.app[STOPPING], context.settings.client_stall_seconds, _revoked(request, kind))
        finally:
            subscriber.close()
        if subscriber.dropped is None:
            await sink.finish()
    finally:
        watcher.release()
    return sink.response


async def _revoked(request: web.Request, kind: str) -> None:
    """Returns once the credential a watch was opened with no longer reads: a watch outlasts its
    request, and credentials replaced meanwhile (their file changed) may have revoked it. Never
    returns without credentials configured."""
    presented = request.get(PRESENTED)
    if presented is None:
        await asyncio.Event().wait()
        return
    reason = await credentials.until_refused(request.app[CONTEXT].authenticator, presented, auth.Right(auth.READ))
    log.info("ending a watch stream: its credential was revoked", peer=request.remote, kind=kind, reason=reason)


def _of_topic(topic_name: str, obj: models.AnyObject) -> bool:
    return isinstance(obj, models.Partition) and obj.topic == topic_name


async def _stream(
    subscriber: fanout.Subscriber,
    sink: _LinesSink | _WebSocketSink,
    stopping: asyncio.Event,
    stall: float,
    revoked: Coroutine[Any, Any, None],
) -> None:
    """The subscriber's snapshot, then its batches as they come, until the client or the SC leaves,
    the credential is ``revoked`` or the subscriber is dropped; a write the client takes nothing of
    for ``stall`` seconds drops it."""

    async def sent(write: Awaitable[None]) -> bool:
        try:
            async with asyncio.timeout(stall):
                await write
        except TimeoutError:
            subscriber.drop("stalled")
            return False
        except ConnectionError:
            return False
        return subscriber.dropped is None

    stopped = asyncio.ensure_future(stopping.wait())
    gone = asyncio.ensure_future(sink.until_gone())
    refused = asyncio.ensure_future(revoked)
    # Any ends the subscriber's wait: one await per batch, not a wait on four futures.
    for end in (stopped, gone, refused):
        end.add_done_callback(lambda _: subscriber.end())
    try:
        for lines in subscriber.snapshot_batches():
            if subscriber.ended or not await sent(sink.send_lines(lines)):
                return
        while batches := await subscriber.next():
            for batch in batches:
                if not await sent(sink.send_batch(batch)):
                    return
    finally:
        await supervisor_module.cancel_and_wait(stopped, gone, refused)


# ---------------------------------------------------------------------------- the application


def build_app(context: context_module.Context) -> web.Application:
    app = web.Application(
        middlewares=[transport.middleware, error_middleware, auth_middleware, standby_middleware], client_max_size=MAX_BODY_BYTES
    )
    app[CONTEXT] = context
    app[STOPPING] = asyncio.Event()
    app[FEEDS] = fanout.Feeds(context.local_store, context.watchers.encodings)
    app[TOPIC_WAITS] = admin_ops.Waits(context.local_store["topics"])
    app[GROUP_WAITS] = admin_ops.Waits(context.local_store["spu-groups"])
    app[REBALANCE_PROGRESS] = rebalance_ops.Progress()
    app[UI_CACHE] = {}
    app.cleanup_ctx.append(_settlements)
    app.on_shutdown.append(_stop_streams)
    routes = app.router
    routes.add_get("/healthz", healthz)
    routes.add_get("/metrics", metrics)
    routes.add_get("/openapi.json", openapi_document)
    for path in UI_FILES:
        routes.add_get(path, ui_file)
    # Before /v1/{kind}/{name}, which would otherwise take /v1/watch/topics.
    routes.add_get("/v1/watch/events", watch_events)
    routes.add_get("/v1/cluster", cluster_status)
    routes.add_post("/v1/cluster/rebalance", rebalance)
    routes.add_get("/v1/cluster/rebalance", rebalance_progress)
    routes.add_delete("/v1/cluster/rebalance", cancel_rebalance)
    routes.add_post("/v1/spus/{name}/decommission", decommission_spu)
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
    await supervisor_module.cancel_and_wait(*tasks)
    await app[FEEDS].close()
    # The context's list answers and worker thread are the API's to end (the Fluvio sessions that
    # share them are closed before the application is cleaned up).
    await app[CONTEXT].lists.close()
    app[CONTEXT].gate.close()
    await app[CONTEXT].placement_worker.close()


async def _stop_streams(app: web.Application) -> None:
    app[STOPPING].set()
    # Before the server waits for its requests: creates waiting for a verdict are answered now.
    app[TOPIC_WAITS].close()
    app[GROUP_WAITS].close()
