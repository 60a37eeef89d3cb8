"""An SPU's state: applying the SC's Sync and Update, serving and applying fetch rounds, what it
tells the SC (what it holds, leaderships, proposals, changed offsets only) and what changed."""

from __future__ import annotations

import random

import pytest

from connection_manager import wire
from connection_manager.spu import fetch_wire
from connection_manager.spu.replica import Proposal, Role
from connection_manager.spu.state import Offsets, ReplicaStatus, SpuState, SyncRequired

LAG = 2.0


def spu_info(spu_id: int, port: int | None = None) -> wire.SpuInfo:
    return wire.SpuInfo(
        id=spu_id,
        name=f"spu-{spu_id}",
        public_endpoint=wire.Endpoint(host="127.0.0.1", port=9100 + spu_id),
        private_endpoint=wire.Endpoint(host="127.0.0.1", port=port if port is not None else 9200 + spu_id),
    )


def hosted(partition: str, leader: int | None, replicas: list[int], epoch: int = 1, isr: list[int] | None = None) -> wire.ReplicaInfo:
    return wire.ReplicaInfo(
        partition=partition, leader=leader, leader_epoch=epoch, partition_epoch=epoch,
        isr=replicas if isr is None else isr, replicas=replicas,
    )


def roles(state: SpuState) -> dict[str, tuple[Role, int | None, int, int]]:
    return {name: (r.role, r.leader, r.leo, r.hw) for name, r in state.replicas.items()}


def synced_state(spu_id: int = 0) -> SpuState:
    state = SpuState(spu_id, LAG)
    state.incarnation = 40 + spu_id  # the SC accepted its connection (numbered so)
    state.apply_sync(
        wire.Sync(
            epoch=1,
            spus=[spu_info(0), spu_info(1), spu_info(2)],
            replicas=[hosted("a-0", 0, [0, 1, 2]), hosted("a-1", 1, [1, 2, 0]), hosted("b-0", 2, [2, 0]), hosted("c-0", None, [1, 0])],
        ),
        now=0.0,
    )
    state.drain()
    return state


def fetch(partition: str, offset: int, epoch: int = 1, last: int = -1, hw: int = 0) -> fetch_wire.PartitionFetch:
    return fetch_wire.PartitionFetch(partition=partition, offset=offset, hw=hw, leader_epoch=epoch, last_fetched_epoch=last)


def test_a_sync_gives_each_replica_its_role_and_restored_logs_go_to_their_partitions() -> None:
    state = SpuState(0, LAG)
    state.restore({"a-0": Offsets(500, 400, ((1, 0),)), "a-1": Offsets(300, 300, ((1, 0),)), "gone-0": Offsets(9, 9, ((1, 0),))})
    # What it says it holds before the SC's picture: nothing told to this process yet.
    assert state.hosted() == wire.Hosted(
        partitions=[
            wire.HostedReplica(partition="a-0", leo=500, leader_epoch=None),
            wire.HostedReplica(partition="a-1", leo=300, leader_epoch=None),
            wire.HostedReplica(partition="gone-0", leo=9, leader_epoch=None),
        ]
    )
    state.apply_sync(
        wire.Sync(
            epoch=7,
            spus=[spu_info(0), spu_info(1)],
            replicas=[hosted("a-0", 0, [0, 1], epoch=3), hosted("a-1", 1, [1, 0], epoch=2), hosted("b-0", None, [1, 0])],
        ),
        now=0.0,
    )
    assert roles(state) == {
        "a-0": (Role.LEADER, 0, 500, 400),  # its HW waits for SPU 1 at epoch 3
        "a-1": (Role.FOLLOWER, 1, 300, 300),
        "b-0": (Role.IDLE, None, 0, 0),
    }
    assert (state.epoch, state.synced, sorted(state.spus)) == (7, True, [0, 1])
    assert state.followed_leaders() == {1: ["a-1"]}
    assert state.drain().leaderships == {"a-0": 3}
    assert [(e["partition"], e["leader_epoch"]) for e in state.hosted().partitions] == [("a-0", 3), ("a-1", 2), ("b-0", None)]
    # What the first sync did not assign is not resumed later: the SC's picture is authoritative.
    assert state.logs() == {
        "a-0": Offsets(500, 400, ((1, 0),)), "a-1": Offsets(300, 300, ((1, 0),)), "b-0": Offsets(0, 0, ()),
    }


