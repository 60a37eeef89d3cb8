"""Topic controller decisions: Init -> Pending -> Provisioned, partitions, the start-index chain.

Purely computational, no I/O: one snapshot in, actions out. Placement runs here (the library
is pure too). Partitions are created exactly once (create-if-absent) and orphans are deleted,
so a crash anywhere converges to exactly the partitions of each topic's replica map. A topic too
large to store in one etcd request is InvalidConfig, never placed in a loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, field

from controller import placement
from controller.reconcile import actions, faults as faults_module, topic_size
from store import kv, local, models, spu_index

CHAIN_KEY = "meta/placement-start-index"
# The largest start index read back as it is: the next one (it, plus the partitions a pass
# places) still fits in topic_size.CHAIN_VALUE_MAX bytes; a larger one, or a negative one, restarts
# at 0 (placement refuses a negative index, and one too long for text cannot be written back).
MAX_START_INDEX = placement.MAX_START_INDEX
INIT = models.TopicResolution.INIT
PENDING = models.TopicResolution.PENDING
INSUFFICIENT = models.TopicResolution.INSUFFICIENT_RESOURCES
INVALID = models.TopicResolution.INVALID_CONFIG
PROVISIONED = models.TopicResolution.PROVISIONED

# Resolutions whose replica map lists partitions that exist (or must: one deleted by hand comes
# back where it was). A topic that cannot place new partitions keeps those it has.
HAS_PARTITIONS = (PROVISIONED, INSUFFICIENT, INVALID, PENDING)

# Writes one provision transaction may carry: the chain key plus topic statuses and partitions.
PROVISION_WRITES = kv.MAX_TXN_WRITES
# The store's request size when none is given: etcd's default limit, the default key prefix.
DEFAULT_REQUEST_SIZE = kv.RequestSize(kv.DEFAULT_PREFIX, kv.DEFAULT_MAX_REQUEST_BYTES)
# A topic's reason while the store refuses a write it needs (an etcd whose limits were lowered
# under the SC: docs/limitations.md), followed by the store's words. The write is retried with a
# backoff; once it goes through, the reason goes.
REFUSED_PROVISION = "the store refused to provision it (retried with a backoff): "
REFUSED_PARTITIONS = "the store refused to create "  # "partitions 0..39 (retried with a backoff): "


@dataclass(frozen=True, slots=True)
class Chain:
    start_index: int
    mod_revision: int  # 0: the key does not exist yet

    def encode(self, start_index: int) -> bytes:
        return json.dumps({"nextStartIndex": start_index}).encode()


def read_chain(snapshot: local.Snapshot) -> Chain:
    stored = snapshot.meta(CHAIN_KEY)
    if stored is None:
        return Chain(0, 0)
    value, mod_revision = stored
    try:
        start_index = int(json.loads(value)["nextStartIndex"])
    # OverflowError: 1e400 is infinity; RecursionError: nested deeper than the parser goes.
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        start_index = 0  # a hand-edited, unreadable chain restarts at 0 rather than stalling
    if not 0 <= start_index <= MAX_START_INDEX:
        start_index = 0  # written by hand, out of range (MAX_START_INDEX)
    return Chain(start_index, mod_revision)


def spu_infos(snapshot: local.Snapshot) -> tuple[placement.SpuInfo, ...]:
    """Every registered SPU, online or not (a decommissioned one counts as offline), in id order
    (placement picks only the online); of SPUs
    sharing an id (written behind the SC's back), only the one holding it (``spu_index.holders``).

    The same tuple until the SPUs change: placement recognises it and skips its SPU checks."""
    return snapshot.derived("spus", "placement-spus", lambda: _spu_infos(snapshot))


def _spu_infos(snapshot: local.Snapshot) -> tuple[placement.SpuInfo, ...]:
    infos = [
        placement.SpuInfo(
            id=entry.obj.spec.id,
            rack=entry.obj.spec.rack,
            # A decommissioned SPU takes no new replica: placement treats it as offline.
            online=entry.obj.status.resolution is models.SpuResolution.ONLINE and not entry.obj.spec.decommission,
        )
        for entry in spu_index.holders(snapshot.entries("spus"), snapshot.meta).values()
    ]
    return tuple(sorted(infos, key=lambda info: info.id))


def current_map(topic: models.Topic) -> list[list[int]]:
    """The rows of the topic's replica map below its partition count, in index order: the
    partitions it keeps, as placement takes them (a row lost from a map leaves a gap here, which
    ``_Rows`` fills in place)."""
    count = topic.spec.partition_count()
    return [list(row) for index, row in sorted(topic.status.replica_map.items()) if index < count]


def short_of_rows(topic: models.Topic) -> bool:
    """Whether the topic's replica map lacks a row below its partition count (a topic being
    grown, or a map with a gap written behind the SC's back).

    Cheap when nothing is missing: distinct indexes, as many as the count, the largest below it,
    are exactly 0..count-1 (``max`` runs in C over a map of 100,000 rows)."""
    replica_map, count = topic.status.replica_map, topic.spec.partition_count()
    if len(replica_map) < count:
        return True
    if max(replica_map) < count:
        return False
    return sum(1 for index in replica_map if index < count) < count


def placement_request(
    topic: models.Topic,
    spus: Sequence[placement.SpuInfo],
    start_index: int,
    existing: Iterable[tuple[str, int, list[int]]],
    current: Sequence[Sequence[int]] | None = None,
) -> placement.PlacementRequest:
    """``current``: the rows the topic keeps, in index order (``current_map`` when not given);
    placement places the others, as many as the partition count leaves."""
    spec = topic.spec
    if current is None:
        current = current_map(topic)
    if spec.replica_assignment is not None:
        return placement.PlacementRequest(
            spus=spus,
            strategy="manual",
            replica_assignment=[(row.id, list(row.replicas)) for row in spec.replica_assignment],
            registered_spu_ids=[spu.id for spu in spus],
            current_replica_map=current,
        )
    strategy = spec.placement.strategy if spec.placement is not None else "computed"
    if not _load_aware(topic):
        existing = ()  # only load-aware strategies read other topics' assignment (O(partitions))
    return placement.PlacementRequest(
        spus=spus,
        partitions=spec.partitions or 0,
        replication_factor=spec.replication_factor or 0,
        strategy=strategy,  # a plug-in's name stays a name: placement finds it among the configured placers
        start_index=start_index,
        ignore_rack_assignment=spec.ignore_rack_assignment,
        policies=spec.placement.policies if spec.placement is not None else None,
        existing=list(existing),
        current_replica_map=current,
    )


NO_PLACERS: placement.Placers = {}


def validate(
    topic: models.Topic, spus: Sequence[placement.SpuInfo], placers: placement.Placers = NO_PLACERS
) -> placement.InvalidConfig | None:
    """Configuration problems found before placing (None when valid): the replica assignment, the
    policies, and a strategy that is neither built in nor one of the configured ``placers``."""
    spec = topic.spec
    try:
        if spec.replica_assignment is not None:
            placement.validate_manual(
                [(row.id, list(row.replicas)) for row in spec.replica_assignment], [spu.id for spu in spus]
            )
        elif spec.placement is not None:
            placement.check_strategy(spec.placement.strategy, placers)
            if spec.placement.policies:
                placement.parse_policies(spec.placement.policies)
    except placement.InvalidConfig as error:
        return error
    return None


def unplaced_reason(error: placement.PlacementError) -> str:
    """The reason an unplaceable topic records: the problem, then what makes it placeable."""
    if not isinstance(error, placement.InvalidConfig):
        return error.message
    return f"{error.message}; {_REMEDIES[error.fix]}"


_REMEDIES = {
    placement.Fix.SPEC: "delete the topic and create it again with a valid spec",
    placement.Fix.CLUSTER: "the topic stays and is placed by itself once the SPUs allow it",
    placement.Fix.PLUGINS: (
        "the topic is placed once the SC runs with that plug-in configured and working, or delete it and "
        "create it again with another strategy"
    ),
}


def placed_note(topic: models.Topic, replica_map: Sequence[Sequence[int]], spus: Sequence[placement.SpuInfo]) -> str:
    """The reason a Provisioned topic records: its rack violations, if any ("" otherwise).

    Not when racks are ignored, nor when policies keep replicas together (node=colocated): the
    topic's own spec asked for them."""
    violations = placement.rack_violations(replica_map, spus)
    if not violations or topic.spec.ignore_rack_assignment:
        return ""
    policies = topic.spec.placement.policies if topic.spec.placement is not None else None
    if policies and placement.parse_policies(policies).node == "colocated":
        return ""
    online: dict[str, int] = {}
    for spu in spus:
        if spu.online and spu.rack is not None:
            online[spu.rack] = online.get(spu.rack, 0) + 1
    one = len(violations) == 1
    per_rack = ", ".join(f"{rack} {count}" for rack, count in sorted(online.items()))
    return (
        f"placed with rack violations: partition{'' if one else 's'} {placement.format_ids(violations)} "
        f"{'has' if one else 'have'} more than one replica in a rack although another rack has none of "
        f"{'its' if one else 'their'} replicas (online SPUs per rack: {per_rack}; racks of equal size avoid this)"
    )


def dry_run(
    snapshot: local.Snapshot, topic: models.Topic, placers: placement.Placers = NO_PLACERS
) -> placement.PlacementResult:
    """The placement ``topic`` would get now, without deciding anything (the API's dryRun)."""
    return placement.compute(dry_run_request(snapshot, topic, placers), placers)


def dry_run_request(
    snapshot: local.Snapshot, topic: models.Topic, placers: placement.Placers = NO_PLACERS
) -> placement.PlacementRequest:
    """What ``dry_run`` computes, taken from ``snapshot``: the caller may compute it later, elsewhere
    (the request holds no reference to the store)."""
    spus = spu_infos(snapshot)
    problem = validate(topic, spus, placers)
    if problem is not None:
        raise problem
    return placement_request(topic, spus, read_chain(snapshot).start_index, _assignment(snapshot))


def _load_aware(topic: models.Topic) -> bool:
    """Least-loaded, and plug-ins (which see the cluster's assignment), read every partition."""
    strategy = topic.spec.placement.strategy if topic.spec.placement is not None else "computed"
    return strategy == "least-loaded" or strategy not in placement.STRATEGIES


def _assignment(snapshot: local.Snapshot) -> list[tuple[str, int, list[int]]]:
    return [
        (entry.obj.topic, entry.obj.index, list(entry.obj.spec.replicas))
        for entry in snapshot.entries("partitions").values()
    ]


def _idle(key: str) -> bool:
    return False


def _not_refused(key: str) -> str:
    return ""


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the topic controller needs beyond the snapshot.

    ``changes`` None (or a full relist) looks at everything; otherwise partitions are checked
    only for the topics and partitions that changed. ``busy(key)``: a write to that key is in
    flight, or failed and waits out a backoff (deciding on it again now would be wasted work).
    ``retry_unplaced``: re-run topics that are InvalidConfig or InsufficientResources (their
    outcome only changes with the SPUs or their own spec, which ``changes`` shows).
    ``request_size``: the store's request limit, which sizes topics and provision transactions.
    ``alone(key)``: a write to that topic failed before: it is provisioned in a transaction of
    its own, so that if it fails again it takes no other topic down with it.
    ``refused(key)``: the store's refusal of the last write about that topic alone (its
    provisioning, or some of its partitions), "" if none since one went through: said in the
    topic's reason.
    ``placers``: the configured placement plug-ins.
    ``faults``: where a topic or partition whose decision raised goes (faults.py).
    """

    changes: local.ChangesByKind | None = None
    busy: Callable[[str], bool] = _idle
    retry_unplaced: bool = True
    request_size: kv.RequestSize = DEFAULT_REQUEST_SIZE
    alone: Callable[[str], bool] = _idle
    refused: Callable[[str], str] = _not_refused
    placers: placement.Placers = field(default_factory=dict)
    faults: faults_module.Faults = faults_module.RAISE


@dataclass(frozen=True, slots=True)
class _Scope:
    """What one pass looks at."""

    full: bool  # every topic and partition: no changes given, or a relist
    touched: frozenset[str]  # the topics that changed (a full pass looks at all of them anyway)
    retry: bool  # unplaced topics are due another try: a full pass, or retry_unplaced


def decide(snapshot: local.Snapshot, inputs: Inputs) -> list[actions.Action]:
    """The topic controller's actions, in three steps: validate new and invalid topics, place the
    pending ones (one provision transaction on the chain key), then create the partitions their
    replica maps name and delete the ones none does."""
    scope = _scope(inputs)
    spus = spu_infos(snapshot)
    decided = _validate(snapshot, inputs, scope, spus)
    placed = _place(snapshot, inputs, scope, spus)
    decided += placed.statuses
    provision = placed.action()
    if provision is not None:
        decided.append(provision)
    decided += _reconcile_partitions(snapshot, inputs, scope, placed.topics | placed.noted, spus)
    return decided


def _scope(inputs: Inputs) -> _Scope:
    changes = inputs.changes
    full = changes is None or any(change.full for change in changes.values())
    touched: frozenset[str] = frozenset()
    if changes is not None and "topics" in changes and not full:
        touched = frozenset({entry.name for entry in changes["topics"].updated} | set(changes["topics"].deleted))
    return _Scope(full, touched, full or inputs.retry_unplaced)


def _validate(
    snapshot: local.Snapshot, inputs: Inputs, scope: _Scope, spus: Sequence[placement.SpuInfo]
) -> list[actions.Action]:
    """Init and InvalidConfig topics: Pending when valid, else InvalidConfig with the reason.

    Only topics with something left to do, from indexes the local store keeps up to date: a pass
    costs what those topics cost, not what the whole table does. Validation depends on the
    topic's spec and the SPUs alone: without a retry, only the topics that changed (a topic whose
    write was set aside comes back as changed)."""
    topics: Mapping[str, local.Entry[models.Topic]] = snapshot.entries("topics")
    unvalidated: Iterable[local.Entry[models.Topic]]
    if scope.retry:
        unvalidated = snapshot.indexed("topics", "unvalidated", _unvalidated)
    else:
        unvalidated = sorted(
            (topics[name] for name in scope.touched if name in topics and _unvalidated(topics[name].obj)),
            key=lambda entry: entry.mod_revision,
        )
    decided: list[actions.Action] = []
    for entry in unvalidated:
        if not inputs.busy(entry.obj.key):
            try:
                decided += _validated(entry, spus, inputs.placers, inputs.request_size)
            except Exception as error:  # this topic only (faults.py)
                inputs.faults.record("topics", entry.name, error)
    return decided


class _Provision:
    """The provision transaction this pass fills: topic statuses on the chain key, within the
    store's limits on writes and bytes per request, and the SPU rows they place."""

    def __init__(self, chain: Chain, request_size: kv.RequestSize) -> None:
        self.chain = chain
        self.cursor = chain.start_index
        self.room = PROVISION_WRITES - 1  # the chain key takes one write
        # The bytes the topic statuses may take, after the chain key's write.
        self.room_bytes = request_size.budget - request_size.writes_bound(1, len(CHAIN_KEY), topic_size.CHAIN_VALUE_MAX)
        self.provisions: list[actions.TopicProvision] = []
        self.topics: set[str] = set()  # placed by this pass
        # Topics whose reason this pass sets to the store's refusal of their provisioning (placed
        # again at the next pass, from the status written).
        self.noted: set[str] = set()
        # Topic statuses refused on the way (unplaceable, too large), in topic order.
        self.statuses: list[actions.Action] = []

    def add(self, provision: actions.TopicProvision, cost: int, next_start_index: int) -> None:
        # Statuses only: up to 127 topics per transaction on the chain key. Their partitions are
        # created by the next pass (create-if-absent, batched 128 per transaction, several in
        # flight), so the chain key is held for one small write per cycle, not 11 topics' worth.
        self.room -= 1
        self.room_bytes -= cost
        self.provisions.append(provision)
        self.topics.add(provision.topic.name)
        self.cursor = next_start_index

    def action(self) -> actions.Action | None:
        if not self.provisions:
            return None
        return actions.provision(CHAIN_KEY, self.chain.encode(self.cursor), self.chain.mod_revision, self.provisions)


