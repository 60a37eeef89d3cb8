"""The KV store interface every backend implements (etcd, memory) and its typed errors.

Defines data shapes and the contract only; no backend logic and no I/O here. Keys passed to a
backend are relative to its key prefix (default ``/sc/``), so several clusters can share one etcd.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import enum
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass

DEFAULT_PREFIX = "/sc/"

# etcd's default --max-request-bytes: the largest request it takes (1.5 MiB).
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024
# What etcd adds around a transaction before comparing it with --max-request-bytes (its raft
# request header: 18 bytes measured on etcd 3.5, more with authentication). Kept free by every
# size check here, so that what passes them passes etcd's.
REQUEST_ENVELOPE_BYTES = 512


class StoreError(Exception):
    """Base of every error a KV backend raises."""


class Conflict(StoreError):
    """A compare-and-swap lost: the key's mod revision is not the expected one.

    Retry intent: re-read and reconcile again now.
    """

    def __init__(self, key: str, expected: int, actual: int, failed: Sequence[tuple[str, int, int]] = ()) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        # Every compare of the request that failed, (key, expected, actual) in compare order, the
        # first being the one named above; backends that check a batch name them all, so a caller
        # can send every stale write back at once instead of one per retry.
        self.failed: tuple[tuple[str, int, int], ...] = tuple(failed) or ((key, expected, actual),)
        state = "absent" if actual == 0 else f"at mod revision {actual}"
        wanted = "absent" if expected == 0 else f"at mod revision {expected}"
        others = f" (and {len(self.failed) - 1} more compares)" if len(self.failed) > 1 else ""
        super().__init__(f"conflict on key {key!r}: expected it {wanted}, found it {state}{others}")

    @property
    def keys(self) -> frozenset[str]:
        """The keys of every failed compare."""
        return frozenset(key for key, _, _ in self.failed)

    @classmethod
    def of(cls, failed: Sequence[tuple[str, int, int]]) -> Conflict:
        """The Conflict of a request whose compares ``failed`` (not empty), named by the first."""
        return cls(*failed[0], failed=failed)


class NotFound(StoreError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"key {key!r} does not exist")


class AlreadyExists(StoreError):
    def __init__(self, key: str, mod_revision: int) -> None:
        self.key = key
        self.mod_revision = mod_revision
        super().__init__(f"key {key!r} already exists (mod revision {mod_revision})")


class Compacted(StoreError):
    """A watch asked for history the store no longer has; relist from ``revision`` or later."""

    def __init__(self, requested: int, revision: int) -> None:
        self.requested = requested
        self.revision = revision
        super().__init__(
            f"revision {requested} is compacted: the oldest revision still available is {revision}"
        )


class HistoryLost(StoreError):
    """The store went back: it no longer has the last change a watch delivered, or it is at a
    lower revision than it answered before (etcd restored from a backup, or a single-member etcd
    before 3.5.5 killed right after acknowledging writes: etcd issue 14370). Writes it acknowledged
    are lost, and revisions after ``revision`` may be reused for other changes, so a watch resumed
    after ``delivered`` could miss them: relist. ``answered``: only the revision tells (the watch
    still has everything it delivered); ``delivered`` is then the highest revision answered."""

    def __init__(self, delivered: int, revision: int, *, answered: bool = False) -> None:
        self.delivered = delivered
        self.revision = revision
        self.answered = answered
        what = (
            f"the store is at revision {revision}, below revision {delivered} it answered before"
            if answered
            else f"the store went back to revision {revision} after a watch delivered revision {delivered}"
        )
        super().__init__(f"{what}: writes it acknowledged are lost, and the revisions after it may hold other changes")


class Unavailable(StoreError):
    """The store could not be reached within the request timeout; back off and retry."""


class NoSpace(Unavailable):
    """etcd refuses every write: its database reached its space quota and its NOSPACE alarm is
    raised. Only an operator ends it. The refused attempt wrote nothing (an earlier attempt of the
    same write that failed otherwise may have: ``outcome`` then says so).

    Retry intent: back off and retry, as for Unavailable (the SC writes again by itself once etcd
    takes writes), but not within one request: waiting does not free the space.
    """

    def __init__(self, endpoints: str, outcome: str = "") -> None:
        super().__init__(
            f"etcd at {endpoints} refuses writes: its database reached its space quota (--quota-backend-bytes) "
            "and its NOSPACE alarm is raised. An operator must free space: compact its history (etcdctl compact "
            "<its current revision>), defragment every member (etcdctl defrag), then disarm the alarm (etcdctl alarm "
            "disarm), and raise --quota-backend-bytes if the data needs it; the SC writes again by itself once etcd "
            f"takes writes.{outcome}"
        )


class LeaseExpired(StoreError):
    """The lease is gone (expired, revoked, or never granted by this store): its keys are deleted."""

    def __init__(self, lease: int) -> None:
        self.lease = lease
        super().__init__(f"lease {lease:x} has expired or was revoked")


class TooLarge(StoreError, ValueError):
    """A request above the store's size limit (etcd's ``--max-request-bytes``); nothing was written.

    Retry intent: none, the same request fails the same way every time (hence also a ValueError,
    like any other malformed request).
    """

    def __init__(self, size: int, limit: int, reserved: int = 0) -> None:
        self.size = size
        self.limit = limit
        reserve = f" and {reserved} for the SC's fence on its claim, sent with every write" if reserved else ""
        super().__init__(
            f"a request of {size} bytes is too large: the store takes at most {limit - REQUEST_ENVELOPE_BYTES - reserved} "
            f"(its limit of {limit} bytes, etcd's --max-request-bytes and the setting etcd_max_request_bytes, "
            f"less {REQUEST_ENVELOPE_BYTES} for etcd's own envelope{reserve})"
        )


class TooLargeForCluster(TooLarge):
    """A request etcd itself refused as too large although it was within etcd_max_request_bytes: the
    cluster's --max-request-bytes is lower than the setting (by how much, etcd does not say)."""

    def __init__(self, size: int, configured_limit: int) -> None:
        self.size = size
        self.limit = configured_limit
        StoreError.__init__(
            self,
            f"etcd refused a request of {size} bytes as too large: the cluster's --max-request-bytes is below "
            f"that and below the {configured_limit} bytes of the setting etcd_max_request_bytes; set "
            "etcd_max_request_bytes to the cluster's --max-request-bytes",
        )


