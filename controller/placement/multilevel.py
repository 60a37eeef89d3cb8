"""Multi-level rack awareness (the KIP's hierarchical placer): a tree of rings over `/dc/rack` paths.

Purely computational, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.placement import cluster, model


class Node:
    """A level of the rack tree: inner nodes ring over their children, leaves over their SPUs."""

    __slots__ = ("name", "children", "spus", "capacity", "pointer")

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []
        self.spus: list[int] = []
        self.capacity = 0
        self.pointer = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


def place(run: model.Run) -> list[list[int]]:
    """Replica sets from the ring walk, continued across partitions; leaders then evened out.

    Each replica walks from the root taking the child each ring points to (advancing that
    ring) down to a leaf, whose ring gives the SPU. Children whose subtree already holds
    every one of its SPUs in this partition are skipped, as are SPUs already chosen, so an
    unbalanced tree still gets distinct replicas spread as evenly as its shape allows. The
    walk starts where `start_index` unconstrained picks from the all-zero state would leave
    it, so the same input always gives the same map and chained topics start further on.
    """
    root = build_tree(run.spus, ignore_racks=run.request.ignore_rack_assignment)
    if is_uniform(root):
        replica_sets = _uniform_walk(root, run.count, run.replication_factor, run.start_index)
    else:
        replica_sets = walk(root, run.count, run.replication_factor, run.start_index)
    return lead_evenly(replica_sets)


def build_tree(spus: Sequence[model.SpuInfo], *, ignore_racks: bool = False) -> Node:
    """The rack tree of the eligible SPUs: children in name order, SPUs in id order.

    Without racks (or with racks ignored) the root itself is the only leaf. Every SPU must
    sit at the same depth, or the result is an InvalidConfig naming two that differ.
    """
    root = Node("/")
    layout = cluster.rack_layout(spus, ignore_racks=ignore_racks)
    ordered = sorted(spus, key=lambda spu: spu.id)
    paths = {spu.id: (cluster.rack_path(spu) if layout != "none" else ()) for spu in ordered}
    if ordered:
        first = ordered[0]
        for spu in ordered:
            if len(paths[spu.id]) != len(paths[first.id]):
                raise model.InvalidConfig(
                    "multi-level racks must all have the same depth: "
                    f"SPU {first.id} has {first.rack!r} ({len(paths[first.id])} levels), "
                    f"SPU {spu.id} has {spu.rack!r} ({len(paths[spu.id])} levels)",
                    fix=model.Fix.CLUSTER,
                )
    index: dict[tuple[str, ...], Node] = {(): root}
    for spu in ordered:
        path = paths[spu.id]
        node = root
        for depth in range(len(path)):
            key = path[: depth + 1]
            child = index.get(key)
            if child is None:
                child = index[key] = Node(path[depth])
                node.children.append(child)
            node = child
        node.spus.append(spu.id)
    _finish(root)
    return root


def _finish(node: Node) -> int:
    node.children.sort(key=lambda child: child.name)
    node.capacity = len(node.spus) + sum(_finish(child) for child in node.children)
    return node.capacity


def is_uniform(root: Node) -> bool:
    """True when every node of a level has the same number of children and all leaves the same size.

    Then the unconstrained walk visits every SPU exactly once per cycle of all SPUs, so it
    never has to skip anything and can be precomputed as one sequence.
    """
    level = [root]
    while not level[0].is_leaf:
        width = len(level[0].children)
        if any(node.is_leaf or len(node.children) != width for node in level):
            return False
        level = [child for node in level for child in node.children]
    return all(node.is_leaf and len(node.spus) == len(level[0].spus) for node in level)


def prime(node: Node, visits: int) -> None:
    """Set every ring as `visits` unconstrained picks from the all-zero state would leave it."""
    if node.is_leaf:
        node.pointer = visits % len(node.spus)
        return
    width = len(node.children)
    node.pointer = visits % width
    for position, child in enumerate(node.children):
        prime(child, visits // width + (1 if position < visits % width else 0))


def walk(root: Node, count: int, replication_factor: int, start_index: int) -> list[list[int]]:
    """The ring walk itself, one replica at a time (the reference; works for any tree shape)."""
    prime(root, start_index)
    replica_sets: list[list[int]] = []
    for _ in range(count):
        chosen: list[int] = []
        taken: set[int] = set()
        used: dict[int, int] = {}
        for _replica in range(replication_factor):
            node = root
            while not node.is_leaf:
                width = len(node.children)
                for step in range(width):
                    child = node.children[(node.pointer + step) % width]
                    if used.get(id(child), 0) < child.capacity:
                        break
                node.pointer = (node.pointer + step + 1) % width
                used[id(child)] = used.get(id(child), 0) + 1
                node = child
            size = len(node.spus)
            for step in range(size):
                spu_id = node.spus[(node.pointer + step) % size]
                if spu_id not in taken:
                    break
            node.pointer = (node.pointer + step + 1) % size
            taken.add(spu_id)
            chosen.append(spu_id)
        replica_sets.append(chosen)
    return replica_sets


def walk_sequence(node: Node) -> list[int]:
    """One full cycle of the unconstrained walk of a uniform tree from the all-zero state.

    Pick i goes to child i % k, as that child's pick i // k, so the cycle interleaves the
    children's own cycles.
    """
    if node.is_leaf:
        return list(node.spus)
    cycles = [walk_sequence(child) for child in node.children]
    width = len(cycles)
    sequence = [0] * (width * len(cycles[0]))
    for position, cycle in enumerate(cycles):
        sequence[position::width] = cycle
    return sequence


def _uniform_walk(root: Node, count: int, replication_factor: int, start_index: int) -> list[list[int]]:
    """The same walk for a uniform tree, as slices of the precomputed cycle (no per-pick work)."""
    cycle = walk_sequence(root)
    size = len(cycle)
    offset = start_index % size
    picks_needed = count * replication_factor
    rotated = cycle[offset:] + cycle[:offset]
    picks = rotated * (picks_needed // size + 1)
    del picks[picks_needed:]
    columns = [picks[replica::replication_factor] for replica in range(replication_factor)]
    return list(map(list, zip(*columns, strict=True)))


def lead_evenly(replica_sets: list[list[int]]) -> list[list[int]]:
    """Rotate each replica set so its preferred leader is the member that leads least so far.

    The walk fixes which SPUs hold each partition (and so the per-level spread); continuing it
    across partitions would give every partition the same leader position in the tree when the
    replication factor shares a divisor with the tree's width (3 DCs, RF 3: every leader in dc1).
    Ties go to the earliest pick. Rotating keeps the ring order of the followers for failover.
    """
    leaderships: dict[int, int] = {}
    get = leaderships.get
    for index, replicas in enumerate(replica_sets):
        best, best_count = 0, get(replicas[0], 0)
        if best_count:
            for position in range(1, len(replicas)):
                count = get(replicas[position], 0)
                if count < best_count:
                    best, best_count = position, count
                    if not count:
                        break
        leader = replicas[best]
        leaderships[leader] = best_count + 1
        if best:
            replica_sets[index] = replicas[best:] + replicas[:best]
    return replica_sets
