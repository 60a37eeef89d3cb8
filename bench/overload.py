"""Overload benchmark (the Overload issue, items 1, 2, 5 and 6): a real `sc run` (memory store, its
default limits and timeouts) with three simulated SPUs in a process of their own, attacked by each
attack below in turn; for each, the SC's figures during and after it, next to the same figures with
no attack, in one run.

Figures per phase: the SC's RSS and open descriptors (the peak during an attack, the last sample
after it); /healthz p99 and failures, from a prober process of its own (a new connection for each
GET, every 50 ms, 2 s timeout, from 127.0.0.1); SPU disconnects (SPU connections the SC accepted
again, i.e. reconnections); the bytes the SC logged. Attackers connect from 127.0.0.2 and up.

Attacks are async functions (target, options) listed in ATTACKS: each runs its attack, holds the
connections it opened for `--seconds` where it holds any, closes them before returning, and may
return a note for the table. Another
attack is one more function in that list; the expensive reads and watchers are bench/overload_reads.py's
(its own etcd and seeding).

    .venv/bin/python bench/overload.py [--seconds 15] [--only aborted-uploads,junk] [--idle 15000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import aiohttp  # noqa: E402

from bench import provisioning  # noqa: E402
from connection_manager import wire  # noqa: E402
from controller.api.fluvio import messages  # noqa: E402
from store import embedded_etcd  # noqa: E402

MiB = 1024 * 1024
SPUS = 3
PROBE_INTERVAL = 0.05
PROBE_TIMEOUT = 2.0
ATTACKERS = [f"127.0.0.{host}" for host in range(2, 10)]

PROBE = """
import asyncio, sys, time

