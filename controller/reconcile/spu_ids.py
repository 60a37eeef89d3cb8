"""The SPU id index: the key ``meta/spu-ids/<id>`` names the one SPU that holds each id.

Purely computational, no I/O: the index writes that take and release an id in the same transaction
as the SPU itself (so two SPUs can never both get an id), and which SPU holds an id when SPUs
written behind the SC's back share one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from controller.reconcile import actions
from store import local

INDEX_PREFIX = "meta/spu-ids/"

# Reads one meta key of a snapshot: (value, mod revision), or None if absent.
MetaReader = Callable[[str], tuple[bytes, int] | None]


class IdInUse(Exception):
    """Another SPU holds the id; nothing may be written for it."""

    def __init__(self, spu_id: int, holder: str) -> None:
        self.spu_id = spu_id
        self.holder = holder
        super().__init__(f"SPU id {spu_id} is already used by SPU {holder!r}")


def index_key(spu_id: int) -> str:
    return f"{INDEX_PREFIX}{spu_id}"


def encode_holder(name: str) -> bytes:
    return json.dumps({"spu": name}).encode()


def decode_holder(value: bytes) -> str | None:
    """The SPU an index value names; None for a value that is not ours (written by hand)."""
    try:
        holder = json.loads(value)["spu"]
    except (ValueError, KeyError, TypeError):
        return None
    return holder if isinstance(holder, str) else None


def claim(name: str, spu_id: int, stored: tuple[bytes, int] | None, ids: Mapping[str, int]) -> actions.Write | None:
    """The index write that gives ``spu_id`` to SPU ``name``, to go in the SPU's own transaction
    (None when ``name`` already holds it). Raises IdInUse when another SPU holds the id.

    ``stored`` is the index key as read (value, mod revision); ``ids`` is every SPU's id by name,
    read no earlier than ``stored``. An SPU holds an id when the index names it and it has that
    id, or, for SPUs stored without an index key (before the index existed, or written by hand),
    when it has that id at all. An index key naming an SPU that is gone or has another id was left
    by a change made behind the SC's back: it is stale, and taken over with a compare on its mod
    revision, so whoever changes it first wins and the other's transaction fails.
    """
    indexed = None if stored is None else decode_holder(stored[0])
    if indexed is not None and indexed != name and ids.get(indexed) == spu_id:
        raise IdInUse(spu_id, indexed)
    others = sorted(other for other, other_id in ids.items() if other_id == spu_id and other != name)
    if others:
        raise IdInUse(spu_id, others[0])
    if indexed == name and ids.get(name) == spu_id:
        return None
    return actions.Write(index_key(spu_id), encode_holder(name), 0 if stored is None else stored[1])


def release(name: str, spu_id: int, stored: tuple[bytes, int] | None) -> actions.Write | None:
    """The index delete to go in the transaction that deletes SPU ``name`` or moves it off
    ``spu_id`` (None when the index does not name it: someone else's key stays)."""
    if stored is None or decode_holder(stored[0]) != name:
        return None
    return actions.Write(index_key(spu_id), None, stored[1])


def holders(spus: Mapping[str, local.Entry], meta: MetaReader) -> dict[int, local.Entry]:
    """The SPU that holds each id, in id order.

    Several SPUs with one id can only have been written behind the SC's back: the one the index
    names holds it, else the one created first (then the first by name); the others are ignored
    by placement (see ``shadowed``) rather than failing every topic of the cluster.
    """
    by_id: dict[int, list[local.Entry]] = {}
    for entry in spus.values():
        by_id.setdefault(entry.obj.spec.id, []).append(entry)  # type: ignore[attr-defined]
    held: dict[int, local.Entry] = {}
    for spu_id in sorted(by_id):
        sharing = by_id[spu_id]
        held[spu_id] = sharing[0] if len(sharing) == 1 else _holder(spu_id, sharing, meta)
    return held


def shadowed(spus: Mapping[str, local.Entry], meta: MetaReader) -> list[tuple[int, str, str]]:
    """(id, SPU ignored, the SPU holding the id) for every SPU that shares its id, in id order."""
    held = holders(spus, meta)
    ignored = [
        (entry.obj.spec.id, entry.name, held[entry.obj.spec.id].name)  # type: ignore[attr-defined]
        for entry in spus.values()
        if held[entry.obj.spec.id] is not entry  # type: ignore[attr-defined]
    ]
    return sorted(ignored)


def describe_shadowed(ignored: list[tuple[int, str, str]]) -> str:
    """What to tell an operator about SPUs that share an id (empty when none do)."""
    return "; ".join(
        f"SPU {name!r} has id {spu_id}, which SPU {holder!r} holds: placement ignores {name!r}; "
        f"delete it (DELETE /v1/spus/{name}) and register it again with a free id"
        for spu_id, name, holder in ignored
    )


def _holder(spu_id: int, sharing: list[local.Entry], meta: MetaReader) -> local.Entry:
    stored = meta(index_key(spu_id))
    indexed = None if stored is None else decode_holder(stored[0])
    for entry in sharing:
        if entry.name == indexed:
            return entry
    return min(sharing, key=lambda entry: (entry.create_revision, entry.name))

