"""Values in the store this SC cannot read (written by hand, or by a newer SC whose fields this one
does not know, as in a rolling upgrade) are not deletions: an SC restarted on them deletes nothing
they own. A real daemon on a real etcd, restarted, as an operator would meet it."""

from __future__ import annotations

import json

import pytest

from controller.reconcile import spu_group
from store import embedded_etcd, kv, models
from tests import builders
from tests.fixtures.daemon import etcd_settings, running

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
        status, body = await sc.call("POST", "/v1/topics?timeout=10", {"name": "kept", "spec": {"partitions": 2, "replicationFactor": 1}})
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
