"""The store's claim as this SC's mirror sees it, told in the decision feed (the live page's SC
panel redraws on it): a new holder, the claim ended, a relist that changes nothing told nothing,
and a claim value nobody of this project wrote named as such."""

from __future__ import annotations

import json
import types
from typing import Any

from controller.api import cluster, decisions as decisions_module
from store import active_sc, local


class _Context:
    """What RoleFeed reads of a Context: its mirror, its decisions and its own claim state."""

    def __init__(self) -> None:
        self.local_store = local.LocalStore()
        self.decisions = decisions_module.Decisions(clock=lambda: 1700000000.0)
        self.active: Any = None


def told(context: _Context) -> list[dict[str, Any]]:
    return [json.loads(line)["object"] for line in context.decisions.ring]


def identity(sc_id: str) -> active_sc.Identity:
    return active_sc.Identity(sc_id, "host-a", 42, f"{sc_id}.example:9003", "2026-11-27T06:00:00+00:00")


def test_each_new_holder_and_each_end_of_a_claim_is_told_once() -> None:
    context = _Context()
    cluster.RoleFeed(context)  # type: ignore[arg-type]  # a stand-in with what RoleFeed reads of a Context
    meta = context.local_store.meta
    meta.resync([(active_sc.KEY, identity("sc-a").encode(), 5)], 5)
    meta.resync([(active_sc.KEY, identity("sc-a").encode(), 5)], 9)  # a relist: the same claim
    meta.delete(active_sc.KEY, 12)
    meta.apply(active_sc.KEY, identity("sc-b").encode(), 14)
    assert [(d["kind"], d["name"], d["verb"], d["revision"], d["detail"]) for d in told(context)] == [
        ("sc", "sc-a", "lead", 5, "sc-a.example:9003"),
        ("sc", "sc-a", "release", 12, ""),
        ("sc", "sc-b", "lead", 14, "sc-b.example:9003"),
    ]
    reasons = [d["reason"] for d in told(context)]
    assert reasons[0] == "SC sc-a leads the store (fencing epoch 5)"
    assert reasons[1] == "the claim of SC sc-a (epoch 5) ended: no SC leads until a standby claims it"
    assert reasons[2] == "SC sc-b leads the store (fencing epoch 14), after SC sc-a"


def test_this_scs_own_claim_is_told_when_it_leads_with_its_cause() -> None:
    """The mirror may see this SC's claim before its controllers run: the feed tells it when it
    leads (the page then finds it leader), with the cause of the takeover."""
    context = _Context()
    feed = cluster.RoleFeed(context)  # type: ignore[arg-type]  # a stand-in with what RoleFeed reads of a Context
    mine = identity("sc-b")
    context.active = types.SimpleNamespace(identity=mine)
    context.local_store.meta.apply(active_sc.KEY, identity("sc-a").encode(), 5)
    context.local_store.meta.delete(active_sc.KEY, 12)
    context.local_store.meta.apply(active_sc.KEY, mine.encode(), 14)
    assert [d["verb"] for d in told(context)] == ["lead", "release"]
    feed.took_over(active_sc.Takeover("lease-expired", 14, identity("sc-a"), 5, "2026-11-27T06:01:00+00:00"), mine)
    last = told(context)[-1]
    assert (last["name"], last["verb"], last["cause"], last["revision"], last["detail"]) == ("sc-b", "lead", "lease-expired", 14, "sc-b.example:9003")
    assert last["reason"] == "SC sc-b leads the store (fencing epoch 14), after SC sc-a"


def test_a_claim_value_of_unknown_shape_is_told_without_trusting_it() -> None:
    context = _Context()
    cluster.RoleFeed(context)  # type: ignore[arg-type]  # a stand-in with what RoleFeed reads of a Context
    context.local_store.meta.apply(active_sc.KEY, b'{"id": "<script>", "x": ' + b"[" * 5000, 3)
    [decision] = told(context)
    assert (decision["name"], decision["verb"], decision["detail"]) == ("unknown", "lead", "")
    assert decision["reason"].startswith("an SC of unknown identity leads the store (fencing epoch 3)")


def test_an_sc_that_leads_names_itself_leader_before_its_mirror_has_its_claim() -> None:
    """Just after a takeover the mirror can still lack the new claim (the old one's deletion came
    first): GET /v1/cluster said role "leader" and leader null, and a client checking the new epoch
    failed. An SC that leads names itself, at its claim's epoch; once the mirror has the claim, the
    mirror's word stands."""
    context = _Context()
    mine = identity("sc-b")
    context.active = types.SimpleNamespace(
        identity=mine,
        state=active_sc.State.ACTIVE,
        problem=lambda: None,
        takeover=active_sc.Takeover("lease-expired", 14, identity("sc-a"), 5, "2026-11-27T06:01:00+00:00"),
    )
    context.local_store.meta.apply(active_sc.KEY, identity("sc-a").encode(), 5)
    context.local_store.meta.delete(active_sc.KEY, 12)
    described = cluster.describe(context)  # type: ignore[arg-type]  # a stand-in with what describe reads of a Context
    assert described["self"]["role"] == "leader"
    assert described["leader"] == {"id": "sc-b", "address": "sc-b.example:9003", "since": mine.started, "epoch": 14}
    context.local_store.meta.apply(active_sc.KEY, mine.encode(), 14)
    assert cluster.describe(context)["leader"]["epoch"] == 14  # type: ignore[arg-type]  # as above
