"""Leader election and the partition controller: exact writes and answers for each situation, from
snapshots and the cluster view (the rules themselves are tabled in test_partition_state.py)."""

from __future__ import annotations

import pytest

from connection_manager import health as health_module
from connection_manager import lrs, reports
from controller.reconcile import actions, election, partition
from store import local, models
from tests.builders import spu, written

ONLINE, OFFLINE = health_module.Health.ONLINE, health_module.Health.OFFLINE
Online = models.PartitionResolution.ONLINE
LeaderOffline = models.PartitionResolution.LEADER_OFFLINE


# ---------------------------------------------------------------------------- elect()


@pytest.mark.parametrize(
    ("replicas", "in_sync", "eligible", "expected"),
    [
        ([0, 1, 2], [0, 1, 2], {1, 2}, 1),  # replica order, the preferred leader first
        ([2, 0, 1], [0, 1, 2], {1, 2}, 2),
        ([0, 1, 2], [0, 2], {1, 2}, 2),  # only members of the in-sync set
        ([0, 1, 2], [0], {1, 2}, None),
        ([0, 1, 2], [0, 1, 2], set(), None),
    ],
)
def test_elect_takes_the_first_eligible_member_in_replica_order(
    replicas: list[int], in_sync: list[int], eligible: set[int], expected: int | None
) -> None:
    assert election.elect(replicas, in_sync, eligible.__contains__) == expected


def test_unclean_election_takes_the_replica_holding_the_most_records_then_replica_order() -> None:
    leo = {1: 50, 2: 80}.get
    assert election.elect_unclean([0, 1, 2], {1, 2}.__contains__, leo) == 2
    assert election.elect_unclean([0, 1, 2], {0, 1}.__contains__, leo) == 1  # SPU 0's LEO is unknown
    assert election.elect_unclean([0, 2, 1], {1, 2}.__contains__, lambda spu: 10) == 2
    assert election.elect_unclean([0, 1], set().__contains__, leo) is None


# ---------------------------------------------------------------------------- the controller


def snapshot_of(*objects: models.AnyObject) -> local.Snapshot:
    """Objects applied in order at revisions 1, 2, ...: SPUs first are registered before the partitions' writes."""
    store = local.LocalStore()
    for revision, obj in enumerate(objects, start=1):
        store[obj.kind].apply(obj, revision)
    return store.snapshot()


def part(
    leader: int,
    replicas: list[int],
    resolution: models.PartitionResolution = Online,
    isr: list[int] | None = None,
    leader_epoch: int = 1,
    partition_epoch: int = 1,
    hw: int = 10,
) -> models.Partition:
    status = models.PartitionStatus(
        resolution=resolution,
        leader_epoch=leader_epoch,
        partition_epoch=partition_epoch,
        isr=list(replicas if isr is None else isr) if partition_epoch else [],
        leader=models.ReplicaStatus(spu=leader, hw=hw, leo=hw),
        replicas=[models.ReplicaStatus(spu=s, hw=hw, leo=hw) for s in replicas if s != leader],
    )
    return models.Partition(name="orders-0", spec=models.PartitionSpec(leader=leader, replicas=replicas), status=status)


def fresh(replicas: list[int]) -> models.Partition:
    return models.Partition(name="orders-0", spec=models.PartitionSpec(leader=replicas[0], replicas=replicas))


def health(**states: health_module.Health) -> dict[int, health_module.HealthRecord]:
    return {int(s[1:]): health_module.HealthRecord(state, 0.0, incarnation=int(s[1:]) + 1) for s, state in states.items()}


def live(leader: int, epoch: int, hw: int, leo: int, **followers: int) -> dict[str, lrs.LiveStatus]:
    offsets = tuple(lrs.ReplicaOffsets(int(s[1:]), min(hw, f), f) for s, f in followers.items())
    return {"orders-0": lrs.LiveStatus(leader, epoch, hw, leo, offsets, reported_at=0.0)}


SPUS = [spu(spu_id) for spu_id in range(3)]
ALL_ONLINE = health(s0=ONLINE, s1=ONLINE, s2=ONLINE)


