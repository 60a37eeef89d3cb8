"""The rebalance planner: replica moves that even out the SPUs' load while moving as little as possible.

Purely computational, no I/O: a checked request (`rebalance.check`) in, a `RebalancePlan` out.
It never makes a partition's rack spread worse and never changes a replication factor.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from controller.placement import model, rebalance, spread

# A planned move: (partition index, from SPU, to SPU).
Record = tuple[int, int, int]


class _Node(NamedTuple):
    """A node of an augmenting path (step 3).

    "giver": `spu` has a replica to give. "receiver": `spu` takes one. "move": the planned move
    `record` (received by `spu`) is cancelled, its replica free to go elsewhere. "pool": a
    ceiling changes hands (see `_augment_once`). "swap": the planned move `record` of a
    partition is cancelled so that the giver before may give that partition to `spu` (see
    `_swap_from`).
    """

    kind: str
    spu: int
    record: Record | None = None


# Once a valid replica is found, how many more a pick looks at for one it prefers (see _pick):
# a preference, not worth scanning a thousand replicas for.
_PREFERENCE_LOOKAHEAD = 64


def plan(request: rebalance.RebalanceRequest) -> rebalance.RebalancePlan:
    """The plan for `request` (InvalidConfig for a bad one).

    Balance is counted over the SPUs that take replicas, online and not decommissioning; their
    targets are ⌊total/n⌋ or ⌈total/n⌉ of the replicas they and the decommissioning SPUs hold,
    the ceilings going to the SPUs that hold the most (ties to the lowest id); a
    decommissioning SPU's target is 0. An offline SPU keeps its replicas, takes none, and
    counts in no balance: it may be back in a minute, and moving replicas off a dead SPU is
    a decision of its own (decommission it). The lower bound is the sum over SPUs of their
    replicas above target: each such replica must move at least once.

    The plan is made in steps, each moving only what the previous ones could not:
    1. every replica of a decommissioning SPU goes to the SPU most below its target that may
       take it;
    2. SPUs below target take replicas, one at a time to the one most below, from the SPUs
       most above theirs (without racks this alone meets the lower bound: an SPU above
       target holds more than one below it, so holds a partition that one lacks);
    3. what is still above target is matched again through augmenting paths (a move already
       planned gives way to another, a ceiling changes hands), still one move per replica:
       the plan meets the lower bound wherever such paths reach; a plan within the bound
       that only a wholesale rearrangement finds can still be missed (racks only);
    4. a replica with no SPU below target that may take it goes through an SPU at its target,
       which passes another replica on (one move more each; `notes` says so);
    5. what a decommissioning SPU still holds goes above the ceiling where racks force it;
    6. an SPU left below target because of racks takes replicas from SPUs holding two or more
       than it, so that what racks do allow is even;
    7. leaderships are evened out by making another replica of a partition its preferred
       leader, which moves no data.
    A move "may" happen when the receiver does not hold the partition, the partition's rack
    spread does not drop (per level, see `spread`; never below min(what it had, the racks
    that remain)), and neither SPU has reached `max_moves_per_spu`.
    """
    planner = _Planner(rebalance.check(request))
    planner.empty_decommissioned()
    planner.fill()
    planner.augment()
    planner.retarget()
    planner.detour()
    planner.overflow()
    planner.level_out()
    planner.balance_leaders()
    return planner.result()


class _Planner:
    """The working placement: replica lists, who holds what, counts, and the moves made so far."""

    def __init__(self, cluster: rebalance.Cluster) -> None:
        self.cluster = cluster
        self.original = cluster.rows
        self.rows = [list(row) for row in cluster.rows]
        self.ids = [spu.id for spu in cluster.spus]
        self.takers = [spu.id for spu in cluster.spus if spu.online and spu.id not in cluster.decommissioning]
        self.taker_set = set(self.takers)
        self.leaving = sorted(cluster.decommissioning)
        self.counted = self.takers + self.leaving
        self.holdings: dict[int, set[int]] = {spu_id: set() for spu_id in self.ids}
        # Partitions an SPU held at the start and still holds, in partition order: the replicas
        # it may give. A replica it received is never passed on (that would be one move made twice).
        self.givable: dict[int, dict[int, None]] = {spu_id: {} for spu_id in self.ids}
        self.leaders = dict.fromkeys(self.ids, 0)
        for index, row in enumerate(self.rows):
            for spu_id in row:
                self.holdings[spu_id].add(index)
                self.givable[spu_id][index] = None
            self.leaders[row[0]] += 1
        self.originally = {spu_id: frozenset(held) for spu_id, held in self.holdings.items()}

        total = sum(len(self.holdings[spu_id]) for spu_id in self.counted)
        if total and not self.takers:
            raise model.InsufficientResources(
                f"{total} replicas are on decommissioning SPUs and no online SPU may take them: "
                "bring an SPU online or register a new one"
            )
        size = max(1, len(self.takers))
        self.floor, extra = divmod(total, size)
        self.ceiling = self.floor + (1 if extra else 0)
        self.target = dict.fromkeys(self.takers, self.floor)
        for spu_id in sorted(self.takers, key=lambda spu_id: (-len(self.holdings[spu_id]), spu_id))[:extra]:
            self.target[spu_id] = self.floor + 1
        self.target.update(dict.fromkeys(self.leaving, 0))
        self.lower_bound = sum(max(0, len(self.holdings[spu_id]) - self.target[spu_id]) for spu_id in self.counted)

        led = sum(self.leaders[spu_id] for spu_id in self.counted)
        self.leader_floor, leader_extra = divmod(led, size)
        self.leader_ceiling = self.leader_floor + (1 if leader_extra else 0)

        self.keys = cluster.rack_keys
        self.levels = max((len(keys) for keys in self.keys.values()), default=0)
        self.required = self._required_spread() if self.levels else []
        self.limit = cluster.max_moves_per_spu
        self.moved = dict.fromkeys(self.ids, 0)
        self.received: dict[int, list[Record]] = {spu_id: [] for spu_id in self.ids}
        self.moves_of: dict[int, list[Record]] = {}  # planned moves per partition index
        # Whether racks let an SPU give any replica into a rack, (giver, rack keys) -> bool: see _may_give.
        self.racks_open: dict[tuple[int, spread.RackKeys], bool] = {}
        self.rack_key_set = set(self.keys.values())
        # (giver, receiver) pairs a full scan found no move for, and (giver, rack keys) it has none for.
        self.dead: set[tuple[int, int]] = set()
        self.closed: set[tuple[int, spread.RackKeys]] = set()
        self.detoured: list[str] = []
        self.overflowed = 0
        self.leveled = 0

    # ------------------------------------------------------------------ the rules of a move

    def _required_spread(self) -> list[tuple[int, ...]]:
        """Per partition and level, the racks it must keep spanning: what it spans now, or all
        racks that remain to it if fewer (those of the SPUs that take replicas, and of its own
        replicas on offline SPUs, which stay)."""
        levels, keys = self.levels, self.keys
        taker_racks = [{keys[spu_id][level] for spu_id in self.takers if keys[spu_id]} for level in range(levels)]
        staying = set(self.ids) - self.taker_set - set(self.leaving)
        required = []
        for row in self.rows:
            now = spread.spread([keys[spu_id] for spu_id in row], levels)
            offline_racks = [keys[spu_id] for spu_id in row if spu_id in staying and keys[spu_id]]
            required.append(
                tuple(
                    min(now[level], len(taker_racks[level] | {entry[level] for entry in offline_racks}))
                    for level in range(levels)
                )
            )
        return required

    def _valid(self, partition: int, giver: int, receiver: int, row: Sequence[int] | None = None) -> bool:
        """May `giver`'s replica of `partition` go to `receiver` (placement and racks; not limits)?

        `row` judges it against another replica list than the partition's current one.
        """
        if row is None:
            if partition in self.holdings[receiver]:
                return False
            row = self.rows[partition]
        elif receiver in row:
            return False
        return self._racks_allow(partition, giver, self.keys[receiver], row)

    def _racks_allow(
        self, partition: int, giver: int, receiver_keys: spread.RackKeys, row: Sequence[int] | None = None
    ) -> bool:
        """Would the partition keep its rack spread if `giver`'s replica went to an SPU with these racks?"""
        if not self.levels:
            return True
        keys = self.keys
        if receiver_keys == keys[giver]:
            return True  # same rack at every level: the spread cannot change
        if row is None:
            row = self.rows[partition]
        needed = self.required[partition]
        for level in range(self.levels):
            racks = {keys[spu_id][level] for spu_id in row if spu_id != giver and keys[spu_id]}
            if receiver_keys:
                racks.add(receiver_keys[level])
            if len(racks) < needed[level]:
                return False
        return True

    def _may_give(self, giver: int, receiver: int) -> bool:
        """Whether `giver` has a replica it may give `receiver` (for the searches of steps 3 and 4).

        Whether racks allow any of its replicas into the receiver's rack is remembered per rack:
        when racks forbid them all, every SPU of that rack is answered at once (a thousand
        replicas scanned once per rack, not once per SPU, and not again until a move touches
        one of the giver's partitions, see `_apply`).
        """
        key = (giver, self.keys[receiver])
        is_open = self.racks_open.get(key)
        if is_open is None:
            is_open = self.racks_open[key] = any(
                self._racks_allow(partition, giver, key[1]) for partition in self.givable[giver]
            )
        return is_open and self._pick_any(giver, receiver) is not None

    def _forget_racks(self, partition: int, *spus: int) -> None:
        """A move changed `partition`: what its SPUs may give into each rack is to be worked out again."""
        if not self.racks_open:
            return
        for spu_id in {*self.rows[partition], *spus}:
            for keys in self.rack_key_set:
                self.racks_open.pop((spu_id, keys), None)

    def _can_move(self, giver: int, receiver: int) -> bool:
        limit = self.limit
        return limit is None or (self.moved[giver] < limit and self.moved[receiver] < limit)

    def _excess(self, spu_id: int) -> int:
        return len(self.holdings[spu_id]) - self.target[spu_id]

    def _pick_any(self, giver: int, receiver: int, exclude: set[int] | frozenset[int] = frozenset()) -> int | None:
        """The first replica `giver` may give `receiver`, in partition order."""
        for partition in self.givable[giver]:
            if partition not in exclude and self._valid(partition, giver, receiver):
                return partition
        return None

    def _pick(self, giver: int, receiver: int, exclude: set[int] | frozenset[int] = frozenset()) -> int | None:
        """A replica `giver` may give `receiver`, preferring, in this order:
        - a partition with no move planned yet, so that a partition keeps most of its replicas
          (and its in-sync set) while it moves, and moves are spread over more partitions;
        - one it leads while it leads more than the ceiling and the receiver fewer (the
          leadership travels with the data), otherwise one it follows.

        The first valid replica in partition order is taken, or a preferred one among the next
        _PREFERENCE_LOOKAHEAD. Until the first, the replicas the receiver holds already are passed
        over in C: they are never valid, and with few SPUs a receiver soon holds most of the
        partitions at the front of every giver's list (a Python loop over them made a plan of
        30,000 partitions for 12 SPUs quadratic).
        """
        prefer_led = self.leaders[giver] > self.leader_ceiling and self.leaders[receiver] < self.leader_ceiling
        rows, moves_of = self.rows, self.moves_of
        partitions = iter(self.givable[giver])
        best = None
        for partition in itertools.filterfalse(self.holdings[receiver].__contains__, partitions):
            if partition not in exclude and self._valid(partition, giver, receiver):
                best = partition
                break
        if best is None:
            return None
        best_score = (2 if moves_of.get(best) else 0) + (0 if (rows[best][0] == giver) == prefer_led else 1)
        if not best_score:
            return best
        # The same iterator: the lookahead counts every replica after the first valid one.
        for partition in itertools.islice(partitions, _PREFERENCE_LOOKAHEAD):
            score = (2 if moves_of.get(partition) else 0) + (0 if (rows[partition][0] == giver) == prefer_led else 1)
            if score >= best_score or partition in exclude or not self._valid(partition, giver, receiver):
                continue
            best, best_score = partition, score
            if not score:
                break
        return best

    def _apply(self, partition: int, giver: int, receiver: int) -> Record:
        row = self.rows[partition]
        row[row.index(giver)] = receiver
        self.holdings[giver].discard(partition)
        self.holdings[receiver].add(partition)
        self.givable[giver].pop(partition, None)
        if partition in self.originally[receiver]:
            self.givable[receiver][partition] = None  # back where it was: its own replica again
        if row[0] == receiver:
            self.leaders[giver] -= 1
            self.leaders[receiver] += 1
        self.moved[giver] += 1
        self.moved[receiver] += 1
        record = (partition, giver, receiver)
        self.received[receiver].append(record)
        self.moves_of.setdefault(partition, []).append(record)
        self._forget_racks(partition, giver)
        return record

    def _undo(self, record: Record) -> None:
        partition, giver, receiver = record
        row = self.rows[partition]
        row[row.index(receiver)] = giver
        self.holdings[receiver].discard(partition)
        self.holdings[giver].add(partition)
        self.givable[receiver].pop(partition, None)
        if partition in self.originally[giver]:
            self.givable[giver][partition] = None
        if row[0] == giver:
            self.leaders[receiver] -= 1
            self.leaders[giver] += 1
        self.moved[giver] -= 1
        self.moved[receiver] -= 1
        self.received[receiver].remove(record)
        self.moves_of[partition].remove(record)
        self._forget_racks(partition, receiver)

    # ------------------------------------------------------------------ steps 1 and 2

    def empty_decommissioned(self) -> None:
        """Each replica of a decommissioning SPU to the taker most below its target that may take it."""
        for leaving in self.leaving:
            for partition in list(self.givable[leaving]):
                by_need = sorted(self.takers, key=lambda spu_id: (self._excess(spu_id), spu_id))
                for receiver in by_need:
                    if self._excess(receiver) >= 0:
                        break
                    if self._can_move(leaving, receiver) and self._valid(partition, leaving, receiver):
                        self._apply(partition, leaving, receiver)
                        break

    def fill(self) -> None:
        """Takers below target take replicas from the takers most above theirs, one at a time to the
        one most below target, so that a short supply (racks) is shared evenly."""
        sources = [(-self._excess(spu_id), spu_id) for spu_id in self.takers if self._excess(spu_id) > 0]
        receivers = [(self._excess(spu_id), spu_id) for spu_id in self.takers if self._excess(spu_id) < 0]
        heapq.heapify(sources)
        heapq.heapify(receivers)
        while receivers and sources:
            receiver = heapq.heappop(receivers)[1]
            giver = self._give_one(receiver, sources)
            if giver is not None and self._excess(receiver) < 0:
                heapq.heappush(receivers, (self._excess(receiver), receiver))

    def _give_one(self, receiver: int, sources: list[tuple[int, int]]) -> int | None:
        """One replica for `receiver` from the source most above target that may give it one."""
        set_aside = []
        found = None
        while sources:
            entry = heapq.heappop(sources)
            giver = entry[1]
            if self._excess(giver) <= 0:
                continue  # done giving: drop it
            if not self._can_move(giver, receiver) or self._known_dead(giver, receiver):
                set_aside.append(entry)
                continue
            partition = self._pick(giver, receiver)
            if partition is None:
                self._note_dead(giver, receiver)
                set_aside.append(entry)
                continue
            self._apply(partition, giver, receiver)
            if self._excess(giver) > 0:
                heapq.heappush(sources, (-self._excess(giver), giver))
            found = giver
            break
        for entry in set_aside:
            heapq.heappush(sources, entry)  # unchanged, so their place in the heap still holds
        return found

    def _known_dead(self, giver: int, receiver: int) -> bool:
        return (giver, receiver) in self.dead or (giver, self.keys[receiver]) in self.closed

    def _note_dead(self, giver: int, receiver: int) -> None:
        """Remember that `giver` had nothing for `receiver`; and for its whole rack, when racks were why.

        Within one step these only grow truer (a giver only loses replicas, a receiver only
        gains them); a move of another replica of a partition could reopen one, which the
        augmenting paths of step 3 would still find.
        """
        self.dead.add((giver, receiver))
        receiver_keys = self.keys[receiver]
        if self.levels and not any(
            self._racks_allow(partition, giver, receiver_keys) for partition in self.givable[giver]
        ):
            self.closed.add((giver, receiver_keys))

    # ------------------------------------------------------------------ step 3: augmenting paths

    def augment(self) -> None:
        """Place what is still above target with one move each, re-routing moves already planned.

        Here which takers end at the ceiling is left open (it does not matter to balance): a
        path starts at a decommissioning SPU, at a taker above the ceiling, or, when more
        takers are at the ceiling than there are ceilings, at one of those; it ends at a taker
        below the floor, or at one at the floor while ceilings are free. Each path lowers the
        lower bound still to go by one with one move, so the plan meets the bound whenever
        paths exist until none is left to go.
        """
        while self._augment_once(from_ceiling=False) or self._augment_once(from_ceiling=True):
            pass

    def _ceilings_free(self) -> int:
        """How many more takers may end at the ceiling (negative: that many too many are there)."""
        if self.floor == self.ceiling:
            return 0
        total = sum(len(self.holdings[spu_id]) for spu_id in self.counted)
        ceilings = total - self.floor * len(self.takers)
        return ceilings - sum(1 for spu_id in self.takers if len(self.holdings[spu_id]) >= self.ceiling)

    def _augment_once(self, from_ceiling: bool) -> bool:
        """One augmenting path, searched breadth first from every SPU that may start one.

        A giver leads to each taker it may give a replica to; the path ends at a taker that
        may end it. A full receiver leads to each move it received: cancelling that move frees
        it for the giver before. A cancelled move leads to another taker its replica may go to
        instead, or back to its giver, who then gives something else. A giver also leads,
        through a swap, to a taker that may end the path and that it could give a partition to
        but for that partition's one planned move (see `_swap_from`).
        """
        floor, ceiling = self.floor, self.ceiling
        free = self._ceilings_free()
        holding = {spu_id: len(self.holdings[spu_id]) for spu_id in self.counted}
        if from_ceiling:
            if free >= 0:
                return False
            roots = [spu_id for spu_id in self.takers if holding[spu_id] == ceiling]
            ends = {spu_id for spu_id in self.takers if holding[spu_id] < floor}
        else:
            roots = [spu_id for spu_id in self.leaving if holding[spu_id]]
            roots += [spu_id for spu_id in self.takers if holding[spu_id] > ceiling]
            ends = {
                spu_id
                for spu_id in self.takers
                if holding[spu_id] < floor or (holding[spu_id] < ceiling and free > 0)
            }
        roots = [spu_id for spu_id in roots if self.givable[spu_id]]
        if not roots or not ends:
            return False
        # With no ceiling free, a taker at the floor may still take one if a taker that reached
        # the ceiling through a planned move gives that move up (through the "pool" node).
        pooling = not from_ceiling and floor < ceiling and free == 0
        at_floor = {spu_id for spu_id in self.takers if holding[spu_id] == floor} if pooling else set()
        parent: dict[_Node, _Node | None] = {_Node("giver", spu_id): None for spu_id in roots}
        queue: deque[_Node] = deque(parent)

        def reach(node: _Node, previous: _Node) -> bool:
            if node in parent:
                return False
            parent[node] = previous
            queue.append(node)
            return True

        while queue:
            node = queue.popleft()
            if node.kind == "receiver":
                for record in self.received[node.spu]:
                    reach(_Node("move", node.spu, record), node)
                if node.spu in at_floor:
                    reach(_Node("pool", -1), node)
                continue
            if node.kind == "pool":
                for spu_id in self.takers:
                    if holding[spu_id] == ceiling:
                        for record in self.received[spu_id]:
                            reach(_Node("move", spu_id, record), node)
                continue
            if node.kind == "move":
                assert node.record is not None
                partition, giver, holder = node.record
                if self._valid(partition, holder, giver):  # the replica may go back where it was
                    reach(_Node("giver", giver), node)
            for receiver in self.takers:
                if _Node("receiver", receiver) in parent:
                    continue
                last = receiver in ends
                if not last and not self.received[receiver] and receiver not in at_floor:
                    continue
                if node.kind == "giver":
                    giver = node.spu
                    if receiver == giver or not self._can_move(giver, receiver):
                        continue
                    if not self._may_give(giver, receiver):
                        continue
                else:
                    # The moved replica goes to `receiver` instead: judged as a move from where it is now.
                    assert node.record is not None
                    partition, giver, holder = node.record
                    if receiver == giver or not self._can_move(giver, receiver):
                        continue
                    if not self._valid(partition, holder, receiver):
                        continue
                end = _Node("receiver", receiver)
                reach(end, node)
                if last:
                    return self._apply_augmenting(parent, end)
            if node.kind == "giver":
                swap = self._swap_from(node.spu, ends)
                if swap is not None:
                    parent[swap] = node
                    return self._apply_augmenting(parent, swap)
        return False

    def _swap_from(self, giver: int, ends: set[int]) -> _Node | None:
        """A swap ending a path at `giver`: it could give a partition to a taker in `ends` but for
        that partition's one planned move (Z → W); that move is cancelled, and Z gives W
        another replica instead. Three moves for two: one more, as for any augmenting path."""
        below = [spu_id for spu_id in self.takers if spu_id in ends and spu_id != giver]
        if not below:
            return None
        keys = self.keys
        for partition in self.givable[giver]:
            records = self.moves_of.get(partition)
            if not records or len(records) != 1:
                continue
            (record,) = records
            _, other_giver, other_receiver = record
            if other_giver == giver:
                continue
            # A move within one rack changed no spread: it can only be in the way of its own receiver.
            same_racks = keys[other_giver] == keys[other_receiver]
            row = [other_giver if spu_id == other_receiver else spu_id for spu_id in self.rows[partition]]
            for receiver in below:
                if same_racks and receiver != other_receiver:
                    continue
                if (
                    self._can_move(giver, receiver)
                    and not self._valid(partition, giver, receiver)
                    and self._valid(partition, giver, receiver, row)
                    and self._pick_any(other_giver, other_receiver, exclude={partition}) is not None
                ):
                    return _Node("swap", receiver, record)
        return None

    def _apply_augmenting(self, parent: dict[_Node, _Node | None], end: _Node) -> bool:
        path: list[_Node] = [end]
        while (previous := parent[path[-1]]) is not None:
            path.append(previous)
        path.reverse()
        # Partitions some later step moves: an earlier giver must not pick them.
        reserved = {
            node.record[0]
            for index, node in enumerate(path)
            if node.record is not None and (node.kind == "swap" or index + 1 < len(path))
        }
        journal: list[tuple[bool, Record]] = []  # (applied?, record), to roll back
        for index in range(1, len(path)):
            previous, node = path[index - 1], path[index]
            following = path[index + 1] if index + 1 < len(path) else None
            partition: int | None
            if node.kind == "swap":
                # The end of the path: cancel Z -> W, give its partition to the receiver, Z gives W another.
                assert node.record is not None
                swapped, other_giver, other_receiver = node.record
                self._undo(node.record)
                journal.append((False, node.record))
                giver = previous.spu
                if not (self._can_move(giver, node.spu) and self._valid(swapped, giver, node.spu)):
                    self._roll_back(journal)
                    return False
                journal.append((True, self._apply(swapped, giver, node.spu)))
                partition = self._pick(other_giver, other_receiver, exclude=reserved)
                if partition is None or not self._can_move(other_giver, other_receiver):
                    self._roll_back(journal)
                    return False
                giver, node = other_giver, _Node("receiver", other_receiver)
            elif node.kind == "pool":
                # A taker at the ceiling gives up a move it received, so that the one before may rise.
                assert following is not None and following.kind == "move" and following.record is not None
                self._undo(following.record)
                journal.append((False, following.record))
                continue
            elif node.kind == "receiver":
                if following is not None and following.kind == "move":
                    assert following.record is not None
                    self._undo(following.record)
                    journal.append((False, following.record))
                if previous.kind == "giver":
                    giver = previous.spu
                    partition = (
                        self._pick(giver, node.spu, exclude=reserved) if self._can_move(giver, node.spu) else None
                    )
                else:
                    assert previous.kind == "move" and previous.record is not None
                    partition, giver = previous.record[0], previous.record[1]
                    if not (self._can_move(giver, node.spu) and self._valid(partition, giver, node.spu)):
                        partition = None
            else:
                continue  # a giver or a cancelled move: its neighbours do the work
            if partition is None or partition not in self.holdings[giver]:
                self._roll_back(journal)
                return False
            journal.append((True, self._apply(partition, giver, node.spu)))
        # A cancelled move puts its replica back beside replicas that may have moved since.
        if not all(self._spread_kept(record[0]) for _, record in journal):
            self._roll_back(journal)
            return False
        return True

    def _spread_kept(self, partition: int) -> bool:
        if not self.levels:
            return True
        now = spread.spread([self.keys[spu_id] for spu_id in self.rows[partition]], self.levels)
        return all(count >= needed for count, needed in zip(now, self.required[partition], strict=True))

    def _roll_back(self, journal: list[tuple[bool, Record]]) -> None:
        for applied, record in reversed(journal):
            if applied:
                self._undo(record)
            else:
                self._apply(*record)

    # ------------------------------------------------------------------ step 4: detours

    def retarget(self) -> None:
        """Give the ceilings to the takers that hold the most now, before the steps that cost extra.

        Which takers end at the ceiling does not matter to balance; an SPU above its first
        target but at the ceiling, beside one below its target but at the floor (racks
        stopped the move between them), needs no detour.
        """
        for spu_id in self.takers:
            self.target[spu_id] = self.floor
        extra = sum(len(self.holdings[spu_id]) for spu_id in self.counted) - self.floor * len(self.takers)
        for spu_id in sorted(self.takers, key=lambda spu_id: (-len(self.holdings[spu_id]), spu_id))[:extra]:
            self.target[spu_id] = self.floor + 1

    def detour(self) -> None:
        """A replica with no direct receiver goes to an SPU at its target, which passes one of its own on."""
        while True:
            givers = [spu_id for spu_id in self.counted if self._excess(spu_id) > 0 and self.givable[spu_id]]
            if not givers:
                return
            path = self._detour_path(givers)
            if path is None:
                return
            journal: list[tuple[bool, Record]] = []
            names = []
            for giver, receiver in zip(path, path[1:], strict=False):
                partition = self._pick(giver, receiver) if self._can_move(giver, receiver) else None
                if partition is None:
                    self._roll_back(journal)
                    return
                journal.append((True, self._apply(partition, giver, receiver)))
                names.append(self.cluster.names[partition])
            if len(path) == 2:
                continue  # a direct move after all (a re-routing that step 3 had to roll back)
            self.detoured.append(
                f"SPU {path[0]}'s replica of {names[0]} goes to SPU {path[1]}, "
                + ", ".join(f"SPU {giver} passes {name} to SPU {receiver}" for giver, receiver, name in zip(path[1:-1], path[2:], names[1:], strict=True))
            )

    def _detour_path(self, givers: list[int]) -> list[int] | None:
        """The shortest chain giver → takers at target → a taker below target, searched back from the end."""
        frontier = [spu_id for spu_id in self.takers if self._excess(spu_id) < 0]
        toward: dict[int, int | None] = dict.fromkeys(frontier)
        edges: dict[tuple[int, int], bool] = {}

        def edge(giver: int, receiver: int) -> bool:
            key = (giver, receiver)
            if key not in edges:
                edges[key] = (
                    giver != receiver and self._can_move(giver, receiver) and self._may_give(giver, receiver)
                )
            return edges[key]

        giver_set = set(givers)
        while frontier:
            for giver in givers:
                for receiver in frontier:
                    if edge(giver, receiver):
                        path = [giver, receiver]
                        while (step := toward[path[-1]]) is not None:
                            path.append(step)
                        return path
            reached = []
            for middle in self.takers:
                if middle in toward or middle in giver_set:
                    continue
                if self.limit is not None and self.moved[middle] + 2 > self.limit:
                    continue
                for receiver in frontier:
                    if edge(middle, receiver):
                        toward[middle] = receiver
                        reached.append(middle)
                        break
            frontier = reached
        return None

    def overflow(self) -> None:
        """What a decommissioning SPU still holds goes to the takers holding fewest that may take it,
        above their target if need be: racks left no taker at or below its target for it, and
        a decommission must still empty the SPU."""
        for leaving in self.leaving:
            for partition in list(self.givable[leaving]):
                for receiver in sorted(self.takers, key=lambda spu_id: (len(self.holdings[spu_id]), spu_id)):
                    if self._can_move(leaving, receiver) and self._valid(partition, leaving, receiver):
                        self._apply(partition, leaving, receiver)
                        self.overflowed += 1
                        break

    # ------------------------------------------------------------------ step 5: even out what racks allow

    def level_out(self) -> None:
        """A taker still below target takes from takers holding at least two more, fullest first.

        A replica such a taker received in this plan is passed on by re-routing its move (no
        move more); otherwise it gives one of its own (one more move, counted in the notes).
        """
        self.dead.clear()  # earlier steps cancelled moves: what was dead may live again
        self.closed.clear()
        finished: set[int] = set()
        while True:
            below = [
                spu_id
                for spu_id in self.takers
                if self._excess(spu_id) < 0
                and spu_id not in finished
                and (self.limit is None or self.moved[spu_id] < self.limit)
            ]
            if not below:
                return
            receiver = min(below, key=lambda spu_id: (len(self.holdings[spu_id]), spu_id))
            fuller = sorted(
                (
                    spu_id
                    for spu_id in self.takers
                    if len(self.holdings[spu_id]) >= len(self.holdings[receiver]) + 2
                    and not self._known_dead(spu_id, receiver)
                ),
                key=lambda spu_id: (-len(self.holdings[spu_id]), spu_id),
            )
            for giver in fuller:
                if self._reroute_one(giver, receiver):
                    break
                partition = self._pick(giver, receiver) if self._can_move(giver, receiver) else None
                if partition is not None:
                    self._apply(partition, giver, receiver)
                    self.leveled += 1
                    break
                if self._can_move(giver, receiver):
                    self._note_dead(giver, receiver)
            else:
                finished.add(receiver)

    def _reroute_one(self, holder: int, receiver: int) -> bool:
        """A move `holder` received goes to `receiver` instead, if it may."""
        for record in self.received[holder]:
            partition, giver, _ = record
            if giver != receiver and self._valid(partition, holder, receiver):
                self._undo(record)
                if self._can_move(giver, receiver):
                    self._apply(partition, giver, receiver)
                    return True
                self._apply(*record)
        return False

    # ------------------------------------------------------------------ step 6: leaders

    def balance_leaders(self) -> None:
        """Even out preferred leaders by reordering replica lists (no data moves).

        Counted like replicas: partitions led by a taker or a decommissioning SPU, over the
        takers; a decommissioning SPU's target is 0, and only takers take leaderships.
        """
        rows = self.rows
        led = sum(self.leaders[spu_id] for spu_id in self.counted)
        floor, extra = divmod(led, max(1, len(self.takers)))
        self.leader_floor, self.leader_ceiling = floor, floor + (1 if extra else 0)
        target = dict.fromkeys(self.takers, floor)
        for spu_id in sorted(self.takers, key=lambda spu_id: (-self.leaders[spu_id], spu_id))[:extra]:
            target[spu_id] = floor + 1
        target.update(dict.fromkeys(self.leaving, 0))

        # Partitions whose replica list changes anyway come first: fewer partitions touched.
        changed = [index for index, row in enumerate(rows) if tuple(row) != self.original[index]]
        unchanged = [index for index, row in enumerate(rows) if tuple(row) == self.original[index]]
        self.led_by: dict[int, dict[int, None]] = {spu_id: {} for spu_id in self.ids}
        # Per leader, how many of the partitions it leads each SPU follows in (see _handover_path).
        self.followers_of: dict[int, Counter[int]] = {spu_id: Counter() for spu_id in self.ids}
        for index in changed + unchanged:
            row = rows[index]
            self.led_by[row[0]][index] = None
            self.followers_of[row[0]].update(row[1:])
        # Direct: a leader above target hands a partition to one of its replicas below target.
        for giver in sorted(self.counted, key=lambda spu_id: (target[spu_id] - self.leaders[spu_id], spu_id)):
            for index in list(self.led_by[giver]):
                if self.leaders[giver] <= target[giver]:
                    break
                row = rows[index]
                candidates = [
                    spu_id for spu_id in row[1:] if spu_id in self.taker_set and self.leaders[spu_id] < target[spu_id]
                ]
                if candidates:
                    self._lead(
                        index, max(candidates, key=lambda spu_id: (target[spu_id] - self.leaders[spu_id], -row.index(spu_id)))
                    )
        # Then chains: X hands a partition to Y, which hands one of its own on, until one that may lead more.
        while self._lead_along_a_path():
            pass

    def _lead(self, index: int, new_leader: int) -> None:
        row = self.rows[index]
        old_leader = row[0]
        self.leaders[old_leader] -= 1
        self.leaders[new_leader] += 1
        del self.led_by[old_leader][index]
        self.led_by[new_leader][index] = None
        self.followers_of[old_leader].subtract(row[1:])
        row.remove(new_leader)
        row.insert(0, new_leader)
        self.followers_of[new_leader].update(row[1:])

    def _lead_along_a_path(self) -> bool:
        """Move one leadership along the shortest chain of handovers that brings an SPU into range.

        In range means between the floor and the ceiling (0 for a decommissioning SPU): which
        SPUs end at the ceiling does not matter. Tried in turn: from one above the ceiling to one
        below the floor; to one below the ceiling; from one above the floor to one below it.
        """
        floor, ceiling, leaders = self.leader_floor, self.leader_ceiling, self.leaders
        leaving = self.cluster.decommissioning
        over = [spu_id for spu_id in self.counted if leaders[spu_id] > (0 if spu_id in leaving else ceiling)]
        under = {spu_id for spu_id in self.takers if leaders[spu_id] < floor}
        if not over and not under:
            return False
        attempts: list[tuple[list[int], Callable[[int], bool]]] = []
        if over and under:
            attempts.append((over, under.__contains__))
        if over:
            attempts.append((over, lambda spu_id: leaders[spu_id] < ceiling))
        if under:
            above_floor = [spu_id for spu_id in self.counted if leaders[spu_id] > (0 if spu_id in leaving else floor)]
            attempts.append((above_floor, under.__contains__))
        return any(self._handover_path(givers, wanted) for givers, wanted in attempts)

    def _handover_path(self, givers: list[int], wanted: Callable[[int], bool]) -> bool:
        """Breadth first from `givers` over "leads a partition of which the next one holds a replica"."""
        parent: dict[int, tuple[int, int] | None] = dict.fromkeys(givers)
        queue = deque(givers)
        rows, takers = self.rows, self.taker_set
        while queue:
            giver = queue.popleft()
            # The takers this giver can reach that nothing reached yet: once each has been met, its
            # other partitions cannot add one (with few SPUs, that is after a few dozen of thousands).
            unmet = sum(1 for spu_id, count in self.followers_of[giver].items() if count and spu_id in takers and spu_id not in parent)
            if not unmet:
                continue
            for index in self.led_by[giver]:
                for receiver in rows[index][1:]:
                    if receiver in parent or receiver not in takers:
                        continue
                    parent[receiver] = (giver, index)
                    if wanted(receiver):
                        node = receiver
                        while (link := parent[node]) is not None:
                            self._lead(link[1], node)
                            node = link[0]
                        return True
                    queue.append(receiver)
                    unmet -= 1
                if not unmet:
                    break
        return False

    # ------------------------------------------------------------------ the answer

    def result(self) -> rebalance.RebalancePlan:
        names, original = self.cluster.names, self.original
        moves = tuple(
            rebalance.Move(partition=names[index], before=original[index], after=tuple(row))
            for index, row in enumerate(self.rows)
            if tuple(row) != original[index]
        )
        replica_moves = sum(len(move.placed) for move in moves)
        leader_changes = sum(1 for move in moves if move.after[0] != move.before[0] and move.after[0] in move.before)
        notes = []
        extra = replica_moves - self.lower_bound
        if self.detoured:
            notes.append(
                f"{len(self.detoured)} replica(s) had no SPU below its target that could take them (each such SPU "
                f"already held the partition{', or the partition would lose a rack' if self.levels else ''}), so each "
                "goes through an SPU at its target, one move more: " + "; ".join(self.detoured)
            )
        if self.overflowed:
            notes.append(
                f"{self.overflowed} replica(s) of decommissioning SPUs go to SPUs above the ceiling: racks leave no "
                "SPU at or below its target that may take them"
            )
        if self.leveled:
            notes.append(
                f"{self.leveled} move(s) even out SPUs that racks keep below their target (see unreachable), "
                "from SPUs holding two or more replicas more"
            )
        if extra > 0:
            notes.insert(0, f"{replica_moves} replica moves, {extra} above the lower bound of {self.lower_bound}")
        return rebalance.RebalancePlan(
            moves=moves,
            replica_moves=replica_moves,
            lower_bound=self.lower_bound,
            leader_changes=leader_changes,
            before=_load(original, self.ids),
            after=_load(self.rows, self.ids),
            replica_targets=rebalance.Targets(self.floor, self.ceiling),
            leader_targets=rebalance.Targets(self.leader_floor, self.leader_ceiling),
            unreachable=tuple(self._shortfalls()),
            notes=tuple(notes),
        )

    def _shortfalls(self) -> list[rebalance.Shortfall]:
        found = []
        racks = ", or the partition would lose a rack" if self.levels else ""
        limited = self.limit is not None and any(count >= self.limit for count in self.moved.values())
        measures: tuple[tuple[str, Callable[[int], int], int, int], ...] = (
            ("replicas", lambda spu_id: len(self.holdings[spu_id]), self.floor, self.ceiling),
            ("leaders", lambda spu_id: self.leaders[spu_id], self.leader_floor, self.leader_ceiling),
        )
        for kind, count_of, floor, ceiling in measures:
            for spu_id in self.counted:
                count = count_of(spu_id)
                leaving = spu_id in self.cluster.decommissioning
                low, high = (0, 0) if leaving else (floor, ceiling)
                if low <= count <= high:
                    continue
                if kind == "replicas" and limited and self.limit is not None and self.moved[spu_id] >= self.limit:
                    reason = f"maxMovesPerSpu {self.limit} reached: plan again once these moves are done"
                elif kind == "replicas" and limited:
                    reason = (
                        f"the SPUs it could trade replicas with reached maxMovesPerSpu {self.limit}: "
                        "plan again once these moves are done"
                    )
                elif kind == "replicas" and leaving:
                    stuck = [self.cluster.names[index] for index in self.givable[spu_id]]
                    reason = (
                        f"decommissioning, but its replicas of {_names(stuck)} may go to no SPU that takes replicas: "
                        f"each already holds the partition{racks}"
                    )
                elif kind == "replicas" and count > high:
                    reason = (
                        "none of its replicas may go to an SPU below its target: each such SPU already holds "
                        f"the partition{racks}"
                    )
                elif kind == "replicas":
                    reason = f"no SPU above its target has a replica that may come here: it holds the partition already{racks}"
                elif count > high:
                    reason = "no other replica of the partitions it leads is on an SPU that may lead more (online, below its target)"
                else:
                    reason = "it holds no replica of a partition led by an SPU with leaderships to spare"
                found.append(rebalance.Shortfall(spu_id, kind, count, low, high, reason))
        return found


def _load(rows: tuple[tuple[int, ...], ...] | list[list[int]], ids: list[int]) -> rebalance.Load:
    replicas = dict.fromkeys(ids, 0)
    leaders = dict.fromkeys(ids, 0)
    for row in rows:
        leaders[row[0]] += 1
        for spu_id in row:
            replicas[spu_id] += 1
    return rebalance.Load(replicas=replicas, leaders=leaders)


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
