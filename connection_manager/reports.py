"""What SPUs tell the SC besides offsets, as the controllers read it: each connection's incarnation
and what its process holds, leaders' in-sync proposals and leadership confirmations.

Purely computational, no I/O. The connection manager fills these in; the partition controller
decides from them (and never from anything older than the SPU's current connection).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from connection_manager import wire
from store import models


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One accepted connection of an SPU, once it said what its process holds (``Hosted``)."""

    spu: int
    number: int
    # Partition -> (its log end offset, the leader epoch this process was last told; None: never).
    # The connection manager forgets an entry once the partition is deleted: a new one of the name
    # is another partition, of which this process held nothing.
    hosted: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    # Partition -> the partition epoch at which the SC saw that this process had not been told of
    # the role the committed state gives it (leader, or in-sync member): it restarted since. The
    # fact holds while the partition stays at that epoch (the SC's next write takes it into account).
    # The connection manager forgets an entry once the partition moved on (so it stays small), or
    # was deleted.
    restarted: dict[str, int] = field(default_factory=dict)

    def restarted_at(self, partition: str, partition_epoch: int) -> bool:
        return self.restarted.get(partition) == partition_epoch

    def leo(self, partition: str) -> int | None:
        held = self.hosted.get(partition)
        return None if held is None else held[0]

    def forget(self, partition: str) -> None:
        """The partition was deleted: what this process held of it, and the role it missed, were
        of that partition only."""
        self.hosted.pop(partition, None)
        self.restarted.pop(partition, None)


def hosted_map(entries: Iterable[wire.HostedReplica], identities: Mapping[str, int]) -> dict[str, tuple[int, int | None]]:
    """What a process holds of the partitions ``identities`` names (name -> uid, the current ones
    that have one): an entry naming another uid is of another partition of that name, deleted
    since (its log holds none of the current one's records), and is left out. An entry naming
    none (an SPU older than the field), or about a partition without a uid, is taken as it is."""
    held = {}
    for entry in entries:
        name = entry["partition"]
        if "uid" in entry and entry["uid"] != identities.get(name, entry["uid"]):
            continue
        held[name] = (entry["leo"], entry["leader_epoch"])
    return held


def has_role(partition: models.Partition, spu: int) -> bool:
    """The committed state counts on ``spu``: it leads the partition, or is in its in-sync set."""
    status = partition.status
    if partition.spec.leader == spu and status.resolution is not models.PartitionResolution.LEADER_OFFLINE:
        return True
    return spu in partition.in_sync()


def roles_not_continued(
    spu: int, hosted: Mapping[str, tuple[int, int | None]], partitions: Iterable[models.Partition]
) -> dict[str, int]:
    """The partitions where the committed state gives ``spu`` a role at a leader epoch its
    process was not told of (a new process, or one that missed the change), each with the
    partition epoch at which that was seen."""
    restarted = {}
    for partition in partitions:
        if spu not in partition.spec.replicas or not has_role(partition, spu):
            continue
        told = hosted.get(partition.name)
        if told is None or told[1] != partition.status.leader_epoch:
            restarted[partition.name] = partition.status.partition_epoch
    return restarted


@dataclass(frozen=True, slots=True)
class Proposal:
    """A leader's AlterIsr, as received on its connection ``incarnation``."""

    partition: str
    spu: int
    incarnation: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    # (SPU, incarnation) as the frame named them: the connection under which the leader saw each
    # SPU it adds catch up (KIP-903). The rules add an SPU only under its current incarnation.
    incarnations: tuple[tuple[int, int], ...] = ()
    # The leader's HW when it proposed (None: an SPU older than the field): committed once the set is.
    hw: int | None = None
