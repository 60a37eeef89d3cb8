"""Overload benchmark, expensive reads and watchers (the Overload issue): a real `sc run` on its own
etcd (no fsync) with three live simulator SPUs (SPU_RATES), attacked from this process. For each attack it
prints, in the same run and next to the same figures with no attack: the SC's RSS and open
descriptors (peak during, and after), /healthz latency (p99 and worst, probed from a process of
its own every 50 ms), and SPU disconnects (reconnections and heartbeat timeouts).

  1. lists: C concurrent GET /v1/partitions of P partitions (every client reads to the end);
  2. Fluvio List: C concurrent List "Partition" over Fluvio's protocol;
  3. placement: K concurrent POST /v1/placement of 100,000 partitions at RF 32 on 64 SPUs;
  4. provisioning T topics x Q partitions through the API with 0, 50 and 200 HTTP watchers of
     partitions: seconds until all are Provisioned and every watcher has seen every partition.

    .venv/bin/python bench/overload_reads.py [--partitions 10000] [--clients 1000] [--placements 10]

The functions are also what tests/functional/test_overload.py runs, on a smaller scale.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import aiohttp  # noqa: E402

from controller.api.fluvio import messages, objects as fluvio_objects  # noqa: E402
from store import embedded_etcd, etcd, kv, models  # noqa: E402

SPU_IDS = (0, 1, 2)
# A tenth of the simulator's default replication traffic: at its defaults, three simulated SPUs
# hosting 10,000 partitions keep a core busy themselves, and on a two-core machine that would hide
# what the SC does. Heartbeats and live-replica reports still flow.
SPU_RATES = ("--append-interval", "5", "--fetch-interval", "0.5", "--replica-lag-time", "10")
PROBE_INTERVAL = 0.05
PROBE_TIMEOUT = 60.0
SAMPLE_INTERVAL = 0.1
# How long after an attack the "after" figures are taken (memory given back, health normal).
SETTLE_SECONDS = 3.0


# ---------------------------------------------------------------------------- the SC and its SPUs


class Sc:
    """`sc run` in a process of its own, on etcd (``endpoints``) or on the memory store."""

    def __init__(self, workdir: Path, endpoints: list[str] | None, settings: dict[str, str] | None = None) -> None:
        self.public_port, self.private_port = embedded_etcd.free_ports(2)
        self.log_path = workdir / f"sc-{self.public_port}.log"
        # Its simulator SPUs' warnings (why one reconnected: the SC closed it, a ping went unanswered).
        self.spus_log_path = workdir / f"spus-{self.private_port}.log"
        environment = {name: value for name, value in os.environ.items() if not name.startswith("SC_")}
        environment.update(
            SC_BIND_HOST="127.0.0.1",
            SC_PUBLIC_PORT=str(self.public_port),
            SC_PRIVATE_PORT=str(self.private_port),
            SC_LOG_FORMAT="json",
            SC_LOG_LEVEL="warning",
            SC_RECORD_HISTORY="false",
        )
        environment.update({f"SC_{name.upper()}": value for name, value in (settings or {}).items()})
        if endpoints is None:
            environment["SC_STORE"] = "memory"
        else:
            environment.update(SC_ETCD_ENDPOINTS=",".join(endpoints), SC_KEY_PREFIX=f"/bench/overload/{uuid.uuid4().hex}/")
        self.prefix = environment.get("SC_KEY_PREFIX", "")
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    async def start(self, timeout: float = 120.0) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controller.cli", "run"], env=self.environment, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"sc run exited:\n{self.log_path.read_text()[-3000:]}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{self.url}/healthz") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise TimeoutError(f"sc run not healthy within {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def open_descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    async def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, by its name with labels as printed."""
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/metrics") as response:
            text = await response.text()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Spus:
    """Simulator SPUs (`sc spu run --count N`) connected to the SC's private port, in one process."""

    def __init__(self, sc: Sc) -> None:
        self.sc = sc
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.sc.spus_log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controller.cli", "spu", "run", "--count", str(len(SPU_IDS)), "--first-id", str(SPU_IDS[0]),
                 "--sc-private", f"127.0.0.1:{self.sc.private_port}", "--log-format", "json", "--log-level", "warning",
                 *SPU_RATES],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    async def wait_online(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (await self.sc.metrics()).get('sc_objects{kind="spus",resolution="Online"}') == len(SPU_IDS):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("the simulator SPUs did not come Online")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spu_object(spu_id: int, ports: tuple[int, int]) -> models.Spu:
    return models.Spu(
        name=f"spu-{spu_id}",
        spec=models.SpuSpec(
            id=spu_id,
            public_endpoint=models.Endpoint(host="127.0.0.1", port=ports[0]),
            private_endpoint=models.Endpoint(host="127.0.0.1", port=ports[1]),
        ),
    )


def placed(topics: int, partitions: int) -> list[models.AnyObject]:
    """Provisioned topics with their partitions on the three SPUs (RF 3), as the controllers leave them."""
    objects: list[models.AnyObject] = []
    replicas = [list(SPU_IDS[index:] + SPU_IDS[:index]) for index in range(len(SPU_IDS))]
    for number in range(topics):
        name = f"topic-{number:04d}"
        replica_map = {index: replicas[index % len(replicas)] for index in range(partitions)}
        objects.append(
            models.Topic(
                name=name,
                spec=models.TopicSpec(partitions=partitions, replication_factor=len(SPU_IDS)),
                status=models.TopicStatus(resolution=models.TopicResolution.PROVISIONED, replica_map=replica_map),
            )
        )
        objects += [
            models.Partition(name=models.partition_name(name, index), uid=models.new_partition_uid(), spec=models.PartitionSpec(leader=row[0], replicas=row))
            for index, row in replica_map.items()
        ]
    return objects


async def seed(endpoints: list[str], prefix: str, objects: list[models.AnyObject]) -> None:
    store = await etcd.EtcdStore.open(endpoints, prefix, request_timeout=30)
    try:
        batches = [objects[start : start + kv.MAX_TXN_OPS] for start in range(0, len(objects), kv.MAX_TXN_OPS)]
        for batch in batches:
            await store.txn([], [kv.Put(obj.key, models.encode(obj)) for obj in batch])
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def cluster(
    workdir: Path, endpoints: list[str] | None, topics: int, partitions: int, settings: dict[str, str] | None = None
) -> AsyncIterator[Sc]:
    """An SC whose store holds ``topics`` x ``partitions`` (RF 3) on three live simulator SPUs.

    On etcd the objects are written before the SC starts; on the memory store the topics are
    created through the API (the controllers place them on the three SPUs)."""
    sc = Sc(workdir, endpoints, settings)
    spus = Spus(sc)
    ports = embedded_etcd.free_ports(2 * len(SPU_IDS))
    spu_objects = [spu_object(spu_id, (ports[2 * index], ports[2 * index + 1])) for index, spu_id in enumerate(SPU_IDS)]
    try:
        if endpoints is not None:
            await seed(endpoints, sc.prefix, [*spu_objects, *placed(topics, partitions)])
        await sc.start()
        async with aiohttp.ClientSession(sc.url) as session:
            if endpoints is None:
                for spu in spu_objects:
                    async with session.post("/v1/spus", json={"name": spu.name, "spec": spu.to_json_dict()["spec"]}) as response:
                        assert response.status == 201, await response.text()
            spus.start()
            await spus.wait_online()
            if endpoints is None:
                await create_topics(session, topics, partitions)
        await until_partitions(sc, topics * partitions)
        await until_settled(sc, topics * partitions)
        yield sc
    finally:
        spus.stop()
        sc.stop()


async def create_topics(
    session: aiohttp.ClientSession, topics: int, partitions: int, concurrency: int = 16, first: int = 0
) -> None:
    """Topics topic-<first> .. topic-<first + topics - 1> through the API, answered at once (?timeout=0)."""
    slots = asyncio.Semaphore(concurrency)

    async def create(number: int) -> None:
        body = {"name": f"topic-{number:04d}", "spec": {"partitions": partitions, "replicationFactor": len(SPU_IDS)}}
        async with slots, session.post("/v1/topics?timeout=0", json=body) as response:
            assert response.status in (201, 202), await response.text()

    await asyncio.gather(*(create(number) for number in range(first, first + topics)))


async def until_settled(sc: Sc, count: int, timeout: float = 300.0) -> None:
    """Until all ``count`` partitions are Online and led (the controllers have nothing left to do
    after a start), so that what is measured next is the attack, not the SC settling."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples = await sc.metrics()
        if (
            samples.get('sc_objects{kind="partitions",resolution="Online"}') == count
            and samples.get("sc_partitions_without_leader") == 0
        ):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the {count} partitions were not all Online and led within {timeout} s")


async def until_partitions(sc: Sc, count: int, timeout: float = 300.0) -> None:
    """Until the SC holds ``count`` partitions and every topic is Provisioned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples = await sc.metrics()
        held = sum(value for name, value in samples.items() if name.startswith('sc_objects{kind="partitions"'))
        waiting = sum(
            value for name, value in samples.items() if name.startswith('sc_objects{kind="topics"') and "Provisioned" not in name
        )
        if held == count and not waiting:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the SC did not hold {count} provisioned partitions within {timeout} s")


# ---------------------------------------------------------------------------- measuring


@dataclass
class Figures:
    """One stretch of time: the SC's peak RSS and descriptors, /healthz latencies, SPU disconnects."""

    rss_peak: int = 0
    rss_end: int = 0
    descriptors_peak: int = 0
    descriptors_end: int = 0
    health: list[float] = field(default_factory=list)  # probes on new connections
    health_kept: list[float] = field(default_factory=list)  # probes on one kept-alive connection
    spu_disconnects: float = 0.0
    seconds: float = 0.0

    def health_p99(self, kept: bool = False) -> float:
        ordered = sorted(self.health_kept if kept else self.health)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")

    def health_worst(self, kept: bool = False) -> float:
        samples = self.health_kept if kept else self.health
        return max(samples) if samples else float("nan")

    def row(self) -> str:
        return (
            f"RSS peak {self.rss_peak / 2**20:6.1f} MiB, end {self.rss_end / 2**20:6.1f} MiB   "
            f"fds peak {self.descriptors_peak:5d}, end {self.descriptors_end:4d}   "
            f"/healthz p99 / worst: new connection {self.health_p99() * 1000:6.0f} / {self.health_worst() * 1000:6.0f} ms, "
            f"kept-alive {self.health_p99(True) * 1000:5.0f} / {self.health_worst(True) * 1000:5.0f} ms "
            f"({len(self.health)} probes)   SPU disconnects {self.spu_disconnects:.0f}"
        )


def probe_main(url: str) -> None:
    """`overload_reads.py probe URL`: GET /healthz every PROBE_INTERVAL until stdin closes, then print
    the latencies (JSON), in a process of its own so that the attackers' loop does not delay it.

    Each round probes twice: on a new connection, as a liveness probe does (it also waits in the
    listen backlog, which a burst of connections can overflow: the kernel then drops the SYN and
    the client retries after 1, 3, 7 s), and on one kept-alive connection (the SC's loop alone)."""
    fresh: list[float] = []
    kept: list[float] = []
    host, _, port = url.removeprefix("http://").partition(":")
    connection: http.client.HTTPConnection | None = None
    stop = threading.Event()

    def stop_at_end_of_input() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=PROBE_TIMEOUT) as response:
                response.read()
        except (urllib.error.URLError, OSError):
            pass  # counted as slow as it was
        fresh.append(time.perf_counter() - started)
        started = time.perf_counter()
        try:
            if connection is None:
                connection = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT)
            connection.request("GET", "/healthz")
            connection.getresponse().read()
        except (http.client.HTTPException, OSError):
            connection = None
        kept.append(time.perf_counter() - started)
        if len(fresh) == 1:
            print("ready", flush=True)
        stop.wait(PROBE_INTERVAL)
    print(json.dumps({"fresh": fresh[1:], "kept": kept[1:]}), flush=True)