async def probe(port: int) -> None:
    started = time.monotonic()
    try:
        async with asyncio.timeout(%(timeout)s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n")
            answer = await reader.read()
            writer.close()
        seconds = time.monotonic() - started if answer.startswith(b"HTTP/1.1 200") else -1.0
    except (OSError, TimeoutError):
        seconds = -1.0
    print(f"{started:.6f} {seconds:.6f}", flush=True)

async def main(port: int) -> None:
    running = set()
    while True:
        task = asyncio.create_task(probe(port))
        running.add(task)
        task.add_done_callback(running.discard)
        await asyncio.sleep(%(interval)s)

asyncio.run(main(int(sys.argv[1])))
""" % {"timeout": PROBE_TIMEOUT, "interval": PROBE_INTERVAL}


@dataclass(frozen=True)
class Options:
    seconds: float  # each hold, the baseline and each "after" phase
    idle: int  # connections of the idle-connections attack


@dataclass
class Target:
    public_port: int
    private_port: int
    pid: int
    log_path: Path
    # SPU connections an attack itself had accepted (not the real SPUs' reconnections).
    own_spu_connections: int = 0

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        return provisioning.process_cpu_seconds(self.pid)

    def descriptors(self) -> int:
        return len(list(Path(f"/proc/{self.pid}/fd").iterdir()))

    def log_bytes(self) -> int:
        return self.log_path.stat().st_size

    async def metric(self, name: str) -> float:
        """A metric of the SC, retried while its public port is busy."""
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with aiohttp.ClientSession() as session, asyncio.timeout(5):
                    async with session.get(f"http://127.0.0.1:{self.public_port}/metrics") as response:
                        for line in (await response.text()).splitlines():
                            if line.startswith(name + " "):
                                return float(line.split()[1])
                        raise RuntimeError(f"no {name} in /metrics")
            if time.monotonic() > deadline:
                raise RuntimeError(f"/metrics did not answer for 60 s ({name})")
            await asyncio.sleep(0.5)


@dataclass
class Phase:
    name: str
    started: float = 0.0
    ended: float = 0.0
    peak_rss: int = 0
    last_rss: int = 0
    peak_descriptors: int = 0
    last_descriptors: int = 0
    logged: int = 0
    spu_reconnects: float = 0.0
    probes: list[float] = field(default_factory=list)  # seconds; -1 for a failure
    note: str = ""

    def healthz(self) -> tuple[str, str]:
        answered = sorted(seconds for seconds in self.probes if seconds >= 0)
        failed = len(self.probes) - len(answered)
        p99 = answered[min(len(answered) - 1, int(0.99 * (len(answered) - 1) + 0.5))] * 1000 if answered else float("nan")
        return f"{p99:.1f}", f"{failed}/{len(self.probes)}"


class Measure:
    """Samples the SC's RSS and descriptors, and collects the prober's answers, phase by phase."""

    def __init__(self, target: Target, probes: list[tuple[float, float]]) -> None:
        self.target = target
        self.probes = probes
        self.phases: list[Phase] = []

    @contextlib.asynccontextmanager
    async def phase(self, name: str):
        phase = Phase(name, started=time.monotonic())
        logged_before = self.target.log_bytes()
        accepted_before = await self.target.metric("sc_spu_connections_accepted_total")
        own_before = self.target.own_spu_connections
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                rss, descriptors = self.target.rss(), self.target.descriptors()
                phase.peak_rss, phase.last_rss = max(phase.peak_rss, rss), rss
                phase.peak_descriptors, phase.last_descriptors = max(phase.peak_descriptors, descriptors), descriptors
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)

        sampler = asyncio.create_task(sample())
        try:
            yield phase
        finally:
            phase.ended = time.monotonic()
            stop.set()
            await sampler
            phase.probes = [seconds for at, seconds in self.probes if phase.started <= at < phase.ended]
            phase.logged = self.target.log_bytes() - logged_before
            accepted = await self.target.metric("sc_spu_connections_accepted_total") - accepted_before
            phase.spu_reconnects = accepted - (self.target.own_spu_connections - own_before)
            self.phases.append(phase)
            print(f"  {name}: done in {phase.ended - phase.started:.1f} s {phase.note}", flush=True)


# ---------------------------------------------------------------------------- attacks


async def raw_connection(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        sock.bind((host, 0))
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def open_many(count: int, port: int, first_bytes: bytes = b"") -> list[socket.socket]:
    """``count`` connections from the attacker addresses, each having sent ``first_bytes``."""
    loop = asyncio.get_running_loop()
    opened: list[socket.socket] = []
    gate = asyncio.Semaphore(200)

    async def one(index: int) -> None:
        async with gate:
            with contextlib.suppress(OSError):
                sock = await raw_connection(ATTACKERS[index % len(ATTACKERS)], port)
                opened.append(sock)
                if first_bytes:
                    with contextlib.suppress(OSError):
                        await loop.sock_sendall(sock, first_bytes)

    await asyncio.gather(*(one(index) for index in range(count)))
    return opened


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


async def send_then_abort(host: str, port: int, head: bytes, size: int, seconds: float) -> None:
    """``head`` then ``size`` bytes, then a reset; gives up after ``seconds``."""
    with contextlib.suppress(OSError, TimeoutError):
        _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))
        try:
            async with asyncio.timeout(seconds):
                writer.write(head)
                chunk = b" " * (256 * 1024)
                for _ in range(size // len(chunk)):
                    writer.write(chunk)
                    await writer.drain()
        finally:
            writer.transport.abort()


async def aborted_uploads(target: Target, options: Options) -> str:
    """Item 1: 100 POSTs to /v1/placement (a topic create takes no more than its store holds) announcing 16,000,000 bytes, sending 15 MiB, then a reset; three times."""
    head = b"POST /v1/placement HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 16000000\r\n\r\n"
    for _ in range(3):
        await asyncio.gather(
            *(send_then_abort(ATTACKERS[index % len(ATTACKERS)], target.public_port, head, 15 * MiB, 4 * options.seconds) for index in range(100))
        )
    return ""


async def fluvio_large_frames(target: Target, options: Options) -> str:
    """Item 2: 100 Fluvio connections announcing 16 MiB Create frames and sending 15 MiB, then silent.

    A Create is the only request that may be large, up to what one store request holds (1.6 MB on
    the default limits): these are refused at their header, before any of their bytes is read."""
    head = (16 * MiB).to_bytes(4, "big") + messages.CREATE.to_bytes(2, "big")
    sent: list[socket.socket] = []

    async def one(index: int) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            sock = await raw_connection(ATTACKERS[index % len(ATTACKERS)], target.public_port)
            sent.append(sock)
            async with asyncio.timeout(options.seconds):
                await asyncio.get_running_loop().sock_sendall(sock, head + b" " * (15 * MiB))

    await asyncio.gather(*(one(index) for index in range(100)))
    sent_whole = sum(1 for sock in sent if _open(sock))
    await asyncio.sleep(options.seconds)
    still = sum(1 for sock in sent if _open(sock))
    close_all(sent)
    return f"({sent_whole} of 100 still open once their 15 MiB were sent or refused, {still} after {options.seconds:g} s more)"


async def idle_connections(target: Target, options: Options) -> str:
    """Item 2: connections that send nothing (15,000 by default), from 8 addresses, held for the phase."""
    opened = await open_many(options.idle, target.public_port)
    await asyncio.sleep(options.seconds)
    still = sum(1 for sock in opened if _open(sock))
    close_all(opened)
    return f"({len(opened)} opened, {still} still open at the end)"


async def slow_clients(target: Target, options: Options) -> str:
    """Item 2: 500 of each: a partial request line, a body trickled a byte a second, silence, a partial
    WebSocket upgrade on the private port, a Fluvio length prefix never followed by its frame."""
    kinds = [
        (target.public_port, b"GET /heal"),
        (target.public_port, b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{"),
        (target.public_port, b""),
        (target.private_port, f"GET {wire.SPU_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConn".encode()),
        (target.public_port, (1000).to_bytes(4, "big")),
    ]
    opened = [await open_many(500, port, first) for port, first in kinds]
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + options.seconds
    while time.monotonic() < deadline:
        for sock in opened[1]:  # the trickled bodies
            with contextlib.suppress(OSError):
                await loop.sock_sendall(sock, b" ")
        await asyncio.sleep(1.0)
    still = [sum(1 for sock in group if _open(sock)) for group in opened]
    for group in opened:
        close_all(group)
    return f"(still open at the end, of 500 each: {still})"


async def junk(target: Target, options: Options) -> str:
    """Item 6: 300 connections each sending 1 MiB of non-HTTP bytes; the bytes answered."""
    answered = 0
    payload = b"\x16\x03\x01" + bytes(range(256)) * (MiB // 256)

    async def one(index: int) -> None:
        nonlocal answered
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", target.public_port, local_addr=(ATTACKERS[index % len(ATTACKERS)], 0))
            try:
                async with asyncio.timeout(options.seconds):
                    with contextlib.suppress(OSError):
                        writer.write(payload)
                        await writer.drain()
                    answered += len(await reader.read())
            finally:
                writer.transport.abort()

    await asyncio.gather(*(one(index) for index in range(300)))
    return f"({answered} bytes answered to 300 MiB of junk, {answered / 300:.0f} per connection)"


async def spu_impostors(target: Target, options: Options) -> str:
    """Item 5: for ``--seconds``, connections to 9004 claiming the live SPUs' ids without a token: from
    other addresses (refused: no token, not loopback), from this host (refused: the SPU holding the
    id is healthy), and with a broken first frame. The real SPUs must stay connected (the table's SPU
    reconnect column) and the refusals must be logged once per cause and interval, not per try."""
    counts = {"refused": 0, "accepted": 0}
    url_path = wire.SPU_PATH
    deadline = asyncio.get_running_loop().time() + options.seconds

    async def claim(session: aiohttp.ClientSession, index: int) -> None:
        spu_id = index % SPUS
        frames = [wire.encode(wire.Register(spu_id=spu_id)), b"\x00not a frame\xff"]
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with asyncio.timeout(2):
                    async with session.ws_connect(f"ws://127.0.0.1:{target.private_port}{url_path}") as ws:
                        await ws.send_bytes(frames[index % 2])
                        answer = await ws.receive()
                        accepted = answer.type is aiohttp.WSMsgType.BINARY and b'"accepted"' in answer.data
                        counts["accepted" if accepted else "refused"] += 1

    async def from_address(address: str, indexes: range) -> None:
        connector = aiohttp.TCPConnector(local_addr=(address, 0), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(claim(session, index) for index in indexes))

    # 8 claimers from each attacker address and 8 from this host (loopback: the SC's rule for SPUs
    # without a token lets them try; only the healthy sessions of the real SPUs refuse them).
    await asyncio.gather(*(from_address(address, range(8)) for address in [*ATTACKERS, "127.0.0.1"]))
    return f"({counts['refused']} impostor registrations refused, {counts['accepted']} accepted)"


async def refused_frames(target: Target) -> float:
    """SPU frames the SC refused as invalid so far (none yet: no such series)."""
    try:
        return await target.metric('sc_spu_frame_errors_total{code="invalid"}')
    except RuntimeError:
        return 0.0


async def spu_large_frames(target: Target, options: Options) -> str:
    """For ``--seconds``, one more registered SPU (id 100, from this host: no token needed there)
    sends the largest frames the SC takes, back to back: heartbeats with a third of a million
    unknown fields, each refused after a full parse (0.7-0.8 s of the SC's loop, as a valid
    `leading` frame of that size). The SC reads them no faster than `spu_frame_bytes_per_second`
    beyond its burst; the real SPUs must stay connected and /healthz answer."""
    fields = ",".join(f'"x{index}":[]' for index in range((wire.MAX_FRAME_BYTES - 64) // 14))
    return await _flood_spu_frames(target, options, ('{"v":2,"type":"heartbeat",' + fields + "}").encode(), refused_frames)


async def spu_stale_leaderships(target: Target, options: Options) -> str:
    """As spu-large-frames, with well-formed `leading` frames of 90,000 confirmations the SC never
    told the flooding SPU (a partition it follows, at an epoch that does not exist): each entry is
    stale, and each once earned an error frame of its own (90,000 answers to build, encode and send
    per frame); the SC now answers a frame's first 16 and the rest in one."""
    entry = '{"partition":"flooded-0","leaderEpoch":999}'
    count = (wire.MAX_FRAME_BYTES - 64) // (len(entry) + 1)
    entries = ",".join([entry] * count)

    async def frames_read(target: Target) -> float:
        try:
            return await target.metric("sc_spu_stale_entries_total") / count
        except RuntimeError:
            return 0.0  # no such series yet

    frame = ('{"v":2,"type":"leading","partitions":[' + entries + "]}").encode()
    # A partition SPU 100 hosts (an entry for one it does not refuses the whole frame at once).
    topic = {"name": "flooded", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 100]}]}}
    return await _flood_spu_frames(target, options, frame, frames_read, topic)


