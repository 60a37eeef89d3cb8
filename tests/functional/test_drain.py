"""Drains end to end: the daemon on a real etcd, SPUs as scripted WebSocket clients on 127.0.0.1.

A drain is the operator's stored intent (spec.drain): refused up front when it cannot finish,
forced on demand, cancelled by an undrain, visible in the list, the JSON and the API, and kept
across SPU reconnections and SC restarts.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest

from controller.cli import main as cli
from store import embedded_etcd, models
from tests.fixtures.daemon import Running, etcd_settings, running
from tests.functional.test_connection_manager import Cluster, cluster, start_cluster  # noqa: F401 (cluster is a fixture)

pytestmark = pytest.mark.etcd


async def create_manual(sc: Running, name: str, *replicas: list[int]) -> None:
    """A topic whose partition i has ``replicas[i]`` (the first one leads)."""
    assignment = [{"id": index, "replicas": spus} for index, spus in enumerate(replicas)]
    status, answer = await sc.call("POST", "/v1/topics", {"name": name, "spec": {"replicaAssignment": assignment}})
    assert status == 201, answer


async def report_led(cluster: Cluster, offset: int = 10) -> None:
    """Every connected SPU reports each partition it leads, every follower at ``offset``, and (as
    a leader whose followers all caught up would) proposes every online replica into the in-sync set."""
    online = {spu_id for spu_id, spu in cluster.spus.items() if spu.websocket is not None and not spu.websocket.closed}
    for spu in cluster.spus.values():
        if spu.spu_id not in online:
            continue
        led = [name for name, info in spu.replicas.items() if info.leader == spu.spu_id]
        if led:
            await spu.report(
                *[(name, offset, offset, {f: offset for f in spu.replicas[name].replicas if f != spu.spu_id}) for name in led]
            )
        for name in led:
            info = spu.replicas[name]
            wanted = [replica for replica in info.replicas if replica in online]
            if set(wanted) - set(info.isr):
                await spu.propose(name, wanted, incarnations=cluster.incarnations(wanted))


async def hosting(cluster: Cluster, layout: dict[int, set[str]]) -> None:
    for spu_id, names in layout.items():
        spu = cluster.spus[spu_id]
        await spu.wait_for(lambda spu=spu, names=names: names <= set(spu.replicas))


async def all_online(cluster: Cluster, leaders: dict[str, int]) -> None:
    async def check() -> None:
        await report_led(cluster)
        found = await cluster.sc.read_all("partitions")
        assert {name: (p.spec.leader, p.status.resolution.value) for name, p in found.items() if name in leaders} == {
            name: (leader, "Online") for name, leader in leaders.items()
        }

    await cluster.sc.eventually(check)


# The SC runs in the test's process: its log lines share the captured streams with the CLI's output.
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]|\{)")


def printed(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(stdout, stderr) of the CLI since the last call, without the SC's log lines."""
    captured = capsys.readouterr()
    out, err = (
        "".join(line for line in stream.splitlines(keepends=True) if not _LOG_LINE.match(line))
        for stream in (captured.out, captured.err)
    )
    return out, err


async def spu_shown(sc: Running, name: str) -> dict[str, Any]:
    status, body = await sc.call("GET", f"/v1/spus/{name}")
    assert status == 200, body
    return body


async def draining_gauge(sc: Running) -> str:
    async with sc.session.get("/metrics") as response:
        [line] = [line for line in (await response.text()).splitlines() if line.startswith("sc_spus_draining ")]
    return line.split()[1]