def drained(spu_id: int, resolution: str = "Online") -> models.Spu:
    plain = spu(spu_id, resolution)
    return plain.model_copy(update={"spec": plain.spec.model_copy(update={"drain": True})})


def decide(p: models.Partition, view: partition.ClusterView, draining: tuple[int, ...] = ()) -> list[tuple[str, str, dict]]:
    spus = [drained(s.spec.id) if s.spec.id in draining else s for s in SPUS]
    decided = partition.decide(snapshot_of(*spus, p), partition.Inputs(view))
    return [(a.verb.value, a.cause, models.decode("partitions", written(a.writes[0])).to_json_dict()) for a in decided.actions]


def test_a_healthy_partition_needs_nothing_and_offsets_alone_change_nothing() -> None:
    view = partition.ClusterView(ALL_ONLINE, live(0, 1, 500, 600, s1=550, s2=480))
    assert decide(part(0, [0, 1, 2]), view) == []


def test_a_new_partition_is_online_once_its_leader_confirms_with_its_in_sync_set_written() -> None:
    assert decide(fresh([0, 1, 2]), partition.ClusterView(ALL_ONLINE, {})) == []
    confirmed = partition.ClusterView(
        ALL_ONLINE, live(0, 0, 10, 12, s1=10, s2=8), confirmed={"orders-0": (0, 0)}, max_hw={"orders-0": 10}
    )
    assert decide(fresh([0, 1, 2]), confirmed) == [
        (
            "update-status",
            "",
            {
                "name": "orders-0",
                "spec": {"leader": 0, "replicas": [0, 1, 2]},
                "status": {
                    "resolution": "Online",
                    "leaderEpoch": 0,
                    "partitionEpoch": 1,
                    "isr": [0, 1, 2],
                    # The live offsets are shown, the HW the highest known.
                    "leader": {"spu": 0, "hw": 10, "leo": 12},
                    "replicas": [{"spu": 1, "hw": 10, "leo": 10}, {"spu": 2, "hw": 8, "leo": 8}],
                    "lrs": 2,
                },
            },
        )
    ]
    # A confirmation of another epoch or SPU is not this leadership's.
    assert decide(fresh([0, 1, 2]), partition.ClusterView(ALL_ONLINE, {}, confirmed={"orders-0": (1, 0)})) == []


def test_leader_offline_elects_the_first_in_sync_member_and_the_hw_shown_never_goes_back() -> None:
    stored = part(0, [0, 1, 2], hw=10)
    # The last report said 20 (the live report of the old leader); SPU 1 is behind SPU 2 in offsets,
    # but both are in the committed in-sync set: offsets do not matter, replica order does.
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), live(0, 1, 20, 25, s1=21, s2=24), max_hw={"orders-0": 20})
    assert decide(stored, view) == [
        (
            "elect",
            "spu-offline",
            {
                "name": "orders-0",
                "spec": {"leader": 1, "replicas": [0, 1, 2]},
                "status": {
                    "resolution": "Online",
                    "leaderEpoch": 2,
                    "partitionEpoch": 2,
                    "isr": [1, 2],
                    "leader": {"spu": 1, "hw": 20, "leo": 21},
                    "replicas": [{"spu": 0, "hw": 20, "leo": 25}, {"spu": 2, "hw": 20, "leo": 24}],
                    "lrs": 1,
                },
            },
        )
    ]


def test_after_an_sc_restart_nothing_in_memory_is_needed() -> None:
    """No live report, no incarnation yet: the stored in-sync set decides alone."""
    stored = part(0, [0, 1, 2], isr=[0, 2])
    [(verb, cause, obj)] = decide(stored, partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {}))
    assert (verb, cause, obj["spec"]["leader"], obj["status"]["isr"]) == ("elect", "spu-offline", 2, [2])


