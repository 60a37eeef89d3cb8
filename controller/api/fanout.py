"""Watch fan-out for the HTTP API: one feed per (kind, topic filter) turns each change into event
lines once, and every subscriber gets the same bytes; a subscriber that falls more than its buffer
behind is dropped. No sockets here: controller.api.routes writes each subscriber to its connection.
"""

from __future__ import annotations

import asyncio
import collections
from collections import Counter as Tally
from collections.abc import Callable, Iterator

import structlog

from store import local, models, supervisor

log = structlog.get_logger(__name__)

# Lines per batch (bounds one write's size and the loop time it takes to build).
BATCH_LINES = 500
# Objects encoded between two yields to the loop while a feed catches up with a large change.
ENCODE_CHUNK = 500

Keep = Callable[[models.AnyObject], bool]


def event_line(event_type: bytes, revision: int, encoded: bytes) -> bytes:
    return b'{"type":"%s","revision":%d,"object":%s}' % (event_type, revision, encoded)


def sync_line(revision: int) -> bytes:
    return event_line(b"SYNC", revision, b"null")


class Batch:
    """Event lines published once for every subscriber of a feed."""

    __slots__ = ("lines", "size", "_chunk")

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.size = sum(len(line) + 1 for line in lines)
        self._chunk: bytes | None = None

    @property
    def chunk(self) -> bytes:
        """The lines as one JSON-lines write, joined on first use and then shared."""
        if self._chunk is None:
            self._chunk = b"\n".join(self.lines) + b"\n"
        return self._chunk


class Subscriber:
    """One watch stream of a feed: the state when it joined, then the batches published since.

    The batches are shared with the other subscribers; what one holds beyond ``buffer_bytes`` it
    has not taken is not kept: it is dropped (``on_drop`` aborts its connection), as a Kubernetes
    watch that falls behind is ended, and its client watches again.
    """

    def __init__(
        self,
        feed: Feed,
        snapshot: list[tuple[local.Entry[models.AnyObject], bytes]],
        revision: int,
        buffer_bytes: int,
        on_drop: Callable[[str], None],
    ) -> None:
        self.feed = feed
        self.snapshot = snapshot
        self.revision = revision
        self.buffer_bytes = buffer_bytes
        self.pending_bytes = 0
        self.dropped: str | None = None
        self.ended = False
        self._pending: collections.deque[Batch] = collections.deque()
        self._wake = asyncio.Event()
        self._on_drop = on_drop

    def snapshot_batches(self) -> Iterator[list[bytes]]:
        """Every object as ADDED, then SYNC, in batches built as they are asked for."""
        snapshot = self.snapshot
        for start in range(0, len(snapshot), BATCH_LINES):
            yield [event_line(b"ADDED", entry.mod_revision, encoded) for entry, encoded in snapshot[start : start + BATCH_LINES]]
        yield [sync_line(self.revision)]
        self.snapshot = []

    def offer(self, batch: Batch) -> None:
        if self.dropped is not None:
            return
        if self.pending_bytes + batch.size > self.buffer_bytes:
            self.drop("overflow")
            return
        self._pending.append(batch)
        self.pending_bytes += batch.size
        self._wake.set()

    async def next(self) -> list[Batch]:
        """The batches not taken yet (waits for one); [] once dropped or ended."""
        while not self._pending and self.dropped is None and not self.ended:
            self._wake.clear()
            await self._wake.wait()
        if self.dropped is not None or self.ended:
            return []
        batches = list(self._pending)
        self._pending.clear()
        self.pending_bytes = 0
        return batches

    def drop(self, reason: str) -> None:
        if self.dropped is not None:
            return
        self.dropped = reason
        self._pending.clear()
        self.pending_bytes = 0
        self._wake.set()
        self.feed.leave(self)
        self._on_drop(reason)

    def end(self) -> None:
        """No more batches wanted (the client or the SC is leaving): ``next()`` returns []."""
        self.ended = True
        self._wake.set()

    def close(self) -> None:
        self.feed.leave(self)


