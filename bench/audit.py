"""Audit benchmark (issue 6): the history recorder, the Parquet export and the Spark report.

Measures, in the same run:
  1. provisioning N topics x P partitions on the in-process daemon (memory store, 30 SPUs seeded
     Online), with the history recorded and without: history records written per second while
     provisioning, records dropped, and the provisioning time with the history / without (baseline);
  2. a synthetic history of R records (default 1,000,000: topics, partitions, SPU flaps, elections)
     written through the recorder: records/s;
  3. the export of that history to Parquet: rows/s, next to the rows/s of only reading and parsing
     the history (baseline: what the export costs beyond reading);
  4. the Spark report over it in local mode (jobs + report.json, tables and charts): seconds, next
     to one full scan of the dataset by the same session (baseline);
  5. with --merged: the report over that history and a standby's of the same store (the same
     changes, each recorded 0.1 s later, no actions), merged: seconds, next to the report over the
     first history alone run again right after it (the baseline, on a JVM as warm).

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/audit.py [--topics N] [--partitions P] [--records R] [--master local[2]] [--merged]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from controller import config, daemon as daemon_module, logs  # noqa: E402
from controller.audit import export  # noqa: E402
from store import history, models  # noqa: E402

SPUS = 30
RACKS = 6


def spu(spu_id: int, resolution: str = "Online") -> models.Spu:
    return models.Spu.model_validate(
        {
            "name": f"spu-{spu_id}",
            "spec": {
                "id": spu_id, "rack": f"r{spu_id % RACKS}",
                "publicEndpoint": {"host": "127.0.0.1", "port": 20000 + spu_id},
                "privateEndpoint": {"host": "127.0.0.1", "port": 30000 + spu_id},
            },
            "status": {"resolution": resolution},
        }
    )


# ---------------------------------------------------------------------------- 1. while provisioning


async def provision(topics: int, partitions: int, history_dir: Path | None) -> tuple[float, int, int]:
    """Seconds to provision, history records written, records dropped."""
    settings = config.Settings(
        store=config.StoreKind.MEMORY, bind_host="127.0.0.1", public_port=0, private_port=0,
        spu_offline_grace=3600.0, history_dir=history_dir, record_history=history_dir is not None,
    )
    daemon = daemon_module.Daemon(settings)
    await daemon.start()
    try:
        assert daemon.context is not None
        store, local_store = daemon.context.kv_store, daemon.context.local_store
        for spu_id in range(SPUS):
            await store.create(f"spus/spu-{spu_id}", models.encode(spu(spu_id)))
        started = time.perf_counter()
        for index in range(topics):
            topic = models.Topic.model_validate(
                {"name": f"t{index}", "spec": {"partitions": partitions, "replicationFactor": 3}}
            )
            await store.create(topic.key, models.encode(topic))
        expected = topics * partitions
        while True:
            done = sum(
                entry.obj.status.resolution is models.TopicResolution.PROVISIONED
                for entry in local_store["topics"]
            )
            if done == topics and len(local_store["partitions"]) == expected:
                break
            await asyncio.sleep(0.01)
        if daemon.history is not None:
            await daemon.history.flush()
        seconds = time.perf_counter() - started
        recorder = daemon.history
        written = sum(recorder.stats.recorded.values()) if recorder is not None else 0
        dropped = recorder.stats.dropped if recorder is not None else 0
        return seconds, written, dropped
    finally:
        await daemon.stop()


# ---------------------------------------------------------------------------- 2. a synthetic history


async def synthetic_history(directory: Path, records: int, seed: int = 6, standby: bool = False) -> tuple[float, int]:
    """A day of a cluster: topics provisioned, then SPU flaps, elections, status changes. Seconds, records.

    ``standby``: the same day as a standby records it (the same changes, 0.1 s later; no actions).
    """
    rng = random.Random(seed)
    now = [1_772_352_000.0]  # 2026-03-01T08:00:00Z
    lag = 0.1 if standby else 0.0
    recorder = history.Recorder.open(directory, clock=lambda: now[0] + lag)
    await recorder.start()
    revision = 0
    written = [0]
    partitions: dict[str, list[int]] = {}
    leaders: dict[str, int] = {}
    started = time.perf_counter()

    def change(obj: models.AnyObject, op: str) -> None:
        recorder.record_change(obj.kind, obj.name, op, revision, models.encode(obj))
        written[0] += 1

    def action(kind: str, name: str, verb: str, cause: str, keys: list[str]) -> None:
        if not standby:
            recorder.record_action(kind, name, verb, verb, cause, revision - 1, "applied", revision, keys)
        written[0] += 1  # counted either way: both days end at the same change

    async def drain() -> None:
        if recorder.queue_depth >= 50_000:
            await recorder.flush()  # let the writer catch up: the queue stays bounded

    for spu_id in range(SPUS):
        revision += 1
        change(spu(spu_id), history.CREATE)
    topic_index = 0
    while len(partitions) < records // 20:
        name = f"topic-{topic_index}"
        topic_index += 1
        revision += 1
        spec = {"partitions": 8, "replicationFactor": 3}
        change(models.Topic.model_validate({"name": name, "spec": spec}), history.CREATE)
        now[0] += 0.05
        revision += 1
        replica_map = {index: rng.sample(range(SPUS), 3) for index in range(8)}
        topic = models.Topic.model_validate(
            {"name": name, "spec": spec, "status": {"resolution": "Provisioned", "replicaMap": replica_map}}
        )
        keys = [topic.key] + [f"partitions/{name}-{index}" for index in replica_map]
        action("topics", name, "provision", "", keys)
        change(topic, history.UPDATE)
        for index, replicas in replica_map.items():
            partition_name = f"{name}-{index}"
            partitions[partition_name], leaders[partition_name] = replicas, replicas[0]
            change(models.Partition.model_validate({"name": partition_name, "spec": {"leader": replicas[0], "replicas": replicas}}), history.CREATE)
        await drain()
    names = list(partitions)
    causes = ("spu-offline", "preferred-leader", "drain", "unclean")
    while written[0] < records:
        await drain()
        now[0] += rng.uniform(0.0, 0.2)
        revision += 1
        roll = rng.random()
        if roll < 0.05:
            spu_id = rng.randrange(SPUS)
            resolution = rng.choice(("Online", "Offline"))
            action("spus", f"spu-{spu_id}", "update-status", "", [f"spus/spu-{spu_id}"])
            change(spu(spu_id, resolution), history.UPDATE)
        elif roll < 0.45:
            name = rng.choice(names)
            replicas = partitions[name]
            leader = rng.choice([spu_id for spu_id in replicas if spu_id != leaders[name]])
            leaders[name] = leader
            cause = rng.choice(causes)
            action("partitions", name, "elect", cause, [f"partitions/{name}"])
            status: dict[str, Any] = {"resolution": "Online", "leader": {"spu": leader, "hw": 0, "leo": 0}}
            change(models.Partition.model_validate({"name": name, "spec": {"leader": leader, "replicas": replicas}, "status": status}), history.UPDATE)
        else:
            name = rng.choice(names)
            resolution = "Online" if rng.random() < 0.6 else "LeaderOffline"
            status = {"resolution": resolution, "leader": {"spu": leaders[name], "hw": 0, "leo": 0} if resolution == "Online" else None}
            action("partitions", name, "update-status", "", [f"partitions/{name}"])
            change(models.Partition.model_validate({"name": name, "spec": {"leader": leaders[name], "replicas": partitions[name]}, "status": status}), history.UPDATE)
    await recorder.close()
    return time.perf_counter() - started, sum(recorder.stats.recorded.values())


# ---------------------------------------------------------------------------- 3 and 4


def read_only(directory: Path) -> tuple[float, int]:
    started = time.perf_counter()
    count = sum(1 for _ in history.HistoryReader(directory).records())
    return time.perf_counter() - started, count


def spark_report(
    dataset: Path, out: Path, master: str, standby: Path | None = None
) -> tuple[float, float, float, int, float, float]:
    """Session start, one full scan (baseline), and the whole report, in seconds; rows scanned; and
    the report over ``dataset`` and ``standby`` merged, then over ``dataset`` alone again (its
    baseline, on a JVM as warm: 0 and 0 without ``standby``)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from controller.audit import jobs, report

    started = time.perf_counter()
    spark = jobs.session(master, app_name="sc-audit-bench")
    session_seconds = time.perf_counter() - started
    try:
        started = time.perf_counter()
        rows = jobs.load(spark, dataset).filter("seq > 0").count()
        scan_seconds = time.perf_counter() - started
        started = time.perf_counter()
        results = jobs.run(spark, dataset)
        report.write(results, out)
        report_seconds = time.perf_counter() - started
        merged_seconds = again_seconds = 0.0
        if standby is not None:
            started = time.perf_counter()
            report.write(jobs.run(spark, [dataset, standby]), out.with_name(out.name + "-merged"))
            merged_seconds = time.perf_counter() - started
            started = time.perf_counter()
            report.write(jobs.run(spark, dataset), out)
            again_seconds = time.perf_counter() - started
    finally:
        spark.stop()
    return session_seconds, scan_seconds, report_seconds, rows, merged_seconds, again_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--records", type=int, default=1_000_000, help="synthetic history size (0: only part 1)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--merged", action="store_true", help="also report over two SCs' histories merged (5.)")
    args = parser.parse_args()
    logs.configure(config.LogFormat.CONSOLE, "warning")
    work = Path(tempfile.mkdtemp(prefix="sc-audit-bench-"))
    print(f"work dir {work}; {os.cpu_count()} cores")

    baseline, _, _ = asyncio.run(provision(args.topics, args.partitions, None))
    seconds, written, dropped = asyncio.run(provision(args.topics, args.partitions, work / "provisioning-history"))
    print(f"1. provisioning {args.topics} topics x {args.partitions} partitions x RF 3:")
    print(f"   with the history: {seconds:.2f} s, {written} records written ({written / seconds:,.0f} records/s), {dropped} dropped")
    print(f"   baseline without: {baseline:.2f} s; ratio with/without {seconds / baseline:.2f}")

    if not args.records:
        return
    seconds, written = asyncio.run(synthetic_history(work / "history", args.records))
    print(f"2. synthetic history: {written:,} records through the recorder in {seconds:.1f} s ({written / seconds:,.0f} records/s)")

    read_seconds, read_rows = read_only(work / "history")
    result = export.export(work / "history", work / "export")
    print(
        f"3. export: {result.rows:,} rows in {result.seconds:.1f} s ({result.rows / result.seconds:,.0f} rows/s, {result.files} files); "
        f"baseline read+parse only {read_rows / read_seconds:,.0f} rows/s; ratio {result.seconds / read_seconds:.2f}x the read"
    )

    standby = None
    if args.merged:
        asyncio.run(synthetic_history(work / "history-standby", args.records, standby=True))
        export.export(work / "history-standby", work / "export-standby")
        standby = work / "export-standby"
    session_seconds, scan_seconds, report_seconds, rows, merged_seconds, again_seconds = spark_report(
        work / "export", work / "report", args.master, standby
    )
    print(
        f"4. Spark report on {rows:,} records ({args.master}): {report_seconds:.1f} s "
        f"(session start {session_seconds:.1f} s not included); baseline one full scan {scan_seconds:.1f} s; "
        f"ratio {report_seconds / scan_seconds:.1f}x the scan"
    )
    if standby is not None:
        print(
            f"5. Spark report on that history and a standby's, merged: {merged_seconds:.1f} s; "
            f"baseline the first alone again, after it: {again_seconds:.1f} s; ratio {merged_seconds / again_seconds:.1f}x"
        )


if __name__ == "__main__":
    main()
