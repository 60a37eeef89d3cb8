"""The whole daemon (pipeline, controllers, public API) driven through its HTTP API and CLI.

Runs on the memory store and on a real etcd; every result is read back from the KV store
(on etcd through a client of its own), not only from the API's answers.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from controller import config
from controller import daemon as daemon_module
from controller.cli import main as cli
from store import active_sc, kv, models
from tests.fixtures.daemon import Running


def cli_lines(out: str) -> list[str]:
    """The CLI's output without the daemon's log lines (the daemon logs to the same stdout here)."""
    return [line for line in out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line)]


def topic_body(name: str, partitions: int, replication_factor: int, **spec: Any) -> dict[str, Any]:
    return {"name": name, "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec}}


def provisioned_with(sc: Running, name: str, partitions: int) -> Callable[[], Awaitable[None]]:
    """A check for `sc.eventually`: the topic is Provisioned with its partitions, all in the store."""

    async def provisioned() -> None:
        topic = await sc.read("topics", name)
        assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED
        assert await sc.partitions_of(name) == topic.status.replica_map
        assert len(topic.status.replica_map) == partitions

    return provisioned


async def test_healthz_is_ok_once_started(sc: Running) -> None:
    assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})


async def test_computed_topic_gets_the_seed_assignment_and_its_partitions(sc: Running) -> None:
    for spu_id in range(5):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", topic_body("orders", 16, 3))
    assert (status, body["status"]["resolution"]) == (201, "Provisioned")
    stored = await sc.read("topics", "orders")
    assert stored is not None and stored.to_json_dict() == body
    replica_map = stored.status.replica_map
    # The seed's 5-SPU, 16-partition table.
    assert (replica_map[0], replica_map[5], replica_map[9], replica_map[15]) == ([0, 1, 2], [0, 2, 3], [4, 1, 2], [0, 1, 2])

    async def partitions_created() -> None:
        assert await sc.partitions_of("orders") == replica_map

    await sc.eventually(partitions_created)


async def test_rack_aware_topic_spreads_every_partition_over_racks(sc: Running) -> None:
    for spu_id, rack in enumerate(["r1", "r1", "r2", "r2", "r3", "r3"]):
        await sc.register_spu(spu_id, rack)
    predicted_status, predicted = await sc.call("POST", "/v1/topics?dryRun=true", topic_body("spread", 6, 3))
    assert predicted_status == 200
    status, body = await sc.call("POST", "/v1/topics", topic_body("spread", 6, 3))
    assert status == 201
    stored = await sc.read("topics", "spread")
    assert stored is not None
    replica_map = stored.status.replica_map
    assert [replica_map[index] for index in range(6)] == predicted["replicaMap"]
    rack_of = {spu_id: f"r{spu_id // 2 + 1}" for spu_id in range(6)}
    for replicas in replica_map.values():
        assert len({rack_of[spu_id] for spu_id in replicas}) == 3, replica_map


async def test_rack_violations_are_reported_by_create_and_describe(sc: Running, capsys: pytest.CaptureFixture[str]) -> None:
    for spu_id, rack in enumerate(["r1", "r1", "r1", "r2", "r3"]):
        await sc.register_spu(spu_id, rack)
    reason = (
        "placed with rack violations: partitions 2, 3, 4 have more than one replica in a rack although another rack "
        "has none of their replicas (online SPUs per rack: r1 3, r2 1, r3 1; racks of equal size avoid this)"
    )
    status, body = await sc.call("POST", "/v1/topics", topic_body("uneven", 6, 3))
    assert (status, body["status"]["resolution"], body["status"]["reason"]) == (201, "Provisioned", reason)
    capsys.readouterr()
    argv = ["topic", "create", "second", "-p", "2", "-r", "3", "--sc", sc.url]
    assert await asyncio.to_thread(cli.main, argv) == 0  # from start index 6: [3, 4, 1], [4, 1, 2]
    created = cli_lines(capsys.readouterr().out)
    assert created[1].split()[:4] == ["second", "Provisioned", "2", "3"]
    assert created[1].endswith("placed with rack violations: partition 1 has more than one replica in a rack although "
                               "another rack has none of its replicas (online SPUs per rack: r1 3, r2 1, r3 1; racks of "
                               "equal size avoid this)")  # fmt: skip
    assert await asyncio.to_thread(cli.main, ["topic", "describe", "uneven", "--sc", sc.url]) == 0
    assert f"Reason:      {reason}" in cli_lines(capsys.readouterr().out)


async def test_manual_topic_gets_exactly_its_assignment(sc: Running) -> None:
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    assignment = [{"id": 0, "replicas": [2, 0]}, {"id": 1, "replicas": [1, 2]}]
    status, body = await sc.call("POST", "/v1/topics", {"name": "manual", "spec": {"replicaAssignment": assignment}})
    assert (status, body["status"]["replicaMap"]) == (201, {"0": [2, 0], "1": [1, 2]})

    async def partitions_created() -> None:
        assert await sc.partitions_of("manual") == {0: [2, 0], 1: [1, 2]}

    await sc.eventually(partitions_created)


@pytest.mark.parametrize(
    "placement_spec",
    [{"strategy": "policies", "policies": "node=balanced;preferred_nodes=3"}, {"strategy": "kafka"}],
)
async def test_strategies_place_what_the_dry_run_predicted(sc: Running, placement_spec: dict[str, Any]) -> None:
    for spu_id in range(4):
        await sc.register_spu(spu_id)
    await sc.call("POST", "/v1/topics", topic_body("first", 3, 2))  # moves the start-index chain
    body = topic_body("second", 8, 2, placement=placement_spec)
    status, predicted = await sc.call("POST", "/v1/topics?dryRun=true", body)
    assert status == 200
    status, created = await sc.call("POST", "/v1/topics", body)
    assert status == 201, created
    stored = await sc.read("topics", "second")
    assert stored is not None and stored.spec.placement.model_dump(exclude_none=True) == placement_spec
    replica_map = stored.status.replica_map
    assert [replica_map[index] for index in range(8)] == predicted["replicaMap"]


async def test_invalid_configs(sc: Running) -> None:
    await sc.register_spu(0, "r1")
    await sc.register_spu(1)  # no rack: a partial rack layout
    # Checked before writing: nothing is stored.
    manual = {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 9]}]}}
    status, body = await sc.call("POST", "/v1/topics", manual)
    assert (status, body["error"]["code"]) == (422, "InvalidConfig")
    assert "9" in body["error"]["message"]
    assert await sc.read("topics", "manual") is None
    # Found by placement: the controller's verdict is kept in the store, with what to do.
    status, body = await sc.call("POST", "/v1/topics", topic_body("racks", 2, 2))
    reason = (
        "rack-aware placement needs a rack on every online SPU, but SPU 1 has none: give SPU 1 a rack "
        "(sc spu set-rack ID --rack R), or create the topic with ignoreRackAssignment: true "
        "(sc topic create --ignore-rack-assignment); the topic stays and is placed by itself once the SPUs allow it"
    )
    assert (status, body["error"]) == (422, {"code": "InvalidConfig", "message": f"topic 'racks' is InvalidConfig: {reason}"})
    stored = await sc.read("topics", "racks")
    assert stored is not None and body["object"] == stored.to_json_dict()
    assert (stored.status.resolution, stored.status.reason) == (models.TopicResolution.INVALID_CONFIG, reason)
    assert await sc.partitions_of("racks") == {}


async def test_a_topic_waiting_for_a_rack_is_placed_once_the_spu_gets_one(sc: Running, capsys: pytest.CaptureFixture[str]) -> None:
    for spu_id, rack in enumerate(["r1", "r2", "r3", None]):
        await sc.register_spu(spu_id, rack)
    status, body = await sc.call("POST", "/v1/topics", topic_body("waits", 4, 3))
    assert (status, body["object"]["status"]["resolution"]) == (422, "InvalidConfig")
    assert "SPU 3 has none: give SPU 3 a rack" in body["object"]["status"]["reason"]
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["spu", "set-rack", "3", "--rack", "r1", "--sc", sc.url]) == 0
    assert "3   spu-3  Custom  r1" in capsys.readouterr().out
    await sc.eventually(provisioned_with(sc, "waits", 4))
    spu = await sc.read("spus", "spu-3")
    assert spu is not None and spu.spec.rack == "r1"


async def test_insufficient_spus_then_an_spu_is_added(sc: Running) -> None:
    await sc.register_spu(0)
    await sc.register_spu(1)
    status, body = await sc.call("POST", "/v1/topics", topic_body("wide", 4, 3))
    assert (status, body["status"]["resolution"]) == (202, "InsufficientResources")
    stored = await sc.read("topics", "wide")
    assert stored is not None and stored.status.resolution is models.TopicResolution.INSUFFICIENT_RESOURCES
    assert "1 more needed" in stored.status.reason
    await sc.register_spu(2)
    await sc.eventually(provisioned_with(sc, "wide", 4))


async def test_add_partitions_keeps_the_existing_ones(sc: Running) -> None:
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", topic_body("orders", 3, 2))
    assert status == 201
    before = body["status"]["replicaMap"]
    status, body = await sc.call("POST", "/v1/topics/orders/partitions", {"count": 2})
    assert (status, body["spec"]["partitions"]) == (200, 5)
    stored = await sc.read("topics", "orders")
    assert stored is not None and stored.to_json_dict() == body
    replica_map = stored.status.replica_map
    assert {str(index): replica_map[index] for index in range(3)} == before
    assert len(replica_map) == 5

    async def partitions_created() -> None:
        assert await sc.partitions_of("orders") == replica_map

    await sc.eventually(partitions_created)


async def test_delete_topic_takes_its_partitions(sc: Running) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    assert (await sc.call("POST", "/v1/topics", topic_body("gone", 4, 2)))[0] == 201
    assert (await sc.call("POST", "/v1/topics", topic_body("kept", 2, 2)))[0] == 201
    status, body = await sc.call("DELETE", "/v1/topics/gone")
    assert (status, body["deleted"]["name"], body["warnings"]) == (200, "gone", [])

    async def only_kept_remains() -> None:
        assert await sc.read("topics", "gone") is None
        assert sorted(await sc.read_all("partitions")) == ["kept-0", "kept-1"]

    await sc.eventually(only_kept_remains)


def spu_body(name: str, spu_id: int) -> dict[str, Any]:
    endpoint = {"host": "127.0.0.1", "port": 9005}
    return {"name": name, "spec": {"id": spu_id, "publicEndpoint": endpoint, "privateEndpoint": endpoint}}


async def test_concurrent_registrations_of_one_spu_id_store_exactly_one(sc: Running) -> None:
    """Hardening #3: the id check and the write were two steps, so 4 of 4 concurrent registrations
    of id 7 were stored, and placement then failed for every topic of the cluster."""
    answers = await asyncio.gather(*(sc.call("POST", "/v1/spus", spu_body(f"twin-{index}", 7)) for index in range(8)))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] + [409] * 7, answers
    (winner,) = [body["name"] for status, body in answers if status == 201]
    refusals = {body["error"]["code"] for status, body in answers if status == 409}
    assert refusals == {"SpuIdInUse"}, answers
    assert all(f"SPU id 7 is already used by SPU {winner!r}" in body["error"]["message"] for status, body in answers if status == 409)
    assert sorted(await sc.read_all("spus")) == [winner]


async def test_registrations_racing_an_spu_group_for_its_ids_never_share_an_id(sc: Running) -> None:
    """The group's range check read the mirror, then its SPUs were written: custom SPUs registered
    in between got the same ids. Whoever takes an id's index key first has it."""
    group = {"name": "g", "spec": {"replicas": 8, "minId": 400}}
    registrations = [sc.call("POST", "/v1/spus", spu_body(f"custom-{400 + index}", 400 + index)) for index in range(0, 8, 2)]
    answers = await asyncio.gather(sc.call("POST", "/v1/spu-groups?timeout=0", group), *registrations)
    assert answers[0][0] == 202, answers[0]
    registered = {body["name"] for status, body in answers[1:] if status == 201}
    assert all(body["error"]["code"] == "SpuIdInUse" for status, body in answers[1:] if status != 201), answers

    async def settled() -> None:
        stored = await sc.read("spu-groups", "g")
        assert stored is not None and stored.status.resolution is not models.SpuGroupResolution.INIT
        spus = await sc.read_all("spus")
        if stored.status.resolution is models.SpuGroupResolution.RESERVED:
            assert set(spus) == {f"g-{index}" for index in range(8)}
        assert registered <= set(spus)
        ids = [spu.spec.id for spu in spus.values()]
        assert sorted(ids) == sorted(set(ids)), {name: spu.spec.id for name, spu in spus.items()}
        index = {item.key: json.loads(item.value)["spu"] for item in (await sc.kv_store.list("meta/spu-ids/")).items}
        assert index == {f"meta/spu-ids/{spu.spec.id}": name for name, spu in spus.items()}

    await sc.eventually(settled)


