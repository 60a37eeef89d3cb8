"""Values in the store this SC cannot read (written by hand, or by a newer SC whose fields this one
does not know, as in a rolling upgrade) are not deletions: an SC restarted on them deletes nothing
they own. A real daemon on a real etcd, restarted, as an operator would meet it."""

from __future__ import annotations

import json

import pytest

from controller.reconcile import spu_group
from store import embedded_etcd, kv, models
from tests import builders
from tests.fixtures.daemon import Running, etcd_settings, running

pytestmark = pytest.mark.etcd


def from_a_newer_version(stored: kv.KeyValue) -> bytes:
    """The stored object with a field this version does not know (its models forbid extra fields)."""
    value = json.loads(stored.value)
    value["spec"]["fromANewerVersion"] = True
    return json.dumps(value).encode()


async def test_an_sc_restarted_on_a_topic_and_a_group_it_cannot_read_deletes_nothing_they_own(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    settings = etcd_settings(etcd_server)
    async with running(settings) as sc:
        await sc.register_spu(0)
        status, body = await sc.call("POST", "/v1/topics?timeout=10000", {"name": "kept", "spec": {"partitions": 2, "replicationFactor": 1}})
        assert status == 201, body
        status, body = await sc.call("POST", "/v1/spu-groups", {"name": "grp", "spec": {"replicas": 1, "minId": 100}})
        assert status == 201, body

        async def placed() -> None:
            assert sorted(await sc.partitions_of("kept")) == [0, 1]
            assert "grp-0" in await sc.read_all("spus")

        await sc.eventually(placed)
        for key in ("topics/kept", "spu-groups/grp"):
            stored = await sc.kv_store.get(key)
            assert stored is not None
            await sc.kv_store.update(key, from_a_newer_version(stored), stored.mod_revision)
        # What a restarted SC must still delete: a partition and an SPU whose owners are gone.
        await sc.kv_store.create("partitions/gone-0", models.encode(builders.partition("gone-0", [0])))
        (ghost,) = spu_group.desired_spus(builders.spu_group("ghost", 1, 200))
        await sc.kv_store.create(ghost.key, models.encode(ghost))

    async with running(settings) as sc:
        async def owners_gone_deleted() -> None:
            assert await sc.kv_store.get("partitions/gone-0") is None
            assert await sc.kv_store.get(ghost.key) is None

        await sc.eventually(owners_gone_deleted)
        assert sorted(await sc.partitions_of("kept")) == [0, 1]
        assert await sc.kv_store.get("spus/grp-0") is not None
        assert sc.daemon.context is not None
        assert sc.daemon.context.local_store["topics"].unreadable == {"kept"}


async def test_an_spu_record_unreadable_at_a_restart_does_not_empty_the_in_sync_set_it_alone_holds(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    """SPU 0 alone is in sync for a partition (SPU 1 fell behind). Its SPU record turns unreadable
    (as a newer SC's write would make it) and the SC restarts: it can no longer say SPU 0 is
    registered, so the partition goes LeaderOffline, but SPU 0 stays its in-sync set, and leads
    again once its record is readable. Before, it was taken out as unregistered: an empty in-sync
    set, which only an unclean election could bring back."""
    settings = etcd_settings(etcd_server)
    async with running(settings) as sc:
        await sc.register_spu(0, ports=(9005, 9006))
        await sc.register_spu(1, ports=(9007, 9008))
        status, body = await sc.call(
            "POST", "/v1/topics?timeout=10000", {"name": "solo", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}
        )
        assert status == 201, body
        await sc.eventually(lambda: _assert_created(sc, "partitions/solo-0"))
        stored = await sc.kv_store.get("partitions/solo-0")
        assert stored is not None
        created = models.decode("partitions", stored.value)
        # Its history, as an SC would have written it: SPU 0 leads, SPU 1 left the in-sync set.
        committed = created.model_copy(
            update={
                "status": models.PartitionStatus(
                    resolution=models.PartitionResolution.ONLINE,
                    leader_epoch=3,
                    partition_epoch=4,
                    isr=[0],
                    leader=models.ReplicaStatus(spu=0, hw=100, leo=100),
                )
            }
        )
        await sc.kv_store.update(stored.key, models.encode(committed), stored.mod_revision)
        record = await sc.kv_store.get("spus/spu-0")
        assert record is not None
        await sc.kv_store.update(record.key, from_a_newer_version(record), record.mod_revision)

    async with running(settings) as sc:
        async def leader_offline_with_spu_0_in_sync() -> None:
            partition = await sc.read("partitions", "solo-0")
            assert isinstance(partition, models.Partition)
            assert partition.status.resolution is models.PartitionResolution.LEADER_OFFLINE, partition.status
            assert partition.status.isr == [0]

        await sc.eventually(leader_offline_with_spu_0_in_sync)
        unreadable = await sc.kv_store.get("spus/spu-0")
        assert unreadable is not None
        await sc.kv_store.update(unreadable.key, record.value, unreadable.mod_revision)  # readable again

        async def led_by_spu_0_again() -> None:
            partition = await sc.read("partitions", "solo-0")
            assert isinstance(partition, models.Partition)
            assert partition.status.resolution is models.PartitionResolution.ONLINE, partition.status
            assert (partition.spec.leader, partition.status.leader_epoch, partition.status.isr) == (0, 5, [0])

        await sc.eventually(led_by_spu_0_again)


async def _assert_created(sc: Running, key: str) -> None:
    assert await sc.kv_store.get(key) is not None