async def spu_disconnects(sc: Sc) -> float:
    """SPU connections accepted beyond the first of each SPU, plus SPUs dropped for silence."""
    samples = await sc.metrics()
    return samples.get("sc_spu_connections_accepted_total", 0.0) - len(SPU_IDS) + samples.get("sc_spu_heartbeat_timeouts_total", 0.0)


@contextlib.asynccontextmanager
async def measured(sc: Sc) -> AsyncIterator[Figures]:
    """The figures of the body's stretch of time, filled in when it ends."""
    figures = Figures()
    disconnects_before = await spu_disconnects(sc)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                figures.rss_peak = max(figures.rss_peak, sc.rss_bytes())
                figures.descriptors_peak = max(figures.descriptors_peak, sc.open_descriptors())
            stop.wait(SAMPLE_INTERVAL)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    probe = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "probe", sc.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert probe.stdout is not None
    ready = await asyncio.to_thread(probe.stdout.readline)  # the probe has started and answered once
    assert ready == b"ready\n", ready
    try:
        yield figures
    finally:
        # communicate() closes the probe's stdin, which ends it.
        out, _ = await asyncio.to_thread(probe.communicate, None, PROBE_TIMEOUT + 30)
        probed = json.loads(out)
        figures.health, figures.health_kept = probed["fresh"], probed["kept"]
        stop.set()
        await asyncio.to_thread(sampler.join)
        figures.rss_end = sc.rss_bytes()
        figures.descriptors_end = sc.open_descriptors()
        figures.spu_disconnects = await spu_disconnects(sc) - disconnects_before


