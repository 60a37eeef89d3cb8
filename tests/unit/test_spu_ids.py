"""The SPU id index's pure rules: who may take an id, what releases it, who holds a shared id."""

from __future__ import annotations

import pytest

from controller.reconcile import actions, spu_ids, topic
from store import local, models, spu_index
from tests import builders

KEY = "meta/spu-ids/7"


def held_by(name: str, revision: int = 40) -> tuple[bytes, int]:
    return spu_index.encode_holder(name), revision


@pytest.mark.parametrize(
    ("stored", "ids", "expected"),
    [
        pytest.param(None, {}, actions.Write(KEY, b'{"spu": "new"}', 0), id="free: created absent"),
        pytest.param(None, {"other": 8}, actions.Write(KEY, b'{"spu": "new"}', 0), id="other ids do not matter"),
        # Stale keys (an SPU deleted or renumbered behind the SC's back) are taken at their revision.
        pytest.param(held_by("gone"), {}, actions.Write(KEY, b'{"spu": "new"}', 40), id="holder gone"),
        pytest.param(held_by("moved"), {"moved": 8}, actions.Write(KEY, b'{"spu": "new"}', 40), id="holder renumbered"),
        pytest.param((b"not json", 41), {}, actions.Write(KEY, b'{"spu": "new"}', 41), id="unreadable value"),
        pytest.param((b'{"spu": 7}', 42), {}, actions.Write(KEY, b'{"spu": "new"}', 42), id="holder not a name"),
        # Taking its own key back after a renumbering behind its back rewrites it (same value).
        pytest.param(held_by("new"), {"new": 8}, actions.Write(KEY, b'{"spu": "new"}', 40), id="own stale key"),
        pytest.param(held_by("new"), {"new": 7}, None, id="already held"),
    ],
)
def test_claim_takes_a_free_or_stale_id(
    stored: tuple[bytes, int] | None, ids: dict[str, int], expected: actions.Write | None
) -> None:
    assert spu_ids.claim("new", 7, stored, ids) == expected


@pytest.mark.parametrize(
    ("stored", "ids", "holder"),
    [
        pytest.param(held_by("owner"), {"owner": 7}, "owner", id="indexed holder"),
        # SPUs stored without an index key (before the index, or by hand) hold their id too.
        pytest.param(None, {"legacy": 7}, "legacy", id="no index key"),
        pytest.param(held_by("gone"), {"legacy": 7}, "legacy", id="stale key, unindexed holder"),
        pytest.param(None, {"b": 7, "a": 7}, "a", id="several unindexed: the first by name"),
        pytest.param(held_by("b"), {"a": 7, "b": 7}, "b", id="several: the indexed one"),
    ],
)
def test_claim_refuses_an_id_another_spu_holds(stored: tuple[bytes, int] | None, ids: dict[str, int], holder: str) -> None:
    with pytest.raises(spu_ids.IdInUse) as raised:
        spu_ids.claim("new", 7, stored, ids)
    assert (raised.value.spu_id, raised.value.holder, str(raised.value)) == (
        7,
        holder,
        f"SPU id 7 is already used by SPU {holder!r}",
    )


def test_release_deletes_only_a_key_that_names_the_spu() -> None:
    assert spu_ids.release("s", 7, held_by("s", 12)) == actions.Write(KEY, None, 12)
    assert spu_ids.release("s", 7, held_by("other", 12)) is None
    assert spu_ids.release("s", 7, None) is None
    assert spu_ids.release("s", 7, (b"garbage", 12)) is None


def entries(*spus: tuple[models.Spu, int]) -> dict[str, local.Entry[models.Spu]]:
    table: local.KindStore[models.Spu] = local.KindStore("spus")
    for spu, revision in spus:
        table.apply(spu, revision)
    return dict(table.view)


def test_the_spus_ignored_are_those_sharing_an_id_another_holds() -> None:
    """Which SPU holds a shared id is store/spu_index.py's rule (tests/unit/test_spu_index.py)."""
    spus = entries(
        (builders.spu(1, name="one"), 3),
        (builders.spu(7, name="late"), 9),
        (builders.spu(7, name="early"), 5),
        (builders.spu(7, name="also-early"), 5),  # same revision (one transaction): by name
        (builders.spu(2, name="two"), 4),
    )
    no_index: dict[str, tuple[bytes, int]] = {}
    assert spu_ids.shadowed(spus, no_index.get) == [(7, "early", "also-early"), (7, "late", "also-early")]
    indexed = {KEY: held_by("late")}
    assert spu_ids.shadowed(spus, indexed.get) == [(7, "also-early", "late"), (7, "early", "late")]
    assert spu_ids.describe_shadowed([(7, "early", "late")]) == (
        "SPU 'early' has id 7, which SPU 'late' holds: placement ignores 'early'; "
        "delete it (DELETE /v1/spus/early) and register it again with a free id"
    )
    assert spu_ids.shadowed(entries((builders.spu(1), 3), (builders.spu(2), 4)), no_index.get) == []


def test_placement_sees_each_id_once_when_spus_share_one() -> None:
    """Before the index, four SPUs with id 7 made every topic of the cluster fail placement with
    "SPU id 7 appears more than once"; the SPUs that do not hold the id are left out instead."""
    store = local.LocalStore()
    for spu, revision in [(builders.spu(7, rack="r1", name="a"), 5), (builders.spu(7, rack="r2", name="b"), 6), (builders.spu(3), 7)]:
        store["spus"].apply(spu, revision)
    assert [(info.id, info.rack) for info in topic.spu_infos(store.snapshot())] == [(3, None), (7, "r1")]
