"""Leader election and the partition controller: exact actions for each situation."""

from __future__ import annotations

import pytest

from connection_manager import health as health_module
from connection_manager import lrs
from controller.reconcile import actions, election, partition
from store import local, models
from tests.builders import spu

ONLINE, OFFLINE = health_module.Health.ONLINE, health_module.Health.OFFLINE


# ---------------------------------------------------------------------------- elect()


@pytest.mark.parametrize(
    ("replicas", "leaving", "online", "leo", "hw", "unclean", "expected"),
    [
        # in-sync followers: the highest LEO wins
        ([0, 1, 2], 0, {1, 2}, {1: 100, 2: 110}, 100, False, election.Election(2, True)),
        # equal LEOs: replica-list order
        ([0, 2, 1], 0, {1, 2}, {1: 100, 2: 100}, 100, False, election.Election(2, True)),
        # a follower below the HW is not in sync
        ([0, 1, 2], 0, {1, 2}, {1: 99, 2: 100}, 100, False, election.Election(2, True)),
        ([0, 1, 2], 0, {1, 2}, {1: 99, 2: 50}, 100, False, None),
        # the best follower is offline
        ([0, 1, 2], 0, {2}, {1: 200, 2: 100}, 100, False, election.Election(2, True)),
        # nobody online
        ([0, 1, 2], 0, set(), {1: 100, 2: 100}, 100, False, None),
        # unclean: the most advanced online replica, marked unclean
        ([0, 1, 2], 0, {1, 2}, {1: 99, 2: 50}, 100, True, election.Election(1, False)),
        ([0, 1, 2], 0, set(), {1: 99}, 100, True, None),
        # never reported: unknown offsets, unknown HW: every replica is in sync
        ([0, 1, 2], 0, {1, 2}, {}, -1, False, election.Election(1, True)),
        # a follower never reported while the HW is known: not in sync
        ([0, 1, 2], 0, {1, 2}, {2: 5}, 5, False, election.Election(2, True)),
        # the leaving leader is never chosen, even if online (drain)
        ([0, 1], 0, {0, 1}, {0: 10, 1: 10}, 10, False, election.Election(1, True)),
        # nobody is leaving (recovery from LeaderOffline)
        ([0, 1], None, {0}, {0: 5, 1: 10}, 10, False, None),
    ],
)
def test_elect(
    replicas: list[int],
    leaving: int | None,
    online: set[int],
    leo: dict[int, int],
    hw: int,
    unclean: bool,
    expected: election.Election | None,
) -> None:
    assert election.elect(replicas, leaving, online.__contains__, leo, hw, unclean) == expected


# ---------------------------------------------------------------------------- the controller


def snapshot_of(*objects: models.ClusterObject) -> local.Snapshot:
    store = local.LocalStore()
    for revision, obj in enumerate(objects, start=1):
        store[obj.kind].apply(obj, revision)
    return store.snapshot()


def part(
    leader: int,
    replicas: list[int],
    resolution: models.PartitionResolution = models.PartitionResolution.OFFLINE,
    hw: int = -1,
    leo: int = -1,
    followers: dict[int, int] | None = None,
) -> models.Partition:
    status = models.PartitionStatus(resolution=resolution)
    if followers is not None:
        status = models.PartitionStatus(
            resolution=resolution,
            leader=models.ReplicaStatus(spu=leader, hw=hw, leo=leo),
            replicas=[models.ReplicaStatus(spu=spu, hw=min(hw, f_leo), leo=f_leo) for spu, f_leo in followers.items()],
            lrs=sum(f_leo >= hw for f_leo in followers.values()),
        )
    return models.Partition(
        name="orders-0", spec=models.PartitionSpec(leader=leader, replicas=replicas), status=status
    )


