"""Computed replica assignment (Fluvio's CRA): round robin with gaps, and its 3-stage rack-aware form.

Purely computational, no I/O. Racks written as paths are handed to the multi-level strategy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from controller.placement import cluster, model, multilevel, rings


def place(run: model.Run) -> list[list[int]]:
    """The default strategy: rack-aware when every eligible SPU has a rack, else round robin with gaps."""
    layout, sequence = _layout(run.spus, run.request.ignore_rack_assignment)
    if layout == "paths":
        return multilevel.place(run)
    if sequence is not None:
        return _from_sequence(sequence, run)
    return round_robin(run.ids, run.count, run.replication_factor, run.start_index)


# The last eligible-SPU tuple's layout and rack sequence: the engine hands every topic of a pass
# the same tuple (immutable), so while it is the same object neither is worked out again.
_last_layout: tuple[tuple[model.SpuInfo, ...], bool, cluster.RackLayout, tuple[int, ...] | None] | None = None


def _layout(spus: tuple[model.SpuInfo, ...], ignore_racks: bool) -> tuple[cluster.RackLayout, tuple[int, ...] | None]:
    """The SPUs' rack layout, and for flat racks the rack-aware sequence (stages 1 and 2)."""
    global _last_layout
    last = _last_layout
    if last is not None and last[0] is spus and last[1] == ignore_racks:
        return last[2], last[3]
    layout = cluster.rack_layout(spus, ignore_racks=ignore_racks)
    if len(spus) > model.CACHED_SPUS_LIMIT:  # not remembered: a placement request's list may be huge
        return layout, tuple(rack_sequence(spus)) if layout == "flat" else None
    sequence = _rack_sequence_of(tuple(spus)) if layout == "flat" else None
    if type(spus) is tuple:
        _last_layout = (spus, ignore_racks, layout, sequence)
    return layout, sequence


def round_robin(ids: Sequence[int], count: int, replication_factor: int, start_index: int) -> list[list[int]]:
    """The seed's table: replica r of the partition at index i = s + p is ids[(i + r + gap) % n].

    The leader has no gap; followers shift by `gap = (i // n) % (n - RF + 1)`, so each pass over
    the SPUs pairs every leader with a different set of followers.
    """
    gap_max = len(ids) - replication_factor + 1

    def offsets(pass_number: int) -> list[int]:
        gap = pass_number % gap_max
        return [0, *(replica + gap for replica in range(1, replication_factor))]

    return _by_pass(ids, count, start_index, offsets)


def _by_pass(
    sequence: Sequence[int], count: int, start_index: int, offsets_of_pass: Callable[[int], list[int]]
) -> list[list[int]]:
    """Partitions at indexes s .. s + count - 1, replica r of index i at sequence[(i + offsets[r]) % n].

    The offsets depend only on the pass `i // n` over the sequence, so each pass is a block
    of consecutive indexes cut out of the sequence ring as slices.
    """
    n = len(sequence)
    ring = rings.ring(sequence)
    replica_map: list[list[int]] = []
    index, end = start_index, start_index + count
    while index < end:
        block_end = min(end, (index // n + 1) * n)
        replica_map.extend(rings.block(ring, index % n, block_end - index, offsets_of_pass(index // n)))
        index = block_end
    return replica_map


def rack_sequence(spus: Sequence[model.SpuInfo]) -> list[int]:
    """Stages 1 and 2 of the rack-aware CRA: the rack matrix read diagonally.

    Stage 1 groups SPUs by rack (ids sorted), racks by size descending then name. Stage 2 walks
    the matrix: row advances by one each step, column by one each full pass over the rows,
    short racks wrapping around; SPUs already taken are skipped and any the walk missed are
    appended in matrix order so every SPU appears exactly once.
    """
    by_rack: dict[str, list[int]] = {}
    for spu in sorted(spus, key=lambda spu: spu.id):
        by_rack.setdefault(spu.rack or "", []).append(spu.id)
    matrix = [by_rack[rack] for rack in sorted(by_rack, key=lambda rack: (-len(by_rack[rack]), rack))]
    rows, cols = len(matrix), len(matrix[0])
    taken: set[int] = set()
    sequence: list[int] = []
    row = col = 0
    for step in range(rows * cols):
        rack = matrix[row]
        spu_id = rack[col % len(rack)]
        if spu_id not in taken:
            taken.add(spu_id)
            sequence.append(spu_id)
        row = (row + 1) % rows
        col = ((step + 1) // rows + row) % cols
    # Step i visits cell (i % rows, (i // rows + i % rows) % cols): every cell once, so every
    # SPU is met; the append keeps the every-SPU-once promise explicit should that change.
    sequence.extend(spu_id for rack in matrix for spu_id in rack if spu_id not in taken)
    return sequence


@functools.lru_cache(maxsize=8)
def _rack_sequence_of(spus: tuple[model.SpuInfo, ...]) -> tuple[int, ...]:
    """rack_sequence, remembered per SPU set (many topics are placed on the same cluster)."""
    return tuple(rack_sequence(spus))


def _from_sequence(sequence: Sequence[int], run: model.Run) -> list[list[int]]:
    """Stage 3: replica r of the partition at index i = s + p is sequence[(i + r) % n]."""
    offsets = list(range(run.replication_factor))
    return _by_pass(sequence, run.count, run.start_index, lambda _pass: offsets)