async def attack_and_after(sc: Sc, attack: Callable[[], Awaitable[collections.Counter[str]]]) -> tuple[Figures, Figures, collections.Counter[str]]:
    """(during, after, outcomes): the figures while ``attack`` runs, then for SETTLE_SECONDS after."""
    async with measured(sc) as during:
        started = time.perf_counter()
        outcomes = await attack()
        during.seconds = time.perf_counter() - started
    async with measured(sc) as after:
        await asyncio.sleep(SETTLE_SECONDS)
    return during, after, outcomes


async def idle(seconds: float) -> collections.Counter[str]:
    await asyncio.sleep(seconds)
    return collections.Counter()


# ---------------------------------------------------------------------------- attacks


async def read_all(response: aiohttp.ClientResponse) -> int:
    """Read an answer to the end without keeping it (the client's memory is not what is measured)."""
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
    return size


async def lists_attack(
    url: str, clients: int, paths: tuple[str, ...] = ("/v1/partitions",), check: Callable[[str, bytes], None] | None = None
) -> collections.Counter[str]:
    """``clients`` concurrent GETs, each on its own connection, of ``paths`` in turn; outcomes by
    status ("429 with Retry-After" apart). ``check(path, body)`` is given each 200 answer whole
    (otherwise answers are read to the end and dropped)."""
    outcomes: collections.Counter[str] = collections.Counter()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def one(path: str) -> None:
            try:
                async with session.get(path) as response:
                    if check is not None and response.status == 200:
                        check(path, await response.read())
                    else:
                        await read_all(response)
                    retry = " with Retry-After" if response.status == 429 and "Retry-After" in response.headers else ""
                    outcomes[f"{response.status}{retry}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                outcomes[type(error).__name__] += 1

        await asyncio.gather(*(one(paths[number % len(paths)]) for number in range(clients)))
    return outcomes


async def fluvio_lists_attack(port: int, clients: int, label: str = fluvio_objects.PARTITION) -> collections.Counter[str]:
    """``clients`` connections each sending one List; outcomes: "ok" (the label asked) or the label answered."""
    outcomes: collections.Counter[str] = collections.Counter()

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as error:
            outcomes[type(error).__name__] += 1
            return
        try:
            writer.write(messages.encode_request(messages.RequestHeader(messages.LIST, 19, 1, "bench"), messages.ListRequest(label)))
            length = messages.frame_length(await reader.readexactly(4), 1 << 31)
            message = await reader.readexactly(length)
            answered = message[4 + 2 : 4 + 2 + int.from_bytes(message[4:6], "big")].decode()
            outcomes["ok" if answered == label else answered] += 1
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            outcomes[type(error).__name__] += 1
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    await asyncio.gather(*(one() for _ in range(clients)))
    return outcomes


async def placement_attack(url: str, clients: int, partitions: int, replication_factor: int, spus: int = 64) -> collections.Counter[str]:
    request = {"spus": [{"id": spu_id} for spu_id in range(spus)], "partitions": partitions, "replicationFactor": replication_factor}
    return await placement_bodies_attack(url, clients, json.dumps(request).encode())


async def placement_bodies_attack(url: str, clients: int, body: bytes) -> collections.Counter[str]:
    """``clients`` POST /v1/placement of ``body`` at once (bytes as they are: a hostile body)."""
    outcomes: collections.Counter[str] = collections.Counter()
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def one() -> None:
            sent = io.BytesIO(body)  # not bytes: aiohttp warns that it would send them in one write
            async with session.post("/v1/placement", data=sent, headers={"Content-Type": "application/json"}) as response:
                await read_all(response)
                outcomes[str(response.status)] += 1

        await asyncio.gather(*(one() for _ in range(clients)))
    return outcomes


class Watchers:
    """HTTP watchers of partitions. With ``names``, each records the partitions it has seen and the
    changes after SYNC (the functional test checks them); without, each only counts bytes, so that
    the bench's own CPU is not what is measured (every watcher gets the same bytes)."""

    def __init__(self, url: str, count: int, names: bool = True) -> None:
        self.url = url
        self.count = count
        self.names = names
        self.seen: list[set[bytes]] = [set() for _ in range(count)]
        # ADDED and MODIFIED events after SYNC, per watcher: each is one encoding, shared or not.
        self.changes = [0] * count
        self.received = [0] * count
        self.last_received = [0.0] * count
        self.synced = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(self.url, connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))
        self._tasks = [asyncio.create_task(self._watch(index)) for index in range(self.count)]
        while self.synced < self.count:
            await asyncio.sleep(0.02)

    async def _watch(self, index: int) -> None:
        assert self._session is not None
        async with self._session.get("/v1/watch/partitions") as response:
            assert response.status == 200, await response.text()
            if self.names:
                await self._parse(index, response)
                return
            tail: bytes | None = b""
            async for chunk in response.content.iter_any():
                self.received[index] += len(chunk)
                self.last_received[index] = time.perf_counter()
                if tail is not None:
                    if b'{"type":"SYNC"' in tail + chunk:
                        self.synced += 1
                        tail = None
                    else:
                        tail = chunk[-16:]

    async def _parse(self, index: int, response: aiohttp.ClientResponse) -> None:
        seen = self.seen[index]
        synced = False
        async for line in response.content:
            if line.startswith(b'{"type":"SYNC"'):
                self.synced += 1
                synced = True
            elif not line.startswith(b'{"type":"DELETED"'):
                self.changes[index] += synced
                # The object's name is the first field of the object: "object":{"name":"..."
                start = line.index(b'"name":"') + 8
                seen.add(line[start : line.index(b'"', start)])

    def all_seen(self, count: int) -> bool:
        return all(len(seen) >= count for seen in self.seen)

    async def until_quiet(self, quiet: float = 1.0) -> float:
        """Once every watcher has the same bytes and nothing came for ``quiet`` s: when the last came."""
        while True:
            before = list(self.received)
            await asyncio.sleep(quiet)
            if self.received == before and len(set(before)) == 1:
                return max(self.last_received)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Provisioning:
    seconds: float
    sc_cpu_seconds: float
    encodings_per_partition: float
    watch_bytes: int


