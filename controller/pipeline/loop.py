"""The level-triggered loop around a pure controller: wake, snapshot, decide, submit.

A wake-up only says "something changed"; the controller recomputes from the current snapshot.
Expectations keep it from re-deciding from a store that has not yet seen its own last write, and
a failed write's keys back off, so a refused action is not decided again in a hot loop.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from controller import metrics as metrics_module
from controller.pipeline import dispatcher as dispatcher_module
from controller.reconcile import actions, faults as faults_module
from store import local, models

log = structlog.get_logger(__name__)

# A controller: (snapshot, what changed per kind since its last pass) -> actions.
Decide = Callable[[local.Snapshot, local.ChangesByKind], Sequence[actions.Action]]

# After a key's write fails for good (Outcome.FAILED) it is busy for this long, doubling with each
# failure in a row: deciding it again costs what the decision costs (a placement can take 0.5 s),
# and the store would refuse the same write the same way.
FAILURE_BACKOFF_INITIAL = 0.5
FAILURE_BACKOFF_MAX = 60.0
# Action keys whose last lost compare is remembered (see ControllerLoop._lost_to).
LOST_TO_LIMIT = 10_000
# Objects whose refused write is remembered (see ControllerLoop._refused).
REFUSED_LIMIT = 10_000
# Objects whose last fault is remembered, so that one failing again the same way is not logged
# at every pass (it is still counted).
FAULTS_REMEMBERED = 1_024


@dataclass(slots=True)
class _Failure:
    count: int  # failures in a row
    until: float  # loop time until which the key is busy


class ControllerLoop:
    def __init__(
        self,
        name: str,
        decide: Decide,
        listens_to: Mapping[str, local.Part],
        local_store: local.LocalStore,
        dispatcher: dispatcher_module.ActionDispatcher,
        metrics: metrics_module.Metrics,
        resync_interval: float = 60.0,
    ) -> None:
        self.name = name
        self.decide = decide
        self.local_store = local_store
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.resync_interval = resync_interval
        self.listens_to = dict(listens_to)
        # Made afresh by each run(): a new listener's first changes are everything, a full pass.
        self.listeners: dict[str, local.Listener[models.AnyObject]] = {}
        # Write key -> the revision the local store must reach before we decide on that key again.
        self._expected: dict[str, int] = {}
        # The same as a heap of (revision, key), so a pass forgets the caught-up keys without
        # looking at the others (a burst of creates keeps 10,000s in flight). An entry whose key
        # was since expected at a higher revision is dropped when it comes up.
        self._expecting: list[tuple[int, str]] = []
        # Expectations given up on, because the store lost the writes they wait for (etcd 3.5.1
        # killed just after acknowledging them, docs/limitations.md): the local store's fork count
        # last seen (LocalStore.forked), and the expectations open at the last resync pass (a
        # loss the Reader cannot see: an idle store never reaches the lost write's revision).
        self._forks = local_store.forks
        self._open_at_resync: list[tuple[str, int]] = []
        self._submitted: set[str] = set()
        # Objects whose action was set aside (its key busy, or its write lost a compare): they
        # count as changed in the first pass after their keys are free, so an incremental
        # controller looks at them again even when no listener reports them (the echo of a
        # write can reach the local store before the write's answer, or come from another loop).
        self._deferred: dict[tuple[str, str], tuple[str, ...]] = {}
        # Keys whose last write failed for good: busy until their backoff ends, and remembered
        # (for the next backoff, and so the controller writes them alone) until a write to them
        # is applied or someone else changes them.
        self._failures: dict[str, _Failure] = {}
        # Object key (``topics/orders``) -> the store's refusal of the last write about that object
        # alone (a write of several objects', such as a provision of several topics, is about
        # none of them), until a write about it is applied or the object changes: the controller
        # records it in the object's status, where an operator looks for why nothing happens.
        self._refused: dict[str, str] = {}
        # Action key -> the revision its last write lost to. Lost twice to the same revision,
        # the decision did not see that value (a value the Reader cannot decode never reaches
        # the local store): deciding again at once would lose again, so it backs off instead.
        self._lost_to: dict[str, int] = {}
        # Keys a controller left objects aside for on its own (outside the deferred ones): when
        # another loop's write to one of them is answered, this loop wakes to look at them.
        self.waiting_for: set[str] = set()
        self._now = 0.0  # the loop time of the current pass
        # Where the decision puts the objects whose step raised (faults.py), and the error last
        # logged for each.
        self.faults = faults_module.Faults(isolate=True)
        self._faulted: dict[tuple[str, str], str] = {}
        self._kick = asyncio.Event()
        self._kick.set()
        self.passes = 0
        # True during a pass woken by the resync timer rather than by a change or a kick.
        self.resyncing = False
        dispatcher.on_result(self._on_result)

    def busy(self, key: str) -> bool:
        """A write to ``key`` is in flight, its echo has not reached the local store yet, or its
        last write failed and its backoff has not ended."""
        if key in self._expected or self.dispatcher.writing(key):
            return True
        failure = self._failures.get(key) if self._failures else None
        return failure is not None and failure.until > self._now

    def failed(self, key: str) -> bool:
        """The last write to ``key`` failed for good (its backoff may have ended): write it alone,
        so that if it fails again it takes nothing down with it."""
        return key in self._failures

    def refusal(self, key: str) -> str:
        """The store's refusal of the last write about the object at ``key`` (a failed write's
        detail), or "" if none was refused since a write about it was applied."""
        return self._refused.get(key, "")

    def kick(self) -> None:
        """Recompute on the next turn (an outside change the listeners cannot see)."""
        self._kick.set()

    async def run(self) -> None:
        """Until cancelled. Each call starts clean (after a crash, the supervisor calls it again):
        fresh listeners and a full first pass; writes in flight keep their expectations."""
        self.listeners = {kind: self.local_store[kind].listener(part) for kind, part in self.listens_to.items()}
        self._kick.set()
        try:
            while True:
                self.resyncing = await self._wait()
                self.run_pass()
        finally:
            for listener in self.listeners.values():
                listener.close()

    def run_pass(self) -> None:
        """One decision: everything between here and the submits runs without awaiting."""
        self._kick.clear()
        changes = {kind: listener.changes() for kind, listener in self.listeners.items()}
        self._forget_caught_up()
        loop = asyncio.get_running_loop()
        started = self._now = loop.time()
        if self._failures or self._refused:
            self._forget_changed_failures(changes)
        snapshot = self.local_store.snapshot()
        if self.resyncing and (self._expected or self._open_at_resync):
            self._forget_overdue()
        if self._deferred:
            changes = self._with_deferred(changes, snapshot)
        self.faults.take()  # a pass that raised as a whole left its faults behind
        decided = self.decide(snapshot, changes)
        self._report_faults()
        self.passes += 1
        self.metrics.reconcile_passes.labels(self.name).inc()
        self.metrics.reconcile_seconds.labels(self.name).observe(loop.time() - started)
        for action in decided:
            if any(self.busy(key) for key in action.write_keys):
                # Decided from a store behind a write to the same key: decide again once free.
                self._defer(action)
                continue
            self._submitted.add(action.key)
            self.dispatcher.submit(action)

    def _report_faults(self) -> None:
        """Count each object whose decision raised; log it when its error is new."""
        for fault in self.faults.take():
            self.metrics.reconcile_faults.labels(self.name, fault.kind).inc()
            said = f"{type(fault.error).__name__}: {fault.error}"
            if self._faulted.get((fault.kind, fault.name)) == said:
                continue
            if len(self._faulted) >= FAULTS_REMEMBERED:
                self._faulted.clear()
            self._faulted[(fault.kind, fault.name)] = said
            log.error(
                "a decision raised: this object is left as it is until it, or what it depends on, "
                "changes (or the next full pass); the others go on",
                controller=self.name,
                kind=fault.kind,
                name=fault.name,
                error=said,
                exc_info=fault.error,
            )

    def _defer(self, action: actions.Action) -> None:
        # A provision spans several topics, and pending topics are looked at on every pass.
        if action.kind in self.listens_to and action.verb is not actions.Verb.PROVISION:
            self._deferred[(action.kind, action.name)] = tuple(action.write_keys)

    def _with_deferred(self, changes: dict[str, local.Changes[Any]], snapshot: local.Snapshot) -> dict[str, local.Changes[Any]]:
        """``changes`` plus the deferred objects whose keys are free now (as updated, or deleted)."""
        ready: dict[str, list[str]] = {}
        for (kind, name), keys in list(self._deferred.items()):
            if not any(self.busy(key) for key in keys):
                del self._deferred[(kind, name)]
                ready.setdefault(kind, []).append(name)
        for kind, names in ready.items():
            change = changes[kind]
            if change.full:
                continue  # everything is looked at anyway
            table = snapshot.entries(kind)
            seen = {entry.name for entry in change.updated} | set(change.deleted)
            fresh = sorted(name for name in names if name not in seen)
            changes[kind] = local.Changes(
                full=False,
                updated=[*change.updated, *(table[name] for name in fresh if name in table)],
                deleted=[*change.deleted, *(name for name in fresh if name not in table)],
                epoch=change.epoch,
            )
        return changes

    async def _wait(self) -> bool:
        """Until a change, a kick, a failed key's backoff ending or the resync timer; True if it
        was the resync timer."""
        waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(listener.wait()) for listener in self.listeners.values()]
        waiters.append(asyncio.ensure_future(self._kick.wait()))
        loop = asyncio.get_running_loop()
        timeout = self.resync_interval
        now = loop.time()
        backoffs = [failure.until - now for failure in self._failures.values() if failure.until > now]
        if backoffs and min(backoffs) < timeout:
            timeout = max(min(backoffs), 0.001)  # not below the loop's timer resolution
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done and timeout < self.resync_interval:
                return False  # a backoff ended: a pass like any other (the deferred come back)
            return not done
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    def _on_result(self, result: dispatcher_module.Result) -> None:
        action = result.action
        if action.key not in self._submitted:
            # Another loop's write: it may free a key one of ours was set aside for.
            if self.waiting_for and any(key in self.waiting_for for key in action.write_keys):
                self.kick()
            elif self._deferred and any(
                key in keys for keys in self._deferred.values() for key in action.write_keys
            ):
                self.kick()
            return
        self._submitted.discard(action.key)
        if result.outcome is not dispatcher_module.Outcome.CONFLICT and self._lost_to:
            self._lost_to.pop(action.key, None)
        if result.outcome is dispatcher_module.Outcome.APPLIED:
            if self._refused:
                self._refused.pop(models.object_key(action.kind, action.name), None)
            for key in action.write_keys:
                self._expect(key, result.revision)
                if self._failures:
                    self._failures.pop(key, None)
        elif result.outcome is dispatcher_module.Outcome.CONFLICT:
            if result.revision:
                for key in action.write_keys:
                    self._expect(key, result.revision)
            if result.revision and self._lost_to.get(action.key) == result.revision:
                delay = self._back_off(action)
                log.warning(
                    "a write lost twice to a value this SC does not see (malformed?): decided again after a backoff",
                    controller=self.name, key=action.key, revision=result.revision, detail=result.detail, backoff=delay,
                )
            if len(self._lost_to) >= LOST_TO_LIMIT:
                self._lost_to.clear()  # forgetting costs one more lost write before a backoff
            self._lost_to[action.key] = result.revision
            self._defer(action)  # decided again once the store has the value that won
        elif result.outcome is dispatcher_module.Outcome.FAILED:
            delay = self._back_off(action)
            log.warning("failed action decided again after a backoff", controller=self.name, key=action.key, backoff=delay)
            if _about_one(action):
                if len(self._refused) >= REFUSED_LIMIT:
                    self._refused.clear()  # forgotten, a refusal is said again at its write's next try
                self._refused[models.object_key(action.kind, action.name)] = result.detail
            self._defer(action)  # decided again once its backoff ends
        self.kick()

    def _back_off(self, action: actions.Action) -> float:
        """Make the action's objects busy for their next backoff; the longest delay."""
        now = asyncio.get_running_loop().time()
        # A queue key that is also written is shared by many objects' actions (the placement
        # chain): the objects are to blame, not it.
        blamed = [key for key in action.write_keys if key != action.queue_key]
        delay = 0.0
        for key in blamed:
            previous = self._failures.get(key)
            count = 1 if previous is None else previous.count + 1
            key_delay = min(FAILURE_BACKOFF_MAX, FAILURE_BACKOFF_INITIAL * 2 ** (count - 1))
            self._failures[key] = _Failure(count, now + key_delay)
            delay = max(delay, key_delay)
        return delay

    def _forget_changed_failures(self, changes: local.ChangesByKind) -> None:
        """Someone else changed (or deleted) an object whose write failed: decide it afresh (and
        forget what the store refused about it: what it says may no longer hold)."""
        for kind, change in changes.items():
            # A relist says nothing about one object, except that those it names deleted were
            # deleted and created again.
            if not change.full:
                for entry in change.updated:
                    key = models.object_key(kind, entry.name)
                    self._failures.pop(key, None)
                    self._refused.pop(key, None)
            for name in change.deleted:
                key = models.object_key(kind, name)
                self._failures.pop(key, None)
                self._refused.pop(key, None)

    def _expect(self, key: str, revision: int) -> None:
        if self.local_store.forks != self._forks:
            self._forget_lost()  # first: this write's answer came after the relist
        if revision > self._expected.get(key, 0):
            self._expected[key] = revision
            heapq.heappush(self._expecting, (revision, key))

    def _forget_caught_up(self) -> None:
        if self.local_store.forks != self._forks:
            self._forget_lost()
        revision = self.local_store.revision
        expecting, expected = self._expecting, self._expected
        while expecting and expecting[0][0] <= revision:
            at, key = heapq.heappop(expecting)
            if expected.get(key) == at:
                del expected[key]

    def _forget_overdue(self) -> None:
        """At a resync pass: forget the expectations already open at the previous one. An echo
        comes within milliseconds; one still missing after a whole resync interval of quiet is of
        a write the store lost, and waiting longer would keep its object from being decided.
        Forgetting is safe: a write decided from a store that is merely behind loses its compare."""
        expected = self._expected
        overdue = [(key, revision) for key, revision in self._open_at_resync if expected.get(key) == revision]
        if overdue:
            self._drop_expected([key for key, _ in overdue])
            log.warning(
                "writes whose echo never came are no longer waited for: decided again",
                controller=self.name, keys=len(overdue), revisions=sorted({revision for _, revision in overdue})[:10],
                store_revision=self.local_store.revision,
            )
        self._open_at_resync = list(expected.items())

    def _forget_lost(self) -> None:
        """The Reader relisted a store that lost writes it had acknowledged (LocalStore.forked):
        the writes answered at a later revision than that listing are not waited for. (One answered
        between the listing and the relist's end may be dropped too: its object is then decided
        before its echo, and that write loses its compare.)"""
        self._forks = self.local_store.forks
        revision = self.local_store.forked_at
        gone = [key for key, at in self._expected.items() if at > revision]
        if gone:
            self._drop_expected(gone)
            log.warning(
                "the store lost writes it had acknowledged: the ones answered after its listing are no longer waited for",
                controller=self.name, keys=len(gone), listed_revision=revision,
            )

    def _drop_expected(self, keys: list[str]) -> None:
        """Stop waiting for the echoes of ``keys`` (the heap keeps only what is still expected)."""
        expected = self._expected
        for key in keys:
            del expected[key]
        self._expecting = [(at, key) for at, key in self._expecting if expected.get(key) == at]
        heapq.heapify(self._expecting)


def _about_one(action: actions.Action) -> bool:
    """Whether ``action`` is about the one object its kind and name say: not a provision of several
    topics (named by their names joined), whose refusal may be any one of theirs."""
    return sum(1 for obj in action.objects if obj.kind == action.kind) <= 1
