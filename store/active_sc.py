"""One active SC per store: claims ``meta/active-sc`` (its identity) under a lease kept alive, and
refuses this SC's writes whenever it may not hold that claim. It decides nothing about objects; the
daemon decides what to do when another SC holds the claim (refuse to start, or stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import enum
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from store import kv

_log = logging.getLogger(__name__)

KEY = "meta/active-sc"
DEFAULT_TTL = 10
# Polling the key while a previous holder's claim may still expire (a crashed SC's).
_WAIT_POLL_SECONDS = 0.5
_HOLDER_CHARS = 300
# A renewal that fails is sent again after this pause while the lease may still be alive.
_RETRY_PAUSE_SECONDS = 0.2
_MIN_ATTEMPT_SECONDS = 1.0
# An unconditional delete through the guard reads the key's revision and deletes at it: a key
# rewritten between the two that many times in a row gives up with the last Conflict.
_DELETE_ATTEMPTS = 10


class Fenced(kv.Unavailable):
    """The store refused a write of this SC: the claim the write was sent under is not the store's
    claim any more (it expired, or another SC holds it now), whatever this SC believed."""


class AnotherScActive(Exception):
    """Another SC holds the store's active-SC claim; the message names it and what to do."""

    def __init__(self, key: str, holder: str, ttl: int) -> None:
        self.holder = holder
        super().__init__(
            f"another SC is active on this store: {holder} holds {key}. Until SC high availability lands, "
            f"one SC runs per store: stop that SC first, or give this one a store of its own (--key-prefix, "
            f"--etcd-endpoints or --data-dir). A crashed SC's claim ends {ttl} s after its last keep-alive."
        )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who holds the claim: what an operator needs to find that SC."""

    id: str
    host: str
    pid: int
    address: str  # the public API's host:port
    started: str  # ISO 8601 UTC, for people (nothing compares it)

    @classmethod
    def of_this_process(cls, address: str) -> Identity:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), address, started)

    def encode(self) -> bytes:
        fields = {"id": self.id, "host": self.host, "pid": self.pid, "address": self.address, "started": self.started}
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Identity | None:
        """A claim's value as an SC of this project writes it; None for anything else (whoever can
        write the store can write there)."""
        try:
            fields = json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None
        if not isinstance(fields, dict) or set(fields) != {"id", "host", "pid", "address", "started"}:
            return None
        texts = [fields[name] for name in ("id", "host", "address", "started")]
        if not all(isinstance(text, str) and len(text) <= _HOLDER_CHARS for text in texts):
            return None
        pid = fields["pid"]
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
            return None
        return cls(fields["id"], fields["host"], pid, fields["address"], fields["started"])


def describe_holder(value: bytes) -> str:
    """A claim's value as a person reads it; anything may be stored there, so nothing is trusted."""
    try:
        fields = json.loads(value)
        if not isinstance(fields, dict):
            raise ValueError("not an object")
        text = (
            f"SC {fields['id']} (pid {fields['pid']} on host {fields['host']}, "
            f"public address {fields['address']}, active since {fields['started']})"
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        text = f"an unknown holder (value {value[:60]!r})"
    return text if len(text) <= _HOLDER_CHARS else text[: _HOLDER_CHARS - 3] + "..."


class State(enum.Enum):
    UNCLAIMED = "unclaimed"  # before acquire(), or after release()
    ACTIVE = "active"  # holds the claim (writes allowed while the lease is known to be alive)
    LOST = "lost"  # the lease or the key is gone: writes refused, claiming again
    SUPERSEDED = "superseded"  # another SC holds the claim: writes refused for good


class ActiveSc:
    """This SC's claim on the store. :meth:`acquire` it, run :meth:`run` as a task, :meth:`release`.

    Writes are allowed only while ACTIVE and before the lease's TTL has passed since the last
    keep-alive that etcd answered (counted from when it was sent, so never later than etcd's own
    expiry). That is this SC's own belief; the store has the last word: every write carries, in
    its transaction, a compare on the claim's revision (see GuardedStore), so a write sent by an
    SC that lost the claim without knowing it (paused, cut off) is refused by the store itself.
    """

    def __init__(self, kv_store: kv.KVStore, ttl: int = DEFAULT_TTL) -> None:
        if ttl < 2:
            raise ValueError(f"the active-SC lease must last at least 2 s, got {ttl}")
        self.kv_store = kv_store
        self.ttl = ttl
        self.key = f"{kv_store.prefix}{KEY}"
        self.state = State.UNCLAIMED
        self.identity: Identity | None = None
        self.holder = ""  # who holds the claim when SUPERSEDED
        self.superseded = asyncio.Event()
        self._lease: int | None = None
        self._claimed_revision = 0
        self._valid_until = 0.0
        self._lost_because = ""
        self._warned_unreachable = False
        self.fenced_writes = 0  # writes the store refused: their claim was not the store's any more
        self.losses = 0  # times this SC lost the claim while it held it

    # ------------------------------------------------------------------ for the daemon

    async def acquire(self, address: str, wait: float | None = None) -> None:
        """Claim the store for this SC, waiting up to ``wait`` seconds (default: the TTL and one
        more) for another holder's claim to end: a crashed SC's lease outlives it by its TTL.

        Raises AnotherScActive if another SC still holds it then.
        """
        loop = asyncio.get_running_loop()
        self.identity = Identity.of_this_process(address)
        deadline = loop.time() + (self.ttl + 1 if wait is None else wait)
        sent = loop.time()
        lease = await self.kv_store.grant_lease(self.ttl)
        warned = False
        try:
            while True:
                claim = await self.kv_store.claim(KEY, self.identity.encode(), lease.id)
                if claim.won:
                    self._activate(lease.id, claim.current.create_revision, sent + lease.ttl)
                    _log.info("this SC is the active SC of its store (%s, lease %x)", self.key, lease.id)
                    return
                holder = describe_holder(claim.current.value)
                if loop.time() >= deadline:
                    raise AnotherScActive(self.key, holder, self.ttl)
                if not warned:
                    warned = True
                    _log.warning(
                        "%s holds %s; waiting up to %.0f s for its claim to end (a crashed SC's does)",
                        holder, self.key, deadline - loop.time(),
                    )
                await asyncio.sleep(min(_WAIT_POLL_SECONDS, max(0.0, deadline - loop.time())))
                sent = loop.time()
                await self.kv_store.keep_alive(lease.id)
        except BaseException:
            with contextlib.suppress(kv.StoreError):
                await self.kv_store.revoke_lease(lease.id)
            raise

    async def run(self) -> None:
        """Keep the claim: renew the lease every third of its TTL; claim again if it is lost."""
        while self.state in (State.ACTIVE, State.LOST):
            await asyncio.sleep(self.ttl / 3)
            if self.state is State.ACTIVE:
                await self._renew()
            elif self.state is State.LOST:
                await self._claim_again()

    async def release(self) -> None:
        """Give the claim up (its key is deleted with the lease): the next SC need not wait."""
        lease, self._lease = self._lease, None
        if self.state is not State.SUPERSEDED:
            self.state = State.UNCLAIMED
        self._valid_until = 0.0
        if lease is not None:
            with contextlib.suppress(kv.StoreError):
                await self.kv_store.revoke_lease(lease)

    def problem(self) -> str | None:
        """Why this SC may not write now (None: it may)."""
        if self.state is State.ACTIVE:
            if asyncio.get_running_loop().time() < self._valid_until:
                return None
            return (
                f"its claim on {self.key} could not be renewed within its {self.ttl} s lease (the store is "
                "unreachable); writes are paused until it is renewed"
            )
        if self.state is State.LOST:
            return f"it lost its claim on {self.key} ({self._lost_because}); writes are paused while it claims it again"
        if self.state is State.SUPERSEDED:
            return f"another SC is active on this store ({self.holder}); this SC is stopping"
        return f"it does not hold {self.key} (not claimed yet, or stopping)"

    def check_writable(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise kv.Unavailable(f"this SC may not write: {problem}")

    @property
    def leading(self) -> bool:
        """Whether this SC holds the claim and may write now, as far as it knows (readable from any
        thread, as metrics are: the event loop's clock is time.monotonic)."""
        return self.state is State.ACTIVE and time.monotonic() < self._valid_until

    def fence(self) -> kv.Compare:
        """The compare every write of this SC carries: the claim is still the one it made (a
        leased key is never rewritten, so its mod revision is its create revision)."""
        self.check_writable()
        return kv.Compare(KEY, self._claimed_revision)

    def fenced(self, error: kv.Conflict) -> Fenced:
        """The store refused a write on the fence: the claim is lost, whatever this SC believed."""
        self.fenced_writes += 1
        now = "absent" if error.actual == 0 else f"at revision {error.actual}"
        if self.state is State.ACTIVE:
            self._lose(f"the store refused a write: the claim made at revision {error.expected} is {now}")
        return Fenced(f"this SC may not write: the store's claim {self.key} is not its own any more ({now})")

    # ------------------------------------------------------------------ internals

    def _activate(self, lease: int, revision: int, valid_until: float) -> None:
        self._lease = lease
        self._claimed_revision = revision
        self._valid_until = valid_until
        self.state = State.ACTIVE

    async def _renew(self) -> None:
        assert self._lease is not None and self.identity is not None
        loop = asyncio.get_running_loop()
        while True:
            sent = loop.time()
            try:
                # A share of the lease per attempt: one that waited out the store's request budget
                # (5 s) left no time for another before a 10 s lease lapsed.
                async with asyncio.timeout(max(_MIN_ATTEMPT_SECONDS, self.ttl / 5)):
                    ttl = await self.kv_store.keep_alive(self._lease)
                    current = await self.kv_store.get(KEY)
                break
            except kv.LeaseExpired:
                self._lose(f"its lease expired: the store was unreachable for longer than the {self.ttl} s TTL")
                return
            except (kv.Unavailable, TimeoutError) as error:
                reason = str(error) or f"no answer within {max(_MIN_ATTEMPT_SECONDS, self.ttl / 5):g} s"
                if not self._warned_unreachable:
                    self._warned_unreachable = True
                    _log.warning("cannot renew the active-SC lease (%s); writes pause once it lapses", reason)
                if loop.time() + _RETRY_PAUSE_SECONDS >= self._valid_until:
                    return  # lapsed for all we know: run() goes on at its pace (and finds out)
                await asyncio.sleep(_RETRY_PAUSE_SECONDS)
        if current is None:
            self._lose(f"{self.key} was deleted")
        elif current.create_revision != self._claimed_revision or current.value != self.identity.encode():
            self._lose(f"{self.key} was replaced: {describe_holder(current.value)} holds it")
        else:
            if self._warned_unreachable:
                self._warned_unreachable = False
                _log.warning("the active-SC lease is renewed again")
            self._valid_until = sent + ttl

    def _lose(self, because: str) -> None:
        self.losses += 1
        self.state = State.LOST
        self._valid_until = 0.0
        self._lost_because = because
        _log.error("this SC lost its claim on %s (%s): writes are paused while it claims it again", self.key, because)

    async def _claim_again(self) -> None:
        assert self.identity is not None
        old, self._lease = self._lease, None
        loop = asyncio.get_running_loop()
        try:
            if old is not None:
                await self.kv_store.revoke_lease(old)
            sent = loop.time()
            lease = await self.kv_store.grant_lease(self.ttl)
            claim = await self.kv_store.claim(KEY, self.identity.encode(), lease.id)
        except kv.StoreError as error:
            _log.warning("cannot claim %s again yet: %s", self.key, error)
            return
        if claim.won:
            self._activate(lease.id, claim.current.create_revision, sent + lease.ttl)
            _log.warning("this SC holds %s again: writes resume", self.key)
            return
        with contextlib.suppress(kv.StoreError):
            await self.kv_store.revoke_lease(lease.id)
        self.holder = describe_holder(claim.current.value)
        self.state = State.SUPERSEDED
        self.superseded.set()
        _log.error("%s is now the active SC of this store (%s): this SC stops", self.holder, self.key)


class GuardedStore(kv.ForwardingStore):
    """The store as this SC's pipeline and API see it: reads pass; every write is a transaction
    that also compares the store's claim with this SC's (ActiveSc.fence), so it applies only while
    this SC holds the claim in the store's own view. The fence goes first: a Conflict naming the
    claim's key is a fenced write (Fenced), any other keeps the meaning it has for the caller."""

    def __init__(self, inner: kv.KVStore, active: ActiveSc) -> None:
        super().__init__(inner)
        self.active = active

    @property
    def reserved_request_bytes(self) -> int:  # type: ignore[override]  # KVStore declares a plain attribute
        # The fence at the largest revision there can be: callers' requests plus the fence always fit.
        fence = kv.RequestSize(self.inner.prefix, self.inner.max_request_bytes).compare_bytes(KEY, 2**63 - 1)
        return self.inner.reserved_request_bytes + fence

    async def create(self, key: str, value: bytes, guards: Sequence[kv.Compare] = ()) -> int:
        # The fence as the create's first guard: the backend's group commit still sends a burst of
        # creates (the API's topic creates) in one transaction, with the fence its own compare.
        if len(guards) + 1 >= kv.MAX_TXN_OPS:
            raise ValueError(f"a create of the SC carries at most {kv.MAX_TXN_OPS - 2} guards (one more is its fence), got {len(guards)}")
        size = kv.request_size(self)
        # The fence's compare is reserved; as a guard it also reads its key back when it fails.
        total = size.create_bytes(key, len(value)) + size.guards_bytes(guards) + size.delete_bytes(KEY)
        if total > size.budget:
            raise kv.TooLarge(total, size.max_request_bytes, size.reserved)
        fence = self.active.fence()
        try:
            return await self.inner.create(key, value, [fence, *guards])
        except kv.Conflict as error:
            if error.key == fence.key:
                raise self.active.fenced(error) from None
            raise

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        try:
            return await self._fenced_txn([kv.Compare(key, mod_revision)], [kv.Put(key, value)])
        except kv.Conflict as error:
            if error.actual == 0:
                raise kv.NotFound(key) from None
            raise

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        for attempt in range(_DELETE_ATTEMPTS):
            expected = mod_revision
            if expected is None:
                # "Whatever it is": at the revision it has now (a compare is what carries the fence).
                current = await self.inner.get(key)
                if current is None:
                    raise kv.NotFound(key)
                expected = current.mod_revision
            try:
                return await self._fenced_txn([kv.Compare(key, expected)], [kv.Delete(key)])
            except kv.Conflict as error:
                if error.actual == 0:
                    raise kv.NotFound(key) from None
                if mod_revision is not None or attempt == _DELETE_ATTEMPTS - 1:
                    raise
                # Changed between the read and the delete: delete what it is now.
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        if not operations:
            return await self.inner.txn(compares, operations)  # a check writes nothing: no fence
        return await self._fenced_txn(compares, operations)

    async def _fenced_txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        # Checked here, against what callers may send: the limits less the fence.
        if len(compares) > kv.MAX_TXN_WRITES or len(operations) > kv.MAX_TXN_OPS:
            raise ValueError(
                f"a transaction of the SC holds at most {kv.MAX_TXN_OPS} operations and {kv.MAX_TXN_WRITES} compares "
                f"(one more is its fence), got {len(operations)} and {len(compares)}"
            )
        kv.request_size(self).check(compares, operations)
        fence = self.active.fence()
        try:
            return await self.inner.txn([fence, *compares], operations)
        except kv.Conflict as error:
            if error.key == fence.key:
                raise self.active.fenced(error) from None
            raise

    async def compact(self, revision: int) -> None:
        self.active.check_writable()
        await self.inner.compact(revision)

    async def claim(self, key: str, value: bytes, lease: int) -> kv.Claim:
        self.active.check_writable()
        return await self.inner.claim(key, value, lease)
