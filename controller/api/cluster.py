"""`GET /v1/cluster`: the SCs of this store, as this SC sees them.

The active SC is the holder of the store's claim (``meta/active-sc``, see ``store.active_sc``),
read from this SC's mirror; its epoch is the claim's revision, which changes with every new holder.
The standbys are the other candidates (``meta/sc-candidates/<id>``), in the order they would lead.
"""

from __future__ import annotations

from typing import Any

from controller import context as context_module
from store import active_sc


def describe(context: context_module.Context) -> dict[str, Any]:
    """``{"self": {"id", "role", "address"}, "leader": {"id", "address", "since", "epoch"} | None,
    "standbys": [...]}``; ids and addresses unknown (before this SC claimed, or a claim value this
    project did not write) are null."""
    active = context.active
    identity = active.identity if active is not None else None
    leading = active is not None and active.state is active_sc.State.ACTIVE and active.problem() is None
    this = {
        "id": identity.id if identity is not None else None,
        "role": "leader" if leading else "standby",
        "address": identity.address if identity is not None else None,
    }
    claim = context.local_store.meta.values.get(active_sc.KEY)
    leader: dict[str, Any] | None = None
    if claim is not None:
        value, revision = claim
        holder = active_sc.Identity.decode(value)
        leader = {
            "id": holder.id if holder is not None else None,
            "address": holder.address if holder is not None else None,
            "since": holder.started if holder is not None else None,
            "epoch": revision,
        }
    leader_id = leader["id"] if leader is not None else None
    standbys = [
        {"id": candidate.identity.id, "address": candidate.identity.address}
        for candidate in active_sc.queue(context.local_store.meta.values)
        if candidate.identity.id != leader_id
    ]
    return {"self": this, "leader": leader, "standbys": standbys}


def leader_of(context: context_module.Context) -> active_sc.Identity | None:
    """The leader as this SC's mirror has it (None: no claim, or one no SC of this project wrote)."""
    claim = context.local_store.meta.values.get(active_sc.KEY)
    return active_sc.Identity.decode(claim[0]) if claim is not None else None
