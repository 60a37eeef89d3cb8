"""The commands of deploy/ run for real: the SC as Compose, Kubernetes and systemd start it, the
Compose stack's SPU registration and SPU simulators, and the health checks they declare.

Each runs the manifest's exact argv and environment through the image's entrypoint (or the
unit's ExecStart), swapping only what must differ on one test machine: etcd endpoints (the test
etcd), ports (free ones), paths (a temp dir), the key prefix (a fresh one on the shared etcd) and
host names. A flag that no longer exists, a setting the SC rejects or a health check that does
not check fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from asyncio.subprocess import PIPE
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from store import embedded_etcd, history
from tests import deploy_files as files

BIN = str(Path(sys.executable).parent)  # where this environment's `sc` is: /opt/sc/bin in the image
STOP_TIMEOUT = 30.0  # the manifests' grace period (checked against them below)


class Process:
    """A child process with its stdout and stderr in files."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, logs: Path, name: str) -> None:
        self.argv = argv
        self.stdout = logs / f"{name}.out"
        self.stderr = logs / f"{name}.err"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)

    def output(self) -> str:
        return f"$ {shlex.join(self.argv)}\n{self.stdout.read_text()[-3000:]}\n{self.stderr.read_text()[-3000:]}"

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], cwd: Path, logs: Path, name: str) -> Iterator[Process]:
    process = Process(argv, env, cwd, logs, name)
    try:
        yield process
    finally:
        process.kill()


def base_env(extra: dict[str, str]) -> dict[str, str]:
    """Only what the container or unit would set: nothing of the test's own SC_* environment leaks in."""
    return {"HOME": os.environ.get("HOME", "/"), **extra}


