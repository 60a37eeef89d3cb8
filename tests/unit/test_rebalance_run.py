"""Rebalance runs (controller/reconcile/moves.py): the stored run decoded defensively, moves started
with at most N in flight per SPU, done once every move ended, cancelled moves sent back; and the
partition controller's writes for each step of a move."""

from __future__ import annotations

import json

import pytest

from connection_manager import health as health_module
from controller.reconcile import actions, moves, partition, partition_state
from controller.reconcile import spu as spu_controller
from controller.reconcile import topic as topic_controller
from store import local, models
from tests.builders import spu, topic


def stored_partition(name: str, replicas: list[int], move: tuple[list[int], list[int]] | None = None, isr: list[int] | None = None, leader: int | None = None) -> models.Partition:
    reassignment = None if move is None else models.Reassignment(previous=move[0], target=move[1])
    in_sync = list(replicas if isr is None else isr)
    lead = replicas[0] if leader is None else leader
    return models.Partition(
        name=name,
        spec=models.PartitionSpec(leader=lead, replicas=replicas, reassignment=reassignment),
        status=models.PartitionStatus(
            resolution=models.PartitionResolution.ONLINE, leader_epoch=1, partition_epoch=1, isr=in_sync,
            leader=models.ReplicaStatus(spu=lead, hw=5, leo=5),
        ),
    )


def store_of(*objects: models.AnyObject, run: bytes | None = None) -> local.LocalStore:
    """The objects, and topic ``t`` Provisioned with the replica map their partitions of ``t`` imply."""
    store = local.LocalStore()
    mapped = {
        obj.index: (obj.spec.reassignment.target if obj.spec.reassignment else obj.spec.replicas)
        for obj in objects
        if isinstance(obj, models.Partition)
    }
    if mapped:
        objects = (topic("t", len(mapped), 2, "Provisioned", replica_map=mapped), *objects)
    for revision, obj in enumerate(objects, start=1):
        store[obj.kind].apply(obj, revision)
    store.meta.resync([] if run is None else [(moves.KEY, run, 100)], 100)
    return store


def run_of(*planned: tuple[str, tuple[int, ...], tuple[int, ...]], state: str = moves.RUNNING, limit: int = 1) -> moves.Run:
    return moves.Run(moves.REBALANCE, state, limit, tuple(moves.PlannedMove(*move) for move in planned))


def targets(decided: list[actions.Action]) -> list[tuple[str, list[int], list[int]]]:
    """(partition, previous, target) of each reassignment written; each action also points its
    topic's replica map at the targets, in the same transaction."""
    found = []
    for action in decided:
        *written, mapped = action.objects
        assert isinstance(mapped, models.Topic) and action.write_keys[-1] == mapped.key
        for obj in written:
            assert isinstance(obj, models.Partition) and obj.spec.reassignment is not None
            assert mapped.status.replica_map[obj.index] == obj.spec.reassignment.target
            found.append((obj.name, obj.spec.reassignment.previous, obj.spec.reassignment.target))
    return found


# ---------------------------------------------------------------------------- the stored run


