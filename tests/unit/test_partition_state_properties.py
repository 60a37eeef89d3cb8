"""Properties of the replication-state rules over any stored partition (a stored object may have
been written by anyone) and any view of the SPUs: whatever the decision, it never raises, and what
it would write is a partition the SC can read back, with epochs that only grow, a leader among
the replicas, and an in-sync set of replicas. The tables in test_partition_state.py pin the exact
transitions; these look for the inputs nobody wrote a row for."""

from __future__ import annotations

from typing import Any

from hypothesis import given, note, settings, strategies as st

from connection_manager import reports
from controller.reconcile import partition_state as ps
from store import models
from tests.unit.test_partition_state import Spus, current

SPU_IDS = st.integers(min_value=0, max_value=6)
EPOCHS = st.one_of(st.integers(min_value=0, max_value=5), st.integers(min_value=models.MAX_EPOCH - 2, max_value=models.MAX_EPOCH))


@st.composite
def stored_partitions(draw: Any) -> models.Partition:
    replicas = draw(st.lists(SPU_IDS, min_size=1, max_size=4, unique=True))
    leader = draw(st.sampled_from(replicas))
    reassignment = None
    if draw(st.booleans()):
        target = draw(st.lists(SPU_IDS, min_size=1, max_size=4, unique=True))
        previous = draw(st.lists(st.sampled_from(replicas), min_size=1, max_size=len(replicas), unique=True))
        reassignment = models.Reassignment(previous=previous, target=target)
    partition_epoch = draw(EPOCHS)
    return models.Partition(
        name="t-0",
        spec=models.PartitionSpec(leader=leader, replicas=replicas, reassignment=reassignment),
        status=models.PartitionStatus(
            resolution=draw(st.sampled_from(list(models.PartitionResolution))),
            leader_epoch=draw(EPOCHS),
            partition_epoch=partition_epoch,
            # Anything unique, even SPUs that are not replicas: written by anyone.
            isr=draw(st.lists(SPU_IDS, max_size=5, unique=True)),
            leader=models.ReplicaStatus(spu=leader, hw=draw(st.integers(-1, 200)), leo=200),
        ),
    )


@st.composite
def spu_views(draw: Any, partition: models.Partition) -> Spus:
    restarted: dict[int, reports.Incarnation] = {}
    for spu in draw(st.lists(SPU_IDS, max_size=3, unique=True)):
        leo = draw(st.one_of(st.none(), st.integers(0, 300)))
        hosted: dict[str, tuple[int, int | None]] = {} if leo is None else {"t-0": (leo, None)}
        restarted[spu] = reports.Incarnation(spu, 7, hosted, {"t-0": partition.status.partition_epoch})
    return Spus(
        online_ids=set(draw(st.lists(SPU_IDS, max_size=7, unique=True))),
        draining_ids=set(draw(st.lists(SPU_IDS, max_size=2, unique=True))),
        registered={spu: draw(st.sampled_from([1, 1, 20])) for spu in draw(st.lists(SPU_IDS, max_size=7, unique=True))},
        incarnations=restarted,
        unreadable_records=draw(st.booleans()),
    )


@st.composite
def cases(draw: Any) -> tuple[models.Partition, Spus, ps.Facts]:
    partition = draw(stored_partitions())
    spus = draw(spu_views(partition))
    status = partition.status
    proposal = None
    if draw(st.booleans()):
        isr = tuple(draw(st.lists(SPU_IDS, max_size=5, unique=True)))
        # Each member named under its current incarnation, a previous one, or not at all.
        named = [(spu, draw(st.sampled_from([current(spu), current(spu) - 1]))) for spu in isr if draw(st.booleans())]
        proposal = reports.Proposal(
            "t-0",
            draw(st.sampled_from([partition.spec.leader, *range(7)])),
            1,
            draw(st.sampled_from([status.leader_epoch, max(status.leader_epoch - 1, 0)])),
            draw(st.sampled_from([status.partition_epoch, max(status.partition_epoch - 1, 0)])),
            isr,
            tuple(named),
        )
    facts = ps.Facts(
        committed_hw=draw(st.integers(-1, 300)),
        confirmed=draw(st.booleans()),
        proposal=proposal,
        unclean=draw(st.booleans()),
        rebalance=draw(st.booleans()),
    )
    return partition, spus, facts


@settings(max_examples=2000, deadline=None)
@given(cases())
def test_whatever_is_stored_a_decision_writes_a_readable_partition_that_moves_forward(
    case: tuple[models.Partition, Spus, ps.Facts],
) -> None:
    partition, spus, facts = case
    note(f"{partition!r}\n{spus!r}\n{facts!r}")
    stored = partition.status
    decision = ps.decide(partition, 10, spus, facts)
    if facts.proposal is None:
        assert decision.answer is None
    transition = decision.transition
    if transition is None:
        return
    state = transition.state
    replicas = list(transition.replicas or partition.spec.replicas)
    # What the partition controller writes, read back as the SC's Reader reads it.
    written = models.Partition(
        name=partition.name,
        spec=models.PartitionSpec(
            leader=state.leader, replicas=replicas, reassignment=None if transition.ends_move else partition.spec.reassignment
        ),
        status=models.PartitionStatus(
            resolution=state.resolution, leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch, isr=list(state.isr)
        ),
    )
    models.decode("partitions", models.encode(written))
    assert state.leader_epoch >= stored.leader_epoch and state.partition_epoch >= stored.partition_epoch
    before = ps.stored_state(partition)
    if (state.leader, state.isr, state.resolution) != (before.leader, before.isr, before.resolution):
        assert state.partition_epoch > stored.partition_epoch, "a change of leader, in-sync set or resolution, same epoch"
    if state.leader != partition.spec.leader:
        assert state.leader_epoch == stored.leader_epoch + 1
    newly_leading = state.resolution is not models.PartitionResolution.LEADER_OFFLINE and (
        state.leader != before.leader or before.resolution is models.PartitionResolution.LEADER_OFFLINE
    )
    if newly_leading and transition.cause != ps.CAUSE_UNCLEAN:
        # Only a member of the committed set holds every committed record (KIP-966's rule).
        assert state.leader in before.isr, f"SPU {state.leader} leads, outside the in-sync set {before.isr}"
    if state.isr != before.isr and not (set(state.isr) <= set(before.isr)):
        # Only a leader's proposal adds members (every SPU it adds caught up): checked by _check.
        assert facts.proposal is not None or transition.cause == ps.CAUSE_UNCLEAN, f"{before.isr} grew to {state.isr}"
    assert set(state.isr) <= set(replicas), f"in-sync set {state.isr} holds SPUs that are not replicas {replicas}"
    # As read back (at partition epoch 0 every replica counts): a move's new SPUs never count unasked.
    grown = set(written.in_sync()) - set(partition.in_sync())
    if grown:
        assert facts.proposal is not None or transition.cause == ps.CAUSE_UNCLEAN, f"{partition.in_sync()} grew to {written.in_sync()}"
    if grown and transition.cause != ps.CAUSE_UNCLEAN:
        # KIP-903: each SPU a proposal adds was named under the connection it has now.
        assert facts.proposal is not None
        named = dict(facts.proposal.incarnations)
        for spu in grown:
            connection = spus.incarnation(spu)
            assert connection is not None and named.get(spu) == connection.number, (spu, named, connection)
    if state.resolution is models.PartitionResolution.ONLINE:
        assert state.leader in state.isr, f"leader {state.leader} outside its in-sync set {state.isr}"
