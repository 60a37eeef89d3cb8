"""CLI start benchmark (issue 16): cold starts of `sc --help` and `sc topic list` next to a bare
Python script doing the same HTTP GET with urllib, in the same run.

Starts its own `sc run --store memory` on free ports, with a few topics to list. Each command runs
as a new process, REPEAT times, the three interleaved so that the machine's load falls on all
alike; medians are printed with their ratio to the bare script (target: at most 3x). Exit status 1
when a target is missed.

    .venv/bin/python bench/cli_start.py [--repeat K]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from store import embedded_etcd  # noqa: E402 (after the path set-up above)

TARGET_RATIO = 3.0
TOPICS = 5


def sc_program() -> str:
    """The `sc` console script of this Python's environment, as an operator runs it."""
    return str(Path(sys.executable).with_name("sc"))


def wait_healthy(url: str, daemon: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the SC did not come up (exit status {daemon.poll()})")
        time.sleep(0.1)


def create_topics(url: str) -> None:
    for index in range(TOPICS):
        body = f'{{"name": "topic-{index}", "spec": {{"partitions": 3, "replicationFactor": 1}}}}'.encode()
        request = urllib.request.Request(
            url + "/v1/topics?timeout=0", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


def seconds_of(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command (default 15)")
    options = parser.parse_args()
    public, private = embedded_etcd.free_ports(2)
    url = f"http://127.0.0.1:{public}"
    sc = sc_program()
    commands = {
        # What `sc topic list` sends: one page of the list.
        "bare urllib GET": [sys.executable, "-c", f"import urllib.request; urllib.request.urlopen({url!r} + '/v1/topics?limit=1000').read()"],
        "sc --help": [sc, "--help"],
        "sc topic list": [sc, "topic", "list", "--sc", url],
    }
    with tempfile.TemporaryFile() as log:
        daemon = subprocess.Popen(
            [sc, "run", "--store", "memory", "--bind-host", "127.0.0.1", "--public-port", str(public),
             "--private-port", str(private), "--log-format", "json"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_healthy(url, daemon)
            create_topics(url)
            for command in commands.values():
                seconds_of(command)  # once, unmeasured: compiled bytecode and the page cache warm, as for an operator
            timings: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(options.repeat):
                for name, command in commands.items():
                    timings[name].append(seconds_of(command))
        finally:
            daemon.terminate()
            daemon.wait(30)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    bare = medians["bare urllib GET"]
    print(f"cold starts, median of {options.repeat} (Python {sys.version.split()[0]}):")
    missed = []
    for name, median in medians.items():
        ratio = median / bare
        print(f"  {name:<16} {median * 1000:7.1f} ms  {ratio:4.2f}x the bare script")
        if name != "bare urllib GET" and ratio > TARGET_RATIO:
            missed.append(name)
    if missed:
        print(f"target missed (at most {TARGET_RATIO:g}x the bare script): {', '.join(missed)}")
        return 1
    print(f"target met: at most {TARGET_RATIO:g}x the bare script")
    return 0


if __name__ == "__main__":
    sys.exit(main())