def get_json(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        # Patience, not a bound: the waits below poll with it, and a read timeout is no answer to retry
        # but an error (an SC starting beside its standby and etcd on a busy machine may take seconds).
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def wait_healthy(process: Process, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process.popen.poll() is None, f"exited with {process.popen.returncode}:\n{process.output()}"
        with contextlib.suppress(OSError):
            if get_json(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"}):
                return
        assert time.monotonic() < deadline, f"not healthy within {timeout} s:\n{process.output()}"
        time.sleep(0.05)


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON log (a line that is not JSON fails the test)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def etcd_urls(server: embedded_etcd.EmbeddedEtcd) -> list[str]:
    if not server.running:
        server.start()
    return [f"http://{endpoint}" for endpoint in server.endpoints]


def fresh_prefix() -> str:
    return f"/deploy-{uuid.uuid4().hex[:8]}/"


def image_env() -> dict[str, str]:
    """The image's ENV, its /opt/sc/bin being this environment's bin directory."""
    env = files.image_env(base_path=os.environ["PATH"])
    assert env["PATH"].startswith("/opt/sc/bin:"), env["PATH"]
    return {**env, "PATH": env["PATH"].replace("/opt/sc/bin", BIN, 1)}


def post_json(url: str, body: Any, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def register_spu(public: int, token: str | None = None) -> str:
    """Something for the history to record: an SPU registered through the API; its name."""
    spec = {"id": 7, "publicEndpoint": {"host": "spu-7", "port": 9005}, "privateEndpoint": {"host": "spu-7", "port": 9006}}
    if token is not None:  # the deployed SC asks for a credential: without one, a 401
        status, body = post_json(f"http://127.0.0.1:{public}/v1/spus", {"name": "spu-7", "spec": spec})
        assert status == 401, body
    status, body = post_json(f"http://127.0.0.1:{public}/v1/spus", {"name": "spu-7", "spec": spec}, token)
    assert status == 201, body
    return "spu-7"


DEPLOY_TOKEN = "deploy-test-token-0123456789abcdef"


def tokens_file(tmp_path: Path) -> Path:
    """What the operator makes by deploy/README.md: one admin credential, readable by the SC only."""
    path = tmp_path / "tokens"
    path.write_text(f"ops admin {DEPLOY_TOKEN}\n")
    path.chmod(0o600)
    return path


def assert_history_recorded(directory: Path, spu_name: str) -> None:
    """The SC recorded its history in ``directory``: the snapshot it started from (the key prefix was
    empty), then the SPU registered while it ran, seen live."""
    records = list(history.HistoryReader(directory).records())
    assert (directory / "history.id").is_file()
    assert [(r["type"], r["snapshot"]) for r in records if r["type"] == "sync"][:1] == [("sync", True)]
    created = [(r["kind"], r["name"], r["source"]) for r in records if r["type"] == "change" and r["op"] == "create"]
    assert created == [("spus", spu_name, "watch")]


def stop_cleanly(process: Process, stop_signal: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> None:
    """The SC stops with status 0 on the signal, having logged JSON lines only, to stderr."""
    assert process.stop(stop_signal, timeout) == 0, process.output()
    assert process.stdout.read_text() == ""
    events = [line["event"] for line in json_lines(process.stderr)]
    assert "SC ready" in events, events


def assert_private_port_warning(process: Process, remote_spus: bool) -> None:
    """With no SPU token, the SC said once at start whom its private port accepts."""
    warnings = [line["event"] for line in json_lines(process.stderr) if "SPU token" in line["event"]]
    expected = (
        "no SPU token is configured and spu_allow_remote_without_token is set: anyone who reaches "
        "the private port can connect as any registered SPU; configure spu_token_file"
        if remote_spus
        else "no SPU token is configured: the private port accepts SPUs from this host (loopback) only; "
        "to accept SPUs from other hosts, give every SPU a shared token (spu_token_file, "
        "`sc spu run --token-file`)"
    )
    assert warnings == [expected], warnings


def roles(publics: list[int], token: str | None) -> list[dict[str, Any]]:
    """``GET /v1/cluster`` of each SC."""
    answers = []
    for public in publics:
        status, body = get_json(f"http://127.0.0.1:{public}/v1/cluster", token)
        assert status == 200, body
        answers.append(body)
    return answers


def assert_one_leads_the_other_stands_by(publics: list[int], advertised: list[str], token: str | None = None) -> int:
    """The SCs at ``publics`` (public ports), advertising ``advertised`` (host:port each): exactly one
    leads, the other is a standby, and both name the same leader and standby. The leader's index."""
    answers = roles(publics, token)
    assert sorted(answer["self"]["role"] for answer in answers) == ["leader", "standby"], answers
    [leading] = [index for index, answer in enumerate(answers) if answer["self"]["role"] == "leader"]
    assert [answer["self"]["address"] for answer in answers] == advertised
    for answer in answers:
        assert answer["leader"]["address"] == advertised[leading], answers
        assert [standby["address"] for standby in answer["standbys"]] == [advertised[1 - leading]], answers
    return leading


def assert_standby_redirects_writes(standby_public: int, leader_advertised: str, token: str | None = None) -> None:
    """A write to the standby is a 307 to the leader's advertised public address (urllib does not
    follow a POST's 307; `sc` does)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(f"http://127.0.0.1:{standby_public}/v1/spus", b"{}", headers, method="POST")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert (raised.value.code, raised.value.headers["Location"]) == (307, f"http://{leader_advertised}/v1/spus")
    assert json.load(raised.value)["error"]["code"] == "NotLeader"


def wait_listed(publics: list[int], spu_name: str, token: str | None = None) -> None:
    """Every SC lists the SPU: the standby's mirror (and so its history) has the change too."""

    def listed() -> bool:
        answers = [get_json(f"http://127.0.0.1:{public}/v1/spus", token) for public in publics]
        return all(status == 200 and spu_name in [spu["name"] for spu in spus] for status, spus in answers)

    wait_for(listed, 10.0, f"{spu_name} listed by every SC")


def wait_settled(processes: list[Process], publics: list[int], token: str | None = None) -> None:
    """Each SC healthy (200 on /healthz, a standby included), and both seeing each other."""
    for process, public in zip(processes, publics, strict=True):
        wait_healthy(process, public)

    def both_known() -> bool:
        return all(answer["leader"] is not None and len(answer["standbys"]) == 1 for answer in roles(publics, token))

    wait_for(both_known, 15.0, "both SCs in each other's view")


# ------------------------------------------------------------------------------------------- Compose


COMPOSE_SCS = ["sc-0", "sc-1"]


def compose_healthcheck(service: dict[str, Any], **replacements: str) -> list[str]:
    """A healthcheck's exec-form command, with host-specific text replaced (each must occur)."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", test
    argv = [files.unescape_compose(word) for word in test[1:]]
    for old, new in replacements.items():
        assert any(old in word for word in argv), f"{old!r} not in {argv}"
        argv = [word.replace(old, new) for word in argv]
    return argv


def compose_env(service: dict[str, Any], **replacements: str) -> dict[str, str]:
    environment = {key: files.unescape_compose(str(value)) for key, value in service.get("environment", {}).items()}
    missing = set(replacements) - set(environment)
    assert not missing, f"the service sets no {sorted(missing)}"
    return {**environment, **replacements}



def compose_sc(name: str, etcd: list[str], prefix: str, public: int, private: int, workdir: Path, **env: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of Compose's SC ``name``, on this machine's etcd, ports and paths."""
    sc = files.compose()["services"][name]
    argv = files.image_entrypoint() + [files.unescape_compose(word) for word in sc["command"]]
    argv = files.replace_flag(argv, "--etcd-endpoints", ",".join(etcd))
    argv = files.replace_flag(argv, "--public-port", str(public))
    argv = files.replace_flag(argv, "--private-port", str(private))
    history_flag = files.flag_value(argv, "--history-dir")
    assert history_flag == "/var/lib/sc/history"  # on the service's volume, mounted at the WORKDIR
    argv = files.replace_flag(argv, "--history-dir", str(workdir / "history"))
    return argv, base_env({**image_env(), **compose_env(sc, SC_KEY_PREFIX=prefix, **env)})


@pytest.mark.etcd
def test_compose_scs_run_as_composed_one_leads_one_stands_by(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """Both SCs as composed, started together on one store: one leads, the other is a standby;
    both are healthy, advertise their service names, and record their own history."""
    services = files.compose()["services"]
    assert files.image_workdir() == "/var/lib/sc"
    ports = embedded_etcd.free_ports(4)
    publics, privates = ports[:2], ports[2:]
    prefix = fresh_prefix()
    workdirs = [tmp_path / name for name in COMPOSE_SCS]  # the image's WORKDIR, where each service's volume is
    commands = []
    for name, workdir, public, private in zip(COMPOSE_SCS, workdirs, publics, privates, strict=True):
        workdir.mkdir()
        commands.append(compose_sc(name, etcd_urls(etcd_server), prefix, public, private, workdir))
    healthchecks = [
        compose_healthcheck(services[name], **{"127.0.0.1:9003": f"127.0.0.1:{public}"}) for name, public in zip(COMPOSE_SCS, publics, strict=True)
    ]

    with contextlib.ExitStack() as stack:
        processes = [
            stack.enter_context(started(argv, env, workdir, tmp_path, name))
            for name, (argv, env), workdir in zip(COMPOSE_SCS, commands, workdirs, strict=True)
        ]
        wait_settled(processes, publics)
        # Each advertises its service name (its address on the Compose network) with its port.
        advertised = [f"{name}:{public}" for name, public in zip(COMPOSE_SCS, publics, strict=True)]
        leading = assert_one_leads_the_other_stands_by(publics, advertised)
        assert_standby_redirects_writes(publics[1 - leading], advertised[leading])
        for healthcheck, (_, env) in zip(healthchecks, commands, strict=True):
            checked = subprocess.run(healthcheck, env=env, capture_output=True, timeout=10)
            assert (checked.returncode, checked.stdout, checked.stderr) == (0, b"", b"")
        spu = register_spu(publics[leading])
        wait_listed(publics, spu)
        # Both record the change: the standby's history follows the store too.
        for workdir in workdirs:
            assert sorted(path.name for path in workdir.iterdir()) == ["history"]  # the only thing it writes
        for name in COMPOSE_SCS:
            assert services[name]["stop_grace_period"] == f"{STOP_TIMEOUT:.0f}s"
        # The standby first, so that the leader's stop is not a takeover.
        for index in (1 - leading, leading):
            stop_cleanly(processes[index])
    for process, workdir in zip(processes, workdirs, strict=True):
        assert_private_port_warning(process, remote_spus=True)
        assert_history_recorded(workdir / "history", spu)
    # Stopped, they fail their health checks.
    for healthcheck, (_, env) in zip(healthchecks, commands, strict=True):
        assert subprocess.run(healthcheck, env=env, capture_output=True, timeout=10).returncode == 1


async def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdout=PIPE, stderr=PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.etcd
async def test_compose_spu_init_and_spus_join_the_leader_through_the_standby(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """spu-init registers the SPUs through sc-0 (and succeeds again on a second `up`); each SPU
    service connects. sc-1 starts first and leads, so sc-0 is the standby: the registration follows
    its redirect, and the SPUs, which try sc-0 first, follow its refusal to the leader."""
    services = files.compose()["services"]
    spu_services = sorted(name for name in services if name.startswith("spu-") and name != "spu-init")
    assert spu_services == ["spu-0", "spu-1", "spu-2"]
    # Each SC container is reached at its service name; here each at a loopback address of its own
    # (the SCs bind every interface), advertised as its name is in Compose.
    hosts = {name: f"127.0.2.{index + 1}" for index, name in enumerate(COMPOSE_SCS)}
    ports = embedded_etcd.free_ports(4)
    publics, privates = dict(zip(COMPOSE_SCS, ports[:2], strict=True)), dict(zip(COMPOSE_SCS, ports[2:], strict=True))
    prefix = fresh_prefix()
    with contextlib.ExitStack() as stack:
        processes = {}
        for name in ["sc-1", "sc-0"]:
            workdir = tmp_path / name
            workdir.mkdir()
            argv, env = compose_sc(name, etcd_urls(etcd_server), prefix, publics[name], privates[name], workdir, SC_ADVERTISE_HOST=hosts[name])
            processes[name] = stack.enter_context(started(argv, env, workdir, tmp_path, name))
            wait_healthy(processes[name], publics[name])
        wait_settled([processes[name] for name in COMPOSE_SCS], [publics[name] for name in COMPOSE_SCS])
        advertised = [f"{hosts[name]}:{publics[name]}" for name in COMPOSE_SCS]
        assert assert_one_leads_the_other_stands_by([publics[name] for name in COMPOSE_SCS], advertised) == 1
        await _spu_init_and_spus(services, spu_services, hosts, publics, privates, publics["sc-1"], tmp_path)
        for name in ["sc-0", "sc-1"]:
            stop_cleanly(processes[name])


async def _spu_init_and_spus(
    services: dict[str, Any], spu_services: list[str], hosts: dict[str, str], publics: dict[str, int], privates: dict[str, int],
    leader_public: int, tmp_path: Path,
) -> None:
    # Each SPU container has its own 0.0.0.0:9006; here the three share one machine, so each
    # listens on a loopback address of its own, on a port free here.
    port = embedded_etcd.free_ports(1)[0]
    init = services["spu-init"]
    init_argv = [files.unescape_compose(word) for word in init["entrypoint"] + init["command"]]
    assert sum(word.count(':9006"') for word in init_argv) == 1
    init_argv = [word.replace(':9006"', f':{port}"') for word in init_argv]
    assert init["environment"]["SC_ADDR"] == "http://sc-0:9003"
    init_env = base_env({**image_env(), **compose_env(init, SC_ADDR=f"http://{hosts['sc-0']}:{publics['sc-0']}")})
    first = await run(init_argv, init_env, tmp_path)
    assert first[0] == 0 and first[2] == "", first
    # Each SPU is registered under its service's name and id, with its service's name as host
    # (its address on the Compose network).
    status, spus = get_json(f"http://127.0.0.1:{leader_public}/v1/spus")
    assert status == 200
    assert sorted((spu["name"], spu["spec"]["id"], spu["spec"]["privateEndpoint"], spu["status"]["resolution"]) for spu in spus) == [
        (name, int(files.flag_value(services[name]["command"], "--id")), {"host": name, "port": port}, "Init")
        for name in spu_services
    ]

    # The SPUs, each as its `command:`, given every SC's private address (sc-0's first: the standby).
    processes = []
    for index, name in enumerate(spu_services):
        spu = services[name]
        argv = files.image_entrypoint() + [files.unescape_compose(word) for word in spu["command"]]
        assert files.flag_value(argv, "--sc-private") == "sc-0:9004,sc-1:9004"
        argv = files.replace_flag(argv, "--sc-private", ",".join(f"{hosts[sc]}:{privates[sc]}" for sc in COMPOSE_SCS))
        assert files.flag_value(argv, "--listen-host") == "0.0.0.0"
        argv = files.replace_flag(argv, "--listen-host", f"127.0.0.{index + 2}")
        assert files.flag_value(argv, "--data-dir") == "/var/lib/sc"
        data = tmp_path / name
        data.mkdir()
        argv = files.replace_flag(argv, "--data-dir", str(data))
        with (tmp_path / f"{name}.out").open("wb") as out, (tmp_path / f"{name}.err").open("wb") as err:
            processes.append(await asyncio.create_subprocess_exec(*argv, env=base_env({**image_env(), **compose_env(spu)}), cwd=data, stdout=out, stderr=err))
    try:
        # Meanwhile, a second `up`: the SPUs are registered already.
        again = await run(init_argv, init_env, tmp_path)
        assert again == (0, "spu-0 is already registered\nspu-1 is already registered\nspu-2 is already registered\n", "")

        async def all_online() -> bool:
            _, listed = get_json(f"http://127.0.0.1:{leader_public}/v1/spus")
            return [spu["status"]["resolution"] for spu in listed] == ["Online"] * 3

        await _eventually(all_online, 20.0, "every SPU online")
        for index, name in enumerate(spu_services):
            probe = compose_healthcheck(services[name], **{"('127.0.0.1', 9006)": f"('127.0.0.{index + 2}', {port})"})

            async def listening(probe: list[str] = probe) -> bool:
                return (await run(probe, base_env(image_env()), tmp_path))[0] == 0

            await _eventually(listening, 10.0, f"{name} listening")
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(process.wait(), STOP_TIMEOUT) for process in processes]
    assert codes == [0, 0, 0]
    leader_private = f"{hosts['sc-1']}:{privates['sc-1']}"
    for name in spu_services:
        assert (tmp_path / f"{name}.out").read_text() == ""
        lines = json_lines(tmp_path / f"{name}.err")
        events = [line["event"] for line in lines]
        assert events[-1] == "spu stopped" and "sc accepted" in events, events
        # Refused by the standby sc-0, which named the leader's advertised private address.
        assert [line["leader"] for line in lines if line["event"] == "sc is a standby; going to the leader it names"][:1] == [leader_private]
        assert (tmp_path / name / name / "offsets.json").is_file()  # its volume keeps its offsets


async def _eventually(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------------------- Kubernetes


def pod_env(container: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The kubelet's part: the container's env, metadata.name from the downward API, and each
    ``$(NAME)`` replaced by a variable defined before it (as Kubernetes expands them)."""
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "valueFrom" in variable:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, variable
            env[variable["name"]] = pod_name
        else:
            env[variable["name"]] = re.sub(r"\$\((\w+)\)", lambda match: env[match[1]], variable["value"])
    return env


@pytest.mark.etcd
def test_kubernetes_scs_run_as_deployed_one_leads_one_stands_by(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """Each pod of the StatefulSet: its args and env (advertising POD.sc-peers), through the image's
    entrypoint, with the ConfigMap's file as mounted and its own history claim. Started together,
    one leads and the other is a standby, both ready (/healthz 200, the probes' path)."""
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    container = files.container(statefulset, "sc")
    pod = statefulset["spec"]["template"]["spec"]
    assert "command" not in container  # the image's entrypoint, `sc`
    argv = files.image_entrypoint() + container["args"]
    # --config names a file of the ConfigMap volume mounted at its directory.
    config_path = Path(files.flag_value(argv, "--config"))
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = files.kubernetes_object("ConfigMap", volume["configMap"]["name"])
    # The history goes to the pod's claim mounted at /var/lib/sc (the root file system is read-only).
    [history_mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/sc"]
    assert "readOnly" not in history_mount
    assert [claim["metadata"]["name"] for claim in statefulset["spec"]["volumeClaimTemplates"]] == [history_mount["name"]]
    pods = [f"{statefulset['metadata']['name']}-{index}" for index in range(statefulset["spec"]["replicas"])]
    assert pods == ["sc-0", "sc-1"]
    assert [probe["httpGet"]["path"] for probe in (container["startupProbe"], container["readinessProbe"])] == ["/healthz"] * 2
    ports = embedded_etcd.free_ports(4)
    publics, privates = ports[:2], ports[2:]
    prefix = fresh_prefix()
    tokens = tokens_file(tmp_path)
    commands = []
    workdirs = []
    for name, public, private in zip(pods, publics, privates, strict=True):
        workdir = tmp_path / name
        workdir.mkdir()
        workdirs.append(workdir)
        settings = files.replace_settings(
            config_map["data"][config_path.name],
            etcd_endpoints=etcd_urls(etcd_server),
            key_prefix=prefix,
            public_port=public,
            private_port=private,
            history_dir=str(workdir / "history"),
            auth_tokens=str(tokens),
        )
        local_config = tmp_path / f"{name}.toml"
        local_config.write_text(settings)
        commands.append((files.replace_flag(argv, "--config", str(local_config)), base_env({**image_env(), **pod_env(container, name)})))
    assert [env["SC_ADVERTISE_HOST"] for _, env in commands] == ["sc-0.sc-peers", "sc-1.sc-peers"]

    with contextlib.ExitStack() as stack:
        processes = [
            stack.enter_context(started(command, env, workdir, tmp_path, name))
            for name, (command, env), workdir in zip(pods, commands, workdirs, strict=True)
        ]
        wait_settled(processes, publics, DEPLOY_TOKEN)
        # Each advertises its stable name under the headless Service, which its peers resolve in the cluster.
        advertised = [f"{name}.sc-peers:{public}" for name, public in zip(pods, publics, strict=True)]
        leading = assert_one_leads_the_other_stands_by(publics, advertised, DEPLOY_TOKEN)
        assert_standby_redirects_writes(publics[1 - leading], advertised[leading], DEPLOY_TOKEN)
        spu = register_spu(publics[leading], DEPLOY_TOKEN)
        wait_listed(publics, spu, DEPLOY_TOKEN)
        for workdir in workdirs:
            assert sorted(path.name for path in workdir.iterdir()) == ["history"]
        for index in (1 - leading, leading):
            stop_cleanly(processes[index], timeout=pod["terminationGracePeriodSeconds"])
    for process, workdir in zip(processes, workdirs, strict=True):
        assert_private_port_warning(process, remote_spus=True)
        assert_history_recorded(workdir / "history", spu)


# ------------------------------------------------------------------------------------------- systemd


def systemd_command(unit: dict[str, dict[str, list[str]]], config_text: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """ExecStart with /opt/sc/bin/sc as this environment's and --config as a local copy of ``config_text``."""
    [exec_start] = unit["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == "/opt/sc/bin/sc"
    argv[0] = str(Path(BIN) / "sc")
    assert files.flag_value(argv, "--config") == "/etc/sc/sc.toml"
    local_config = tmp_path / "sc.toml"
    local_config.write_text(config_text)
    argv = files.replace_flag(argv, "--config", str(local_config))
    env = base_env({"PATH": os.environ["PATH"], **files.systemd_environment(unit["Service"].get("Environment", []))})
    return argv, env


@pytest.mark.etcd
def test_systemd_sc_runs_as_the_unit_starts_it(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """ExecStart with deploy/systemd/sc.toml as /etc/sc/sc.toml; stopped by the unit's KillSignal in its TimeoutStopSec."""
    unit = files.systemd_unit()
    service = unit["Service"]
    assert service["WorkingDirectory"] == ["/var/lib/sc"] and service["StateDirectory"] == ["sc"]
    state = tmp_path / "state"  # /var/lib/sc
    state.mkdir()
    public, private = embedded_etcd.free_ports(2)
    text = files.SYSTEMD_CONFIG.read_text()
    history_dir = Path(files.tomllib.loads(text)["history_dir"])
    assert history_dir.parent == Path("/var/lib/sc")  # under the StateDirectory, writable despite ProtectSystem=strict
    settings = files.replace_settings(
        text,
        etcd_endpoints=etcd_urls(etcd_server),
        key_prefix=fresh_prefix(),
        public_port=public,
        private_port=private,
        history_dir=str(state / history_dir.name),
        auth_tokens=str(tokens_file(tmp_path)),
    )
    argv, env = systemd_command(unit, settings, tmp_path)
    [kill_signal] = service["KillSignal"]
    [stop_timeout] = service["TimeoutStopSec"]
    with started(argv, env, state, tmp_path, "sc") as process:
        wait_healthy(process, public)
        spu = register_spu(public, DEPLOY_TOKEN)
        assert sorted(path.name for path in state.iterdir()) == ["history"]
        stop_cleanly(process, getattr(signal, kill_signal), float(stop_timeout))
    assert_private_port_warning(process, remote_spus=False)
    assert_history_recorded(state / history_dir.name, spu)


def test_systemd_bad_config_exits_with_the_status_the_unit_does_not_restart(tmp_path: Path) -> None:
    """A setting the SC rejects exits 2, which RestartPreventExitStatus keeps from a restart loop."""
    unit = files.systemd_unit()
    assert unit["Service"]["RestartPreventExitStatus"] == ["2"]
    argv, env = systemd_command(unit, files.SYSTEMD_CONFIG.read_text() + "public_prot = 9003\n", tmp_path)
    finished = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 2
    assert finished.stderr == (
        f"error: invalid configuration: public_prot (in {tmp_path / 'sc.toml'}) = 9003: is not a setting "
        "(see the configuration reference in docs/configuration.md)\n"
    )


# -------------------------------------------------------------------------------------- etcd members


@dataclass
class EtcdMember:
    name: str
    argv: list[str]
    env: dict[str, str]
    health: list[str]  # Compose: the health check's command
    probes: list[str]  # Kubernetes: the liveness and readiness probes' URLs


def etcd_members(where: str, tmp_path: Path) -> list[EtcdMember]:
    """Each etcd member as Compose or the StatefulSet runs it, on 127.0.0.1 with ports of its own:
    the members' host names and their 0.0.0.0 become 127.0.0.1:<port>, the data dir a temp dir.
    Everything else is the manifest's."""
    etcd_bin = Path(embedded_etcd.find_etcd_binary()).parent
    if where == "compose":
        services = files.compose()["services"]
        names = [name for name in services if name.startswith("etcd-")]
        hosts = {name: name for name in names}
        raw = [(name, services[name]["command"], services[name]["environment"], services[name]["healthcheck"]["test"]) for name in names]
        volume = services[names[0]]["volumes"][0].split(":")[1]
        probe_paths: list[str] = []
    else:
        statefulset = files.kubernetes_object("StatefulSet", "etcd")
        etcd = files.container(statefulset, "etcd")
        names = [f"etcd-{index}" for index in range(statefulset["spec"]["replicas"])]
        hosts = {name: f"{name}.{statefulset['spec']['serviceName']}" for name in names}
        # The kubelet's part: $(POD_NAME) from the downward API.
        raw = [(name, [w.replace("$(POD_NAME)", name) for w in etcd["command"] + etcd["args"]], {}, []) for name in names]
        volume = etcd["volumeMounts"][0]["mountPath"]
        probe_paths = [etcd[probe]["httpGet"]["path"] for probe in ("livenessProbe", "readinessProbe")]
        assert {etcd[probe]["httpGet"]["port"] for probe in ("livenessProbe", "readinessProbe")} == {"metrics"}
    ports = {name: embedded_etcd.free_ports(3) for name in names}  # client, peer, metrics
    members = []
    for name, command, environment, test in raw:
        replacements = {f"0.0.0.0:{port}": f"127.0.0.1:{mine}" for port, mine in zip((2379, 2380, 2381), ports[name], strict=True)}
        replacements["127.0.0.1:2379"] = f"127.0.0.1:{ports[name][0]}"  # the health check's own member
        for other in names:
            replacements[f"{hosts[other]}:2379"] = f"127.0.0.1:{ports[other][0]}"
            replacements[f"{hosts[other]}:2380"] = f"127.0.0.1:{ports[other][1]}"

        replacements[volume + "/"] = f"{tmp_path / name}/"
        # One pass, so that a replacement is never replaced again (127.0.0.1:23791 is no 127.0.0.1:2379).
        pattern = re.compile("|".join(re.escape(old) for old in sorted(replacements, key=len, reverse=True)))

        def local(text: str, pattern: re.Pattern[str] = pattern, replacements: dict[str, str] = replacements) -> str:
            return pattern.sub(lambda match: replacements[match[0]], text)

        argv = [local(word) for word in command]
        assert argv[0] == "etcd"
        argv[0] = str(etcd_bin / "etcd")
        env = {key: local(files.unescape_compose(value)) for key, value in environment.items()}
        health = [local(word) for word in test[1:]]
        if health:
            assert test[0] == "CMD" and health[0] == "etcdctl"
            health[0] = str(etcd_bin / "etcdctl")
        metrics = f"http://127.0.0.1:{ports[name][2]}"
        members.append(EtcdMember(name, argv, base_env({"PATH": os.environ["PATH"], **env}), health, [metrics + p for p in probe_paths]))
    return members


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


@pytest.mark.parametrize("where", ["compose", "kubernetes"])
def test_etcd_members_form_a_healthy_cluster(where: str, tmp_path: Path) -> None:
    """The three members' exact flags (and Compose's ETCD_* variables) make one cluster with a
    quorum, which Compose's health checks and the Kubernetes probes see."""
    members = etcd_members(where, tmp_path)
    assert [member.name for member in members] == ["etcd-0", "etcd-1", "etcd-2"]
    assert all(bool(member.health) == (where == "compose") and bool(member.probes) == (where == "kubernetes") for member in members)
    with contextlib.ExitStack() as stack:
        processes = [stack.enter_context(started(m.argv, m.env, tmp_path, tmp_path, m.name)) for m in members]
        for member, process in zip(members, processes, strict=True):

            def healthy(member: EtcdMember = member, process: Process = process) -> bool:
                assert process.popen.poll() is None, process.output()
                if member.health:
                    return subprocess.run(member.health, env=member.env, capture_output=True, timeout=10).returncode == 0
                return [http_status(url) for url in member.probes] == [200, 200]

            wait_for(healthy, 30.0, f"{member.name} healthy")
        # All under the data dirs they were given: the volume's.
        assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == ["etcd-0", "etcd-1", "etcd-2"]
        client = files.flag_value(members[0].argv, "--advertise-client-urls")
        etcdctl = str(Path(embedded_etcd.find_etcd_binary()).parent / "etcdctl")
        listed = subprocess.run([etcdctl, f"--endpoints={client}", "member", "list", "-w", "json"], capture_output=True, text=True, timeout=10)
        assert sorted(member["name"] for member in json.loads(listed.stdout)["members"]) == ["etcd-0", "etcd-1", "etcd-2"]
        for process in processes:
            # etcd shuts down, then re-raises the signal to itself: that is its clean stop.
            assert process.stop() == -signal.SIGTERM, process.output()
            assert '"msg":"closed etcd server"' in process.stderr.read_text()