async def provisioning_with_watchers(
    workdir: Path, endpoints: list[str] | None, watchers: int, topics: int, partitions: int
) -> Provisioning:
    """On a fresh SC with the three SPUs and no topic yet, ``watchers`` HTTP watchers of partitions
    connected: seconds from the first create until every topic is Provisioned with all its
    partitions (the issue's measure), the SC's CPU seconds meanwhile, watch encodings per partition
    created once every watcher has everything and none was dropped (each
    version of a partition encoded once: the same whatever the number of watchers), and the bytes
    each watcher got."""
    async with cluster(workdir, endpoints, 0, 0, {"max_watchers_per_address": str(max(256, watchers))}) as sc:
        watching = Watchers(sc.url, watchers, names=False)
        await watching.start()
        try:
            before = await sc.metrics()
            cpu_before = process_cpu_seconds(sc.pid)
            started = time.perf_counter()
            async with aiohttp.ClientSession(sc.url) as session:
                await create_topics(session, topics, partitions)
            await until_partitions(sc, topics * partitions)
            finished = time.perf_counter()
            cpu = process_cpu_seconds(sc.pid) - cpu_before
            if watchers:
                await watching.until_quiet()  # every watcher got everything (the same bytes), none dropped
            after = await sc.metrics()
        finally:
            await watching.stop()
    dropped = sum(value for name, value in after.items() if name.startswith("sc_watchers_dropped_total"))
    assert not dropped, f"{dropped:.0f} watchers were dropped"

    key = 'sc_watch_encodings_total{kind="partitions"}'
    return Provisioning(
        seconds=finished - started,
        sc_cpu_seconds=cpu,
        encodings_per_partition=(after.get(key, 0.0) - before.get(key, 0.0)) / (topics * partitions),
        watch_bytes=watching.received[0] if watchers else 0,
    )