def test_an_spu_recorded_online_is_trusted_until_the_grace_period_ends() -> None:
    # Health unknown (SC just restarted) and the SPU is recorded Online: no election yet.
    stored = part(0, [0, 1])
    view = partition.ClusterView(health(s1=ONLINE), {})
    assert partition.decide(snapshot_of(spu(0), spu(1), stored), partition.Inputs(view)).actions == []
    # Recorded Offline (the grace period passed): elect.
    [action] = partition.decide(snapshot_of(spu(0, "Offline"), spu(1), stored), partition.Inputs(view)).actions
    assert (action.verb, action.cause) == (actions.Verb.ELECT, "spu-offline")


def test_a_preferred_leader_return_keeps_the_former_leader_eligible() -> None:
    """The issue's wrong eligibility, on the controller: after the preferred leader takes over,
    the former leader stays in the in-sync set, so if the preferred leader dies before saying
    anything, the former leader (holding every record, online) leads again."""
    stored = part(1, [0, 1])
    [action] = partition.decide(snapshot_of(*SPUS, stored), partition.Inputs(partition.ClusterView(health(s0=ONLINE, s1=ONLINE), {}))).actions
    moved = action.objects[0]
    assert isinstance(moved, models.Partition)
    assert (moved.spec.leader, moved.status.isr, action.cause) == (0, [0, 1], "preferred-leader")
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE), {})
    [action] = partition.decide(snapshot_of(*SPUS, moved), partition.Inputs(view)).actions
    again = action.objects[0]
    assert isinstance(again, models.Partition)
    assert (again.spec.leader, again.status.resolution, again.status.leader_epoch) == (1, Online, 3)


def test_a_re_registered_spu_id_inherits_no_leadership() -> None:
    """The issue's re-registered id: SPU 1 was the last replica standing; its id was deleted and
    registered again (created after the partition's last write). It does not lead again."""
    stored = part(1, [0, 1], LeaderOffline, isr=[1])
    store = local.LocalStore()
    store["spus"].apply(spu(0, "Offline"), 1)
    store["partitions"].apply(stored, 2)
    store["spus"].apply(spu(1), 3)
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE), {})
    [action] = partition.decide(store.snapshot(), partition.Inputs(view)).actions
    lost = action.objects[0]
    assert isinstance(lost, models.Partition)
    assert (lost.status.resolution, lost.status.isr, action.verb) == (LeaderOffline, [], actions.Verb.UPDATE_STATUS)
    assert "SPU 1 was registered again" in action.reason


def test_a_restarted_leader_is_replaced_even_though_it_is_online() -> None:
    stored = part(0, [0, 1, 2])
    restarted = {0: reports.Incarnation(0, 9, {"orders-0": (10, None)}, {"orders-0": 1})}
    [(verb, cause, obj)] = decide(stored, partition.ClusterView(ALL_ONLINE, {}, incarnations=restarted))
    assert (verb, cause, obj["spec"]["leader"], obj["status"]["isr"], obj["status"]["leaderEpoch"]) == (
        "elect", "spu-offline", 1, [1, 2], 2
    )


def test_proposals_are_answered_committed_or_refused_with_the_stored_state() -> None:
    stored = part(0, [0, 1, 2])
    shrink = reports.Proposal("orders-0", 0, 1, 1, 1, (0, 1))
    decided = partition.decide(snapshot_of(*SPUS, stored), partition.Inputs(partition.ClusterView(ALL_ONLINE, {}, proposals={"orders-0": shrink})))
    [action] = decided.actions
    assert (action.verb, action.objects[0].status.isr, decided.answers) == (actions.Verb.UPDATE_STATUS, [0, 1], [])
    written = part(0, [0, 1, 2], isr=[0, 1], partition_epoch=2)
    decided = partition.decide(snapshot_of(*SPUS, written), partition.Inputs(partition.ClusterView(ALL_ONLINE, {}, proposals={"orders-0": shrink})))
    [(proposal, answer, state)] = decided.answers
    assert (decided.actions, proposal, answer.error, state.partition_epoch, state.isr) == ([], shrink, None, 2, (0, 1))
    # A proposal for a partition that does not exist.
    gone = reports.Proposal("gone-0", 0, 1, 1, 1, (0,))
    decided = partition.decide(snapshot_of(*SPUS), partition.Inputs(partition.ClusterView(ALL_ONLINE, {}, proposals={"gone-0": gone}), ["gone-0"]))
    [(_, answer, _)] = decided.answers
    assert (answer.error, answer.message) == ("unknown-partition", "partition 'gone-0' does not exist")


