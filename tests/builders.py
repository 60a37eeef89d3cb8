"""Object builders and the one polling helper shared by the tests.

Each builder gives a valid object with plain defaults; a test passes only what it is about.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.reconcile import actions
from store import kv, models


def spu(
    spu_id: int,
    resolution: str = "Online",
    rack: str | None = None,
    name: str | None = None,
    spu_type: str = "Custom",
    host: str = "127.0.0.1",
) -> models.Spu:
    return models.Spu.model_validate(
        {
            "name": name or f"spu-{spu_id}",
            "spec": {
                "id": spu_id,
                "spuType": spu_type,
                "rack": rack,
                "publicEndpoint": {"host": host, "port": 9005},
                "privateEndpoint": {"host": host, "port": 9006},
            },
            "status": {"resolution": resolution},
        }
    )


def topic(
    name: str,
    partitions: int | None = 1,
    replication_factor: int | None = 1,
    resolution: str = "Init",
    *,
    reason: str = "",
    replica_map: Mapping[int, Sequence[int]] | Mapping[str, Sequence[int]] | None = None,
    **spec: Any,
) -> models.Topic:
    """``spec`` takes the other TopicSpec fields (``placement``, ``replica_assignment``, ...); a
    topic given by its assignment passes ``partitions=None, replication_factor=None``."""
    return models.Topic.model_validate(
        {
            "name": name,
            "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec},
            "status": {"resolution": resolution, "replicaMap": replica_map or {}, "reason": reason},
        }
    )


def partition(
    name: str,
    replicas: Sequence[int] = (0,),
    leader: int | None = None,
    resolution: str = "Offline",
    uid: int | None = None,
) -> models.Partition:
    """The leader defaults to the first replica, as the topic controller assigns it. No ``uid``: a
    partition without an identity, as created before SCs gave partitions one."""
    spec = {"leader": replicas[0] if leader is None else leader, "replicas": list(replicas)}
    document: dict[str, object] = {"name": name, "spec": spec, "status": {"resolution": resolution}}
    if uid is not None:
        document["uid"] = uid
    return models.Partition.model_validate(document)


def spu_group(
    name: str = "main",
    replicas: int = 1,
    min_id: int = 0,
    resolution: str = "Init",
    *,
    reason: str = "",
    rack: str | None = None,
) -> models.SpuGroup:
    return models.SpuGroup.model_validate(
        {"name": name, "spec": {"replicas": replicas, "minId": min_id, "rack": rack}, "status": {"resolution": resolution, "reason": reason}}
    )


async def eventually(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Call ``check`` (plain or async) until it passes, and return what it returned.

    It passes when it neither raises AssertionError nor returns False, so it may be an assertion
    or a predicate. The deadline is generous on purpose: a passing check returns at once, so only
    a failing test waits for it. At the deadline the last failure is the message.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        failure: AssertionError | None = None
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except AssertionError as error:
            failure = error
        else:
            if result is not False:
                return result
        if loop.time() > deadline:
            last_seen = f"the last attempt failed: {failure}" if failure is not None else "the last attempt returned False"
            raise AssertionError(f"{_describe(check)} did not pass within {timeout} s; {last_seen}") from failure
        await asyncio.sleep(interval)


async def present(kv_store: kv.KVStore, key: str) -> kv.KeyValue:
    """The key as stored, failing the test if it is absent."""
    item = await kv_store.get(key)
    assert item is not None, f"{key} is not in the store"
    return item


def written(write: actions.Write) -> bytes:
    """The value a write puts (failing the test if it is a delete)."""
    assert write.value is not None, f"{write.key} is deleted, not written"
    return write.value


def _describe(check: Callable[[], object]) -> str:
    name = getattr(check, "__qualname__", repr(check))
    # A lambda's name says nothing; its source line says what was awaited.
    if name.endswith("<lambda>"):
        try:
            return inspect.getsource(check).strip()
        except (OSError, TypeError):
            return name
    return name
