"""`sc demo`: the SC on its embedded etcd and six simulated SPUs in three racks; placement, a failover
and its return, then the Spark audit. Owns the story and its waits; talks to the SC only over its HTTP
API, runs everything as subprocesses it always stops (processes), shows it through output. Its flags
are controller/cli/demo.py's."""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from controller.api import client
from controller.demo import output as demo_output, processes as demo_processes
from store import embedded_etcd

RACKS = ("r1", "r2", "r3")
SPUS_PER_RACK = 2
MARKER_FILE = ".sc-demo"  # in --out: this directory is a demo's output, which a new run may replace
POLL_INTERVAL = 0.05
START_TIMEOUT = 60.0
SETTLE_TIMEOUT = 90.0
EXPORT_TIMEOUT = 180.0
REPORT_TIMEOUT = 900.0
SIGINT_EXIT = 130
SIGTERM_EXIT = 143

T = TypeVar("T")


@dataclass(frozen=True)
class DemoTopic:
    name: str
    spec: dict[str, Any]
    how: str  # what its placement shows


TOPICS = (
    DemoTopic("orders", {"partitions": 6, "replicationFactor": 3}, "computed, rack-aware: one replica in each rack"),
    DemoTopic(
        "clicks",
        {"partitions": 4, "replicationFactor": 2, "ignoreRackAssignment": True},
        "computed, racks ignored: round robin with gaps over the SPU ids",
    ),
    DemoTopic(
        "payments",
        {"partitions": 3, "replicationFactor": 3, "placement": {"strategy": "policies", "policies": "node=exclusive;shard=balanced"}},
        "placement policies node=exclusive;shard=balanced: never two replicas in a rack, spread over the SPUs",
    ),
)

# Spark settings for a history of a few hundred records (this demo's report; the tests' Spark
# session uses them too). There the cost is each query's fixed overhead, not its data: compiling
# generated code for each query and the JVM's optimising compiler cost more than they save (the
# report: 47 s with the optimising compiler, 36 s without; the tests' first report: 49 s with
# generated code, 33 s without); so do the jobs that one shuffle partition per core, adaptive
# execution's re-planning and broadcasts of small join sides add (bench/audit_tiny.py, a 600-record
# history: 36 Spark jobs per report instead of 107; 0.79x the time cold, 0.82x warm). JVM options
# apply only to a session that starts the JVM.
TINY_HISTORY_SETTINGS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
}

STEP_TITLES = (
    "Start the SC on its embedded etcd",
    "Start six SPUs in three racks",
    "Create topics and wait until every replica is in sync",
    "Kill the SPU that leads the most partitions",
    "Bring it back: preferred leaders return",
    "Stop the cluster",
)
AUDIT_STEP_TITLES = (
    "Export the metadata history to Parquet",
    "Run the Spark audit report",
)


