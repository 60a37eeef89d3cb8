"""List answers for the HTTP API and Fluvio's List: each kind's names in list order (an index kept
current from a listener), pages that resume after the last key of an opaque continue token, and
whole answers built once per store version and shared by identical lists. Reads the local store;
writes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import collections
import json
import math
import sys
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from controller.api import admission
from store import local, models

# The most objects one page may hold (?limit=).
MAX_LIMIT = 10_000
# Objects encoded between two yields to the loop: a list of 100,000 partitions must not hold up
# the health checks, SPU heartbeats and controllers while it is encoded.
ENCODE_CHUNK = 1000
# Continue tokens this SC issues are far shorter; a longer one is not ours.
MAX_TOKEN_LENGTH = 512
TOKEN_VERSION = 1
# More changes than this since the index last looked: sort again rather than insert one by one.
RESORT_AT = 256
# A kept answer that differs from what a request would see only in what is shown beside the store
# (the leaders' live offsets, reported every 0.4 s) is reused for this long: under steady replication
# traffic the offsets change on every report, and building 10,000 partitions again for each request
# was most of what a burst of lists cost. Never applied to a change of the store itself.
SHOWN_REUSE_SECONDS = 1.0

SortKey = tuple[Any, ...]


class TokenError(ValueError):
    """A continue token that is not one this SC issued for this listing."""


# ---------------------------------------------------------------------------- list order


def _partition_key(name: str) -> SortKey:
    topic, _, index = name.rpartition("-")
    return (topic, int(index))


def _name_key(name: str) -> SortKey:
    return (name,)


def key_function(table: local.KindStore[models.AnyObject]) -> Callable[[str], SortKey]:
    """The list order of a kind, as a key of a name in ``table``: SPUs by id then name, partitions by
    topic then index, the others by name."""
    if table.kind == "partitions":
        return _partition_key
    if table.kind == "spus":
        view = table.view
        return lambda name: (view[name].obj.spec.id, name)
    return _name_key


class SortedNames:
    """One kind's names in list order, brought up to date from a listener on specs whenever read.

    Inserting the few names created since the last read is O(log n) each, where sorting again
    would take 0.1 s for 100,000 partitions. SPUs sort by a spec field, not by name: their (small)
    table is sorted again after any change.
    """

    def __init__(self, table: local.KindStore[models.AnyObject]) -> None:
        self.table = table
        self.key = key_function(table)
        self._by_name = table.kind != "spus"
        self._listener: local.Listener[models.AnyObject] | None = None
        self._names: list[str] = []

    def current(self) -> list[str]:
        """The names now; valid until the caller next awaits (like a snapshot)."""
        if self._listener is None:
            self._listener = self.table.listener(local.Part.SPEC)
        changes = self._listener.changes()
        if changes.empty:
            return self._names
        if changes.full or not self._by_name or len(changes.updated) + len(changes.deleted) > RESORT_AT:
            self._names = sorted(self.table.view, key=self.key)
            return self._names
        names, key = self._names, self.key
        for name in changes.deleted:
            index = bisect.bisect_left(names, key(name), key=key)
            if index < len(names) and names[index] == name:
                del names[index]
        for entry in changes.updated:
            name = entry.name
            index = bisect.bisect_left(names, key(name), key=key)
            if index == len(names) or names[index] != name:
                names.insert(index, name)
        return names

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


# ---------------------------------------------------------------------------- continue tokens


def encode_token(kind: str, topic: str | None, after: SortKey) -> str:
    """An opaque token: the listing it belongs to and the last key handed out."""
    document = {"v": TOKEN_VERSION, "kind": kind, "topic": topic, "after": list(after)}
    raw = json.dumps(document, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_token(token: str, kind: str, topic: str | None) -> SortKey:
    """The key a page resumes after; TokenError saying why when the token is not ours or is for
    another listing."""
    if len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        raise TokenError("it is not a token this SC issued (too long, or not ASCII)")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        document = json.loads(raw)
    except (binascii.Error, ValueError):
        raise TokenError("it is not a token this SC issued (it does not decode)") from None
    if not isinstance(document, dict) or set(document) != {"v", "kind", "topic", "after"} or document["v"] != TOKEN_VERSION:
        raise TokenError("it is not a token this SC issued")
    if document["kind"] != kind or document["topic"] != topic:
        issued = f"{document['kind']}" + (f" of topic {document['topic']!r}" if document["topic"] is not None else "")
        wanted = kind + (f" of topic {topic!r}" if topic is not None else "")
        raise TokenError(f"it was issued for a listing of {issued}, not of {wanted}: pass the same kind and filter")
    after = document["after"]
    if not isinstance(after, list) or not _valid_key(kind, after):
        raise TokenError("it is not a token this SC issued (its position is malformed)")
    return tuple(after)


def _valid_key(kind: str, parts: list[Any]) -> bool:
    def text(value: Any) -> bool:
        return isinstance(value, str) and len(value) <= 2 * models.NAME_MAX_LENGTH

    def number(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63

    if kind == "partitions":
        return len(parts) == 2 and text(parts[0]) and number(parts[1])
    if kind == "spus":
        return len(parts) == 2 and number(parts[0]) and text(parts[1])
    return len(parts) == 1 and text(parts[0])


# ---------------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class Answer:
    """Encoded objects (a JSON array, or for Fluvio a List body), the store revision they reflect, and
    for a page that is not the last, the key the next page resumes after."""

    body: bytes
    revision: int
    next_after: SortKey | None = None


@dataclass(frozen=True, slots=True)
class _Kept:
    answer: Answer
    epoch: int
    extra: Hashable
    built_at: float


@dataclass(slots=True)
class _Build:
    task: asyncio.Task[Answer]
    # The table epoch its objects were taken at (None until then): a request at a later epoch must
    # not be answered with what was taken before the change it may have made itself.
    epoch: int | None = None


# What a kept answer costs besides its body: its group's key, the entry and the answer objects
# (tracemalloc: about 560 bytes for an empty one). Counted, so that answers of many distinct
# filters (`?topic=` of topics deleted or never there) stay within the budget too; counting the
# body alone let some 33 million empty answers pass for 64 MiB.
ENTRY_BYTES = 600
# The part of ENTRY_BYTES that is the group's key: a kind and a topic name. A longer key counts
# beyond it: a Fluvio List's name filters are in its key, up to a 16 MiB frame of them, and
# answers to lists of distinct long filters, each counted at ENTRY_BYTES, held gigabytes.
KEY_BYTES_IN_ENTRY = 256


def key_bytes(group: Hashable) -> int:
    """About the memory ``group`` holds: its tuples and what they hold (strings, numbers, None)."""
    if isinstance(group, tuple):
        return sys.getsizeof(group) + sum(key_bytes(part) for part in group)
    return sys.getsizeof(group)


def kept_bytes(answer: Answer, group: Hashable = ()) -> int:
    return ENTRY_BYTES + len(answer.body) + max(0, key_bytes(group) - KEY_BYTES_IN_ENTRY)


class Answers:
    """Built answers, the latest of each group kept within a byte budget (least recently used out
    first); one build per group at a time, which concurrent requests for the same group share.

    A group is what is listed (protocol, kind, filter); its answer is kept for one table epoch
    and one ``extra`` (what the answer shows besides the store, such as live offsets; a differing
    extra is accepted for SHOWN_REUSE_SECONDS).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._kept: collections.OrderedDict[Hashable, _Kept] = collections.OrderedDict()
        self._building: dict[Hashable, _Build] = {}
        # How each answer was given: "cached" (built before), "shared" (joined a build), "built".
        self.served: Tally[str] = Tally()

    def __len__(self) -> int:
        """The answers kept now."""
        return len(self._kept)

    async def get(
        self,
        group: Hashable,
        epoch: int,
        extra: Hashable,
        build: Callable[[Callable[[int], None]], Awaitable[Answer]],
    ) -> Answer:
        """The answer for ``group`` at table ``epoch`` (and ``extra``); ``build(taken)`` makes one and
        calls ``taken(epoch)`` at the moment it takes the objects."""
        kept = self._kept.get(group)
        now = asyncio.get_running_loop().time()
        if kept is not None and kept.epoch == epoch and (kept.extra == extra or now - kept.built_at < SHOWN_REUSE_SECONDS):
            self._kept.move_to_end(group)
            self.served["cached"] += 1
            return kept.answer
        running = self._building.get(group)
        if running is not None and (running.epoch is None or running.epoch >= epoch):
            self.served["shared"] += 1
            return await asyncio.shield(running.task)
        self.served["built"] += 1
        return await asyncio.shield(self._start(group, extra, build).task)

    def _start(self, group: Hashable, extra: Hashable, build: Callable[[Callable[[int], None]], Awaitable[Answer]]) -> _Build:
        async def run() -> Answer:
            def taken(epoch: int) -> None:
                state.epoch = epoch

            built_at = asyncio.get_running_loop().time()
            try:
                answer = await build(taken)
            finally:
                if self._building.get(group) is state:
                    del self._building[group]
            if state.epoch is not None:
                self._keep(group, _Kept(answer, state.epoch, extra, built_at))
            return answer

        state = _Build(asyncio.get_running_loop().create_task(run(), name="list-answer"))
        # Every requester may have left (each waits through a shield): the outcome is read here too.
        state.task.add_done_callback(lambda task: task.cancelled() or task.exception())
        self._building[group] = state
        return state

    def _keep(self, group: Hashable, kept: _Kept) -> None:
        previous = self._kept.pop(group, None)
        if previous is not None:
            self.bytes -= kept_bytes(previous.answer, group)
            if previous.epoch > kept.epoch:  # a slower, older build finished last: keep the newer
                kept = previous
        size = kept_bytes(kept.answer, group)
        if size > self.limit_bytes:
            return
        while self._kept and self.bytes + size > self.limit_bytes:
            evicted_group, evicted = self._kept.popitem(last=False)
            self.bytes -= kept_bytes(evicted.answer, evicted_group)
        self._kept[group] = kept
        self.bytes += size

    async def close(self) -> None:
        tasks = [build.task for build in self._building.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._building.clear()
        self._kept.clear()
        self.bytes = 0


Shown = Callable[[models.AnyObject], models.AnyObject]


class Lists:
    """The list answers of one SC: its sorted indexes, its cache of whole answers, and the gate every
    list passes (a whole answer built once for many requests passes it once)."""

    def __init__(self, local_store: local.LocalStore, gate: admission.Gate, cache_bytes: int) -> None:
        self.local_store = local_store
        self.gate = gate
        self.answers = Answers(cache_bytes)
        self._indexes: dict[str, SortedNames] = {}
        # Objects encoded for HTTP list answers, by kind.
        self.encodings: Tally[str] = Tally()

    def names(self, kind: str, topic: str | None = None) -> list[str]:
        """The names of ``kind`` (of ``topic``'s partitions only, if given) in list order, now."""
        index = self._index(kind)
        names = index.current()
        if topic is None:
            return names
        low = bisect.bisect_left(names, (topic,), key=index.key)
        high = bisect.bisect_left(names, (topic, math.inf), key=index.key)
        return names[low:high]

    def _index(self, kind: str) -> SortedNames:
        index = self._indexes.get(kind)
        if index is None:
            index = self._indexes[kind] = SortedNames(self.local_store[kind])
        return index

    async def whole(self, kind: str, topic: str | None, shown: Shown, shown_version: Hashable) -> Answer:
        """Every object of ``kind`` (of ``topic``) as a JSON array, shared with concurrent identical lists
        and kept for the next ones while nothing changes. ``shown_version`` changes whenever
        ``shown`` would show an object differently (live offsets)."""
        table = self.local_store[kind]

        async def build(taken: Callable[[int], None]) -> Answer:
            async with self.gate.slot(admission.LIST):
                names = self.names(kind, topic)
                return await self._encode(table, names, shown, taken)

        return await self.answers.get(("http", kind, topic), table.epoch, shown_version, build)

    async def page(self, kind: str, topic: str | None, after: SortKey | None, limit: int, shown: Shown) -> Answer:
        """At most ``limit`` objects after the key ``after`` (from the first if None), now."""
        table = self.local_store[kind]
        async with self.gate.slot(admission.LIST):
            names = self.names(kind, topic)
            key = self._index(kind).key
            start = 0 if after is None else bisect.bisect_right(names, after, key=key)
            chosen = names[start : start + limit]
            next_after = key(chosen[-1]) if start + limit < len(names) else None
            answer = await self._encode(table, chosen, shown, lambda epoch: None)
        return Answer(answer.body, answer.revision, next_after)

    async def _encode(
        self, table: local.KindStore[models.AnyObject], names: list[str], shown: Shown, taken: Callable[[int], None]
    ) -> Answer:
        view = table.view
        # Taken at one moment (entries are immutable): the answer is the store at that revision.
        objects = [view[name].obj for name in names]
        revision = table.revision
        taken(table.epoch)
        chunks = []
        for start in range(0, len(objects), ENCODE_CHUNK):
            if start:
                await asyncio.sleep(0)
            chunks.append(b",".join([models.encode(shown(obj)) for obj in objects[start : start + ENCODE_CHUNK]]))
        self.encodings[table.kind] += len(objects)
        return Answer(b"[" + b",".join(chunks) + b"]", revision)

    async def close(self) -> None:
        await self.answers.close()
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()