async def test_a_custom_spu_cannot_take_the_id_of_a_managed_one(sc: Running) -> None:
    status, _ = await sc.call("POST", "/v1/spu-groups", {"name": "g", "spec": {"replicas": 2, "minId": 500}})
    assert status == 201

    async def created() -> None:
        assert sorted(await sc.read_all("spus")) == ["g-0", "g-1"]

    await sc.eventually(created)
    assert await sc.call("POST", "/v1/spus", spu_body("custom", 501)) == (
        409,
        {"error": {"code": "SpuIdInUse", "message": "SPU id 501 is already used by SPU 'g-1'; choose another id"}},
    )


async def test_an_spu_id_is_free_again_once_its_spu_is_deleted(sc: Running) -> None:
    assert (await sc.call("POST", "/v1/spus", spu_body("first", 7)))[0] == 201
    assert (await sc.call("DELETE", "/v1/spus/first"))[0] == 200
    assert await sc.kv_store.get("meta/spu-ids/7") is None
    assert (await sc.call("POST", "/v1/spus", spu_body("second", 7)))[0] == 201
    stored = await sc.kv_store.get("meta/spu-ids/7")
    assert stored is not None and json.loads(stored.value) == {"spu": "second"}


async def test_an_index_key_left_by_an_spu_deleted_behind_the_scs_back_does_not_block_its_id(sc: Running) -> None:
    assert (await sc.call("POST", "/v1/spus", spu_body("first", 7)))[0] == 201
    stored = await sc.kv_store.get("spus/first")
    assert stored is not None
    await sc.kv_store.delete("spus/first", stored.mod_revision)  # as `etcdctl del` would
    assert (await sc.call("POST", "/v1/spus", spu_body("second", 7)))[0] == 201
    assert sorted(await sc.read_all("spus")) == ["second"]