class DemoError(Exception):
    """Something the demo needs did not happen; the message says what and where to look."""


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the demo: stop everything and say so, as for Ctrl-C."""


# ---------------------------------------------------------------------------- the command


def handle_demo(args: argparse.Namespace) -> int:
    try:
        out_dir = prepare_out_dir(args.out)
        tls_dir = tls_files(args.tls_dir)
    except DemoError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    titles = STEP_TITLES + (AUDIT_STEP_TITLES if args.audit else ())
    output = demo_output.for_stream(sys.stdout, len(titles))
    work_dir = Path(tempfile.mkdtemp(prefix="sc-demo-")).resolve()
    demo = Demo(output, out_dir, work_dir, args.audit, tls_dir, pause=args.pause)
    previous_sigterm = signal.signal(signal.SIGTERM, _terminated)
    previous_sigint = signal.getsignal(signal.SIGINT)
    code, problem = 0, ""
    try:
        demo.run()
    except Terminated:
        code, problem = SIGTERM_EXIT, "terminated"
    except KeyboardInterrupt:
        code, problem = SIGINT_EXIT, "interrupted"
    except (DemoError, OSError) as error:  # OSError: a process that could not start, a file not written
        code, problem = 1, str(error)
    finally:
        # Stopping takes a few seconds and must not be cut short by a second Ctrl-C.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            leftovers = demo.processes.close()
            if not args.keep_data:
                shutil.rmtree(work_dir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous_sigint)
            signal.signal(signal.SIGTERM, previous_sigterm)
    if leftovers:
        print(f"warning: stopped {len(leftovers)} process(es) left behind:", *leftovers, sep="\n  ", file=sys.stderr)
    if args.keep_data:
        output.note(
            f"Data kept in {work_dir}: `scripts/sc run --data-dir {work_dir / 'data'}` starts an SC on it again "
            "(etcd data and the history are there)."
        )
    if code == SIGINT_EXIT or code == SIGTERM_EXIT:
        print(f"{problem}: the SC, its etcd and the SPUs are stopped; logs in {out_dir / 'logs'}", file=sys.stderr)
    elif code:
        print(f"error: {problem}", file=sys.stderr)
        print(f"the SC, its etcd and the SPUs are stopped; logs in {out_dir / 'logs'}", file=sys.stderr)
    return code


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


TLS_FILES = ("ca.pem", "sc.crt", "sc.key", "spu.crt", "spu.key")


def tls_files(directory: Path | None) -> Path | None:
    """``--tls-dir``, absolute, once every file the demo needs is there."""
    if directory is None:
        return None
    missing = [name for name in TLS_FILES if not (directory / name).is_file()]
    if missing:
        raise DemoError(
            f"--tls-dir {str(directory)!r} lacks {', '.join(missing)}: it needs {', '.join(TLS_FILES)} "
            "(sc.crt for 127.0.0.1, spu.crt naming spu-0 .. spu-5 in its DNS SANs; see README's Security section)"
        )
    return directory.resolve()


def prepare_out_dir(path: Path) -> Path:
    """``path`` made empty and marked as a demo's output; refused if it holds anything else."""
    out_dir = path.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise DemoError(f"--out {str(path)!r} exists and is not a directory: give a directory for the report")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / MARKER_FILE).is_file():
            raise DemoError(
                f"--out {str(path)!r} is not empty and holds no earlier demo's output (no {MARKER_FILE} file): "
                "give a new or empty directory"
            )
        shutil.rmtree(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / MARKER_FILE).write_text("written by `sc demo`; the next run replaces this directory\n")
    except OSError as error:
        raise DemoError(f"cannot write to --out {str(path)!r}: {error.strerror}") from None
    return out_dir


# ---------------------------------------------------------------------------- the story


