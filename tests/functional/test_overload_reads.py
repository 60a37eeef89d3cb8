"""The Overload issue's expensive reads and watchers against a real `sc run` (its own process, on the
memory store and on a real etcd) with three live simulator SPUs, on a small scale with small limits:
every list answers in full or 429 with Retry-After, /healthz answers within 1 s throughout (probed
from a process of its own), no SPU disconnects, memory stays within a bound and is given back, and
the service answers normally afterwards. bench/overload_reads.py runs the same at full scale.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bench import overload_reads
from store import embedded_etcd

TOPICS = 20
PARTITIONS_PER_TOPIC = 100
PARTITIONS = TOPICS * PARTITIONS_PER_TOPIC
SETTINGS = {
    "max_expensive_requests": "2",
    "max_expensive_queue": "4",
    "expensive_queue_seconds": "2",
    "watch_buffer_bytes": str(1024 * 1024),
    "client_stall_seconds": "2",
}
# Bounds, far above what the attacks below take (a few MB) and far below what they took before
# (every list its own copy of every object: 100 x 1 MB for the first attack alone).
PEAK_MEMORY_ABOVE_BASELINE = 100 * 2**20
MEMORY_KEPT_AFTER = 30 * 2**20
# Seconds. Before this work /healthz took 19 to 79 s under these attacks; the < 1 s target is
# bench/overload_reads.py's to hold (docs/benchmarks.md): here, on a machine shared with another
# test, a bound far from both.
HEALTH_WORST = 10.0


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
async def sc(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[overload_reads.Sc]:
    endpoints = None
    if request.param == "etcd":
        server: embedded_etcd.EmbeddedEtcd = request.getfixturevalue("etcd_server")
        if not server.running:
            server.start()
        endpoints = server.endpoints
    async with overload_reads.cluster(tmp_path, endpoints, TOPICS, PARTITIONS_PER_TOPIC, SETTINGS) as running:
        yield running


def partition_names(topic_numbers: range) -> list[str]:
    return [f"topic-{number:04d}-{index}" for number in topic_numbers for index in range(PARTITIONS_PER_TOPIC)]


def check_list(path: str, body: bytes) -> None:
    """A 200 is the whole listing, in order (checked on the answer itself, not trusted)."""
    names = [obj["name"] for obj in json.loads(body)]
    if "topic=" in path:
        number = int(path.rpartition("topic-")[2])
        assert names == partition_names(range(number, number + 1)), path
    else:
        assert names == partition_names(range(TOPICS)), path


def assert_unharmed(during: overload_reads.Figures, baseline: int, sc: overload_reads.Sc, health: bool = True) -> None:
    assert during.health, "the probe answered nothing"
    if health:
        # Probed on new connections (as a liveness probe does) and on a kept-alive one.
        assert during.health_worst() < HEALTH_WORST, f"/healthz took {during.health_worst():.2f} s"
        assert during.health_worst(kept=True) < HEALTH_WORST, f"/healthz took {during.health_worst(kept=True):.2f} s"
    assert during.spu_disconnects == 0, "\n".join(
        [during.row()]
        + [f"{path.name}:\n{path.read_text(errors='replace')[-3000:]}" for path in (sc.log_path, sc.spus_log_path) if path.exists()]
    )
    assert during.rss_peak - baseline < PEAK_MEMORY_ABOVE_BASELINE, (during.rss_peak, baseline)


async def test_lists_and_fluvio_lists_beyond_the_gate_are_refused_and_nothing_else_suffers(sc: overload_reads.Sc) -> None:
    # Three attacks of 100 connections each, one after the other: 300 connections at once would
    # overflow the listen backlog (128), and new connections would wait for the kernel to retry
    # their SYN (1 s, 3 s) whatever the SC does; connection limits are another part's business.
    baseline = sc.rss_bytes()
    distinct = tuple(f"/v1/partitions?topic=topic-{number:04d}" for number in range(TOPICS))
    async with overload_reads.measured(sc) as during:
        same = await overload_reads.lists_attack(sc.url, 100, check=check_list)
        different = await overload_reads.lists_attack(sc.url, 100, distinct, check=check_list)
        fluvio = await overload_reads.fluvio_lists_attack(sc.public_port, 100)
    assert set(same) <= {"200", "429 with Retry-After"} and same["200"] >= 1, same
    assert set(different) <= {"200", "429 with Retry-After"} and different["200"] >= 2, different
    assert set(fluvio) <= {"ok", "Busy"} and sum(fluvio.values()) == 100, fluvio
    assert_unharmed(during, baseline, sc)
    metrics = await sc.metrics()
    # The identical lists shared answers: far fewer were built than served.
    built = metrics['sc_list_answers_total{source="built"}']
    assert built < same["200"] + different["200"] + fluvio["ok"], metrics
    async with overload_reads.measured(sc) as after:
        await asyncio.sleep(overload_reads.SETTLE_SECONDS)
    assert after.rss_end - baseline < MEMORY_KEPT_AFTER, (after.rss_end, baseline)
    assert after.descriptors_end <= during.descriptors_peak and after.spu_disconnects == 0
    # Service as usual: every list answers in full.
    assert await overload_reads.lists_attack(sc.url, 3, check=check_list) == {"200": 3}


async def test_placements_run_off_the_loop_within_the_gate(sc: overload_reads.Sc) -> None:
    baseline = sc.rss_bytes()
    async with overload_reads.measured(sc) as during:
        outcomes = await overload_reads.placement_attack(sc.url, 10, 20_000, 8)
    assert set(outcomes) <= {"200", "429"} and outcomes["200"] >= 2, outcomes
    assert_unharmed(during, baseline, sc)
    assert (await sc.metrics())["sc_expensive_requests_running"] == 0


@pytest.mark.parametrize("sc", ["memory"], indirect=True)  # placement reads no store: one backend is enough
async def test_placement_bodies_of_millions_of_empty_arrays_do_not_stop_the_sc(sc: overload_reads.Sc) -> None:
    # A read credential may send 16 MiB. Parsed in the SC (even in a worker thread: the parser holds
    # the GIL), each such body held the event loop 3-20 s and over 300 MB; the placement worker
    # process takes them now, and the SC only holds the bodies.
    body = b'{"existing": [' + b"[]," * (5 * 2**20) + b"[]]}"
    baseline = sc.rss_bytes()
    async with overload_reads.measured(sc) as during:
        outcomes = await overload_reads.placement_bodies_attack(sc.url, 3, body)
    # "request has no partitions" once a body is parsed; 429 for one that waited for a slot (two
    # here) longer than expensive_queue_seconds (2 s), the worker taking one body at a time.
    assert set(outcomes) <= {"422", "429"} and outcomes["422"] >= 1 and sum(outcomes.values()) == 3, outcomes
    assert_unharmed(during, baseline, sc)
    # Service as usual: a placement is computed.
    assert await overload_reads.placement_attack(sc.url, 1, 10, 3) == {"200": 1}


async def dropped_watchers(sc: overload_reads.Sc) -> dict[str, float]:
    metrics = await sc.metrics()
    return {name: value for name, value in metrics.items() if name.startswith("sc_watchers_dropped_total") and value}


async def test_a_watcher_that_reads_nothing_is_dropped_and_the_others_get_everything_encoded_once(tmp_path: Path) -> None:
    async with overload_reads.cluster(tmp_path, None, 0, 0, SETTINGS) as sc:
        watchers = overload_reads.Watchers(sc.url, 50)
        await watchers.start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", sc.public_port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
        writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
        writer.write(b"GET /v1/watch/partitions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            baseline = sc.rss_bytes()
            created = 0
            async with overload_reads.measured(sc) as during:
                # Rounds of 2,000 partitions (about 3 MB of events) until the socket buffers of the
                # reader that reads nothing are full and it is dropped: at most ten.
                for _ in range(10):
                    async with aiohttp.ClientSession(sc.url) as session:
                        await overload_reads.create_topics(session, TOPICS, PARTITIONS_PER_TOPIC, first=created // PARTITIONS_PER_TOPIC)
                    created += PARTITIONS
                    await overload_reads.until_partitions(sc, created)
                    async with asyncio.timeout(120):
                        while not watchers.all_seen(created):
                            await asyncio.sleep(0.05)
                    await asyncio.sleep(float(SETTINGS["client_stall_seconds"]) + 1)  # its last write may stall
                    if (await dropped_watchers(sc)) != {}:
                        break
            # Not /healthz: here the controllers provision thousands of partitions, and their own
            # passes (not the watchers) hold the loop for a few hundred ms each on a busy machine.
            assert_unharmed(during, baseline, sc, health=False)
            dropped = await dropped_watchers(sc)
            assert list(dropped.values()) == [1.0] and 'protocol="http"' in next(iter(dropped)), dropped
            metrics = await sc.metrics()
            assert metrics['sc_watchers{kind="partitions",protocol="http"}'] == 50
            # Each change was encoded once for all the watchers: the encodings counted at one
            # moment are at least the changes every watcher had got before it, and at most what
            # every watcher gets after it (the SPUs' reports keep changing partitions meanwhile).
            got_before = min(watchers.changes)
            encodings = (await sc.metrics())['sc_watch_encodings_total{kind="partitions"}']
            async with asyncio.timeout(60):
                while min(watchers.changes) < encodings:
                    await asyncio.sleep(0.05)
            assert got_before <= encodings <= min(watchers.changes), (got_before, encodings, collections.Counter(watchers.changes))
            # The SC reset the reader's connection: what the kernel held, then the end.
            writer.transport.resume_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
            try:
                async with asyncio.timeout(30):
                    while await reader.read(1 << 16):
                        pass
            except ConnectionResetError:
                pass
        finally:
            writer.close()
            await watchers.stop()
