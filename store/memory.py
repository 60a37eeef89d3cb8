"""In-memory KV backend with etcd's revision, compare-and-swap, compaction and watch semantics.

For ephemeral runs (`sc run --store memory`) and fast tests; it passes the same contract suite as
etcd. State lives in this process only; nothing here touches the disk or the network.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from store import kv


@dataclass(slots=True)
class _Record:
    value: bytes
    create_revision: int
    mod_revision: int


@dataclass(slots=True)
class _Lease:
    ttl: int
    expires: float  # on the loop clock
    # Key -> the mod revision it was claimed at: a later write of the key detaches it.
    keys: dict[str, int]
    timer: asyncio.TimerHandle | None = None


class MemoryStore(kv.KVStore):
    def __init__(
        self, prefix: str = kv.DEFAULT_PREFIX, max_request_bytes: int = kv.DEFAULT_MAX_REQUEST_BYTES, history_limit: int | None = None
    ) -> None:
        """``history_limit``: the most watch events kept; past it the older half is compacted away,
        as etcd's auto-compaction does (a watcher that far behind is told Compacted and lists
        again). None keeps every event (tests that watch from the start)."""
        if max_request_bytes <= kv.REQUEST_ENVELOPE_BYTES:
            raise ValueError(f"max_request_bytes must be above {kv.REQUEST_ENVELOPE_BYTES}, got {max_request_bytes}")
        if history_limit is not None and history_limit < 2:
            raise ValueError(f"history_limit must be at least 2 events, got {history_limit}")
        self.history_limit = history_limit
        self.prefix = prefix
        # etcd's request limit, enforced here too: what a memory run accepts, etcd accepts.
        self.max_request_bytes = max_request_bytes
        self._request_size = kv.RequestSize(prefix, max_request_bytes)
        self._data: dict[str, _Record] = {}
        self._sorted_keys: list[str] = []
        self._revision = 1  # etcd starts an empty cluster at revision 1
        self._compact_revision = 0
        # Every change since the last compaction, in revision order (one revision may hold
        # several events when a transaction wrote several keys).
        self._history: list[kv.WatchEvent] = []
        self._changed = asyncio.Condition()
        self._closed = False
        self._leases: dict[int, _Lease] = {}
        self._last_lease_id = 0
        self._expiries: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> kv.KeyValue | None:
        self._check_open()
        record = self._data.get(key)
        return None if record is None else self._key_value(key, record)

    async def list(self, prefix: str) -> kv.ListResult:
        self._check_open()
        start = bisect.bisect_left(self._sorted_keys, prefix)
        items = []
        for key in self._sorted_keys[start:]:
            if not key.startswith(prefix):
                break
            items.append(self._key_value(key, self._data[key]))
        return kv.ListResult(items=items, revision=self._revision)

    async def revision(self) -> int:
        self._check_open()
        return self._revision

    # ------------------------------------------------------------------ writes

    async def create(self, key: str, value: bytes, guards: Sequence[kv.Compare] = ()) -> int:
        kv.check_guards(guards)
        size = self._request_size.create_bytes(key, len(value)) + self._request_size.guards_bytes(guards)
        if size > self._request_size.budget:
            raise kv.TooLarge(size, self.max_request_bytes)
        self._check_open()
        for guard in guards:
            record = self._data.get(guard.key)
            actual = 0 if record is None else record.mod_revision
            if actual != guard.mod_revision:
                raise kv.Conflict(guard.key, guard.mod_revision, actual)
        existing = self._data.get(key)
        if existing is not None:
            raise kv.AlreadyExists(key, existing.mod_revision)
        return await self.txn([*guards, kv.Compare(key, 0)], [kv.Put(key, value)])

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        if key not in self._data:
            raise kv.NotFound(key)
        return await self.txn([kv.Compare(key, mod_revision)], [kv.Put(key, value)])

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        record = self._data.get(key)
        if record is None:
            raise kv.NotFound(key)
        expected = record.mod_revision if mod_revision is None else mod_revision
        return await self.txn([kv.Compare(key, expected)], [kv.Delete(key)])

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        self._check_open()
        kv.check_txn_length(compares, operations)
        self._request_size.check(compares, operations)
        failed = []
        for compare in compares:
            record = self._data.get(compare.key)
            actual = 0 if record is None else record.mod_revision
            if actual != compare.mod_revision:
                failed.append((compare.key, compare.mod_revision, actual))
        if failed:
            raise kv.Conflict.of(failed)
        keys = [operation.key for operation in operations]
        if len(set(keys)) != len(keys):
            raise ValueError("a transaction may not write the same key twice")
        effective = [
            operation
            for operation in operations
            if isinstance(operation, kv.Put) or operation.key in self._data
        ]
        if not effective:
            return self._revision
        self._revision += 1
        revision = self._revision
        for operation in effective:
            if isinstance(operation, kv.Put):
                record = self._data.get(operation.key)
                if record is None:
                    record = self._data[operation.key] = _Record(operation.value, revision, revision)
                    bisect.insort(self._sorted_keys, operation.key)
                else:
                    record.value = operation.value
                    record.mod_revision = revision
                self._history.append(
                    kv.WatchEvent(kv.EventType.PUT, operation.key, operation.value, revision, record.create_revision)
                )
            else:
                del self._data[operation.key]
                del self._sorted_keys[bisect.bisect_left(self._sorted_keys, operation.key)]
                self._history.append(kv.WatchEvent(kv.EventType.DELETE, operation.key, None, revision))
        if self.history_limit is not None and len(self._history) > self.history_limit:
            # The newer half stays (whole revisions: from the revision of its first event).
            self._compact(self._history[len(self._history) - self.history_limit // 2].revision)
        async with self._changed:
            self._changed.notify_all()
        return revision

    async def compact(self, revision: int) -> None:
        self._check_open()
        if revision > self._revision:
            raise ValueError(
                f"cannot compact at revision {revision}: the store is only at revision {self._revision}"
            )
        self._compact(revision)

    def _compact(self, revision: int) -> None:
        if revision <= self._compact_revision:
            return
        self._compact_revision = revision
        # Keep the events of `revision` itself and later: watching from `revision` still works.
        first_kept = bisect.bisect_left(self._history, revision, key=lambda event: event.revision)
        del self._history[:first_kept]

    # ------------------------------------------------------------------ leases (expiry on the loop clock)

    async def grant_lease(self, ttl: int) -> kv.Lease:
        self._check_open()
        if ttl < 1:
            raise ValueError(f"a lease lasts at least 1 second, got a TTL of {ttl}")
        self._last_lease_id += 1
        lease = _Lease(ttl, 0.0, {})
        self._leases[self._last_lease_id] = lease
        self._renew(self._last_lease_id, lease)
        return kv.Lease(self._last_lease_id, ttl)

    async def keep_alive(self, lease: int) -> int:
        self._check_open()
        found = self._live_lease(lease)
        self._renew(lease, found)
        return found.ttl

    async def revoke_lease(self, lease: int) -> None:
        self._check_open()
        found = self._leases.pop(lease, None)
        if found is not None:
            if found.timer is not None:
                found.timer.cancel()
            await self._delete_leased(found)

    async def claim(self, key: str, value: bytes, lease: int) -> kv.Claim:
        self._check_open()
        found = self._live_lease(lease)
        existing = self._data.get(key)
        if existing is not None:
            ours = found.keys.get(key) == existing.mod_revision and existing.value == value
            return kv.Claim(ours, self._key_value(key, existing))
        revision = await self.txn([kv.Compare(key, 0)], [kv.Put(key, value)])
        found.keys[key] = revision
        return kv.Claim(True, kv.KeyValue(key, value, revision, revision, lease))

    def _live_lease(self, lease: int) -> _Lease:
        found = self._leases.get(lease)
        if found is None or asyncio.get_running_loop().time() >= found.expires:
            raise kv.LeaseExpired(lease)  # an expired one is being deleted by _expire
        return found

    def _renew(self, lease_id: int, lease: _Lease) -> None:
        loop = asyncio.get_running_loop()
        lease.expires = loop.time() + lease.ttl
        if lease.timer is not None:
            lease.timer.cancel()
        lease.timer = loop.call_at(lease.expires, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None or self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._delete_leased(lease))
        self._expiries.add(task)
        task.add_done_callback(self._expiries.discard)

    async def _delete_leased(self, lease: _Lease) -> None:
        """Delete the lease's keys still as it claimed them (at one revision per 128 keys)."""
        while True:
            # Looked up right before each transaction, whose compares run before it awaits.
            attached = [
                (key, revision)
                for key, revision in lease.keys.items()
                if (record := self._data.get(key)) is not None and record.mod_revision == revision
            ][: kv.MAX_TXN_OPS]
            if not attached or self._closed:
                return
            await self.txn([kv.Compare(key, revision) for key, revision in attached], [kv.Delete(key) for key, _ in attached])

    # ------------------------------------------------------------------ watch

    async def watch(self, prefix: str, from_revision: int) -> AsyncGenerator[kv.WatchEvent, None]:
        self._check_open()
        next_revision = from_revision if from_revision > 0 else self._revision + 1
        while not self._closed:
            if next_revision < self._compact_revision:
                raise kv.Compacted(next_revision, self._compact_revision)
            start = bisect.bisect_left(self._history, next_revision, key=lambda event: event.revision)
            pending = self._history[start:]
            for event in pending:
                if event.key.startswith(prefix):
                    yield event
                # Advance per event: if the consumer is slow and a compaction happens while it
                # holds this generator suspended, the next loop checks from the right place.
                next_revision = event.revision + 1
            if pending:
                continue
            async with self._changed:
                if self._revision < next_revision and not self._closed:
                    await self._changed.wait()

    async def close(self) -> None:
        self._closed = True
        for lease in self._leases.values():
            if lease.timer is not None:
                lease.timer.cancel()
        for task in self._expiries:
            task.cancel()
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed:
            raise kv.Unavailable("the memory store is closed")

    def _key_value(self, key: str, record: _Record) -> kv.KeyValue:
        # The lease that claimed the key at its current revision (a later write detached any other).
        leases = self._leases
        lease = next((lease_id for lease_id, held in leases.items() if held.keys.get(key) == record.mod_revision), 0) if leases else 0
        return kv.KeyValue(key, record.value, record.mod_revision, record.create_revision, lease)
