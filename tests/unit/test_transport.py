"""The listening ports' policy (connection_manager/transport.py): limits derived from the open-file
limit, per-address slots, the buffered-bytes budget, the collection after abandoned requests, the
open-file limit raised to the hard limit (in a subprocess: it is process-wide), and the listen
backlog and accept loop (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from connection_manager import transport
from controller import config


@pytest.mark.parametrize(
    ("file_limit", "given", "expected"),
    [
        # 1,024 (a common default): 256 kept back, 80% of the 768 left to the public port.
        (1024, (None, None, None), transport.ConnectionLimits(public=614, private=154, per_address=153)),
        # The machine: 20,000 descriptors; the public share is capped at 10,000.
        (20_000, (None, None, None), transport.ConnectionLimits(public=10_000, private=3_949, per_address=2_500)),
        (1 << 20, (None, None, None), transport.ConnectionLimits(public=10_000, private=4_096, per_address=2_500)),
        # A small limit keeps a quarter of it back.
        (256, (None, None, None), transport.ConnectionLimits(public=153, private=39, per_address=38)),
        # Given limits are kept as given.
        (1024, (50, 7, 3), transport.ConnectionLimits(public=50, private=7, per_address=3)),
        (1024, (40, None, None), transport.ConnectionLimits(public=40, private=154, per_address=10)),
    ],
)
def test_limits_are_derived_from_the_open_file_limit_unless_given(
    file_limit: int, given: tuple[int | None, int | None, int | None], expected: transport.ConnectionLimits
) -> None:
    assert transport.derive_limits(file_limit, *given) == expected


def test_a_port_refuses_beyond_its_limit_and_beyond_an_addresses_share() -> None:
    port = transport.Port(transport.PUBLIC, transport.Limits(connections=3, per_address=2))
    assert [port.admit("10.0.0.1"), port.admit("10.0.0.1"), port.admit("10.0.0.1")] == [True, True, False]
    assert [port.admit("10.0.0.2"), port.admit("10.0.0.3")] == [True, False]
    assert (port.stats.open, port.by_address) == (3, {"10.0.0.1": 2, "10.0.0.2": 1})
    assert port.stats.refused == {**dict.fromkeys(transport.REASONS, 0), transport.LIMIT: 1, transport.PER_ADDRESS_LIMIT: 1}
    port.release("10.0.0.1")
    port.release("10.0.0.2")
    assert (port.stats.open, port.by_address) == (1, {"10.0.0.1": 1})
    assert port.admit("10.0.0.3") is True


async def test_large_bodies_wait_for_room_in_the_budget_and_small_ones_never_do() -> None:
    budget = transport.Budget(capacity=10 * transport.SMALL_BODY_BYTES)
    big = 6 * transport.SMALL_BODY_BYTES
    order: list[str] = []
    first_in = asyncio.Event()
    first_may_leave = asyncio.Event()

    async def body(name: str, size: int, held: asyncio.Event | None = None, leave: asyncio.Event | None = None) -> None:
        async with budget.hold(size):
            order.append(f"{name} in ({budget.held})")
            if held is not None:
                held.set()
            if leave is not None:
                await leave.wait()
        order.append(f"{name} out")

    first = asyncio.create_task(body("first", big, first_in, first_may_leave))
    await first_in.wait()
    second = asyncio.create_task(body("second", big))
    await body("small", transport.SMALL_BODY_BYTES)  # not counted, never waits
    await asyncio.sleep(0.01)
    assert not second.done()
    first_may_leave.set()
    await asyncio.gather(first, second)
    assert order == [f"first in ({big})", f"small in ({big})", "small out", "first out", f"second in ({big})", "second out"]
    assert budget.held == 0


async def test_one_body_larger_than_the_budget_still_fits_alone() -> None:
    budget = transport.Budget(capacity=transport.SMALL_BODY_BYTES + 1)
    async with budget.hold(100 * transport.SMALL_BODY_BYTES):
        assert budget.held == 100 * transport.SMALL_BODY_BYTES
    assert budget.held == 0


# The loop's clock is looptime's: a busy machine pausing the test between two calls must not
# end the interval between them.
@pytest.mark.looptime
async def test_garbage_from_failed_requests_brings_a_full_collection_at_most_once_an_interval() -> None:
    port = transport.Port(transport.PUBLIC, transport.Limits(connections=10, per_address=10))
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        port.garbage(transport.COLLECT_AFTER_BYTES - 1)
        assert (port.stats.collections, collections) == (0, [])
        port.garbage(1)
        assert (port.stats.collections, collections) == (1, [2])
        port.garbage(transport.COLLECT_AFTER_BYTES)
        assert port.stats.collections == 1  # within the interval: none more
        abandoned = transport.COLLECT_AFTER_BYTES // transport.ABANDONED_GARBAGE_BYTES
        for _ in range(abandoned):
            port.abandoned(1000)
        assert (port.stats.abandoned_requests, port.stats.abandoned_bytes) == (abandoned, 1000 * abandoned)
        await asyncio.sleep(transport.COLLECT_INTERVAL)
        port.abandoned(1000)
        assert (port.stats.collections, collections) == (2, [2, 2])
    finally:
        gc.callbacks.remove(count)


RAISE_FILE_LIMIT = """
import resource
from connection_manager import transport
from controller import config
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 512))
print(transport.raise_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit() -> None:
    done = subprocess.run([sys.executable, "-c", RAISE_FILE_LIMIT], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split("\n")[0] == "512 (512, 512)"


def test_the_defaults_are_the_settings_defaults() -> None:
    defaults = config.Settings()
    assert transport.Timeouts() == transport.Timeouts(
        defaults.client_header_timeout, defaults.client_body_timeout, defaults.client_idle_timeout
    )
    assert transport.Limits(1, 1).buffered_bytes == defaults.max_buffered_request_bytes


# The loop's clock is looptime's: a busy machine pausing the test between two calls must not
# end the interval between them.
@pytest.mark.looptime
async def test_garbage_left_within_the_interval_is_collected_when_it_ends_without_another_failure() -> None:
    """The last clients of an attack abandon within the interval of the previous collection: their
    buffers must not wait for some later failure to be given back (the RSS stayed 70 MB up)."""
    port = transport.Port(transport.PUBLIC, transport.Limits(connections=10, per_address=10))
    trimmed: list[int] = []
    port.garbage(transport.COLLECT_AFTER_BYTES)
    assert port.stats.collections == 1
    port.garbage(transport.COLLECT_AFTER_BYTES)
    assert port.stats.collections == 1  # within the interval: not now...
    deadline = asyncio.get_running_loop().time() + 10 * transport.COLLECT_INTERVAL
    while port.stats.collections == 1 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    trimmed.append(port.stats.collections)
    assert trimmed == [2]  # ...but once it has passed, with nothing else happening
    await asyncio.sleep(transport.COLLECT_INTERVAL)
    assert port.stats.collections == 2  # and only once
@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"4096\n", 4096), (b"65535\n", 65535), (b"128\n", 128), (b"", transport.FALLBACK_BACKLOG), (b"-1\n", transport.FALLBACK_BACKLOG),
     (b"lots\n", transport.FALLBACK_BACKLOG), (b"99999999999999999999\n", transport.FALLBACK_BACKLOG), (None, transport.FALLBACK_BACKLOG)],
)
def test_the_listen_backlog_is_the_systems_largest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes | None, expected: int
) -> None:
    somaxconn = tmp_path / "somaxconn"
    if content is not None:
        somaxconn.write_bytes(content)
    monkeypatch.setattr(transport, "SOMAXCONN_PATH", str(somaxconn))
    assert transport.listen_backlog() == expected