async def test_spus_sharing_an_id_behind_the_scs_back_do_not_stop_placement(sc: Running) -> None:
    """Before the index, SPUs sharing an id made every topic fail placement ("SPU id 1 appears more
    than once"); now the SPU created later is ignored by placement, and the metrics say so."""
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    twin = models.Spu.model_validate(spu_body("twin-of-1", 1))
    await sc.kv_store.create(twin.key, models.encode(twin))  # as a hand edit, or an SC before the index, could
    status, body = await sc.call("POST", "/v1/topics", topic_body("orders", 2, 2))
    assert (status, body["status"]["resolution"], body["status"]["replicaMap"]) == (201, "Provisioned", {"0": [0, 1], "1": [1, 0]})
    async with sc.session.get("/metrics") as response:
        assert "sc_spus_sharing_an_id 1.0" in (await response.text()).splitlines()


async def test_overlapping_spu_groups_written_together_reserve_only_the_earlier_range(sc: Running) -> None:
    """Both groups were reserved in one controller pass, and both created SPUs with ids 302 and 303."""
    first = models.SpuGroup.model_validate({"name": "a", "spec": {"replicas": 4, "minId": 300}})
    second = models.SpuGroup.model_validate({"name": "b", "spec": {"replicas": 3, "minId": 302}})
    await sc.kv_store.txn([], [kv.Put(first.key, models.encode(first)), kv.Put(second.key, models.encode(second))])

    async def settled() -> None:
        groups = await sc.read_all("spu-groups")
        assert {name: group.status.resolution.value for name, group in groups.items()} == {"a": "Reserved", "b": "Invalid"}
        assert groups["b"].status.reason == "id range 302..304 collides: ids 302..303 are in the id range of SPU group a, created earlier"
        spus = await sc.read_all("spus")
        assert {name: spu.spec.id for name, spu in spus.items()} == {f"a-{index}": 300 + index for index in range(4)}

    await sc.eventually(settled)
    await asyncio.sleep(0.3)  # nothing more happens: b stays Invalid and creates nothing
    await settled()


