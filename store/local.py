"""The local store: the SC's read-only mirror of the KV store, one table per kind.

Each object carries separate spec and status epochs; applying an unchanged object changes no
epoch and wakes nobody; a full resync fences listeners so they re-read everything. Only the
Reader writes here (synchronously, on the event loop); controllers read snapshots.
"""

from __future__ import annotations

import asyncio
import enum
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeAlias, TypeVar, overload

from store import models

T = TypeVar("T")
# The kind of object a table, entry or listener holds (``KindStore[models.Topic]``); entries are
# immutable, so an ``Entry[Topic]`` is also an ``Entry[AnyObject]``.
O = TypeVar("O", bound="models.AnyObject")
O_co = TypeVar("O_co", bound="models.AnyObject", covariant=True)

# Deleted names remembered for listeners that have not read the delete yet. A listener older
# than the oldest forgotten tombstone gets the full set instead of a delta.
DEFAULT_TOMBSTONE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class Entry(Generic[O_co]):
    obj: O_co
    mod_revision: int
    spec_epoch: int
    status_epoch: int
    create_revision: int = 0

    @property
    def name(self) -> str:
        return self.obj.name

    @property
    def last_epoch(self) -> int:
        return max(self.spec_epoch, self.status_epoch)


class Part(enum.Flag):
    SPEC = enum.auto()
    STATUS = enum.auto()
    ALL = SPEC | STATUS


# The hot paths (every watch event, every listener) use the flags' int values: operators on
# enum.Flag members run Python code, several per event per listener.
_SPEC, _STATUS, _ALL = Part.SPEC.value, Part.STATUS.value, Part.ALL.value
_PARTS: dict[int, Part] = {part.value: part for part in (Part.SPEC, Part.STATUS, Part.ALL)}


@dataclass(frozen=True, slots=True)
class Changes(Generic[O_co]):
    """What a listener has not seen yet.

    ``full`` is True when the listener was behind a resync fence (or too far behind to be
    given a delta): ``updated`` is then every object, and ``deleted`` only the names among them
    that were deleted and created again (what else is gone, the full set says by leaving it out).

    A name in both ``deleted`` and ``updated`` was deleted and created again since the listener
    last read, whether the watch brought it or a relist found it under a new create revision: the
    object in ``updated`` is a new one (its entry's ``create_revision`` is new), which inherits
    nothing of the old one's. Take ``deleted`` first.
    """

    full: bool
    updated: list[Entry[O_co]]
    deleted: list[str]
    epoch: int

    @property
    def empty(self) -> bool:
        return not self.full and not self.updated and not self.deleted


# What changed, by kind: one listener's changes per kind, the kind a key known at run time only
# (a decision reads ``changes["partitions"]`` as partitions).
ChangesByKind: TypeAlias = "Mapping[str, Changes[Any]]"