def test_restored_logs_not_yet_assigned_are_kept_for_the_next_checkpoint() -> None:
    state = SpuState(0, LAG)
    state.restore({"a-0": Offsets(500, 400, ((0, 0),))})
    assert state.logs() == {"a-0": Offsets(500, 400, ((0, 0),))}


def test_a_later_sync_replaces_the_picture_and_keeps_the_logs_of_partitions_still_hosted() -> None:
    state = synced_state()
    state.replicas["a-0"].append(40, now=0.0)
    state.apply_sync(wire.Sync(epoch=9, spus=[spu_info(0), spu_info(2)], replicas=[hosted("a-0", 2, [0, 1, 2], epoch=2)]), now=1.0)
    assert roles(state) == {"a-0": (Role.FOLLOWER, 2, 40, 0)}
    assert (state.epoch, sorted(state.spus), state.followed_leaders()) == (9, [0, 2], {2: ["a-0"]})
    with pytest.raises(ValueError, match=r"^SPU 0: offsets can only be restored before the first sync$"):
        state.restore({})


def test_an_update_switches_roles_at_once_and_deletes_before_it_adds() -> None:
    state = synced_state()
    state.replicas["a-0"].append(40, now=0.0)
    state.replicas["b-0"].log.leo = 25
    state.apply_update(
        wire.Update(
            epoch=2,
            spus=[spu_info(1, port=9999), spu_info(3)],
            deleted_spus=[2],
            replicas=[
                hosted("a-0", 1, [0, 1, 2], epoch=2), hosted("a-1", 0, [1, 2, 0], epoch=2), hosted("b-0", 0, [2, 0]),
                hosted("d-0", 1, [1, 0]),
            ],
            deleted_replicas=["c-0", "b-0"],
        ),
        now=1.0,
    )
    assert roles(state) == {
        "a-0": (Role.FOLLOWER, 1, 40, 0),
        "a-1": (Role.LEADER, 0, 0, 0),
        "b-0": (Role.LEADER, 0, 0, 0),  # deleted and re-created in one update: a new partition, from 0
        "d-0": (Role.FOLLOWER, 1, 0, 0),
    }
    assert (state.epoch, sorted(state.spus), state.endpoint_of(1)) == (2, [0, 1, 3], wire.Endpoint(host="127.0.0.1", port=9999))
    assert (state.endpoint_of(2), state.followed_leaders()) == (None, {1: ["a-0", "d-0"]})
    assert state.drain().leaderships == {"a-1": 2, "b-0": 1}


def test_an_update_before_any_sync_is_refused() -> None:
    with pytest.raises(SyncRequired, match=r"^update of epoch 3 arrived before any sync$"):
        SpuState(0, LAG).apply_update(wire.Update(epoch=3), now=0.0)


def test_one_fetch_round_carries_every_partition_followed_from_that_leader_with_its_epochs() -> None:
    state = synced_state(spu_id=2)  # SPU 2 leads b-0 and follows a-0 (from 0) and a-1 (from 1)
    state.replicas["a-1"].log.append(1, 70)
    state.replicas["a-1"].hw = 60
    assert state.fetch_request(1, max_records=500) == fetch_wire.FetchRequest(
        spu=2, incarnation=42, max_records=500, partitions=[fetch("a-1", 70, last=1, hw=60)]
    )
    assert state.fetch_request(0, max_records=500) == fetch_wire.FetchRequest(
        spu=2, incarnation=42, max_records=500, partitions=[fetch("a-0", 0)]
    )
    assert state.fetch_request(2, max_records=500) is None


def test_a_process_the_sc_never_accepted_does_not_fetch() -> None:
    """Its fetches must name the connection the SC knows it by (KIP-903): before the first, none."""
    state = synced_state(spu_id=2)
    state.incarnation = None
    assert (state.fetch_request(0, max_records=500), state.fetch_request(1, max_records=500)) == (None, None)


