"""What the provisioning target asks of this stack: the same run against a minimal server.

`bench/provisioning.py` measures the SC's keys/s as a fraction of raw etcd transactions. This
script asks how much of that gap belongs to the SC and how much to the stack and the machine.
It runs the same client (1,000 topic creates through HTTP, 32 at a time, one watch counting the
keys) against a *floor server*: aiohttp + the project's etcd store (etcd3aio / gRPC) + the
project's models, doing only what any SC on this stack must do for each topic, and nothing else:

  - take the HTTP create, validate the body into a Topic, create the key (group commit);
  - watch every key, decode the topic events (its own partition writes it only counts);
  - write the same keys as the SC: status Pending, then status Provisioned with its replica map,
    the chain key and the topic's 10 partitions, batched up to 128 operations per transaction,
    8 transactions in flight, each guarded by the topic's mod revision.

It has no local store, no controllers, no action queue, no placement (a fixed rotation), no
metrics, no logs and no error handling beyond the compare: it is not an SC, only the floor of
one. Its keys/s as a fraction of raw etcd is the best this target can be met by on this
machine with this stack; the SC's own figure (`bench/provisioning.py`) is printed beside it.

    .venv/bin/python bench/provisioning_floor.py [--topics N] [--partitions P] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from aiohttp import web  # noqa: E402

from bench import provisioning  # noqa: E402
from store import etcd, kv, models  # noqa: E402

CHAIN_KEY = "meta/placement-start-index"
TXNS_IN_FLIGHT = 8


def _fail_loudly(task: asyncio.Task[None]) -> None:
    """A floor server that stops writing would only look slow: end it instead."""
    if not task.cancelled() and task.exception() is not None:
        print(f"floor server: {task.exception()!r}", file=sys.stderr, flush=True)
        os._exit(1)


class FloorWriter:
    """Units of writes (each all-or-nothing on one compare) packed into transactions."""

    def __init__(self, store: etcd.EtcdStore) -> None:
        self.store = store
        self.queued: collections.deque[tuple[kv.Compare, list[kv.Operation]]] = collections.deque()
        self.in_flight = 0
        self.scheduled = False

    def add(self, compare: kv.Compare, operations: list[kv.Operation]) -> None:
        self.queued.append((compare, operations))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        while self.queued and self.in_flight < TXNS_IN_FLIGHT:
            compares: list[kv.Compare] = []
            operations: list[kv.Operation] = [kv.Put(CHAIN_KEY, b'{"nextStartIndex":0}')]
            while self.queued and len(operations) + len(self.queued[0][1]) <= kv.MAX_TXN_OPS:
                compare, unit = self.queued.popleft()
                compares.append(compare)
                operations += unit
            self.in_flight += 1
            asyncio.get_running_loop().create_task(self.write(compares, operations)).add_done_callback(_fail_loudly)

    async def write(self, compares: list[kv.Compare], operations: list[kv.Operation]) -> None:
        try:
            await self.store.txn(compares, operations)
        finally:
            self.in_flight -= 1
            self.flush()


async def serve(endpoints: list[str], prefix: str, port: int, spus: int) -> None:
    store = await etcd.EtcdStore.open(endpoints, prefix, request_timeout=30)
    writer = FloorWriter(store)
    spu_ids = list(range(spus))
    cursor = 0
    ready = asyncio.Event()

    async def follow() -> None:
        nonlocal cursor
        revision = await store.revision() + 1
        ready.set()
        async for event in store.watch("", revision):
            if event.type is not kv.EventType.PUT or event.value is None or not event.key.startswith("topics/"):
                continue  # its own partition writes: received, not decoded
            topic = models.decode("topics", event.value)
            resolution = topic.status.resolution
            compare = kv.Compare(topic.key, event.revision)
            if resolution is models.TopicResolution.INIT:
                status = models.TopicStatus(resolution=models.TopicResolution.PENDING)
                pending = topic.model_copy(update={"status": status})
                writer.add(compare, [kv.Put(topic.key, models.encode(pending))])
            elif resolution is models.TopicResolution.PENDING:
                count, factor = topic.spec.partitions or 0, topic.spec.replication_factor or 0
                replica_map = {
                    index: [spu_ids[(cursor + index + offset) % spus] for offset in range(factor)]
                    for index in range(count)
                }
                cursor = (cursor + 1) % spus
                status = models.TopicStatus(resolution=models.TopicResolution.PROVISIONED, replica_map=replica_map)
                provisioned = topic.model_copy(update={"status": status})
                operations: list[kv.Operation] = [kv.Put(topic.key, models.encode(provisioned))]
                for index, replicas in replica_map.items():
                    partition = models.new_partition(provisioned, index, replicas)
                    operations.append(kv.Put(partition.key, models.encode(partition)))
                writer.add(compare, operations)

    async def create_topic(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        topic = models.Topic(name=body["name"], spec=models.TopicSpec.model_validate(body["spec"]))
        await store.create(topic.key, models.encode(topic))
        return web.json_response(topic.to_json_dict(), status=202)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": ready.is_set()}, status=200 if ready.is_set() else 503)

    watch = asyncio.create_task(follow())
    watch.add_done_callback(_fail_loudly)
    app = web.Application()
    app.router.add_post("/v1/topics", create_topic)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    watch.cancel()
    await runner.cleanup()
    await store.close()


class FloorServer(provisioning.Sc):
    def __init__(self, endpoints: list[str], prefix: str, log_path: Path, loop: str = "asyncio") -> None:
        # The floor server is the same on any loop: ``loop`` only keeps the signature of Sc.
        super().__init__(endpoints, prefix, log_path, loop)
        self.command = [
            sys.executable, str(Path(__file__).resolve()), "--serve", "--endpoints", ",".join(endpoints),
            "--prefix", prefix, "--port", str(self.port), "--spus", str(provisioning.SPUS),
        ]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs: raw baseline, floor server, sc run")
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spus", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        await serve(args.endpoints.split(","), args.prefix, args.port, args.spus)
        return 0
    rows: list[tuple[str, dict[str, float], float, float]] = []
    with tempfile.TemporaryDirectory(prefix="sc-bench-floor-") as workdir:
        work = Path(workdir)
        server = provisioning.start_etcd(work)
        try:
            for run in range(args.runs):
                # The baseline again before each pair: this machine's speed drifts within minutes.
                raw = await provisioning.raw_txn_keys_per_second(server.endpoints, args.raw_seconds)
                for name, make in (("floor server", FloorServer), ("sc run", provisioning.Sc)):
                    prefix = f"/bench/provision-{run}-{name.replace(' ', '-')}/"
                    figures = await provisioning.provisioning_run(
                        server.endpoints, work, args.topics, args.partitions, make=make, prefix=prefix, etcd_pid=server.pid
                    )
                    rows.append((name, figures, raw, figures["keys_per_second"] / raw))
        finally:
            server.stop()
    print(f"{args.topics} topics x {args.partitions} partitions x RF 3, created through HTTP; raw: etcd txn keys/s")
    print("(128 puts per txn, 8 concurrent) measured before each pair of runs")
    print(f"  {'server':<14}{'seconds':>9}{'keys/partition':>16}{'raw keys/s':>12}{'keys/s / raw':>14}   CPU s: server / etcd / client")
    for name, figures, raw, ratio in rows:
        cpu = f"{figures['sc_cpu']:.2f} / {figures['etcd_cpu']:.2f} / {figures['bench_cpu']:.2f}"
        print(
            f"  {name:<14}{figures['seconds']:>9.2f}{figures['keys_per_partition']:>16.2f}{raw:>12,.0f}{ratio:>14.2f}   {cpu}"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main()))