def test_a_proposals_hw_is_written_with_the_write_that_commits_its_set_and_with_no_other() -> None:
    """The SC learns the HW of a proposal it commits from the proposal itself (a move's caught-up
    write records what the new replicas copied before the leader's next offsets): the write that
    commits the set carries it. A refused proposal's HW is not written, even by a write due anyway
    (here SPU 2 went offline: it leaves the in-sync set)."""
    stored = part(0, [0, 1, 2])  # hw 10
    shrink = reports.Proposal("orders-0", 0, 1, 1, 1, (0, 1), hw=25)
    decided = partition.decide(snapshot_of(*SPUS, stored), partition.Inputs(partition.ClusterView(ALL_ONLINE, {}, proposals={"orders-0": shrink})))
    [action] = decided.actions
    status = action.objects[0].status
    assert (status.isr, status.leader.hw) == ([0, 1], 25)
    # Never below the highest HW known, though.
    decided = partition.decide(
        snapshot_of(*SPUS, stored),
        partition.Inputs(partition.ClusterView(ALL_ONLINE, {}, proposals={"orders-0": shrink}, max_hw={"orders-0": 30})),
    )
    assert decided.actions[0].objects[0].status.leader.hw == 30
    refused = reports.Proposal("orders-0", 0, 1, 1, 1, (0, 7), hw=2**63 - 1)
    view = partition.ClusterView(health(s0=ONLINE, s1=ONLINE, s2=OFFLINE), {}, proposals={"orders-0": refused})
    decided = partition.decide(snapshot_of(*SPUS, stored), partition.Inputs(view))
    [action] = decided.actions
    [(_, answer, _)] = decided.answers
    status = action.objects[0].status
    assert (answer.error, status.isr, status.leader.hw) == ("invalid", [0, 1], 10)


def test_leader_changes_come_before_in_sync_changes_in_a_pass() -> None:
    led_by_0 = part(0, [0, 1, 2]).model_copy(update={"name": "a-0"})
    led_by_1 = part(1, [1, 2, 0]).model_copy(update={"name": "b-0"})
    view = partition.ClusterView(health(s0=ONLINE, s1=ONLINE, s2=OFFLINE), {})
    lost_0 = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {})
    # In a pass that does not split (the one after a split does not), elections still come first.
    decided = partition.decide(snapshot_of(*SPUS, led_by_0, led_by_1), partition.Inputs(lost_0, urgent_first=False))
    assert [(a.name, a.verb) for a in decided.actions] == [("a-0", actions.Verb.ELECT), ("b-0", actions.Verb.UPDATE_STATUS)]
    assert partition.decide(snapshot_of(*SPUS, led_by_0, led_by_1), partition.Inputs(view)).actions[0].verb is actions.Verb.UPDATE_STATUS


def test_the_quiet_path_skips_exactly_the_partitions_nothing_can_be_due_for() -> None:
    snapshot = snapshot_of(*SPUS, part(0, [0, 1, 2]))
    cluster = partition.Cluster(snapshot, partition.ClusterView(ALL_ONLINE, {}))
    entry = snapshot.entries("partitions")["orders-0"]
    assert cluster.quiet(entry, partition.ClusterView(ALL_ONLINE, {}))
    assert not cluster.quiet(entry, partition.ClusterView(ALL_ONLINE, {}, proposals={"orders-0": reports.Proposal("orders-0", 0, 1, 1, 1, (0,))}))
    for view in (
        partition.ClusterView(health(s0=ONLINE, s1=ONLINE, s2=OFFLINE), {}),
        partition.ClusterView(ALL_ONLINE, {}, incarnations={2: reports.Incarnation(2, 3, {}, {"orders-0": 1})}),
    ):
        assert not partition.Cluster(snapshot, view).quiet(entry, view)
    not_preferred = snapshot_of(*SPUS, part(1, [0, 1, 2]))
    assert not cluster.quiet(not_preferred.entries("partitions")["orders-0"], partition.ClusterView(ALL_ONLINE, {}))