def live(leader: int, hw: int, leo: int, **followers: int) -> dict[str, lrs.LiveStatus]:
    offsets = tuple(lrs.ReplicaOffsets(int(s[1:]), min(hw, f), f) for s, f in followers.items())
    return {"orders-0": lrs.LiveStatus(leader, hw, leo, offsets, reported_at=0.0)}


def health(**states: health_module.Health) -> dict[int, health_module.HealthRecord]:
    return {int(s[1:]): health_module.HealthRecord(state, 0.0) for s, state in states.items()}


SPUS = [spu(spu_id) for spu_id in range(3)]
ALL_ONLINE = health(s0=ONLINE, s1=ONLINE, s2=ONLINE)
Online = models.PartitionResolution.ONLINE
LeaderOffline = models.PartitionResolution.LEADER_OFFLINE


def drained(spu_id: int, resolution: str = "Online") -> models.Spu:
    plain = spu(spu_id, resolution)
    return plain.model_copy(update={"spec": plain.spec.model_copy(update={"drain": True})})


def decide(p: models.Partition, view: partition.ClusterView, draining: tuple[int, ...] = ()) -> list[tuple[str, str, dict]]:
    spus = [drained(s.spec.id) if s.spec.id in draining else s for s in SPUS]
    decided = partition.decide(snapshot_of(*spus, p), partition.Inputs(view))
    return [(a.verb.value, a.cause, models.decode("partitions", a.writes[0].value).to_json_dict()) for a in decided]  # type: ignore[union-attr]


def test_a_partition_whose_leader_has_not_reported_stays_offline() -> None:
    assert decide(part(0, [0, 1, 2]), partition.ClusterView(ALL_ONLINE, {})) == []


def test_the_first_report_makes_it_online_with_the_in_sync_count() -> None:
    assert decide(part(0, [0, 1, 2]), partition.ClusterView(ALL_ONLINE, live(0, 10, 12, s1=10, s2=8))) == [
        (
            "update-status",
            "",
            {
                "name": "orders-0",
                "spec": {"leader": 0, "replicas": [0, 1, 2]},
                "status": {
                    "resolution": "Online",
                    "leader": {"spu": 0, "hw": 10, "leo": 12},
                    "replicas": [{"spu": 1, "hw": 10, "leo": 10}, {"spu": 2, "hw": 8, "leo": 8}],
                    "lrs": 1,
                },
            },
        )
    ]


def test_offsets_alone_change_nothing() -> None:
    stored = part(0, [0, 1, 2], Online, hw=10, leo=12, followers={1: 10, 2: 8})
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 500, 600, s1=550, s2=480))) == []


def test_a_report_from_a_former_leader_is_ignored() -> None:
    stored = part(1, [0, 1, 2], Online, hw=10, leo=12, followers={0: 10, 2: 10})
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 500, 600, s1=100, s2=100))) == []


def test_leader_offline_elects_from_live_offsets() -> None:
    stored = part(0, [0, 1, 2], Online, hw=10, leo=12, followers={1: 10, 2: 10})
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), live(0, 20, 25, s1=24, s2=19))
    assert decide(stored, view) == [
        (
            "elect",
            "spu-offline",
            {
                "name": "orders-0",
                "spec": {"leader": 1, "replicas": [0, 1, 2]},
                "status": {
                    "resolution": "Online",
                    "leader": {"spu": 1, "hw": 20, "leo": 24},
                    # The former leader is out of the in-sync set until the new leader reports it.
                    "replicas": [{"spu": 0, "hw": -1, "leo": -1}, {"spu": 2, "hw": 19, "leo": 19}],
                    "lrs": 0,
                },
            },
        )
    ]


def test_without_live_offsets_the_stored_status_decides() -> None:
    # After an SC restart: no report yet; the stored status says SPU 2 was behind.
    stored = part(0, [0, 1, 2], Online, hw=10, leo=12, followers={1: 10, 2: 8})
    view = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {})
    [(verb, cause, obj)] = decide(stored, view)
    assert (verb, cause, obj["spec"]["leader"]) == ("elect", "spu-offline", 1)