class _Assignment:
    """Every partition's replicas, read (O(partitions)) only once a load-aware strategy needs
    them; with what this pass placed before."""

    def __init__(self, snapshot: local.Snapshot) -> None:
        self._snapshot = snapshot
        self._rows: list[tuple[str, int, list[int]]] | None = None
        self._placed: list[tuple[str, int, list[int]]] = []

    def for_topic(self, topic: models.Topic) -> Sequence[tuple[str, int, list[int]]]:
        if self._rows is None and _load_aware(topic):
            self._rows = _assignment(self._snapshot) + self._placed
        return self._rows or ()

    def add(self, rows: Iterable[tuple[str, int, list[int]]]) -> None:
        (self._placed if self._rows is None else self._rows).extend(rows)


def _place(snapshot: local.Snapshot, inputs: Inputs, scope: _Scope, spus: Sequence[placement.SpuInfo]) -> _Provision:
    """Place the topics waiting for it, oldest first, into one provision transaction.

    Only while the chain is free (one provision in flight keeps it unforked)."""
    provision = _Provision(read_chain(snapshot), inputs.request_size)
    if inputs.busy(CHAIN_KEY):
        return provision
    assignment = _Assignment(snapshot)
    for entry in snapshot.indexed("topics", "unplaced", _unplaced):
        if provision.room < 1:
            break  # this transaction is full: the next pass, once it is written
        try:
            topic: models.Topic = entry.obj
            if not _due(topic, inputs, scope, provision):
                continue
            refusal = inputs.refused(topic.key)
            noted = _with_reason(entry, REFUSED_PROVISION + refusal) if refusal else []
            if noted:
                provision.statuses += noted
                provision.noted.add(topic.name)
                continue
            problem = too_large(topic, spus, inputs.request_size, widest=False)
            if problem is not None:
                provision.statuses += _status(entry, INVALID, problem)  # known without placing it
                continue
            rows = _Rows.of(entry, snapshot)
            try:
                request = placement_request(topic, spus, provision.cursor, assignment.for_topic(topic), rows.current())
                result = placement.compute(request, inputs.placers)
            except placement.PlacementError as error:
                target = INSUFFICIENT if isinstance(error, placement.InsufficientResources) else INVALID
                provision.statuses += _status(entry, target, unplaced_reason(error))
                continue
            placed = rows.placed(result)
            provisioned, value = _provisioned(topic, rows.filled(placed), spus)
            problem = _too_large_placed(topic, len(value), spus, inputs.request_size)
            if problem is not None:
                provision.statuses += _status(entry, INVALID, problem)
                continue
            cost = inputs.request_size.writes_bound(1, len(topic.key), len(value))
            if cost > provision.room_bytes:
                break  # this transaction is full: the next pass, once it is written
            reason = rows.reason(placed)
            provision.add(actions.TopicProvision(provisioned, entry.mod_revision, (), reason, value), cost, result.next_start_index)
            assignment.add([(topic.name, index, replicas) for index, replicas in placed.items()])
            if inputs.alone(topic.key):
                break
        except Exception as error:  # this topic only (faults.py): nothing of it was added
            inputs.faults.record("topics", entry.name, error)
    return provision