async def test_a_drain_that_cannot_finish_is_refused_up_front_and_changes_nothing(cluster: Cluster) -> None:
    """The measured defect: `sc spu drain` answered 'still leads' but had moved the SPU's other
    leaderships and left it draining. Now it is refused before anything moves, and forced on demand."""
    for spu_id in range(2):
        await cluster.connect(spu_id)
    await create_manual(cluster.sc, "solo", [0])
    await create_manual(cluster.sc, "pair", [0, 1])
    await hosting(cluster, {0: {"solo-0", "pair-0"}, 1: {"pair-0"}})
    await all_online(cluster, {"solo-0": 0, "pair-0": 0})
    before = {item.key: item.mod_revision for item in (await cluster.sc.kv_store.list("")).items}

    status, body = await cluster.sc.call("POST", "/v1/spus/spu-0/drain")
    assert status == 409, body
    assert body == {
        "error": {
            "code": "DrainRefused",
            "message": "SPU 0 ('spu-0') was not drained, nothing was changed: 1 of the 2 partition(s) it leads could "
            "not get another leader now: solo-0 (it has no other replica). Bring a follower online or in sync (or "
            "undrain the other SPU) first, or drain with force=true (`sc spu drain --force`) to move the others and "
            "keep these",
        },
        "spu": 0,
        "name": "spu-0",
        "blocked": [{"partition": "solo-0", "reason": "it has no other replica"}],
    }
    await report_led(cluster)
    await asyncio.sleep(0.3)  # room for a leader move, had anything been marked draining
    assert {item.key: item.mod_revision for item in (await cluster.sc.kv_store.list("")).items} == before

    # Forced: what can move moves, the answer says what did and what did not, and it stays draining.
    async with cluster.sc.session.post("/v1/spus/spu-0/drain", params={"force": "true", "timeout": "10000"}) as response:
        status, body = response.status, await response.json()
    assert status == 202, body
    assert body == {
        "spu": 0, "name": "spu-0", "draining": True, "drained": False,
        "moved": [{"partition": "pair-0", "to": 1}],
        "leading": ["solo-0"],
        "blocked": [{"partition": "solo-0", "reason": "it has no other replica"}],
    }

    async def shown_draining() -> None:
        spu = await spu_shown(cluster.sc, "spu-0")
        assert spu["spec"]["drain"] is True
        assert spu["status"] == {
            "resolution": "Online",
            "drain": "Draining",
            "reason": "1 of the 1 partition(s) it leads cannot move: solo-0 (it has no other replica)",
        }, spu

    await cluster.sc.eventually(shown_draining)
    assert (await cluster.partition("solo-0")).status.resolution is models.PartitionResolution.ONLINE


async def test_the_reason_names_a_follower_that_is_draining_too(cluster: Cluster) -> None:
    """The second measured defect: 'no in-sync follower online' for a follower that was online and
    in sync, but draining itself."""
    for spu_id in range(3):
        await cluster.connect(spu_id)
    await create_manual(cluster.sc, "one", [1, 0])
    await create_manual(cluster.sc, "two", [2, 1])
    await hosting(cluster, {0: {"one-0"}, 1: {"one-0", "two-0"}, 2: {"two-0"}})
    await all_online(cluster, {"one-0": 1, "two-0": 2})
    status, body = await cluster.sc.call("POST", "/v1/spus/spu-1/drain")
    assert (status, body["drained"], body["moved"]) == (200, True, [{"partition": "one-0", "to": 0}]), body
    status, body = await cluster.sc.call("POST", "/v1/spus/spu-2/drain")
    assert status == 409, body
    assert body["blocked"] == [{"partition": "two-0", "reason": "the only in-sync follower online, SPU 1, is draining too"}]
    assert "two-0 (the only in-sync follower online, SPU 1, is draining too)" in body["error"]["message"]
    assert "drain" not in (await spu_shown(cluster.sc, "spu-2"))["spec"]


