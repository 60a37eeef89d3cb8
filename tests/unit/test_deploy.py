"""The files under deploy/, checked offline: the Kubernetes manifests against Kubernetes' schemas
(kubernetes-validate, strict), the Compose file against the Compose specification's schema
(vendored in tests/data), the Dockerfile and the systemd unit read as their tools read them, and
the references between them (names, ports, labels, endpoints) that no schema sees.
tests/functional/test_deploy.py runs their commands.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from packaging.specifiers import SpecifierSet

from controller import config
from tests import deploy_files as files

DATA = Path(__file__).resolve().parent.parent / "data"
# The oldest Kubernetes release still commonly run, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.27", kubernetes_validate.utils.major_minor(kubernetes_validate.utils.latest_version())]
IMAGE = f"streaming-controller:{files.pyproject()['project']['version']}"
PART_OF = {"app.kubernetes.io/part-of": "streaming-controller"}


# ---------------------------------------------------------------------------------------- Kubernetes


def test_kubernetes_manifests_hold_exactly_these_objects() -> None:
    assert [(path.name, doc["kind"], doc["metadata"]["name"]) for path, doc in files.kubernetes_documents()] == [
        ("etcd.yaml", "Service", "etcd"),
        ("etcd.yaml", "StatefulSet", "etcd"),
        ("etcd.yaml", "PodDisruptionBudget", "etcd"),
        ("sc.yaml", "ConfigMap", "sc-config"),
        ("sc.yaml", "StatefulSet", "sc"),
        ("sc.yaml", "Service", "sc-peers"),
        ("sc.yaml", "Service", "sc"),
        ("sc.yaml", "PodDisruptionBudget", "sc"),
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_match_the_schemas(version: str) -> None:
    """Strict: an unknown field (a misspelt probe, say) fails, as `kubectl apply` would reject it."""
    for path, document in files.kubernetes_documents():
        assert kubernetes_validate.validate(document, version, strict=True) == version, (path, document["kind"])


def test_kubernetes_validation_rejects_a_misspelt_field() -> None:
    statefulset = copy.deepcopy(files.kubernetes_object("StatefulSet", "sc"))
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="'livenesProbe' was unexpected"):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSIONS[0], strict=True)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    assert workload["spec"]["selector"] == {"matchLabels": labels}
    return labels


def named_ports(container: dict[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container["ports"]}


def test_etcd_statefulset_members_find_each_other() -> None:
    service = files.kubernetes_object("Service", "etcd")
    statefulset = files.kubernetes_object("StatefulSet", "etcd")
    spec = statefulset["spec"]
    etcd = files.container(statefulset, "etcd")
    # Headless, selecting the members, publishing them before they are ready (no quorum before two are up).
    assert (service["spec"]["clusterIP"], service["spec"]["publishNotReadyAddresses"]) == ("None", True)
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    assert spec["serviceName"] == service["metadata"]["name"]
    assert (spec["replicas"], spec["podManagementPolicy"]) == (3, "Parallel")
    ports = named_ports(etcd)
    assert {port["name"]: ports[port["targetPort"]] for port in service["spec"]["ports"]} == {"client": 2379, "peer": 2380}
    # Each member: its pod name, advertised under the headless Service; the initial cluster names them all.
    assert etcd["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    members = [f"{statefulset['metadata']['name']}-{index}" for index in range(spec["replicas"])]
    args = etcd["args"]
    assert files.flag_value(args, "--name") == "$(POD_NAME)"
    assert files.flag_value(args, "--advertise-client-urls") == "http://$(POD_NAME).etcd:2379"
    assert files.flag_value(args, "--initial-advertise-peer-urls") == "http://$(POD_NAME).etcd:2380"
    assert files.flag_value(args, "--initial-cluster") == ",".join(f"{m}=http://{m}.etcd:2380" for m in members)
    assert files.flag_value(args, "--listen-metrics-urls") == f"http://0.0.0.0:{ports['metrics']}"
    # Its data on the claim of each member.
    [claim] = spec["volumeClaimTemplates"]
    [mount] = etcd["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert files.flag_value(args, "--data-dir").startswith(mount["mountPath"] + "/")
    # Probes: alive on the member's own health, ready with the cluster's (quorum) health.
    assert etcd["livenessProbe"]["httpGet"] == {"path": "/health?exclude=NOSPACE&serializable=true", "port": "metrics"}
    assert etcd["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}


def test_etcd_disruption_budget_keeps_a_quorum() -> None:
    statefulset = files.kubernetes_object("StatefulSet", "etcd")
    budget = files.kubernetes_object("PodDisruptionBudget", "etcd")
    assert budget["spec"]["selector"] == {"matchLabels": pod_labels(statefulset)}
    replicas = statefulset["spec"]["replicas"]
    assert replicas - budget["spec"]["maxUnavailable"] >= replicas // 2 + 1


def sc_settings_toml() -> dict[str, Any]:
    return tomllib.loads(files.kubernetes_object("ConfigMap", "sc-config")["data"]["sc.toml"])


def test_sc_statefulset_config_ports_and_probes_agree() -> None:
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    service = files.kubernetes_object("Service", "sc")
    etcd = files.kubernetes_object("StatefulSet", "etcd")
    spec = statefulset["spec"]
    sc = files.container(statefulset, "sc")
    # Two SCs on one store: one leads, the other is a hot standby; neither waits for the other to start.
    assert (spec["replicas"], spec["podManagementPolicy"], spec["serviceName"]) == (2, "Parallel", "sc-peers")
    assert "strategy" not in spec and "updateStrategy" not in spec  # a rolling update, one pod at a time
    assert sc["image"] == IMAGE
    assert sc["args"] == ["run", "--config", "/etc/sc/sc.toml"]
    settings = sc_settings_toml()
    config.Settings(**settings)  # every key is a setting, every value valid
    # The members of the etcd StatefulSet, by their stable names.
    assert settings["etcd_endpoints"] == [f"http://etcd-{i}.etcd:2379" for i in range(etcd["spec"]["replicas"])]
    ports = named_ports(sc)
    assert ports == {"public": settings["public_port"], "private": settings["private_port"]}
    # The clients' Service: every SC (a standby serves reads and redirects writes in the cluster).
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    assert "clusterIP" not in service["spec"]
    assert [(port["port"], ports[port["targetPort"]]) for port in service["spec"]["ports"]] == [(9003, 9003), (9004, 9004)]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert sc[probe]["httpGet"] == {"path": "/healthz", "port": "public"}, probe


def test_each_sc_pod_advertises_its_stable_name_under_the_headless_service() -> None:
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    peers = files.kubernetes_object("Service", statefulset["spec"]["serviceName"])
    sc = files.container(statefulset, "sc")
    # Headless, selecting the SC pods, naming them before they are ready (a starting SC is reached by its name).
    assert (peers["spec"]["clusterIP"], peers["spec"]["publishNotReadyAddresses"]) == ("None", True)
    assert selects(peers["spec"]["selector"], pod_labels(statefulset))
    ports = named_ports(sc)
    assert {port["name"]: ports[port["targetPort"]] for port in peers["spec"]["ports"]} == {"public": 9003, "private": 9004}
    # $(POD_NAME) from the downward API, defined before the variable that uses it: sc-N.sc-peers.
    assert sc["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "SC_ADVERTISE_HOST", "value": f"$(POD_NAME).{peers['metadata']['name']}"},
    ]
    pods = [f"{statefulset['metadata']['name']}-{index}" for index in range(statefulset["spec"]["replicas"])]
    assert [config.Settings(advertise_host=f"{pod}.sc-peers").advertise_host for pod in pods] == ["sc-0.sc-peers", "sc-1.sc-peers"]


def test_kubernetes_spus_are_told_every_sc_pods_private_address() -> None:
    """sc.yaml's SPU command line lists each SC pod's private address, so an SPU finds the leader."""
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    text = (files.KUBERNETES_DIR / "sc.yaml").read_text()
    [listed] = re.findall(r"--sc-private=(\S+)", text)
    private = sc_settings_toml()["private_port"]
    replicas = statefulset["spec"]["replicas"]
    assert listed == ",".join(f"sc-{index}.{statefulset['spec']['serviceName']}:{private}" for index in range(replicas))


def test_sc_disruption_budget_keeps_one_sc() -> None:
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    budget = files.kubernetes_object("PodDisruptionBudget", "sc")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels(statefulset)}}
    assert statefulset["spec"]["replicas"] - budget["spec"]["maxUnavailable"] >= 1


def test_the_scs_whose_spus_run_elsewhere_accept_them() -> None:
    """Without a token the SC accepts SPUs from its own host only; Compose's SPUs run in other
    containers and Kubernetes' in other pods, so those SCs must say they accept remote SPUs."""
    composed = [
        config.Settings(**{
            name.removeprefix("SC_").lower(): value
            for name, value in files.compose()["services"][sc]["environment"].items()
            if name == "SC_SPU_ALLOW_REMOTE_WITHOUT_TOKEN"
        })
        for sc in COMPOSE_SCS
    ]
    kubernetes = config.Settings(**sc_settings_toml())
    for settings in (*composed, kubernetes):
        assert settings.spu_token_file is not None or settings.spu_allow_remote_without_token