def _due(topic: models.Topic, inputs: Inputs, scope: _Scope, provision: _Provision) -> bool:
    """Whether an unplaced topic is to be placed in this pass."""
    if inputs.busy(topic.key):
        return False
    resolution = topic.status.resolution
    if resolution is INSUFFICIENT and not (scope.retry or topic.name in scope.touched):
        return False  # only SPU changes or its own spec can change the outcome
    if resolution is PROVISIONED and not short_of_rows(topic):
        return False
    if inputs.alone(topic.key) and provision.provisions:
        return False  # in a transaction of its own, at the next pass
    return True


@dataclass(frozen=True, slots=True)
class _Rows:
    """What placing a topic keeps and fills of its replica map.

    A partition, once it exists, moves only by the user's hand, so every row of the stored map
    is kept as it is, whatever else is wrong with the map. Of the indexes below the partition
    count that have no row (new partitions, or a row lost behind the SC's back), one whose
    partition exists, created after the topic, gets its row back from that partition (one older
    than the topic is an earlier topic's of the same name, and goes); the others are placed.
    Rows at or past the count stay in the map but are no partitions (never created).
    """

    topic: models.Topic
    kept: dict[int, list[int]]  # the stored map's rows below the count
    rebuilt: dict[int, list[int]]  # missing rows, from the partitions that exist
    missing: list[int]  # the indexes left to place, in order
    past: list[int]  # the stored map's rows at or past the count

    @classmethod
    def of(cls, entry: local.Entry[models.Topic], snapshot: local.Snapshot) -> _Rows:
        topic = entry.obj
        count = topic.spec.partition_count()
        replica_map = topic.status.replica_map
        indexes = sorted(replica_map)  # ascending already, as written: linear
        # The rows themselves are shared, not copied: nothing here changes them (placement takes
        # tuples of them, and the status written validates its own copy).
        kept = {index: replica_map[index] for index in indexes if index < count}
        past = [index for index in indexes if index >= count]
        if not kept:
            missing = list(range(count))  # a new topic: every row
        else:
            missing = [index for index in range(count) if index not in kept] if len(kept) < count else []
        rebuilt: dict[int, list[int]] = {}
        names = snapshot.partitions_of(topic.name) if missing else frozenset()
        if names:  # a new topic has none: nothing to look up
            partitions: Mapping[str, local.Entry[models.Partition]] = snapshot.entries("partitions")
            for index in missing:
                name = models.partition_name(topic.name, index)
                found = partitions.get(name) if name in names else None
                if found is not None and found.create_revision > entry.create_revision:
                    rebuilt[index] = mapped_replicas(found.obj)
            missing = [index for index in missing if index not in rebuilt]
        return cls(topic, kept, rebuilt, missing, past)

    def current(self) -> list[list[int]]:
        """The rows placement keeps, in index order (it places as many more as are missing)."""
        if not self.rebuilt:
            return list(self.kept.values())
        rows = {**self.kept, **self.rebuilt}
        return [rows[index] for index in sorted(rows)]

    def placed(self, result: placement.PlacementResult) -> dict[int, list[int]]:
        """The rows placed for the missing indexes: a manual assignment gives each index its own
        row; a strategy places its run after the rows kept, given to the missing indexes in order."""
        if self.topic.spec.is_manual:
            return {index: list(result.replica_map[index]) for index in self.missing}
        new_rows = result.replica_map[len(self.kept) + len(self.rebuilt) :]
        return {index: list(row) for index, row in zip(self.missing, new_rows, strict=True)}

    def filled(self, placed: Mapping[int, list[int]]) -> dict[int, list[int]]:
        """The stored map (every row of it), with the missing rows rebuilt or placed."""
        replica_map = {**self.topic.status.replica_map, **self.rebuilt, **placed}
        return {index: replica_map[index] for index in sorted(replica_map)}

    def reason(self, placed: Mapping[int, list[int]]) -> str:
        """What placing the topic did (the provision's log line)."""
        said = []
        if placed and not self.kept and not self.rebuilt:
            said.append(f"placed {len(placed)} partitions x {len(next(iter(placed.values())))} replicas")
        elif placed:
            spread = len({spu for row in placed.values() for spu in row})
            said.append(f"placed {_describe(list(placed), limit=10)} on {spread} SPUs")
        if self.rebuilt:
            one = len(self.rebuilt) == 1
            said.append(
                f"replica map {'row' if one else 'rows'} {placement.format_ids(list(self.rebuilt))} rebuilt from the "
                f"{'partition that exists' if one else 'partitions that exist'}"
            )
        if self.past:
            one = len(self.past) == 1
            said.append(
                f"replica map {'row' if one else 'rows'} {placement.format_ids(self.past)} {'is' if one else 'are'} "
                f"past the topic's {self.topic.spec.partition_count()} partitions: not created"
            )
        return "; ".join(said)