class Demo:
    def __init__(
        self,
        output: demo_output.Output,
        out_dir: Path,
        work_dir: Path,
        audit: bool,
        tls_dir: Path | None = None,
        pause: bool = False,
    ) -> None:
        self.output = output
        self.pause = pause  # wait for a line on stdin after each step (a presenter's Enter)
        # With TLS: the files of both ports and the SPUs, and a token of the demo's own for its API calls.
        self.tls_dir = tls_dir
        self.token = secrets.token_urlsafe(32) if tls_dir is not None else None
        self.out_dir = out_dir
        self.work_dir = work_dir
        self.data_dir = work_dir / "data"
        self.audit = audit
        self.processes = demo_processes.Processes(mark=str(work_dir), log_dir=out_dir / "logs")
        self.client = client.Client("http://127.0.0.1:0")  # the SC's real port once start_sc has chosen it
        self.private_address = ""
        self.spu_ports: list[int] = []
        self.racks: dict[int, str] = {}
        # The children that must be up (a death among them fails the demo at the next wait).
        self.running: set[str] = set()
        self.last_seen = ""  # what the last unmet wait saw, for its timeout message

    def run(self) -> None:
        self.output.intro(
            f"sc demo: the SC on its embedded etcd, {len(RACKS) * SPUS_PER_RACK} simulated SPUs in racks "
            f"{', '.join(RACKS)}; every process it starts is stopped at the end (Ctrl-C stops them too)."
        )
        self.start_sc()
        self.between_steps()
        self.start_spus()
        self.between_steps()
        self.create_topics()
        self.between_steps()
        victim, led = self.kill_busiest_spu()
        self.between_steps()
        self.restart(victim, led)
        self.between_steps()
        self.stop_cluster()
        if self.audit:
            self.between_steps()
            history = self.export_history()
            self.between_steps()
            self.report(history)
        self.closing_notes()

    def between_steps(self) -> None:
        """With --pause: wait for a line on stdin (Enter; its end goes on too). The cluster runs on
        meanwhile, and Ctrl-C stops everything as at any other time."""
        if self.pause:
            self.output.note("Press Enter for the next step (Ctrl-C stops the demo and everything it started).")
            sys.stdin.readline()

    # ------------------------------------------------------------------ steps

    def start_sc(self) -> None:
        with self.output.step(STEP_TITLES[0]) as step:
            ports = embedded_etcd.free_ports(4 + 2 * len(RACKS) * SPUS_PER_RACK)
            public, private, etcd_client, etcd_peer = ports[:4]
            self.spu_ports = ports[4:]
            scheme = "https" if self.tls_dir is not None else "http"
            ca = self.tls_dir / "ca.pem" if self.tls_dir is not None else None
            self.client = client.Client(f"{scheme}://127.0.0.1:{public}", token=self.token, ca=ca)
            self.private_address = f"127.0.0.1:{private}"
            self.running.add("sc")
            self.processes.start("sc", [
                "run", "--bind-host", "127.0.0.1", "--public-port", str(public), "--private-port", str(private),
                "--data-dir", str(self.data_dir), "--embedded-etcd-client-port", str(etcd_client),
                "--embedded-etcd-peer-port", str(etcd_peer), "--log-format", "json", *self._sc_tls_flags(),
            ])
            step.progress("waiting for /healthz")
            self.wait_for("the SC to answer /healthz", START_TIMEOUT, self._healthy)
            step.done(
                f"API on {scheme}://127.0.0.1:{public}, SPUs connect to {self.private_address}, "
                f"etcd on 127.0.0.1:{etcd_client}, data in {self.data_dir}"
            )

    def start_spus(self) -> None:
        with self.output.step(STEP_TITLES[1]) as step:
            spu_ids = range(len(RACKS) * SPUS_PER_RACK)
            for spu_id in spu_ids:
                rack = RACKS[spu_id // SPUS_PER_RACK]
                public, private = self.spu_ports[2 * spu_id: 2 * spu_id + 2]
                spec = {
                    "id": spu_id,
                    "rack": rack,
                    "publicEndpoint": {"host": "127.0.0.1", "port": public},
                    "privateEndpoint": {"host": "127.0.0.1", "port": private},
                }
                self.call("POST", "/v1/spus", {"name": f"spu-{spu_id}", "spec": spec})
                self.racks[spu_id] = rack
            for spu_id in spu_ids:
                self.start_spu(spu_id)
            step.progress("waiting for every SPU to connect")
            self.wait_for("every SPU to be Online", START_TIMEOUT, lambda: self._spus_online(len(spu_ids)))
            by_rack = collections.defaultdict(list)
            for spu_id, rack in self.racks.items():
                by_rack[rack].append(str(spu_id))
            step.done(f"{len(spu_ids)} SPUs online: " + "; ".join(f"{rack}: SPUs {', '.join(ids)}" for rack, ids in by_rack.items()))

    def start_spu(self, spu_id: int) -> demo_processes.Child:
        self.running.add(f"spu-{spu_id}")
        return self.processes.start(
            f"spu-{spu_id}",
            ["spu", "run", "--id", str(spu_id), "--sc-private", self.private_address, "--log-format", "json", *self._spu_tls_flags()],
        )

    def _sc_tls_flags(self) -> list[str]:
        if self.tls_dir is None:
            return []
        tokens = self.work_dir / "tokens"
        tokens.write_text(f"demo admin {self.token}\n")
        tokens.chmod(0o600)
        return [
            "--tls-cert", str(self.tls_dir / "sc.crt"), "--tls-key", str(self.tls_dir / "sc.key"),
            "--tls-client-ca", str(self.tls_dir / "ca.pem"), "--auth-tokens", str(tokens),
        ]

    def _spu_tls_flags(self) -> list[str]:
        if self.tls_dir is None:
            return []
        return ["--tls-ca", str(self.tls_dir / "ca.pem"), "--tls-cert", str(self.tls_dir / "spu.crt"), "--tls-key", str(self.tls_dir / "spu.key")]

    def create_topics(self) -> None:
        with self.output.step(STEP_TITLES[2]) as step:
            for topic in TOPICS:
                step.progress(f"creating {topic.name}")
                status, answer = self.call("POST", "/v1/topics", {"name": topic.name, "spec": topic.spec})
                resolution = answer.get("status", {}).get("resolution")
                if resolution != "Provisioned":
                    reason = answer.get("status", {}).get("reason") or "no reason given"
                    raise DemoError(f"topic {topic.name!r} is {resolution} (HTTP {status}), not Provisioned: {reason}")
            step.progress("waiting for every partition to be online with all its replicas in sync")
            partitions = self.wait_for("every partition to be Online, led by its preferred leader, all replicas in sync",
                                       SETTLE_TIMEOUT, self._settled)
            step.done(f"{len(TOPICS)} topics, {len(partitions)} partitions, every replica in sync")
        for topic in TOPICS:
            spec = topic.spec
            self.output.note(f"  {topic.name}: {spec['partitions']} partitions x {spec['replicationFactor']} replicas, {topic.how}")
        self.show_placement(partitions)

    def kill_busiest_spu(self) -> tuple[int, list[str]]:
        before = self.partitions()
        led_by = collections.Counter(p["spec"]["leader"] for p in before.values())
        victim = min(led_by, key=lambda spu_id: (-led_by[spu_id], spu_id))
        led = sorted(name for name, p in before.items() if p["spec"]["leader"] == victim)
        with self.output.step(STEP_TITLES[3]) as step:
            step.progress(f"SIGKILL to SPU {victim}")
            self.running.discard(f"spu-{victim}")
            self.processes.kill(f"spu-{victim}")
            killed_at = time.monotonic()
            step.progress(f"waiting for the SC to elect new leaders for {len(led)} partitions")

            def moved() -> dict[str, dict[str, Any]] | None:
                now = self.partitions()
                for name in led:
                    if now[name]["spec"]["leader"] == victim or not _online(now[name]):
                        self.last_seen = _describe(now[name])
                        return None
                return now

            after = self.wait_for(f"new leaders for the partitions SPU {victim} led ({', '.join(led)})", SETTLE_TIMEOUT, moved)
            elected_in = time.monotonic() - killed_at
            step.done(
                f"SPU {victim} killed; it led {len(led)} partitions ({', '.join(led)}); "
                f"all had new leaders {elected_in * 1000:.0f} ms later"
            )
        rows = [
            [name, victim, after[name]["spec"]["leader"], self.racks[after[name]["spec"]["leader"]], _followers_in_sync(after[name])]
            for name in led
        ]
        self.output.table(
            f"New leaders after SPU {victim} (rack {self.racks[victim]}) was killed: in-sync followers took over",
            ["partition", "old leader", "new leader", "its rack", "followers in sync"],
            [rows],
        )
        return victim, led

    def restart(self, victim: int, led: list[str]) -> None:
        interim = {name: p["spec"]["leader"] for name, p in self.partitions().items() if name in led}
        with self.output.step(STEP_TITLES[4]) as step:
            self.start_spu(victim)
            restarted_at = time.monotonic()
            step.progress(f"SPU {victim} restarted empty: waiting for it to catch up and lead again")
            self.wait_for(f"SPU {victim} to lead {', '.join(led)} again", SETTLE_TIMEOUT, self._settled)
            returned_in = time.monotonic() - restarted_at
            step.done(
                f"SPU {victim} is back; after catching up it leads its {len(led)} partitions again "
                f"({returned_in:.1f} s after its restart)"
            )
        self.output.table(
            f"Preferred leaders back: SPU {victim} is the first replica of each",
            ["partition", "interim leader", "leader now"],
            [[[name, interim[name], victim] for name in led]],
        )

    def stop_cluster(self) -> None:
        with self.output.step(STEP_TITLES[5]) as step:
            spus = [name for name in self.processes.children if name.startswith("spu-")]
            # The SC first: SPUs going away one by one would make it elect leaders again, and the
            # history (and so the report) would tell that story instead of the demo's.
            step.progress("the SC first (it stops its etcd and closes the history), then the SPUs")
            self.running.clear()
            code = self.processes.stop("sc")
            if code is None:
                raise DemoError(f"the SC did not stop within {demo_processes.STOP_TIMEOUT:g} s of SIGTERM and was killed")
            if code != 0:
                raise DemoError(f"the SC exited with status {code} when stopped:\n{self.processes.children['sc'].log_tail()}")
            for name in spus:
                self.processes.stop(name)
            step.done(f"{len(spus)} SPUs and the SC stopped; the history is in {self.data_dir / 'history'}")

    def export_history(self) -> Path:
        history = self.out_dir / "history"
        with self.output.step(AUDIT_STEP_TITLES[0]) as step:
            child = self.run_to_end(
                "audit-export",
                ["audit", "export", "--history-dir", str(self.data_dir / "history"), "--out", str(history)],
                EXPORT_TIMEOUT,
            )
            exported = _last_json_line(child.log_path)
            step.done(f"{exported.get('rows', '?')} records exported to {history}")
        return history

    def report(self, history: Path) -> None:
        with self.output.step(AUDIT_STEP_TITLES[1]) as step:
            step.progress("Spark in its own process, local[2] (starting Spark takes a while)")
            self.run_to_end(
                "audit-report",
                ["audit", "report", "--history", str(history), "--out", str(self.out_dir), "--master", "local[2]"],
                REPORT_TIMEOUT,
                {
                    "SPARK_LOCAL_IP": "127.0.0.1",
                    # A history of a few hundred records: Spark set for it, unless the user set Spark.
                    "PYSPARK_SUBMIT_ARGS": os.environ.get(
                        "PYSPARK_SUBMIT_ARGS",
                        " ".join(f"--conf {key}={value}" for key, value in TINY_HISTORY_SETTINGS.items())
                        + " pyspark-shell",
                    ),
                },
            )
            report_json = self.out_dir / "report.json"
            try:
                document = json.loads(report_json.read_text())
            except (OSError, ValueError) as error:
                raise DemoError(f"the report finished but {report_json} is unreadable: {error}") from None
            changes = document.get("leaderChanges", [])
            causes = collections.Counter(change["cause"] for change in changes)
            step.done(
                f"{len(changes)} leader changes ("
                + (", ".join(f"{cause}: {count}" for cause, count in sorted(causes.items())) or "none")
                + f"); report in {self.out_dir}"
            )
        self.show_report(document)

    def closing_notes(self) -> None:
        notes = []
        if self.audit:
            notes.append(f"The report: {self.out_dir / 'report.md'} (charts/, tables/ next to it; report.json for scripts).")
        notes.append(f"Logs of the SC and SPUs: {self.out_dir / 'logs'}.")
        notes += [
            "Run the SC for real:",
            "  scripts/sc run                      # embedded etcd, data in ./sc-data, API on :9003, SPUs on :9004",
            "  scripts/sc run --etcd-endpoints http://etcd-0:2379,http://etcd-1:2379,http://etcd-2:2379",
            "                                      # an existing etcd cluster (see deploy/ for Compose, Kubernetes, systemd)",
            "  scripts/sc spu register --id 0 --name spu-0 --public-server HOST:9010 --private-server HOST:9011 --rack r1",
            "  scripts/sc topic create orders --partitions 6 --replication-factor 3",
        ]
        for note in notes:
            self.output.note(note)

    # ------------------------------------------------------------------ showing

    def show_placement(self, partitions: dict[str, dict[str, Any]]) -> None:
        by_topic: dict[str, list[list[object]]] = collections.defaultdict(list)
        for name, partition in sorted(partitions.items(), key=lambda item: _partition_order(item[1])):
            replicas = partition["spec"]["replicas"]
            by_topic[name.rpartition("-")[0]].append(
                [name, replicas[0], replicas[1:], " ".join(self.racks[spu_id] for spu_id in replicas)]
            )
        self.output.table(
            "Placement: each partition's leader (its preferred replica) and followers",
            ["partition", "leader", "followers", "racks of its replicas"],
            [by_topic[topic.name] for topic in TOPICS],
        )
        leads: dict[int, list[str]] = collections.defaultdict(list)
        follows: dict[int, list[str]] = collections.defaultdict(list)
        for name, partition in sorted(partitions.items(), key=lambda item: _partition_order(item[1])):
            leads[partition["spec"]["leader"]].append(name)
            for spu_id in partition["spec"]["replicas"][1:]:
                follows[spu_id].append(name)
        sections = [
            [
                [rack, spu_id, len(leads[spu_id]), leads[spu_id], len(follows[spu_id]), follows[spu_id]]
                for spu_id in sorted(spu for spu, spu_rack in self.racks.items() if spu_rack == rack)
            ]
            for rack in RACKS
        ]
        self.output.table(
            "SPUs by rack: what each leads and follows",
            ["rack", "SPU", "leads", "leader of", "follows", "follower of"],
            sections,
        )

    def show_report(self, document: dict[str, Any]) -> None:
        rows = [
            [change["partition"], change["from"], change["to"], change["cause"], change["at"]]
            for change in document.get("leaderChanges", [])
        ]
        self.output.table(
            "From report.json: leader changes, with the cause the SC recorded",
            ["partition", "from", "to", "cause", "at (UTC)"],
            [rows],
        )
        windows = document.get("unavailability", [])
        provisioning = document.get("provisioning", [])
        offline = [
            f"SPU {row['spu']} {_seconds_between(row['start'], row['end'])}"
            for row in document.get("spuIntervals", [])
            if row.get("state") == "Offline"
        ]
        leaders = document.get("balance", {}).get("leadersPerSpu", {})
        self.output.note(
            f"Partitions without a leader: {len(windows)} window(s)"
            + (f", the longest {max(w['seconds'] or 0 for w in windows):.2f} s" if windows else "")
            + f". SPUs offline: {', '.join(offline) or 'none'}."
        )
        self.output.note(
            "Provisioning (create to Provisioned): "
            + ", ".join(f"{row['topic']} {row['seconds']:.2f} s" for row in provisioning if row.get("seconds") is not None)
            + ". Leaders per SPU at the end: "
            + ", ".join(f"SPU {spu}: {count}" for spu, count in sorted(leaders.items(), key=lambda item: int(item[0])))
            + "."
        )

    # ------------------------------------------------------------------ the SC and the children

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return self.client.call(method, path, body)
        except client.ClientError as error:
            raise DemoError(f"{method} {path}: {error}") from None

    def partitions(self) -> dict[str, dict[str, Any]]:
        _, answer = self.call("GET", "/v1/partitions")
        return {partition["name"]: partition for partition in answer}

    def wait_for(self, what: str, timeout: float, check: Callable[[], T | None]) -> T:
        """Poll ``check`` until it returns something; fail if a child died or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        self.last_seen = ""
        while True:
            self._children_alive()
            found = check()
            if found is not None and found is not False:
                return found
            if time.monotonic() > deadline:
                seen = f" (last seen: {self.last_seen})" if self.last_seen else ""
                raise DemoError(f"timed out after {timeout:g} s waiting for {what}{seen}; logs in {self.out_dir / 'logs'}")
            time.sleep(POLL_INTERVAL)

    def run_to_end(self, name: str, sc_arguments: list[str], timeout: float, environment: dict[str, str] | None = None) -> demo_processes.Child:
        child = self.processes.start(name, sc_arguments, environment)
        try:
            code = child.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise DemoError(f"`sc {' '.join(sc_arguments[:2])}` did not finish within {timeout:g} s; its log: {child.log_path}") from None
        if code != 0:
            raise DemoError(f"`sc {' '.join(sc_arguments)}` failed (exit status {code}):\n{child.log_tail()}")
        return child

    def _children_alive(self) -> None:
        for name in sorted(self.running):
            child = self.processes.children[name]
            if not child.alive():
                raise DemoError(
                    f"{child.name} (pid {child.pid}) exited with status {child.process.returncode}; "
                    f"the end of its log ({child.log_path}):\n{child.log_tail()}"
                )

    def _healthy(self) -> bool:
        try:
            status, _ = self.client.call("GET", "/healthz")
        except client.ClientError:
            return False  # not listening yet, or 503 until its store is synced
        return status == 200

    def _spus_online(self, count: int) -> list[dict[str, Any]] | None:
        _, spus = self.call("GET", "/v1/spus")
        online = [spu for spu in spus if spu.get("status", {}).get("resolution") == "Online"]
        if len(online) == count:
            return online
        self.last_seen = f"{len(online)} of {count} SPUs Online"
        return None

    def _settled(self) -> dict[str, dict[str, Any]] | None:
        """Every partition Online, led by its preferred (first) replica, every replica in sync."""
        partitions = self.partitions()
        expected = sum(topic.spec["partitions"] for topic in TOPICS)
        if len(partitions) != expected:
            self.last_seen = f"{len(partitions)} of {expected} partitions exist"
            return None
        for partition in partitions.values():
            spec = partition["spec"]
            if not _online(partition) or spec["leader"] != spec["replicas"][0] or _followers_in_sync(partition) != len(spec["replicas"]) - 1:
                self.last_seen = _describe(partition)
                return None
        return partitions


def _online(partition: dict[str, Any]) -> bool:
    return bool(partition.get("status", {}).get("resolution") == "Online")


def _followers_in_sync(partition: dict[str, Any]) -> int:
    """``status.lrs``: the followers the leader reports in sync (the leader itself not counted)."""
    return int(partition.get("status", {}).get("lrs") or 0)


def _describe(partition: dict[str, Any]) -> str:
    spec, status = partition["spec"], partition.get("status", {})
    return (
        f"{partition['name']} is {status.get('resolution')}, led by SPU {spec['leader']} (preferred {spec['replicas'][0]}), "
        f"{_followers_in_sync(partition)} of {len(spec['replicas']) - 1} followers in sync"
    )


def _partition_order(partition: dict[str, Any]) -> tuple[int, int]:
    name = partition["name"]
    topic, _, index = name.rpartition("-")
    order = [demo_topic.name for demo_topic in TOPICS]
    return (order.index(topic) if topic in order else len(order), int(index) if index.isdigit() else 0)


def _seconds_between(start: str, end: str | None) -> str:
    if end is None:
        return "since " + start
    seconds = (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds()
    return f"for {seconds:.1f} s"


def _last_json_line(path: Path) -> dict[str, Any]:
    """The JSON summary a command printed last (its log holds its other output too)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    return {}
