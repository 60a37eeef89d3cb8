"""One SC per store: `sc run` uses only the etcd it started, and refuses to run where another SC
is active. Real `sc run` processes, each with its own data dir, on free ports."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from store import embedded_etcd

pytestmark = pytest.mark.etcd


class ScRun:
    """`sc run` with its embedded etcd as a child process."""

    def __init__(self, data_dir: Path, etcd_ports: tuple[int, int], *extra: str) -> None:
        self.data_dir = data_dir
        self.public_port, self.private_port = embedded_etcd.free_ports(2)
        self.log_path = data_dir.with_suffix(".log")
        self.command = [
            sys.executable, "-m", "controller.cli", "run",
            "--data-dir", str(data_dir),
            "--embedded-etcd-client-port", str(etcd_ports[0]),
            "--embedded-etcd-peer-port", str(etcd_ports[1]),
            "--bind-host", "127.0.0.1",
            "--public-port", str(self.public_port),
            "--private-port", str(self.private_port),
            "--log-format", "json",
            *extra,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )

    def wait_exit(self, timeout: float) -> tuple[int, str]:
        assert self.process is not None
        _, stderr = self.process.communicate(timeout=timeout)
        return self.process.returncode, stderr.decode()

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                assert self.process is not None and self.process.poll() is None, self.log_path.read_text()[-3000:]
                try:
                    async with session.get(f"{self.url}/healthz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"sc run not healthy within {timeout} s:\n{self.log_path.read_text()[-3000:]}")
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.communicate()


@pytest.fixture
def processes() -> Iterator[list[ScRun]]:
    started: list[ScRun] = []
    yield started
    for process in started:
        process.stop()


async def test_a_second_sc_run_on_the_same_etcd_ports_fails_within_seconds_naming_port_owner_and_flag(
    tmp_path: Path, processes: list[ScRun]
) -> None:
    etcd_ports = (client_port, _) = tuple(embedded_etcd.free_ports(2))
    first = ScRun(tmp_path / "first", etcd_ports)  # type: ignore[arg-type]
    processes.append(first)
    first.start()
    await first.wait_healthy()
    etcd_pid = int((tmp_path / "first" / "etcd.lock").read_text().split("etcd pid ")[1])

    second = ScRun(tmp_path / "second", etcd_ports)  # type: ignore[arg-type]
    processes.append(second)
    began = time.monotonic()
    second.start()
    code, stderr = second.wait_exit(timeout=30)
    assert time.monotonic() - began < 15  # the interpreter's start included
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        f"error: the embedded etcd cannot start: its client port 127.0.0.1:{client_port} is already in use by "
        f"pid {etcd_pid} (etcd, data dir {tmp_path / 'first' / 'etcd'}); stop that process, or give this SC "
        f"another client port with --embedded-etcd-client-port (or SC_EMBEDDED_ETCD_CLIENT_PORT)"
    )
    await first.wait_healthy(timeout=5)
