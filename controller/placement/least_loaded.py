"""Least-loaded placement (what Fluvio's SC does today): each pick goes to the SPU carrying least.

Purely computational, no I/O. Leaders and followers are counted separately, over every
existing partition (other topics and this topic's current partitions). With racks, a
partition's replicas also spread over racks, and each leader's first followers over SPUs.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable

from controller.placement import cluster, model, spread


def place(run: model.Run) -> list[list[int]]:
    """Rack-aware when every eligible SPU has a rack (and racks are not ignored), else by load alone."""
    if cluster.rack_layout(run.spus, ignore_racks=run.request.ignore_rack_assignment) == "none":
        return _place_by_load(run)
    return _place_rack_aware(run)


def _place_by_load(run: model.Run) -> list[list[int]]:
    """Leader: fewest leaders; each follower: fewest followers; never twice in a partition; ties to the lowest id.

    Each heap holds one entry per eligible SPU, the integer `count << bits | position`
    (position in id order), so the smallest entry is the least-loaded SPU with the lowest id
    and a pick costs O(log n): add one to the count and sift the entry back down. A
    partition's followers are the smallest follower entries but its leader's.
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
        leader = top & mask
        chosen = [leader]
        # The followers are the smallest entries but the leader's, in order: popped together and
        # pushed back counted (a pick at a time would pop every earlier follower again, which at
        # a replication factor near the SPU count made a partition quadratic in it).
        picked: list[int] = []
        leader_entry: int | None = None
        while len(picked) < run.replication_factor - 1:
            entry = heappop(follower_heap)
            if entry & mask == leader:
                leader_entry = entry
            else:
                picked.append(entry)
        for entry in picked:
            chosen.append(entry & mask)
            heappush(follower_heap, entry + one)
        if leader_entry is not None:
            heappush(follower_heap, leader_entry)
        replica_map.append([ids[position] for position in chosen])
    return replica_map


