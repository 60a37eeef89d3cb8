"""The placement vocabulary: requests, results and typed errors shared by every strategy.

Purely computational: plain frozen dataclasses and exceptions, no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import NamedTuple

STRATEGIES = ("computed", "kafka", "least-loaded", "multi-level", "policies", "manual")
# The longest SPU list whose checks and rack sequence placement remembers (for the last few lists:
# a controller pass places every topic on one cluster). A longer one is worked out each time: a
# list sent with a placement request (POST /v1/placement, a read) may hold a million SPUs, which
# remembered for the life of the process held gigabytes.
CACHED_SPUS_LIMIT = 10_000
# The largest start index a request may give: the largest the cluster's chain key keeps (a signed
# 64-bit integer, as Fluvio's and Kafka's own counters).
MAX_START_INDEX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class SpuInfo:
    """One SPU as placement sees it: only online SPUs receive new replicas."""

    id: int
    rack: str | None = None
    online: bool = True

    def __hash__(self) -> int:
        # Computed once: placement caches its SPU checks on tuples of SpuInfo, hashed for every
        # topic placed (100 SPUs x 1,000 topics), and the generated hash is Python code per call.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.id, self.rack, self.online))
            object.__setattr__(self, "_hash", cached)
        return cached


class ExistingPartition(NamedTuple):
    """A partition of another topic, already placed (a plain 3-tuple works too)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]


class ManualPartition(NamedTuple):
    """One entry of a replica assignment file: `{"id": 0, "replicas": [0, 1, 2]}`.

    Values are kept as given (they may come from a user's JSON file); `manual` validates them.
    """

    id: object
    replicas: object


@dataclasses.dataclass(frozen=True)
class PlacementRequest:
    """Everything a placement depends on; the same request always gives the same result.

    `partitions` is the total partition count wanted. Partitions listed in
    `current_replica_map` already exist and are kept unchanged; only the partitions from
    `len(current_replica_map)` on are placed, as one run that starts at `start_index`.
    For `manual`, `partitions` and `replication_factor` may be 0 (taken from the assignment).
    """

    spus: Sequence[SpuInfo]
    partitions: int = 0
    replication_factor: int = 0
    strategy: str = "computed"
    start_index: int = 0
    ignore_rack_assignment: bool = False
    policies: str | None = None
    existing: Sequence[ExistingPartition | tuple[str, int, Sequence[int]]] = ()
    current_replica_map: Sequence[Sequence[int]] = ()
    replica_assignment: Sequence[ManualPartition | tuple[object, object]] | None = None
    registered_spu_ids: Sequence[int] | None = None
    plugin: str | None = None

    def __post_init__(self) -> None:
        # Freeze the sequences so a request can be shared and compared safely.
        object.__setattr__(self, "spus", tuple(self.spus))
        object.__setattr__(self, "existing", tuple(self.existing))
        object.__setattr__(self, "current_replica_map", tuple(tuple(row) for row in self.current_replica_map))
        if self.replica_assignment is not None:
            object.__setattr__(self, "replica_assignment", tuple(self.replica_assignment))
        if self.registered_spu_ids is not None:
            object.__setattr__(self, "registered_spu_ids", tuple(self.registered_spu_ids))


@dataclasses.dataclass(frozen=True)
class PlacementResult:
    """The replica map (index = partition, preferred leader first) and where the next run starts."""

    replica_map: list[list[int]]
    next_start_index: int


@dataclasses.dataclass(frozen=True)
class Run:
    """What one strategy must place, once the engine has checked the request.

    `spus` are the eligible (online) SPUs in id order; the strategy returns `count` replica
    lists, for partitions `first_partition` .. `first_partition + count - 1`.
    """

    spus: tuple[SpuInfo, ...]
    count: int
    first_partition: int
    replication_factor: int
    start_index: int
    request: PlacementRequest

    @property
    def ids(self) -> list[int]:
        return [spu.id for spu in self.spus]


class PlacementError(Exception):
    """A placement that cannot be made; `code` is the topic resolution it leads to."""

    code = "PlacementError"

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InsufficientResources(PlacementError):
    """Not enough eligible SPUs (or locations) for what was asked.

    `needed_spus` is how many more online SPUs would make it work, when that is the problem.
    """

    code = "InsufficientResources"

    def __init__(self, message: str, *, needed_spus: int | None = None) -> None:
        super().__init__(message)
        self.needed_spus = needed_spus


class Fix(enum.Enum):
    """What can make an InvalidConfig placeable; a topic controller tells its user which."""

    SPEC = "spec"  # only another spec: the topic must be deleted and created again
    CLUSTER = "cluster"  # the SPUs (a rack given, an SPU registered): the same topic is placed then
    PLUGINS = "plugins"  # the SC's configured placement plug-ins (the operator's)


class InvalidConfig(PlacementError):
    """Bad parameters: partial racks, malformed policies or replica assignment, unknown strategy.

    `problems` lists every individual problem found (the message joins them); `fix` says what
    can make the placement possible.
    """

    code = "InvalidConfig"

    def __init__(self, message: str, *, problems: Sequence[str] = (), fix: Fix = Fix.SPEC) -> None:
        super().__init__(message)
        self.problems = tuple(problems) if problems else (message,)
        self.fix = fix


def format_ids(ids: Sequence[int], limit: int = 10) -> str:
    """`0, 1, 2` (or `0, 1, ... and 40 more`) for error messages that name SPUs."""
    shown = ", ".join(str(spu_id) for spu_id in ids[:limit])
    if len(ids) > limit:
        shown += f", ... and {len(ids) - limit} more"
    return shown
