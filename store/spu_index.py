"""Which SPU holds each SPU id: the index key ``meta/spu-ids/<id>`` names it, else the SPU created first.

Purely computational, no I/O: the rule every reader of the mirror applies alike (placement, the
connection manager), for SPUs written behind the SC's back that share an id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from store import local, models

INDEX_PREFIX = "meta/spu-ids/"

# Reads one meta key of the mirror: (value, mod revision), or None if absent.
MetaReader = Callable[[str], tuple[bytes, int] | None]


def index_key(spu_id: int) -> str:
    return f"{INDEX_PREFIX}{spu_id}"


def encode_holder(name: str) -> bytes:
    return json.dumps({"spu": name}).encode()


def decode_holder(value: bytes) -> str | None:
    """The SPU an index value names; None for a value that is not ours (written by hand)."""
    try:
        holder = json.loads(value)["spu"]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deep to parse
        return None
    return holder if isinstance(holder, str) else None


def holders(spus: Mapping[str, local.Entry[models.Spu]], meta: MetaReader) -> dict[int, local.Entry[models.Spu]]:
    """The SPU that holds each id, in id order.

    Several SPUs with one id can only have been written behind the SC's back: the one the index
    names holds it, else the one created first (then the first by name); the others are ignored.
    """
    by_id: dict[int, list[local.Entry[models.Spu]]] = {}
    for entry in spus.values():
        by_id.setdefault(entry.obj.spec.id, []).append(entry)
    return {spu_id: _holder(spu_id, by_id[spu_id], meta) for spu_id in sorted(by_id)}


def holder(spus: Mapping[str, local.Entry[models.Spu]], meta: MetaReader, spu_id: int) -> local.Entry[models.Spu] | None:
    """The SPU that holds ``spu_id`` (None if no SPU has it), by the rule of :func:`holders`."""
    sharing = [entry for entry in spus.values() if entry.obj.spec.id == spu_id]
    return _holder(spu_id, sharing, meta) if sharing else None


def _holder(spu_id: int, sharing: list[local.Entry[models.Spu]], meta: MetaReader) -> local.Entry[models.Spu]:
    if len(sharing) == 1:
        return sharing[0]
    stored = meta(index_key(spu_id))
    indexed = None if stored is None else decode_holder(stored[0])
    for entry in sharing:
        if entry.name == indexed:
            return entry
    return min(sharing, key=lambda entry: (entry.create_revision, entry.name))