def test_a_leader_records_each_follower_under_the_incarnation_its_fetch_names() -> None:
    state = synced_state()  # SPU 0 leads a-0 (replicas 0, 1, 2)
    state.append(100, now=0.0)
    state.serve(fetch_wire.FetchRequest(spu=1, incarnation=7, max_records=500, partitions=[fetch("a-0", 100, last=1)]), now=0.1)
    assert state.replicas["a-0"].followers[1].incarnation == 7
    state.serve(fetch_wire.FetchRequest(spu=1, incarnation=8, max_records=500, partitions=[fetch("a-0", 40, last=1)]), now=0.2)
    progress = state.replicas["a-0"].followers[1]
    assert (progress.incarnation, progress.leo, progress.last_caught_up_at) == (8, 40, None)


def test_a_leader_serves_the_partitions_it_can_and_names_the_others() -> None:
    state = synced_state()
    state.append(100, now=0.0)  # a-0 is the only partition SPU 0 leads
    request = fetch_wire.FetchRequest(
        spu=1, max_records=30, partitions=[fetch("a-0", 20, last=1), fetch("a-1", 0), fetch("zz-0", 0), fetch("a-0", 0, epoch=0)]
    )
    assert state.serve(request, now=0.5) == fetch_wire.FetchResponse(
        partitions=[
            fetch_wire.PartitionFetched(partition="a-0", offset=20, leo=100, hw=0, records=30, epochs=[(1, 20)]),
            fetch_wire.PartitionFetched(partition="a-1", offset=0, error="not-leader"),
            fetch_wire.PartitionFetched(partition="zz-0", offset=0, error="not-leader"),
            fetch_wire.PartitionFetched(partition="a-0", offset=0, error="fenced-leader-epoch"),
        ]
    )
    stranger = request.model_copy(update={"spu": 5})
    assert state.serve(stranger, now=0.5).partitions[0] == fetch_wire.PartitionFetched(partition="a-0", offset=20, error="not-a-replica")
    # A follower at a newer epoch: refused; only the SC's word would make this leader stop.
    newer = fetch_wire.FetchRequest(spu=1, max_records=30, partitions=[fetch("a-0", 0, epoch=2)])
    assert state.serve(newer, now=0.6).partitions[0].error == "unknown-leader-epoch"
    assert (state.replicas["a-0"].role, state.drain().stepped_down) == (Role.LEADER, {})


def test_a_follower_applies_each_partition_of_an_answer_on_its_own_and_truncates_where_told() -> None:
    state = synced_state(spu_id=2)
    state.apply_update(wire.Update(epoch=2, replicas=[hosted("a-2", 0, [0, 2]), hosted("a-3", 0, [0, 2])]), now=0.0)
    state.replicas["a-3"].log.append(1, 10)
    state.replicas["a-2"].log.append(1, 30)
    response = fetch_wire.FetchResponse(
        partitions=[
            fetch_wire.PartitionFetched(partition="a-0", offset=0, leo=100, hw=40, records=50, epochs=[(1, 0)]),
            fetch_wire.PartitionFetched(partition="a-2", offset=30, leo=12, hw=12, diverging_epoch=1, diverging_end_offset=12),
            fetch_wire.PartitionFetched(partition="a-3", offset=10, leo=20, hw=0, records=50, epochs=[(1, 10)]),
            fetch_wire.PartitionFetched(partition="gone-0", offset=0, leo=10, hw=0, records=10, epochs=[(1, 0)]),
        ]
    )
    assert state.apply_response(0, response) == {
        "a-3": "partition 'a-3': leader 0 answered a fetch at offset 10 with 50 records, LEO 20, HW 0, which do not add up",
    }
    assert (roles(state)["a-0"], roles(state)["a-2"], roles(state)["a-3"]) == (
        (Role.FOLLOWER, 0, 50, 40), (Role.FOLLOWER, 0, 12, 0), (Role.FOLLOWER, 0, 10, 0)
    )
    assert state.drain().logs == {"a-0", "a-2"}
    # The same answer again is stale: a-0 has moved on to offset 50.
    assert state.apply_response(0, response.model_copy(update={"partitions": response.partitions[:1]})) == {}
    assert roles(state)["a-0"] == (Role.FOLLOWER, 0, 50, 40)