class KindStore(Generic[O]):
    """The mirror of one kind; see the module docstring."""

    def __init__(self, kind: str, tombstone_limit: int = DEFAULT_TOMBSTONE_LIMIT) -> None:
        self.kind = kind
        # Partitions by topic, so deleting a topic or checking its partitions is not a full scan.
        self._groups: dict[str, set[str]] | None = {} if kind == "partitions" else None
        self._identities = kind == "partitions"  # its objects have a uid (Partition.uid)
        # Values computed from the whole table, kept while the table's epoch does not move.
        self._derived: dict[str, tuple[int, object]] = {}
        # Named subsets kept up to date on every change (see ``index``): name -> (predicate,
        # member names in the order of their last change).
        self._indexes: dict[str, tuple[Callable[[O], bool], dict[str, None]]] = {}
        self.epoch = 0
        self.fence = 0
        self.revision = 0  # the KV revision this table reflects
        self.synced = False
        # Insertion order = order of last change, so deltas are read from the end.
        self._entries: dict[str, Entry[O]] = {}
        self._tombstones: dict[str, int] = {}
        self._tombstone_limit = tombstone_limit
        self._forgotten_up_to = 0
        self._listeners: set[Listener[O]] = set()
        self.view: Mapping[str, Entry[O]] = types.MappingProxyType(self._entries)
        # Names in the store whose value this SC cannot read (malformed, or written by a newer
        # version), while it mirrors no readable version of them: absent from the mirror, but not
        # deleted, so what they own is not orphaned (see mark_unreadable).
        self.unreadable: set[str] = set()

    # ------------------------------------------------------------------ reads

    def get(self, name: str) -> Entry[O] | None:
        return self._entries.get(name)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry[O]]:
        return iter(list(self._entries.values()))

    def objects(self) -> list[O]:
        return [entry.obj for entry in self._entries.values()]

    def group(self, owner: str) -> frozenset[str]:
        """Names of the partitions of topic ``owner`` (partitions table only)."""
        if self._groups is None:
            raise ValueError(f"the {self.kind} table is not grouped")
        return frozenset(self._groups.get(owner, ()))

    def index(self, name: str, predicate: Callable[[O], bool]) -> Iterable[str]:
        """Names of the objects for which ``predicate`` holds, oldest change first.

        Built on first use, then kept up to date by every write, so a controller that only
        cares about a few objects (topics not yet provisioned) need not scan them all on each
        pass. ``predicate`` must depend on the object alone. The view is live: read it before
        the next await, like a snapshot.
        """
        found = self._indexes.get(name)
        if found is None:
            found = (predicate, self._members(predicate))
            self._indexes[name] = found
        return found[1].keys()

    def _members(self, predicate: Callable[[O], bool]) -> dict[str, None]:
        ordered = sorted(self._entries.values(), key=lambda entry: entry.mod_revision)
        return {entry.name: None for entry in ordered if predicate(entry.obj)}

    def _indexed(self, obj: O | None, name: str) -> None:
        for predicate, members in self._indexes.values():
            members.pop(name, None)
            if obj is not None and predicate(obj):
                members[name] = None

    def _grouped(self, name: str, present: bool) -> None:
        if self._groups is None:
            return
        owner = name.rpartition("-")[0]
        if present:
            self._groups.setdefault(owner, set()).add(name)
        else:
            members = self._groups.get(owner)
            if members is not None:
                members.discard(name)
                if not members:
                    del self._groups[owner]

    # ------------------------------------------------------------------ writes (Reader only)

    def apply(self, obj: O, mod_revision: int, create_revision: int = 0) -> Part | None:
        """Store ``obj``; returns the parts that changed (None if nothing did).

        ``create_revision``: the key's, as the store reports it (0: unknown). A name this mirror
        does not hold is usually being created (then it is ``mod_revision``), but not always: a
        value that was unreadable until this write keeps the key's creation, so an SPU whose
        record could not be read for a while is not taken for registered again.
        """
        if obj.kind != self.kind:
            raise ValueError(f"cannot apply a {obj.kind} object to the {self.kind} store")
        self.revision = max(self.revision, mod_revision)
        current = self._entries.get(obj.name)
        if current is None:
            if self.unreadable:
                self.unreadable.discard(obj.name)
            changed = _ALL
        else:
            changed = (_SPEC if current.obj.spec != obj.spec or self._identity_changed(current.obj, obj) else 0) | (
                _STATUS if current.obj.status != obj.status else 0
            )
        if not changed:
            if current is not None and current.mod_revision != mod_revision:
                # Same content written again: remember the revision (CAS needs it), wake nobody.
                self._entries[obj.name] = Entry(
                    obj, mod_revision, current.spec_epoch, current.status_epoch, current.create_revision
                )
            return None
        self.epoch += 1
        spec_epoch = self.epoch if changed & _SPEC or current is None else current.spec_epoch
        status_epoch = self.epoch if changed & _STATUS or current is None else current.status_epoch
        if current is not None:
            create_revision = current.create_revision
        elif not create_revision:
            create_revision = mod_revision
        self._entries.pop(obj.name, None)
        self._entries[obj.name] = Entry(obj, mod_revision, spec_epoch, status_epoch, create_revision)
        if current is None:
            self._grouped(obj.name, True)
        if self._indexes:
            self._indexed(obj, obj.name)
        # A tombstone stays when its name is created again: a listener that has not read the
        # delete gets the name in both lists, so it does not take the new object for the old one.
        self._notify(changed)
        return _PARTS[changed]

    def _identity_changed(self, before: O, after: O) -> bool:
        """A partition's uid written over in place (the SC never changes one: a hand edit, or another
        partition's value put on the key): a change of the spec's kind, since the SPUs are told it
        with the spec. Taken for the same value written again, it woke nobody, and the SPUs heard of
        it at the partition's next change, whatever that was, and dropped their logs then."""
        return (
            self._identities
            and isinstance(before, models.Partition)
            and isinstance(after, models.Partition)
            and before.uid != after.uid
        )

    def mark_unreadable(self, name: str, revision: int) -> None:
        """The store holds ``name`` at ``revision`` in a value this SC cannot read. A readable
        version already mirrored stays (the Reader keeps serving it); else the name is unreadable
        until a readable write or a delete of it."""
        self.revision = max(self.revision, revision)
        if name not in self._entries:
            self.unreadable.add(name)

    def delete(self, name: str, revision: int = 0) -> bool:
        self.revision = max(self.revision, revision)
        if self.unreadable:
            self.unreadable.discard(name)
        if self._entries.pop(name, None) is None:
            return False
        self._grouped(name, False)
        if self._indexes:
            self._indexed(None, name)
        self.epoch += 1
        self._bury(name)
        self._notify(_ALL)
        return True

    def _bury(self, name: str) -> None:
        """Remember that ``name`` was deleted at the current epoch, for the listeners behind it."""
        self._tombstones.pop(name, None)
        self._tombstones[name] = self.epoch
        while len(self._tombstones) > self._tombstone_limit:
            oldest = next(iter(self._tombstones))
            self._forgotten_up_to = self._tombstones.pop(oldest)

    def resync(self, objects: Iterable[tuple[O, int, int]], revision: int, unreadable: Iterable[str] = ()) -> None:
        """Replace the whole table with a fresh listing of (object, mod revision, create revision),
        and the names listed whose value could not be read.

        Fences every listener. A name listed under another create revision than the one mirrored
        was deleted and created again while the watch was down: it is a new object, and the
        listeners get it as deleted too, as if the watch had brought the delete and the create.
        """
        self.unreadable = set(unreadable)
        self.epoch += 1
        self.fence = self.epoch
        fresh = {obj.name: (obj, mod_revision, create_revision) for obj, mod_revision, create_revision in objects}
        for name in [name for name in self._entries if name not in fresh]:
            del self._entries[name]
            self._grouped(name, False)
        # Behind the fence everybody gets the full set: the tombstones of names absent from it
        # are not needed (the full set leaves them out), those of names there again still are
        # (a listener that had not read the delete is to be told the object there is new).
        for name in [name for name in self._tombstones if name not in fresh]:
            del self._tombstones[name]
        for name, (obj, mod_revision, create_revision) in fresh.items():
            current = self._entries.get(name)
            # (A create revision of 0 is one the caller did not know: it tells nothing.)
            recreated = (
                current is not None
                and current.create_revision != create_revision
                and 0 not in (current.create_revision, create_revision)
            )
            if recreated:
                self._bury(name)
            if current is not None and current.obj == obj and not recreated:
                self._entries[name] = Entry(obj, mod_revision, current.spec_epoch, current.status_epoch, create_revision)
            else:
                if self._entries.pop(name, None) is None:
                    self._grouped(name, True)
                self._entries[name] = Entry(obj, mod_revision, self.epoch, self.epoch, create_revision)
        for name, (predicate, _) in list(self._indexes.items()):
            self._indexes[name] = (predicate, self._members(predicate))
        self.revision = revision
        self.synced = True
        self._notify(_ALL)

    # ------------------------------------------------------------------ listeners

    def listener(self, part: Part = Part.ALL) -> Listener[O]:
        """A listener that starts behind everything (its first ``changes()`` is the full set)."""
        listener = Listener(self, part)
        self._listeners.add(listener)
        return listener

    def changes_since(self, epoch: int, part: Part) -> Changes[O]:
        if epoch < self.fence or epoch < self._forgotten_up_to:
            # Of what was deleted since, only the names there again: new objects (see Changes).
            # A listener that never read knew no old object.
            recreated = []
            if epoch >= 0:
                entries = self._entries
                for name, deleted_at in reversed(self._tombstones.items()):
                    if deleted_at <= epoch:
                        break
                    if name in entries:
                        recreated.append(name)
                recreated.reverse()
            return Changes(True, list(self._entries.values()), recreated, self.epoch)
        updated: list[Entry[O]] = []
        spec, status = bool(part.value & _SPEC), bool(part.value & _STATUS)
        for entry in reversed(self._entries.values()):
            if entry.spec_epoch <= epoch and entry.status_epoch <= epoch:
                break  # entries are in the order of their last change
            if (spec and entry.spec_epoch > epoch) or (status and entry.status_epoch > epoch):
                updated.append(entry)
        updated.reverse()
        deleted = []
        for name, deleted_at in reversed(self._tombstones.items()):
            if deleted_at <= epoch:
                break
            deleted.append(name)
        deleted.reverse()
        return Changes(False, updated, deleted, self.epoch)

    def _notify(self, changed: int) -> None:
        for listener in self._listeners:
            if listener._mask & changed:
                listener._wake.set()

    def _remove_listener(self, listener: Listener[O]) -> None:
        self._listeners.discard(listener)


