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
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from store import embedded_etcd, etcd, kv
from tests.builders import eventually
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
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def proxied_store(
    server: embedded_etcd.EmbeddedEtcd, prefix: str
) -> AsyncIterator[tuple[tcp_proxy.TcpProxy, etcd.EtcdStore]]:
    """A store that reaches the session's etcd through a fault-injecting proxy."""
    async with tcp_proxy.TcpProxy(server.host, server.client_port) as proxy:
        async with store_on(proxy.endpoint, prefix) as store:
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
    its header; resuming from that header would skip the rest of the replay. This etcd fsyncs, so
    the kill loses no acknowledged write and the watch owes exactly every write made."""
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
    async with contextlib.aclosing(etcd_store.watch("replay/", start)) as events:
        async with asyncio.timeout(30):
            async for event in events:
                received.append(event)
                if len(received) == 10:
                    etcd_server.kill()
                    etcd_server.start()
                if len(received) == len(written):
                    break
    assert [(event.revision, event.key) for event in received] == written
    assert {event.value for event in received} == {value}
    assert "broke" in caplog.text, "etcd was killed after the whole replay was buffered: test proves nothing"


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
        assert all(seconds < 3 * request_timeout for seconds in elapsed.values()), elapsed
        # The same store works again once etcd is back.
        assert await store.get("topics/a") is None
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
    with pytest.raises(kv.Unavailable) as raised:
        await etcd.EtcdStore.open([f"127.0.0.1:{port}"], request_timeout=0.3)
    assert f"127.0.0.1:{port}" in str(raised.value)
    assert "UNAVAILABLE" in str(raised.value)


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
    second = embedded_etcd.EmbeddedEtcd(etcd_server.data_dir, *embedded_etcd.free_ports(2))
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
    server = embedded_etcd.EmbeddedEtcd(tmp_path, *embedded_etcd.free_ports(2), startup_timeout=0.01)
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
    server = embedded_etcd.EmbeddedEtcd(tmp_path, *embedded_etcd.free_ports(2), extra_args=("--unsafe-no-fsync",))
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
    request: etcd answers "request is too large" (INVALID_ARGUMENT), a ValueError at once (a retry
    until the deadline would end as Unavailable)."""
    store = await etcd.EtcdStore.open(
        etcd_server.endpoints, prefix="/sc-test/too-large/", request_timeout=REQUEST_TIMEOUT, max_request_bytes=2 * 1024 * 1024
    )
    try:
        with pytest.raises(ValueError, match="request is too large"):
            await store.txn([], [kv.Put("topics/big", b"x" * (kv.DEFAULT_MAX_REQUEST_BYTES + 1024))])
        assert await store.get("topics/big") is None
    finally:
        await store.close()
