"""Keeps the daemon's long-lived asyncio tasks running: a task that raises is logged with its
traceback, counted and started again from its factory after a backoff; one that keeps failing is
reported for /healthz. In the lowest layer so every layer's tasks share it; it knows no task's work.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger(__name__)

# A task's coroutine, made afresh for every (re)start: each start begins from a clean state.
Factory = Callable[[], Awaitable[None]]

INITIAL_BACKOFF = 0.1
MAX_BACKOFF = 5.0
# A run that lasts this long was healthy: the backoff starts over and the task is no longer failing.
HEALTHY_AFTER = 5.0
# This many failures in a row, each before the run was healthy, make the task "failing".
FAILING_AFTER = 3
_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class Failing:
    """A task that keeps failing: its name, its failures in a row and the last one's error."""

    task: str
    failures: int
    last_error: str

    def describe(self) -> str:
        return f"task {self.task} keeps failing: {self.last_error}"


class _Record:
    __slots__ = ("failures", "last_error", "running_since")

    def __init__(self) -> None:
        self.failures = 0  # in a row, each before the run had been healthy
        self.last_error = ""
        self.running_since: float | None = None  # None while waiting out a backoff


class Supervisor:
    """Runs named tasks, restarting each after an unexpected exception.

    A task ends for good when its coroutine returns or when its task is cancelled (its owner
    stops it as before: cancel the returned task). A ``CancelledError`` that does not come from
    a cancellation of the task itself (a gRPC call cancelled underneath it) is a failure.
    """

    def __init__(
        self,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        healthy_after: float = HEALTHY_AFTER,
        failing_after: int = FAILING_AFTER,
    ) -> None:
        if not 0 < initial_backoff <= max_backoff:
            raise ValueError(f"backoff must be 0 < initial ({initial_backoff}) <= max ({max_backoff})")
        if failing_after < 1:
            raise ValueError(f"failing_after must be at least 1, got {failing_after}")
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.healthy_after = healthy_after
        self.failing_after = failing_after
        # Restarts per task name since this supervisor was made (a counter: never decreases).
        self.restarts: collections.Counter[str] = collections.Counter()
        self._running: dict[str, _Record] = {}

    @property
    def tasks(self) -> list[str]:
        """The names of the tasks running (or waiting to restart) now."""
        return sorted(self._running)

    def spawn(self, name: str, factory: Factory) -> asyncio.Task[None]:
        """Run ``factory()`` as the task ``name``, and again after each unexpected exception."""
        if name in self._running:
            raise ValueError(f"a task named {name!r} is already supervised")
        record = self._running[name] = _Record()
        self.restarts.setdefault(name, 0)
        return asyncio.create_task(self._keep(name, factory, record), name=name)

    def failing(self) -> list[Failing]:
        """The tasks that keep failing now, by name."""
        now = asyncio.get_running_loop().time()
        found = []
        for name, record in sorted(self._running.items()):
            if record.failures < self.failing_after:
                continue
            if record.running_since is not None and now - record.running_since >= self.healthy_after:
                continue  # it has run healthily since: _keep resets the count at its next failure
            found.append(Failing(name, record.failures, record.last_error))
        return found

    async def _keep(self, name: str, factory: Factory, record: _Record) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.initial_backoff
        try:
            while True:
                record.running_since = started = loop.time()
                try:
                    await factory()
                    return
                except asyncio.CancelledError as cancelled:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise
                    error: BaseException = cancelled
                except Exception as raised:
                    error = raised
                record.running_since = None
                if loop.time() - started >= self.healthy_after:
                    record.failures = 0
                    backoff = self.initial_backoff
                record.failures += 1
                record.last_error = _describe(error)
                self.restarts[name] += 1
                _log.error(
                    "task %s failed (%s); restarting it in %.1f s (failure %d in a row, restart %d)",
                    name, record.last_error, backoff, record.failures, self.restarts[name],
                    exc_info=error,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
        finally:
            del self._running[name]


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has ended.

    What a task raises as it ends is retrieved, and a failure other than its cancellation is
    logged, not raised: the caller is closing, and the others must close too. A cancel of the
    caller while it waits is raised (``with suppress(CancelledError): await task`` swallowed it).
    """
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    try:
        await asyncio.wait(set(tasks))
    except BaseException:
        for task in tasks:
            task.add_done_callback(_retrieve)
        raise
    for task in tasks:
        _retrieve(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
        _log.warning("task %s ended with an error when it was cancelled: %s", name, _describe(error))


def _describe(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]  # a task group's one failure: name it, not the group
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."