class Listener(Generic[O]):
    """Waits for changes of one kind (spec, status or both) and hands them out once."""

    def __init__(self, store: KindStore[O], part: Part) -> None:
        self.store = store
        self.part = part
        self._mask = part.value
        self.epoch = -1  # behind everything: the first read is the full set
        self._wake = asyncio.Event()
        self._wake.set()

    def has_changes(self) -> bool:
        return not self.store.changes_since(self.epoch, self.part).empty

    def changes(self) -> Changes[O]:
        """Everything this listener has not seen; marks it seen."""
        self._wake.clear()
        changes = self.store.changes_since(self.epoch, self.part)
        self.epoch = changes.epoch
        return changes

    def skip(self) -> None:
        """Mark everything seen without reading it (cheaper than ``changes()`` when the
        caller does not care what changed)."""
        self._wake.clear()
        self.epoch = self.store.epoch

    async def wait(self) -> None:
        """Return once there is something this listener has not seen (at once if there is)."""
        while True:
            await self._wake.wait()
            if self.has_changes():
                return
            self._wake.clear()

    def close(self) -> None:
        self.store._remove_listener(self)


class Snapshot:
    """A consistent view of every kind for one decision.

    Valid until the caller next awaits (the Reader applies events only between awaits), which is
    exactly the life of a pure controller call. Entries are immutable.
    """

    def __init__(self, tables: Mapping[str, KindStore[Any]], meta: MetaTable | None = None) -> None:
        self._tables = tables
        self._views = {kind: table.view for kind, table in tables.items()}
        self.epochs = {kind: table.epoch for kind, table in tables.items()}
        # The KV revision this view reflects (every kind: the Reader applies one ordered stream).
        self.revision = max([table.revision for table in tables.values()] + [meta.revision if meta else 0])
        self._meta = meta.values if meta is not None else {}

    def meta(self, key: str) -> tuple[bytes, int] | None:
        """A cluster-internal key's (value, mod revision), or None if absent."""
        return self._meta.get(key)

    def unreadable(self, kind: str) -> AbstractSet[str]:
        """The names of ``kind`` in the store that this SC cannot read (absent from ``entries``
        but not deleted: what they own is not theirs to take)."""
        return self._tables[kind].unreadable

    # Each read is typed by its kind when the kind is written out (``entries("topics")`` holds
    # ``Entry[Topic]``), and by ``AnyObject`` when it is only known at run time.
    @overload
    def entries(self, kind: Literal["spus"]) -> Mapping[str, Entry[models.Spu]]: ...
    @overload
    def entries(self, kind: Literal["spu-groups"]) -> Mapping[str, Entry[models.SpuGroup]]: ...
    @overload
    def entries(self, kind: Literal["topics"]) -> Mapping[str, Entry[models.Topic]]: ...
    @overload
    def entries(self, kind: Literal["partitions"]) -> Mapping[str, Entry[models.Partition]]: ...
    @overload
    def entries(self, kind: str) -> Mapping[str, Entry[models.AnyObject]]: ...
    def entries(self, kind: str) -> Mapping[str, Entry[models.AnyObject]]:
        return self._views[kind]

    @overload
    def get(self, kind: Literal["spus"], name: str) -> models.Spu | None: ...
    @overload
    def get(self, kind: Literal["spu-groups"], name: str) -> models.SpuGroup | None: ...
    @overload
    def get(self, kind: Literal["topics"], name: str) -> models.Topic | None: ...
    @overload
    def get(self, kind: Literal["partitions"], name: str) -> models.Partition | None: ...
    @overload
    def get(self, kind: str, name: str) -> models.AnyObject | None: ...
    def get(self, kind: str, name: str) -> models.AnyObject | None:
        entry = self._views[kind].get(name)
        return None if entry is None else entry.obj

    @overload
    def objects(self, kind: Literal["spus"]) -> list[models.Spu]: ...
    @overload
    def objects(self, kind: Literal["spu-groups"]) -> list[models.SpuGroup]: ...
    @overload
    def objects(self, kind: Literal["topics"]) -> list[models.Topic]: ...
    @overload
    def objects(self, kind: Literal["partitions"]) -> list[models.Partition]: ...
    @overload
    def objects(self, kind: str) -> list[models.AnyObject]: ...
    def objects(self, kind: str) -> list[Any]:
        return [entry.obj for entry in self._views[kind].values()]

    def derived(self, kind: str, name: str, compute: Callable[[], T]) -> T:
        """``compute()``, remembered until ``kind``'s table changes (for example the SPU list
        placement needs, which every topic of a pass would otherwise rebuild)."""
        table = self._tables[kind]
        cached = table._derived.get(name)
        if cached is not None and cached[0] == table.epoch:
            return cached[1]  # type: ignore[return-value]  # cached under this name: compute()'s value, a T
        value = compute()
        table._derived[name] = (table.epoch, value)
        return value

    def indexed(self, kind: str, name: str, predicate: Callable[[O], bool]) -> Iterator[Entry[O]]:
        """The entries of ``kind`` for which ``predicate`` holds, oldest change first; kept as
        an index of the table (see ``KindStore.index``), so the cost is the matches read, not
        the table's size. Read it before the next await."""
        view = self._views[kind]
        return (view[member] for member in self._tables[kind].index(name, predicate))

    def partitions_of(self, topic: str) -> frozenset[str]:
        """Names of the partitions of ``topic`` in the store (whatever the topic's replica map says)."""
        return self._tables["partitions"].group(topic)


