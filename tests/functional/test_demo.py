"""`sc demo` as a user runs it, in a subprocess without a terminal (plain lines): the whole story with the
Spark report, and a Ctrl-C in the middle; neither may leave a process behind (every process the demo
starts inherits this test's environment mark, so /proc tells what is left)."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.demo import demo
from tests.fixtures import processes

pytestmark = pytest.mark.etcd

MARK = "DEMO_TEST_RUN_MARK"  # no SC_ prefix: the demo keeps SC_* settings from its children
LINE_TIMEOUT = 180.0


def marked(mark: str) -> list[str]:
    """The command lines of living processes whose environment holds MARK=mark."""
    wanted = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        read = _read_process(entry)
        if read is not None and wanted in read[0].split(b"\0"):
            found.append(f"{entry.name}: {read[1]}")
    return found


def marked_at_least(mark: str, count: int, seconds: float = 10.0) -> list[str]:
    """``marked(mark)`` once it lists at least ``count`` processes (looked at again until ``seconds``)."""
    deadline = time.monotonic() + seconds
    while len(found := marked(mark)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(found) >= count, found
    return found


def _read_process(entry: Path, attempts: int = 20) -> tuple[bytes, str] | None:
    """(environment, command line) of the process at /proc/PID; None for a zombie, a kernel thread, or
    one gone. A read that fails (ESRCH, ENOENT) while /proc/PID is there is made again: the process
    may be exiting, and is then gone at the next look."""
    for _ in range(attempts):
        try:
            state, flags = processes.read_stat(entry)
            if state in ("Z", "X") or flags & processes.PF_KTHREAD:
                return None
            environment = (entry / "environ").read_bytes()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            return environment, command
        except (ProcessLookupError, FileNotFoundError):
            if not entry.exists():
                return None
            time.sleep(0.005)
        except (OSError, IndexError, ValueError):
            return None  # not ours to read (init's environment), or not a process's stat
    return None


class Demo:
    """`sc demo ARGS` in a session of its own, its output read line by line as it comes."""

    def __init__(self, *arguments: str) -> None:
        self.mark = uuid.uuid4().hex
        # The demo's work dir (tempfile.mkdtemp) goes in here, removed at cleanup: a demo killed
        # outright cannot remove its own, and left 62 MB in the system's temp dir at every run.
        self.temp_dir = tempfile.mkdtemp(prefix="sc-demo-test-")
        environment = {**os.environ, MARK: self.mark, "TMPDIR": self.temp_dir}
        environment.pop("SC_ADDR", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "demo", *arguments],
            # With --pause the demo waits for a line after each step: the test's to send (go_on).
            stdin=subprocess.PIPE if "--pause" in arguments else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, prefix: str) -> str:
        while True:
            try:
                line = self._queue.get(timeout=LINE_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} within {LINE_TIMEOUT:g} s; so far:\n" + "\n".join(self.lines)) from None
            if line is None:
                raise AssertionError(f"the demo ended before a line starting {prefix!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        while not self._queue.empty():
            line = self._queue.get_nowait()
            if line is not None:
                self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def go_on(self) -> None:
        """Enter, for a demo run with --pause that waits after a step."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def cleanup(self) -> None:
        """Whatever a failed test left running goes, so one failure does not load the next tests."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(LINE_TIMEOUT)
        assert self.process.stdout is not None
        self.process.stdout.close()
        if self.process.stdin is not None:
            self.process.stdin.close()
        for line in marked(self.mark):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def assert_nothing_left(self) -> None:
        with pytest.raises(ProcessLookupError):
            os.killpg(self.process.pid, 0)  # the demo's own group (its session) is empty
        assert marked(self.mark) == []


@pytest.fixture
def runs() -> Iterator[list[Demo]]:
    started: list[Demo] = []
    yield started
    for run in started:
        run.cleanup()


def data_dir_of(output: str) -> Path:
    found = re.search(r"data in (/\S+/data)$", output, re.MULTILINE)
    assert found, output
    return Path(found.group(1))


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_the_demo_tells_the_whole_story_and_the_report_holds_the_failover_it_caused(tmp_path: Path, runs: list[Demo]) -> None:
    out = tmp_path / "report"
    run = Demo("--out", str(out))
    runs.append(run)
    titles = demo.STEP_TITLES + demo.AUDIT_STEP_TITLES
    run.wait_for_line(f"[{len(titles)}/{len(titles)}] ok (")
    assert run.finish(timeout=120) == 0, run.output
    output = run.output

    steps = len(titles)
    for number, title in enumerate(titles, start=1):
        assert f"[{number}/{steps}] {title} ..." in run.lines, output
        assert any(line.startswith(f"[{number}/{steps}] ok (") for line in run.lines), output
    assert "warning" not in output and "error" not in output, output
    for name in ("orders-5", "clicks-3", "payments-2"):
        assert re.search(rf"^  {name} +\d+ ", output, re.MULTILINE), output  # in the placement table
    assert "scripts/sc run --etcd-endpoints" in output

    killed = re.search(r"SPU (\d+) killed; it led \d+ partitions \(([^)]*)\)", output)
    assert killed, output
    victim, led = int(killed.group(1)), killed.group(2).split(", ")
    assert led and all(re.fullmatch(r"(orders|clicks|payments)-\d+", name) for name in led), led

    report = json.loads((out / "report.json").read_text())
    changes = report["leaderChanges"]
    # Exactly the demo's failover: the victim's partitions moved away (spu-offline) and came back to
    # it (preferred-leader); the SC was stopped before its SPUs, so nothing else moved.
    lost = sorted((change["partition"], change["from"]) for change in changes if change["cause"] == "spu-offline")
    returned = sorted((change["partition"], change["to"]) for change in changes if change["cause"] == "preferred-leader")
    assert lost == [(name, victim) for name in sorted(led)], changes
    assert returned == [(name, victim) for name in sorted(led)], changes
    assert len(changes) == 2 * len(led), changes
    interim = {change["partition"]: change["to"] for change in changes if change["cause"] == "spu-offline"}
    assert all(change["from"] == interim[change["partition"]] for change in changes if change["cause"] == "preferred-leader")
    assert (out / "report.md").is_file()
    assert f"The report: {out.resolve() / 'report.md'}" in output

    run.assert_nothing_left()
    assert not data_dir_of(output).parent.exists()  # the temporary data dir is gone


@pytest.mark.timeout(600)
def test_the_demo_runs_over_mutual_tls_with_files_it_is_given(tmp_path: Path, runs: list[Demo]) -> None:
    from tests.fixtures import certs

    authority = certs.Authority(tmp_path / "tls", "ca")
    authority.server(file_name="sc")
    spus = tuple(f"spu-{spu_id}" for spu_id in range(len(demo.RACKS) * demo.SPUS_PER_RACK))
    authority.issue("demo-spus", dns_names=spus, file_name="spu")
    run = Demo("--no-audit", "--out", str(tmp_path / "out"), "--tls-dir", str(tmp_path / "tls"))
    runs.append(run)
    titles = demo.STEP_TITLES
    run.wait_for_line(f"[{len(titles)}/{len(titles)}] ok (")
    assert run.finish(timeout=120) == 0, run.output
    assert any(line.startswith("[1/") and "ok (" in line for line in run.lines), run.output
    assert "API on https://127.0.0.1:" in run.output, run.output
    assert "warning" not in run.output and "error" not in run.output, run.output
    run.assert_nothing_left()


def test_a_tls_dir_without_the_files_is_refused_before_anything_starts(tmp_path: Path, runs: list[Demo]) -> None:
    (tmp_path / "tls").mkdir()
    run = Demo("--no-audit", "--out", str(tmp_path / "out"), "--tls-dir", str(tmp_path / "tls"))
    runs.append(run)
    assert run.finish(timeout=60) == 2
    assert f"error: --tls-dir {str(tmp_path / 'tls')!r} lacks ca.pem, sc.crt, sc.key, spu.crt, spu.key" in run.output


@pytest.mark.timeout(600)
def test_ctrl_c_stops_the_sc_its_etcd_and_every_spu_and_exits_130(tmp_path: Path, runs: list[Demo]) -> None:
    # --pause: the demo waits after each step, so that it is where the test looks, however slowly
    # the test reads (without, on a busy machine it was at its end by the time of the SIGINT).
    run = Demo("--no-audit", "--pause", "--out", str(tmp_path / "out"))
    runs.append(run)
    steps = len(demo.STEP_TITLES)
    first = run.wait_for_line(f"[1/{steps}] ok (")
    run.go_on()
    run.wait_for_line(f"[2/{steps}] ok (")  # the SC, its etcd and six SPUs are up
    run.wait_for_line("Press Enter")
    marked_at_least(run.mark, 9)  # the demo, the SC, etcd, six SPUs
    os.killpg(run.process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the demo's group
    assert run.finish(timeout=120) == 130, run.output
    assert f"[3/{steps}]" not in run.output  # it waited after the second step, as --pause says
    assert "interrupted: the SC, its etcd and the SPUs are stopped" in run.output
    run.assert_nothing_left()
    assert not data_dir_of(first).parent.exists()


@pytest.mark.timeout(300)
def test_a_demo_killed_outright_leaves_no_sc_etcd_or_spu_behind(tmp_path: Path, runs: list[Demo]) -> None:
    run = Demo("--no-audit", "--pause", "--out", str(tmp_path / "out"))  # waiting where the test looks
    runs.append(run)
    steps = len(demo.STEP_TITLES)
    run.wait_for_line(f"[1/{steps}] ok (")
    run.go_on()
    run.wait_for_line(f"[2/{steps}] ok (")  # the SC, its etcd and six SPUs are up
    run.wait_for_line("Press Enter")
    marked_at_least(run.mark, 9)  # the demo, the SC, etcd, six SPUs
    run.process.kill()  # SIGKILL to the demo alone: no handler, no cleanup of its own
    run.finish(timeout=60)
    # Linux tells each child (PR_SET_PDEATHSIG); they stop as on Ctrl-C, the SC taking its etcd.
    deadline = time.monotonic() + 60
    while marked(run.mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marked(run.mark) == []


def test_an_out_dir_holding_something_else_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    finished = subprocess.run(
        [sys.executable, "-m", "controller.cli", "demo", "--out", str(out)], capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 2
    assert finished.stdout == ""
    assert finished.stderr == (
        f"error: --out {str(out)!r} is not empty and holds no earlier demo's output (no .sc-demo file): "
        "give a new or empty directory\n"
    )
    assert (out / "thesis.tex").read_text() == "keep me"
