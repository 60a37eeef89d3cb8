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
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

DEFAULT_PREFIX = "/sc/"


class StoreError(Exception):
    """Base of every error a KV backend raises."""


class Conflict(StoreError):
    """A compare-and-swap lost: the key's mod revision is not the expected one.

    Retry intent: re-read and reconcile again now.
    """

    def __init__(self, key: str, expected: int, actual: int) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        state = "absent" if actual == 0 else f"at mod revision {actual}"
        wanted = "absent" if expected == 0 else f"at mod revision {expected}"
        super().__init__(f"conflict on key {key!r}: expected it {wanted}, found it {state}")


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


class Unavailable(StoreError):
    """The store could not be reached within the request timeout; back off and retry."""


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int


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
    """Async KV contract shared by every backend; the contract test suite runs against each."""

    prefix: str

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None if it does not exist."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> ListResult:
        """Every key under ``prefix`` (sorted by key) and the store revision they were read at."""

    @abc.abstractmethod
    async def create(self, key: str, value: bytes) -> int:
        """Write a key that must not exist; returns its mod revision. Raises AlreadyExists."""

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
    def watch(self, prefix: str, from_revision: int) -> AsyncIterator[WatchEvent]:
        """Every PUT and DELETE under ``prefix`` with revision >= ``from_revision``, in order.

        Survives store restarts without losing or repeating an event. Raises Compacted if
        ``from_revision`` (or the resume point after a reconnect) is no longer available.
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


# Largest number of operations etcd accepts in one transaction by default (--max-txn-ops).
MAX_TXN_OPS = 128


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
