"""A decision that raises for one object stops that object only (controller/reconcile/faults.py):
in each controller, a fault injected for one object leaves the others' actions as they were, the
loop counts every fault and logs each object's error once, and a decision called outside a loop
still raises (so the property tests keep seeing every bug)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import structlog

from connection_manager import health as health_module
from controller.reconcile import actions, faults, partition, partition_state, spu, spu_group, topic
from store import local, memory, models
from tests import builders
from tests.unit.test_controllers import make_topic, snapshot_of
from tests.unit.test_election import part
from tests.unit.test_loop import controller_on
from tests.unit.test_partition_controller import OFFLINE, ONLINE, Passes, named


def injected(name: str) -> RuntimeError:
    return RuntimeError(f"injected fault for {name}")


def raising_for(monkeypatch: pytest.MonkeyPatch, module: Any, function: str, poisoned: str, name_of: Any) -> None:
    """``module.function`` raises when ``name_of(its first argument)`` is ``poisoned``."""
    real = getattr(module, function)

    def fake(*args: Any, **kwargs: Any) -> Any:
        if name_of(args[0]) == poisoned:
            raise injected(poisoned)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, function, fake)


def taken(recorded: faults.Faults) -> list[tuple[str, str, str]]:
    return [(fault.kind, fault.name, str(fault.error)) for fault in recorded.take()]


async def test_a_partition_whose_decision_raises_is_left_and_the_others_are_elected(monkeypatch: pytest.MonkeyPatch) -> None:
    led = tuple(named(part(0, [0, 1, 2]), f"led-{index}") for index in range(3))
    passes = Passes(led, (OFFLINE, ONLINE, ONLINE))
    raising_for(monkeypatch, partition_state, "decide", "led-1", lambda partition: partition.name)
    assert sorted(passes.decide()) == [("led-0", actions.Verb.ELECT), ("led-2", actions.Verb.ELECT)]
    assert taken(passes.controller.loop.faults) == [("partitions", "led-1", "injected fault for led-1")]
    # Outside a loop the same decision raises, as before.
    with pytest.raises(RuntimeError, match="injected fault for led-1"):
        view = partition.ClusterView(passes.controller._health.snapshot(), {})
        partition.decide(passes.local_store.snapshot(), partition.Inputs(view))


def test_an_spu_whose_decision_raises_is_left_and_the_others_are_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = snapshot_of(*((builders.spu(spu_id, resolution="Init"), 10 + spu_id) for spu_id in range(3)))
    health = {spu_id: health_module.HealthRecord(health_module.Health.ONLINE, 0.0) for spu_id in range(3)}
    real_target = spu._target
    calls = iter(range(3))

    def target(*args: Any) -> Any:
        if next(calls) == 1:  # the second SPU of the pass
            raise injected("spu-1")
        return real_target(*args)

    monkeypatch.setattr(spu, "_target", target)
    recorded = faults.Faults(isolate=True)
    decided = spu.decide(snapshot, spu.Inputs(health, now=1.0, started_at=0.0, grace_period=30.0, faults=recorded))
    assert sorted(action.name for action in decided) == ["spu-0", "spu-2"]
    assert taken(recorded) == [("spus", "spu-1", "injected fault for spu-1")]


def test_an_spu_group_whose_decision_raises_is_left_and_the_others_are_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = snapshot_of((builders.spu_group("first", 2, 10), 5), (builders.spu_group("second", 2, 20), 6))
    raising_for(monkeypatch, spu_group, "desired_spus", "first", lambda group: group.name)
    recorded = faults.Faults(isolate=True)
    decided = spu_group.decide(snapshot, spu_group.Inputs(faults=recorded))
    assert [(action.kind, action.name, action.verb) for action in decided] == [("spu-groups", "second", actions.Verb.UPDATE_STATUS)]
    assert taken(recorded) == [("spu-groups", "first", "injected fault for first")]
    with pytest.raises(RuntimeError, match="injected fault for first"):
        spu_group.decide(snapshot, spu_group.Inputs())


def test_a_topic_whose_partitions_cannot_be_built_is_left_and_the_others_get_theirs(monkeypatch: pytest.MonkeyPatch) -> None:
    provisioned = {"resolution": "Provisioned", "replicaMap": {"0": [0]}}
    snapshot = snapshot_of(
        *((builders.spu(spu_id), spu_id + 1) for spu_id in range(2)),
        (make_topic("first", provisioned, partitions=1, replicationFactor=1), 10),
        (make_topic("second", provisioned, partitions=1, replicationFactor=1), 11),
    )
    raising_for(monkeypatch, models, "new_partition", "first", lambda topic: topic.name)
    recorded = faults.Faults(isolate=True)
    decided = topic.decide(snapshot, topic.Inputs(faults=recorded))
    assert [(action.verb, action.name) for action in decided] == [(actions.Verb.CREATE_PARTITIONS, "second")]
    assert taken(recorded) == [("topics", "first", "injected fault for first")]


def test_a_topic_whose_placement_raises_is_left_and_the_others_are_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = snapshot_of(
        *((builders.spu(spu_id), spu_id + 1) for spu_id in range(2)),
        *((builders.topic(name, 1, 1, "Pending"), 10 + index) for index, name in enumerate(("first", "second", "third"))),
    )
    raising_for(monkeypatch, topic, "placement_request", "second", lambda pending: pending.name)
    recorded = faults.Faults(isolate=True)
    [provision] = topic.decide(snapshot, topic.Inputs(faults=recorded))
    assert [write.key for write in provision.writes] == [topic.CHAIN_KEY, "topics/first", "topics/third"]
    assert taken(recorded) == [("topics", "second", "injected fault for second")]


def test_a_managed_spu_whose_deletion_raises_is_left_and_the_others_are_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SPUs of a group that was deleted: each is deleted on its own.
    managed = spu_group.desired_spus(builders.spu_group("gone", 3, 10))
    snapshot = snapshot_of(*((spu_entry, 5 + index) for index, spu_entry in enumerate(managed)))
    raising_for(monkeypatch, spu_group, "_delete", "gone-1", lambda entry: entry.name)
    recorded = faults.Faults(isolate=True)
    decided = spu_group.decide(snapshot, spu_group.Inputs(faults=recorded))
    assert sorted((action.verb, action.name) for action in decided) == [(actions.Verb.DELETE, "gone-0"), (actions.Verb.DELETE, "gone-2")]
    assert taken(recorded) == [("spus", "gone-1", "injected fault for gone-1")]


def test_a_partition_whose_orphan_check_raises_is_left_and_the_others_are_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = snapshot_of(*((named(part(0, [0, 1]), f"gone-{index}"), 10 + index) for index in range(3)))
    raising_for(monkeypatch, topic, "_orphan", "gone-1", lambda entry: entry.name)
    recorded = faults.Faults(isolate=True)
    decided = topic.decide(snapshot, topic.Inputs(faults=recorded))
    assert [(action.verb, action.name) for action in decided] == [(actions.Verb.DELETE, "gone-0"), (actions.Verb.DELETE, "gone-2")]
    assert taken(recorded) == [("partitions", "gone-1", "injected fault for gone-1")]


async def test_the_loop_counts_every_fault_and_logs_each_objects_error_once() -> None:
    store = memory.MemoryStore()
    errors = ["first error", "first error", "first error", "another error"]

    def decide(snapshot: local.Snapshot, changes: Mapping[str, local.Changes[Any]]) -> list[actions.Action]:
        controller.faults.record("topics", "poison", RuntimeError(errors.pop(0)))
        return []

    _, controller = controller_on(store, local.LocalStore(), decide)
    try:
        with structlog.testing.capture_logs() as logged:
            for _ in range(4):
                controller.run_pass()
        said = [(entry["name"], entry["error"]) for entry in logged if entry["event"].startswith("a decision raised")]
        assert said == [("poison", "RuntimeError: first error"), ("poison", "RuntimeError: another error")]
        counted = controller.metrics.registry.get_sample_value("sc_reconcile_faults_total", {"controller": "test", "kind": "topics"})
        assert counted == 4
        assert controller.passes == 4
    finally:
        await store.close()


def test_a_move_whose_decision_raises_is_left_and_the_runs_other_moves_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebalance run is one stored object, but its moves are decided one by one: a bug that one
    move's partition triggers stops that move (and keeps the run from being marked done), not the
    rebalance controller and every other move with it."""
    from controller.reconcile import moves
    from tests.unit.test_rebalance_run import run_of, store_of, stored_partition, targets

    partitions = [stored_partition(f"t-{index}", [0, 1]) for index in range(3)]
    run = run_of(*((f"t-{index}", (0, 1), (2, 1)) for index in range(3)), limit=5)
    snapshot = store_of(*partitions, run=run.encode()).snapshot()
    raising_for(monkeypatch, moves, "status_of", "t-1", lambda move: move.partition)
    recorded = faults.Faults(isolate=True)
    decided = moves.decide(snapshot, moves.Inputs(faults=recorded))
    assert [name for name, _, _ in targets(decided)] == ["t-0", "t-2"]
    assert taken(recorded) == [("partitions", "t-1", "injected fault for t-1")]
    with pytest.raises(RuntimeError, match="injected fault for t-1"):
        moves.decide(snapshot, moves.Inputs())
    # The other moves done: the run is not marked done while one of its moves cannot be decided.
    finished = [stored_partition("t-0", [2, 1]), partitions[1], stored_partition("t-2", [2, 1])]
    snapshot = store_of(*finished, run=run.encode()).snapshot()
    assert moves.decide(snapshot, moves.Inputs(faults=recorded)) == []
    assert taken(recorded) == [("partitions", "t-1", "injected fault for t-1")]
