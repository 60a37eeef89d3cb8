"""The task supervisor on a fast-forwarded loop clock: restarts, backoff, "failing", cancellation."""

from __future__ import annotations

import asyncio
import logging

import pytest

from store import supervisor as supervisor_module


class Script:
    """A task body that fails the given number of times, then runs until released."""

    def __init__(self, failures: int, run_for: float = 0.0) -> None:
        self.failures = failures
        self.run_for = run_for  # seconds each failing run lasts before it raises
        self.starts: list[float] = []
        self.released = asyncio.Event()

    async def __call__(self) -> None:
        loop = asyncio.get_running_loop()
        self.starts.append(round(loop.time(), 3))
        if len(self.starts) <= self.failures:
            await asyncio.sleep(self.run_for)
            raise RuntimeError(f"injected failure {len(self.starts)}")
        await self.released.wait()


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.looptime(start=0)
async def test_a_task_that_raises_is_logged_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = supervisor_module.Supervisor()
    script = Script(failures=1)
    with caplog.at_level(logging.ERROR, logger="store.supervisor"):
        task = supervisor.spawn("reader", script)
        await asyncio.sleep(1.0)
    assert script.starts == [0.0, 0.1]
    assert supervisor.restarts == {"reader": 1}
    assert supervisor.tasks == ["reader"]
    assert supervisor.failing() == []
    [record] = caplog.records
    assert record.getMessage() == (
        "task reader failed (RuntimeError: injected failure 1); restarting it in 0.1 s (failure 1 in a row, restart 1)"
    )
    assert record.exc_info is not None and "injected failure 1" in str(record.exc_info[1])
    await stop(task)
    assert supervisor.tasks == [] and supervisor.restarts == {"reader": 1}


@pytest.mark.looptime(start=0)
async def test_the_backoff_doubles_up_to_its_cap_and_starts_over_after_a_healthy_run() -> None:
    supervisor = supervisor_module.Supervisor(initial_backoff=0.1, max_backoff=0.5, healthy_after=5.0)
    script = Script(failures=5)
    task = supervisor.spawn("controller-topic", script)
    await asyncio.sleep(3.0)
    # Failing at once each time: 0.1, 0.2, 0.4, then 0.5 (the cap) between starts.
    assert script.starts == [0.0, 0.1, 0.3, 0.7, 1.2, 1.7]
    await stop(task)

    script = Script(failures=3, run_for=6.0)  # each run lasts longer than healthy_after
    task = supervisor.spawn("controller-topic", script)
    await asyncio.sleep(30.0)
    assert [round(later - earlier, 3) for earlier, later in zip(script.starts, script.starts[1:])] == [6.1, 6.1, 6.1]
    assert supervisor.failing() == []
    await stop(task)


@pytest.mark.looptime(start=0)
async def test_a_task_failing_again_and_again_is_failing_until_it_has_run_healthily() -> None:
    supervisor = supervisor_module.Supervisor(initial_backoff=0.1, max_backoff=5.0, healthy_after=5.0, failing_after=3)
    script = Script(failures=4)
    task = supervisor.spawn("reader", script)
    await asyncio.sleep(0.35)  # failed at 0.0, 0.1 and 0.3: the third one in a row
    assert supervisor.failing() == [supervisor_module.Failing("reader", 3, "RuntimeError: injected failure 3")]
    assert supervisor.failing()[0].describe() == "task reader keeps failing: RuntimeError: injected failure 3"
    await asyncio.sleep(1.0)  # the fourth failure at 0.7, the fifth start at 1.5 runs
    assert script.starts == [0.0, 0.1, 0.3, 0.7]
    assert [failing.failures for failing in supervisor.failing()] == [4]
    await asyncio.sleep(0.2)
    assert script.starts == [0.0, 0.1, 0.3, 0.7, 1.5]
    await asyncio.sleep(4.9)  # running for 4.95 s: not yet healthy
    assert [failing.failures for failing in supervisor.failing()] == [4]
    await asyncio.sleep(0.1)  # 5.05 s
    assert supervisor.failing() == []
    assert supervisor.restarts == {"reader": 4}
    await stop(task)


@pytest.mark.looptime(start=0)
async def test_a_task_that_returns_ends_and_is_not_restarted() -> None:
    supervisor = supervisor_module.Supervisor()
    finished = []

    async def once() -> None:
        finished.append(asyncio.get_running_loop().time())

    task = supervisor.spawn("spu-grace", once)
    await task
    await asyncio.sleep(10.0)
    assert finished == [0.0] and supervisor.tasks == [] and supervisor.restarts == {"spu-grace": 0}