async def test_spu_group_with_a_colliding_range_is_invalid_and_creates_nothing(sc: Running) -> None:
    await sc.register_spu(101, online=False)
    status, body = await sc.call("POST", "/v1/spu-groups", {"name": "g", "spec": {"replicas": 3, "minId": 100}})
    assert (status, body["error"]["code"]) == (422, "SpuGroupInvalid")
    stored = await sc.read("spu-groups", "g")
    assert stored is not None and stored.status.resolution is models.SpuGroupResolution.INVALID
    assert "SPU id 101 is already used by SPU spu-101" in stored.status.reason
    assert sorted(await sc.read_all("spus")) == ["spu-101"]


async def test_spu_group_scales_up_and_down_and_goes_with_its_spus(sc: Running) -> None:
    status, body = await sc.call("POST", "/v1/spu-groups", {"name": "g", "spec": {"replicas": 2, "minId": 200, "rack": "r9"}})
    assert (status, body["status"]["resolution"]) == (201, "Reserved")

    def has_spus(count: int) -> Callable[[], Any]:
        async def check() -> None:
            spus = await sc.read_all("spus")
            assert {name: spu.spec.id for name, spu in spus.items()} == {f"g-{i}": 200 + i for i in range(count)}
            assert all(spu.spec.spu_type is models.SpuType.MANAGED and spu.spec.rack == "r9" for spu in spus.values())

        return check

    await sc.eventually(has_spus(2))
    assert (await sc.call("POST", "/v1/spu-groups/g/scale", {"replicas": 4}))[0] == 202
    await sc.eventually(has_spus(4))
    assert (await sc.call("POST", "/v1/spu-groups/g/scale", {"replicas": 1}))[0] == 202
    await sc.eventually(has_spus(1))  # the highest ids go first
    assert (await sc.call("DELETE", "/v1/spus/g-0"))[0] == 409  # the group owns it
    assert (await sc.call("DELETE", "/v1/spu-groups/g"))[0] == 200
    await sc.eventually(has_spus(0))
    assert await sc.read("spu-groups", "g") is None


