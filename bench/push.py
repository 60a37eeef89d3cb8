"""Push benchmark: what the connection manager spends telling 100 SPUs of a provisioning burst.

Replays, without sockets, the partition deltas `bench/provisioning.py --live-spus` makes the SC
push: 1,000 topics x 10 partitions x RF 3 created one topic per push, then every partition
confirmed (Online, partition epoch 1) 20 per push, then a tenth of the SPUs failed over in one
push. Each push is handed to 100 SPU sessions the
way `ConnectionManager.push` does (`Concerned` + `_replica_delta`, each partition's state built
once for all its SPUs), and, as the baseline in the same run, the plain reading of the rule:
every change looked at for every session, its state built for each SPU. Both must tell every
session the same thing (checked); the figures are the seconds spent in the pushes alone.

    .venv/bin/python bench/push.py [--topics N] [--spus S] [--repeat K]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connection_manager import server, wire  # noqa: E402 (after the path set-up above)
from controller import daemon  # noqa: E402
from store import local, models  # noqa: E402

PARTITIONS = 10
CONFIRMED_PER_PUSH = 20

Delta = tuple[list[wire.ReplicaInfo], list[str]]
Push = Callable[[list[server.Session], local.Changes[models.Partition], Mapping[str, local.Entry[models.Partition]]], list[Delta]]


def pushed(sessions: list[server.Session], changes: local.Changes[models.Partition], partitions: Mapping[str, local.Entry[models.Partition]]) -> list[Delta]:
    """What ``ConnectionManager.push`` does for the partitions."""
    concerned = server.Concerned(changes)
    built: server.BuiltStates = {}
    return [server._replica_delta(session, changes, partitions, concerned, built) for session in sessions]


def plain(sessions: list[server.Session], changes: local.Changes[models.Partition], partitions: Mapping[str, local.Entry[models.Partition]]) -> list[Delta]:
    """The rule read plainly: every change for every session."""
    deltas = []
    for session in sessions:
        changed, deleted = [], []
        for entry in changes.updated:
            told = session.hosted.get(entry.name)
            if session.spu_id in entry.obj.spec.replicas:
                info = server._replica_info(entry, session.incarnation)
                if told != info:
                    session.hosted[entry.name] = info
                    changed.append(info)
            elif told is not None:
                del session.hosted[entry.name]
                deleted.append(entry.name)
        deltas.append((changed, deleted))
    return deltas


def replay(push: Push, topics: int, spus: int) -> tuple[float, list[list[Delta]]]:
    """Seconds in ``push`` over the burst, and what each push told each session."""
    rng = random.Random(7)
    table: local.KindStore[models.Partition] = local.KindStore("partitions")
    listener = table.listener()
    listener.changes()
    sessions = [server.Session(spu_id, f"spu-{spu_id}", 1, None) for spu_id in range(spus)]  # type: ignore[arg-type]  # nothing is sent
    revision, spent, told = 0, 0.0, []

    def one_push() -> None:
        nonlocal spent
        changes = listener.changes()
        started = time.perf_counter()
        deltas = push(sessions, changes, table.view)
        spent += time.perf_counter() - started
        told.append(deltas)

    for index in range(topics):
        topic = models.Topic(name=f"topic-{index}", spec=models.TopicSpec(partitions=PARTITIONS, replication_factor=3))
        for partition in range(PARTITIONS):
            revision += 1
            created = models.new_partition(topic, partition, rng.sample(range(spus), 3))
            # Its uid from the bench's seed, not the SC's random draw: both replays must build the
            # same partitions for their deltas to be compared.
            table.apply(created.model_copy(update={"uid": rng.randrange(1, models.MAX_PARTITION_UID)}), revision)
        one_push()
    names = list(table.view)
    for start in range(0, len(names), CONFIRMED_PER_PUSH):
        for name in names[start : start + CONFIRMED_PER_PUSH]:
            obj = table.view[name].obj
            status = obj.status.model_copy(
                update={"resolution": models.PartitionResolution.ONLINE, "partition_epoch": 1, "isr": list(obj.spec.replicas)}
            )
            revision += 1
            table.apply(obj.model_copy(update={"status": status}), revision)
        one_push()
    # Then a failover: every partition led by one of the first tenth of the SPUs gets a new leader,
    # all in one push (its changes outnumber what any SPU was told).
    dead = set(range(max(1, spus // 10)))
    for name in names:
        obj = table.view[name].obj
        survivors = [spu for spu in obj.spec.replicas if spu not in dead]
        if obj.spec.leader in dead and survivors:
            spec = obj.spec.model_copy(update={"leader": survivors[0]})
            status = obj.status.model_copy(update={"leader_epoch": 1, "partition_epoch": 2})
            revision += 1
            table.apply(obj.model_copy(update={"spec": spec, "status": status}), revision)
    one_push()
    return spent, told


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--spus", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gc.set_threshold(daemon.GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])  # as `sc run` has it
    best = {"plain": float("inf"), "push": float("inf")}
    for _ in range(args.repeat):
        plain_seconds, plain_told = replay(plain, args.topics, args.spus)
        push_seconds, push_told = replay(pushed, args.topics, args.spus)
        if push_told != plain_told:
            raise SystemExit("push told the SPUs something else than the plain reading")
        best["plain"] = min(best["plain"], plain_seconds)
        best["push"] = min(best["push"], push_seconds)
    pushes = args.topics + args.topics * PARTITIONS // CONFIRMED_PER_PUSH + 1
    print(f"{args.topics} topics x {PARTITIONS} x RF 3 on {args.spus} SPUs: {pushes} pushes, best of {args.repeat}")
    print(f"  plain reading (every change, every SPU): {best['plain']:.3f} s  baseline")
    print(f"  push (by SPU, states shared):            {best['push']:.3f} s  {best['push'] / best['plain']:.2f}x the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
