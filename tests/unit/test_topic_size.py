"""Topic sizes are exact: every formula is checked against the encoded topic the store would hold."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from controller.reconcile import topic as topic_controller, topic_size
from store import active_sc, kv, models


def computed(partitions: int, replication_factor: int, **spec: object) -> models.Topic:
    return models.Topic.model_validate(
        {"name": "orders", "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec}}
    )


def manual(rows: list[list[int]]) -> models.Topic:
    return models.Topic.model_validate(
        {"name": "manual", "spec": {"replicaAssignment": [{"id": index, "replicas": row} for index, row in enumerate(rows)]}}
    )


def provisioned(topic: models.Topic, replica_map: dict[int, list[int]]) -> models.Topic:
    status = models.TopicStatus(resolution=models.TopicResolution.PROVISIONED, replica_map=replica_map)
    return topic.model_copy(update={"status": status})


def rows(partitions: int, replication_factor: int, digits: int) -> dict[int, list[int]]:
    first = 10 ** (digits - 1) if digits > 1 else 0
    return {index: [first + (index + offset) % 7 for offset in range(replication_factor)] for index in range(partitions)}


@pytest.mark.parametrize("partitions", [1, 9, 10, 11, 99, 100, 101, 1234])
@pytest.mark.parametrize(("replication_factor", "digits"), [(1, 1), (3, 1), (3, 2), (2, 10)])
def test_a_computed_topic_size_is_its_encoding(partitions: int, replication_factor: int, digits: int) -> None:
    asked = computed(7, replication_factor, placement={"strategy": "policies", "policies": "rack=spread é"})
    replica_map = rows(partitions, replication_factor, digits)
    grown = provisioned(computed(partitions, replication_factor, placement={"strategy": "policies", "policies": "rack=spread é"}), replica_map)
    assert topic_size.provisioned_bytes(asked, partitions, replication_factor, digits) == len(models.encode(grown))
    assert topic_size.stored_bytes(grown, replica_map) == len(models.encode(grown))
    assert topic_size.map_bytes(replica_map) == len(models.encode(grown)) - len(models.encode(provisioned(grown, {}))) + 2


@pytest.mark.parametrize("partitions", [1, 10, 11, 150])
@pytest.mark.parametrize(("replication_factor", "digits"), [(1, 1), (3, 2)])
def test_a_manual_topic_size_counts_its_assignment_twice(partitions: int, replication_factor: int, digits: int) -> None:
    replica_map = rows(partitions, replication_factor, digits)
    topic = manual([list(row) for row in replica_map.values()])
    other = manual([[5, 6], [7]])  # any assignment: only the topic's own fields are kept
    expected = len(models.encode(provisioned(topic, replica_map)))
    assert topic_size.provisioned_bytes(other, partitions, replication_factor, digits) == expected
    assert topic_size.stored_bytes(topic, replica_map) == expected


def test_the_largest_count_is_the_last_that_fits() -> None:
    topic = computed(100_000, 3)
    limit = topic_size.max_topic_bytes(kv.RequestSize(kv.DEFAULT_PREFIX, kv.DEFAULT_MAX_REQUEST_BYTES), "orders", topic_controller.CHAIN_KEY)
    fitting = topic_size.largest_count(topic, 3, 1, limit)
    assert topic_size.provisioned_bytes(topic, fitting, 3, 1) <= limit < topic_size.provisioned_bytes(topic, fitting + 1, 3, 1)
    assert fitting == 98_877
    assert topic_size.largest_count(topic, 3, 1, 10**9) == models.MAX_PARTITIONS
    assert topic_size.largest_count(topic, 3, 1, 10) == 0


def test_the_largest_topic_leaves_room_for_the_transaction_and_a_reason() -> None:
    """A topic of exactly the largest size, InvalidConfig with the longest reason, alone in a
    provision transaction with the chain key: within the store's limit, counted exactly."""
    request_size = kv.RequestSize("/sc/", kv.DEFAULT_MAX_REQUEST_BYTES)
    name = "t" * 63
    largest = topic_size.max_topic_bytes(request_size, name, topic_controller.CHAIN_KEY)
    value_with_reason = largest + topic_size.STATUS_ROOM
    key = models.object_key("topics", name)
    compares = [kv.Compare(topic_controller.CHAIN_KEY, 2**40), kv.Compare(key, 2**40)]
    operations: list[kv.Operation] = [
        kv.Put(topic_controller.CHAIN_KEY, b"x" * topic_size.CHAIN_VALUE_MAX), kv.Put(key, b"x" * value_with_reason)
    ]
    request_size.check(compares, operations)
    assert len(b'{"nextStartIndex": 9223372036854775807}') <= topic_size.CHAIN_VALUE_MAX
    longest = len(models.TopicResolution.INSUFFICIENT_RESOURCES.value) - len(models.TopicResolution.PROVISIONED.value)
    assert topic_size.REASON_MAX_BYTES + longest <= topic_size.STATUS_ROOM


def test_a_reason_is_cut_to_its_room() -> None:
    assert topic_size.bounded_reason("short") == "short"
    cut = topic_size.bounded_reason("é" * 1000)
    assert len(cut.encode()) <= topic_size.REASON_MAX_BYTES and cut.endswith("...")


def test_the_largest_partition_action_fits_the_smallest_request_limit() -> None:
    """The settings' floor for etcd_max_request_bytes: a transaction's worth of partitions of the
    largest shape (a 63-character topic, replication factor 128, 10-digit SPU ids), with the SC's
    fence."""
    from controller import config
    from controller.reconcile import actions

    floor = config.Settings.model_fields["etcd_max_request_bytes"].metadata[0].ge
    topic = models.Topic.model_validate({"name": "t" * 63, "spec": {"partitions": 100_000, "replicationFactor": 128}})
    widest = [2**31 - 1 - offset for offset in range(128)]
    partitions = [models.new_partition(topic, 99_999 - index, widest) for index in range(kv.MAX_TXN_WRITES)]
    action = actions.create_partitions(topic.name, partitions, "largest")
    prefix = "/sc/" + "p" * 200 + "/"
    request_size = kv.RequestSize(prefix, floor, kv.RequestSize(prefix, floor).compare_bytes(active_sc.KEY, 2**63 - 1))
    assert request_size.writes_bound(len(action.writes), action.key_bytes, action.value_bytes) <= request_size.budget


@given(st.lists(st.lists(st.integers(0, models.MAX_SPU_ID), min_size=1, max_size=5, unique=True), min_size=1, max_size=30))
def test_the_least_bytes_of_an_assignment_are_at_most_what_its_topic_takes(assignment: list[list[int]]) -> None:
    """A Fluvio create is refused unbuilt when this bound is above the store's request limit: it
    must never be above what the topic really takes."""
    topic = manual(assignment)
    stored = len(models.encode(provisioned(topic, dict(enumerate(assignment)))))
    least = topic_size.least_assignment_bytes(len(assignment), sum(map(len, assignment)))
    assert least <= stored, (least, stored)


def test_the_least_bytes_of_an_assignment_count_each_row_and_each_id() -> None:
    # [{"id":0,"replicas":[1,2]},{"id":1,"replicas":[2,1]}] and {"0":[1,2],"1":[2,1]}: 25 and 9 a row.
    assert topic_size.least_assignment_bytes(2, 4) == 2 * 26 + 4 * 4 <= 2 * (25 + 9)
