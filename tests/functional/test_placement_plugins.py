"""Placement plug-ins on a whole daemon: only the operator's configuration loads code, a spec only
names what is configured, and a stored topic naming anything else is InvalidConfig, never imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from controller import config
from store import embedded_etcd, etcd, models
from tests.fixtures import daemon as daemon_fixtures
from tests.fixtures.daemon import Running

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = "computed, kafka, least-loaded, multi-level, policies, manual"
CONFIGURE = "sc run --placement-plugin NAME=module:Class"
OPERATOR = f"plug-ins are configured by the operator ({CONFIGURE})"


def names_a_module(strategy: str, configured: str = "none") -> str:
    return (
        f"placement strategy {strategy!r} names a module: a topic names a built-in strategy ({BUILT_IN}) or a "
        f"placement plug-in configured on this SC, by its name (configured: {configured}); the SC imports only "
        f"the plug-ins its operator configures ({CONFIGURE})"
    )


def not_configured(strategy: str, configured: str = "none") -> str:
    return (
        f"placement strategy {strategy!r} is neither built in ({BUILT_IN}) nor a placement plug-in configured "
        f"on this SC (configured: {configured}); {OPERATOR}"
    )


def topic_body(name: str, partitions: int, replication_factor: int, **spec: Any) -> dict[str, Any]:
    return {"name": name, "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec}}


def stored_topic(name: str, strategy: str) -> models.Topic:
    """A topic as someone could write it straight into the store, bypassing the API's checks."""
    return models.Topic.model_validate(topic_body(name, 2, 1, placement={"strategy": strategy}))


async def test_a_spec_naming_a_module_is_refused_and_the_daemon_lives(sc: Running) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    refused = {"error": {"code": "InvalidConfig", "message": names_a_module("os:abort")}}
    body = topic_body("doom", 1, 1, placement={"strategy": "os:abort"})
    assert await sc.call("POST", "/v1/topics", body) == (422, refused)
    assert await sc.call("POST", "/v1/topics?dryRun=true", body) == (422, refused)
    assert await sc.read("topics", "doom") is None
    request = {"partitions": 1, "replicationFactor": 1, "strategy": "os:abort"}
    assert await sc.call("POST", "/v1/placement", request) == (422, refused)
    plugin_field = {"partitions": 1, "replicationFactor": 1, "plugin": "os:abort"}
    assert await sc.call("POST", "/v1/placement", plugin_field) == (
        422,
        {
            "error": {
                "code": "InvalidConfig",
                "message": f"placement plug-in 'os:abort' is not configured on this SC (configured: none); {OPERATOR}",
            }
        },
    )
    # A well-formed name that nobody configured is refused the same way, before anything is written.
    status, answer = await sc.call("POST", "/v1/topics", topic_body("later", 1, 1, placement={"strategy": "my-placer"}))
    assert (status, answer) == (422, {"error": {"code": "InvalidConfig", "message": not_configured("my-placer")}})
    assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})
    assert await sc.read_all("topics") == {}


async def test_a_topic_written_straight_into_the_store_naming_a_module_is_invalid_config(
    sc: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    never_imported = "tests.unit.placement.never_imported"
    monkeypatch.delitem(sys.modules, never_imported, raising=False)
    for name, strategy in (("doom", "os:abort"), ("later", "my-placer"), ("sneaky", f"{never_imported}:Placer")):
        topic = stored_topic(name, strategy)
        await sc.kv_store.create(topic.key, models.encode(topic))

    async def both_invalid() -> None:
        doom, later = await sc.read("topics", "doom"), await sc.read("topics", "later")
        assert doom is not None and later is not None
        assert (doom.status.resolution, doom.status.reason) == (
            models.TopicResolution.INVALID_CONFIG,
            names_a_module("os:abort") + "; delete the topic and create it again with a valid spec",
        )
        assert (later.status.resolution, later.status.reason) == (
            models.TopicResolution.INVALID_CONFIG,
            not_configured("my-placer")
            + "; the topic is placed once the SC runs with that plug-in configured and working, or delete it and create "
            "it again with another strategy",
        )

    async def sneaky_invalid() -> None:
        sneaky = await sc.read("topics", "sneaky")
        assert sneaky is not None and sneaky.status.resolution is models.TopicResolution.INVALID_CONFIG

    await sc.eventually(both_invalid)
    await sc.eventually(sneaky_invalid)
    assert never_imported not in sys.modules  # named by a stored spec, and never imported
    assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})
    assert await sc.partitions_of("doom") == {}