def _place_rack_aware(run: model.Run) -> list[list[int]]:
    """The same picks, with two rules first for each follower.

    1. Racks: the follower goes to a rack (a site first, then a leaf rack, for paths) holding
       the fewest of this partition's replicas, so replicas take distinct racks while any is free.
    2. Failover: the first follower, which takes the leadership when the leader fails, goes to
       an SPU that has followed this leader first least often; so a failed SPU's leaderships
       land on as many survivors as there are (the `failover` figure of the balance report).

    Among the SPUs both rules allow, the one following fewest wins. Ties do not go to the
    lowest id here but round the SPUs, one place further at each follower count: with
    lowest-id ties every leader meets the same least-loaded SPUs pass after pass (which is
    what concentrated failovers), and finding one it has not paired with yet would mean
    popping all those it has. Heap entries are `count, (position + count) mod n, position`
    packed in one integer; entries the rules refuse are popped and pushed back. With three
    replicas or more per leaf rack the same entries are read from sorted rows per leaf rack
    instead (`_LeafRows`): the heap would pop most SPUs at every pick.
    """
    ids = run.ids
    size = len(ids)
    racks = _Racks([spread.rack_keys(spu) for spu in run.spus])
    position_of = {spu_id: position for position, spu_id in enumerate(ids)}
    leaders = [0] * size
    followers = [0] * size
    first_followers: list[dict[int, int]] = [{} for _ in ids]
    for replicas in _all_existing(run):
        positions = [position_of.get(spu_id) for spu_id in replicas]
        for replica_index, held_at in enumerate(positions):
            if held_at is None:
                continue  # offline or unknown SPUs take no new replicas, so their load does not matter
            if replica_index == 0:
                leaders[held_at] += 1
            else:
                followers[held_at] += 1
        if len(positions) > 1 and positions[0] is not None and positions[1] is not None:
            followed = first_followers[positions[0]]
            followed[positions[1]] = followed.get(positions[1], 0) + 1
    # How often each leader's allowed first followers have followed it first, at the fewest:
    # raised only when every allowed SPU has reached it, so they take turns.
    failover_level = [0] * size
    top_of, leaf_of, flat = racks.top_of, racks.leaf_of, racks.flat
    site_count = len(racks.top_sizes)
    # As many sites as replicas: each replica takes a site of its own (and so a leaf of its own),
    # and only which sites a partition uses matters.
    roomy = site_count >= run.replication_factor
    bits = max(1, size.bit_length())
    mask = (1 << bits) - 1
    one = 1 << bits
    count_shift = 2 * bits
    leader_heap = [count << bits | position for position, count in enumerate(leaders)]
    follower_heap = [
        count << count_shift | (position + count) % size << bits | position for position, count in enumerate(followers)
    ]
    heapq.heapify(leader_heap)
    heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
    replica_map: list[list[int]] = []
    if _by_rows(len(racks.leaf_sizes), run.replication_factor):
        rows = _LeafRows(follower_heap, racks, mask, count_shift, bits, size)
        for _ in range(run.count):
            top = leader_heap[0]
            heapreplace(leader_heap, top + one)
            leader = top & mask
            chosen = rows.followers(leader, run.replication_factor, first_followers[leader], failover_level)
            replica_map.append(list(map(ids.__getitem__, chosen)))
        return replica_map
    heapq.heapify(follower_heap)
    for _ in range(run.count):
        top = leader_heap[0]
        heapreplace(leader_heap, top + one)
        leader = top & mask
        chosen = [leader]
        # How many of this partition's replicas each site and each leaf rack holds (one dict
        # serves both for plain labels, where a rack is its own site and leaf).
        used_tops = {top_of[leader]: 1}
        used_leaves = used_tops if flat else {leaf_of[leader]: 1}
        paired: dict[int, int] | None = first_followers[leader]
        level = failover_level[leader]
        for _replica in range(1, run.replication_factor):
            # While some site is unused, "allowed" is "in an unused site", checked inline below.
            allowed = None if roomy or len(used_tops) < site_count else racks.allowed(used_tops, used_leaves)
            set_aside = []
            picked: int | None = None
            while follower_heap:
                entry = follower_heap[0]
                position = entry & mask
                if (
                    (top_of[position] not in used_tops if allowed is None else allowed(position))
                    and position not in chosen
                    and (paired is None or paired.get(position, 0) <= level)
                ):
                    picked = entry
                    break
                set_aside.append(heappop(follower_heap))
            if picked is None:
                # Every SPU the racks allow has followed this leader first as often as the level,
                # or more (racks always allow some SPU not yet in the partition): the level rises
                # to the fewest among them, and the first of those in heap order is taken.
                assert paired is not None
                candidates = [
                    entry
                    for entry in set_aside
                    if (entry & mask) not in chosen
                    and (top_of[entry & mask] not in used_tops if allowed is None else allowed(entry & mask))
                ]
                failover_level[leader] = level = min(paired.get(entry & mask, 0) for entry in candidates)
                picked = next(entry for entry in candidates if paired.get(entry & mask, 0) == level)
                set_aside.remove(picked)
                follower_heap.append(picked)  # the heap is empty: the entry goes back to be replaced
                position = picked & mask
            count = (picked >> count_shift) + 1
            heapreplace(follower_heap, count << count_shift | (position + count) % size << bits | position)
            for entry in set_aside:
                heappush(follower_heap, entry)
            if paired is not None:
                paired[position] = paired.get(position, 0) + 1
                paired = None  # the pairing rule is for the first follower only
            chosen.append(position)
            used_tops[top_of[position]] = used_tops.get(top_of[position], 0) + 1
            if not roomy and not flat:
                used_leaves[leaf_of[position]] = used_leaves.get(leaf_of[position], 0) + 1
        replica_map.append(list(map(ids.__getitem__, chosen)))
    return replica_map