def test_offsets_are_sent_for_what_changed_only_and_nothing_while_idle() -> None:
    state = synced_state()
    assert state.offsets() == [
        wire.PartitionOffsets(partition="a-0", leader_epoch=1, hw=0, leo=0, followers=[])  # it started leading: once
    ]
    assert state.offsets() == []
    state.append(100, now=0.0)
    state.serve(fetch_wire.FetchRequest(spu=2, max_records=60, partitions=[fetch("a-0", 0)]), now=0.25)
    assert state.offsets() == [
        wire.PartitionOffsets(partition="a-0", leader_epoch=1, hw=0, leo=100, followers=[wire.ReplicaOffsets(spu=2, hw=0, leo=0)])
    ]
    # The same fetch again changes nothing: nothing to send.
    state.serve(fetch_wire.FetchRequest(spu=2, max_records=60, partitions=[fetch("a-0", 0)]), now=0.3)
    assert state.offsets() == []
    assert len(state.offsets(only_changed=False)) == 1
    assert SpuState(0, LAG).offsets(only_changed=False) == []


def test_time_makes_a_leader_propose_and_the_answer_is_adopted() -> None:
    state = synced_state()
    state.tick(1.0)
    assert state.drain().proposals == []  # within the lag time of its leadership
    state.tick(2.5)
    [(name, proposal)] = state.drain().proposals
    assert (name, proposal) == ("a-0", Proposal((0,), 1, 1, 2.5))
    assert state.pending_proposals() == [("a-0", proposal)]
    state.proposal_answered(
        wire.AlterIsrResult(partition="a-0", leader_epoch=1, partition_epoch=2, isr=[0]), now=2.6
    )
    assert (state.pending_proposals(), state.replicas["a-0"].isr) == ([], (0,))
    state.append(10, now=3.0)
    assert state.drain().acked == {"a-0": (1, 10, 1)}  # alone in its set: each burst is committed at once


def test_the_sc_fencing_an_epoch_makes_its_leader_stop() -> None:
    state = synced_state()
    assert state.fenced("a-0", 1) is False
    assert state.fenced("a-0", 2) is True
    assert state.replicas["a-0"].role is Role.IDLE
    assert state.leaderships() is None
    assert state.fenced("nope-0", 5) is False


def test_the_status_of_a_replica_is_a_snapshot() -> None:
    state = synced_state()
    state.serve(fetch_wire.FetchRequest(spu=1, max_records=60, partitions=[fetch("a-0", 0)]), now=0.0)
    assert state.status("a-0", now=1.0) == ReplicaStatus("a-0", Role.LEADER, 0, 1, 0, 0, (1, 2), {1: 0}, (0, 1, 2))
    assert state.status("a-1", now=0.0) == ReplicaStatus("a-1", Role.FOLLOWER, 1, 1, 0, 0, (), {}, (1, 2, 0))
    assert state.status("nope-0", now=0.0) is None


def test_the_partitions_followed_from_each_leader_stay_those_of_the_whole_picture() -> None:
    """Kept up to date from what each Update (or fence) touched, not rebuilt over every replica:
    always what a pass over the whole picture finds, in name order."""

    def reference(state: SpuState) -> dict[int, list[str]]:
        following: dict[int, list[str]] = {}
        for name, replica in sorted(state.replicas.items()):
            if replica.role is Role.FOLLOWER and replica.leader is not None:
                following.setdefault(replica.leader, []).append(name)
        return following

    rng = random.Random(11)
    names = [f"t-{index}" for index in range(25)]
    state = SpuState(0, LAG)
    epochs = dict.fromkeys(names, 1)

    def picked(name: str) -> wire.ReplicaInfo:
        epochs[name] += 1
        leader = rng.choice([None, 0, 1, 2, 3])
        return hosted(name, leader, [0, 1, 2, 3], epoch=epochs[name])

    state.apply_sync(wire.Sync(epoch=1, spus=[], replicas=[picked(name) for name in names[:15]]), 0.0)
    assert state.followed_leaders() == reference(state)
    for step in range(300):
        if step % 50 == 49:
            chosen = rng.sample(names, 12)
            state.apply_sync(wire.Sync(epoch=step, spus=[], replicas=[picked(name) for name in chosen]), 0.0)
        elif rng.random() < 0.2:
            name = rng.choice(names)
            state.fenced(name, epochs[name] + 1)
        else:
            touched = rng.sample(names, rng.randint(1, 4))
            deleted = [name for name in touched if rng.random() < 0.2]
            replicas = [picked(name) for name in touched if name not in deleted]
            state.apply_update(wire.Update(epoch=step, replicas=replicas, deleted_replicas=deleted), 0.0)
        assert state.followed_leaders() == reference(state), step


