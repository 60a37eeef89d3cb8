"""The SPU id index's writes: taking and releasing ``meta/spu-ids/<id>`` in the same transaction as
the SPU itself (so two SPUs can never both get an id), and what placement ignores when SPUs written
behind the SC's back share one. Which SPU holds an id is store/spu_index.py's rule, not redone here.

Purely computational, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.reconcile import actions
from store import local, models, spu_index


class IdInUse(Exception):
    """Another SPU holds the id; nothing may be written for it."""

    def __init__(self, spu_id: int, holder: str) -> None:
        self.spu_id = spu_id
        self.holder = holder
        super().__init__(f"SPU id {spu_id} is already used by SPU {holder!r}")


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
    indexed = None if stored is None else spu_index.decode_holder(stored[0])
    if indexed is not None and indexed != name and ids.get(indexed) == spu_id:
        raise IdInUse(spu_id, indexed)
    others = sorted(other for other, other_id in ids.items() if other_id == spu_id and other != name)
    if others:
        raise IdInUse(spu_id, others[0])
    if indexed == name and ids.get(name) == spu_id:
        return None
    return actions.Write(spu_index.index_key(spu_id), spu_index.encode_holder(name), 0 if stored is None else stored[1])


def release(name: str, spu_id: int, stored: tuple[bytes, int] | None) -> actions.Write | None:
    """The index delete to go in the transaction that deletes SPU ``name`` or moves it off
    ``spu_id`` (None when the index does not name it: someone else's key stays)."""
    if stored is None or spu_index.decode_holder(stored[0]) != name:
        return None
    return actions.Write(spu_index.index_key(spu_id), None, stored[1])


def shadowed(spus: Mapping[str, local.Entry[models.Spu]], meta: spu_index.MetaReader) -> list[tuple[int, str, str]]:
    """(id, SPU ignored, the SPU holding the id) for every SPU that shares its id, in id order:
    placement uses only the holders (``spu_index.holders``) rather than failing every topic."""
    held = spu_index.holders(spus, meta)
    ignored = [
        (entry.obj.spec.id, entry.name, held[entry.obj.spec.id].name)
        for entry in spus.values()
        if held[entry.obj.spec.id] is not entry
    ]
    return sorted(ignored)


def describe_shadowed(ignored: list[tuple[int, str, str]]) -> str:
    """What to tell an operator about SPUs that share an id (empty when none do)."""
    return "; ".join(
        f"SPU {name!r} has id {spu_id}, which SPU {holder!r} holds: placement ignores {name!r}; "
        f"delete it (DELETE /v1/spus/{name}) and register it again with a free id"
        for spu_id, name, holder in ignored
    )
