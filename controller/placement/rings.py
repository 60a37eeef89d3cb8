"""Index arithmetic over an ordered SPU sequence, shared by the computed and kafka strategies.

Purely computational, no I/O: a block of consecutive partitions whose replicas sit at fixed
offsets from their leader is cut out of the sequence column by column.
"""

from __future__ import annotations

from collections.abc import Sequence


def ring(sequence: Sequence[int]) -> list[int]:
    """The sequence written out three times, so any `first + offset + count` window is one slice."""
    return list(sequence) * 3


def block(ring_: list[int], first: int, count: int, offsets: Sequence[int]) -> list[list[int]]:
    """Rows for `count` consecutive partitions: partition i's replica r is sequence[first + i + offsets[r]].

    Needs `0 <= first < n`, `0 <= offsets[r] < n` and `count <= n` for a ring of length 3n;
    callers cut their runs into blocks of at most n partitions.
    """
    columns = [ring_[first + offset : first + offset + count] for offset in offsets]
    return list(map(list, zip(*columns, strict=True)))