def test_drain_moves_the_leadership_within_the_in_sync_set_and_never_leaves_none() -> None:
    stored = part(0, [0, 1, 2])
    [(verb, cause, obj)] = decide(stored, partition.ClusterView(ALL_ONLINE, {}), draining=(0,))
    assert (verb, cause, obj["spec"]["leader"], obj["status"]["isr"]) == ("elect", "drain", 1, [0, 1, 2])
    [(_, _, obj)] = decide(stored, partition.ClusterView(ALL_ONLINE, {}), draining=(0, 1))
    assert obj["spec"]["leader"] == 2
    assert decide(part(0, [0, 1, 2], isr=[0]), partition.ClusterView(ALL_ONLINE, {}), draining=(0,)) == []


def test_drain_blockers_name_each_partition_that_could_not_move_with_the_real_reason() -> None:
    """What a drain of SPU 0 would leave behind, by the drain's own election: one reason each."""
    def led(name: str, replicas: list[int], isr: list[int]) -> models.Partition:
        return part(0, replicas, isr=isr).model_copy(update={"name": name})

    partitions = [
        led("ok-0", [0, 1, 2], [0, 1, 2]),  # can move: not named
        led("solo-0", [0], [0]),
        led("offline-0", [0, 1, 2], [0, 1, 2]),  # can move while SPU 1 is online
        led("behind-0", [0, 1, 3], [0, 3]),
        led("draining-0", [0, 2], [0, 2]),
        led("draining-1", [0, 2, 4], [0, 2, 4]),
    ]
    spus = [spu(0), spu(1), drained(2), spu(3, "Offline"), drained(4)]
    snapshot = snapshot_of(*spus, *partitions)
    view = partition.ClusterView(health(s0=ONLINE, s1=ONLINE, s2=ONLINE, s3=OFFLINE, s4=ONLINE), {})
    blocked = partition.drain_blockers(snapshot, 0, view)
    assert blocked == {
        "behind-0": "the online follower (SPU 1) is not in the in-sync set [0, 3]",
        "draining-0": "the only in-sync follower online, SPU 2, is draining too",
        "draining-1": "the in-sync followers online (SPUs 2, 4) are draining too",
        "solo-0": "it has no other replica",
    }
    down = partition.ClusterView(health(s0=ONLINE, s1=OFFLINE, s2=OFFLINE, s3=OFFLINE, s4=ONLINE), {})
    assert partition.drain_blockers(snapshot, 0, down)["offline-0"] == "no follower is online (SPUs 1, 2 offline)"
    assert partition.describe_blockers(blocked, limit=2) == (
        "behind-0 (the online follower (SPU 1) is not in the in-sync set [0, 3]), "
        "draining-0 (the only in-sync follower online, SPU 2, is draining too) and 2 more"
    )


def test_only_the_named_partitions_are_looked_at() -> None:
    view = partition.ClusterView(ALL_ONLINE, {}, confirmed={"orders-0": (0, 0)})
    snapshot = snapshot_of(*SPUS, fresh([0, 1, 2]))
    assert partition.decide(snapshot, partition.Inputs(view, ["orders-1", "absent-0"])).actions == []
    assert len(partition.decide(snapshot, partition.Inputs(view, ["orders-0"])).actions) == 1


def test_the_api_shows_the_current_leaders_offsets_and_the_highest_hw_known() -> None:
    stored = part(0, [0, 1, 2], hw=10)
    shown = partition.with_live_offsets(stored, live(0, 1, 90, 95, s1=91, s2=80)["orders-0"], 90)
    assert shown.status.leader == models.ReplicaStatus(spu=0, hw=90, leo=95)
    assert [r.leo for r in shown.status.replicas] == [91, 80]
    # A report of another epoch (a former leadership) is not shown; the HW known stays.
    former = partition.with_live_offsets(stored, live(0, 0, 5, 7)["orders-0"], 90)
    assert former.status.leader == models.ReplicaStatus(spu=0, hw=90, leo=10)
    # A new leader lagging behind the committed offset: the highest known is shown.
    lagging = partition.with_live_offsets(stored, live(0, 1, 3, 95)["orders-0"], 90)
    assert lagging.status.leader == models.ReplicaStatus(spu=0, hw=90, leo=95)
    assert partition.with_live_offsets(stored, None, -1) is stored


