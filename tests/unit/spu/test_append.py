"""A leader's append bursts on the loop clock, fast-forwarded by looptime: exact LEOs at exact times."""

from __future__ import annotations

import asyncio

import pytest

from connection_manager import wire
from connection_manager.spu import simulator
from connection_manager.spu.settings import SpuSettings
from connection_manager.spu.state import SpuState


@pytest.mark.looptime
async def test_every_partition_led_gets_a_burst_each_interval_and_the_others_none() -> None:
    state = SpuState(0, lag_time=2.0)
    state.apply_sync(
        wire.Sync(
            epoch=1,
            spus=[],
            replicas=[
                wire.ReplicaInfo(partition="t-0", leader=0, leader_epoch=1, isr=[0], replicas=[0]),
                wire.ReplicaInfo(partition="t-1", leader=0, leader_epoch=1, isr=[0], replicas=[0]),
                wire.ReplicaInfo(partition="t-2", leader=1, leader_epoch=1, isr=[1, 0], replicas=[1, 0]),
                wire.ReplicaInfo(partition="t-3", leader=None, leader_epoch=1, isr=[1, 0], replicas=[1, 0]),
            ],
        ),
        now=0.0,
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    bursts = asyncio.create_task(simulator.append_bursts(state, SpuSettings(append_interval=0.5, append_records=100)))
    leos = []
    for pause in (0.25, 0.5, 0.5, 9.0):
        await asyncio.sleep(pause)
        leos.append((loop.time() - start, {name: replica.leo for name, replica in state.replicas.items()}))
    bursts.cancel()
    await asyncio.gather(bursts, return_exceptions=True)
    assert leos == [
        (0.25, {"t-0": 0, "t-1": 0, "t-2": 0, "t-3": 0}),
        (0.75, {"t-0": 100, "t-1": 100, "t-2": 0, "t-3": 0}),
        (1.25, {"t-0": 200, "t-1": 200, "t-2": 0, "t-3": 0}),
        (10.25, {"t-0": 2000, "t-1": 2000, "t-2": 0, "t-3": 0}),
    ]
    # Alone in their in-sync sets, the leaders commit each burst at once.
    assert (state.replicas["t-0"].hw, state.replicas["t-1"].hw) == (2000, 2000)
    assert state.replicas["t-0"].log.runs == [(1, 0)]