def test_no_in_sync_follower_online_makes_it_leader_offline_keeping_the_offsets() -> None:
    stored = part(0, [0, 1, 2], Online, hw=10, leo=12, followers={1: 10, 2: 8})
    view = partition.ClusterView(health(s0=OFFLINE, s1=OFFLINE, s2=ONLINE), live(0, 10, 12, s1=10, s2=8))
    [(verb, cause, obj)] = decide(stored, view)
    assert (verb, cause) == ("update-status", "")
    assert obj["spec"] == {"leader": 0, "replicas": [0, 1, 2]}
    assert obj["status"] == {
        "resolution": "LeaderOffline",
        "leader": {"spu": 0, "hw": 10, "leo": 12},
        "replicas": [{"spu": 1, "hw": 10, "leo": 10}, {"spu": 2, "hw": 8, "leo": 8}],
        "lrs": 1,
    }
    # Nothing more to do while it stays so.
    lost = models.decode("partitions", models.Partition.model_validate(obj).model_dump_json(by_alias=True).encode())
    assert decide(lost, view) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("back", "expected_leader"),
    [
        ("s1", 1),  # was in sync at the loss (10 >= hw 10)
        ("s2", None),  # was behind (8 < 10): may not lead
        ("s0", 0),  # the old leader itself
    ],
)
def test_leader_offline_recovers_only_with_a_replica_that_was_in_sync(back: str, expected_leader: int | None) -> None:
    stored = part(0, [0, 1, 2], LeaderOffline, hw=10, leo=12, followers={1: 10, 2: 8})
    states = {"s0": OFFLINE, "s1": OFFLINE, "s2": OFFLINE, back: ONLINE}
    decided = decide(stored, partition.ClusterView(health(**states), {}))
    if expected_leader is None:
        assert decided == []
    else:
        [(_, _, obj)] = decided
        assert (obj["spec"]["leader"], obj["status"]["resolution"]) == (expected_leader, "Online")


def test_unclean_election_is_marked_unclean() -> None:
    stored = part(0, [0, 1, 2], LeaderOffline, hw=10, leo=12, followers={1: 10, 2: 8})
    view = partition.ClusterView(health(s0=OFFLINE, s1=OFFLINE, s2=ONLINE), {}, unclean_election=True)
    [(verb, cause, obj)] = decide(stored, view)
    assert (verb, cause, obj["spec"]["leader"]) == ("elect", "unclean", 2)


def test_an_spu_recorded_online_is_trusted_until_the_grace_period_ends() -> None:
    # Health unknown (SC just restarted) and the SPU is recorded Online: no election yet.
    recorded_online = spu(0).model_copy(update={"status": models.SpuStatus(resolution=models.SpuResolution.ONLINE)})
    stored = part(0, [0, 1], Online, hw=10, leo=10, followers={1: 10})
    view = partition.ClusterView(health(s1=ONLINE), {})
    assert partition.decide(snapshot_of(recorded_online, spu(1), stored), partition.Inputs(view)) == []
    # Recorded Offline (the grace period passed): elect.
    [action] = partition.decide(snapshot_of(spu(0, "Offline"), spu(1), stored), partition.Inputs(view))
    assert (action.verb, action.cause) == (actions.Verb.ELECT, "spu-offline")