def _by_rows(leaves: int, replication_factor: int) -> bool:
    """Whether the rack-aware picks read rows per leaf rack (`_LeafRows`) rather than pop a heap.

    Measured (`bench/placement_rows.py`, same answers both ways): from three replicas per leaf
    rack on the rows take 0.2-0.5x the heap's time (0.2x at RF 128 on 8 racks); at two they are
    0.8-1.3x, and below that up to 10x slower (the heap then pops few entries per pick, and the
    rows read one per allowed rack).
    """
    return 3 * leaves <= replication_factor


class _LeafRows:
    """The follower entries of `_place_rack_aware` in one sorted row per leaf rack.

    A pick reads the first entry the partition has not taken from each row the racks allow,
    and takes the smallest: the entry the heap would reach after popping every entry the rules
    refuse. With few leaf racks and many replicas per partition that popping was most of the
    work (a replication factor of 128 on 8 racks popped about a hundred entries per pick); here a
    pick reads a few entries per allowed row. Counts are raised when the partition is complete
    (an SPU in the partition is not picked again in it, so its entry does not matter until then).
    """

    def __init__(self, entries: list[int], racks: _Racks, mask: int, count_shift: int, bits: int, size: int) -> None:
        self.racks, self.mask, self.count_shift, self.bits, self.size = racks, mask, count_shift, bits, size
        self.entry_of = [0] * size
        self.rows: list[list[int]] = [[] for _ in racks.leaf_sizes]
        for entry in sorted(entries):
            self.entry_of[entry & mask] = entry
            self.rows[racks.leaf_of[entry & mask]].append(entry)
        self.leaves_of_top = {top: sorted(leaves) for top, leaves in racks.leaves_of_top.items()}
        self.top_sizes = [racks.top_sizes[top] for top in range(len(racks.top_sizes))]
        self.leaf_sizes = [racks.leaf_sizes[leaf] for leaf in range(len(racks.leaf_sizes))]

    def followers(
        self, leader: int, replication_factor: int, paired: dict[int, int], failover_level: list[int]
    ) -> list[int]:
        """The partition led by `leader`: its positions, leader first, by the rules of `_place_rack_aware`.

        The racks allowed are those at the fewest replicas: the sites holding fewest (none, while
        a site is unused), then among their leaf racks those holding fewest; each counting only
        racks with an SPU not yet taken. A pick moves its site up a level; when no site is left
        at the level, the level is found again.
        """
        racks, mask, rows = self.racks, self.mask, self.rows
        top_of, leaf_of, flat = racks.top_of, racks.leaf_of, racks.flat
        top_sizes, leaf_sizes = self.top_sizes, self.leaf_sizes
        top_used = [0] * len(top_sizes)
        leaf_used = top_used if flat else [0] * len(leaf_sizes)
        chosen = [leader]
        taken = {leader}
        front = [0] * len(rows)  # per row, where the entries the partition has not taken may start
        top_used[top_of[leader]] += 1
        if not flat:
            leaf_used[leaf_of[leader]] += 1
        level_tops: set[int] = set()
        first: dict[int, int] | None = paired
        level = failover_level[leader]
        for _replica in range(1, replication_factor):
            if not level_tops:
                with_room = [top for top, used in enumerate(top_used) if used < top_sizes[top]]
                fewest = min(top_used[top] for top in with_room)
                level_tops = {top for top in with_room if top_used[top] == fewest}
            if flat:
                leaves: Iterable[int] = level_tops
            else:
                open_leaves = [
                    leaf for top in level_tops for leaf in self.leaves_of_top[top] if leaf_used[leaf] < leaf_sizes[leaf]
                ]
                fewest_leaf = min(leaf_used[leaf] for leaf in open_leaves)
                leaves = [leaf for leaf in open_leaves if leaf_used[leaf] == fewest_leaf]
            picked: int | None = None
            for leaf in leaves:
                row = rows[leaf]
                index = front[leaf]
                while index < len(row) and row[index] & mask in taken:
                    index += 1
                front[leaf] = index
                for entry in itertools.islice(row, index, None):
                    position = entry & mask
                    if position in taken or (first is not None and first.get(position, 0) > level):
                        continue
                    if picked is None or entry < picked:
                        picked = entry
                    break
            if picked is None:
                # As in the heap: every allowed SPU has followed this leader first more often
                # than the level, which rises to the fewest among them.
                assert first is not None
                candidates = [
                    entry for leaf in leaves for entry in rows[leaf][front[leaf]:] if entry & mask not in taken
                ]
                failover_level[leader] = level = min(first.get(entry & mask, 0) for entry in candidates)
                picked = min(entry for entry in candidates if first.get(entry & mask, 0) == level)
            position = picked & mask
            if first is not None:
                first[position] = first.get(position, 0) + 1
                first = None  # the pairing rule is for the first follower only
            chosen.append(position)
            taken.add(position)
            top = top_of[position]
            top_used[top] += 1
            level_tops.discard(top)
            if not flat:
                leaf_used[leaf_of[position]] += 1
        count_shift, bits, size = self.count_shift, self.bits, self.size
        for position in chosen[1:]:
            entry = self.entry_of[position]
            row = rows[leaf_of[position]]
            del row[bisect.bisect_left(row, entry)]
            count = (entry >> count_shift) + 1
            entry = self.entry_of[position] = count << count_shift | (position + count) % size << bits | position
            bisect.insort(row, entry)
        return chosen


