"""Fluvio wire benchmark (issue 8): the Fluvio protocol next to the HTTP API, in the same run, against
a real `sc run` on its own etcd (started here, without fsync: this measures the public port).

  1. List of 10,000 topics over the Fluvio protocol and over HTTP: latency to the last byte (first
     call, then median and p95 of the next ones) and bytes per answer; with the real `fluvio`
     client (if installed, in a subprocess) the latency of all_topics() including its decode.
  2. Watch fan-out: 1,000 topics created through the HTTP API with nobody watching (the baseline),
     then with 50 Fluvio watchers, then with 50 HTTP watchers (JSON lines): seconds until every
     watcher has seen every topic Provisioned, frames and bytes per watcher. The watchers run in
     this process, so their decoding shares the machine with the SC.

    .venv/bin/python bench/fluvio_wire.py [--topics 10000] [--watchers 50] [--created 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import aiohttp  # noqa: E402

from bench import provisioning  # noqa: E402  (the `sc run` process and the seeding)
from controller.api.fluvio import client as client_module, messages, objects as fluvio_objects  # noqa: E402
from store import embedded_etcd, etcd, models  # noqa: E402

LIST_REPEATS = 20
SPUS = 3


def provisioned_topic(name: str, spu_id: int) -> list[models.AnyObject]:
    topic = models.Topic(
        name=name,
        spec=models.TopicSpec(partitions=1, replication_factor=1),
        status=models.TopicStatus(resolution=models.TopicResolution.PROVISIONED, replica_map={0: [spu_id]}),
    )
    partition = models.Partition(name=models.partition_name(name, 0), uid=models.new_partition_uid(), spec=models.PartitionSpec(leader=spu_id, replicas=[spu_id]))
    return [topic, partition]


async def fluvio_list_once(port: int) -> tuple[float, int]:
    """Seconds from sending List "Topic" to the answer's last byte, and the answer's bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = messages.encode_request(messages.RequestHeader(messages.LIST, 19, 1, "bench"), messages.ListRequest(fluvio_objects.TOPIC))
        started = time.perf_counter()
        writer.write(request)
        length = messages.frame_length(await reader.readexactly(4))
        await reader.readexactly(length)
        return time.perf_counter() - started, 4 + length
    finally:
        writer.close()
        await writer.wait_closed()