# ---------------------------------------------------------------------------- the run


def describe(outcomes: collections.Counter[str]) -> str:
    return ", ".join(f"{outcome}: {count}" for outcome, count in sorted(outcomes.items())) or "-"


def print_pair(title: str, during: Figures, after: Figures, outcomes: collections.Counter[str]) -> None:
    print(f"\n{title}   answers: {describe(outcomes)}")
    print(f"   during  {during.row()}")
    print(f"   after   {after.row()}")


@contextlib.contextmanager
def own_etcd(workdir: Path) -> Iterator[list[str]]:
    client_port, peer_port = embedded_etcd.free_ports(2)
    server = embedded_etcd.EmbeddedEtcd(workdir / "etcd", client_port, peer_port, extra_args=("--unsafe-no-fsync",))
    server.start()
    try:
        yield server.endpoints
    finally:
        server.stop()


async def run(args: argparse.Namespace, workdir: Path, endpoints: list[str]) -> None:
    topics = max(1, args.partitions // 100)
    print(f"Overload (reads and watchers): sc run on etcd (no fsync), {topics * 100:,} partitions RF 3 on 3 live SPUs")
    async with cluster(workdir, endpoints, topics, 100) as sc:
        during, after, _ = await attack_and_after(sc, lambda: idle(args.baseline_seconds))
        print_pair(f"0. no attack ({args.baseline_seconds:g} s)", during, after, collections.Counter())
        during, after, outcomes = await attack_and_after(sc, lambda: lists_attack(sc.url, args.clients))
        print_pair(f"1. {args.clients} concurrent GET /v1/partitions ({during.seconds:.1f} s)", during, after, outcomes)
        during, after, outcomes = await attack_and_after(sc, lambda: fluvio_lists_attack(sc.public_port, args.clients))
        print_pair(f"2. {args.clients} concurrent Fluvio List Partition ({during.seconds:.1f} s)", during, after, outcomes)
        during, after, outcomes = await attack_and_after(sc, lambda: placement_attack(sc.url, args.placements, 100_000, 32))
        print_pair(f"3. {args.placements} concurrent POST /v1/placement 100,000 x RF 32 ({during.seconds:.1f} s)", during, after, outcomes)
        metrics = await sc.metrics()
        print(
            "   gate: "
            + ", ".join(f"{name.split('purpose=')[1][1:-2]} refused {value:.0f}" for name, value in sorted(metrics.items()) if name.startswith("sc_expensive_requests_refused_total"))
        )
    print(f"\n4. provisioning {args.topics} topics x {args.topic_partitions} partitions (RF 3) with HTTP watchers of partitions")
    for watchers in (0, 50, 200):
        run = await provisioning_with_watchers(workdir, endpoints, watchers, args.topics, args.topic_partitions)
        print(
            f"   {watchers:3d} watchers: {run.seconds:6.2f} s   SC CPU {run.sc_cpu_seconds:6.2f} s   "
            f"watch encodings per partition {run.encodings_per_partition:.2f}   {run.watch_bytes / 2**20:.1f} MiB per watcher"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--placements", type=int, default=10)
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--topic-partitions", type=int, default=30)
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sc-bench-overload-") as directory, own_etcd(Path(directory)) as endpoints:
        await run(args, Path(directory), endpoints)


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe_main(sys.argv[2])
    else:
        asyncio.run(main())