class _Racks:
    """The eligible SPUs' racks at both levels, as small integers (a plain label is its own site and leaf)."""

    def __init__(self, keys: list[spread.RackKeys]) -> None:
        top_number = {name: number for number, name in enumerate(sorted({entry[0] for entry in keys}))}
        leaf_number = {name: number for number, name in enumerate(sorted({entry[-1] for entry in keys}))}
        self.top_of = [top_number[entry[0]] for entry in keys]
        self.leaf_of = [leaf_number[entry[-1]] for entry in keys]
        self.top_sizes = Counter(self.top_of)
        self.leaf_sizes = Counter(self.leaf_of)
        self.flat = all(len(entry) == 1 for entry in keys)
        self.leaves_of_top: dict[int, set[int]] = {}
        for top, leaf in zip(self.top_of, self.leaf_of, strict=True):
            self.leaves_of_top.setdefault(top, set()).add(leaf)

    def allowed(self, tops: dict[int, int], leaves: dict[int, int]) -> Callable[[int], bool] | None:
        """Whether a position's site, then its leaf rack, holds the fewest of the partition's replicas.

        None while some site holds none (nor then do its leaves): "allowed" is then simply "in
        an unused site", which the caller checks inline. Only racks with an SPU not yet in the
        partition count for the fewest, so some SPU always qualifies (the replication factor
        never exceeds the eligible SPUs).
        """
        top_sizes, leaf_sizes = self.top_sizes, self.leaf_sizes
        if len(tops) < len(top_sizes):
            return None  # the caller checks this case inline; kept here so the method stands alone
        fewest_top = min(count for top, count in tops.items() if count < top_sizes[top])
        fewest_leaf = min(
            leaves.get(leaf, 0)
            for top, count in tops.items()
            if count == fewest_top
            for leaf in self.leaves_of_top[top]
            if leaves.get(leaf, 0) < leaf_sizes[leaf]
        )
        top_of, leaf_of = self.top_of, self.leaf_of
        return lambda position: (
            tops.get(top_of[position], 0) == fewest_top and leaves.get(leaf_of[position], 0) == fewest_leaf
        )


def _all_existing(run: model.Run) -> list[tuple[int, ...]]:
    existing = [tuple(entry[2]) for entry in run.request.existing]
    existing.extend(tuple(replicas) for replicas in run.request.current_replica_map)
    return existing
