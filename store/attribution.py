"""Who asked for a write: the principal and address of the request in whose task a write runs (a
context variable the public port's handlers set), and a store wrapper that records them in the
history next to the write's revision. It decides no right (controller/api/auth.py does that).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from store import history, kv, models


@dataclass(frozen=True, slots=True)
class Actor:
    by: str  # a token's name, CN=<cn> of a client certificate, anonymous@loopback
    address: str | None


# Unset in the pipeline's own tasks: the SC's writes are attributed by their action records.
ACTOR: contextvars.ContextVar[Actor | None] = contextvars.ContextVar("actor", default=None)


@contextlib.contextmanager
def acting(actor: Actor) -> Iterator[None]:
    """The writes made inside (in this task, and tasks it starts) are ``actor``'s."""
    token = ACTOR.set(actor)
    try:
        yield
    finally:
        ACTOR.reset(token)


class AttributedStore(kv.ForwardingStore):
    """The store as the API sees it: each write made for an actor is recorded in the history as a
    request record (kind, name, revision, by, address) once it committed."""

    def __init__(self, inner: kv.KVStore, recorder: history.Recorder) -> None:
        super().__init__(inner)
        self.recorder = recorder

    async def create(self, key: str, value: bytes, guards: Sequence[kv.Compare] = ()) -> int:
        return self._attributed([key], await self.inner.create(key, value, guards))

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        return self._attributed([key], await self.inner.update(key, value, mod_revision))

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        return self._attributed([key], await self.inner.delete(key, mod_revision))

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        return self._attributed([operation.key for operation in operations], await self.inner.txn(compares, operations))

    def _attributed(self, keys: Sequence[str], revision: int) -> int:
        actor = ACTOR.get()
        if actor is not None:
            for key in keys:
                kind, _, name = key.partition("/")
                if name and kind in models.KINDS:  # not the bookkeeping keys (meta/...) beside them
                    self.recorder.record_request(kind, name, revision, actor.by, actor.address)
        return revision