def identified(info: wire.ReplicaInfo, uid: int) -> wire.ReplicaInfo:
    return info.model_copy(update={"uid": uid})


def test_a_replica_told_under_another_uid_is_another_partition_whose_log_starts_empty() -> None:
    """An SPU away while its partition was deleted and created again (same name, leader and epochs:
    a topic created again places the same) was told the new one in its next Sync (or an SC that
    relisted its store told it in an Update, with no deletion) and kept the old log for it: it led
    the new partition with the old one's records and HW. The uid the SC sends says
    which partition of the name it is: another one is a new replica (its leadership said again)."""
    state = SpuState(0, LAG)
    state.incarnation = 40
    state.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0), spu_info(1)], replicas=[identified(hosted("a-0", 0, [0, 1]), 5)]), now=0.0)
    state.replicas["a-0"].append(100, now=0.0)
    state.drain()
    # The same partition again: its log stays.
    state.apply_sync(wire.Sync(epoch=2, spus=[spu_info(0), spu_info(1)], replicas=[identified(hosted("a-0", 0, [0, 1]), 5)]), now=1.0)
    assert (roles(state), state.drain().removed) == ({"a-0": (Role.LEADER, 0, 100, 0)}, set())
    # Another one of the name, by Sync then by Update.
    for apply in (
        lambda info: state.apply_sync(wire.Sync(epoch=3, spus=[spu_info(0), spu_info(1)], replicas=[info]), now=2.0),
        lambda info: state.apply_update(wire.Update(epoch=4, replicas=[info]), now=3.0),
    ):
        state.replicas["a-0"].append(100, now=2.0)
        state.drain()
        identity = state.replicas["a-0"].uid + 1  # type: ignore[operator]  # told one above
        apply(identified(hosted("a-0", 0, [0, 1]), identity))
        assert roles(state) == {"a-0": (Role.LEADER, 0, 0, 0)}
        changes = state.drain()
        assert (changes.removed, changes.leaderships, changes.logs) == ({"a-0"}, {"a-0": 1}, {"a-0"})
        assert state.hosted().partitions == [{"partition": "a-0", "leo": 0, "leader_epoch": 1, "uid": identity}]
        assert state.logs() == {"a-0": Offsets(0, 0, (), identity)}


def test_a_restored_log_goes_only_to_the_partition_it_is_of() -> None:
    """A process restarted from its data directory holds logs of the partitions its previous
    process was told, by name and uid; one the SC now describes under another create
    revision is another partition's (deleted and created again meanwhile), and starts empty. A log
    saved without one (an SC older than the field told it) is taken as before."""
    state = SpuState(0, LAG)
    state.restore({"a-0": Offsets(500, 400, ((1, 0),), 5), "a-1": Offsets(300, 300, ((1, 0),), 6), "a-2": Offsets(200, 200, ((1, 0),))})
    assert state.hosted().partitions == [
        {"partition": "a-0", "leo": 500, "leader_epoch": None, "uid": 5},
        {"partition": "a-1", "leo": 300, "leader_epoch": None, "uid": 6},
        {"partition": "a-2", "leo": 200, "leader_epoch": None},
    ]
    replicas = [identified(hosted("a-0", 1, [1, 0]), 5), identified(hosted("a-1", 1, [1, 0]), 9), identified(hosted("a-2", 1, [1, 0]), 7)]
    state.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0), spu_info(1)], replicas=replicas), now=0.0)
    assert {name: replica.leo for name, replica in state.replicas.items()} == {"a-0": 500, "a-1": 0, "a-2": 200}
    assert state.logs() == {
        "a-0": Offsets(500, 400, ((1, 0),), 5), "a-1": Offsets(0, 0, (), 9), "a-2": Offsets(200, 200, ((1, 0),), 7),
    }
    assert state.drain().logs == {"a-0", "a-1", "a-2"}  # journaled with the partition each log is of


