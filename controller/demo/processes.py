"""The processes `sc demo` owns: each in a session of its own, stopped SIGTERM-then-SIGKILL by process
group, then a sweep of anything still carrying the demo's environment mark (which every child and
everything it starts inherits). On Linux each child also gets SIGTERM if the demo dies without
stopping them (killed outright). No cluster logic here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from store import embedded_etcd

# Set in every child's environment (and so in everything they start: etcd, Spark's JVM):
# the sweep finds what a killed parent left behind by this mark, not by a process name.
MARK_VARIABLE = "STREAMING_CONTROLLER_DEMO_RUN"
STOP_TIMEOUT = 20.0
SWEEP_TIMEOUT = 5.0


class Child:
    """One `sc ...` subprocess with its log file; ``name`` is what the user reads in messages."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Processes:
    """Every child of one demo run, keyed by name; ``close()`` leaves none of them, nor their children."""

    def __init__(self, mark: str, log_dir: Path) -> None:
        self.mark = mark
        self.log_dir = log_dir
        self.children: dict[str, Child] = {}
        self._reaped: list[Child] = []

    def start(self, name: str, sc_arguments: Sequence[str], extra_environment: dict[str, str] | None = None) -> Child:
        """``sc <arguments>`` in a new session (a terminal's Ctrl-C reaches only the demo, which stops it in order)."""
        if name in self.children and self.children[name].alive():
            raise RuntimeError(f"process {name!r} is already running (pid {self.children[name].pid})")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        # The demo's cluster is its own: SC_* settings meant for another SC (an SC_ETCD_ENDPOINTS, say) stay out.
        environment = {name: value for name, value in os.environ.items() if not name.startswith("SC_")}
        environment.update(extra_environment or {})
        environment[MARK_VARIABLE] = self.mark
        command = [sys.executable, "-m", "controller.cli", *sc_arguments]
        if threading.current_thread() is threading.main_thread():
            # A demo killed outright (SIGKILL, the OOM killer) cannot stop its children: Linux
            # sends them SIGTERM instead, and each stops as on Ctrl-C (the SC stops its etcd).
            command = embedded_etcd.dying_with_parent(command, signal.SIGTERM)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        if name in self.children:
            self._reaped.append(self.children[name])
        self.children[name] = child
        return child

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash would: no goodbye to the SC."""
        child = self.children[name]
        _signal_group(child.pid, signal.SIGKILL)
        child.process.wait()

    def stop(self, name: str, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM to the group, SIGKILL after ``timeout``; the exit status (None if it had to be killed)."""
        child = self.children[name]
        return _stop(child.process, timeout)

    def close(self) -> list[str]:
        """Stop every child still running, the last started first (the SC, started first, goes last),
        then sweep; returns a line for each process the sweep found (none when all stopped cleanly).
        """
        for child in reversed(list(self.children.values())):
            _stop(child.process, STOP_TIMEOUT)
        for child in self._reaped:
            _stop(child.process, STOP_TIMEOUT)
        return sweep(self.mark)


def _stop(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The group of ``process`` (it leads it) is empty when this returns; its exit status, None if killed."""
    code: int | None = None
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
    else:
        code = process.returncode
    # Members that outlive their leader (Spark's JVM shutting down after its driver) get the same grace.
    if not _wait_empty(process.pid, SWEEP_TIMEOUT):
        _signal_group(process.pid, signal.SIGTERM)
        if not _wait_empty(process.pid, SWEEP_TIMEOUT):
            _signal_group(process.pid, signal.SIGKILL)
            _wait_empty(process.pid, SWEEP_TIMEOUT)
    return code


def _wait_empty(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def group_members(pgid: int) -> list[int]:
    """Living (not zombie) processes of group ``pgid``; without /proc, none can be seen."""
    members: list[int] = []
    if not Path("/proc").is_dir():
        return members
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # After the command's closing parenthesis: state, ppid, pgrp.
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def marked(mark: str) -> list[int]:
    """Pids of the processes whose environment carries ``MARK_VARIABLE=mark`` (this one excluded)."""
    wanted = f"{MARK_VARIABLE}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if wanted in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(mark: str, timeout: float = SWEEP_TIMEOUT) -> list[str]:
    """SIGTERM, then SIGKILL, whatever still carries the mark (e.g. an etcd whose SC was SIGKILLed)."""
    if not Path("/proc").is_dir():
        return []  # no /proc to search: the process-group stops are all there is
    left = {pid: _command_line(pid) for pid in marked(mark)}
    if not left:
        return []
    for pid in left:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _living(left):
        time.sleep(0.05)
    for pid in _living(left):
        _signal(pid, signal.SIGKILL)
    return [f"pid {pid}: {command}" for pid, command in sorted(left.items())]


def _living(pids: dict[int, str]) -> list[int]:
    living = []
    for pid in pids:
        fields = _stat_fields(pid)
        if fields and fields[0] != "Z":
            living.append(pid)
    return living


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _signal(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