async def test_the_cli_against_the_daemon(sc: Running, capsys: pytest.CaptureFixture[str]) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    argv = ["topic", "create", "events", "-p", "2", "-r", "2", "--sc", sc.url]
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, argv) == 0
    out, err = capsys.readouterr()
    assert (cli_lines(out), err) == (
        ["NAME    RESOLUTION   PARTITIONS  REPLICATION  REASON", "events  Provisioned  2           2            -"],
        "",
    )
    stored = await sc.read("topics", "events")
    assert stored is not None and stored.status.resolution is models.TopicResolution.PROVISIONED

    async def partitions_created() -> None:
        assert await sc.partitions_of("events") == stored.status.replica_map

    await sc.eventually(partitions_created)
    assert await asyncio.to_thread(cli.main, ["partition", "list", "-o", "json", "--sc", sc.url]) == 0
    listed = json.loads("\n".join(cli_lines(capsys.readouterr().out)))
    assert [(p["name"], p["spec"]["replicas"]) for p in listed] == [
        ("events-0", stored.status.replica_map[0]),
        ("events-1", stored.status.replica_map[1]),
    ]


async def test_the_cluster_route_names_this_sc_as_the_active_one(sc: Running) -> None:
    """A real daemon claims its store at start: it is the leader, at the claim's revision."""
    assert sc.daemon.active is not None and sc.daemon.active.identity is not None
    identity = sc.daemon.active.identity
    claim = await sc.kv_store.get(active_sc.KEY)
    assert claim is not None
    status, body = await sc.call("GET", "/v1/cluster")
    assert (status, body) == (200, {
        "self": {"id": identity.id, "role": "leader", "address": identity.address},
        "leader": {"id": identity.id, "address": identity.address, "since": identity.started, "epoch": claim.mod_revision},
        "standbys": [],
    })  # fmt: skip
    assert identity.address.endswith(f":{sc.daemon.public_port}")


async def test_a_create_waiting_for_its_verdict_is_answered_when_the_sc_stops(settings: config.Settings) -> None:
    """A create waits for its topic's verdict (?timeout=). If the SC stops first, the verdict will
    not come from this SC: the request is answered at once with the topic as written (202, as when
    its time runs out), not held until the HTTP server's own shutdown timeout cancels it without an
    answer. (The demo's SC, killed amid a create, took 30 s to stop.)"""
    daemon = daemon_module.Daemon(settings)
    await daemon.start()
    try:
        assert daemon.pipeline is not None and daemon.context is not None
        await daemon.pipeline.step_down()  # no controller: nothing will decide the topic
        topics = daemon.context.local_store["topics"]
        url = f"http://127.0.0.1:{daemon.public_port}/v1/topics?timeout=600000"
        async with aiohttp.ClientSession() as client:
            request = asyncio.create_task(client.post(url, json=topic_body("orders", 2, 1)))
            while topics.get("orders") is None:  # written, and now waiting for its verdict
                assert not request.done(), request
                await asyncio.sleep(0.01)
            await daemon.stop()
            async with await request as response:
                body = await response.json()
            assert (response.status, body["name"], body["status"]["resolution"]) == (202, "orders", "Init")
    finally:
        await daemon.stop()
