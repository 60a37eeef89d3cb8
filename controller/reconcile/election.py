"""Leader election: which replica leads a partition whose leader is gone, or none.

Purely computational, no I/O. Kafka's guarantee: only a replica holding every committed
record (its last reported LEO is at least the leader's last reported high watermark) may lead,
unless unclean election is allowed, which is then reported as such.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class Election:
    leader: int
    clean: bool  # False: the new leader may miss committed records (unclean election)


def elect(
    replicas: Sequence[int],
    leaving: int | None,
    eligible: Callable[[int], bool],
    leo: Mapping[int, int],
    leader_hw: int,
    unclean: bool = False,
) -> Election | None:
    """The new leader among ``replicas`` other than ``leaving``, or None.

    ``eligible``: online and allowed to lead (not draining). A candidate is in sync when
    ``leo[spu] >= leader_hw`` (unknown offsets count as -1, so a partition nobody has reported
    yet, whose HW is unknown too, has every replica in sync). Highest LEO wins, then the
    replica-list order (the preferred leader first).
    """
    candidates = [spu for spu in replicas if spu != leaving and eligible(spu)]
    in_sync = [spu for spu in candidates if leo.get(spu, UNKNOWN_OFFSET) >= leader_hw]
    if in_sync:
        return Election(_best(in_sync, replicas, leo), clean=True)
    if unclean and candidates:
        return Election(_best(candidates, replicas, leo), clean=False)
    return None


def _best(candidates: Collection[int], replicas: Sequence[int], leo: Mapping[int, int]) -> int:
    return max(candidates, key=lambda spu: (leo.get(spu, UNKNOWN_OFFSET), -replicas.index(spu)))