# More than the backlog the ports had (1,024), and few enough descriptors for a default limit of 4,096.
BURST = 1500


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (Linux's struct tcp_info starts with it: 1 established, 2 SYN sent)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@contextlib.contextmanager
def connecting(port_number: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` non-blocking connects to 127.0.0.1:``port_number``; closed at the end."""
    clients: list[socket.socket] = []
    try:
        for _ in range(count):
            client = socket.socket()
            clients.append(client)
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(("127.0.0.1", port_number))
        yield clients
    finally:
        for client in clients:
            client.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the TCP state from Linux's TCP_INFO")
async def test_a_burst_of_connections_waits_in_the_listen_queue_instead_of_being_dropped() -> None:
    """The kernel queues as many connections as somaxconn allows before the loop accepts any: a
    connection it cannot queue has its SYN dropped, and its client waits a second to send it again."""
    soft_limit = transport.file_limit()
    if soft_limit < BURST + 256:
        pytest.skip(f"needs {BURST + 256} open files, the limit is {soft_limit}")
    port = transport.Port(transport.PUBLIC, transport.Limits(connections=BURST, per_address=BURST))
    listener = await transport.Listener.open(port, "127.0.0.1", 0, lambda first: None)
    try:
        assert listener.backlog == transport.listen_backlog()
        queued = min(BURST, listener.backlog + 1)  # Linux queues one more than the backlog
        # No await from here on: the loop accepts nothing meanwhile, the kernel's queue holds them.
        with connecting(listener.sockets[0].getsockname()[1], BURST) as clients:
            deadline = time.monotonic() + 5.0  # loopback connects complete at once; a dropped SYN waits 1 s, 3 s
            while (established := sum(tcp_state(client) == 1 for client in clients)) < queued and time.monotonic() < deadline:
                time.sleep(0.05)
            assert established == queued
    finally:
        listener.close()
        await listener.wait_closed()


@pytest.mark.parametrize(("waiting", "limit", "taken"), [(300, 1000, 300), (30, 5, 5)])
async def test_one_wake_up_accepts_every_connection_waiting_up_to_the_ports_limit(waiting: int, limit: int, taken: int) -> None:
    """A connection behind a burst is accepted at the next turn of the loop, not after the burst's
    size in turns; and no more than the port holds, which would evict those just accepted."""
    port = transport.Port(transport.PUBLIC, transport.Limits(connections=limit, per_address=limit))
    listener = await transport.Listener.open(port, "127.0.0.1", 0, lambda first: None)
    try:
        with connecting(listener.sockets[0].getsockname()[1], waiting):
            # The listener's wake-up runs once per turn, after this task's: at the first turn this
            # task sees anything open, exactly one wake-up has run.
            for _ in range(100):
                if port.stats.open:
                    break
                await asyncio.sleep(0)
            assert (port.stats.open, port.stats.refused[transport.EVICTED]) == (taken, 0)
    finally:
        listener.close()
        await listener.wait_closed()