@pytest.mark.looptime(start=0)
async def test_cancelling_stops_it_during_a_run_and_during_a_backoff() -> None:
    supervisor = supervisor_module.Supervisor(initial_backoff=1.0, max_backoff=1.0)
    script = Script(failures=1)
    task = supervisor.spawn("cm-pusher", script)
    await asyncio.sleep(0.5)  # waiting out the backoff after the first failure
    await stop(task)
    assert task.cancelled() and script.starts == [0.0] and supervisor.tasks == []
    await asyncio.sleep(5.0)
    assert script.starts == [0.0]

    task = supervisor.spawn("cm-pusher", Script(failures=0))
    await asyncio.sleep(0.5)
    await stop(task)
    assert task.cancelled() and supervisor.tasks == []


@pytest.mark.looptime(start=0)
async def test_a_cancelled_error_from_underneath_is_a_failure_not_a_stop() -> None:
    """A gRPC call cancelled by someone else raises CancelledError in the task awaiting it,
    although nobody cancelled the task: the task must come back."""
    supervisor = supervisor_module.Supervisor()
    starts = []

    async def body() -> None:
        starts.append(asyncio.get_running_loop().time())
        if len(starts) == 1:
            inner = asyncio.get_running_loop().create_future()
            inner.cancel()
            await inner
        await asyncio.Event().wait()

    task = supervisor.spawn("reader", body)
    await asyncio.sleep(1.0)
    assert starts == [0.0, 0.1] and supervisor.restarts == {"reader": 1}
    await stop(task)


def test_a_second_task_of_the_same_name_is_refused() -> None:
    async def scenario() -> None:
        supervisor = supervisor_module.Supervisor()
        async def forever() -> None:
            await asyncio.Event().wait()

        task = supervisor.spawn("reader", forever)
        with pytest.raises(ValueError, match="a task named 'reader' is already supervised"):
            supervisor.spawn("reader", forever)
        await stop(task)

    asyncio.run(scenario())


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match=r"backoff must be 0 < initial \(2.0\) <= max \(1.0\)"):
        supervisor_module.Supervisor(initial_backoff=2.0, max_backoff=1.0)
    with pytest.raises(ValueError, match="failing_after must be at least 1, got 0"):
        supervisor_module.Supervisor(failing_after=0)


@pytest.mark.looptime(start=0)
async def test_a_task_group_failing_with_one_error_is_described_by_that_error() -> None:
    supervisor = supervisor_module.Supervisor(failing_after=1)
    runs = []

    async def fails() -> None:
        raise KeyError("topics")

    async def body() -> None:
        runs.append(1)
        if len(runs) == 1:
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.Event().wait())
                group.create_task(fails())
        await asyncio.Event().wait()

    task = supervisor.spawn("fluvio-admin-waits", body)
    await asyncio.sleep(0.05)
    assert supervisor.failing() == [supervisor_module.Failing("fluvio-admin-waits", 1, "KeyError: 'topics'")]
    await stop(task)


async def test_cancel_and_wait_waits_for_the_tasks_and_does_not_swallow_a_cancel_of_its_caller() -> None:
    """``with suppress(CancelledError): await task`` after ``task.cancel()`` also swallowed a cancel
    of the task that waits: a close() cancelled meanwhile went on as if it had not been."""
    release = asyncio.Event()
    ended: list[str] = []

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # cleaning up
            ended.append("child")
            raise

    child = asyncio.ensure_future(slow_to_stop())
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(supervisor_module.cancel_and_wait(child))
    await asyncio.sleep(0.01)
    assert not closing.done()
    closing.cancel()  # the closer's own owner gives up
    await asyncio.sleep(0.01)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.sleep(0)
    assert child.cancelled() and ended == ["child"]

    # Not cancelled itself, it waits for each task, whatever they raise on cancellation.
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    tasks = [asyncio.ensure_future(slow_to_stop()), asyncio.ensure_future(fails_on_cancel()), asyncio.ensure_future(asyncio.sleep(0))]
    await asyncio.sleep(0)
    await supervisor_module.cancel_and_wait(*tasks)
    assert all(task.done() for task in tasks) and ended == ["child", "child"]