def test_preferred_leader_returns_only_when_in_sync_and_in_batches() -> None:
    lagging = part(1, [0, 1, 2], Online, hw=10, leo=10, followers={0: 5, 2: 10})
    behind = partition.ClusterView(ALL_ONLINE, live(1, 50, 60, s0=40, s2=55))
    assert decide(lagging, behind) == []
    # Once it catches up, the in-sync set is written first; the move comes on the next pass.
    [(verb, _, obj)] = decide(lagging, partition.ClusterView(ALL_ONLINE, live(1, 50, 60, s0=55, s2=55)))
    assert (verb, obj["spec"]["leader"], obj["status"]["lrs"]) == ("update-status", 1, 2)
    stored = part(1, [0, 1, 2], Online, hw=10, leo=10, followers={0: 10, 2: 10})
    caught_up = partition.ClusterView(ALL_ONLINE, live(1, 50, 60, s0=55, s2=55))
    [(verb, cause, obj)] = decide(stored, caught_up)
    assert (verb, cause, obj["spec"]["leader"]) == ("elect", "preferred-leader", 0)
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(1, 50, 60, s0=55, s2=55), rebalance_batch=0)) == []
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(1, 50, 60, s0=55, s2=55)), draining=(0,)) == []


def test_drain_moves_the_leadership_to_an_in_sync_follower_and_never_leaves_none() -> None:
    stored = part(0, [0, 1, 2], Online, hw=10, leo=10, followers={1: 10, 2: 10})
    [(verb, cause, obj)] = decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 10, 10, s1=10, s2=10)), draining=(0,))
    assert (verb, cause, obj["spec"]["leader"]) == ("elect", "drain", 1)
    # Not to a follower that is draining too: the other one.
    [(verb, cause, obj)] = decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 10, 10, s1=10, s2=10)), draining=(0, 1))
    assert (verb, cause, obj["spec"]["leader"]) == ("elect", "drain", 2)
    # No in-sync follower, or only draining ones: the drained SPU keeps leading.
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 10, 10, s1=5, s2=5)), draining=(0,)) == []
    assert decide(stored, partition.ClusterView(ALL_ONLINE, live(0, 10, 10, s1=10, s2=5)), draining=(0, 1)) == []


def test_a_draining_replica_leads_rather_than_leave_a_partition_without_a_leader() -> None:
    """Draining is a preference: when the leader is lost and the only in-sync replica online is
    draining, it leads (clean) rather than the partition going LeaderOffline; a replica that is
    not draining is still preferred."""
    stored = part(0, [0, 1, 2], Online, hw=10, leo=10, followers={1: 10, 2: 5})
    lost_leader = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {})
    [(verb, cause, obj)] = decide(stored, lost_leader, draining=(1,))
    assert (verb, cause, obj["spec"]["leader"], obj["status"]["resolution"]) == ("elect", "spu-offline", 1, "Online")
    both_in_sync = part(0, [0, 1, 2], Online, hw=10, leo=10, followers={1: 10, 2: 10})
    [(_, _, obj)] = decide(both_in_sync, lost_leader, draining=(1,))
    assert obj["spec"]["leader"] == 2
    # Unclean comes only after every clean choice, draining ones included.
    unclean = partition.ClusterView(health(s0=OFFLINE, s1=ONLINE, s2=ONLINE), {}, unclean_election=True)
    [(_, cause, obj)] = decide(stored, unclean, draining=(1,))
    assert (cause, obj["spec"]["leader"]) == ("spu-offline", 1)


@pytest.mark.parametrize(
    ("back", "draining", "expected"),
    [
        ({"s0"}, (0,), ("update-status", "", 0)),  # the leader back, draining: it leads again, nobody else can
        ({"s0", "s1"}, (0,), ("elect", "spu-offline", 1)),  # an in-sync replica that is not draining is preferred
        ({"s1"}, (1,), ("elect", "spu-offline", 1)),  # only a draining in-sync replica is back: it leads
        ({"s2"}, (), None),  # out of sync: nobody may lead
    ],
)
def test_a_leader_offline_partition_recovers_with_a_draining_replica_if_need_be(
    back: set[str], draining: tuple[int, ...], expected: tuple[str, str, int] | None
) -> None:
    stored = part(0, [0, 1, 2], LeaderOffline, hw=10, leo=12, followers={1: 10, 2: 8})
    states = {name: ONLINE if name in back else OFFLINE for name in ("s0", "s1", "s2")}
    decided = decide(stored, partition.ClusterView(health(**states), {}), draining=draining)
    if expected is None:
        assert decided == []
    else:
        [(verb, cause, obj)] = decided
        assert (verb, cause, obj["spec"]["leader"]) == expected and obj["status"]["resolution"] == "Online"


