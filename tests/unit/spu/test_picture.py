"""The simulator looks at what an Update touched, not at every replica it hosts: with thousands
of replicas per SPU and twenty SPUs in one process, a pass over all of them at every Update kept
the process's loop so busy that it noticed its SC's death seconds late (bench/takeover.py)."""

from __future__ import annotations

from collections.abc import Iterator

import structlog.testing

from connection_manager import wire
from connection_manager.spu.simulator import SimulatedSpu


class NoScan(dict[str, object]):
    """The replicas of an SPU, refusing to be walked through (looked up by name only)."""

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("walked through every replica")

    def items(self):  # noqa: ANN201 (refuses, whatever the types)
        raise AssertionError("walked through every replica")

    def values(self):  # noqa: ANN201
        raise AssertionError("walked through every replica")


def info(name: str, leader: int, epoch: int = 1) -> wire.ReplicaInfo:
    return wire.ReplicaInfo(partition=name, leader=leader, leader_epoch=epoch, partition_epoch=epoch, isr=[0, 1], replicas=[0, 1])


async def test_an_update_is_looked_at_for_the_partitions_it_names_only() -> None:
    spu = SimulatedSpu(0, "127.0.0.1:1")
    spu.state.apply_sync(wire.Sync(epoch=1, spus=[], replicas=[info(name, 0) for name in ("t-0", "t-1", "t-2")]), 0.0)
    with structlog.testing.capture_logs() as logs:
        spu._picture_changed(None)
    assert [line["event"] for line in logs] == ["replicas assigned"]
    spu.state.apply_update(wire.Update(epoch=2, replicas=[info("t-1", 1, 2)], deleted_replicas=["t-2"]), 0.0)
    spu.state.replicas = NoScan(spu.state.replicas)  # type: ignore[assignment]  # a dict all the same
    with structlog.testing.capture_logs() as logs:
        spu._picture_changed({"t-1", "t-2"})
        spu._picture_changed({"t-0"})  # nothing changed there
    told = [line for line in logs if line["event"] in ("replica role", "replica removed")]
    assert [(line["event"], line["partition"]) for line in told] == [("replica role", "t-1"), ("replica removed", "t-2")]
    assert told[0]["role"] == "follower" and told[0]["leader"] == 1
