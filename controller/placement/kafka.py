"""Kafka's replica assignment (AdminUtils): leader round robin, followers shifted once per pass.

Purely computational, no I/O. The start index is both Kafka's fixed start index and its
initial replica shift, so the result is deterministic where Kafka would pick at random.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controller.placement import cluster, model, rings


def place(run: model.Run) -> list[list[int]]:
    """Rack-aware when every eligible SPU has a rack (and racks are not ignored), else rack-unaware."""
    layout = cluster.rack_layout(run.spus, ignore_racks=run.request.ignore_rack_assignment)
    if layout == "none":
        return rack_unaware(run.ids, run.count, run.replication_factor, run.start_index)
    racks = {spu.id: spu.rack or "" for spu in run.spus}
    return rack_aware(racks, run.count, run.replication_factor, run.start_index)


def rack_unaware(ids: Sequence[int], count: int, replication_factor: int, start_index: int) -> list[list[int]]:
    """Leader of partition p = B[(p + s) % n]; follower j = B[(first + 1 + (shift + j) % (n - 1)) % n]."""
    n = len(ids)

    def offsets(shift: int) -> list[int]:
        return [0, *(1 + (shift + j) % (n - 1) for j in range(replication_factor - 1))]

    return _by_shift(ids, count, start_index, offsets)


def _by_shift(
    arranged: Sequence[int], count: int, start_index: int, offsets_of_shift: Callable[[int], list[int]]
) -> list[list[int]]:
    """Partition p leads at arranged[(p + s) % n], its replicas at offsets fixed by the shift s + p // n.

    The shift grows each time p > 0 is a multiple of n, so it is constant over blocks of n
    partitions, which are cut out of the broker ring as slices.
    """
    n = len(arranged)
    ring = rings.ring(arranged)
    replica_map: list[list[int]] = []
    for block_start in range(0, count, n):
        offsets = offsets_of_shift(start_index + block_start // n)
        size = min(n, count - block_start)
        replica_map.extend(rings.block(ring, (block_start + start_index) % n, size, offsets))
    return replica_map


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """Brokers taking one from each rack in turn (racks by name, ids sorted), skipping exhausted racks."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    return cluster.alternate([by_rack[rack] for rack in sorted(by_rack)])


def rack_aware(racks: dict[int, str], count: int, replication_factor: int, start_index: int) -> list[list[int]]:
    """Kafka's rack-aware assignment over the rack-alternated broker list.

    The leader is chosen as in the rack-unaware form. Followers probe
    list[(first + 1 + (shift * numRacks + k) % (n - 1)) % n] with k counting every probe of
    the partition, taking a broker only if its rack has no replica yet (or all racks have
    one) and it is not a replica yet. When all racks have the same size, the rack of list
    position i is i % numRacks and numRacks divides n, so the accepted offsets depend only on
    the shift and are computed once per block of n partitions; otherwise each partition probes.
    """
    arranged = rack_alternated(racks)
    n = len(arranged)
    rack_names = sorted(set(racks.values()))
    rack_number = {rack: number for number, rack in enumerate(rack_names)}
    rack_at = [rack_number[racks[broker]] for broker in arranged]
    num_racks = len(rack_names)
    # Offsets relative to the leader only decide racks alike for every leader when the rack
    # pattern repeats with a period that divides the list length (equal-sized racks).
    periodic = n % num_racks == 0 and all(rack == position % num_racks for position, rack in enumerate(rack_at))
    if periodic:

        def offsets(shift: int) -> list[int]:
            return _probe(0, shift * num_racks, replication_factor, rack_at, num_racks)

        return _by_shift(arranged, count, start_index, offsets)
    replica_map: list[list[int]] = []
    for partition in range(count):
        shift = start_index + partition // n
        first = (partition + start_index) % n
        positions = _probe(first, shift * num_racks, replication_factor, rack_at, num_racks)
        replica_map.append([arranged[position] for position in positions])
    return replica_map


def _probe(first: int, base: int, replication_factor: int, rack_at: Sequence[int], num_racks: int) -> list[int]:
    """Positions (in the arranged list) of one partition's replicas, leader at `first`."""
    n = len(rack_at)
    positions = [first]
    racks_with_replicas = {rack_at[first]}
    taken = {first}
    probe = 0
    while len(positions) < replication_factor:
        position = (first + 1 + (base + probe) % (n - 1)) % n
        probe += 1
        rack = rack_at[position]
        if (rack not in racks_with_replicas or len(racks_with_replicas) == num_racks) and (
            position not in taken or len(taken) == n
        ):
            positions.append(position)
            racks_with_replicas.add(rack)
            taken.add(position)
    return positions