class LocalStore:
    """One KindStore per kind of object."""

    def __init__(self, tombstone_limit: int = DEFAULT_TOMBSTONE_LIMIT) -> None:
        self.tables: dict[str, KindStore[Any]] = {kind: KindStore(kind, tombstone_limit) for kind in models.KINDS}
        self.meta = MetaTable()
        # How many times the store was found to have lost writes it had acknowledged, and the
        # revision of the last listing after such a loss (see forked()).
        self.forks = 0
        self.forked_at = 0

    def forked(self, revision: int) -> None:
        """The store lost writes it had acknowledged and was relisted at ``revision``: a write
        answered at a later revision before the relist will never reach this mirror (its revision
        may be another write's), so nobody should wait for it."""
        self.forks += 1
        self.forked_at = revision

    @overload
    def __getitem__(self, kind: Literal["spus"]) -> KindStore[models.Spu]: ...
    @overload
    def __getitem__(self, kind: Literal["spu-groups"]) -> KindStore[models.SpuGroup]: ...
    @overload
    def __getitem__(self, kind: Literal["topics"]) -> KindStore[models.Topic]: ...
    @overload
    def __getitem__(self, kind: Literal["partitions"]) -> KindStore[models.Partition]: ...
    @overload
    def __getitem__(self, kind: str) -> KindStore[models.AnyObject]: ...
    def __getitem__(self, kind: str) -> KindStore[Any]:
        try:
            return self.tables[kind]
        except KeyError:
            raise ValueError(f"unknown kind {kind!r}: use one of {', '.join(self.tables)}") from None

    @property
    def revision(self) -> int:
        """The KV revision the whole mirror reflects."""
        return max([table.revision for table in self.tables.values()] + [self.meta.revision])

    @property
    def synced(self) -> bool:
        return self.meta.synced and all(table.synced for table in self.tables.values())

    def snapshot(self) -> Snapshot:
        return Snapshot(self.tables, self.meta)