def mapped_replicas(partition: models.Partition) -> list[int]:
    """The replicas a topic's map names for ``partition``: where a partition being moved goes (the
    rebalance controller writes the map's row in the same transaction as the reassignment)."""
    moving = partition.spec.reassignment
    return list(partition.spec.replicas if moving is None else moving.target)


def _provisioned(
    topic: models.Topic, replica_map: dict[int, list[int]], spus: Sequence[placement.SpuInfo]
) -> tuple[models.Topic, bytes]:
    """The topic Provisioned with ``replica_map``, and its encoding (what will be written)."""
    note = placed_note(topic, [replica_map[index] for index in range(topic.spec.partition_count())], spus)
    provisioned = topic.model_copy(
        update={"status": models.TopicStatus(resolution=PROVISIONED, replica_map=replica_map, reason=note)}
    )
    return provisioned, models.encode(provisioned)


def _reconcile_partitions(
    snapshot: local.Snapshot, inputs: Inputs, scope: _Scope, placed_now: set[str], spus: Sequence[placement.SpuInfo]
) -> list[actions.Action]:
    """Every partition on a full pass; else those that changed and those of the topics that did."""
    topics: Mapping[str, local.Entry[models.Topic]] = snapshot.entries("topics")
    if scope.full:
        every = snapshot.entries("partitions").keys()
        return _partition_actions(snapshot, topics, every, topics.keys(), placed_now, inputs, spus)
    partition_changes = inputs.changes.get("partitions") if inputs.changes is not None else None
    changed_partitions = [entry.name for entry in partition_changes.updated] if partition_changes is not None else []
    # A partition deleted behind the SC's back: its topic is checked for missing partitions.
    gone = {name.rpartition("-")[0] for name in partition_changes.deleted} if partition_changes is not None else set()
    # A topic whose reason says the store refused its partitions: checked until they are all there.
    refused = {entry.name for entry in snapshot.indexed("topics", "partitions-refused", _partitions_refused)}
    return _partition_actions(snapshot, topics, changed_partitions, scope.touched | gone | refused, placed_now, inputs, spus)


