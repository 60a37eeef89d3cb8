"""Least-loaded placement (what Fluvio's SC does today): each pick goes to the SPU carrying least.

Purely computational, no I/O. Leaders and followers are counted separately, over every
existing partition (other topics and this topic's current partitions).
"""

from __future__ import annotations

import heapq

from controller.placement import model


def place(run: model.Run) -> list[list[int]]:
    """Leader: fewest leaders; each follower: fewest followers; never twice in a partition; ties to the lowest id.

    Each heap holds one entry per eligible SPU, the integer `count << bits | position`
    (position in id order), so the smallest entry is the least-loaded SPU with the lowest id
    and a pick costs O(log n): add one to the count and sift the entry back down. SPUs that
    already hold a replica of the partition are set aside while the next follower is found.
    """
    ids = run.ids
    position_of = {spu_id: position for position, spu_id in enumerate(ids)}
    leaders = [0] * len(ids)
    followers = [0] * len(ids)
    for replicas in _all_existing(run):
        for replica_index, spu_id in enumerate(replicas):
            position = position_of.get(spu_id)
            if position is None:
                continue  # offline or unknown SPUs take no new replicas, so their load does not matter
            if replica_index == 0:
                leaders[position] += 1
            else:
                followers[position] += 1
    bits = max(1, len(ids).bit_length())
    mask = (1 << bits) - 1
    one = 1 << bits
    leader_heap = [count << bits | position for position, count in enumerate(leaders)]
    follower_heap = [count << bits | position for position, count in enumerate(followers)]
    heapq.heapify(leader_heap)
    heapq.heapify(follower_heap)
    heapreplace, heappop, heappush = heapq.heapreplace, heapq.heappop, heapq.heappush
    replica_map: list[list[int]] = []
    for _ in range(run.count):
        top = leader_heap[0]
        heapreplace(leader_heap, top + one)
        chosen = [top & mask]
        set_aside = []
        for _replica in range(run.replication_factor - 1):
            top = follower_heap[0]
            while (top & mask) in chosen:
                set_aside.append(heappop(follower_heap))
                top = follower_heap[0]
            heapreplace(follower_heap, top + one)
            chosen.append(top & mask)
        for entry in set_aside:
            heappush(follower_heap, entry)
        replica_map.append([ids[position] for position in chosen])
    return replica_map


def _all_existing(run: model.Run) -> list[tuple[int, ...]]:
    existing = [tuple(entry[2]) for entry in run.request.existing]
    existing.extend(tuple(replicas) for replicas in run.request.current_replica_map)
    return existing