class TooManyOperations(StoreError, ValueError):
    """A transaction etcd refused as holding more operations than its --max-txn-ops; nothing was
    written.

    Retry intent: none, the same transaction fails the same way until the cluster takes more (the
    SC sends up to MAX_TXN_OPS, etcd's default, and checks the cluster takes them when it starts).
    """

    def __init__(self, endpoints: str, operations: int) -> None:
        self.operations = operations
        super().__init__(
            f"etcd at {endpoints} refused a transaction of {operations} operations as too many: its --max-txn-ops "
            f"is below that, and the SC sends up to {MAX_TXN_OPS} (etcd's default): start etcd with "
            f"--max-txn-ops={MAX_TXN_OPS} or more"
        )


class ClusterLimitTooLow(StoreError):
    """The cluster takes fewer operations per transaction, or smaller requests, than the SC sends:
    found when the SC starts, so that it stops then rather than fail those writes for ever."""


class WrongCluster(StoreError):
    """The store's endpoint answers for another etcd cluster than the one it first answered for.

    Retry intent: none, for good: the store refuses every request from then on (the operator must
    point the SC back at its own cluster, or start it afresh on the new one).
    """

    def __init__(self, endpoints: str, expected: int, found: int) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"etcd at {endpoints} now answers for cluster {found:x}, not {expected:x} where this SC's state "
            "is: the SC stops using the store; point it back at its own cluster, or restart it to start "
            "afresh on this one"
        )


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int = 0  # the lease the key is held under (0: none; it stays until deleted)


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[KeyValue]
    revision: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    key: str
    value: bytes | None  # None for DELETE
    revision: int  # the mod revision of the change (for DELETE: the revision of the delete)
    # The key's create revision after a PUT (== revision when the PUT created it); 0 for DELETE.
    create_revision: int = 0


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease granted by the store: ``ttl`` is the seconds granted (a store may grant more)."""

    id: int
    ttl: int


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of :meth:`KVStore.claim`: whether this call created the key, and the key now."""

    won: bool
    current: KeyValue


