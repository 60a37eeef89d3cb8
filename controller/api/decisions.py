"""The SC's latest decisions (each action applied or refused, with its reason and cause) for the
live page: a bounded ring, and the watch streams of /v1/watch/events fed from it. No sockets and
no writes here: the pipeline reports its results, controller.api.routes streams them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable, Iterator

from controller.api import fanout

# Decisions a new watcher gets first (about 400 bytes each: the ring holds some 200 KB at most).
RING_DECISIONS = 500


class _Subscriber(fanout.Subscriber):
    """A watcher of the decisions: the ring as it was when it joined, then each decision."""

    def __init__(self, source: Decisions, lines: list[bytes], revision: int, buffer_bytes: int, on_drop: Callable[[str], None]) -> None:
        super().__init__(source, [], revision, buffer_bytes, on_drop)  # type: ignore[arg-type]  # only leave() is used
        self.lines = lines

    def snapshot_batches(self) -> Iterator[list[bytes]]:
        lines = self.lines
        for start in range(0, len(lines), fanout.BATCH_LINES):
            yield lines[start : start + fanout.BATCH_LINES]
        yield [fanout.sync_line(self.revision)]
        self.lines = []


class Decisions:
    """The last ``capacity`` decisions as event lines, and their watchers. ``record`` never blocks and
    never fails for a slow watcher: the decisions of one turn of the loop go out as one batch, and a
    watcher more than its buffer behind is dropped (as a watcher of objects is, fanout.Subscriber)."""

    def __init__(self, capacity: int = RING_DECISIONS, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.ring: collections.deque[bytes] = collections.deque(maxlen=capacity)
        self.revision = 0
        self.subscribers: set[_Subscriber] = set()
        self._unsent: list[bytes] = []

    def record(
        self, kind: str, name: str, verb: str, reason: str, cause: str, outcome: str, revision: int, detail: str = ""
    ) -> None:
        decision = {
            "time": round(self.clock(), 3), "kind": kind, "name": name, "verb": verb, "cause": cause,
            "reason": reason, "outcome": outcome, "revision": revision, "detail": detail,
        }
        line = fanout.event_line(b"ADDED", revision, json.dumps(decision, separators=(",", ":")).encode())
        self.ring.append(line)
        self.revision = max(self.revision, revision)
        if not self.subscribers:
            return
        if not self._unsent:
            asyncio.get_running_loop().call_soon(self._publish)
        self._unsent.append(line)

    def _publish(self) -> None:
        lines, self._unsent = self._unsent, []
        for start in range(0, len(lines), fanout.BATCH_LINES):
            batch = fanout.Batch(lines[start : start + fanout.BATCH_LINES])
            for subscriber in list(self.subscribers):
                subscriber.offer(batch)

    async def subscribe(self, buffer_bytes: int, on_drop: Callable[[str], None]) -> fanout.Subscriber:
        """A new watcher, given the ring as it is now (what is still to be published included)."""
        if self._unsent:
            self._publish()
        subscriber = _Subscriber(self, list(self.ring), self.revision, buffer_bytes, on_drop)
        self.subscribers.add(subscriber)
        return subscriber

    def leave(self, subscriber: fanout.Subscriber) -> None:
        self.subscribers.discard(subscriber)