def _partitions_refused(topic: models.Topic) -> bool:
    """Its reason says the store refuses its partitions (said until they are all there)."""
    return topic.status.reason.startswith(REFUSED_PARTITIONS)


def _unvalidated(topic: models.Topic) -> bool:
    """Init, or InvalidConfig (valid again after a spec change, or SPU changes, may fix it)."""
    return topic.status.resolution in (INIT, INVALID)


def _unplaced(topic: models.Topic) -> bool:
    """Pending, InsufficientResources, or Provisioned with a row missing below its partition count
    (partitions added, or a row lost behind the SC's back: manual topics too)."""
    status = topic.status
    if status.resolution is PROVISIONED:
        return short_of_rows(topic)
    return status.resolution in (PENDING, INSUFFICIENT)


def _validated(
    entry: local.Entry[models.Topic], spus: Sequence[placement.SpuInfo], placers: placement.Placers, request_size: kv.RequestSize
) -> list[actions.Action]:
    topic: models.Topic = entry.obj
    problem = validate(topic, spus, placers)
    if problem is not None:
        return _status(entry, INVALID, unplaced_reason(problem))
    too_big = too_large(topic, spus, request_size, widest=False)
    if too_big is not None:
        return _status(entry, INVALID, too_big)
    if topic.status.resolution is INVALID:
        # The configuration is valid now; if placement still rejects it the same way (for
        # example partial racks), stay put instead of flapping through Pending.
        try:
            result = placement.compute(placement_request(topic, spus, 0, []), placers)
        except placement.InvalidConfig as error:
            if unplaced_reason(error) == topic.status.reason:
                return []
        except placement.PlacementError:
            pass
        else:
            # Placed, but on SPU ids too wide to store it: stay InvalidConfig (with that reason).
            size = topic_size.stored_bytes(topic, dict(enumerate(result.replica_map)))
            too_wide = _too_large_placed(topic, size, spus, request_size)
            if too_wide is not None:
                return _status(entry, INVALID, too_wide)
    return _status(entry, PENDING, "configuration is valid")


