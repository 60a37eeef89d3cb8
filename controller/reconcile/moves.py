"""Rebalance runs: the plan stored under ``meta/rebalance``, its moves started with at most N in
flight per SPU, cancelled, and its progress, all from the stored state (a restarted or new SC
continues where the last one was).

Purely computational, no I/O: the stored run's codec (defensive: any value may be there), the
planner's request built from a snapshot, and (snapshot, run) -> actions. Each move is carried out
by the partition controller (``partition_state``); this module only writes each partition's
``spec.reassignment`` (start, cancel) and the run's state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from controller.placement import model as placement_model
from controller.placement import rebalance
from controller.reconcile import actions
from controller.reconcile import faults as faults_module
from store import local, models

KEY = "meta/rebalance"
RUNNING, DONE, CANCELLED = "running", "done", "cancelled"
STATES = (RUNNING, DONE, CANCELLED)
REBALANCE, DECOMMISSION = "rebalance", "decommission"
# Each move's progress, from its partition as stored.
PENDING = "pending"  # not started: the partition holds the replicas the plan started from
MOVING = "moving"  # its reassignment is in the partition
DONE_MOVE = "done"  # the partition holds the planned replicas, no reassignment left
REVERTING = "reverting"  # cancelled while moving: going back to the replicas it had
SKIPPED = "skipped"  # the partition was deleted or changed otherwise: nothing for this run to do
# Causes of the actions (the history's structured field; the audits count them per SPU).
CAUSE_PLANNED = "move-planned"  # recorded by the API when it stores the run
CAUSE_STARTED = "move-started"
CAUSE_CANCELLED = "move-cancelled"
CAUSE_RUN = "rebalance-run"
# The largest run stored: a plan is one etcd value (etcd's default request limit is 1.5 MiB).
MAX_MOVES = 10_000
MAX_MOVES_PER_SPU = 10_000


class InvalidRun(ValueError):
    """A stored value under meta/rebalance that this SC cannot use; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class PlannedMove:
    partition: str
    before: tuple[int, ...]
    after: tuple[int, ...]

    @property
    def spus(self) -> frozenset[int]:
        """The SPUs whose load the move changes: the one that leave and the ones that arrive."""
        return frozenset(self.before).symmetric_difference(self.after)


@dataclass(frozen=True, slots=True)
class Run:
    """A stored plan and how far it is: ``running`` (moves are started), ``done`` (every move ended),
    ``cancelled`` (unfinished moves go back)."""

    kind: str
    state: str
    max_moves_per_spu: int
    moves: tuple[PlannedMove, ...]
    decommissioning: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind,
                "state": self.state,
                "maxMovesPerSpu": self.max_moves_per_spu,
                "decommissioning": list(self.decommissioning),
                "moves": [
                    {"partition": move.partition, "from": list(move.before), "to": list(move.after)} for move in self.moves
                ],
            },
            separators=(",", ":"),
        ).encode()

    def with_state(self, state: str) -> Run:
        return Run(self.kind, state, self.max_moves_per_spu, self.moves, self.decommissioning)