def test_a_run_round_trips_through_its_stored_form() -> None:
    run = moves.Run(moves.DECOMMISSION, moves.RUNNING, 3, (moves.PlannedMove("t-0", (0, 1), (2, 1)),), (0,))
    assert moves.decode(run.encode()) == run
    assert json.loads(run.encode()) == {
        "kind": "decommission", "state": "running", "maxMovesPerSpu": 3, "decommissioning": [0],
        "moves": [{"partition": "t-0", "from": [0, 1], "to": [2, 1]}],
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\xff", "is not JSON"),
        (b"[]", r"must be a JSON object, got \[\]"),
        (b'{"kind": "x", "state": "running", "maxMovesPerSpu": 1, "moves": []}', "kind 'x' is not"),
        (b'{"kind": "rebalance", "state": "paused", "maxMovesPerSpu": 1, "moves": []}', "state 'paused' is not one of running, done, cancelled"),
        (b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": 0, "moves": []}', "maxMovesPerSpu 0 is not an integer from 1 to 10000"),
        (b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": true, "moves": []}', "maxMovesPerSpu True"),
        (b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": 1, "moves": {}}', "moves must be a list"),
        (b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": 1, "moves": [{"partition": "t-0"}]}', r"moves\[0\] must be"),
        (
            b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": 1, "moves": [{"partition": "t-0", "from": [1, 1], "to": [2]}]}',
            r"moves\[0\].from must list distinct SPU ids from 0 to 2147483647, got \[1, 1\]",
        ),
        (
            b'{"kind": "rebalance", "state": "done", "maxMovesPerSpu": 1, "moves": [{"partition": "t-0", "from": [1], "to": [-2]}]}',
            r"moves\[0\].to must list distinct SPU ids",
        ),
        (
            # A running move to an id no SPU can have: starting it raised in every pass.
            b'{"kind": "rebalance", "state": "running", "maxMovesPerSpu": 1, "moves": [{"partition": "t-0", "from": [1, 2], "to": [1, 2147483648]}]}',
            r"moves\[0\].to must list distinct SPU ids from 0 to 2147483647, got \[1, 2147483648\]",
        ),
    ],
)
def test_a_stored_value_that_is_not_a_run_is_named_and_never_acted_on(value: bytes, message: str) -> None:
    with pytest.raises(moves.InvalidRun, match=message):
        moves.decode(value)
    snapshot = store_of(stored_partition("t-0", [1, 2]), run=value).snapshot()
    assert moves.decide(snapshot, moves.Inputs()) == []
    shown = moves.progress(snapshot).to_json()
    assert shown["state"] == "idle" and shown["problem"]


# ---------------------------------------------------------------------------- starting moves


def test_moves_start_in_plan_order_with_at_most_the_limit_in_flight_per_spu() -> None:
    """A move counts against the SPUs it changes: the one leaving and the one arriving."""
    partitions = [stored_partition(f"t-{i}", [0, 1]) for i in range(4)]
    planned = [("t-0", (0, 1), (2, 1)), ("t-1", (0, 1), (0, 3)), ("t-2", (0, 1), (3, 1)), ("t-3", (0, 1), (0, 2))]
    one = run_of(*planned, limit=1)
    # t-0 takes SPUs 0 and 2, t-1 SPUs 1 and 3; t-2 (0, 3) and t-3 (1, 2) wait for a slot.
    assert targets(moves.decide(store_of(*partitions, run=one.encode()).snapshot(), moves.Inputs())) == [
        ("t-0", [0, 1], [2, 1]), ("t-1", [0, 1], [0, 3])
    ]
    two = run_of(*planned, limit=2)
    assert len(targets(moves.decide(store_of(*partitions, run=two.encode()).snapshot(), moves.Inputs()))) == 4


def test_a_move_in_flight_or_just_submitted_holds_its_spus_slots() -> None:
    moving_t0 = stored_partition("t-0", [0, 1, 2], move=([0, 1], [2, 1]))
    run = run_of(("t-0", (0, 1), (2, 1)), ("t-1", (0, 1), (3, 1)), ("t-2", (4, 5), (6, 5)), limit=1)
    snapshot = store_of(moving_t0, stored_partition("t-1", [0, 1]), stored_partition("t-2", [4, 5]), run=run.encode()).snapshot()
    assert targets(moves.decide(snapshot, moves.Inputs())) == [("t-2", [4, 5], [6, 5])]
    # t-2's start is in flight (not back in the mirror): it is not started twice, nor is its slot given away.
    assert moves.decide(snapshot, moves.Inputs(busy={"partitions/t-2"}.__contains__)) == []


def test_the_run_is_done_once_every_move_ended_or_was_overtaken() -> None:
    run = run_of(("t-0", (0, 1), (2, 1)), ("t-1", (0, 1), (3, 1)))
    # t-0 done; t-1 changed by something else (its replicas are neither before nor after): skipped.
    snapshot = store_of(stored_partition("t-0", [2, 1]), stored_partition("t-1", [4, 1]), run=run.encode()).snapshot()
    (write,) = moves.decide(snapshot, moves.Inputs())
    assert write.write_keys == (moves.KEY,) and write.writes[0].expected_revision == 100
    assert moves.decode(write.writes[0].value or b"").state == moves.DONE
    assert write.reason == "rebalance done: 1 move(s) done, 1 skipped (partition deleted or changed meanwhile: t-1)"
    progress = moves.progress(snapshot)
    assert (progress.state, progress.total, progress.done, progress.skipped) == ("running", 2, 1, ("t-1",))
    # Done stays done: nothing more.
    done = store_of(stored_partition("t-0", [2, 1]), run=run.with_state(moves.DONE).encode()).snapshot()
    assert moves.decide(done, moves.Inputs()) == []


def test_cancel_sends_the_moves_in_flight_back_and_starts_nothing() -> None:
    run = run_of(("t-0", (0, 1), (2, 1)), ("t-1", (0, 1), (3, 1)), ("t-2", (0, 1), (0, 4)), state=moves.CANCELLED, limit=5)
    snapshot = store_of(
        stored_partition("t-0", [0, 1, 2], move=([0, 1], [2, 1])),  # moving: goes back
        stored_partition("t-1", [3, 1]),  # done: stays
        stored_partition("t-2", [0, 1]),  # not started: stays
        run=run.encode(),
    ).snapshot()
    decided = moves.decide(snapshot, moves.Inputs())
    assert targets(decided) == [("t-0", [0, 1], [0, 1])]
    assert decided[0].cause == moves.CAUSE_CANCELLED
    progress = moves.progress(snapshot)
    assert (progress.state, progress.done, progress.in_flight, progress.pending) == ("cancelled", 1, ("t-0",), 1)


# ---------------------------------------------------------------------------- the partition controller's writes


def _decide(p: models.Partition, online: set[int]) -> list[actions.Action]:
    spus = [spu(i) for i in range(5)]
    snapshot = store_of(*spus, p).snapshot()
    records = {i: health_module.HealthRecord(health_module.Health.ONLINE if i in online else health_module.Health.OFFLINE, 0.0) for i in range(5)}
    return partition.decide(snapshot, partition.Inputs(partition.ClusterView(records, {}))).actions


def test_the_partition_controller_writes_each_step_with_its_spec_and_cause() -> None:
    (start,) = _decide(stored_partition("t-0", [0, 1], move=([0, 1], [2, 1])), {0, 1, 2})
    (written,) = start.objects
    assert isinstance(written, models.Partition)
    assert (start.verb, start.cause) == (actions.Verb.UPDATE_SPEC, partition_state.MOVE_ADDING)
    assert written.spec == models.PartitionSpec(leader=0, replicas=[0, 1, 2], reassignment=models.Reassignment(previous=[0, 1], target=[2, 1]))
    assert [replica.spu for replica in written.status.replicas] == [1, 2]

    (handover,) = _decide(stored_partition("t-0", [0, 1, 2], move=([0, 1], [2, 1]), isr=[0, 1, 2]), {0, 1, 2})
    (written,) = handover.objects
    assert isinstance(written, models.Partition)
    assert (handover.verb, handover.cause) == (actions.Verb.ELECT, partition_state.CAUSE_REASSIGNMENT)
    assert (written.spec.leader, written.spec.replicas, written.status.leader_epoch) == (2, [0, 1, 2], 2)
    assert written.spec.reassignment is not None

    (end,) = _decide(stored_partition("t-0", [0, 1, 2], move=([0, 1], [2, 1]), isr=[0, 1, 2], leader=2), {0, 1, 2})
    (written,) = end.objects
    assert isinstance(written, models.Partition)
    assert (end.verb, end.cause) == (actions.Verb.UPDATE_SPEC, partition_state.MOVE_COMPLETED)
    assert written.spec == models.PartitionSpec(leader=2, replicas=[2, 1])
    assert (written.status.isr, written.status.partition_epoch) == ([1, 2], 2)


def test_a_decommissioned_spu_takes_no_new_replica_and_its_status_follows_what_it_holds() -> None:
    retiring = spu(1)
    retiring = retiring.model_copy(update={"spec": retiring.spec.model_copy(update={"decommission": True})})
    holding = store_of(spu(0), retiring, stored_partition("t-0", [0, 1])).snapshot()
    assert [(info.id, info.online) for info in topic_controller.spu_infos(holding)] == [(0, True), (1, False)]
    inputs = spu_controller.Inputs(health={}, now=0.0, started_at=0.0, grace_period=10.0)
    (marked,) = spu_controller.decide(holding, inputs)
    (written,) = marked.objects
    assert isinstance(written, models.Spu) and written.status.decommission is models.SpuDecommission.IN_PROGRESS
    assert marked.reason == "SPU 1 is decommissioned: 1 replica(s) still on it"
    empty = store_of(spu(0), retiring, stored_partition("t-0", [0, 2])).snapshot()
    (marked,) = spu_controller.decide(empty, inputs)
    (written,) = marked.objects
    assert isinstance(written, models.Spu) and written.status.decommission is models.SpuDecommission.DONE
    assert marked.reason == "SPU 1 is decommissioned: it holds no replica, it may be deleted"


def test_the_run_is_decoded_again_only_when_its_value_changed() -> None:
    run = run_of(("t-0", (0, 1), (2, 1)))
    store = store_of(stored_partition("t-0", [0, 1]), run=run.encode())
    first = moves.stored(store.snapshot())
    assert first.run == run and moves.stored(store.snapshot(), first) is first
    store.meta.apply(moves.KEY, run.with_state(moves.CANCELLED).encode(), 101)
    again = moves.stored(store.snapshot(), first)
    assert again is not first and again.run == run.with_state(moves.CANCELLED)


def test_a_move_started_keeps_the_partitions_identity() -> None:
    """The reassignment is written into the spec: the partition's uid (its identity for its SPUs) stays."""
    stored = stored_partition("t-0", [0, 1])
    stored = stored.model_copy(update={"uid": 12345})
    snapshot = store_of(stored, run=run_of(("t-0", (0, 1), (2, 1))).encode()).snapshot()
    decided = moves.decide(snapshot, moves.Inputs())
    assert targets(decided) == [("t-0", [0, 1], [2, 1])]
    [written] = [obj for obj in decided[0].objects if isinstance(obj, models.Partition)]
    assert written.uid == 12345
    assert json.loads(decided[0].writes[0].value or b"")["uid"] == 12345
