"""Freezing real processes for the functional tests' final reads (tests/fixtures/processes.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from unittest import mock

import pytest

from tests.fixtures import processes


async def test_a_frozen_process_is_stopped_when_freeze_returns_and_runs_again_once_thawed() -> None:
    # A child that counts as fast as it can: stopped, its count no longer moves.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\ni = 0\nwhile True:\n    i += 1\n    if i % 100000 == 0:\n        print(i, flush=True)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()
        await processes.freeze([child.pid])
        assert processes._state(child.pid) == "T"
        processes.thaw([child.pid])
        for _ in range(1000):
            if processes._state(child.pid) != "T":
                break
            await asyncio.sleep(0.005)
        assert processes._state(child.pid) in ("R", "S")
        child.stdout.readline()  # it counts on
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    # Gone (reaped): nothing to freeze, nothing to wait for.
    await processes.freeze([child.pid])
    processes.thaw([child.pid])
    assert processes._state(child.pid) is None


async def test_a_failed_read_of_a_living_process_is_not_taken_for_a_stop() -> None:
    """Reads of a living process's /proc files were seen to fail for a moment on a loaded machine:
    freeze waits on, and gives up naming the process, rather than return while it may still run."""
    child = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(60)"])
    try:
        with mock.patch.object(processes, "_state", return_value=None):
            with pytest.raises(AssertionError, match=f"processes \\[{child.pid}\\] did not stop within 0.3 s"):
                await processes.freeze([child.pid], seconds=0.3)
    finally:
        processes.thaw([child.pid])
        child.kill()
        child.wait()
