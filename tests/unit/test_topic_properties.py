"""Properties of the topic controller's decision over any stored topics, partitions and SPUs (a
stored object may have been written by anyone): it never raises, every object it writes is one
the SC reads back, it writes each key once, and it creates partitions only for topics that exist,
at an index the topic has, on SPUs it names."""

from __future__ import annotations

from typing import Any

from hypothesis import given, note, settings, strategies as st

from controller.reconcile import actions, topic as topic_controller
from store import local, models
from tests import builders

SPU_IDS = st.integers(min_value=0, max_value=5)
NAMES = st.sampled_from(["a", "b", "c"])


@st.composite
def topics(draw: Any, name: str) -> models.Topic:
    resolution = draw(st.sampled_from([resolution.value for resolution in models.TopicResolution]))
    # Any map the model reads (rows of distinct SPUs); a row past the topic's partitions too.
    replica_map = draw(
        st.dictionaries(st.integers(0, 5), st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True), max_size=5)
    )
    if draw(st.booleans()):
        return builders.topic(
            name, partitions=draw(st.integers(1, 4)), replication_factor=draw(st.integers(1, 4)),
            resolution=resolution, replica_map=replica_map,
        )
    assignment = draw(
        st.lists(st.lists(st.integers(0, 7), max_size=4), min_size=1, max_size=4)
    )
    ids = draw(st.lists(st.integers(0, 6), min_size=len(assignment), max_size=len(assignment)))
    return builders.topic(
        name, partitions=None, replication_factor=None, resolution=resolution, replica_map=replica_map,
        replica_assignment=[{"id": index, "replicas": replicas} for index, replicas in zip(ids, assignment)],
    )


@st.composite
def snapshots(draw: Any) -> local.Snapshot:
    store = local.LocalStore()
    revision = 1
    for spu_id in draw(st.lists(SPU_IDS, max_size=6, unique=True)):
        store["spus"].apply(builders.spu(spu_id, draw(st.sampled_from(["Online", "Offline"])), rack=draw(st.sampled_from([None, "r1", "r2"]))), revision)
        revision += 1
    for name in draw(st.lists(NAMES, max_size=3, unique=True)):
        store["topics"].apply(draw(topics(name)), revision)
        revision += 1
    for name in draw(st.lists(NAMES, max_size=3)):
        replicas = draw(st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True))
        store["partitions"].apply(builders.partition(f"{name}-{draw(st.integers(0, 6))}", replicas), revision)
        revision += 1
    for kind in models.KINDS:
        store[kind].synced = True
    store.meta.resync([], revision)
    return store.snapshot()


@settings(max_examples=1500, deadline=None)
@given(snapshots())
def test_whatever_is_stored_the_topic_controller_writes_readable_objects_once(snapshot: local.Snapshot) -> None:
    note(repr({kind: [entry.obj for entry in snapshot.entries(kind).values()] for kind in ("spus", "topics", "partitions")}))
    decided = topic_controller.decide(snapshot, topic_controller.Inputs())
    written: list[str] = []
    topics_stored = snapshot.entries("topics")
    for action in decided:
        assert isinstance(action, actions.Action)
        for write in action.writes:
            written.append(write.key)
            kind, _, name = write.key.partition("/")
            if write.value is None or kind == "meta":
                continue
            obj = models.decode(kind, write.value)
            if kind == "partitions" and write.expected_revision == 0:
                assert isinstance(obj, models.Partition)
                topic = topics_stored.get(obj.topic)
                assert topic is not None, f"{obj.name} created for a topic that does not exist"
                assert obj.index < topic.obj.spec.partition_count(), f"{obj.name}: the topic has {topic.obj.spec.partition_count()} partitions"
    assert len(written) == len(set(written)), f"a key written twice in one pass: {sorted(written)}"


@settings(max_examples=1500, deadline=None)
@given(snapshots())
def test_whatever_map_is_stored_its_rows_and_the_partitions_they_name_stay(snapshot: local.Snapshot) -> None:
    """A partition, once it exists, moves only by the user's hand: whatever a stored replica map
    holds (a gap, a row past the topic's partitions), every status written keeps each of its rows
    as it is, and no partition that its topic's map names as it is is deleted."""
    note(repr({kind: [entry.obj for entry in snapshot.entries(kind).values()] for kind in ("spus", "topics", "partitions")}))
    decided = topic_controller.decide(snapshot, topic_controller.Inputs())
    topics_stored, partitions_stored = snapshot.entries("topics"), snapshot.entries("partitions")
    for action in decided:
        for write in action.writes:
            kind, _, name = write.key.partition("/")
            if kind == "topics" and write.value is not None:
                written = models.decode("topics", write.value)
                assert isinstance(written, models.Topic)
                for index, row in topics_stored[name].obj.status.replica_map.items():
                    assert written.status.replica_map.get(index) == row, f"{name}: row {index} {row} written as {written.status.replica_map.get(index)}"
            elif kind == "partitions" and write.value is None:
                partition: models.Partition = partitions_stored[name].obj
                topic = topics_stored.get(partition.topic)
                mapped = None if topic is None else topic.obj.status.replica_map.get(partition.index)
                assert mapped != list(partition.spec.replicas), f"{name} deleted though its topic's map names it: {mapped}"