@pytest.mark.etcd
async def test_a_stored_module_reference_comes_up_invalid_after_a_restart_and_a_configured_name_places(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    """Topics written to etcd before the SC starts (as a version that imported module:Class could
    have stored them): the SC starts, imports nothing, and marks the module reference InvalidConfig;
    once the operator configures a plug-in under the name the other topic gives, it is placed."""
    settings = daemon_fixtures.etcd_settings(etcd_server)
    own_store = await etcd.EtcdStore.open(settings.etcd_endpoints, settings.key_prefix, daemon_fixtures.REQUEST_TIMEOUT)
    try:
        for topic in (stored_topic("doom", "os:abort"), stored_topic("later", "highest-first")):
            await own_store.create(topic.key, models.encode(topic))
    finally:
        await own_store.close()
    async with daemon_fixtures.running(settings) as sc:
        for spu_id in range(3):
            await sc.register_spu(spu_id)

        async def invalid(name: str, reason: str) -> None:
            topic = await sc.read("topics", name)
            assert topic is not None
            assert (topic.status.resolution, topic.status.reason) == (models.TopicResolution.INVALID_CONFIG, reason)

        doom_reason = names_a_module("os:abort") + "; delete the topic and create it again with a valid spec"
        await sc.eventually(lambda: invalid("doom", doom_reason))
        await sc.eventually(
            lambda: invalid(
                "later",
                not_configured("highest-first")
                + "; the topic is placed once the SC runs with that plug-in configured and working, or delete it and create "
                "it again with another strategy",
            )
        )
    with_plugin = settings.model_copy(update={"placement_plugins": {"highest-first": "tests.placement_plugins:HighestFirst"}})
    async with daemon_fixtures.running(with_plugin) as sc:

        async def placed_by_the_plugin() -> None:
            topic = await sc.read("topics", "later")
            assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED
            assert topic.status.replica_map == {0: [2], 1: [2]}
            assert await sc.partitions_of("later") == {0: [2], 1: [2]}

        await sc.eventually(placed_by_the_plugin)
        configured = names_a_module("os:abort", "highest-first")
        await sc.eventually(lambda: invalid("doom", configured + "; delete the topic and create it again with a valid spec"))


async def test_a_configured_plugin_places_topics_dry_runs_and_placement_requests() -> None:
    settings = config.Settings(
        store=config.StoreKind.MEMORY,
        placement_plugins={"highest-first": "tests.placement_plugins:HighestFirst", "defers": "tests.placement_plugins:Defers"},
        **daemon_fixtures.COMMON_SETTINGS,
    )
    async with daemon_fixtures.running(settings) as sc:
        for spu_id in range(4):
            await sc.register_spu(spu_id)
        body = topic_body("top", 3, 2, placement={"strategy": "highest-first"})
        status, predicted = await sc.call("POST", "/v1/topics?dryRun=true", body)
        assert (status, predicted["replicaMap"]) == (200, [[3, 2], [3, 2], [3, 2]])
        status, created = await sc.call("POST", "/v1/topics", body)
        assert (status, created["status"]["replicaMap"]) == (201, {"0": [3, 2], "1": [3, 2], "2": [3, 2]})

        async def partitions_created() -> None:
            assert await sc.partitions_of("top") == {0: [3, 2], 1: [3, 2], 2: [3, 2]}

        await sc.eventually(partitions_created)
        # A plug-in that defers leaves the placement to the computed strategy.
        status, deferred = await sc.call("POST", "/v1/topics", topic_body("plain", 2, 2, placement={"strategy": "defers"}))
        assert status == 201
        status, computed = await sc.call("POST", "/v1/placement", {"partitions": 2, "replicationFactor": 2, "startIndex": 3})
        assert deferred["status"]["replicaMap"] == {str(index): row for index, row in enumerate(computed["replicaMap"])}
        status, answer = await sc.call("POST", "/v1/placement", {"partitions": 1, "replicationFactor": 3, "strategy": "highest-first"})
        assert (status, answer["replicaMap"]) == (200, [[3, 2, 1]])
        status, answer = await sc.call("POST", "/v1/topics", topic_body("nope", 1, 1, placement={"strategy": "other"}))
        assert (status, answer["error"]["message"]) == (422, not_configured("other", "defers, highest-first"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--placement-plugin", "broken=tests.placement_plugins:BrokenAtStart"],
            "error: placement plug-in 'broken' (tests.placement_plugins:BrokenAtStart) could not be created: "
            "RuntimeError: no licence file",
        ),
        (
            ["--placement-plugin", "gone=tests.no_such_module:Placer"],
            "error: placement plug-in 'gone' (tests.no_such_module:Placer): cannot import 'tests.no_such_module': "
            "No module named 'tests.no_such_module'",
        ),
    ],
)
def test_sc_run_stops_with_status_2_when_a_plugin_cannot_be_loaded(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    command = [
        sys.executable, "-m", "controller.cli", "run", "--store", "memory", "--bind-host", "127.0.0.1",
        "--public-port", "0", "--private-port", "0", "--data-dir", str(tmp_path / f"data-{uuid.uuid4().hex}"),
        "--log-format", "json", *flags,
    ]  # fmt: skip
    finished = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=60)
    assert finished.returncode == 2, finished
    assert finished.stderr.decode().splitlines()[-1:] == [message]