def test_a_pass_writes_every_election_and_postpones_in_sync_changes_past_its_batch() -> None:
    """A failover's elections are never held back; the followerships' in-sync changes beyond the
    batch are decided in the next pass."""
    led = [part(0, [0, 1, 2]).model_copy(update={"name": f"led-{index}"}) for index in range(3)]
    followed = [part(1, [1, 0, 2]).model_copy(update={"name": f"followed-{index}"}) for index in range(3)]
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {}, changes_batch=1)
    decided = partition.decide(snapshot_of(*SPUS, *led, *followed), partition.Inputs(view, urgent_first=False))
    assert [(a.name, a.verb) for a in decided.actions] == [
        ("led-0", actions.Verb.ELECT), ("led-1", actions.Verb.ELECT), ("led-2", actions.Verb.ELECT),
        ("followed-0", actions.Verb.UPDATE_STATUS),
    ]
    assert decided.postponed == {"followed-1", "followed-2"}


def test_a_pass_with_leaders_gone_decides_their_partitions_alone_and_the_rest_next() -> None:
    """A failover at 100,000 partitions: the SPU led 2,000 and followed 4,000. Deciding all 6,000
    before writing anything held every election back by the time the followerships took (the
    in-sync changes beyond the batch were even decided twice). Partitions whose leader cannot lead
    go first, alone; the others are postponed to the next pass, which does not split again (a
    partition that stays leaderless must not hold the others back forever)."""
    led = [part(0, [0, 1, 2]).model_copy(update={"name": f"led-{index}"}) for index in range(2)]
    followed = [part(1, [1, 0, 2]).model_copy(update={"name": f"followed-{index}"}) for index in range(2)]
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {})
    snapshot = snapshot_of(*SPUS, *led, *followed)
    first = partition.decide(snapshot, partition.Inputs(view))
    assert [(a.name, a.verb) for a in first.actions] == [("led-0", actions.Verb.ELECT), ("led-1", actions.Verb.ELECT)]
    assert first.postponed == {"followed-0", "followed-1"} and first.split
    second = partition.decide(snapshot, partition.Inputs(view, first.postponed, urgent_first=False))
    assert sorted((a.name, a.verb) for a in second.actions) == [
        ("followed-0", actions.Verb.UPDATE_STATUS), ("followed-1", actions.Verb.UPDATE_STATUS),
    ]
    assert not second.split and not second.postponed
    # Nothing to split: every partition concerned has lost its leader, or none has.
    assert not partition.decide(snapshot, partition.Inputs(view, ["led-0", "led-1"])).split
    assert not partition.decide(snapshot, partition.Inputs(view, ["followed-0"])).split


def test_while_elections_are_on_their_way_only_leaderless_partitions_are_decided() -> None:
    """The controller holds the other partitions back until its elections are written and back
    (hold_others): they are postponed even when no partition or every partition is leaderless."""
    led = [part(0, [0, 1, 2]).model_copy(update={"name": f"led-{index}"}) for index in range(2)]
    followed = [part(1, [1, 0, 2]).model_copy(update={"name": f"followed-{index}"}) for index in range(2)]
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {})
    snapshot = snapshot_of(*SPUS, *led, *followed)
    held = partition.decide(snapshot, partition.Inputs(view, ["followed-0", "followed-1"], hold_others=True))
    assert (held.actions, held.postponed, held.split) == ([], {"followed-0", "followed-1"}, True)
    both = partition.decide(snapshot, partition.Inputs(view, ["led-0", "followed-0"], hold_others=True))
    assert [(a.name, a.verb) for a in both.actions] == [("led-0", actions.Verb.ELECT)] and both.postponed == {"followed-0"}
    only_leaderless = partition.decide(snapshot, partition.Inputs(view, ["led-0", "led-1"], hold_others=True))
    assert sorted(a.name for a in only_leaderless.actions) == ["led-0", "led-1"] and not only_leaderless.postponed


