"""Synthetic histories written through the recorder, as a running SC would write them, at chosen times.

``Writer`` plays both the Reader (change records, one revision per write) and the dispatcher (the
action record of each SC write, with its cause); a user's write has no action record.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from store import history, models

T0 = datetime.datetime(2026, 3, 1, 10, 0, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0.timestamp()

    def __call__(self) -> float:
        return self.now


class Writer:
    def __init__(self, directory: Path, first_revision: int = 100) -> None:
        self.clock = Clock()
        self.recorder = history.Recorder.open(directory, clock=self.clock)
        self.revision = first_revision
        self.objects: dict[str, models.AnyObject] = {}
        self.revisions: dict[str, int] = {}  # each object's last write (its mod revision)
        self.losing = False

    def at(self, seconds: float) -> Writer:
        """Records from now on are at T0 + ``seconds``."""
        self.clock.now = T0.timestamp() + seconds
        return self

    # ------------------------------------------------------------------ writes

    def put(self, *objects: models.AnyObject, by_sc: str | None = None, cause: str = "", verb: str = "update-status") -> int:
        """Write ``objects`` in one transaction; ``by_sc``: the reason of the SC action that did it."""
        self.revision += 1
        if self.losing:
            for obj in objects:
                self.objects[obj.key] = obj
                self.revisions[obj.key] = self.revision
            return self.revision
        if by_sc is not None:
            name = objects[0].name
            keys = [obj.key for obj in objects]
            self.recorder.record_action(objects[0].kind, name, verb, by_sc, cause, self.revision - 1, "applied", self.revision, keys)
        for obj in objects:
            op = history.UPDATE if obj.key in self.objects else history.CREATE
            self.objects[obj.key] = obj
            self.revisions[obj.key] = self.revision
            self.recorder.record_change(obj.kind, obj.name, op, self.revision, models.encode(obj))
        return self.revision

    def delete(self, kind: str, name: str, by_sc: str | None = None, requested_by: tuple[str, str] | None = None) -> int:
        """``requested_by``: the principal and address of the API request that deleted it."""
        self.revision += 1
        key = models.object_key(kind, name)
        del self.revisions[key]
        if self.losing:
            del self.objects[key]
            return self.revision
        if requested_by is not None:
            self.recorder.record_request(kind, name, self.revision, *requested_by)
        if by_sc is not None:
            self.recorder.record_action(kind, name, "delete", by_sc, "", self.revision - 1, "applied", self.revision, [key])
        del self.objects[key]
        self.recorder.record_change(kind, name, history.DELETE, self.revision, None)
        return self.revision

    @contextlib.contextmanager
    def lost(self) -> Iterator[None]:
        """The writes made within reach the store, but the history loses them (its queue was full):
        a gap record covers their revisions."""
        first = self.revision + 1
        self.losing = True
        try:
            yield
        finally:
            self.losing = False
        self.recorder.record_gap(first, self.revision, "queue-full", dropped=self.revision - first + 1)

    def relist(self) -> int:
        """The SC away while etcd compacts (one revision of something else): a gap, then the snapshot
        the Reader lists, each object at its last write (as created before: an update)."""
        self.revision += 1
        self.recorder.record_gap(self.revision, self.revision, "compacted")
        for key, obj in sorted(self.objects.items()):
            self.recorder.record_change(
                obj.kind, obj.name, history.UPDATE, self.revisions[key], models.encode(obj), source=history.LIST,
                snapshot=self.revision,
            )
        self.recorder.record_sync(self.revision, snapshot=True)
        return self.revision

    def get(self, kind: str, name: str) -> Any:
        return self.objects[models.object_key(kind, name)]

    # ------------------------------------------------------------------ object helpers

    def spu(self, spu_id: int, rack: str | None, resolution: str = "Init", port: int = 9005) -> models.Spu:
        return models.Spu.model_validate(
            {
                "name": f"spu-{spu_id}",
                "spec": {
                    "id": spu_id, "rack": rack, "publicEndpoint": {"host": "127.0.0.1", "port": port},
                    "privateEndpoint": {"host": "127.0.0.1", "port": 9006},
                },
                "status": {"resolution": resolution},
            }
        )

    def spu_state(self, spu_id: int, resolution: str) -> int:
        spu = self.get("spus", f"spu-{spu_id}")
        return self.put(spu.model_copy(update={"status": models.SpuStatus(resolution=resolution)}), by_sc="SPU health")

    def topic(self, name: str, spec: dict[str, Any]) -> int:
        return self.put(models.Topic.model_validate({"name": name, "spec": spec}))

    def topic_status(self, name: str, resolution: str, replica_map: dict[int, list[int]] | None = None) -> models.Topic:
        topic = self.get("topics", name)
        status = models.TopicStatus(resolution=resolution, replica_map=replica_map or {})
        return topic.model_copy(update={"status": status})

    def provision(self, name: str, replica_map: dict[int, list[int]]) -> int:
        """Topic Provisioned and its partitions created, in one transaction (as the topic controller does)."""
        topic = self.topic_status(name, "Provisioned", replica_map)
        partitions = [
            models.Partition.model_validate(
                {"name": f"{name}-{index}", "spec": {"leader": replicas[0], "replicas": replicas}}
            )
            for index, replicas in replica_map.items()
        ]
        return self.put(topic, *partitions, by_sc="provisioned", verb="provision")

    def partition_state(self, name: str, resolution: str, leader: int | None = None) -> int:
        partition = self.get("partitions", name)
        status = models.PartitionStatus(
            resolution=resolution, leader=None if leader is None else models.ReplicaStatus(spu=leader, hw=0, leo=0)
        )
        return self.put(partition.model_copy(update={"status": status}), by_sc="live replicas")

    def elect(self, name: str, leader: int, cause: str | None) -> int:
        """spec.leader and status.leader change in one write; cause None: written by a user."""
        partition = self.get("partitions", name)
        updated = partition.model_copy(
            update={
                "spec": partition.spec.model_copy(update={"leader": leader}),
                "status": models.PartitionStatus(resolution="Online", leader=models.ReplicaStatus(spu=leader, hw=0, leo=0)),
            }
        )
        if cause is None:
            return self.put(updated)
        return self.put(updated, by_sc=f"elected {leader}", cause=cause, verb="update-spec")

    async def close(self) -> None:
        await self.recorder.start()
        await self.recorder.close()


def move_step(
    w: Writer,
    name: str,
    replicas: list[int],
    cause: str,
    reassignment: tuple[list[int], list[int]] | None,
    leader: int | None = None,
    hw: int | None = None,
) -> int:
    """The partition controller's write of one move step; ``hw``: the committed offset its status
    records (the status is kept otherwise)."""
    partition = w.get("partitions", name)
    move = None if reassignment is None else models.Reassignment(previous=reassignment[0], target=reassignment[1])
    leader = partition.spec.leader if leader is None else leader
    spec = models.PartitionSpec(leader=leader, replicas=replicas, reassignment=move)
    status = partition.status
    if hw is not None:
        status = status.model_copy(update={"leader": models.ReplicaStatus(spu=leader, hw=hw, leo=hw + 5)})
    return w.put(partition.model_copy(update={"spec": spec, "status": status}), by_sc="move step", cause=cause, verb="update-spec")


def caught_up(w: Writer, name: str, isr: list[int], hw: int) -> int:
    """The write that commits the last arriving replica into the in-sync set (a status write)."""
    partition = w.get("partitions", name)
    leader = partition.spec.leader
    status = models.PartitionStatus(
        resolution="Online", leader_epoch=1, partition_epoch=3, isr=isr, leader=models.ReplicaStatus(spu=leader, hw=hw, leo=hw + 5),
    )
    return w.put(partition.model_copy(update={"status": status}), by_sc="in-sync set grows", cause="move-caught-up")


def iso(seconds: float) -> str:
    """The report's ISO 8601 form of T0 + ``seconds``."""
    return (T0 + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def write_cluster_story(directory: Path) -> Writer:
    """The scenario the Spark tests assert exact figures on (see test_jobs.py for the expected ones)."""
    w = Writer(directory)
    w.at(0)
    # The recording SC leads from the start; later it is deposed, and takes the store back.
    w.recorder.record_takeover("sc-a", "10.0.0.1:9003", 99, "unclaimed", None, 0)
    for spu_id, rack in ((0, "r1"), (1, "r1"), (2, "r2"), (3, "r3")):
        w.put(w.spu(spu_id, rack))
    w.at(1)
    for spu_id in range(4):
        w.spu_state(spu_id, "Online")

    w.at(5).topic("orders", {"partitions": 2, "replicationFactor": 2})
    w.at(5.5).put(w.topic_status("orders", "Pending"), by_sc="valid configuration")
    w.at(7).provision("orders", {0: [0, 2], 1: [2, 3]})
    w.at(8).partition_state("orders-0", "Online", 0)
    w.partition_state("orders-1", "Online", 2)

    w.at(10).topic("events", {"partitions": 1, "replicationFactor": 1})
    w.at(10.25).put(w.topic_status("events", "Pending"), by_sc="valid configuration")
    w.at(12.5).provision("events", {0: [3]})
    w.at(13).partition_state("events-0", "Online", 3)

    w.at(20).spu_state(0, "Offline")
    w.at(20.5).elect("orders-0", 2, "spu-offline")
    w.at(25).spu_state(0, "Online")
    w.at(26).elect("orders-0", 0, "preferred-leader")

    w.at(30).spu_state(3, "Offline")
    w.partition_state("events-0", "LeaderOffline")
    w.at(45).spu_state(3, "Online")
    w.at(45.5).partition_state("events-0", "Online", 3)

    w.at(50).topic("manual", {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]})
    w.at(51).provision("manual", {0: [0, 1]})
    w.at(52).partition_state("manual-0", "Online", 0)

    w.at(60).spu_state(3, "Offline")
    w.at(60.5).partition_state("events-0", "LeaderOffline")
    w.at(61.5).spu_state(3, "Online")
    w.at(62).partition_state("events-0", "Online", 3)

    w.at(64).recorder.record_step_down("sc-a", 99, "fenced")
    w.at(66).recorder.record_takeover("sc-a", "10.0.0.1:9003", 150, "lease-expired", "sc-b", 140)
    w.at(70).elect("orders-1", 3, "drain")
    w.at(80).elect("orders-1", 2, "unclean")
    w.at(85).elect("orders-1", 3, None)

    w.at(90).put(w.spu(4, "r3"))
    w.at(95).put(w.spu(4, "r3", port=9015))
    w.at(99.5).spu_state(3, "Offline")
    w.at(100).partition_state("events-0", "LeaderOffline")

    w.at(105).topic("tmp", {"partitions": 1, "replicationFactor": 9})
    w.at(106).put(w.topic_status("tmp", "InsufficientResources"), by_sc="6 SPUs missing")
    w.at(110).delete("topics", "tmp", requested_by=("alice", "10.0.0.7"))
    w.at(115).put(models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 1, "minId": 10}}))
    reserved = models.SpuGroupStatus(resolution="Reserved")
    w.at(115.5).put(w.get("spu-groups", "g").model_copy(update={"status": reserved}), by_sc="ids 10..10 are free")
    managed = models.Spu.model_validate(
        {
            "name": "g-0",
            "spec": {
                "id": 10, "spuType": "Managed", "publicEndpoint": {"host": "127.0.0.1", "port": 10010},
                "privateEndpoint": {"host": "127.0.0.1", "port": 30010},
            },
        }
    )
    w.put(managed, by_sc="SPU 10 of group g", verb="create")
    w.at(120).topic("late", {"partitions": 1, "replicationFactor": 1})
    await w.close()
    # Written by hand into the history: the export skips them (a leader that is a string, not JSON).
    log = history.SegmentLog(directory)
    log.open()
    moved = b'{"name":"orders-0","spec":{"leader":"2","replicas":[0,2]},"status":{"resolution":"Online"}}'
    fields = {
        "seq": log.next_seq, "type": "change", "kind": "partitions", "name": "orders-0", "op": "update",
        "revision": w.revision + 1, "source": "watch", "time": int((T0.timestamp() + 121) * 1_000_000),
    }
    log.append([history.encode(fields, moved), b"not json"])
    log.close()
    return w