def too_large(
    topic: models.Topic, spus: Sequence[placement.SpuInfo], request_size: kv.RequestSize, widest: bool = True
) -> str | None:
    """Why ``topic`` cannot be stored in one request of the store (None if it fits). Cheap: no
    placement, its size is counted with its manual assignment, or with every SPU id as wide as
    the widest registered one (``widest``: what a create or an add-partitions may be sure of) or
    the narrowest (what the controller refuses before placing; it sizes what it placed exactly).
    """
    max_bytes = topic_size.max_topic_bytes(request_size, topic.name, CHAIN_KEY)
    spec = topic.spec
    # Existing rows may name SPUs no longer registered: they count among the ids it may get.
    ids = [spu.id for spu in spus] + [spu for row in topic.status.replica_map.values() for spu in row]
    if spec.replica_assignment is not None:
        size = topic_size.stored_bytes(topic, {row.id: row.replicas for row in spec.replica_assignment})
        bound = ""
    else:
        digits = topic_size.id_digits(ids, widest)
        size = topic_size.provisioned_bytes(topic, spec.partitions or 0, spec.replication_factor or 0, digits)
        bound = "up to " if widest else "at least "
    if size <= max_bytes:
        return None
    return topic_size.too_large(topic, size, bound, max_bytes, request_size.max_request_bytes, topic_size.id_digits(ids, widest=True))