@dataclass(frozen=True, slots=True)
class Compare:
    """Transaction guard: the key's mod revision must equal ``mod_revision`` (0 means absent)."""

    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Operation = Put | Delete


class KVStore(abc.ABC):
    """Async KV contract shared by every backend; the contract test suite runs against each.

    Every backend refuses a transaction (or a create) larger than ``max_request_bytes``, counted
    as :class:`RequestSize` does, with :class:`TooLarge` before sending anything.
    """

    prefix: str
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Bytes of every request a wrapper adds to what its caller sends (the active-SC guard's fence):
    # a caller's request must fit in the limit less these.
    reserved_request_bytes: int = 0
    # Writes refused with NoSpace so far (only etcd has a space quota), for /metrics.
    no_space_refusals: int = 0

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None if it does not exist."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> ListResult:
        """Every key under ``prefix`` (sorted by key) and the store revision they were read at."""

    @abc.abstractmethod
    async def create(self, key: str, value: bytes, guards: Sequence[Compare] = ()) -> int:
        """Write a key that must not exist; returns its mod revision. Raises AlreadyExists.

        ``guards``: compares on other keys that must hold too, in the same atomic step (the
        active-SC guard's fence). A guard that fails raises Conflict naming it, whether the key
        exists or not. Unlike a ``txn``, creates under the same guards may share one request.
        """

    @abc.abstractmethod
    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        """Compare-and-swap on the mod revision; returns the new one. Raises Conflict/NotFound."""

    @abc.abstractmethod
    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        """Delete the key (only at ``mod_revision`` when given); returns the delete's revision.

        Raises NotFound if the key is absent and Conflict if its revision differs.
        """

    @abc.abstractmethod
    async def txn(self, compares: Sequence[Compare], operations: Sequence[Operation]) -> int:
        """Apply every operation atomically if every compare holds; returns the new revision.

        All or nothing: if a compare fails nothing is written and Conflict names the first
        compare that failed. A transaction with no operations only checks the compares.
        """

    @abc.abstractmethod
    def watch(self, prefix: str, from_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Every PUT and DELETE under ``prefix`` with revision >= ``from_revision``, in order.

        Survives store restarts without losing or repeating an event. Raises Compacted if
        ``from_revision`` (or the resume point after a reconnect) is no longer available.
        """

    # Leases: a key claimed under a lease is deleted when the lease ends (revoked, or not kept
    # alive within its TTL). A later write of the key without the lease detaches it (as in etcd).
    # Together they make an owner key that vanishes with its owner: the active SC's marker now,
    # a leader election later.

    @abc.abstractmethod
    async def grant_lease(self, ttl: int) -> Lease:
        """A new lease that ends ``ttl`` seconds (at least 1) after it was last kept alive."""

    @abc.abstractmethod
    async def keep_alive(self, lease: int) -> int:
        """Restart the lease's TTL; returns the TTL in seconds. Raises LeaseExpired if it is gone."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> None:
        """End the lease now, deleting its keys in one revision; a lease already gone is no error."""

    @abc.abstractmethod
    async def claim(self, key: str, value: bytes, lease: int) -> Claim:
        """Create ``key`` under ``lease`` unless it exists, in one atomic step; the key as it is
        afterwards (the caller's value if ``won``, else the holder's). Raises LeaseExpired.
        """

    @abc.abstractmethod
    async def revision(self) -> int:
        """The store's current revision."""

    @abc.abstractmethod
    async def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (watches from older revisions get Compacted)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; pending watches end."""

    def stopped(self) -> StoreError | None:
        """The error every request now fails with, for good (WrongCluster), or None: the store
        works, or fails in a way that may pass. Lets /healthz say so without waiting for a task
        to trip over it."""
        return None



class ForwardingStore(KVStore):
    """A store in front of another: every method, the prefix, the request limit and the health are
    the inner store's. Wrappers (the active-SC guard, the history's attribution) override only what
    they add, so a method or attribute the interface gains reaches the backend through them too."""

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner

    @property
    def prefix(self) -> str:  # type: ignore[override]  # KVStore declares a plain attribute; a wrapper reads its inner store's
        return self.inner.prefix

    @property
    def max_request_bytes(self) -> int:  # type: ignore[override]  # as prefix: the inner store's
        return self.inner.max_request_bytes

    @property
    def reserved_request_bytes(self) -> int:  # type: ignore[override]  # as prefix: the inner store's
        return self.inner.reserved_request_bytes

    @property
    def no_space_refusals(self) -> int:  # type: ignore[override]  # as prefix: the inner store's
        return self.inner.no_space_refusals

    async def get(self, key: str) -> KeyValue | None:
        return await self.inner.get(key)

    async def list(self, prefix: str) -> ListResult:
        return await self.inner.list(prefix)

    async def create(self, key: str, value: bytes, guards: Sequence[Compare] = ()) -> int:
        return await self.inner.create(key, value, guards)

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        return await self.inner.update(key, value, mod_revision)

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        return await self.inner.delete(key, mod_revision)

    async def txn(self, compares: Sequence[Compare], operations: Sequence[Operation]) -> int:
        return await self.inner.txn(compares, operations)

    def watch(self, prefix: str, from_revision: int) -> AsyncGenerator[WatchEvent, None]:
        return self.inner.watch(prefix, from_revision)

    async def grant_lease(self, ttl: int) -> Lease:
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease: int) -> int:
        return await self.inner.keep_alive(lease)

    async def revoke_lease(self, lease: int) -> None:
        await self.inner.revoke_lease(lease)

    async def claim(self, key: str, value: bytes, lease: int) -> Claim:
        return await self.inner.claim(key, value, lease)

    async def revision(self) -> int:
        return await self.inner.revision()

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    async def close(self) -> None:
        await self.inner.close()

    def stopped(self) -> StoreError | None:
        return self.inner.stopped()


# Largest number of operations etcd accepts in one transaction by default (--max-txn-ops); it
# limits a transaction's compares to as many.
MAX_TXN_OPS = 128
# One compare of every write transaction of the SC is its fence on the store's claim
# (store/active_sc.py): the writes, each with its compare, that one such transaction may hold.
MAX_TXN_WRITES = MAX_TXN_OPS - 1


def check_txn_length(compares: Sequence[Compare], operations: Sequence[Operation]) -> None:
    """Raise ValueError if the transaction holds more operations or compares than etcd takes."""
    if len(operations) > MAX_TXN_OPS or len(compares) > MAX_TXN_OPS:
        raise ValueError(
            f"a transaction holds at most {MAX_TXN_OPS} operations and {MAX_TXN_OPS} compares, "
            f"got {len(operations)} and {len(compares)}"
        )


def check_guards(guards: Sequence[Compare]) -> None:
    """Raise ValueError if a create carries more guards than one etcd transaction compares (the
    create's own compare is one more)."""
    if len(guards) >= MAX_TXN_OPS:
        raise ValueError(f"a create carries at most {MAX_TXN_OPS - 1} guards, got {len(guards)}")


def request_size(store: KVStore) -> RequestSize:
    """How ``store`` counts the size of a request, and its limit."""
    return RequestSize(store.prefix, store.max_request_bytes, store.reserved_request_bytes)


@dataclass(frozen=True, slots=True)
class RequestSize:
    """The size of a request as etcd counts it against --max-request-bytes: its protobuf encoding
    (a TxnRequest), keys under ``prefix``. Arithmetic only, so both backends count alike (a test
    checks it against the encoded etcd messages).

    ``budget``: the largest request that passes (the limit less etcd's envelope, and less what a
    wrapper adds to every request: ``reserved``).
    """

    prefix: str
    max_request_bytes: int
    reserved: int = 0

    @property
    def budget(self) -> int:
        return self.max_request_bytes - REQUEST_ENVELOPE_BYTES - self.reserved

    def key_bytes(self, key: str) -> int:
        return len(self.prefix.encode()) + len(key.encode())

    def compare_bytes(self, key: str, mod_revision: int) -> int:
        # Compare{target: MOD, key, mod_revision}: EQUAL is the default (not encoded); mod_revision
        # belongs to a oneof, so it is encoded even when 0.
        return _field(2 + _field(self.key_bytes(key)) + 1 + _varint(mod_revision))

    def put_bytes(self, key: str, value_length: int) -> int:
        # RequestOp{request_put: PutRequest{key, value}}; an empty value is not encoded.
        put = _field(self.key_bytes(key)) + (_field(value_length) if value_length else 0)
        return _field(_field(put))

    def delete_bytes(self, key: str) -> int:
        # RequestOp{request_delete_range: DeleteRangeRequest{key}}
        return _field(_field(_field(self.key_bytes(key))))

    def guards_bytes(self, guards: Sequence[Compare]) -> int:
        """What guards add to a group commit's transaction: each a compare, and the read-back of
        its key when it fails (a RangeRequest encodes as a DeleteRangeRequest does)."""
        return sum(self.compare_bytes(guard.key, guard.mod_revision) + self.delete_bytes(guard.key) for guard in guards)

    def create_bytes(self, key: str, value_length: int) -> int:
        """A create-if-absent as the etcd backend sends it in a group commit: a nested transaction
        (its compare, its put, the read-back of the key when it exists). The memory backend counts
        a create the same way, so both refuse the same creates."""
        read_back = _field(_field(_field(self.key_bytes(key))))
        nested = self.compare_bytes(key, 0) + self.put_bytes(key, value_length) + read_back
        return _field(_field(nested))

    def operation_bytes(self, operation: Operation) -> int:
        if isinstance(operation, Put):
            return self.put_bytes(operation.key, len(operation.value))
        return self.delete_bytes(operation.key)

    def txn_bytes(self, compares: Sequence[Compare], operations: Sequence[Operation]) -> int:
        return sum(self.compare_bytes(compare.key, compare.mod_revision) for compare in compares) + sum(
            self.operation_bytes(operation) for operation in operations
        )

    def writes_bound(self, writes: int, key_bytes: int, value_bytes: int) -> int:
        """Never less than the bytes of ``writes`` writes (each a compare and a put or delete) whose
        keys and values total ``key_bytes`` and ``value_bytes``: a cheap count for batching."""
        keys = key_bytes + writes * len(self.prefix.encode())
        return 2 * keys + value_bytes + writes * _WRITE_OVERHEAD_BOUND

    def check(self, compares: Sequence[Compare], operations: Sequence[Operation]) -> None:
        """Raise TooLarge if the transaction would be above the limit."""
        if self.bound(compares, operations) <= self.budget:
            return  # the common case, counted without a call per field
        size = self.txn_bytes(compares, operations)
        if size > self.budget:
            raise TooLarge(size, self.max_request_bytes, self.reserved)

    def bound(self, compares: Sequence[Compare], operations: Sequence[Operation]) -> int:
        """Never less than ``txn_bytes``: each compare, put or delete is its key and value plus at
        most _OPERATION_OVERHEAD_BOUND bytes of tags and lengths (keys and values below 2**35)."""
        keys = sum(len(compare.key.encode()) for compare in compares) + sum(len(op.key.encode()) for op in operations)
        values = sum(len(op.value) for op in operations if type(op) is Put)
        count = len(compares) + len(operations)
        return keys + values + count * (len(self.prefix.encode()) + _OPERATION_OVERHEAD_BOUND)


# Tags and length prefixes of one compare and one put (lengths below 2**35): 25 + 24 bytes.
_WRITE_OVERHEAD_BOUND = 49
# Of any one compare, put or delete (the largest: a compare, with a 10-byte revision).
_OPERATION_OVERHEAD_BOUND = 25


def _varint(value: int) -> int:
    """Bytes of a protobuf varint holding ``value`` (>= 0)."""
    return max(1, (value.bit_length() + 6) // 7)


def _field(length: int) -> int:
    """Bytes of a length-delimited protobuf field (number below 16) of ``length`` bytes."""
    return 1 + _varint(length) + length
# The deadline (event loop time) of the caller's budget, when it set one (see ``budget``).
_budget_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("kv_budget_deadline", default=None)


@contextlib.contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Within the block, a request to the store may keep retrying while the store is unavailable
    for up to ``seconds`` from now, when that is longer than the backend's own request timeout.

    For a caller that was given a budget of its own (an API request's ``?timeout=``): a store
    that is down for less than the budget then costs time, not a failed request. Never shortens
    the backend's timeout. Nested budgets: the innermost applies.
    """
    token = _budget_deadline.set(asyncio.get_running_loop().time() + max(seconds, 0.0))
    try:
        yield
    finally:
        _budget_deadline.reset(token)


def budget_deadline() -> float | None:
    """The deadline (event loop time) of the budget the caller set, or None."""
    return _budget_deadline.get()