class Echoes:
    """Objects the SC wrote itself, by key, until the watch brings them back.

    The Reader takes the object written instead of decoding the value again when the event
    carries exactly the bytes written (decoding was most of what an event cost while
    provisioning). Forgetting is always safe: an event without a match is decoded. Bounded:
    past ``limit`` entries the oldest is dropped.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._by_key: dict[str, tuple[bytes, models.AnyObject]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def expect(self, key: str, value: bytes, obj: models.AnyObject) -> None:
        self._by_key.pop(key, None)
        if len(self._by_key) >= self.limit:
            del self._by_key[next(iter(self._by_key))]
        self._by_key[key] = (value, obj)

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def take(self, key: str, value: bytes) -> models.AnyObject | None:
        """The object written under ``key`` if ``value`` is exactly what was written."""
        found = self._by_key.pop(key, None)
        if found is None or found[0] != value:
            return None
        return found[1]


class MetaTable:
    """Cluster-internal keys (``meta/...``), such as the placement start-index chain.

    Not objects: no epochs; controllers read them from the snapshot. A controller that acts on a
    key asks to be woken when it changes (``on_change``): a wake-up, never the value.
    """

    def __init__(self) -> None:
        self.values: dict[str, tuple[bytes, int]] = {}
        self.revision = 0
        self.synced = False
        self._wakers: dict[str, list[Callable[[], None]]] = {}

    def on_change(self, key: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever ``key`` is written, deleted, or relisted, until the function
        returned is called."""
        wakers = self._wakers.setdefault(key, [])
        wakers.append(wake)
        return lambda: wakers.remove(wake) if wake in wakers else None

    def apply(self, key: str, value: bytes, mod_revision: int) -> None:
        self.values[key] = (value, mod_revision)
        self.revision = max(self.revision, mod_revision)
        self._wake(key)

    def delete(self, key: str, revision: int) -> None:
        self.values.pop(key, None)
        self.revision = max(self.revision, revision)
        self._wake(key)

    def resync(self, items: Iterable[tuple[str, bytes, int]], revision: int) -> None:
        self.values = {key: (value, mod_revision) for key, value, mod_revision in items}
        self.revision = revision
        self.synced = True
        for key in self._wakers:
            self._wake(key)

    def _wake(self, key: str) -> None:
        for wake in self._wakers.get(key, ()):
            wake()
