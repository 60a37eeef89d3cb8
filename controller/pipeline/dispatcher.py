"""The action dispatcher and the KV updater: the only code that writes controller decisions.

A work queue keyed by object: one action in flight per key, a newer action replaces the queued
one, `Conflict` hands the key back to its controller, `Unavailable` and a terminal failure back off
per key. Ready actions with disjoint keys are batched into one etcd transaction (at most 128
operations, and within the store's request size limit).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from controller import metrics as metrics_module
from controller.reconcile import actions
from store import kv, local, models

log = structlog.get_logger(__name__)

MIN_RETRY_WAIT = 0.001  # seconds: asyncio's timers are not finer than this


class Outcome(str, enum.Enum):
    APPLIED = "applied"
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    # Terminal: the store refused the action itself (malformed, or too large for any request).
    # Logged, not retried; its key backs off, so a controller deciding it again waits.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Result:
    action: actions.Action
    outcome: Outcome
    revision: int = 0  # APPLIED: the commit revision; CONFLICT: the key's actual revision
    detail: str = ""


ResultHook = Callable[[Result], None]


class KvUpdater:
    """Turns a batch of actions into one compare-and-swap transaction."""

    def __init__(
        self, kv_store: kv.KVStore, metrics: metrics_module.Metrics, echoes: local.Echoes | None = None
    ) -> None:
        self.kv_store = kv_store
        self.metrics = metrics
        self.echoes = echoes

    async def apply(self, batch: Sequence[actions.Action]) -> int:
        compares: list[kv.Compare] = []
        operations: list[kv.Operation] = []
        echoes = self.echoes
        for action in batch:
            written = {obj.key: obj for obj in action.objects} if echoes is not None and action.objects else None
            for write in action.writes:
                if write.expected_revision is not None:
                    compares.append(kv.Compare(write.key, write.expected_revision))
                if write.value is None:
                    operations.append(kv.Delete(write.key))
                    continue
                operations.append(kv.Put(write.key, write.value))
                if echoes is not None and written is not None and (obj := written.get(write.key)) is not None:
                    echoes.expect(write.key, write.value, obj)
        try:
            with self.metrics.etcd_request("txn"):
                return await self.kv_store.txn(compares, operations)
        except BaseException:
            if echoes is not None:  # not applied (or maybe not): the events, if any, get decoded
                for operation in operations:
                    echoes.forget(operation.key)
            raise


class ActionDispatcher:
    def __init__(
        self,
        updater: KvUpdater,
        metrics: metrics_module.Metrics,
        # 16 x 128 writes: a failover that moves 2,000 leaderships (one SPU of 50 at 100,000
        # partitions) sends every election at once; with 8, the second half waited until the
        # first half's watch events had been taken in (~300 ms).
        max_batches_in_flight: int = 16,
        max_batch_writes: int = kv.MAX_TXN_WRITES,
        initial_backoff: float = 0.1,
        max_backoff: float = 5.0,
    ) -> None:
        self.updater = updater
        self.metrics = metrics
        self.max_batches_in_flight = max_batches_in_flight
        self.max_batch_writes = max_batch_writes
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._queued: dict[str, actions.Action] = {}
        # Each queued action's bytes in a transaction, and what one transaction may hold.
        self._request_size = kv.request_size(updater.kv_store)
        self._bytes: dict[str, int] = {}
        self._in_flight_keys: set[str] = set()
        self._in_flight_writes: set[str] = set()
        self._queued_writes: collections.Counter[str] = collections.Counter()
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        # Keys whose action failed inside a shared batch: retried alone to find the culprit.
        self._isolated: set[str] = set()
        self._hooks: list[ResultHook] = []
        self._wake = asyncio.Event()
        self._batches: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ for controllers

    def on_result(self, hook: ResultHook) -> None:
        self._hooks.append(hook)

    def submit(self, action: actions.Action) -> None:
        """Queue ``action``; replaces a queued (not in-flight) action for the same key."""
        if len(action.writes) > self.max_batch_writes:
            raise ValueError(f"action {action.key} has {len(action.writes)} writes, above {self.max_batch_writes}")
        self._dequeue(action.key)
        self._enqueue(action)
        self._idle.clear()
        self.metrics.action_queue_depth.set(len(self._queued))
        self._wake.set()

    def busy(self, key: str) -> bool:
        """True while an action for ``key`` is queued or being written."""
        return key in self._queued or key in self._in_flight_keys

    def writing(self, key: str) -> bool:
        """True while some in-flight or queued action writes ``key`` (not only as its queue key)."""
        return key in self._in_flight_writes or key in self._queued_writes

    @property
    def depth(self) -> int:
        return len(self._queued)

    async def drained(self) -> None:
        """Wait until nothing is queued or in flight (used by a graceful shutdown)."""
        await self._idle.wait()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Until cancelled, which cancels the writes in flight. After a crash the supervisor calls it
        again: the queue is data and stays; the writes in flight go on and report as usual."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._wake.clear()
                now = loop.time()
                while len(self._batches) < self.max_batches_in_flight:
                    batch = self._take_batch(now)
                    if not batch:
                        break
                    task = asyncio.create_task(self._write(batch))
                    self._batches.add(task)
                self._update_idle()
                delay = self._next_retry_delay(now)
                # asyncio.timeout, not wait_for: on Python 3.11 a wait_for cancelled in the turn its
                # wait completes drops the cancel, and a term's end would never finish.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        except asyncio.CancelledError:
            for task in list(self._batches):
                task.cancel()
            await asyncio.gather(*self._batches, return_exceptions=True)
            raise

    def _take_batch(self, now: float) -> list[actions.Action]:
        batch: list[actions.Action] = []
        batch_keys: set[str] = set()
        writes = 0
        room = self._request_size.budget
        in_flight_keys, in_flight_writes, not_before = self._in_flight_keys, self._in_flight_writes, self._not_before
        for key, action in self._queued.items():  # changed only after this loop
            if key in in_flight_keys or (not_before and not_before.get(key, 0.0) > now):
                continue
            action_writes = action.write_keys
            if any(write in batch_keys or write in in_flight_writes for write in action_writes):
                continue
            size = self._bytes[key]
            if key in self._isolated or size > self._request_size.budget:
                # Alone: a suspect of a failed batch, or too large for any transaction (the store
                # refuses it, and it must take nothing down with it).
                if batch:
                    continue
                batch.append(action)
                batch_keys.update(action_writes)
                break
            if writes + len(action_writes) > self.max_batch_writes or size > room:
                break
            batch.append(action)
            batch_keys.update(action_writes)
            writes += len(action_writes)
            room -= size
        for action in batch:
            self._dequeue(action.key)
            self._in_flight_keys.add(action.key)
        self._in_flight_writes |= batch_keys
        self.metrics.action_queue_depth.set(len(self._queued))
        return batch

    def _next_retry_delay(self, now: float) -> float | None:
        waiting = [self._not_before.get(key, 0.0) for key in self._queued if key not in self._in_flight_keys]
        if not waiting or len(self._batches) >= self.max_batches_in_flight:
            return None
        delay = min(waiting) - now
        # Not below the loop's timer resolution: a shorter wait could end on a clock that has not
        # reached the key's time yet, and the loop would spin until it does.
        return 0.0 if delay <= 0 else max(delay, MIN_RETRY_WAIT)

    def _update_idle(self) -> None:
        if not self._queued and not self._in_flight_keys:
            self._idle.set()
        else:
            self._idle.clear()

    async def _write(self, batch: list[actions.Action]) -> None:
        results: list[Result] = []
        try:
            revision = await self.updater.apply(batch)
            results = [Result(action, Outcome.APPLIED, revision) for action in batch]
        except kv.Conflict as conflict:
            # Compares lost: their actions go back to their controllers, all at once (the store
            # names every failed compare); the others were not applied (all or nothing) and are
            # retried at once unless something newer is queued.
            stale = {key: (expected, actual) for key, expected, actual in conflict.failed}
            for action in batch:
                lost = next((key for key in action.write_keys if key in stale), None)
                if lost is not None:
                    expected, actual = stale[lost]
                    detail = str(kv.Conflict(lost, expected, actual))
                    results.append(Result(action, Outcome.CONFLICT, actual, detail))
                else:
                    self._requeue(action)
        except kv.Unavailable as unavailable:
            for action in batch:
                self._requeue(action, backoff=True)
            results = [Result(action, Outcome.UNAVAILABLE, 0, str(unavailable)) for action in batch]
            # A full etcd refuses every batch at once until an operator frees it: the store logs
            # that, with the remedy, once a minute; a line per batch would only bury it.
            say = log.debug if isinstance(unavailable, kv.NoSpace) else log.warning
            say(
                "store unavailable, actions kept and retried with backoff",
                actions=len(batch), keys=[action.key for action in batch[:5]], error=str(unavailable),
            )
        except Exception as error:
            # A store refusal, or a bug (ours or a library's): either way its actions get a result.
            unexpected = not isinstance(error, kv.StoreError | ValueError)
            if len(batch) > 1:
                # Find the culprit: a bad action must not drop the whole batch.
                for action in batch:
                    self._requeue(action, isolate=True)
            else:
                detail = f"{type(error).__name__}: {error}" if unexpected else str(error)
                results = [Result(batch[0], Outcome.FAILED, 0, detail)]
                log.error(
                    "action failed", key=batch[0].key, verb=batch[0].verb.value, error=detail, exc_info=unexpected,
                    **_object_of(batch[0]),
                )
                self._back_off(batch[0].key)
        finally:
            for action in batch:
                self._in_flight_keys.discard(action.key)
                if len(batch) == 1:
                    self._isolated.discard(action.key)
            for action in batch:
                self._in_flight_writes.difference_update(action.write_keys)
            for result in results:
                self._report(result)
            # Free the slot before waking the loop (a done-callback would run only after the
            # loop has already looked, leaving it asleep with work queued).
            current = asyncio.current_task()
            if current is not None:
                self._batches.discard(current)
            self._wake.set()

    def _requeue(self, action: actions.Action, backoff: bool = False, isolate: bool = False) -> None:
        if action.key in self._queued:
            return  # a newer decision for this key is already waiting
        self._enqueue(action)
        if backoff:
            self._back_off(action.key)
        if isolate:
            self._isolated.add(action.key)

    def _back_off(self, key: str) -> None:
        """The key's next action waits, twice as long after each failure in a row (capped)."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(self.max_backoff, self.initial_backoff * 2 ** (failures - 1))
        self._not_before[key] = asyncio.get_running_loop().time() + delay

    def _enqueue(self, action: actions.Action) -> None:
        self._queued[action.key] = action
        self._queued_writes.update(action.write_keys)
        self._bytes[action.key] = self._action_bytes(action)

    def _action_bytes(self, action: actions.Action) -> int:
        return self._request_size.writes_bound(len(action.writes), action.key_bytes, action.value_bytes)

    def _dequeue(self, key: str) -> None:
        action = self._queued.pop(key, None)
        if action is not None:
            del self._bytes[key]
            self._queued_writes.subtract(action.write_keys)
            for write_key in action.write_keys:
                if self._queued_writes[write_key] <= 0:
                    del self._queued_writes[write_key]

    def _report(self, result: Result) -> None:
        action = result.action
        if result.outcome is Outcome.APPLIED or result.outcome is Outcome.CONFLICT:
            self._failures.pop(action.key, None)
            self._not_before.pop(action.key, None)
        self.metrics.action_done(action, result.outcome.value)  # elections also count by cause
        if result.outcome is Outcome.APPLIED:
            extra = {"cause": action.cause} if action.cause else {}
            log.info(
                "action applied", key=action.key, verb=action.verb.value, reason=action.reason, revision=result.revision, **extra
            )
        elif result.outcome is Outcome.CONFLICT:
            # Routine (the controller re-decides from the newer value), so below info.
            log.debug("action conflict", key=action.key, verb=action.verb.value, reason=action.reason, detail=result.detail)
        for hook in self._hooks:
            try:
                hook(result)
            except Exception:
                # A bug in one listener's bookkeeping must not cost the others their result, nor
                # this batch its slot (taken for good, all of them stall every write).
                log.exception("action result hook failed", key=action.key, hook=getattr(hook, "__qualname__", repr(hook)))


def _object_of(action: actions.Action) -> dict[str, str]:
    """The object an action is about, for its log line, when its queue key does not say it (a
    topic's provisioning is queued under the placement chain's key); a provision of several topics
    names them joined, so the field is cut to 200 characters."""
    key = models.object_key(action.kind, action.name)
    return {} if key == action.key else {"object": key[:200]}