def test_drain_blockers_name_each_partition_that_could_not_move_with_the_real_reason() -> None:
    """What a drain of SPU 0 would leave behind, by the drain's own election: one reason each."""
    def led(name: str, replicas: list[int], followers: dict[int, int]) -> models.Partition:
        p = part(0, replicas, Online, hw=10, leo=10, followers=followers)
        return p.model_copy(update={"name": name})

    partitions = [
        led("ok-0", [0, 1, 2], {1: 10, 2: 10}),  # can move: not named
        led("solo-0", [0], {}),
        led("offline-0", [0, 1, 2], {1: 10, 2: 10}),  # can move while SPU 1 is online
        led("behind-0", [0, 1, 3], {1: 5, 3: 10}),
        led("draining-0", [0, 2], {2: 10}),
        led("draining-1", [0, 2, 4], {2: 10, 4: 10}),
    ]
    spus = [spu(0), spu(1), drained(2), spu(3, "Offline"), drained(4)]
    snapshot = snapshot_of(*spus, *partitions)
    view = partition.ClusterView(health(s0=ONLINE, s1=ONLINE, s2=ONLINE, s3=OFFLINE, s4=ONLINE), {})
    blocked = partition.drain_blockers(snapshot, 0, view)
    assert blocked == {
        "behind-0": "the online follower (SPU 1) is out of sync (behind the high watermark 10)",
        "draining-0": "the only in-sync follower online, SPU 2, is draining too",
        "draining-1": "the in-sync followers online (SPUs 2, 4) are draining too",
        "solo-0": "it has no other replica",
    }
    # With SPU 1 offline too, offline-0 and ok-0 have no follower online.
    down = partition.ClusterView(health(s0=ONLINE, s1=OFFLINE, s2=OFFLINE, s3=OFFLINE, s4=ONLINE), {})
    assert partition.drain_blockers(snapshot, 0, down)["offline-0"] == "no follower is online (SPUs 1, 2 offline)"
    # The live report decides when there is one: SPU 1 caught up with the leader's HW.
    caught_up = partition.ClusterView(view.health, {"behind-0": live(0, 10, 10, s1=10, s3=10)["orders-0"]})
    assert "behind-0" not in partition.drain_blockers(snapshot, 0, caught_up)
    assert partition.describe_blockers(blocked, limit=2) == (
        "behind-0 (the online follower (SPU 1) is out of sync (behind the high watermark 10)), "
        "draining-0 (the only in-sync follower online, SPU 2, is draining too) and 2 more"
    )


def test_only_the_named_partitions_are_looked_at() -> None:
    view = partition.ClusterView(ALL_ONLINE, live(0, 10, 12, s1=10, s2=8))
    snapshot = snapshot_of(*SPUS, part(0, [0, 1, 2]))
    assert partition.decide(snapshot, partition.Inputs(view, ["orders-1", "absent-0"])) == []
    assert len(partition.decide(snapshot, partition.Inputs(view, ["orders-0"]))) == 1


def test_the_api_overlays_live_offsets_on_online_partitions_only() -> None:
    stored = part(0, [0, 1, 2], Online, hw=10, leo=12, followers={1: 10, 2: 8})
    shown = partition.with_live_offsets(stored, live(0, 90, 95, s1=91, s2=80)["orders-0"])
    assert shown.status.leader == models.ReplicaStatus(spu=0, hw=90, leo=95)
    assert shown.status.lrs == 1
    lost = stored.model_copy(update={"status": stored.status.model_copy(update={"resolution": LeaderOffline})})
    assert partition.with_live_offsets(lost, live(0, 90, 95)["orders-0"]) is lost
