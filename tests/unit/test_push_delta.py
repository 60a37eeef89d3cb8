"""What the connection manager tells each SPU of a partition delta is the same whether it sorts
the delta by SPU first and builds each partition's state once for all its SPUs (``Concerned`` and
the shared states, what ``push`` does) or looks at every change for every SPU (the plain reading
of the rule, kept here as the reference)."""

from __future__ import annotations

import copy
import random

import hypothesis
import pydantic
from hypothesis import strategies as st

from connection_manager import server, wire
from store import local, models
from tests.builders import partition

SPUS = range(6)


def reference_delta(
    session: server.Session, changes: local.Changes[models.Partition], partitions: dict[str, local.Entry[models.Partition]]
) -> tuple[list[wire.ReplicaInfo], list[str]]:
    """Every changed partition looked at for this session, in the order of the changes, after the
    deletions (a name in both was deleted and created again: the SPU is told of a new partition)."""
    changed, deleted = [], []
    for name in changes.deleted:
        if session.hosted.pop(name, None) is not None:
            deleted.append(name)
        session.incarnation.forget(name)
    restarted = session.incarnation.restarted
    for entry in changes.updated:
        obj, name = entry.obj, entry.name
        if restarted and name in restarted and restarted[name] != obj.status.partition_epoch:
            del restarted[name]
        told = session.hosted.get(name)
        if session.spu_id in obj.spec.replicas:
            info = server._replica_info(entry, session.incarnation)
            if told != info:
                session.hosted[name] = info
                changed.append(info)
        elif told is not None:
            del session.hosted[name]
            deleted.append(name)
    return changed, deleted


def random_partition(rng: random.Random, name: str) -> models.Partition:
    replicas = rng.sample(list(SPUS), rng.randint(1, 3))
    return partition(name, replicas, leader=rng.choice(replicas + [replicas[0]]), resolution=rng.choice(["Online", "Offline"]))


async def test_the_delta_sorted_by_spu_tells_each_spu_what_looking_at_every_change_tells_it() -> None:
    rng = random.Random(17)
    table: local.KindStore[models.Partition] = local.KindStore("partitions")
    listener = table.listener()
    revision = 0
    names = [f"t-{index}" for index in range(40)]
    for name in names:
        revision += 1
        table.apply(random_partition(rng, name), revision)
    sessions = [server.Session(spu_id, f"spu-{spu_id}", 1, None) for spu_id in SPUS]  # type: ignore[arg-type]  # nothing is sent
    first = listener.changes()
    for session in sessions:
        server._replica_delta(session, first, table.view)  # the full set: what a Sync tells
    told_something = 0
    for _ in range(300):
        for _ in range(rng.randint(1, 8)):
            name = rng.choice(names)
            revision += 1
            if rng.random() < 0.1:
                table.delete(name, revision)
            else:
                table.apply(random_partition(rng, name), revision)
        for session in sessions:
            if rng.random() < 0.2 and session.hosted:
                # A restart's fact about one of its partitions (spent once the partition is decided again).
                restarted_name = rng.choice(sorted(session.hosted))
                entry = table.get(restarted_name)
                if entry is not None:
                    session.incarnation.restarted[restarted_name] = entry.obj.status.partition_epoch + rng.randint(0, 1)
        changes = listener.changes()
        assert not changes.full
        concerned = server.Concerned(changes)
        built: server.BuiltStates = {}  # shared by the sessions, as in a push
        for session in sessions:
            expected_session = copy.deepcopy(session)
            expected = reference_delta(expected_session, changes, dict(table.view))
            assert server._replica_delta(session, changes, table.view, concerned, built) == expected
            assert (session.hosted, session.incarnation.restarted) == (expected_session.hosted, expected_session.incarnation.restarted)
            told_something += bool(expected[0] or expected[1])
    assert told_something > 300  # the rounds did tell the SPUs things, both ways


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    replicas=st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=4, unique=True),
    isr=st.lists(st.integers(min_value=0, max_value=2**40), max_size=4, unique=True),
    uid=st.one_of(st.none(), st.integers(min_value=-(2**65), max_value=2**65), st.text(max_size=3), st.booleans(), st.floats()),
)
def test_every_partition_the_sc_can_read_can_be_told_to_its_spus(replicas: list[int], isr: list[int], uid: object) -> None:
    """A stored partition (anyone may have written it) that the model reads is one the push can
    build for its SPUs: a state the wire refuses (an SPU id past 2**31 - 1, a uid not from 1 to 2**63 - 1) would make every push
    fail, and no SPU hear of anything. The model refuses such a partition instead (it is then
    unreadable, which deletes nothing)."""
    try:
        partition = models.Partition.model_validate(
            {"name": "t-0", "uid": uid, "spec": {"leader": replicas[0], "replicas": replicas}, "status": {"partitionEpoch": 1, "isr": isr}}
        )
    except pydantic.ValidationError:
        return
    assert server._build_replica_info(partition, partition.spec.leader).uid == partition.uid