async def http_list_once(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.get(f"{url}/v1/topics") as response:
        body = await response.read()
    return time.perf_counter() - started, len(body)


def real_client_list(port: int, repeats: int) -> list[float] | None:
    if importlib.util.find_spec("fluvio") is None:
        return None
    script = textwrap.dedent(
        f"""
        import json, time, fluvio
        admin = fluvio.FluvioAdmin.connect_with_config(fluvio.FluvioConfig.new("127.0.0.1:{port}"))
        times = []
        for _ in range({repeats}):
            started = time.perf_counter()
            count = len(admin.all_topics())
            times.append(time.perf_counter() - started)
        print(json.dumps({{"count": count, "times": times}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the fluvio client failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return list(result["times"])


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms"


async def list_run(endpoints: list[str], workdir: Path, topics: int) -> None:
    prefix = "/bench/fluvio-list/"
    store = await etcd.EtcdStore.open(endpoints, prefix)
    try:
        objects: list[models.AnyObject] = [provisioning.spu(spu_id) for spu_id in range(SPUS)]
        for index in range(topics):
            objects += provisioned_topic(f"topic-{index:05d}", index % SPUS)
        await provisioning.seed(store, objects)
    finally:
        await store.close()
    sc = provisioning.Sc(endpoints, prefix, workdir / "sc-list.log")
    try:
        await sc.start_and_wait_healthy()
        async with aiohttp.ClientSession() as session:
            fluvio = [await fluvio_list_once(sc.port) for _ in range(LIST_REPEATS + 1)]
            http = [await http_list_once(session, sc.url) for _ in range(LIST_REPEATS + 1)]
        check = await client_module.Client.connect("127.0.0.1", sc.port)
        try:
            assert len(await check.list(fluvio_objects.TOPIC)) == topics
        finally:
            await check.close()
        real = real_client_list(sc.port, LIST_REPEATS)
    finally:
        sc.stop()
    fluvio_times, http_times = [t for t, _ in fluvio[1:]], [t for t, _ in http[1:]]
    fluvio_bytes, http_bytes = fluvio[0][1], http[0][1]
    print(f"\n1. List of {topics:,} topics (to the last byte, {LIST_REPEATS} calls after a first)")
    print(f"   Fluvio  first {fluvio[0][0] * 1000:7.1f} ms   {summary(fluvio_times)}   {fluvio_bytes:>10,} bytes")
    print(f"   HTTP    first {http[0][0] * 1000:7.1f} ms   {summary(http_times)}   {http_bytes:>10,} bytes")
    if real is not None:
        print(f"   fluvio 0.21 all_topics() incl. its decode:       {summary(real)}")
    print(
        f"   ratio Fluvio/HTTP: latency {statistics.median(fluvio_times) / statistics.median(http_times):.2f}, "
        f"bytes {fluvio_bytes / http_bytes:.2f}"
    )


class Watcher:
    """Counts what one watcher receives and notes when it has seen every created topic Provisioned."""

    def __init__(self, prefix: str, wanted: int) -> None:
        self.prefix = prefix
        self.wanted = wanted
        self.resolutions: dict[str, bool] = {}
        self.frames = 0
        self.bytes = 0
        self.done_at: float | None = None
        self.done = asyncio.Event()

    def seen(self, name: str, provisioned: bool | None) -> None:
        if not name.startswith(self.prefix):
            return  # an earlier phase's topic
        if provisioned is None:
            self.resolutions.pop(name, None)
        else:
            self.resolutions[name] = provisioned
        if self.done_at is None and sum(self.resolutions.values()) >= self.wanted:
            self.done_at = time.perf_counter()
            self.done.set()


async def fluvio_watcher(port: int, watcher: Watcher, ready: asyncio.Event) -> None:
    client = await client_module.Client.connect("127.0.0.1", port)
    try:
        frames = client.watch(fluvio_objects.TOPIC)
        await frames.get()  # the snapshot of the empty cluster
        ready.set()
        while not watcher.done.is_set():
            update = (await frames.get()).update
            watcher.frames += 1
            for message in update.changes:
                provisioned = message.content.status.resolution is fluvio_objects.TopicResolution.PROVISIONED
                watcher.seen(message.content.name, None if message.header is messages.MessageType.DELETE else provisioned)
        watcher.bytes = client.received_bytes
    finally:
        await client.close()


async def http_watcher(session: aiohttp.ClientSession, url: str, watcher: Watcher, ready: asyncio.Event) -> None:
    async with session.get(f"{url}/v1/watch/topics") as response:
        async for line in response.content:
            watcher.bytes += len(line)
            event = json.loads(line)
            if event["type"] == "SYNC":
                ready.set()
                continue
            watcher.frames += 1
            obj = event["object"]
            watcher.seen(obj["name"], None if event["type"] == "DELETED" else obj["status"]["resolution"] == "Provisioned")
            if watcher.done.is_set():
                return


async def create_topics(session: aiohttp.ClientSession, url: str, prefix: str, count: int) -> None:
    semaphore = asyncio.Semaphore(16)

    async def create(index: int) -> None:
        body = {"name": f"{prefix}-{index:04d}", "spec": {"partitions": 1, "replicationFactor": 1}}
        async with semaphore, session.post(f"{url}/v1/topics?timeout=0", json=body) as response:
            assert response.status in (201, 202), await response.text()

    await asyncio.gather(*(create(index) for index in range(count)))


async def fan_out(sc: provisioning.Sc, protocol: str, watchers: int, created: int) -> tuple[float, float, float, float]:
    """(seconds until all saw everything, median watcher seconds, frames per watcher, bytes per watcher)."""
    prefix = f"fan-{protocol}"
    state = [Watcher(prefix, created) for _ in range(watchers)]
    ready = [asyncio.Event() for _ in range(watchers)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        if protocol == "fluvio":
            tasks = [asyncio.create_task(fluvio_watcher(sc.port, w, r)) for w, r in zip(state, ready, strict=True)]
        else:
            tasks = [asyncio.create_task(http_watcher(session, sc.url, w, r)) for w, r in zip(state, ready, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ready)), 60)
        started = time.perf_counter()
        await create_topics(session, sc.url, prefix, created)
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    done = [w.done_at - started for w in state if w.done_at is not None]
    return max(done), statistics.median(done), statistics.mean(w.frames for w in state), statistics.mean(w.bytes for w in state)


async def unwatched(sc: provisioning.Sc, created: int) -> float:
    """Seconds until the same creates are all Provisioned with nobody watching (polled over HTTP)."""
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await create_topics(session, sc.url, "fan-none", created)
        while True:
            async with session.get(f"{sc.url}/v1/topics") as response:
                topics = await response.json()
            done = sum(1 for topic in topics if topic["name"].startswith("fan-none") and topic["status"]["resolution"] == "Provisioned")
            if done >= created:
                return time.perf_counter() - started
            await asyncio.sleep(0.05)


async def fan_out_run(endpoints: list[str], workdir: Path, watchers: int, created: int) -> None:
    prefix = "/bench/fluvio-fanout/"
    store = await etcd.EtcdStore.open(endpoints, prefix)
    try:
        await provisioning.seed(store, [provisioning.spu(spu_id) for spu_id in range(SPUS)])
    finally:
        await store.close()
    sc = provisioning.Sc(endpoints, prefix, workdir / "sc-fanout.log")
    try:
        await sc.start_and_wait_healthy()
        baseline = await unwatched(sc, created)
        fluvio = await fan_out(sc, "fluvio", watchers, created)
        http = await fan_out(sc, "http", watchers, created)
    finally:
        sc.stop()
    print(f"\n2. Watch fan-out: {watchers} watchers while {created:,} topics are created (HTTP, 16 at a time)")
    print(f"   nobody watching: all Provisioned in {baseline:6.2f} s (the creates alone)")
    for name, (last, median, frames, size) in (("Fluvio", fluvio), ("HTTP", http)):
        print(
            f"   {name:6}  all watchers done {last:6.2f} s   median {median:6.2f} s   "
            f"{frames:8.1f} frames/watcher (HTTP: events)   {size:>10,.0f} bytes/watcher"
        )
    print(
        f"   ratio Fluvio/HTTP: time {fluvio[0] / http[0]:.2f}, frames {fluvio[2] / http[2]:.2f}, bytes {fluvio[3] / http[3]:.2f}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--created", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sc-bench-fluvio-") as directory:
        workdir = Path(directory)
        client_port, peer_port = embedded_etcd.free_ports(2)
        server = embedded_etcd.EmbeddedEtcd(workdir / "etcd", client_port, peer_port, extra_args=("--unsafe-no-fsync",))
        await server.start_async()
        try:
            print(f"Fluvio wire benchmark: sc run on etcd (no fsync), {SPUS} SPUs seeded Online")
            await list_run(server.endpoints, workdir, args.topics)
            await fan_out_run(server.endpoints, workdir, args.watchers, args.created)
        finally:
            await asyncio.to_thread(server.stop)


if __name__ == "__main__":
    asyncio.run(main())