async def test_an_undrain_cancels_and_the_preferred_leader_returns(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    for spu_id in range(2):
        await cluster.connect(spu_id)
    await create_manual(cluster.sc, "pair", [0, 1])
    await hosting(cluster, {0: {"pair-0"}, 1: {"pair-0"}})
    await all_online(cluster, {"pair-0": 0})
    argv = ["--sc", cluster.sc.url]
    assert await asyncio.to_thread(cli.main, ["spu", "drain", "spu-0", *argv]) == 0
    assert printed(capsys)[0] == "SPU 0 (spu-0) leads no partition: it can be stopped\n"
    await all_online(cluster, {"pair-0": 1})

    async def listed(drain: str) -> None:
        printed(capsys)
        assert await asyncio.to_thread(cli.main, ["spu", "list", *argv]) == 0
        rows = [line.split() for line in printed(capsys)[0].splitlines()]
        assert rows[0][5] == "DRAIN" and [row[5] for row in rows[1:]] == [drain, "-", "-"], rows

    await cluster.sc.eventually(lambda: listed("Drained"))
    assert await draining_gauge(cluster.sc) == "1.0"
    assert await asyncio.to_thread(cli.main, ["spu", "list", "-o", "json", *argv]) == 0
    [drained, _, _] = json.loads(printed(capsys)[0])
    assert (drained["spec"]["drain"], drained["status"]["drain"]) == (True, "Drained")
    # A second drain of a drained SPU changes nothing and says so.
    status, body = await cluster.sc.call("POST", "/v1/spus/spu-0/drain")
    assert (status, body["drained"], body["moved"]) == (200, True, []), body

    assert await asyncio.to_thread(cli.main, ["spu", "undrain", "0", *argv]) == 0
    assert printed(capsys)[0] == "SPU 0 (spu-0) is not draining: it may lead again\n"
    await cluster.sc.eventually(lambda: listed("-"))
    assert await draining_gauge(cluster.sc) == "0.0"

    async def status_cleared() -> None:
        # The list shows the spec at once; the SPU controller clears the status a moment later.
        assert (await spu_shown(cluster.sc, "spu-0"))["status"] == {"resolution": "Online"}

    await cluster.sc.eventually(status_cleared)
    # SPU 1 reports SPU 0 in sync: the leadership goes back to its preferred leader.
    await all_online(cluster, {"pair-0": 0})
    status, body = await cluster.sc.call("DELETE", "/v1/spus/spu-0/drain")
    assert (status, body) == (200, {"spu": 0, "name": "spu-0", "draining": False})
    status, body = await cluster.sc.call("DELETE", "/v1/spus/spu-9/drain")
    assert (status, body["error"]["code"]) == (404, "NotFound")
    assert await asyncio.to_thread(cli.main, ["spu", "undrain", "9", *argv]) == 1
    assert printed(capsys)[1] == "error: no SPU has id 9\n"


async def test_a_drain_outlives_a_reconnection_and_an_sc_restart(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    """Only an undrain ends a drain: the SPU reconnecting does not, nor does the SC restarting on
    the same store (it reads the intent back and keeps the leaderships away)."""
    settings = etcd_settings(etcd_server, spu_heartbeat_timeout=1.0, spu_offline_grace=5.0)
    async with running(settings) as sc, aiohttp.ClientSession() as client:
        for spu_id in range(2):
            await sc.register_spu(spu_id, online=False)
        first = Cluster(sc, client)
        try:
            for spu_id in range(2):
                await first.connect(spu_id)
            await create_manual(sc, "pair", [0, 1])
            await hosting(first, {0: {"pair-0"}, 1: {"pair-0"}})
            await all_online(first, {"pair-0": 0})
            status, body = await sc.call("POST", "/v1/spus/spu-0/drain")
            assert (status, body["drained"]) == (200, True), body
            # SPU 0 reconnects: still draining, and its preferred leadership stays away.
            await first.spus.pop(0).close()
            await first.connect(0)
            await all_online(first, {"pair-0": 1})
            await asyncio.sleep(0.5)  # room for a preferred-leader move, had the drain ended
            await all_online(first, {"pair-0": 1})
            assert (await spu_shown(sc, "spu-0"))["spec"]["drain"] is True
            # What each process holds, as it will say when it reconnects to the restarted SC.
            held = {spu_id: spu.held({"pair-0": 10}) for spu_id, spu in first.spus.items()}
        finally:
            await first.close()
    async with running(settings) as sc, aiohttp.ClientSession() as client:
        second = Cluster(sc, client)
        try:
            for spu_id in range(2):
                await second.connect(spu_id, hosted=held[spu_id])
            await hosting(second, {0: {"pair-0"}, 1: {"pair-0"}})
            # (Had SPU 0 come back first, it led meanwhile, being the only in-sync replica online.)
            await all_online(second, {"pair-0": 1})

            async def drained() -> None:
                spu = await spu_shown(sc, "spu-0")
                assert (spu["spec"]["drain"], spu["status"]) == (True, {"resolution": "Online", "drain": "Drained"}), spu

            await sc.eventually(drained)
            await asyncio.sleep(0.5)
            await all_online(second, {"pair-0": 1})
            # The drain is what kept it: cancelled, the leadership returns.
            status, _ = await sc.call("DELETE", "/v1/spus/spu-0/drain")
            assert status == 200
            await all_online(second, {"pair-0": 0})
        finally:
            await second.close()


async def test_a_drain_times_out_saying_what_moved_and_what_is_left(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    """Movable on paper, but the new leader's write cannot land before the deadline (timeout=0):
    the answer says the drain goes on, and the SPU stays draining until it is done."""
    async for handle in start_cluster(etcd_server, range(2), spu_heartbeat_timeout=1.0):
        for spu_id in range(2):
            await handle.connect(spu_id)
        await create_manual(handle.sc, "pair", [0, 1])
        await hosting(handle, {0: {"pair-0"}, 1: {"pair-0"}})
        await all_online(handle, {"pair-0": 0})
        async with handle.sc.session.post("/v1/spus/spu-0/drain", params={"timeout": "0"}) as response:
            status, body = response.status, await response.json()
        assert status == 202, body
        assert body == {
            "spu": 0, "name": "spu-0", "draining": True, "drained": False, "moved": [], "leading": ["pair-0"],
            "blocked": [{"partition": "pair-0", "reason": "not moved yet: it has a follower that may lead; the drain goes on"}],
        }
        await all_online(handle, {"pair-0": 1})

        async def drained() -> None:
            assert (await spu_shown(handle.sc, "spu-0"))["status"].get("drain") == "Drained"

        await handle.sc.eventually(drained)