def test_the_scs_that_serve_other_hosts_ask_for_credentials_or_say_they_do_not() -> None:
    """Without a credential the SC serves its public port on loopback only; Compose's spu-init, the
    Kubernetes Service and probes, and systemd's clients on other hosts must reach it."""
    composed = [
        config.Settings(**{
            name.removeprefix("SC_").lower(): value
            for name, value in files.compose()["services"][sc]["environment"].items()
            if name.startswith(("SC_PUBLIC_", "SC_AUTH_"))
        })
        for sc in COMPOSE_SCS
    ]
    kubernetes = config.Settings(**sc_settings_toml())
    systemd = config.Settings(**tomllib.loads(files.SYSTEMD_CONFIG.read_text()))
    for settings in (*composed, kubernetes, systemd):
        assert settings.has_credentials or settings.public_bind_without_auth
    # Kubernetes: the tokens file is the Secret sc-auth, mounted where the config names it.
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    [mount] = [m for m in files.container(statefulset, "sc")["volumeMounts"] if m["name"] == "auth"]
    assert kubernetes.auth_tokens is not None and str(kubernetes.auth_tokens.parent) == mount["mountPath"]
    [volume] = [v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == "auth"]
    assert volume["secret"]["secretName"] == "sc-auth"


def test_every_pod_runs_non_root_read_only_and_bounded() -> None:
    uid, gid = dockerfile_user()
    for kind, name in (("StatefulSet", "sc"), ("StatefulSet", "etcd")):
        pod = files.kubernetes_object(kind, name)["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        if name == "sc":
            assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid)
        for container in pod["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, name
            assert set(container["resources"]) == {"requests", "limits"}, name
            assert set(container["resources"]["requests"]) == set(container["resources"]["limits"]) == {"cpu", "memory"}


def test_sc_writes_only_to_its_volumes() -> None:
    """With a read-only root file system, the history must be on a writable mounted volume: each
    pod's own claim (one SC records into a history directory at a time)."""
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    sc = files.container(statefulset, "sc")
    settings = sc_settings_toml()
    writable = [m["mountPath"] for m in sc["volumeMounts"] if not m.get("readOnly")]
    assert [path for path in writable if settings["history_dir"].startswith(path + "/")] == ["/var/lib/sc"]
    [history] = [m for m in sc["volumeMounts"] if m["mountPath"] == "/var/lib/sc"]
    assert history["name"] not in {v["name"] for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == history["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_every_object_is_labelled_part_of_the_cluster() -> None:
    for _, document in files.kubernetes_documents():
        assert selects(PART_OF, document["metadata"]["labels"]), document["metadata"]["name"]


# ------------------------------------------------------------------------------------------- Compose


@functools.cache
def compose_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((DATA / "compose-spec.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_compose_file_matches_the_compose_spec() -> None:
    assert [error.message for error in compose_validator().iter_errors(files.compose())] == []


def test_compose_validation_rejects_a_misspelt_field() -> None:
    document = files.compose()
    document["services"]["sc-1"]["healthchek"] = document["services"]["sc-1"].pop("healthcheck")
    [error] = compose_validator().iter_errors(document)
    assert list(error.absolute_path) == ["services", "sc-1"]
    assert "'healthchek' was unexpected" in error.message


def test_compose_vendored_schema_is_the_recorded_one() -> None:
    """tests/data/README.md names where the schema comes from and its sha256."""
    digest = hashlib.sha256((DATA / "compose-spec.json").read_bytes()).hexdigest()
    assert digest in (DATA / "README.md").read_text()


COMPOSE_SCS = ["sc-0", "sc-1"]


def test_compose_services_and_their_order() -> None:
    services = files.compose()["services"]
    assert list(services) == ["etcd-0", "etcd-1", "etcd-2", *COMPOSE_SCS, "spu-init", "spu-0", "spu-1", "spu-2"]
    healthy = {"condition": "service_healthy"}
    for name in COMPOSE_SCS:
        assert services[name]["depends_on"] == {"etcd-0": healthy, "etcd-1": healthy, "etcd-2": healthy}
    # Both SCs settled: sc-0 (which spu-init calls) leads, or redirects to sc-1, which does.
    assert services["spu-init"]["depends_on"] == dict.fromkeys(COMPOSE_SCS, healthy)
    for name in ("spu-0", "spu-1", "spu-2"):
        assert services[name]["depends_on"] == {"spu-init": {"condition": "service_completed_successfully"}}
    # Every long-running service has a health check; the one-shot registration does not restart.
    assert sorted(name for name, service in services.items() if "healthcheck" in service) == sorted(set(services) - {"spu-init"})
    assert services["spu-init"]["restart"] == "no"


def test_compose_scs_differ_only_by_name_advertised_host_ports_volume_and_build() -> None:
    services = files.compose()["services"]
    own = ("build", "ports", "volumes", "environment")

    def shared(name: str) -> dict[str, Any]:
        service = services[name]
        environment = {key: value for key, value in service["environment"].items() if key != "SC_ADVERTISE_HOST"}
        return {**{key: value for key, value in service.items() if key not in own}, "environment": environment}

    assert shared("sc-1") == shared("sc-0")
    # Each advertises its service name: its address on the Compose network, valid as the setting.
    for name in COMPOSE_SCS:
        assert services[name]["environment"]["SC_ADVERTISE_HOST"] == name
        assert config.Settings(advertise_host=name).advertise_host == name
    # Each publishes both ports on the host's loopback, on host ports of its own; sc-0 where one SC was.
    published = {name: [port.rsplit(":", 2) for port in services[name]["ports"]] for name in COMPOSE_SCS}
    assert published == {
        "sc-0": [["127.0.0.1", "9003", "9003"], ["127.0.0.1", "9004", "9004"]],
        "sc-1": [["127.0.0.1", "9103", "9003"], ["127.0.0.1", "9104", "9004"]],
    }
    # Each its own history volume, a named one.
    assert {name: services[name]["volumes"] for name in COMPOSE_SCS} == {name: [f"{name}:/var/lib/sc"] for name in COMPOSE_SCS}
    assert [name for name in COMPOSE_SCS if "build" in services[name]] == ["sc-0"]


def test_compose_etcd_members_form_one_cluster() -> None:
    services = files.compose()["services"]
    members = ["etcd-0", "etcd-1", "etcd-2"]
    expected_cluster = ",".join(f"{m}=http://{m}:2380" for m in members)
    for name in members:
        etcd = services[name]
        assert etcd["image"] == files.kubernetes_object("StatefulSet", "etcd")["spec"]["template"]["spec"]["containers"][0]["image"]
        assert etcd["environment"]["ETCD_INITIAL_CLUSTER"] == expected_cluster
        command = etcd["command"]
        assert command[0] == "etcd"
        assert files.flag_value(command, "--name") == name
        assert files.flag_value(command, "--initial-advertise-peer-urls") == f"http://{name}:2380"
        assert files.flag_value(command, "--advertise-client-urls") == f"http://{name}:2379"
        assert etcd["volumes"] == [f"{name}:{etcd['environment']['ETCD_DATA_DIR'].rsplit('/', 1)[0]}"]
    # Every SC on the same cluster and key prefix (one store, one candidates' queue).
    for sc in COMPOSE_SCS:
        assert files.flag_value(services[sc]["command"], "--etcd-endpoints") == ",".join(f"http://{m}:2379" for m in members)
        assert services[sc]["environment"]["SC_KEY_PREFIX"] == "/sc/"


def test_compose_sc_image_and_build() -> None:
    services = files.compose()["services"]
    build = services["sc-0"]["build"]
    context = (files.COMPOSE_FILE.parent / build["context"]).resolve()
    assert context == files.REPO
    assert (context / build["dockerfile"]).resolve() == files.DOCKERFILE
    # One image, built by `sc-0`, run by the other SC, the registration and the SPUs too (Compose does not pull it).
    assert {name: s["image"] for name, s in services.items() if not name.startswith("etcd")} == dict.fromkeys(
        [*COMPOSE_SCS, "spu-init", "spu-0", "spu-1", "spu-2"], IMAGE
    )
    assert [name for name, s in services.items() if "build" in s] == ["sc-0"]


def test_compose_sc_history_is_on_its_named_volume() -> None:
    """The SC's root file system is read-only: --history-dir must be under a named volume's mount,
    which survives the container (`docker compose down` without -v keeps it)."""
    document = files.compose()
    for name in COMPOSE_SCS:
        sc = document["services"][name]
        assert sc["read_only"] is True
        history_dir = files.flag_value(sc["command"], "--history-dir")
        mounts = dict(reversed(volume.split(":", 1)) for volume in sc["volumes"])
        [volume] = [volume for path, volume in mounts.items() if history_dir.startswith(path.rstrip("/") + "/")]
        assert volume in document["volumes"]  # named, not a bind mount or an anonymous volume
        assert (history_dir, volume) == ("/var/lib/sc/history", name)
    # The image's user owns the volume's mount point (a new named volume takes its ownership).
    assert files.image_workdir() == "/var/lib/sc"


def test_compose_spus_differ_only_by_id_and_volume() -> None:
    services = files.compose()["services"]
    commands = [services[f"spu-{i}"]["command"] for i in range(3)]
    assert [files.flag_value(command, "--id") for command in commands] == ["0", "1", "2"]
    assert [files.replace_flag(command, "--id", "N") for command in commands] == [files.replace_flag(commands[0], "--id", "N")] * 3
    assert [services[f"spu-{i}"]["volumes"] for i in range(3)] == [[f"spu-{i}:/var/lib/sc"] for i in range(3)]


def test_compose_spus_are_told_every_scs_private_address() -> None:
    """An SPU tries each in turn; a standby refuses it naming the leader, which it then joins."""
    services = files.compose()["services"]
    private = [f"{sc}:{files.flag_value(services[sc]['command'], '--private-port')}" for sc in COMPOSE_SCS]
    assert private == ["sc-0:9004", "sc-1:9004"]
    for index in range(3):
        assert files.flag_value(services[f"spu-{index}"]["command"], "--sc-private") == ",".join(private)


def test_compose_spus_are_registered_where_they_listen() -> None:
    """spu-init registers each SPU at its service's name and the port its health check probes."""
    services = files.compose()["services"]
    [script] = services["spu-init"]["command"]
    assert services["spu-init"]["entrypoint"] == ["/bin/sh", "-c"]
    assert 'for id in 0 1 2; do' in script
    assert '--id "$$id" --name "spu-$$id" --public-server "spu-$$id:9005" --private-server "spu-$$id:9006"' in script
    for index in range(3):
        spu = services[f"spu-{index}"]
        assert "('127.0.0.1', 9006)" in spu["healthcheck"]["test"][-1]
        assert files.flag_value(spu["command"], "--listen-host") == "0.0.0.0"


def test_compose_strings_escape_their_dollars() -> None:
    """A `$` meant for the shell must be `$$`, or Compose substitutes a host variable (often empty)."""
    strings = files.compose_strings(files.compose())
    assert any("$$" in text for text in strings)  # the registration script's
    for text in strings:
        files.unescape_compose(text)


# ----------------------------------------------------------------------------------------- Dockerfile


def dockerfile_user() -> tuple[int, int]:
    user = files.only(files.final_stage(), "USER").arguments
    match = re.fullmatch(r"(\d+):(\d+)", user)
    assert match, f"USER {user}: give numeric uid:gid, so Kubernetes can check runAsNonRoot"
    return int(match[1]), int(match[2])


def test_dockerfile_runs_sc_as_a_non_root_user_it_creates() -> None:
    stage = files.final_stage()
    uid, gid = dockerfile_user()
    assert uid != 0 and gid != 0
    creates = " ".join(i.arguments for i in stage if i.keyword == "RUN")
    assert f"groupadd --system --gid {gid} sc" in creates
    assert f"useradd --system --uid {uid} --gid {gid} --home-dir {files.image_workdir()} --create-home" in creates
    # `sc` is the project's console script, found on the PATH at the venv the build stage filled.
    assert files.image_entrypoint() == ["sc"]
    assert files.pyproject()["project"]["scripts"]["sc"] == "controller.cli.main:console"
    assert files.image_cmd() == ["run"]
    assert files.image_env(base_path="/usr/local/bin")["PATH"] == "/opt/sc/bin:/usr/local/bin"
    assert files.image_env(base_path="")["PYTHONUNBUFFERED"] == "1"  # log lines leave as written
    assert [i.arguments for i in stage if i.keyword == "COPY"] == ["--from=build /opt/sc /opt/sc"]
    assert files.only(stage, "EXPOSE").arguments.split() == [
        str(config.Settings.model_fields["public_port"].default),
        str(config.Settings.model_fields["private_port"].default),
    ]


def test_dockerfile_base_is_a_slim_python_the_project_supports() -> None:
    stages = files.dockerfile_stages()
    bases = [stage[0].arguments.split()[0] for stage in stages]
    assert bases == ["python:3.11-slim", "python:3.11-slim"]
    version = bases[0].split(":")[1].removesuffix("-slim")
    assert SpecifierSet(files.pyproject()["project"]["requires-python"]).contains(version + ".0")


def test_dockerfile_installs_the_project_as_pyproject_declares_it() -> None:
    """The build stage copies what `pip install .` reads (pyproject, its readme, every package it
    includes) and installs it into the venv the final stage copies; the .dockerignore lets them in."""
    build = files.dockerfile_stages()[0]
    project = files.pyproject()
    packages = sorted(p.removesuffix("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"])
    assert packages == sorted(path.parent.name for path in files.REPO.glob("*/__init__.py") if path.parent.name != "tests")
    copied = [i.arguments.split()[:-1] for i in build if i.keyword == "COPY"]
    sources = sorted(source.rstrip("/") for words in copied for source in words)
    assert sources == sorted(["pyproject.toml", project["project"]["readme"], *packages])
    assert [i.arguments for i in build if i.keyword == "RUN"] == ["python -m venv /opt/sc", "/opt/sc/bin/pip install ."]
    assert [i.arguments for i in build if i.keyword == "WORKDIR"] == ["/src"]
    ignore = [line for line in (files.DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*"
    assert sorted(line.removeprefix("!") for line in ignore if line.startswith("!")) == sources


# ------------------------------------------------------------------------------------------- systemd


def test_systemd_unit_restarts_on_failure_hardened() -> None:
    unit = files.systemd_unit()
    service = unit["Service"]
    assert {key: service[key] for key in ("Type", "User", "Restart", "RestartSec", "KillSignal", "TimeoutStopSec")} == {
        "Type": ["simple"],
        "User": ["sc"],
        "Restart": ["on-failure"],
        "RestartSec": ["2"],
        "KillSignal": ["SIGTERM"],
        "TimeoutStopSec": ["30"],
    }
    for setting in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices", "RestrictSUIDSGID", "MemoryDenyWriteExecute"):
        assert service[setting] == ["true"], setting
    assert service["ProtectSystem"] == ["strict"]
    assert service["CapabilityBoundingSet"] == [""]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    config.Settings(**tomllib.loads(files.SYSTEMD_CONFIG.read_text()))  # the example config is valid


def test_systemd_history_is_in_the_state_directory() -> None:
    """ProtectSystem=strict leaves the file system read-only but for the unit's StateDirectory
    (/var/lib/<name>, created and owned by User=): the history must be under it."""
    service = files.systemd_unit()["Service"]
    settings = tomllib.loads(files.SYSTEMD_CONFIG.read_text())
    [state] = service["StateDirectory"]
    history_dir = Path(settings["history_dir"])
    assert history_dir.parent == Path("/var/lib") / state == Path(service["WorkingDirectory"][0])
    assert "ReadOnlyPaths" not in service and "InaccessiblePaths" not in service
    # The SC runs against an external etcd there: without history_dir it would record no history.
    assert settings["etcd_endpoints"] and "data_dir" not in settings


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    """systemd's own check of the unit (unknown keys, bad values), with ExecStart at a binary that exists here."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "sc.service"
    unit.write_text(files.SYSTEMD_UNIT.read_text().replace("/opt/sc/bin/sc", shutil.which("true") or "/bin/true"))
    checked = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=30)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


def test_sc_environment_variables_are_settings() -> None:
    """The SC ignores an SC_* variable that is no setting, so a misspelt one would pass unnoticed."""
    services = files.compose()["services"]
    statefulset = files.kubernetes_object("StatefulSet", "sc")
    composed = [[*services[sc]["environment"]] for sc in COMPOSE_SCS]
    deployed = [variable["name"] for variable in files.container(statefulset, "sc").get("env", [])]
    expected = ["SC_KEY_PREFIX", "SC_LOG_FORMAT", "SC_SPU_ALLOW_REMOTE_WITHOUT_TOKEN", "SC_PUBLIC_BIND_WITHOUT_AUTH", "SC_ADVERTISE_HOST"]
    assert composed == [expected, expected]
    # POD_NAME is the kubelet's, for SC_ADVERTISE_HOST to use.
    assert deployed == ["POD_NAME", "SC_ADVERTISE_HOST"]
    for variable in [*expected, *deployed[1:]]:
        assert variable.removeprefix("SC_").lower() in config.Settings.model_fields, variable
    # The others' SC_ADDR is the admin commands' address of an SC, which they reach by its service
    # name: sc-0, which redirects writes to the leader when it is the standby (`sc` follows).
    assert services["spu-init"]["environment"] == {"SC_ADDR": "http://sc-0:9003"}
