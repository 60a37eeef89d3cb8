"""Leader election: which replica of a partition may lead it, chosen from its committed in-sync set.

Purely computational, no I/O. Every member of the committed in-sync set holds every committed
record by construction (the leader counts a record committed only once every member has it), so
a clean election needs no offsets: the first member, in replica-list order (the preferred leader
first), that passes the test it is given. An unclean election, opt-in, is a separate choice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence


def elect(replicas: Sequence[int], in_sync: Collection[int], eligible: Callable[[int], bool]) -> int | None:
    """The first replica in ``replicas`` order that is in ``in_sync`` and ``eligible``; None if none."""
    for spu in replicas:
        if spu in in_sync and eligible(spu):
            return spu
    return None


def elect_unclean(replicas: Sequence[int], eligible: Callable[[int], bool], leo: Callable[[int], int | None]) -> int | None:
    """Any ``eligible`` replica, the one holding the most records first (unknown counts as none),
    then in ``replicas`` order: it may miss committed records, so it should miss as few as can be."""
    candidates = [spu for spu in replicas if eligible(spu)]
    if not candidates:
        return None
    return max(candidates, key=lambda spu: (_known(leo(spu)), -replicas.index(spu)))


def _known(offset: int | None) -> int:
    return -1 if offset is None else offset