def decode(value: bytes) -> Run:
    """The run stored in ``value``; InvalidRun naming the offending field and value otherwise."""
    try:
        raw = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise InvalidRun(f"{KEY} is not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise InvalidRun(f"{KEY} must be a JSON object, got {_shown(raw)}")
    kind = raw.get("kind")
    if kind not in (REBALANCE, DECOMMISSION):
        raise InvalidRun(f"{KEY} kind {_shown(kind)} is not {REBALANCE!r} or {DECOMMISSION!r}")
    state = raw.get("state")
    if state not in STATES:
        raise InvalidRun(f"{KEY} state {_shown(state)} is not one of {', '.join(STATES)}")
    limit = raw.get("maxMovesPerSpu")
    if not _is_int(limit) or not 1 <= limit <= MAX_MOVES_PER_SPU:
        raise InvalidRun(f"{KEY} maxMovesPerSpu {_shown(limit)} is not an integer from 1 to {MAX_MOVES_PER_SPU}")
    decommissioning = _ids("decommissioning", raw.get("decommissioning", []))
    moves_raw = raw.get("moves")
    if not isinstance(moves_raw, list) or len(moves_raw) > MAX_MOVES:
        raise InvalidRun(f"{KEY} moves must be a list of at most {MAX_MOVES} moves, got {_shown(moves_raw)}")
    moves = []
    seen: set[str] = set()
    for index, item in enumerate(moves_raw):
        if not isinstance(item, dict) or set(item) != {"partition", "from", "to"}:
            raise InvalidRun(f"{KEY} moves[{index}] must be {{\"partition\", \"from\", \"to\"}}, got {_shown(item)}")
        name = item["partition"]
        if not isinstance(name, str) or not _partition_name(name) or name in seen:
            raise InvalidRun(f"{KEY} moves[{index}].partition {_shown(name)} is not a partition name listed once")
        seen.add(name)
        before, after = _ids(f"moves[{index}].from", item["from"]), _ids(f"moves[{index}].to", item["to"])
        if not before or not after:
            raise InvalidRun(f"{KEY} moves[{index}] must list at least one SPU in from and in to")
        moves.append(PlannedMove(name, before, after))
    return Run(kind, state, limit, tuple(moves), decommissioning)


def _partition_name(name: str) -> bool:
    """A name one of this SC's partitions may have. Such names are ASCII, so the run is never
    written back (marked done, cancelled) larger than it was read: a run of 600 KB of other
    characters grew to 1.8 MB once escaped, too large to write, and stayed running for good."""
    try:
        models.validate_name(models.split_partition_name(name)[0])
    except ValueError:
        return False
    return True


def _ids(field: str, value: object) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not all(_is_int(item) and 0 <= item <= models.MAX_SPU_ID for item in value)
        or len(set(value)) != len(value)
    ):
        raise InvalidRun(f"{KEY} {field} must list distinct SPU ids from 0 to {models.MAX_SPU_ID}, got {_shown(value)}")
    return tuple(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


@dataclass(frozen=True, slots=True)
class Stored:
    """What is under meta/rebalance: a run (``run``), nothing (both None), or a value that is not a
    run (``problem`` says why; it is never acted on, and a new plan may replace it)."""

    run: Run | None
    mod_revision: int
    problem: str | None = None


def stored(snapshot: local.Snapshot, known: Stored | None = None) -> Stored:
    """The run under meta/rebalance; ``known`` (decoded before) is kept while the value is the same
    (a run of 10,000 moves is not decoded again for each partition change)."""
    found = snapshot.meta(KEY)
    if found is None:
        return Stored(None, 0)
    value, mod_revision = found
    if known is not None and known.mod_revision == mod_revision:
        return known
    try:
        return Stored(decode(value), mod_revision)
    except InvalidRun as error:
        return Stored(None, mod_revision, str(error))


# ---------------------------------------------------------------------------- progress


def status_of(move: PlannedMove, entry: local.Entry[models.Partition] | None) -> str:
    """How far ``move`` is, from its partition as stored."""
    if entry is None:
        return SKIPPED
    spec = entry.obj.spec
    replicas = tuple(spec.replicas)
    moving = spec.reassignment
    if moving is None:
        if replicas == move.after:
            return DONE_MOVE
        return PENDING if replicas == move.before else SKIPPED
    if tuple(moving.previous) != move.before:
        return SKIPPED
    if tuple(moving.target) == move.after:
        return MOVING
    return REVERTING if moving.cancelled else SKIPPED


@dataclass(frozen=True, slots=True)
class Progress:
    state: str  # idle, or the run's state
    total: int
    done: int
    in_flight: tuple[str, ...]
    pending: int
    skipped: tuple[str, ...]
    kind: str | None = None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "state": self.state,
            "total": self.total,
            "done": self.done,
            "inFlight": list(self.in_flight),
            "pending": self.pending,
            "skipped": list(self.skipped),
        }
        if self.kind is not None:
            shown["kind"] = self.kind
        if self.problem is not None:
            shown["problem"] = self.problem
        return shown