def test_what_an_spu_says_of_a_partition_names_the_uid_it_was_told() -> None:
    """Every entry about a partition (hosted, leading, offsets, a proposal) names the partition it
    is about, when the SC said which: the SC drops what is about another one. Told none (an SC
    older than the field, which would refuse the key), it names none."""
    state = SpuState(0, LAG)
    state.incarnation = 40
    replicas = [identified(hosted("a-0", 0, [0, 1]), 5), hosted("b-0", 0, [0, 1])]
    state.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0), spu_info(1)], replicas=replicas), now=0.0)
    state.append(10, now=0.0)
    assert state.hosted().partitions == [
        {"partition": "a-0", "leo": 10, "leader_epoch": 1, "uid": 5},
        {"partition": "b-0", "leo": 10, "leader_epoch": 1},
    ]
    leading = state.leaderships()
    assert leading is not None and leading.partitions == [
        {"partition": "a-0", "leader_epoch": 1, "uid": 5}, {"partition": "b-0", "leader_epoch": 1},
    ]
    assert [entry.get("uid") for entry in state.offsets(only_changed=False)] == [5, None]
    state.tick(now=LAG + 1)  # SPU 1 never fetched: each leader proposes it out
    proposals = dict(state.drain().proposals)
    assert (proposals["a-0"].uid, proposals["b-0"].uid) == (5, None)
    for frame in (state.hosted(), leading, wire.Offsets(partitions=state.offsets(only_changed=False))):
        assert wire.parse_spu_message(wire.encode(frame)) == frame


def test_a_fetch_between_two_partitions_of_one_name_is_refused_and_an_answer_for_a_replaced_replica_is_dropped() -> None:
    """The partition's leader and a follower read the SC's update that deleted it and assigned a
    new one of the name (same leader, leader epoch 0 again) at different times. Meanwhile the
    follower fetched for the old partition from the leader of the new one, at the same epoch: the
    leader answered from its new log and recorded the follower as holding every record below its
    old log's end (which it would count for its HW, and propose into the in-sync set), the
    follower took the new partition's records into its old log, or an answer to its old replica's
    fetch into its new one. A fetch names the partition's uid: the leader refuses
    another one (`inconsistent-partition`), and the follower drops an answer to a fetch it made
    for a replica it no longer holds."""
    leader = SpuState(0, LAG)
    leader.incarnation = 40
    leader.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0), spu_info(1)], replicas=[identified(hosted("a-0", 0, [0, 1], epoch=0), 9)]), now=0.0)
    leader.append(5, now=0.0)  # the new partition's first records, at leader epoch 0
    follower = SpuState(1, LAG)
    follower.incarnation = 41
    follower.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0), spu_info(1)], replicas=[identified(hosted("a-0", 0, [0, 1], epoch=0), 5)]), now=0.0)
    follower.replicas["a-0"].log.append(0, 3)  # the old partition's records, at leader epoch 0
    request = follower.fetch_request(0, max_records=500)
    assert request is not None and request.partitions[0].uid == 5
    answer = leader.serve(request, now=1.0)
    assert answer.partitions == [fetch_wire.PartitionFetched(partition="a-0", offset=3, error="inconsistent-partition")]
    assert leader.replicas["a-0"].followers == {}
    # The follower reads the update; its old replica's answer (had the leader been on the old one too) goes nowhere.
    served = fetch_wire.FetchResponse(partitions=[fetch_wire.PartitionFetched(partition="a-0", offset=0, leo=9, hw=3, records=9, epochs=[(0, 0)])])
    follower.apply_update(wire.Update(epoch=2, deleted_replicas=["a-0"], replicas=[identified(hosted("a-0", 0, [0, 1], epoch=0), 9)]), now=1.0)
    assert follower.apply_response(0, served, request) == {}
    assert follower.replicas["a-0"].leo == 0
    # Now both are on the new one: served and applied.
    request = follower.fetch_request(0, max_records=500)
    assert request is not None
    follower.apply_response(0, leader.serve(request, now=2.0), request)
    assert (follower.replicas["a-0"].leo, leader.replicas["a-0"].followers[1].leo) == (5, 0)
