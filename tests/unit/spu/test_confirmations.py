"""The simulator says each leadership to the SC once per connection, and again for a partition of
the same name assigned after its replica was removed: a partition deleted and created again while
its leader stayed connected is a new partition, which stays Offline until its leader confirms it
(rule 5). Before, a (name, epoch) confirmed once was never said again on that connection."""

from __future__ import annotations

import asyncio

from connection_manager import wire
from connection_manager.spu import settings as settings_module
from connection_manager.spu.session import ScSession
from connection_manager.spu.state import SpuState
from tests.unit.spu.test_state import hosted, spu_info


def connected_session(state: SpuState) -> tuple[ScSession, asyncio.Queue[bytes]]:
    """A session on a connection that is up and synced, with its outbox to read what it sends."""
    session = ScSession(state, [("127.0.0.1", 9004)], None, settings_module.SpuSettings(), lambda _: None)
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    session._outbox, session.connected = outbox, True
    return session, outbox


def confirmed(outbox: asyncio.Queue[bytes]) -> list[tuple[str, int]]:
    said: list[tuple[str, int]] = []
    while not outbox.empty():
        message = wire.parse_spu_message(outbox.get_nowait())
        if isinstance(message, wire.Leading):
            said.extend((entry["partition"], entry["leader_epoch"]) for entry in message.partitions)
    return said


async def test_a_partition_removed_and_assigned_again_at_the_same_epoch_is_confirmed_again() -> None:
    state = SpuState(0, 2.0)
    session, outbox = connected_session(state)
    state.apply_sync(wire.Sync(epoch=1, spus=[spu_info(0)], replicas=[hosted("t-0", 0, [0], epoch=0)]), now=0.0)
    session.tell(state.drain())
    assert confirmed(outbox) == [("t-0", 0)]

    # Told again at the same epoch, it says nothing more (once per connection).
    state.apply_update(wire.Update(epoch=2, replicas=[hosted("t-0", 0, [0], epoch=0)]), now=1.0)
    session.tell(state.drain())
    assert confirmed(outbox) == []

    # Deleted, then a new partition of the name: in two updates, and in one.
    state.apply_update(wire.Update(epoch=3, deleted_replicas=["t-0"]), now=2.0)
    session.tell(state.drain())
    state.apply_update(wire.Update(epoch=4, replicas=[hosted("t-0", 0, [0], epoch=0)]), now=3.0)
    session.tell(state.drain())
    assert confirmed(outbox) == [("t-0", 0)]
    state.apply_update(wire.Update(epoch=5, deleted_replicas=["t-0"], replicas=[hosted("t-0", 0, [0], epoch=0)]), now=4.0)
    session.tell(state.drain())
    assert confirmed(outbox) == [("t-0", 0)]

    # Left out of a Sync (removed while the SPU was away from this connection's point of view).
    state.apply_sync(wire.Sync(epoch=6, spus=[spu_info(0)], replicas=[]), now=5.0)
    session.tell(state.drain())
    state.apply_update(wire.Update(epoch=7, replicas=[hosted("t-0", 0, [0], epoch=0)]), now=6.0)
    session.tell(state.drain())
    assert confirmed(outbox) == [("t-0", 0)]


async def test_a_leadership_names_the_uid_of_its_partition_and_a_new_one_is_said_again() -> None:
    """Told t-0 under another uid (deleted and created again while the SPU did not hear
    of it, no deletion in between), the leader confirms the new partition at the same epoch, naming it."""
    state = SpuState(0, 2.0)
    session, outbox = connected_session(state)

    def said() -> list[wire.Leadership]:
        entries: list[wire.Leadership] = []
        while not outbox.empty():
            message = wire.parse_spu_message(outbox.get_nowait())
            if isinstance(message, wire.Leading):
                entries.extend(message.partitions)
        return entries

    for epoch, identity in ((1, 5), (2, 5), (3, 9)):
        info = hosted("t-0", 0, [0], epoch=0).model_copy(update={"uid": identity})
        if state.synced:
            state.apply_update(wire.Update(epoch=epoch, replicas=[info]), now=float(epoch))
        else:
            state.apply_sync(wire.Sync(epoch=epoch, spus=[spu_info(0)], replicas=[info]), now=float(epoch))
        session.tell(state.drain())
        assert said() == ([] if epoch == 2 else [{"partition": "t-0", "leader_epoch": 0, "uid": identity}])
