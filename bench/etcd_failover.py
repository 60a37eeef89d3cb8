"""etcd failover benchmark (hardening #7): what an etcd leader kill costs the SC's store client.

Starts a 3-member etcd cluster WITH fsync (store.embedded_etcd.LocalCluster) and streams creates,
compare-and-swap updates and reads through one EtcdStore (the SC's settings: 5 s request timeout,
0.5 s attempt timeout) from several writers. Each round measures the latency of every request for
a while (the baseline), then SIGKILLs the leader and keeps going; it prints the baseline next to
the slowest request that overlapped the kill, the time until the members agreed on a new leader,
and the failed requests (target: none). The killed member is restarted before the next round.

    .venv/bin/python bench/etcd_failover.py [--rounds 3] [--writers 8] [--attempt-timeout 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from store import embedded_etcd, etcd, kv  # noqa: E402

TARGET_ADDED_SECONDS = 2.0


class Stream:
    def __init__(self) -> None:
        self.requests: list[tuple[float, float]] = []  # (start, seconds), perf_counter
        self.failures: list[str] = []


async def writer(store: etcd.EtcdStore, prefix: str, stop: asyncio.Event, stream: Stream) -> None:
    index = 0
    while not stop.is_set():
        key = f"{prefix}{index:06d}"
        index += 1
        try:
            began = time.perf_counter()
            created = await store.create(key, b"created")
            stream.requests.append((began, time.perf_counter() - began))
            began = time.perf_counter()
            await store.update(key, b"updated", created)
            stream.requests.append((began, time.perf_counter() - began))
            began = time.perf_counter()
            await store.get(key)
            stream.requests.append((began, time.perf_counter() - began))
        except kv.StoreError as error:
            stream.failures.append(f"{key}: {error}")


async def one_round(
    cluster: embedded_etcd.LocalCluster, store: etcd.EtcdStore, number: int, writers: int, baseline_seconds: float, after_seconds: float
) -> dict[str, float]:
    stream, stop = Stream(), asyncio.Event()
    tasks = [
        asyncio.create_task(writer(store, f"bench/round-{number}/writer-{index}/", stop, stream)) for index in range(writers)
    ]
    await asyncio.sleep(baseline_seconds)
    leader = await asyncio.to_thread(cluster.leader)
    killed_at = time.perf_counter()
    leader.kill()
    successor = await asyncio.to_thread(cluster.leader)
    elected = time.perf_counter() - killed_at
    await asyncio.sleep(after_seconds)
    stop.set()
    await asyncio.gather(*tasks)
    # The baseline: requests answered before the kill; across it: those answered after.
    before = sorted(seconds for began, seconds in stream.requests if began + seconds < killed_at)
    across = [seconds for began, seconds in stream.requests if began + seconds >= killed_at]
    result = {
        "requests": len(stream.requests),
        "failures": len(stream.failures),
        "p50": statistics.median(before),
        "p99": before[int(len(before) * 0.99) - 1],
        "max_before": before[-1],
        "max_across": max(across),
        "elected": elected,
    }
    print(
        f"round {number}: killed leader {leader.name}, {successor.name} leads after {result['elected'] * 1000:.0f} ms; "
        f"{result['requests']:.0f} requests, {result['failures']:.0f} failed; baseline p50 / p99 / max "
        f"{result['p50'] * 1000:.1f} / {result['p99'] * 1000:.1f} / {result['max_before'] * 1000:.0f} ms; "
        f"slowest across the kill {result['max_across'] * 1000:.0f} ms "
        f"(added {(result['max_across'] - result['p50']) * 1000:.0f} ms)",
        flush=True,
    )
    for failure in stream.failures[:5]:
        print(f"  failed: {failure}")
    await asyncio.to_thread(leader.start)  # rejoins with its data
    await asyncio.to_thread(cluster.leader)
    return result


async def run(arguments: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="sc-bench-etcd-failover-") as workdir:
        cluster = embedded_etcd.LocalCluster(Path(workdir), size=3)
        cluster.start()
        try:
            store = await etcd.EtcdStore.open(
                cluster.endpoints, prefix="/bench/", attempt_timeout=arguments.attempt_timeout
            )
            try:
                results = [
                    await one_round(cluster, store, number, arguments.writers, arguments.baseline, arguments.after)
                    for number in range(1, arguments.rounds + 1)
                ]
            finally:
                await store.close()
        finally:
            cluster.stop()
    added = [result["max_across"] - result["p50"] for result in results]
    failures = sum(int(result["failures"]) for result in results)
    print(
        f"\n{arguments.rounds} leader kills, {arguments.writers} writers, attempt timeout {arguments.attempt_timeout:g} s: "
        f"baseline p50 {min(r['p50'] for r in results) * 1000:.1f}-{max(r['p50'] for r in results) * 1000:.1f} ms; "
        f"added latency {min(added) * 1000:.0f}-{max(added) * 1000:.0f} ms (target <= {TARGET_ADDED_SECONDS:g} s); "
        f"election {min(r['elected'] for r in results) * 1000:.0f}-{max(r['elected'] for r in results) * 1000:.0f} ms; "
        f"{failures} failed requests (target 0)"
    )
    return 0 if failures == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds measured before each kill")
    parser.add_argument("--after", type=float, default=4.0, help="seconds measured after each kill")
    parser.add_argument("--attempt-timeout", type=float, default=etcd.DEFAULT_ATTEMPT_TIMEOUT)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
