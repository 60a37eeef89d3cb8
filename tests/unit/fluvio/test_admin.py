"""Fluvio Create/Delete/Update on a whole daemon (memory store, real controllers) with our codec as the
client: topics, custom SPUs and SPU groups (the Python client cannot send the last two), and the
exact Status of every failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import structlog

from connection_manager import ratelimit
from controller import config
from controller import daemon as daemon_module
from controller.api.fluvio import admin, client as client_module, messages, objects
from store import local, models
from tests.fixtures import daemon as daemon_fixtures

Error = messages.Error


@pytest.fixture
async def fluvio_sc() -> AsyncIterator[daemon_fixtures.Running]:
    settings = config.Settings(store=config.StoreKind.MEMORY, **daemon_fixtures.COMMON_SETTINGS)
    async with daemon_fixtures.running(settings) as handle:
        yield handle


@pytest.fixture
async def client(fluvio_sc: daemon_fixtures.Running) -> AsyncIterator[client_module.Client]:
    assert fluvio_sc.daemon.public_port is not None
    connected = await client_module.Client.connect("127.0.0.1", fluvio_sc.daemon.public_port)
    yield connected
    await connected.close()


def create(label: str, name: str, spec: object, dry_run: bool = False) -> messages.CreateRequest:
    return messages.CreateRequest(label, name, spec=spec, dry_run=dry_run)


def error(name: str, code: Error, message: str) -> messages.Status:
    return messages.Status(name, messages.ErrorCode(code), message)


def computed(partitions: int, replication: int) -> objects.TopicSpec:
    return objects.TopicSpec(objects.ComputedReplicas(partitions, replication, False))


def custom_spu(spu_id: int, port: int = 9010) -> objects.CustomSpuSpec:
    return objects.CustomSpuSpec(spu_id, objects.IngressPort(port, [objects.IngressAddr(ip="127.0.0.1")]), objects.Endpoint(port + 1, "127.0.0.1"))


# ---------------------------------------------------------------------------- topics


async def test_a_topic_create_answers_once_its_partitions_are_in_the_store(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client
) -> None:
    for spu_id in range(3):
        await fluvio_sc.register_spu(spu_id)
    status, predicted = await fluvio_sc.call("POST", "/v1/topics?dryRun=true", {"name": "orders", "spec": {"partitions": 4, "replicationFactor": 2}})
    assert status == 200
    assert await client.status(messages.CREATE, create(objects.TOPIC, "orders", computed(4, 2))) == messages.Status("orders")
    # At the reply the local store already holds every partition, with the placement's replicas.
    assert fluvio_sc.daemon.context is not None
    partitions = fluvio_sc.daemon.context.local_store["partitions"]
    assert [partitions.get(f"orders-{index}").obj.spec.replicas for index in range(4)] == predicted["replicaMap"]  # type: ignore[union-attr]  # created with the topic above
    assert await fluvio_sc.partitions_of("orders") == dict(enumerate(predicted["replicaMap"]))
    [listed] = await client.list(objects.TOPIC)
    assert listed.status == objects.TopicStatus(objects.TopicResolution.PROVISIONED, dict(enumerate(predicted["replicaMap"])), {}, "")
    assert [meta.name for meta in await client.list(objects.PARTITION)] == [f"orders-{index}" for index in range(4)]


async def test_topic_create_failures_in_fluvios_order(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    for spu_id in range(3):
        await fluvio_sc.register_spu(spu_id)
    assert await client.status(messages.CREATE, create(objects.TOPIC, "taken", computed(1, 1))) == messages.Status("taken")
    bad_retention = objects.TopicSpec(objects.ComputedReplicas(1, 1), cleanup_policy=objects.SegmentCleanup(5))
    cases = [
        (create(objects.TOPIC, "Bad_Name", computed(1, 1)), Error.TOPIC_INVALID_NAME,
         "topic name 'Bad_Name' is invalid: use only lowercase letters, digits and '-', and do not start or end with '-'"),
        # Existence is checked before the settings, as Fluvio does.
        (create(objects.TOPIC, "taken", bad_retention), Error.TOPIC_ALREADY_EXISTS, "Topic 'taken' already exists"),
        (create(objects.TOPIC, "t", bad_retention), Error.TOPIC_INVALID_CONFIGURATION, "retention time 5 s is below the minimum of 10 s"),
        (create(objects.TOPIC, "t", computed(0, 1)), Error.TOPIC_ERROR, "spec.partitions: Input should be greater than or equal to 1 (got 0)"),
        (create(objects.TOPIC, "t", computed(1, 0)), Error.TOPIC_ERROR, "spec.replicationFactor: Input should be greater than or equal to 1 (got 0)"),
    ]  # fmt: skip
    for request, code, message in cases:
        assert await client.status(messages.CREATE, request) == error(request.name, code, message)
    unknown_spu = objects.TopicSpec(objects.AssignedReplicas([objects.PartitionMap(0, [0, 9])]))
    answer = await client.status(messages.CREATE, create(objects.TOPIC, "manual", unknown_spu))
    assert answer.error_code == messages.ErrorCode(Error.TOPIC_ERROR) and "9" in (answer.error_message or "")
    # Fluvio refuses assigned ids out of order (it does not re-sort them): TopicError, as for other assignment errors.
    out_of_order = objects.TopicSpec(objects.AssignedReplicas([objects.PartitionMap(1, [0]), objects.PartitionMap(0, [1])]))
    assert await client.status(messages.CREATE, create(objects.TOPIC, "manual", out_of_order)) == error(
        "manual",
        Error.TOPIC_ERROR,
        "invalid replica assignment: assigned partition ids must be in sequence and without gaps: "
        "1, 0 are out of order (ids given: 1, 0)",
    )
    assert set(await fluvio_sc.read_all("topics")) == {"taken"}


@pytest.mark.parametrize("dry_run", [False, True])
async def test_an_assignment_larger_than_one_etcd_request_is_refused_before_its_model_is_built(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client, dry_run: bool
) -> None:
    """A Fluvio create carries its assignment decoded, not as JSON: building our model of tens of
    thousands of rows takes seconds before TopicTooLarge refuses it. What its rows take in the store
    at least is counted first, in C. This frame is just below the largest a Create may take on this
    store (one etcd request and 64 KiB), so it is read and answered, not closed."""
    rows = [objects.PartitionMap(index, [0, 1, 2, 3]) for index in range(65_000)]
    request = create(objects.TOPIC, "wide", objects.TopicSpec(objects.AssignedReplicas(rows)), dry_run=dry_run)
    frame = messages.encode_request(messages.RequestHeader(messages.CREATE, 19, 1, "fluvio"), request)
    assert 1_572_864 + 65_536 - 16_384 < len(frame) - 4 <= 1_572_864 + 65_536
    least = 26 * 65_000 + 4 * 65_000 * 4
    assert await client.status(messages.CREATE, request) == error(
        "wide",
        Error.TOPIC_ERROR,
        f"topic 'wide' assigns 65000 partitions 260000 replicas, at least {least} bytes in the store: above the "
        f"{config.Settings().etcd_max_request_bytes} bytes of one etcd request (etcd_max_request_bytes), which holds "
        "the whole topic; use fewer partitions or replicas, or raise etcd_max_request_bytes",
    )
    assert await fluvio_sc.read_all("topics") == {}


async def test_an_assignment_whose_frame_is_above_one_etcd_request_closes_the_connection_unread(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client
) -> None:
    """32,000 rows of 16 replicas take 2.3 MB on the wire, more than any stored topic: the frame is
    refused at its header, as an undecodable one (a Status answers only a decoded request)."""
    rows = [objects.PartitionMap(index, list(range(16))) for index in range(32_000)]
    with pytest.raises(ConnectionError):
        await client.status(messages.CREATE, create(objects.TOPIC, "wide", objects.TopicSpec(objects.AssignedReplicas(rows))))
    assert await fluvio_sc.read_all("topics") == {}


async def test_a_topic_without_enough_spus_is_kept_and_answered_not_provisioned(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client
) -> None:
    await fluvio_sc.register_spu(0)
    answer = await client.status(messages.CREATE, create(objects.TOPIC, "wide", computed(1, 3)))
    assert answer.error_code == messages.ErrorCode(Error.TOPIC_NOT_PROVISIONED)
    assert (answer.error_message or "").startswith("topic 'wide' is InsufficientResources: ")
    assert (answer.error_message or "").endswith("it was kept and is placed as soon as enough SPUs are online")
    stored = await fluvio_sc.read("topics", "wide")
    assert stored is not None and stored.status.resolution is models.TopicResolution.INSUFFICIENT_RESOURCES


async def test_a_topic_that_waits_for_a_rack_says_so_and_is_kept(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client
) -> None:
    await fluvio_sc.register_spu(0, rack="r1")
    await fluvio_sc.register_spu(1)
    assert await client.status(messages.CREATE, create(objects.TOPIC, "racks", computed(2, 2))) == error(
        "racks",
        Error.TOPIC_INVALID_CONFIGURATION,
        "topic 'racks' is InvalidConfig: rack-aware placement needs a rack on every online SPU, but SPU 1 has none: "
        "give SPU 1 a rack (sc spu set-rack ID --rack R), or create the topic with ignoreRackAssignment: true "
        "(sc topic create --ignore-rack-assignment); the topic stays and is placed by itself once the SPUs allow it",
    )
    assert set(await fluvio_sc.read_all("topics")) == {"racks"}


async def test_a_topic_dry_run_writes_nothing(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    await fluvio_sc.register_spu(0)
    assert await client.status(messages.CREATE, create(objects.TOPIC, "maybe", computed(2, 1), dry_run=True)) == messages.Status("maybe")
    answer = await client.status(messages.CREATE, create(objects.TOPIC, "maybe", computed(2, 2), dry_run=True))
    assert answer.error_code == messages.ErrorCode(Error.TOPIC_ERROR) and "2" in (answer.error_message or "")
    assert await fluvio_sc.read_all("topics") == {}


async def test_add_partitions_and_its_failures(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    for spu_id in range(2):
        await fluvio_sc.register_spu(spu_id)
    await client.status(messages.CREATE, create(objects.TOPIC, "grow", computed(1, 2)))
    assert await client.status(messages.UPDATE, messages.UpdateRequest(objects.TOPIC, "grow", messages.AddPartition(2))) == messages.Status("grow")

    async def grown() -> None:
        assert sorted(await fluvio_sc.partitions_of("grow")) == [0, 1, 2]

    await fluvio_sc.eventually(grown)
    manual = objects.TopicSpec(objects.AssignedReplicas([objects.PartitionMap(0, [1, 0])]))
    await client.status(messages.CREATE, create(objects.TOPIC, "manual", manual))
    cases = [
        (messages.UpdateRequest(objects.TOPIC, "missing", messages.AddPartition(1)), Error.TOPIC_NOT_FOUND, "Topic 'missing' not found"),
        (messages.UpdateRequest(objects.TOPIC, "manual", messages.AddPartition(1)), Error.TOPIC_INVALID_REPLICA_TYPE,
         "topic 'manual' has a manual replicaAssignment: partitions cannot be added to it"),
        (messages.UpdateRequest(objects.TOPIC, "grow", messages.AddPartition(0)), Error.TOPIC_ERROR,
         "count: the number of partitions to add must be at least 1 (got 0)"),
        (messages.UpdateRequest(objects.TOPIC, "grow", messages.AddMirror("remote")), Error.TOPIC_INVALID_REPLICA_TYPE,
         "topic 'grow': mirrors are not supported by this SC"),
    ]  # fmt: skip
    for request, code, message in cases:
        assert await client.status(messages.UPDATE, request) == error(request.key, code, message)
    other = await client.status(messages.UPDATE, messages.UpdateRequest("SmartModule", "sm", b"\x00"))
    assert other == messages.Status("sm", messages.ErrorCode(Error.OTHER, ("Update of 'SmartModule' objects is not supported by this SC",)),
                                 "Update of 'SmartModule' objects is not supported by this SC")  # fmt: skip


async def test_delete_a_topic_and_its_partitions(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    await fluvio_sc.register_spu(0)
    await client.status(messages.CREATE, create(objects.TOPIC, "gone", computed(2, 1)))
    assert await client.status(messages.DELETE, messages.DeleteRequest(objects.TOPIC, "gone")) == messages.Status("gone")

    async def no_partitions() -> None:
        assert await fluvio_sc.partitions_of("gone") == {}

    await fluvio_sc.eventually(no_partitions)
    assert await client.status(messages.DELETE, messages.DeleteRequest(objects.TOPIC, "gone")) == error("gone", Error.TOPIC_NOT_FOUND, "Topic 'gone' not found")


async def test_unsupported_create_labels_answer_invalid_create_request(client: client_module.Client) -> None:
    answer = await client.status(messages.CREATE, create("SmartModule", "sm", b"\x01\x02"))
    assert answer == error("sm", Error.INVALID_CREATE_REQUEST, "Create of 'SmartModule' objects is not supported by this SC")
    assert await client.list(objects.TOPIC) == []  # and the connection goes on


# ---------------------------------------------------------------------------- custom SPUs


async def test_register_list_and_unregister_custom_spus(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    assert await client.status(messages.CREATE, create(objects.CUSTOM_SPU, "custom-spu-5001", custom_spu(5001))) == messages.Status("custom-spu-5001")
    stored = await fluvio_sc.read("spus", "custom-spu-5001")
    assert stored == models.Spu.model_validate(
        {
            "name": "custom-spu-5001",
            "spec": {"id": 5001, "spuType": "Custom", "publicEndpoint": {"host": "127.0.0.1", "port": 9010},
                     "privateEndpoint": {"host": "127.0.0.1", "port": 9011}},
        }
    )  # fmt: skip

    async def listed() -> None:
        assert await client.list(objects.CUSTOM_SPU) == [
            objects.Metadata("custom-spu-5001", custom_spu(5001), objects.SpuStatus(objects.SpuResolution.INIT))
        ]

    await fluvio_sc.eventually(listed)
    [spu] = await client.list(objects.SPU)
    assert (spu.spec.spu_type, spu.spec.id) == (objects.SpuType.CUSTOM, 5001)
    cases = [
        (create(objects.CUSTOM_SPU, "custom-spu-5001", custom_spu(5002)), Error.SPU_ALREADY_EXISTS, "SPU 'custom-spu-5001' already exists"),
        (create(objects.CUSTOM_SPU, "other", custom_spu(5001)), Error.SPU_ALREADY_EXISTS,
         "SPU id 5001 is already used by SPU 'custom-spu-5001'; choose another id"),
        (create(objects.CUSTOM_SPU, "other", custom_spu(5002, port=0)), Error.SPU_ERROR,
         "spec.publicEndpoint.port: Input should be greater than or equal to 1 (got 0)"),
    ]  # fmt: skip
    for request, code, message in cases:
        assert await client.status(messages.CREATE, request) == error(request.name, code, message)
    # A dry run checks everything, writes nothing and answers an empty name (as Fluvio does).
    assert await client.status(messages.CREATE, create(objects.CUSTOM_SPU, "dry", custom_spu(5003), dry_run=True)) == messages.Status("")
    assert set(await fluvio_sc.read_all("spus")) == {"custom-spu-5001"}

    by_id = messages.DeleteRequest(objects.CUSTOM_SPU, messages.SpuKeyId(5001))
    assert await client.status(messages.DELETE, by_id) == messages.Status("custom-spu-5001")
    assert await fluvio_sc.read("spus", "custom-spu-5001") is None

    async def unlisted() -> None:
        assert await client.list(objects.SPU) == []

    await fluvio_sc.eventually(unlisted)
    assert await client.status(messages.DELETE, by_id) == error("spu-5001", Error.SPU_NOT_FOUND, "SPU 'spu-5001' not found")
    by_name = messages.DeleteRequest(objects.CUSTOM_SPU, messages.SpuKeyName("nope"))
    assert await client.status(messages.DELETE, by_name) == error("nope", Error.SPU_NOT_FOUND, "SPU 'nope' not found")


# ---------------------------------------------------------------------------- SPU groups


async def test_spu_groups_create_list_refuse_and_delete(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    main = objects.SpuGroupSpec(2, 100, objects.SpuConfig(rack="r1"))
    assert await client.status(messages.CREATE, create(objects.SPU_GROUP, "main", main)) == messages.Status("main")
    stored = await fluvio_sc.read("spu-groups", "main")
    assert stored is not None and stored.status.resolution is models.SpuGroupResolution.RESERVED

    async def managed_spus() -> None:
        assert [(meta.name, meta.spec.spu_type, meta.spec.id) for meta in await client.list(objects.SPU)] == [
            ("main-0", objects.SpuType.MANAGED, 100),
            ("main-1", objects.SpuType.MANAGED, 101),
        ]

    await fluvio_sc.eventually(managed_spus)
    assert await client.list(objects.CUSTOM_SPU) == []
    [group] = await client.list(objects.SPU_GROUP)
    assert group == objects.Metadata(
        "main",
        objects.SpuGroupSpec(2, 100, objects.SpuConfig(rack="r1", storage=objects.SpuStorageConfig("/tmp/fluvio", "1Gi"))),
        objects.SpuGroupStatus(objects.SpuGroupResolution.RESERVED, None),
    )
    managed = messages.DeleteRequest(objects.CUSTOM_SPU, messages.SpuKeyName("main-0"))
    assert await client.status(messages.DELETE, managed) == error("main-0", Error.SPU_ERROR, "expected 'Custom' spu, found 'Managed' spu ('main-0')")
    again = await client.status(messages.CREATE, create(objects.SPU_GROUP, "main", main))
    assert again == error("main", Error.SPU_ERROR, "SPU group 'main' already exists")

    clash = await client.status(messages.CREATE, create(objects.SPU_GROUP, "clash", objects.SpuGroupSpec(1, 101)))
    assert clash.error_code == messages.ErrorCode(Error.SPU_ERROR)
    assert (clash.error_message or "").startswith("SPU group 'clash' is Invalid: ") and "101" in (clash.error_message or "")

    assert await client.status(messages.DELETE, messages.DeleteRequest(objects.SPU_GROUP, "main")) == messages.Status("main")
    assert await client.status(messages.DELETE, messages.DeleteRequest(objects.SPU_GROUP, "main")) == error(
        "main", Error.SPU_NOT_FOUND, "SPU group 'main' not found"
    )


async def test_an_spu_group_dry_run_writes_nothing(fluvio_sc: daemon_fixtures.Running, client: client_module.Client) -> None:
    spec = objects.SpuGroupSpec(1, 7)
    assert await client.status(messages.CREATE, create(objects.SPU_GROUP, "maybe", spec, dry_run=True)) == messages.Status("maybe")
    assert await fluvio_sc.read_all("spu-groups") == {}


# ---------------------------------------------------------------------------- readiness


def test_online_readiness_counts_only_online_partitions() -> None:
    table: local.KindStore[models.Partition] = local.KindStore("partitions")
    topic = models.Topic.model_validate(
        {"name": "t", "spec": {"partitions": 3, "replicationFactor": 1},
         "status": {"resolution": "Provisioned", "replicaMap": {"0": [1], "1": [2], "2": [3]}}}
    )  # fmt: skip
    table.resync(
        [
            (models.Partition.model_validate({"name": "t-0", "spec": {"leader": 1, "replicas": [1]}, "status": {"resolution": "Online"}}), 1, 1),
            (models.Partition.model_validate({"name": "t-1", "spec": {"leader": 2, "replicas": [2]}}), 2, 2),
            # Left over from an earlier placement: other replicas than the map's.
            (models.Partition.model_validate({"name": "t-2", "spec": {"leader": 9, "replicas": [9]}, "status": {"resolution": "Online"}}), 3, 3),
        ],
        3,
    )
    assert admin.ready_partitions(topic, table, admin.Readiness.PROVISIONED) == (2, 3)
    assert admin.ready_partitions(topic, table, admin.Readiness.ONLINE) == (1, 3)


async def test_a_create_that_outwaits_its_limit_answers_not_provisioned(fluvio_sc: daemon_fixtures.Running) -> None:
    """With Readiness.ONLINE and no SPU reporting partition status, nothing becomes Online."""
    await fluvio_sc.register_spu(0)
    assert fluvio_sc.daemon.context is not None
    strict = admin.Admin(fluvio_sc.daemon.context, admin.Readiness.ONLINE, create_wait=0.3)
    waits = asyncio.create_task(strict.run())
    try:
        answer = await strict.answer(create(objects.TOPIC, "slow", computed(2, 1)))
    finally:
        waits.cancel()
        await asyncio.gather(waits, return_exceptions=True)
    assert answer == error(
        "slow",
        Error.TOPIC_NOT_PROVISIONED,
        "only 0 out of 2 partitions of topic 'slow' are online after 0.3 s (topic Provisioned); "
        "the topic stays and is completed in the background",
    )
    assert await fluvio_sc.read("topics", "slow") is not None


async def test_a_topic_too_large_to_store_is_refused_by_create_dry_run_and_add_partitions(
    fluvio_sc: daemon_fixtures.Running, client: client_module.Client
) -> None:
    """The HTTP API's size limit holds for a Fluvio client too (TopicError, the same message):
    65,535 partitions (the most Fluvio's protocol describes) at replication factor 5 on 2-digit
    SPU ids do not fit."""
    for spu_id in range(10, 13):
        await fluvio_sc.register_spu(spu_id, online=False)  # nothing gets placed
    answers = [
        await client.status(messages.CREATE, create(objects.TOPIC, "huge", computed(65_535, 5), dry_run=True)),
        await client.status(messages.CREATE, create(objects.TOPIC, "huge", computed(65_535, 5))),
    ]
    message = (
        "topic 'huge' with 65535 partitions at replication factor 5 would take up to 1627424 bytes in the store, "
        "above the 1571058 bytes one topic may take (etcd's request limit, etcd_max_request_bytes, is 1572864 bytes): "
        "at replication factor 5 at most 63280 partitions fit with 2-digit SPU ids; use fewer partitions or a lower "
        "replication factor"
    )
    assert answers == [error("huge", Error.TOPIC_ERROR, message)] * 2
    assert await fluvio_sc.read_all("topics") == {}
    created = await client.status(messages.CREATE, create(objects.TOPIC, "huge", computed(4, 5)))
    assert created.error_code == messages.ErrorCode(Error.TOPIC_NOT_PROVISIONED)  # kept, InsufficientResources
    grow = messages.UpdateRequest(objects.TOPIC, "huge", messages.AddPartition(65_531))
    assert await client.status(messages.UPDATE, grow) == error("huge", Error.TOPIC_ERROR, message)
    stored = await fluvio_sc.read("topics", "huge")
    assert stored is not None and stored.spec.partitions == 4


# ---------------------------------------------------------------------------- on a standby


async def test_a_standby_sends_fluvio_writes_on_to_the_leader(fluvio_sc: daemon_fixtures.Running) -> None:
    """A Fluvio client of a standby SC gets the leader's Status: the topic is created by the leader
    (in its store), never by the standby. With no leader, or one it cannot reach, the Status says
    so; its rights are checked on the standby first."""
    for spu_id in range(3):
        await fluvio_sc.register_spu(spu_id)
    leader = f"127.0.0.1:{fluvio_sc.daemon.public_port}"
    settings = config.Settings(store=config.StoreKind.MEMORY, **daemon_fixtures.COMMON_SETTINGS)
    async with daemon_fixtures.running(settings) as standby:
        assert standby.daemon.fluvio is not None and standby.daemon.public_port is not None
        standby_admin = standby.daemon.fluvio.admin
        standby_admin.forward_to = lambda: leader
        connected = await client_module.Client.connect("127.0.0.1", standby.daemon.public_port)
        try:
            assert await connected.status(messages.CREATE, create(objects.TOPIC, "orders", computed(2, 2))) == messages.Status("orders")
            assert await fluvio_sc.read("topics", "orders") is not None  # in the leader's store
            assert await standby.read("topics", "orders") is None
            taken = await connected.status(messages.CREATE, create(objects.TOPIC, "orders", computed(2, 2)))
            assert taken.error_code.code is Error.TOPIC_ALREADY_EXISTS  # the leader's own refusal
            assert standby_admin.forwarder.forwarded == 2
            standby_admin.forward_to = lambda: ""
            nobody = await connected.status(messages.CREATE, create(objects.TOPIC, "other", computed(1, 1)))
            assert "no SC leads the store now" in (nobody.error_message or "")
            standby_admin.forward_to = lambda: f"127.0.0.1:{daemon_fixtures.embedded_etcd.free_ports(1)[0]}"
            unreachable = await connected.status(messages.DELETE, messages.DeleteRequest(objects.TOPIC, "orders"))
            assert "could not reach the leader" in (unreachable.error_message or "")
            assert await fluvio_sc.read("topics", "orders") is not None
        finally:
            await connected.close()


async def test_a_standby_logs_an_excerpt_of_the_name_it_sends_on(fluvio_sc: daemon_fixtures.Running) -> None:
    """One line per write sent on, not rate-limited: a client's 32 KB name (control characters
    included) must not reach the log whole, each time."""
    assert fluvio_sc.daemon.fluvio is not None
    fluvio_admin = fluvio_sc.daemon.fluvio.admin
    fluvio_admin.forward_to = lambda: f"127.0.0.1:{daemon_fixtures.embedded_etcd.free_ports(1)[0]}"
    name = "\x1b[2J" + "x" * 32_000
    with structlog.testing.capture_logs() as logged:
        await fluvio_admin.answer(messages.DeleteRequest(objects.TOPIC, name))
    sent_on = [line for line in logged if line["event"] == "fluvio write sent on to the leader"]
    assert [line["name"] for line in sent_on] == [ratelimit.excerpt(name)]


async def test_a_create_waiting_for_its_verdict_when_the_sc_stops_is_answered_not_dropped() -> None:
    """As over HTTP: the SC stops while a Fluvio create waits for its topic's verdict, which will
    not come from this SC. The client gets the create's answer (not provisioned yet, and why),
    not a connection closed with its request unanswered."""
    settings = config.Settings(store=config.StoreKind.MEMORY, **daemon_fixtures.COMMON_SETTINGS)
    daemon = daemon_module.Daemon(settings)
    await daemon.start()
    try:
        assert daemon.pipeline is not None and daemon.context is not None and daemon.public_port is not None
        await daemon.pipeline.step_down()  # no controller: nothing will decide the topic
        topics = daemon.context.local_store["topics"]
        connected = await client_module.Client.connect("127.0.0.1", daemon.public_port)
        try:
            answer = asyncio.create_task(connected.status(messages.CREATE, create(objects.TOPIC, "orders", computed(2, 1))))
            while topics.get("orders") is None:  # written, and now waiting for its verdict
                assert not answer.done(), answer
                await asyncio.sleep(0.01)
            await daemon.stop()
            assert await answer == error(
                "orders",
                Error.TOPIC_NOT_PROVISIONED,
                "only 0 out of 2 partitions of topic 'orders' are provisioned when the SC stopped (topic Init); "
                "the topic stays and is completed by the SC that leads next",
            )
        finally:
            await connected.close()
    finally:
        await daemon.stop()