def _too_large_placed(
    topic: models.Topic, size: int, spus: Sequence[placement.SpuInfo], request_size: kv.RequestSize
) -> str | None:
    """Why ``topic``, placed and ``size`` bytes stored, cannot be written (None if it can)."""
    max_bytes = topic_size.max_topic_bytes(request_size, topic.name, CHAIN_KEY)
    if size <= max_bytes:
        return None
    digits = topic_size.id_digits([spu.id for spu in spus], widest=True)
    return topic_size.too_large(topic, size, "", max_bytes, request_size.max_request_bytes, digits)


def _status(entry: local.Entry[models.Topic], resolution: models.TopicResolution, reason: str) -> list[actions.Action]:
    """The topic's status with a new resolution and reason.

    The replica map is always kept: it is the record of the partitions that exist, and only the
    user (deleting the topic) takes them away; a topic that cannot grow, or whose spec went bad,
    keeps every partition it has where it is.
    """
    topic: models.Topic = entry.obj
    reason = topic_size.bounded_reason(reason)  # room for it is kept in every topic's size
    status = models.TopicStatus(
        resolution=resolution,
        replica_map=topic.status.replica_map,
        reason="" if resolution is PENDING else reason,
    )
    if topic.status == status:
        return []
    return [actions.update_status(topic, status, entry.mod_revision, f"{resolution.value}: {reason}")]


def _partition_actions(
    snapshot: local.Snapshot,
    topics: Mapping[str, local.Entry[models.Topic]],
    partition_names: Iterable[str],
    topic_names: Iterable[str],
    placed_now: set[str],
    inputs: Inputs,
    spus: Sequence[placement.SpuInfo],
) -> list[actions.Action]:
    """Create the missing partitions of every replica map; delete partitions no topic maps; say
    in a Provisioned topic's reason that the store refuses its partitions, until they are there.

    Looks at ``partition_names`` and at every partition of ``topic_names`` (all of them on a full
    pass). Sound because the snapshot is a consistent cut: a topic status and the partitions
    written in the same transaction are always seen together.
    """
    busy, faults = inputs.busy, inputs.faults
    partitions: Mapping[str, local.Entry[models.Partition]] = snapshot.entries("partitions")
    # In the store, but in values this SC cannot read: neither deleted nor missing.
    unreadable_topics, unreadable_partitions = snapshot.unreadable("topics"), snapshot.unreadable("partitions")
    decided: list[actions.Action] = []
    topic_names = list(topic_names)
    candidates = set(partition_names)
    for topic_name in topic_names:
        candidates |= snapshot.partitions_of(topic_name)
    for name in sorted(candidates):
        entry = partitions.get(name)
        if entry is None:
            continue
        # No busy check here: an orphan's deletion decided while another write to it is in
        # flight is set aside by the loop and decided again once that write is done.
        if entry.obj.topic in placed_now:
            continue  # its topic's new replica map is being written: judge it after the echo
        try:
            decided += _orphan(entry, topics, unreadable_topics)
        except Exception as error:  # this partition only (faults.py)
            faults.record("partitions", name, error)
    for topic_name in topic_names:
        topic_entry = topics.get(topic_name)
        if topic_entry is None or topic_name in placed_now:
            continue
        topic: models.Topic = topic_entry.obj
        if topic.status.resolution not in HAS_PARTITIONS:
            continue
        try:
            count = topic.spec.partition_count()  # a stored map may name more (not created)
            missing = [
                models.new_partition(topic, index, replicas)
                for index, replicas in sorted(topic.status.replica_map.items())
                if index < count
                and (name := models.partition_name(topic.name, index)) not in partitions
                and name not in unreadable_partitions
                and not busy(models.object_key("partitions", name))
            ]
            if topic.status.resolution is PROVISIONED:
                decided += _partitions_reason(topic_entry, partitions, unreadable_partitions, inputs.refused(topic.key), spus)
        except Exception as error:  # this topic only (faults.py)
            faults.record("topics", topic_name, error)
            continue
        for start in range(0, len(missing), kv.MAX_TXN_WRITES):
            chunk = missing[start : start + kv.MAX_TXN_WRITES]
            decided.append(
                actions.create_partitions(topic.name, chunk, f"{_describe_indexes(chunk)} of topic {topic.name}")
            )
    return decided