def progress(snapshot: local.Snapshot, found: Stored | None = None) -> Progress:
    """GET /v1/cluster/rebalance: the run's state and its moves by progress (idle without a run);
    ``found``: the snapshot's run, if the caller has it decoded already."""
    found = stored(snapshot) if found is None else found
    run = found.run
    if run is None:
        return Progress("idle", 0, 0, (), 0, (), problem=found.problem)
    statuses = _statuses(snapshot, run)
    in_flight = tuple(move.partition for move, status in statuses if status in (MOVING, REVERTING))
    return Progress(
        run.state,
        len(run.moves),
        sum(status == DONE_MOVE for _, status in statuses),
        in_flight,
        sum(status == PENDING for _, status in statuses),
        tuple(move.partition for move, status in statuses if status == SKIPPED),
        run.kind,
    )


def _statuses(snapshot: local.Snapshot, run: Run, faults: faults_module.Faults = faults_module.RAISE) -> list[tuple[PlannedMove, str]]:
    """Each move's progress; a move whose progress raises is left out (when ``faults`` isolates)."""
    partitions = snapshot.entries("partitions")
    statuses = []
    for move in run.moves:
        try:
            statuses.append((move, status_of(move, partitions.get(move.partition))))
        except Exception as error:
            faults.record("partitions", move.partition, error)
    return statuses


def moving_partitions(snapshot: local.Snapshot) -> list[str]:
    """Partitions with a move in progress (a new plan waits until there is none)."""
    return sorted(entry.name for entry in snapshot.entries("partitions").values() if entry.obj.spec.reassignment is not None)


# ---------------------------------------------------------------------------- planning


def decommissioning_spus(snapshot: local.Snapshot) -> tuple[int, ...]:
    """The ids of the SPUs an operator decommissioned (spec.decommission)."""
    return tuple(sorted(entry.obj.spec.id for entry in snapshot.entries("spus").values() if entry.obj.spec.decommission))


def plan_request(
    snapshot: local.Snapshot, online: Callable[[int], bool], decommissioning: Iterable[int] = ()
) -> rebalance.RebalanceRequest:
    """The planner's request for the cluster as stored: every registered SPU (rack, ``online``), every
    partition's replicas, and the decommissioned SPUs (those of the snapshot and ``decommissioning``).
    A partition being moved counts where its move ends (its target; a cancelled move's is where it
    was): its replicas meanwhile are the old ones plus the ones being added, which no plan keeps
    (a dry run is answered while moves are in flight).

    An id that partitions name but no SPU holds (unregistered with its replicas, or scaled away
    with its group) counts as a decommissioned SPU that is down: the plan moves its replicas to
    registered SPUs. Left out, it made the planner refuse every plan (a replica "not in spus"):
    nothing could be rebalanced nor decommissioned until an SPU took the id again. While an SPU
    record cannot be read, such an id may be that SPU's: InvalidConfig names it instead."""
    spus: dict[int, placement_model.SpuInfo] = {}
    for entry in snapshot.entries("spus").values():
        spu: models.Spu = entry.obj
        spus.setdefault(spu.spec.id, placement_model.SpuInfo(spu.spec.id, spu.spec.rack, online(spu.spec.id)))
    partitions = [
        rebalance.PartitionReplicas(entry.name, tuple(_ending(entry.obj)))
        for entry in snapshot.entries("partitions").values()
    ]
    gone = sorted({spu for partition in partitions for spu in partition.replicas if spu not in spus})
    if gone and snapshot.unreadable("spus"):
        unreadable = sorted(snapshot.unreadable("spus"))
        raise placement_model.InvalidConfig(
            f"partitions have replicas on SPU id(s) {gone[:10]}, which no SPU this SC can read holds, and the "
            f"SPU record(s) {unreadable[:5]} cannot be read (one may hold them): fix or delete those records first"
        )
    for spu_id in gone:
        spus[spu_id] = placement_model.SpuInfo(spu_id, None, False)
    leaving = sorted(set(decommissioning_spus(snapshot)) | set(decommissioning) | set(gone))
    return rebalance.RebalanceRequest(spus=list(spus.values()), partitions=partitions, decommissioning=leaving)