async def _flood_spu_frames(
    target: Target,
    options: Options,
    frame: bytes,
    frames_read: Callable[[Target], Awaitable[float]],
    topic: dict[str, Any] | None = None,
) -> str:
    """Registers SPU 100 and sends ``frame`` back to back for ``--seconds``; ``frames_read``: how
    many such frames the SC has read so far (from its metrics); ``topic``: created once SPU 100 is
    registered (deleted after), its partition 0 waited for before SPU 100 connects."""
    assert len(frame) <= wire.MAX_FRAME_BYTES, len(frame)
    spec = {"id": 100, "publicEndpoint": {"host": "127.0.0.1", "port": 1}, "privateEndpoint": {"host": "127.0.0.1", "port": 2}}
    async with aiohttp.ClientSession(f"http://127.0.0.1:{target.public_port}") as api:
        async with api.post("/v1/spus", json={"name": "spu-flooder", "spec": spec}) as response:
            assert response.status == 201, await response.text()
        if topic is not None:
            async with api.post("/v1/topics?timeout=10000", json=topic) as response:
                assert response.status == 201, await response.text()
            for _attempt in range(100):
                async with api.get(f"/v1/partitions/{topic['name']}-0") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.1)
        read_before = await frames_read(target)
        cpu_before, started = target.cpu_seconds(), time.monotonic()
        sent = 0
        async with aiohttp.ClientSession() as session:
            for _attempt in range(50):  # until the SC's mirror has the new SPU
                ws = await session.ws_connect(f"ws://127.0.0.1:{target.private_port}{wire.SPU_PATH}", max_msg_size=0)
                await ws.send_bytes(wire.encode(wire.Register(spu_id=100)))
                if b'"accepted"' in (await ws.receive(timeout=10)).data:
                    target.own_spu_connections += 1
                    break
                await ws.close()
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("SPU 100 was not accepted")
            await ws.send_bytes(wire.encode(wire.Hosted(partitions=[])))
            deadline = asyncio.get_running_loop().time() + options.seconds
            while asyncio.get_running_loop().time() < deadline:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, deadline - asyncio.get_running_loop().time())):
                        await ws.send_bytes(frame)  # waits once the SC stops reading and the socket is full
                        sent += 1
            cpu = (target.cpu_seconds() - cpu_before) / (time.monotonic() - started)
            read = await frames_read(target) - read_before
            await ws.close()
        if topic is not None:
            async with api.delete(f"/v1/topics/{topic['name']}") as response:
                assert response.status in (200, 202, 204), await response.text()
        async with api.delete("/v1/spus/spu-flooder") as response:
            assert response.status in (200, 202, 204), await response.text()
    return f"({sent} frames of {len(frame) / MiB:.1f} MiB sent, {read:.0f} read by the SC; SC CPU {cpu * 100:.0f}% of a core)"


