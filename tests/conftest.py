"""Shared fixtures: the KV backends the contract suite runs against, a task-leak guard, and a guard
against a test configuring logging for the tests after it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings as hypothesis_settings

from store import kv, memory

# Property tests explore the same examples on every run (no test may pass or fail by luck); the
# "explore" profile (`pytest --hypothesis-profile=explore`) searches afresh, to look for new cases.
# No deadline per example: hypothesis's default 200 ms is a wall-clock bound, which a garbage
# collection or a busy CI machine could break for an example that takes microseconds.
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile("deterministic")

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.daemon", "tests.fixtures.spark"]


def free_ports_slice(worker: str, workers: int) -> str:
    """The ports (FIRST-END) pytest-xdist's worker ``worker`` ("gw1") draws free ports from: its
    share of those below the ephemeral range. Workers sharing one range picked the same port."""
    first = 10_000
    try:
        end = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        end = 32768
    width = (end - first) // workers
    index = int(worker.removeprefix("gw"))
    return f"{first + index * width}-{first + (index + 1) * width}"


def pytest_configure(config: pytest.Config) -> None:
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and workers:
        # Also inherited by the processes the worker's tests start (sc run, sc demo).
        os.environ["SC_FREE_PORTS"] = free_ports_slice(worker, int(workers))


@pytest.fixture
async def memory_store() -> AsyncIterator[kv.KVStore]:
    store = memory.MemoryStore()
    yield store
    await store.close()


@pytest.fixture(params=["memory_store", pytest.param("etcd_store", marks=pytest.mark.etcd)])
def kv_store(request: pytest.FixtureRequest) -> kv.KVStore:
    """The same contract runs against the memory backend and a real etcd."""
    return request.getfixturevalue(request.param)


@pytest.fixture(autouse=True)
def no_logging_configured_for_later_tests() -> Iterator[None]:
    """A CLI command run in-process (`cli.main(["spu", "run", ...])`) configures logging for the
    whole process (controller.logs.configure: JSON on stderr, loggers cached on first use), so a
    later test in the same worker that reads the SC's log on stdout failed, or not, by the order
    xdist gave the tests. Such a test must patch ``controller.logs.configure``; this says which."""
    before = structlog.get_config()["logger_factory"]
    yield
    assert structlog.get_config()["logger_factory"] is before, (
        "this test configured logging for the whole process (controller.logs.configure, as `sc run` and "
        "`sc spu run` do in-process): patch controller.logs.configure in it, or later tests log elsewhere"
    )


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves tasks running on its loop (kopf's habit)."""
    before = asyncio.all_tasks()
    yield
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while True:
        # A cancelled gRPC call finishes its own bookkeeping task a moment later: allow 1 s.
        leaked = [
            task
            for task in asyncio.all_tasks() - before
            if not task.done() and task is not asyncio.current_task()
        ]
        if not leaked or loop.time() > deadline:
            break
        await asyncio.sleep(0.01)
    for task in leaked:
        task.cancel()
    assert not leaked, f"test left tasks running: {leaked}"
