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
    takeover = active.takeover if active is not None else None
    if leading and identity is not None and takeover is not None and (leader is None or leader["id"] != identity.id):
        # It leads, and its mirror does not have its claim yet (a takeover's first moments): it
        # names itself, at its claim's epoch, rather than "no leader" or its predecessor.
        leader = {"id": identity.id, "address": identity.address, "since": identity.started, "epoch": takeover.epoch}
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


class RoleFeed:
    """Each change of the store's claim as this SC's mirror sees it, told in the decision feed
    (kind ``sc``): a new holder (verb ``lead``, its address as detail) and a claim that ended
    (``release``). Leader or standby, every SC tells it, so the live page's SC panel redraws at once
    whichever SC serves it. A relist that brings the same claim back tells nothing. This SC's own
    claim is told by ``took_over`` once it leads (with its cause), not when the mirror sees it."""

    def __init__(self, context: context_module.Context) -> None:
        self.context = context
        self._claim: tuple[bytes, int] | None = None
        self._holder = "unknown"
        self._before = "unknown"
        context.local_store.meta.on_change(active_sc.KEY, self._changed)

    def _changed(self) -> None:
        meta = self.context.local_store.meta
        claim = meta.values.get(active_sc.KEY)
        if claim == self._claim:
            return
        ended, self._claim = self._claim, claim
        self._before = self._holder
        if claim is None:
            epoch = ended[1] if ended is not None else 0
            reason = f"the claim of SC {self._before} (epoch {epoch}) ended: no SC leads until a standby claims it"
            self.context.decisions.record("sc", self._before, "release", reason, "claim-ended", "applied", meta.revision)
            return
        value, epoch = claim
        holder = active_sc.Identity.decode(value)
        self._holder = holder.id if holder is not None else "unknown"
        active = self.context.active
        if holder is not None and active is not None and active.identity is not None and active.identity.id == holder.id:
            return  # this SC's own claim: took_over tells it
        who = f"SC {holder.id}" if holder is not None else "an SC of unknown identity"
        self._record(who, epoch, "claim", holder.address if holder is not None else "")

    def took_over(self, takeover: active_sc.Takeover, identity: active_sc.Identity) -> None:
        """This SC leads: its controllers run. The cause is the takeover's (what ended the claim before)."""
        self._record(f"SC {identity.id}", takeover.epoch, takeover.cause, identity.address, identity.id)

    def _record(self, who: str, epoch: int, cause: str, address: str, name: str | None = None) -> None:
        reason = f"{who} leads the store (fencing epoch {epoch})"
        if self._before != "unknown":
            reason += f", after SC {self._before}"
        self.context.decisions.record("sc", name or self._holder, "lead", reason, cause, "applied", epoch, address)
