"""The meta values the SC reads back, written by anyone (a hand edit, a newer SC, a copy of another
cluster's keys): none may make a controller raise in every pass, stall placement, or leave a run
the SC accepted but cannot write back. Each case was found by trying hostile values on every meta
key the SC reads (tests/unit/test_controllers.py and the property tests cover the objects)."""

from __future__ import annotations

import json

from controller.reconcile import moves, topic
from store import kv, local, models
from tests import builders


def snapshot_with(*objects: tuple[models.AnyObject, int], meta: dict[str, tuple[bytes, int]]) -> local.Snapshot:
    store = local.LocalStore()
    for obj, revision in objects:
        store[obj.kind].apply(obj, revision)
    for key, (value, revision) in meta.items():
        store.meta.apply(key, value, revision)
    return store.snapshot()


def placed_with_chain(stored: bytes) -> list[tuple[str, list[str]]]:
    """What a pass decides for one pending topic when the placement chain holds ``stored``."""
    snapshot = snapshot_with(
        (builders.spu(0), 1), (builders.topic("orders", 1, 1, "Pending"), 2), meta={topic.CHAIN_KEY: (stored, 3)}
    )
    return [(action.verb.value, [write.key for write in action.writes]) for action in topic.decide(snapshot, topic.Inputs())]


def test_a_chain_index_too_long_to_write_back_restarts_at_0() -> None:
    # 4,300 digits: Python reads it, but cannot write the next index (4,301 digits) as text; the
    # topic controller raised ValueError in every pass (7 restarts in 10 s, nothing placed).
    assert placed_with_chain(b'{"nextStartIndex": ' + b"9" * 4300 + b"}") == [("provision", [topic.CHAIN_KEY, "topics/orders"])]
    assert topic.read_chain(snapshot_with(meta={topic.CHAIN_KEY: (b'{"nextStartIndex": 1e308}', 3)})).start_index == 0


def test_a_negative_chain_index_restarts_at_0_rather_than_refusing_every_new_topic() -> None:
    # Placement refused every topic ("start index must be ... at least 0"), and validation found
    # it valid again: each topic flipped between Pending and InvalidConfig, thousands of writes a second.
    for stored in (b'{"nextStartIndex": -1}', b'{"nextStartIndex": "-3"}', b'{"nextStartIndex": -1e308}'):
        assert placed_with_chain(stored) == [("provision", [topic.CHAIN_KEY, "topics/orders"])], stored


def test_a_rebalance_value_nested_too_deep_is_an_invalid_run_not_an_exception() -> None:
    # json.loads raised RecursionError, which the decoder did not catch: the rebalance controller
    # restarted for good and every /v1/cluster/rebalance route answered 500.
    snapshot = snapshot_with(meta={moves.KEY: (b"[" * 100_000 + b"]" * 100_000, 3)})
    found = moves.stored(snapshot)
    assert found.run is None and found.problem is not None and "not JSON" in found.problem
    assert moves.decide(snapshot, moves.Inputs()) == []


def test_a_stored_run_the_sc_accepts_is_one_it_can_write_back() -> None:
    # A move naming no partition the SC could have ("é" x 300,000: 600 KB stored, 1.8 MB once
    # written back with its characters escaped) was accepted; marking the run done or cancelling
    # it was then refused as too large for ever, and a new run as "running".
    raw = json.dumps(
        {"kind": "rebalance", "state": "running", "maxMovesPerSpu": 1, "moves": [{"partition": "é" * 300_000, "from": [0], "to": [1]}]},
        ensure_ascii=False,
    ).encode()
    assert len(raw) < kv.DEFAULT_MAX_REQUEST_BYTES  # the store holds it
    found = moves.stored(snapshot_with(meta={moves.KEY: (raw, 3)}))
    assert found.run is None and found.problem is not None and "is not a partition name" in found.problem
    # A run of real partition names is written back no larger than it was read.
    fine = json.dumps({"kind": "rebalance", "state": "running", "maxMovesPerSpu": 1, "moves": [{"partition": "orders-0", "from": [0], "to": [1]}]})
    run = moves.stored(snapshot_with(meta={moves.KEY: (fine.encode(), 3)})).run
    assert run is not None and len(run.with_state(moves.DONE).encode()) <= len(fine) + 64