def _open(sock: socket.socket) -> bool:
    """Whether the server has not closed ``sock`` (nothing to read and no EOF)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


Attack = Callable[[Target, Options], Awaitable[str]]
ATTACKS: list[tuple[str, Attack]] = [
    ("aborted-uploads", aborted_uploads),
    ("idle-connections", idle_connections),
    ("slow-clients", slow_clients),
    ("fluvio-large-frames", fluvio_large_frames),
    ("junk", junk),
    ("spu-impostors", spu_impostors),
    ("spu-large-frames", spu_large_frames),
    ("spu-stale-leaderships", spu_stale_leaderships),
]


# ---------------------------------------------------------------------------- the cluster


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def start_cluster(work: Path, processes: list[subprocess.Popen[bytes]]) -> Target:
    """`sc run` and the SPU simulators (appended to ``processes`` as they start), ready."""
    public_port, private_port, *spu_ports = embedded_etcd.free_ports(2 + 2 * SPUS)
    log_path = work / "sc.log"
    command = [
        sys.executable, "-m", "controller.cli", "run", "--store", "memory", "--bind-host", "127.0.0.1",
        "--public-port", str(public_port), "--private-port", str(private_port), "--log-format", "json",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        sc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    processes.append(sc)
    target = Target(public_port, private_port, sc.pid, log_path)
    url = f"http://127.0.0.1:{public_port}"
    async with aiohttp.ClientSession(url) as api:
        deadline = time.monotonic() + 60
        while True:
            if sc.poll() is not None:
                raise RuntimeError(log_path.read_text()[-2000:])
            with contextlib.suppress(aiohttp.ClientError):
                async with api.get("/healthz") as response:
                    if response.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError("sc run did not become healthy")
            await asyncio.sleep(0.1)
        for spu_id in range(SPUS):
            spec = {
                "id": spu_id,
                "publicEndpoint": {"host": "127.0.0.1", "port": spu_ports[2 * spu_id]},
                "privateEndpoint": {"host": "127.0.0.1", "port": spu_ports[2 * spu_id + 1]},
            }
            async with api.post("/v1/spus", json={"name": f"spu-{spu_id}", "spec": spec}) as response:
                assert response.status == 201, await response.text()
        with (work / "spus.log").open("wb") as log:
            spus = subprocess.Popen(
                [sys.executable, "-m", "controller.cli", "spu", "run", "--first-id", "0", "--count", str(SPUS),
                 "--sc-private", f"127.0.0.1:{private_port}", "--log-format", "json", "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        processes.append(spus)
        while True:
            async with api.get("/v1/spus") as response:
                listed = await response.json()
            if sum(spu["status"]["resolution"] == "Online" for spu in listed) == SPUS:
                break
            if time.monotonic() > deadline + 60:
                raise RuntimeError(f"the SPUs did not come online: {json.dumps(listed)[:500]}")
            await asyncio.sleep(0.2)
        # Partitions replicated between the SPUs: they fetch from each other and report to the SC.
        body = {"name": "bench", "spec": {"partitions": 3, "replicationFactor": 3}}
        async with api.post("/v1/topics", json=body) as response:
            assert response.status == 201, await response.text()
    return target


async def run(args: argparse.Namespace) -> int:
    attacks = [(name, attack) for name, attack in ATTACKS if not args.only or name in args.only.split(",")]
    options = Options(args.seconds, args.idle)
    with tempfile.TemporaryDirectory(prefix="sc-overload-") as workdir:
        work = Path(workdir)
        processes: list[subprocess.Popen[bytes]] = []
        try:
            target = await start_cluster(work, processes)
        except BaseException:
            stop(processes)
            raise
        prober = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PROBE, str(target.public_port), stdout=asyncio.subprocess.PIPE
        )
        probes: list[tuple[float, float]] = []

        async def collect() -> None:
            assert prober.stdout is not None
            async for line in prober.stdout:
                at, seconds = line.split()
                probes.append((float(at), float(seconds)))

        collector = asyncio.create_task(collect())
        measure = Measure(target, probes)
        try:
            limits = next(line for line in map(json.loads, target.log_path.read_text().splitlines()) if line.get("event") == "connection limits")
            print(
                f"SC limits: public {limits['public']}, private {limits['private']}, per address {limits['per_address']} "
                f"(open-file limit {limits['open_file_limit']}); timeouts header {limits['header_timeout']:g} s, "
                f"body {limits['body_timeout']:g} s, idle {limits['idle_timeout']:g} s",
                flush=True,
            )
            await asyncio.sleep(2.0)  # the prober's first answers
            async with measure.phase("no attack"):
                await asyncio.sleep(args.seconds)
            for name, attack in attacks:
                print(f"{name}: {attack.__doc__.splitlines()[0] if attack.__doc__ else ''}", flush=True)
                async with measure.phase(f"{name}: during") as phase:
                    phase.note = await attack(target, options)
                async with measure.phase(f"{name}: after"):
                    await asyncio.sleep(args.seconds)
        finally:
            prober.terminate()
            await prober.wait()
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
            stop(processes)
    print_table(measure.phases)
    return 0


def print_table(phases: list[Phase]) -> None:
    baseline = phases[0]
    base_p99 = float(baseline.healthz()[0])
    header = ("phase", "RSS MB", "fds", "healthz p99 ms", "x base", "healthz fail", "SPU disc.", "log KB")
    rows = []
    for phase in phases:
        during = phase.name.endswith("during")
        rss = phase.peak_rss if during else phase.last_rss
        descriptors = phase.peak_descriptors if during else phase.last_descriptors
        p99, failed = phase.healthz()
        ratio = f"{float(p99) / base_p99:.1f}" if base_p99 and p99 != "nan" else "-"
        rows.append((phase.name, f"{rss / MiB:.0f}", str(descriptors), p99, ratio, failed, f"{phase.spu_reconnects:.0f}", f"{phase.logged / 1024:.1f}"))
    widths = [max(len(str(row[index])) for row in [header, *rows]) for index in range(len(header))]
    print()
    print("  ".join(cell.ljust(width) if index == 0 else cell.rjust(width) for index, (cell, width) in enumerate(zip(header, widths, strict=True))))
    for row in rows:
        print("  ".join(cell.ljust(width) if index == 0 else cell.rjust(width) for index, (cell, width) in enumerate(zip(row, widths, strict=True))))
    print("(RSS and fds: the peak during an attack, the last sample after it; SPU disc.: reconnections the SC accepted)")
    notes = [f"  {phase.name}: {phase.note}" for phase in phases if phase.note]
    if notes:
        print("\n".join(notes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the baseline, of each hold and of each 'after' phase")
    parser.add_argument("--only", help="comma-separated attack names: " + ", ".join(name for name, _ in ATTACKS))
    parser.add_argument("--idle", type=int, default=15_000, help="connections of the idle-connections attack")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attackers' connections
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
