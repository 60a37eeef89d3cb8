"""What the public port lets in: a gate for expensive reads (whole lists, placements, dry runs) with a
short queue and a deadline, one worker thread for CPU-heavy answers, and the registry of open watch
streams (limits, counts, drops). Decides nothing about objects; does no network I/O.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import math
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")

# A client refused a watch stream is told to come back after this long (a watcher slot frees up
# when a stream ends, which the SC cannot predict).
WATCHER_RETRY_SECONDS = 5

# What a gate slot was taken for (the label of the metrics).
LIST = "list"
PLACEMENT = "placement"
DRY_RUN = "dry-run"
FLUVIO_LIST = "fluvio-list"
REBALANCE = "rebalance"  # a rebalance or decommission plan, dry run or not
PURPOSES = (LIST, PLACEMENT, DRY_RUN, FLUVIO_LIST, REBALANCE)


class Busy(Exception):
    """Refused because of load, not because of the request: retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class Gate:
    """At most ``limit`` expensive requests run at once; up to ``queue`` more wait, first come first
    served, at most ``wait`` seconds each; the others are refused at once with Busy.

    The queue is there for bursts; the refusal is what keeps a flood of reads from taking the
    memory and the event loop that SPU heartbeats, health checks and the controllers need.
    """

    def __init__(self, limit: int, queue: int, wait: float) -> None:
        if limit < 1:
            raise ValueError(f"a gate needs at least one slot, got {limit}")
        self.limit = limit
        self.queue = queue
        self.wait = wait
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.admitted: Tally[str] = Tally()
        self.refused: Tally[str] = Tally()
        # One thread: with the GIL, a second would not answer sooner, only take more of the loop's time.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def retry_after(self) -> int:
        """Seconds a refused client should wait: by then the queue has turned over."""
        return max(1, math.ceil(self.wait))

    @contextlib.asynccontextmanager
    async def slot(self, purpose: str) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``; raises Busy if none comes in time."""
        await self.acquire(purpose)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, purpose: str) -> None:
        """One slot, to be given back with ``release()`` (prefer ``slot()`` where a block fits)."""
        if self.running < self.limit and not self._waiters:
            self.running += 1
            self.admitted[purpose] += 1
            return
        if len(self._waiters) >= self.queue:
            self.refused[purpose] += 1
            raise Busy(
                f"the SC is busy: {self.running} expensive requests (lists, placements, dry runs) are running "
                f"and {len(self._waiters)} are waiting, the most it takes (max_expensive_requests={self.limit}, "
                f"max_expensive_queue={self.queue}); retry in {self.retry_after} s, or list in pages with ?limit=",
                self.retry_after,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.wait):
                await waiter
        except TimeoutError:
            self._give_back(waiter)
            self.refused[purpose] += 1
            raise Busy(
                f"the SC is busy: this request waited {self.wait:g} s for one of the {self.limit} slots for expensive "
                f"requests (max_expensive_requests) and got none; retry in {self.retry_after} s, or list in pages "
                "with ?limit=",
                self.retry_after,
            ) from None
        except BaseException:
            self._give_back(waiter)
            raise
        self.admitted[purpose] += 1

    def _give_back(self, waiter: asyncio.Future[None]) -> None:
        """A waiter that leaves: out of the queue, or, if a slot was handed to it meanwhile, the slot passed on."""
        if waiter.done() and not waiter.cancelled():
            self.release()
        else:
            waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes straight to the next in line
                return
        self.running -= 1

    async def offload(self, function: Callable[..., T], *args: object) -> T:
        """``function(*args)`` in the gate's worker thread, so that pure CPU work (placement, encoding a
        large answer) does not stop the event loop. The caller holds a slot: that bounds the queue."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sc-expensive")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(function, *args))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class Watcher:
    """One admitted watch stream; ``release()`` when it ends (idempotent), ``dropped()`` if the SC ended it."""

    def __init__(self, registry: Watchers, protocol: str, kind: str, address: str) -> None:
        self._registry = registry
        self.protocol = protocol
        self.kind = kind
        self.address = address
        self._released = False

    def dropped(self, reason: str) -> None:
        self._registry.dropped[(self.protocol, reason)] += 1

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        registry = self._registry
        registry.open[(self.protocol, self.kind)] -= 1
        registry.by_address[self.address] -= 1
        if not registry.by_address[self.address]:
            del registry.by_address[self.address]


class Watchers:
    """The watch streams open now, by protocol, kind and client address, within two limits."""

    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = per_address
        self.open: Tally[tuple[str, str]] = Tally()
        self.by_address: Tally[str] = Tally()
        self.refused: Tally[str] = Tally()
        self.dropped: Tally[tuple[str, str]] = Tally()
        # Objects encoded for HTTP watch streams, by kind (one per change, however many watchers).
        self.encodings: Tally[str] = Tally()

    @property
    def total(self) -> int:
        return sum(self.open.values())

    def admit(self, protocol: str, kind: str, address: str) -> Watcher:
        """A new watch stream, or Busy naming the limit it would pass."""
        if self.total >= self.limit:
            self.refused[protocol] += 1
            raise Busy(
                f"the SC already serves {self.total} watch streams, its limit (max_watchers={self.limit}); "
                f"retry in {WATCHER_RETRY_SECONDS} s",
                WATCHER_RETRY_SECONDS,
            )
        if self.by_address[address] >= self.per_address:
            self.refused[protocol] += 1
            raise Busy(
                f"the SC already serves {self.by_address[address]} watch streams to {address}, the limit for one "
                f"address (max_watchers_per_address={self.per_address}); close some or retry in "
                f"{WATCHER_RETRY_SECONDS} s",
                WATCHER_RETRY_SECONDS,
            )
        self.open[(protocol, kind)] += 1
        self.by_address[address] += 1
        return Watcher(self, protocol, kind, address)
