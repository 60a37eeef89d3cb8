"""One active SC per store, elected among the SCs of the store (etcd's election recipe): each SC puts
``meta/sc-candidates/<id>`` (its identity) under a lease it keeps alive; candidates queue by the
create revision of their key, and the first claims ``meta/active-sc`` under the same lease. Every
write of this SC is refused unless it holds that claim (see GuardedStore: the store itself checks
the claim's revision in each write's transaction). It decides nothing about objects; the daemon
runs or stops this SC's controllers as its role changes.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from store import kv

_log = logging.getLogger(__name__)

META = "meta/"
KEY = "meta/active-sc"
# Each SC of the store has its key here while it runs: a candidate to lead, in create order.
CANDIDATES = "meta/sc-candidates/"
# A leader that gives its claim up writes who it was and its epoch here (in the same transaction).
RESIGNED_KEY = "meta/active-sc-resigned"
DEFAULT_TTL = 10
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


@dataclass(frozen=True, slots=True)
class Identity:
    """Who holds the claim: what an operator needs to find that SC."""

    id: str
    host: str
    pid: int
    address: str  # the public API's host:port
    started: str  # ISO 8601 UTC, for people (nothing compares it)
    # The private port's host:port, where SPUs connect ("" when not known, as in values written
    # before SCs had standbys): a standby names the leader's to the SPUs it refuses.
    private: str = ""

    @classmethod
    def of_this_process(cls, address: str, private: str = "") -> Identity:
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), address, started, private)

    def encode(self) -> bytes:
        fields: dict[str, object] = {
            "id": self.id, "host": self.host, "pid": self.pid, "address": self.address, "started": self.started,
        }
        if self.private:
            fields["private"] = self.private
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Identity | None:
        """A claim's value as an SC of this project writes it; None for anything else (whoever can
        write the store can write there)."""
        try:
            fields = json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None
        if not isinstance(fields, dict) or set(fields) - {"private"} != {"id", "host", "pid", "address", "started"}:
            return None
        texts = [fields.get(name, "") for name in ("id", "host", "address", "started", "private")]
        if not all(isinstance(text, str) and len(text) <= _HOLDER_CHARS for text in texts):
            return None
        pid = fields["pid"]
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
            return None
        if not fields["id"] or not all(char.isalnum() or char in "-_." for char in fields["id"]):
            return None  # an id names a candidate key: one path segment
        return cls(fields["id"], fields["host"], pid, fields["address"], fields["started"], fields.get("private", ""))


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
    UNCLAIMED = "unclaimed"  # before join(), or after release()
    STANDBY = "standby"  # a candidate in the queue: its key is in the store, it does not hold the claim
    ACTIVE = "active"  # holds the claim (writes allowed while the lease is known to be alive)
    LOST = "lost"  # was a candidate or the leader and is not any more: writes refused, joining the queue again


# Why this SC leads now: what became of the claim before it (Takeover.cause).
UNCLAIMED_STORE = "unclaimed"  # no SC held the claim when this SC looked (a first start, or a restart)
RESIGNED = "resigned"  # the previous leader gave the claim up (stopped, or stepped down)
LEASE_EXPIRED = "lease-expired"  # the previous leader's lease ended: it crashed, paused or was cut off
CLAIM_DELETED = "claim-deleted"  # the claim was deleted while its holder was still a candidate: its writes are fenced


@dataclass(frozen=True, slots=True)
class Takeover:
    """How this SC became the leader: the claim before it (None if it saw none) and why it ended."""

    cause: str
    epoch: int  # the new claim's create revision: the fencing epoch
    previous: Identity | None
    previous_epoch: int  # 0 when there was none
    at: str  # ISO 8601 UTC, for people


@dataclass(frozen=True, slots=True)
class Candidate:
    """A candidate key as this SC read it: whose, and its place in the queue."""

    identity: Identity
    create_revision: int


def candidate_key(sc_id: str) -> str:
    return f"{CANDIDATES}{sc_id}"


def queue(values: Mapping[str, tuple[bytes, int]]) -> list[Candidate]:
    """The candidates among ``values`` (relative key -> (value, create or mod revision)), first in
    line first. A key whose value is not an identity an SC wrote, or whose id is not its key's
    name, is no candidate: whoever can write the store can write there, and nothing they write may
    keep the SCs from electing one of them."""
    found: list[Candidate] = []
    for key, (value, revision) in values.items():
        if not key.startswith(CANDIDATES):
            continue
        identity = Identity.decode(value)
        if identity is not None and key == candidate_key(identity.id):
            found.append(Candidate(identity, revision))
    return sorted(found, key=lambda candidate: (candidate.create_revision, candidate.identity.id))


class ActiveSc:
    """This SC's candidacy and claim. :meth:`join` the queue, run :meth:`run` as a task (it keeps the
    candidacy, claims when first, renews the claim, joins again after a loss), :meth:`release`.

    Writes are allowed only while ACTIVE and before the lease's TTL has passed since the last
    keep-alive that etcd answered (counted from when it was sent, so never later than etcd's own
    expiry). That is this SC's own belief; the store has the last word: every write carries, in
    its transaction, a compare on the claim's revision (see GuardedStore), so a write sent by an
    SC that lost the claim without knowing it (paused, cut off) is refused by the store itself.
    ``changed`` is set at every change of role (and ``term`` counts the claims won), so that the
    daemon starts and stops what only the leader runs.
    """

    def __init__(self, kv_store: kv.KVStore, ttl: int = DEFAULT_TTL) -> None:
        if ttl < 2:
            raise ValueError(f"the active-SC lease must last at least 2 s, got {ttl}")
        self.kv_store = kv_store
        self.ttl = ttl
        self.key = f"{kv_store.prefix}{KEY}"
        self.state = State.UNCLAIMED
        self.identity: Identity | None = None
        self.changed = asyncio.Event()
        # Set once this SC knows its role: it leads, or another candidate is ahead of it.
        self.settled = asyncio.Event()
        self.term = 0  # claims won by this SC: a new term at each
        self.takeover: Takeover | None = None  # how the current (or last) term began
        self.step_down_cause = ""  # why the last term ended (empty while none has)
        self._lease: int | None = None
        self._claimed_revision = 0
        self._valid_until = 0.0
        # Loop time at which the request that last started the lease's TTL (its grant, or a
        # renewal etcd answered) was sent: the lease lasts at least until then plus the TTL.
        self._lease_from = 0.0
        self._lost_because = ""
        self._warned_unreachable = False
        self._resigning = False  # lost the claim while leading: give it up explicitly before joining again
        # The campaign's view: the queue and the claim as last read; from the watch, in revision
        # order, the last claim seen and the last one that ended (its holder, epoch and cause).
        self.candidates: list[Candidate] = []
        self._claim_now: kv.KeyValue | None = None
        # The claim and candidate identities no lease holds, as last read (_delete_no_lease).
        self._no_lease: list[kv.KeyValue] = []
        self._holder: kv.KeyValue | None = None
        self._ended: tuple[kv.KeyValue, str] | None = None
        self._revision_events: list[kv.WatchEvent] = []
        self._seen_revision = 0
        self._seen = asyncio.Event()
        self.fenced_writes = 0  # writes the store refused: their claim was not the store's any more
        self.losses = 0  # times this SC lost the claim while it held it

    # ------------------------------------------------------------------ for the daemon

    async def join(self, address: str, private: str = "") -> None:
        """Enter the queue of candidates (this SC's key under a new lease). Raises StoreError if the
        store cannot be reached: the daemon does not start without it."""
        self.identity = Identity.of_this_process(address, private)
        await self._enter()

    async def acquire(self, address: str, wait: float | None = None) -> None:
        """Join and wait up to ``wait`` seconds (default: the TTL and one more, what a crashed
        holder's claim may outlive it) to lead; TimeoutError if this SC does not lead by then (it
        stays a candidate: run() goes on from where this left)."""
        await self.join(address)
        async with asyncio.timeout(self.ttl + 1 if wait is None else wait):
            while self.state is State.STANDBY:
                await self._campaign()
        if self.state is not State.ACTIVE:
            raise kv.Unavailable(f"this SC could not stay a candidate for {self.key}: {self._lost_because}")

    async def run(self) -> None:
        """Until cancelled: renew the lease every third of its TTL, campaign while a standby, and
        join the queue again (at its end) after losing the claim or the candidacy."""
        while self.state is not State.UNCLAIMED:
            if self.state is State.ACTIVE:
                await asyncio.sleep(self.ttl / 3)
                if self.state is State.ACTIVE:
                    await self._renew()
            elif self.state is State.STANDBY:
                await self._campaign()
            else:
                await self._rejoin()

    async def release(self) -> None:
        """Leave the queue and give the claim up (both keys go with the lease): the next candidate
        need not wait. A leader says it resigned (RESIGNED_KEY, in the transaction that deletes its
        claim) so that the next one records why it took over."""
        lease, self._lease = self._lease, None
        leading = self.leading
        self._set_state(State.UNCLAIMED)
        self._valid_until = 0.0
        if lease is None:
            return
        if leading:
            await self._resign()
        with contextlib.suppress(kv.StoreError):
            await self.kv_store.revoke_lease(lease)

    async def _resign(self) -> None:
        """Delete this SC's claim, if the store still has it, saying so (RESIGNED_KEY)."""
        assert self.identity is not None
        note = json.dumps({"id": self.identity.id, "epoch": self._claimed_revision}, separators=(",", ":")).encode()
        with contextlib.suppress(kv.StoreError):  # the claim is not its own any more, or the store is away
            await self.kv_store.txn(
                [kv.Compare(KEY, self._claimed_revision)],
                [kv.Delete(KEY), kv.Delete(candidate_key(self.identity.id)), kv.Put(RESIGNED_KEY, note)],
            )

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
            return f"it lost its place as a candidate for {self.key} ({self._lost_because}); it is joining the queue again"
        if self.state is State.STANDBY:
            return f"it is a standby: another SC holds {self.key} (or is about to)"
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

    def fence(self, term: int | None = None) -> kv.Compare:
        """The compare every write of this SC carries: the claim is still the one it made (a
        leased key is never rewritten, so its mod revision is its create revision). ``term``: the
        term that decided the write; refused once another began (this SC lost the claim and won
        it again), whose claim would otherwise let the old term's write through."""
        self.check_writable()
        if term is not None and term != self.term:
            raise kv.Unavailable(f"this SC may not write: the write was decided in its term {term}, which ended (term {self.term} now)")
        return kv.Compare(KEY, self._claimed_revision)

    @property
    def epoch(self) -> int:
        """The create revision of this SC's claim in its current or last term (0 before any)."""
        return self._claimed_revision

    def fenced(self, error: kv.Conflict) -> Fenced:
        """The store refused a write on the fence: the claim is lost, whatever this SC believed."""
        self.fenced_writes += 1
        now = "absent" if error.actual == 0 else f"at revision {error.actual}"
        if self.state is State.ACTIVE:
            self._lose(FENCED, f"the store refused a write: the claim made at revision {error.expected} is {now}")
        return Fenced(f"this SC may not write: the store's claim {self.key} is not its own any more ({now})")

    # ------------------------------------------------------------------ internals

    def _set_state(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self.changed.set()

    async def _enter(self) -> None:
        """A new lease and this SC's candidate key under it: the end of the queue."""
        assert self.identity is not None
        sent = asyncio.get_running_loop().time()
        lease = await self.kv_store.grant_lease(self.ttl)
        self._lease_from = sent
        try:
            claim = await self.kv_store.claim(candidate_key(self.identity.id), self.identity.encode(), lease.id)
        except BaseException:
            with contextlib.suppress(kv.StoreError):
                await self.kv_store.revoke_lease(lease.id)
            raise
        if not claim.won:
            with contextlib.suppress(kv.StoreError):
                await self.kv_store.revoke_lease(lease.id)
            raise kv.StoreError(
                f"cannot join the SC candidates: {self.kv_store.prefix}{candidate_key(self.identity.id)} is taken "
                f"by {describe_holder(claim.current.value)}"
            )
        self._lease = lease.id
        self._claim_now = self._holder = None
        self._ended = None
        self._set_state(State.STANDBY)
        _log.info("this SC is a candidate for %s (lease %x): a standby until it is first", self.key, lease.id)

    async def _rejoin(self) -> None:
        if self._resigning:
            self._resigning = False
            await self._resign()  # after a loss its claim may still be in the store (an unanswered renewal)
        old, self._lease = self._lease, None
        try:
            if old is not None:
                await self.kv_store.revoke_lease(old)  # its keys go: the others need not wait for its TTL
            await self._enter()
        except kv.StoreError as error:
            if old is not None:
                self._lease = old  # revoked or not, revoked again next time (a lease gone is no error)
            _log.warning("cannot join the SC candidates again yet: %s", error)
            await asyncio.sleep(_RETRY_PAUSE_SECONDS)

    async def _campaign(self) -> None:
        """While STANDBY: look at the queue and the claim at each change of either (a watch), claim
        when first and the claim is free, and keep the lease alive. Returns on a change of state."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        next_renewal = loop.time() + self.ttl / 3
        unreachable = False
        try:
            while self.state is State.STANDBY:
                try:
                    revision = await self._look()
                    if watcher is None:
                        # The claim as this first listing has it, then each change in order (the watch).
                        self._holder, self._revision_events, self._seen_revision = self._claim_now, [], revision
                        watcher = asyncio.create_task(self._watch(revision + 1, changed), name="sc-candidates-watch")
                    if self.state is State.STANDBY and self._first() and self._no_lease:
                        await self._delete_no_lease()
                    if self.state is State.STANDBY and self._first() and self._claim_now is None:
                        await self._try_claim()
                    if self.state is not State.STANDBY:
                        return
                except kv.LeaseExpired:
                    self._lose(LEASE_LOST, f"its lease expired: the store was unreachable for longer than the {self.ttl} s TTL")
                    return
                except kv.StoreError as error:
                    if not unreachable:
                        _log.warning("cannot read the SC candidates of %s yet (%s): trying again", self.key, error)
                    unreachable = True
                    await asyncio.sleep(_RETRY_PAUSE_SECONDS)
                    changed.set()  # look again (after the lease's renewal, if due)
                else:
                    unreachable = False
                while True:
                    if loop.time() >= next_renewal:
                        next_renewal = loop.time() + self.ttl / 3
                        if not await self._keep_candidacy():
                            return
                    if changed.is_set():
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, next_renewal - loop.time())):
                            await changed.wait()
                changed.clear()
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def _keep_candidacy(self) -> bool:
        """Renew the lease of a standby; False once the candidacy is lost (LOST)."""
        assert self._lease is not None
        sent = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(_MIN_ATTEMPT_SECONDS, self.ttl / 5)):
                await self.kv_store.keep_alive(self._lease)
            self._lease_from = sent
        except kv.LeaseExpired:
            self._lose(LEASE_LOST, f"its lease expired: the store was unreachable for longer than the {self.ttl} s TTL")
            return False
        except (kv.Unavailable, TimeoutError) as error:
            _log.warning("cannot renew this standby's lease (%s); it is tried again", str(error) or "no answer")
        return True

    async def _look(self) -> int:
        """Read the queue and the claim; returns the revision read at."""
        assert self.identity is not None
        listed = await self.kv_store.list(META)
        # A candidate key no lease holds is no SC's (each holds its own under its lease): an
        # identity written by hand, or copied without its lease, would otherwise be first for good.
        values = {
            item.key: (item.value, item.create_revision)
            for item in listed.items
            if item.lease or not item.key.startswith(CANDIDATES)
        }
        self._no_lease = [
            item for item in listed.items
            if not item.lease and (item.key == KEY or queue({item.key: (item.value, item.create_revision)}))
        ]
        claim = next((item for item in listed.items if item.key == KEY), None)
        if candidate_key(self.identity.id) not in values:
            self._lose(LEASE_LOST, "its candidate key went (its lease expired, or someone deleted it)")
            return listed.revision
        self.candidates = queue(values)
        # A claim with this SC's own value is its own, made by a request whose answer was lost (a
        # retried transaction): claiming again finds it and takes it (the same lease), never waits on it.
        if claim is not None and claim.value == self.identity.encode():
            claim = None
        self._claim_now = claim
        if not self._first():
            self.settled.set()  # a standby behind another candidate
        return listed.revision

    def _first(self) -> bool:
        """First in line, not counting earlier processes at this SC's own address: they are gone
        (this one holds their port), and their keys end with their leases. A restarted SC thus
        leads once its predecessor's claim ends, as a single SC should. Only the order depends on
        it: two SCs that both believe they are first both try to claim, and one claim wins."""
        identity = self.identity
        if identity is None:
            return False
        ahead = [candidate.identity for candidate in self.candidates if not _predecessor(candidate.identity, identity)]
        return bool(ahead) and ahead[0].id == identity.id

    async def _delete_no_lease(self) -> None:
        """A claim or a candidacy no lease holds is no SC's (each SC holds both under its lease,
        and they end with it): an identity written by hand, or copied from another cluster without
        its lease, would keep every SC a standby for good (the claim), or be listed as a standby
        for good (a candidacy, which the queue already passes over). The first candidate deletes
        them, each compared on its revision (one rewritten meanwhile is left alone), then claims."""
        for item in self._no_lease:
            _log.warning(
                "%s holds %s under no lease, which no SC does: deleting it",
                f"{self.kv_store.prefix}{item.key}", describe_holder(item.value),
            )
            with contextlib.suppress(kv.Conflict, kv.NotFound):  # changed meanwhile: looked at again
                await self.kv_store.delete(item.key, item.mod_revision)
            if item.key == KEY:
                self._claim_now = None
        self._no_lease = []

    async def _try_claim(self) -> None:
        assert self.identity is not None and self._lease is not None
        claim = await self.kv_store.claim(KEY, self.identity.encode(), self._lease)
        if not claim.won:
            self._claim_now = claim.current  # someone claimed between the look and now
            return
        self._claimed_revision = claim.current.create_revision
        # The claim lives as long as the lease it is under: from the last renewal etcd answered
        # (a claim does not renew it), however recent the claim.
        self._valid_until = self._lease_from + self.ttl
        self.term += 1
        # What ended before this claim: once the watch has gone past every revision before it (a
        # moment; a watch that lags more is not waited for, and the cause is what it saw by then).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_MIN_ATTEMPT_SECONDS):
                while self._seen_revision < self._claimed_revision:
                    self._seen.clear()
                    await self._seen.wait()
        ended = self._ended
        previous = ended[0] if ended is not None else None
        self.takeover = Takeover(
            cause=ended[1] if ended is not None else UNCLAIMED_STORE,
            epoch=self._claimed_revision,
            previous=Identity.decode(previous.value) if previous is not None else None,
            previous_epoch=previous.create_revision if previous is not None else 0,
            at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        )
        self._claim_now = None
        self._set_state(State.ACTIVE)
        self.settled.set()
        previous_text = describe_holder(previous.value) if previous is not None else "none"
        _log.warning(
            "this SC is now the active SC of its store (%s, epoch %d, lease %x): takeover cause %s, previous leader %s",
            self.key, self._claimed_revision, self._lease, self.takeover.cause, previous_text,
        )

    async def _watch(self, from_revision: int, changed: asyncio.Event) -> None:
        """Set ``changed`` at every change of a candidate key or of the claim; after a broken or
        compacted watch, too (the campaign then reads everything again). Follows the claim's
        holders in revision order (_follow_claim)."""
        revision = from_revision
        while True:
            try:
                async with contextlib.aclosing(self.kv_store.watch(META, revision)) as events:
                    async for event in events:
                        revision = event.revision + 1
                        self._follow_claim(event)
                        if event.key == KEY or event.key.startswith(CANDIDATES):
                            changed.set()
                return  # the store is closing
            except kv.Compacted as compacted:
                revision = compacted.revision
            except kv.HistoryLost as lost:
                # Changes after lost.revision may not be the ones seen: the campaign reads all again.
                _log.error("the SC candidates' watch: %s", lost)
                revision = lost.revision + 1
            except kv.StoreError as error:
                _log.warning("the SC candidates' watch broke (%s): watching again after a pause", error)
                await asyncio.sleep(_RETRY_PAUSE_SECONDS)
            changed.set()

    def _follow_claim(self, event: kv.WatchEvent) -> None:
        """Take the watch's events one revision at a time (a revision's events come together, in
        one transaction's order): a claim put is the new holder; a claim deleted ended as the rest
        of its revision says: with a resignation note (resigned), with its holder's candidacy (its
        lease ended: lease-expired), or alone (someone deleted it: claim-deleted)."""
        if self._revision_events and event.revision != self._revision_events[0].revision:
            self._end_revision(self._revision_events)
            self._revision_events = []
        self._revision_events.append(event)
        if event.revision > self._seen_revision:
            # Everything before this event's revision is taken in; its own revision is once the
            # next comes, but a claim at it is its first event (a claim is a transaction of its own).
            self._seen_revision = event.revision - 1 if event.key != KEY else event.revision
            self._seen.set()
        if event.key == KEY and event.type is kv.EventType.PUT and event.value is not None:
            self._end_revision(self._revision_events)
            self._revision_events = []

    def _end_revision(self, events: Sequence[kv.WatchEvent]) -> None:
        keys = {(event.type, event.key) for event in events}
        for event in events:
            if event.key != KEY:
                continue
            if event.type is kv.EventType.PUT and event.value is not None:
                self._holder = kv.KeyValue(KEY, event.value, event.revision, event.create_revision or event.revision)
                continue
            holder = self._holder
            if holder is None:
                continue  # the claim of a holder this SC never saw: nothing to say of it
            owner = Identity.decode(holder.value)
            if (kv.EventType.PUT, RESIGNED_KEY) in keys:
                cause = RESIGNED
            elif owner is not None and (kv.EventType.DELETE, candidate_key(owner.id)) in keys:
                cause = LEASE_EXPIRED
            else:
                cause = CLAIM_DELETED
            self._ended, self._holder = (holder, cause), None

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
                self._lose(LEASE_LOST, f"its lease expired: the store was unreachable for longer than the {self.ttl} s TTL")
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
            self._lose(CLAIM_DELETED, f"{self.key} was deleted")
        elif current.create_revision != self._claimed_revision or current.value != self.identity.encode():
            self._lose(CLAIM_REPLACED, f"{self.key} was replaced: {describe_holder(current.value)} holds it")
        else:
            if self._warned_unreachable:
                self._warned_unreachable = False
                _log.warning("the active-SC lease is renewed again")
            self._valid_until = sent + ttl
            self._lease_from = sent

    def _lose(self, cause: str, because: str) -> None:
        leading = self.state is State.ACTIVE
        self._valid_until = 0.0
        self._lost_because = because
        self._set_state(State.LOST)
        if leading:
            self.losses += 1
            self.step_down_cause = cause
            self._resigning = True
            _log.error(
                "this SC lost its claim on %s (%s): it steps down to a standby and joins the queue again", self.key, because
            )
        else:
            _log.warning("this standby lost its place in the queue for %s (%s): it joins again", self.key, because)


# Why a leader stepped down (ActiveSc.step_down_cause).
LEASE_LOST = "lease-lost"  # its lease expired (the store unreachable for longer than the TTL)
FENCED = "fenced"  # the store refused one of its writes: the claim was not its own any more
CLAIM_REPLACED = "claim-replaced"  # its renewal found another value at the claim


def _predecessor(other: Identity, identity: Identity) -> bool:
    """``other`` is an earlier process of the SC at ``identity``'s address (same host and address)."""
    return other.id != identity.id and other.host == identity.host and other.address == identity.address


class GuardedStore(kv.ForwardingStore):
    """The store as this SC's pipeline and API see it: reads pass; every write is a transaction
    that also compares the store's claim with this SC's (ActiveSc.fence), so it applies only while
    this SC holds the claim in the store's own view. The fence goes first: a Conflict naming the
    claim's key is a fenced write (Fenced), any other keeps the meaning it has for the caller."""

    def __init__(self, inner: kv.KVStore, active: ActiveSc, term: int | None = None) -> None:
        super().__init__(inner)
        self.active = active
        self.term = term  # None: any term of this SC (the API); else only that one (a term's pipeline)

    def for_term(self, term: int) -> GuardedStore:
        """The same store, its writes refused once ``term`` ended: a term's controllers write
        through it, so nothing a term decided is written in a later one."""
        return GuardedStore(self.inner, self.active, term)

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
        fence = self.active.fence(self.term)
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
        fence = self.active.fence(self.term)
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