def test_the_hosting_index_names_the_partitions_of_an_spu_and_follows_changes() -> None:
    store = local.LocalStore()
    store["partitions"].apply(part(0, [0, 1]).model_copy(update={"name": "a-0"}), 1)
    store["partitions"].apply(part(1, [1, 2]).model_copy(update={"name": "b-0"}), 2)
    index = partition.HostingIndex()
    listener = store["partitions"].listener(local.Part.ALL)
    index.update(store.snapshot(), listener.changes())
    assert (index.of([0]), index.of([1]), index.of([2, 9])) == ({"a-0"}, {"a-0", "b-0"}, {"b-0"})
    store["partitions"].apply(part(2, [2, 0]).model_copy(update={"name": "c-0"}), 3)
    index.update(store.snapshot(), listener.changes())
    assert index.of([0]) == {"a-0", "c-0"}
    listener.close()


def test_the_hosting_index_forgets_deleted_partitions_and_those_moved_away() -> None:
    """Churn leaves nothing behind: before, every partition ever deleted stayed in the index, and
    each SPU change looked at all of them again (3,000 names after 100 topics came and went)."""
    store = local.LocalStore()
    partitions = store["partitions"]
    listener = partitions.listener(local.Part.ALL)
    index = partition.HostingIndex()
    index.update(store.snapshot(), listener.changes())
    revision = 0
    for round_number in range(20):
        names = [f"churn{round_number}-{i}" for i in range(3)]
        for name in names:
            revision += 1
            partitions.apply(part(0, [0, 1]).model_copy(update={"name": name}), revision)
        index.update(store.snapshot(), listener.changes())
        assert index.size() == 6
        for name in names:
            revision += 1
            partitions.delete(name, revision)
        index.update(store.snapshot(), listener.changes())
    assert index.size() == 0 and index.of([0, 1]) == set()
    # A move from [0, 1] to [2, 1]: SPU 0's set drops it when an SPU change looks at SPU 0.
    partitions.apply(part(0, [0, 1]).model_copy(update={"name": "m-0"}), revision + 1)
    index.update(store.snapshot(), listener.changes())
    partitions.apply(part(2, [2, 1]).model_copy(update={"name": "m-0"}), revision + 2)
    index.update(store.snapshot(), listener.changes())
    assert index.of([0]) == {"m-0"}  # without the current partitions, as a health change asks
    assert index.of([0, 1, 2], store.snapshot().entries("partitions")) == {"m-0"}
    assert index.of([0]) == set() and index.size() == 2
    listener.close()


def test_an_election_and_a_move_keep_the_partitions_identity() -> None:
    """The uid is the partition's identity for its SPUs: every rewrite of the partition keeps it. One
    that dropped it would make the partition one without identity (or, drawn again, another one
    whose SPUs start empty)."""

    def with_uid(p: models.Partition) -> models.Partition:
        return p.model_copy(update={"uid": 2**62 + 7})

    # An election (the leader gone): spec.leader changes.
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), live(0, 1, 20, 25, s1=21, s2=24), max_hw={"orders-0": 20})
    [(verb, _, elected)] = decide(with_uid(part(0, [0, 1, 2], hw=10)), view)
    assert (verb, elected["spec"], elected["uid"]) == ("elect", {"leader": 1, "replicas": [0, 1, 2]}, 2**62 + 7)
    # A move's step (a reordering: it ends at once): spec.replicas and reassignment change.
    stored = part(0, [0, 1, 2])
    moving = stored.model_copy(
        update={"spec": stored.spec.model_copy(update={"reassignment": models.Reassignment(previous=[0, 1, 2], target=[1, 0, 2])})}
    )
    [(verb, _, moved)] = decide(with_uid(moving), partition.ClusterView(ALL_ONLINE, live(0, 1, 10, 10, s1=10, s2=10)))
    assert (verb, moved["spec"], moved["uid"]) == ("update-spec", {"leader": 0, "replicas": [1, 0, 2]}, 2**62 + 7)