def _partitions_reason(
    entry: local.Entry[models.Topic],
    partitions: Mapping[str, local.Entry[models.Partition]],
    unreadable: AbstractSet[str],
    refusal: str,
    spus: Sequence[placement.SpuInfo],
) -> list[actions.Action]:
    """A Provisioned topic's reason while the store refuses to create its partitions (``refusal``:
    its last words about them), naming those not there; back to what placing it said once they
    all are. Only a topic with such a reason, or a refusal, costs a look at each of its partitions."""
    topic = entry.obj
    refused_before = _partitions_refused(topic)
    if not refusal and not refused_before:
        return []
    count = topic.spec.partition_count()
    absent = [
        index
        for index in sorted(topic.status.replica_map)
        if index < count
        and (name := models.partition_name(topic.name, index)) not in partitions
        and name not in unreadable
    ]
    if absent and refusal:
        return _with_reason(entry, f"{REFUSED_PARTITIONS}{_describe(absent, limit=10)} (retried with a backoff): {refusal}")
    if absent or not refused_before:
        return []  # still refused (said already), or refused no more and all there
    return _with_reason(entry, placed_note(topic, current_map(topic), spus), "the store took its partitions")


def _with_reason(entry: local.Entry[models.Topic], reason: str, said: str = "") -> list[actions.Action]:
    """The topic's status as it stands, with ``reason`` (none if it has that reason already);
    ``said``: the action's reason, if not the topic's."""
    topic: models.Topic = entry.obj
    reason = topic_size.bounded_reason(reason)  # room for it is kept in every topic's size
    if topic.status.reason == reason:
        return []
    status = models.TopicStatus(resolution=topic.status.resolution, replica_map=topic.status.replica_map, reason=reason)
    return [actions.update_status(topic, status, entry.mod_revision, f"{status.resolution.value}: {said or reason}")]


def _describe_indexes(partitions: list[models.Partition]) -> str:
    """``partition 3``, ``partitions 0..9`` or ``partitions 0..4, 6, 8..9``."""
    return _describe([partition.index for partition in partitions])


def _describe(indexes: list[int], limit: int | None = None) -> str:
    """``partition 3``, ``partitions 0..9`` or ``partitions 0..4, 6, 8..9`` (ascending indexes);
    past ``limit`` runs, ``partitions 0..4, 6, ... and 7 more``."""
    runs: list[list[int]] = []
    for index in indexes:
        if runs and index == runs[-1][-1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    shown = runs if limit is None else runs[:limit]
    text = ", ".join(f"{first}..{last}" if last > first else str(first) for first, last in shown)
    if len(shown) < len(runs):
        text += f", ... and {len(runs) - len(shown)} more"
    return f"{'partition' if len(indexes) == 1 else 'partitions'} {text}"


def _orphan(
    entry: local.Entry[models.Partition], topics: Mapping[str, local.Entry[models.Topic]], unreadable_topics: AbstractSet[str]
) -> list[actions.Action]:
    partition: models.Partition = entry.obj
    topic_entry = topics.get(partition.topic)
    if topic_entry is None:
        if partition.topic in unreadable_topics:
            return []  # its topic is there, in a value this SC cannot read: not deleted
        return [actions.delete("partitions", partition.name, entry.mod_revision, f"topic {partition.topic} was deleted")]
    topic: models.Topic = topic_entry.obj
    wanted = topic.status.replica_map.get(partition.index)
    placed = mapped_replicas(partition)
    if wanted is None:
        if partition.index < topic.spec.partition_count() and entry.create_revision > topic_entry.create_revision:
            return []  # its row was lost behind the SC's back: placing the topic rebuilds it from this partition
        reason = f"topic {partition.topic} has no partition {partition.index} in its replica map"
    elif list(wanted) != placed:
        reason = f"replicas {placed} differ from the topic's replica map {wanted}"
    else:
        return []
    return [actions.delete("partitions", partition.name, entry.mod_revision, reason)]