def _ending(partition: models.Partition) -> list[int]:
    move = partition.spec.reassignment
    return partition.spec.replicas if move is None else move.target


def run_of(plan: rebalance.RebalancePlan, kind: str, max_moves_per_spu: int, decommissioning: Iterable[int] = ()) -> Run:
    """The run to store for ``plan``: running, or done at once when it moves nothing."""
    moves = tuple(PlannedMove(move.partition, tuple(move.before), tuple(move.after)) for move in plan.moves)
    return Run(kind, RUNNING if moves else DONE, max_moves_per_spu, moves, tuple(sorted(set(decommissioning))))


# ---------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a pass needs beyond the snapshot: which keys have a write of this controller in flight
    (such a partition counts as moving: its start may not be back in the store yet)."""

    busy: Callable[[str], bool] = lambda key: False
    known: Stored | None = None  # the run as last decoded (see ``stored``)
    # A move whose decision raises is left (and the run not marked done) when isolating.
    faults: faults_module.Faults = faults_module.RAISE


def decide(snapshot: local.Snapshot, inputs: Inputs) -> list[actions.Action]:
    """A running run: start pending moves in plan order while every SPU they concern has fewer than
    maxMovesPerSpu moves in flight; mark the run done once every move ended. A cancelled run: every
    move in flight goes back (its target becomes the replicas it had). Nothing for any other value."""
    found = stored(snapshot, inputs.known)
    run = found.run
    if run is None or run.state == DONE:
        return []
    partitions = snapshot.entries("partitions")
    statuses = _statuses(snapshot, run, inputs.faults)
    if run.state == CANCELLED:
        going_back = [
            (partitions[move.partition], move.before) for move, status in statuses if status == MOVING and move.partition in partitions
        ]
        return _reassign(snapshot, going_back, CAUSE_CANCELLED, inputs.faults)
    if len(statuses) == len(run.moves) and all(status in (DONE_MOVE, SKIPPED) for _, status in statuses):
        skipped = [move.partition for move, status in statuses if status == SKIPPED]
        reason = f"{run.kind} done: {len(statuses) - len(skipped)} move(s) done"
        if skipped:
            reason += f", {len(skipped)} skipped (partition deleted or changed meanwhile: {', '.join(skipped[:10])})"
        return [_run_write(run.with_state(DONE), found.mod_revision, reason)]
    in_flight: dict[int, int] = {}
    pending = []
    for move, status in statuses:
        # A start of ours not back in the local store yet: it counts as in flight.
        starting = status == PENDING and inputs.busy(models.object_key("partitions", move.partition))
        if status == PENDING and not starting:
            pending.append(move)
        elif status in (MOVING, REVERTING) or starting:
            for spu in move.spus:
                in_flight[spu] = in_flight.get(spu, 0) + 1
    limit = run.max_moves_per_spu
    starts = []
    for move in pending:
        if any(in_flight.get(spu, 0) >= limit for spu in move.spus):
            continue
        starts.append((partitions[move.partition], move.after))
        for spu in move.spus:
            in_flight[spu] = in_flight.get(spu, 0) + 1
    return _reassign(snapshot, starts, CAUSE_STARTED, inputs.faults)


# Partitions per transaction (with their topic: within kv.MAX_TXN_WRITES).
_PER_TRANSACTION = 100


def _reassign(
    snapshot: local.Snapshot,
    changes: list[tuple[local.Entry[models.Partition], tuple[int, ...]]],
    cause: str,
    faults: faults_module.Faults,
) -> list[actions.Action]:
    """One transaction per topic (and per 100 partitions): each partition's reassignment to its new
    target, and the topic's replica map pointing each of them at that target, so that the topic
    controller sees the partition where it is going (never an orphan to delete)."""
    topics = snapshot.entries("topics")
    by_topic: dict[str, list[tuple[local.Entry[models.Partition], tuple[int, ...]]]] = {}
    for entry, target in changes:
        by_topic.setdefault(entry.obj.topic, []).append((entry, target))
    decided = []
    for topic_name, items in by_topic.items():
        topic_entry = topics.get(topic_name)
        if topic_entry is None:
            continue  # the topic's deletion takes its partitions with it
        for start in range(0, len(items), _PER_TRANSACTION):
            chunk = items[start : start + _PER_TRANSACTION]
            try:
                decided.append(_topic_action(topic_entry, chunk, cause))
            except Exception as error:
                faults.record("topics", topic_name, error)
    return decided


def _topic_action(
    topic_entry: local.Entry[models.Topic], items: list[tuple[local.Entry[models.Partition], tuple[int, ...]]], cause: str
) -> actions.Action:
    topic: models.Topic = topic_entry.obj
    replica_map = dict(topic.status.replica_map)
    writes = []
    objects: list[models.AnyObject] = []
    reasons = []
    for entry, target in items:
        partition = entry.obj
        moving = partition.spec.reassignment
        previous = moving.previous if moving is not None else partition.spec.replicas
        reassignment = models.Reassignment(previous=list(previous), target=list(target))
        spec = models.PartitionSpec(leader=partition.spec.leader, replicas=list(partition.spec.replicas), reassignment=reassignment)
        updated = partition.model_copy(update={"spec": spec})
        writes.append(actions.Write(partition.key, models.encode(updated), entry.mod_revision))
        objects.append(updated)
        replica_map[partition.index] = list(target)
        if cause == CAUSE_CANCELLED:
            reasons.append(f"{partition.name}: move cancelled, back from {list(partition.spec.replicas)} to {list(target)}")
        else:
            leaving = [spu for spu in previous if spu not in target]
            arriving = [spu for spu in target if spu not in previous]
            reasons.append(
                f"{partition.name}: move started, {list(previous)} -> {list(target)} (SPU(s) {arriving} arrive, {leaving} leave)"
            )
    status = topic.status.model_copy(update={"replica_map": replica_map})
    updated_topic = topic.model_copy(update={"status": status})
    writes.append(actions.Write(topic.key, models.encode(updated_topic), topic_entry.mod_revision))
    objects.append(updated_topic)
    names = ",".join(entry.obj.name for entry, _ in items)
    # Queued apart from the partition and topic controllers' writes to these keys: the compares
    # decide which lands, and the loser decides again from the winner's values.
    return actions.Action(
        "partitions", names, actions.Verb.UPDATE_SPEC, "; ".join(reasons), tuple(writes),
        max(entry.mod_revision for entry, _ in items), tuple(objects),
        queue_key=f"rebalance/{topic.name}/{items[0][0].name}", cause=cause,
    )


def _run_write(run: Run, mod_revision: int, reason: str) -> actions.Action:
    write = actions.Write(KEY, run.encode(), mod_revision)
    return actions.Action("meta", "rebalance", actions.Verb.UPDATE_STATUS, reason, (write,), mod_revision, cause=CAUSE_RUN)


def holdings(snapshot: local.Snapshot, spu_ids: Iterable[int]) -> Mapping[int, int]:
    """How many partitions list each of ``spu_ids`` among their replicas (a move's added SPUs too)."""
    wanted = set(spu_ids)
    counts = dict.fromkeys(wanted, 0)
    if not wanted:
        return counts
    for entry in snapshot.entries("partitions").values():
        for spu in entry.obj.spec.replicas:
            if spu in wanted:
                counts[spu] += 1
    return counts