class Feed:
    """The changes of one kind (through one filter), encoded once, for every subscriber."""

    def __init__(self, table: local.KindStore[models.AnyObject], keep: Keep | None, encodings: Tally[str], on_idle: Callable[[Feed], None]) -> None:
        self.table = table
        self.keep = keep
        self.encodings = encodings
        self._on_idle = on_idle
        self.subscribers: set[Subscriber] = set()
        # What the subscribers have been told, with each object's encoding; in the order of last change.
        self.known: dict[str, tuple[local.Entry[models.AnyObject], bytes]] = {}
        self.revision = 0
        self.closed = False
        self._listener = table.listener(local.Part.ALL)
        self._lock = asyncio.Lock()
        self._joining = 0
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch-feed-{table.kind}")

    async def join(self, buffer_bytes: int, on_drop: Callable[[str], None]) -> Subscriber:
        """A new subscriber, given the state the others have been told (brought up to date first)."""
        self._joining += 1
        try:
            async with self._lock:
                await self._catch_up()
                subscriber = Subscriber(self, list(self.known.values()), self.revision, buffer_bytes, on_drop)
                self.subscribers.add(subscriber)
                return subscriber
        finally:
            self._joining -= 1

    def leave(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)
        if not self.subscribers and not self._joining and not self.closed:
            self.close()

    def close(self) -> None:
        self.closed = True
        self._task.cancel()
        self._listener.close()
        self._on_idle(self)

    async def wait_closed(self) -> None:
        await supervisor.cancel_and_wait(self._task)  # cancelled by close() already

    async def _run(self) -> None:
        try:
            while True:
                await self._listener.wait()
                async with self._lock:
                    await self._catch_up()
        except Exception:
            # A bug here must not leave every watcher of the kind waiting for events that never come.
            log.exception("a watch feed failed: its watchers are dropped and may watch again", kind=self.table.kind)
            for subscriber in list(self.subscribers):
                subscriber.drop("error")

    async def _catch_up(self) -> None:
        changes = self._listener.changes()
        if changes.empty:
            return
        revision = self.table.revision
        lines = await self._events(changes, revision, telling=bool(self.subscribers))
        self.revision = revision
        for start in range(0, len(lines), BATCH_LINES):
            batch = Batch(lines[start : start + BATCH_LINES])
            for subscriber in list(self.subscribers):
                subscriber.offer(batch)

    async def _events(self, changes: local.Changes[models.AnyObject], revision: int, telling: bool) -> list[bytes]:
        """The event lines that bring the subscribers from ``known`` to ``changes``; updates ``known``.
        Without subscribers (a new feed) only ``known`` is built."""
        known, keep = self.known, self.keep
        lines: list[bytes] = []
        updated = [entry for entry in changes.updated if keep is None or keep(entry.obj)]
        if changes.full:
            fresh = {entry.name for entry in updated}
            for name in [name for name in known if name not in fresh]:
                _, encoded = known.pop(name)
                if telling:
                    lines.append(event_line(b"DELETED", revision, encoded))
        encoded_now = 0
        recreated = {entry.name for entry in updated} & set(changes.deleted) if changes.deleted else set()
        for entry in updated:
            if encoded_now and encoded_now % ENCODE_CHUNK == 0:
                await asyncio.sleep(0)
            if entry.name in recreated:
                # Deleted and created again: the old object's end first (by the new one's creation
                # it was gone), then the new one.
                gone = known.pop(entry.name, None)
                if gone is not None and telling:
                    lines.append(event_line(b"DELETED", entry.create_revision, gone[1]))
            previous = known.get(entry.name)
            if previous is not None and (previous[0].obj is entry.obj or previous[0].obj == entry.obj):
                known[entry.name] = (entry, previous[1])  # same object written again: nothing to tell
                continue
            encoded = models.encode(entry.obj)
            encoded_now += 1
            known.pop(entry.name, None)
            known[entry.name] = (entry, encoded)
            if telling:
                lines.append(event_line(b"ADDED" if previous is None else b"MODIFIED", entry.mod_revision, encoded))
        self.encodings[self.table.kind] += encoded_now
        for name in changes.deleted:
            if name in recreated:
                continue
            gone = known.pop(name, None)
            if gone is not None and telling:
                lines.append(event_line(b"DELETED", revision, gone[1]))
        return lines


class Feeds:
    """The feeds of one API: created by the first subscriber of a (kind, filter), closed with the last."""

    def __init__(self, local_store: local.LocalStore, encodings: Tally[str]) -> None:
        self.local_store = local_store
        self.encodings = encodings
        self._feeds: dict[tuple[str, str | None], Feed] = {}
        self._closing: set[Feed] = set()

    async def subscribe(
        self, kind: str, topic: str | None, keep: Keep | None, buffer_bytes: int, on_drop: Callable[[str], None]
    ) -> Subscriber:
        key = (kind, topic)
        feed = self._feeds.get(key)
        if feed is None or feed.closed:
            feed = self._feeds[key] = Feed(self.local_store[kind], keep, self.encodings, lambda idle: self._idle(key, idle))
        return await feed.join(buffer_bytes, on_drop)

    def _idle(self, key: tuple[str, str | None], feed: Feed) -> None:
        if self._feeds.get(key) is feed:
            del self._feeds[key]
        self._closing.add(feed)
        feed._task.add_done_callback(lambda _: self._closing.discard(feed))

    def __len__(self) -> int:
        return len(self._feeds)

    async def close(self) -> None:
        for feed in list(self._feeds.values()):
            feed.close()
        await asyncio.gather(*(feed.wait_closed() for feed in list(self._closing)))
