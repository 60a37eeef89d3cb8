"""The admin CLI against a real API server on 127.0.0.1: tables, JSON output, errors and exit codes.

The CLI is synchronous (urllib), so it runs in a thread while the server runs on the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import pytest

from controller import config
from controller.api import client as api_client
from controller.cli import main as cli
from store import active_sc, models
from tests import builders
from tests.unit import api_server
from tests.builders import partition, topic
from tests.unit.api_server import server, spu  # noqa: F401 (server is a fixture)


class Sc:
    def __init__(self, server: api_server.ApiServer, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    async def __call__(self, *argv: str, address: bool = True) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of ``sc ARGV --sc <server>``."""
        arguments = [*argv, "--sc", self.server.url] if address else list(argv)
        self.capsys.readouterr()
        try:
            code = await asyncio.to_thread(cli.main, arguments)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def sc(server: api_server.ApiServer, capsys: pytest.CaptureFixture[str]) -> Sc:
    return Sc(server, capsys)


PROVISIONED: dict[str, Any] = {"resolution": "Provisioned", "replicaMap": {"0": [0, 1], "1": [1, 2], "2": [2, 0]}}


# ---------------------------------------------------------------------------- topics


async def test_topic_create_prints_the_topic_as_a_table(server: api_server.ApiServer, sc: Sc) -> None:
    deciding = server.decide_later("topics", "orders", PROVISIONED)
    result = await sc("topic", "create", "orders", "--partitions", "3", "--replication-factor", "2")
    await deciding
    assert result == (
        0,
        "NAME    RESOLUTION   PARTITIONS  REPLICATION  REASON\n"
        "orders  Provisioned  3           2            -\n",
        "",
    )


async def test_topic_create_as_json_with_policies(server: api_server.ApiServer, sc: Sc) -> None:
    deciding = server.decide_later("topics", "orders", PROVISIONED)
    code, out, err = await sc(
        "topic", "create", "orders", "-p", "3", "-r", "2", "--ignore-rack-assignment",
        "--placement-policies", "node=balanced;preferred_nodes=1", "-o", "json",
    )  # fmt: skip
    await deciding
    stored = await server.read("topics", "orders")
    assert stored is not None
    assert (code, json.loads(out), err) == (0, stored.to_json_dict(), "")
    assert stored.to_json_dict()["spec"] == {
        "partitions": 3,
        "replicationFactor": 2,
        "ignoreRackAssignment": True,
        "placement": {"strategy": "policies", "policies": "node=balanced;preferred_nodes=1"},
    }


async def test_topic_create_waiting_for_spus_is_a_failure_that_keeps_the_topic(server: api_server.ApiServer, sc: Sc) -> None:
    reason = "replication factor 2 needs 2 online SPUs, none is online: 2 more needed"
    deciding = server.decide_later("topics", "orders", {"resolution": "InsufficientResources", "reason": reason})
    code, out, err = await sc("topic", "create", "orders", "-p", "3", "-r", "2")
    await deciding
    assert code == 1
    assert out.splitlines()[1].split(None, 4) == ["orders", "InsufficientResources", "3", "2", reason]
    assert err == (
        f"error: topic 'orders' is not provisioned: {reason}; it was kept and will be provisioned once enough SPUs "
        "are online (or delete it: sc topic delete orders)\n"
    )
    assert await server.read("topics", "orders") is not None


async def test_topic_create_left_pending_names_the_reason_the_sc_gave(server: api_server.ApiServer, sc: Sc) -> None:
    """A topic the SC has not finished with, though it says why (etcd refusing its writes): the
    failure names that reason, not only the resolution (before, the operator had to list the
    topics to learn it)."""
    reason = "the store refused to provision it (retried with a backoff): etcd takes at most 128 operations"
    deciding = server.decide_later("topics", "orders", {"resolution": "Pending", "reason": reason})
    code, _, err = await sc("topic", "create", "orders", "-p", "3", "-r", "1")
    await deciding
    assert code == 1
    assert err == (
        f"error: topic 'orders' was written but the SC has not finished with it yet (resolution Pending: {reason}); "
        "check it with `sc topic list`\n"
    )


async def test_topic_create_errors_exit_1(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(topic("orders"))
    assert await sc("topic", "create", "orders", "-p", "1", "-r", "1") == (
        1,
        "",
        "error: topic 'orders' already exists\n",
    )
    assert await sc("topic", "create", "other", "-p", "0", "-r", "1") == (
        1,
        "",
        "error: spec.partitions: Input should be greater than or equal to 1 (got 0)\n",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-r", "1"], "a computed topic needs --partitions (or give --replica-assignment FILE)"),
        ([], "a computed topic needs --partitions and --replication-factor (or give --replica-assignment FILE)"),
        (
            ["--replica-assignment", "a.json", "-p", "2", "--placement-strategy", "kafka"],
            "--replica-assignment cannot be combined with --partitions, --placement-strategy",
        ),
        (
            ["-p", "1", "-r", "1", "--validate-only"],
            "--validate-only checks a --replica-assignment file; use --dry-run for a computed topic",
        ),
        (["-p", "x", "-r", "1"], "argument -p/--partitions: 'x' is not a whole number"),
    ],
)
async def test_topic_create_usage_errors_exit_2(sc: Sc, argv: list[str], message: str) -> None:
    code, out, err = await sc("topic", "create", "t", *argv)
    assert (code, out) == (2, "")
    assert err.endswith(f"sc topic create: error: {message}\n")


async def test_dry_run_prints_the_placement_and_creates_nothing(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(spu(0), spu(1), spu(2))
    assert await sc("topic", "create", "orders", "-p", "3", "-r", "2", "--dry-run") == (
        0,
        "PARTITION  REPLICAS\n0          [0, 1]\n1          [1, 2]\n2          [2, 0]\nnext start index: 3\n",
        "",
    )
    assert await server.read("topics", "orders") is None


async def test_dry_run_names_the_partitions_with_rack_violations(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(*(spu(spu_id, rack=rack) for spu_id, rack in enumerate(["r1", "r1", "r1", "r2"])))
    assert await sc("topic", "create", "orders", "-p", "3", "-r", "3", "--dry-run") == (
        0,
        "PARTITION  REPLICAS\n0          [0, 3, 1]\n1          [3, 1, 2]\n2          [1, 2, 0]\nnext start index: 3\n"
        "rack violations: partition 2 (replicas in fewer racks than they could be)\n",
        "",
    )


async def test_validate_only_checks_an_assignment_file(
    server: api_server.ApiServer, sc: Sc, tmp_path: pathlib.Path
) -> None:
    await server.put(spu(0), spu(1))
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"id": 0, "replicas": [1, 0]}, {"id": 1, "replicas": [0, 1]}]))
    assert await sc("topic", "create", "m", "--replica-assignment", str(good), "--validate-only") == (
        0,
        f"replica assignment {good} is valid for topic 'm'\n"
        "PARTITION  REPLICAS\n0          [1, 0]\n1          [0, 1]\nnext start index: 0\n",
        "",
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"replicaAssignment": [{"id": 0, "replicas": [0, 7]}]}))
    code, out, err = await sc("topic", "create", "m", "--replica-assignment", str(bad), "--validate-only")
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and "7" in err
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    assert await sc("topic", "create", "m", "--replica-assignment", str(broken)) == (
        1,
        "",
        f"error: replica assignment file {str(broken)!r} is not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 3 (char 2)\n",
    )
    assert await sc("topic", "create", "m", "--replica-assignment", str(tmp_path / "none.json")) == (
        1,
        "",
        f"error: cannot read the replica assignment file {str(tmp_path / 'none.json')!r}: No such file or directory\n",
    )
    assert await server.read("topics", "m") is None


async def test_topic_list_describe_and_json(server: api_server.ApiServer, sc: Sc) -> None:
    manual = models.Topic.model_validate(
        {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}, {"id": 1, "replicas": [1]}]}}
    )
    provisioned = topic("orders", 3, 2, resolution="Provisioned", replica_map=PROVISIONED["replicaMap"])
    await server.put(provisioned, manual, topic("waiting", 2, 3, resolution="InsufficientResources", reason="2 more needed"))
    assert await sc("topic", "list") == (
        0,
        "NAME     RESOLUTION             PARTITIONS  REPLICATION   REASON\n"
        "manual   Init                   2           1/2 (manual)  -\n"
        "orders   Provisioned            3           2             -\n"
        "waiting  InsufficientResources  2           3             2 more needed\n",
        "",
    )
    code, out, _ = await sc("topic", "list", "-o", "json")
    assert (code, [obj["name"] for obj in json.loads(out)]) == (0, ["manual", "orders", "waiting"])
    assert await sc("topic", "describe", "orders") == (
        0,
        "Name:        orders\n"
        "Resolution:  Provisioned\n"
        "Partitions:  3\n"
        "Replication: 2\n"
        "Rack-aware:  yes\n"
        "Strategy:    computed\n"
        "Reason:      -\n"
        "Partitions:\n"
        "  PARTITION  LEADER  REPLICAS  ISR  LAG  RESOLUTION\n"
        "  0          0       [0, 1]    -    -    -\n"
        "  1          1       [1, 2]    -    -    -\n"
        "  2          2       [2, 0]    -    -    -\n",
        "",
    )
    code, out, _ = await sc("topic", "describe", "orders", "-o", "json")
    assert (code, json.loads(out)) == (0, provisioned.to_json_dict())
    assert await sc("topic", "describe", "nope") == (1, "", "error: topic 'nope' not found\n")


async def test_topic_delete_and_add_partitions(server: api_server.ApiServer, sc: Sc) -> None:
    provisioned = topic("orders", 3, 2, resolution="Provisioned", replica_map=PROVISIONED["replicaMap"])
    await server.put(provisioned, topic("other"))
    deciding = server.decide_later(
        "topics", "orders", {**PROVISIONED, "replicaMap": {**PROVISIONED["replicaMap"], "3": [0, 2]}}, after=provisioned
    )
    code, out, err = await sc("topic", "add-partitions", "orders")
    await deciding
    assert (code, out.splitlines()[1].split(), err) == (0, ["orders", "Provisioned", "4", "2", "-"], "")
    assert await sc("topic", "add-partitions", "nope", "--count", "2") == (1, "", "error: topic 'nope' not found\n")
    assert await sc("topic", "delete", "orders") == (0, "topic 'orders' deleted\n", "")
    assert await server.read("topics", "orders") is None
    code, out, _ = await sc("topic", "delete", "other", "-o", "json")
    assert (code, json.loads(out)) == (0, {"deleted": topic("other").to_json_dict(), "warnings": []})
    assert await sc("topic", "delete", "orders") == (1, "", "error: topic 'orders' not found\n")


# ---------------------------------------------------------------------------- SPUs and groups


async def test_spu_register_list_unregister(server: api_server.ApiServer, sc: Sc) -> None:
    assert await sc(
        "spu", "register", "--id", "5", "--name", "spu-5", "--public-server", "10.0.0.5:9005",
        "--private-server", "[::1]:9006", "--rack", "/dc1/r1",
    ) == (
        0,
        "ID  NAME   TYPE    RACK     RESOLUTION  DRAIN  DECOMMISSION  PUBLIC         PRIVATE\n"
        "5   spu-5  Custom  /dc1/r1  Init        -      -             10.0.0.5:9005  [::1]:9006\n",
        "",
    )  # fmt: skip
    assert await sc(
        "spu", "register", "--id", "5", "--name", "other", "--public-server", "h:1", "--private-server", "h:2"
    ) == (1, "", "error: SPU id 5 is already used by SPU 'spu-5'; choose another id\n")
    await server.put(spu(1, "spu-1"), partition("t-0", [5]))
    assert await sc("spu", "list") == (
        0,
        "ID  NAME   TYPE    RACK     RESOLUTION  DRAIN  DECOMMISSION  PUBLIC         PRIVATE\n"
        "1   spu-1  Custom  -        Online      -      -             10.0.0.1:9005  10.0.0.1:9006\n"
        "5   spu-5  Custom  /dc1/r1  Init        -      -             10.0.0.5:9005  [::1]:9006\n",
        "",
    )
    assert await sc("spu", "unregister", "--id", "5") == (
        0,
        "SPU 'spu-5' deleted\n",
        "warning: SPU 5 ('spu-5') still holds replicas of 1 partition: t-0; they stay assigned to id 5 until an SPU "
        "with that id is registered again or a rebalance moves them\n",
    )
    assert await sc("spu", "unregister", "spu-1") == (0, "SPU 'spu-1' deleted\n", "")
    assert await sc("spu", "unregister", "--id", "5") == (1, "", "error: no SPU has id 5\n")
    code, _, err = await sc("spu", "unregister")
    assert (code, err.splitlines()[-1]) == (
        2,
        "sc spu unregister: error: name the SPU to unregister: give its NAME or --id ID (one of them)",
    )


async def test_spu_set_rack_by_id_or_name(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(spu(1, "spu-1"))
    header = "ID  NAME   TYPE    RACK  RESOLUTION  DRAIN  DECOMMISSION  PUBLIC         PRIVATE\n"
    assert await sc("spu", "set-rack", "1", "--rack", "r2") == (
        0, header + "1   spu-1  Custom  r2    Online      -      -             10.0.0.1:9005  10.0.0.1:9006\n", ""
    )  # fmt: skip
    assert await sc("spu", "set-rack", "spu-1", "--no-rack") == (
        0, header + "1   spu-1  Custom  -     Online      -      -             10.0.0.1:9005  10.0.0.1:9006\n", ""
    )  # fmt: skip
    stored = await server.read("spus", "spu-1")
    assert stored is not None and stored.spec.rack is None
    assert await sc("spu", "set-rack", "7", "--rack", "r2") == (1, "", "error: no SPU has id 7\n")
    code, _, err = await sc("spu", "set-rack", "1")
    assert (code, err.splitlines()[-1]) == (2, "sc spu set-rack: error: one of the arguments --rack --no-rack is required")


async def test_spu_group_create_list_delete(server: api_server.ApiServer, sc: Sc) -> None:
    deciding = server.decide_later("spu-groups", "main", {"resolution": "Reserved"})
    assert await sc("spu-group", "create", "main", "--replicas", "3", "--min-id", "100", "--rack", "r1") == (
        0,
        "NAME  REPLICAS  MIN-ID  RACK  RESOLUTION  REASON\nmain  3         100     r1    Reserved    -\n",
        "",
    )
    await deciding
    reason = "id range 100..101 collides: SPU id 100 is already used by SPU main-0"
    deciding = server.decide_later("spu-groups", "clash", {"resolution": "Invalid", "reason": reason})
    assert await sc("spu-group", "create", "clash", "--replicas", "2", "--min-id", "100") == (
        1,
        "",
        f"error: SPU group 'clash' is Invalid: {reason}; it is kept, and reserves its range by itself once nothing collides: unregister the SPUs named, or delete the group and create it with another minId\n",
    )
    await deciding
    assert await sc("spu-group", "scale", "main", "--replicas", "5") == (
        0,
        "NAME  REPLICAS  MIN-ID  RACK  RESOLUTION  REASON\nmain  5         100     r1    Reserved    -\n",
        "",
    )
    assert await sc("spu-group", "scale", "nope", "--replicas", "5") == (1, "", "error: SPU group 'nope' not found\n")
    await server.put(spu(104, "main-4", spu_type="Managed"), partition("t-0", [104]))
    assert await sc("spu-group", "scale", "main", "--replicas", "4") == (
        0,
        "NAME  REPLICAS  MIN-ID  RACK  RESOLUTION  REASON\nmain  4         100     r1    Reserved    -\n",
        "warning: scaling SPU group 'main' down to 4 deletes SPU 104 ('main-4'), which still holds replicas of 1 "
        "partition: t-0; they stay assigned to id 104 until an SPU with that id is registered again or a rebalance moves them\n",
    )
    code, out, _ = await sc("spu-group", "scale", "main", "--replicas", "5", "-o", "json")
    assert (code, json.loads(out)["spec"]["replicas"], json.loads(out)["warnings"]) == (0, 5, [])
    code, out, _ = await sc("spu-group", "list", "-o", "json")
    assert (code, [group["status"]["resolution"] for group in json.loads(out)]) == (0, ["Invalid", "Reserved"])
    assert await sc("spu-group", "delete", "clash") == (0, "SPU group 'clash' deleted\n", "")
    assert await sc("spu-group", "list") == (
        0,
        "NAME  REPLICAS  MIN-ID  RACK  RESOLUTION  REASON\nmain  5         100     r1    Reserved    -\n",
        "",
    )


async def test_partition_list(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(partition("a-0", [1, 2, 3]), partition("b-0", [2]), partition("a-1", [3, 1]))
    assert await sc("partition", "list", "--topic", "a") == (
        0,
        "NAME  LEADER  REPLICAS   RESOLUTION  HW  LEO  LRS\n"
        "a-0   1       [1, 2, 3]  Offline     -   -    0\n"
        "a-1   3       [3, 1]     Offline     -   -    0\n",
        "",
    )
    code, out, _ = await sc("partition", "list", "-o", "json")
    assert (code, [obj["name"] for obj in json.loads(out)]) == (0, ["a-0", "a-1", "b-0"])


def reported(name: str, replicas: list[int], leader: tuple[int, int], followers: dict[int, int], **status: Any) -> models.Partition:
    """Partition ``name`` led by its first replica, whose LRS said: leader (HW, LEO), each follower's LEO."""
    hw, leo = leader
    return models.Partition.model_validate(
        {
            "name": name,
            "spec": {"leader": replicas[0], "replicas": replicas},
            "status": {
                "resolution": "Online",
                "leader": {"spu": replicas[0], "hw": hw, "leo": leo},
                "replicas": [{"spu": spu, "hw": min(hw, follower_leo), "leo": follower_leo} for spu, follower_leo in followers.items()],
                "lrs": sum(1 for follower_leo in followers.values() if follower_leo >= hw),
                **status,
            },
        }
    )


async def test_topic_describe_shows_each_partitions_leader_replicas_in_sync_set_and_lag(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(
        topic("orders", 3, 3, resolution="Provisioned", replica_map={"0": [0, 1, 2], "1": [1, 2, 0], "2": [2, 0, 1]}),
        reported("orders-0", [0, 1, 2], (100, 120), {1: 120, 2: 100}),
        reported("orders-1", [2, 0, 1], (50, 80), {0: 30, 1: 80}, partitionEpoch=2, isr=[1, 2]),  # its leader moved from 1 to 2; 0 left the in-sync set
        partition("other-0", [5]),
    )
    code, out, err = await sc("topic", "describe", "orders")
    assert (code, err) == (0, "")
    assert out.split("Partitions:\n")[1] == (
        "  PARTITION  LEADER  REPLICAS   ISR        LAG  RESOLUTION\n"
        "  0          0       [0, 1, 2]  [0, 1, 2]  20   Online\n"
        "  1          2       [2, 0, 1]  [2, 1]     50   Online\n"
        "  2          2       [2, 0, 1]  -          -    -\n"  # not created yet: its place in the replica map
    )
    assert await sc("partition", "list", "--topic", "orders") == (
        0,
        "NAME      LEADER  REPLICAS   RESOLUTION  HW   LEO  LRS\n"
        "orders-0  0       [0, 1, 2]  Online      100  120  2\n"
        "orders-1  2       [2, 0, 1]  Online      50   80   1\n",
        "",
    )


def test_the_in_sync_set_shown_is_the_one_the_sc_stores() -> None:
    from controller.cli import topic as topic_cli

    for shown, listed in (
        (reported("t-0", [0, 1, 2], (100, 120), {1: 120, 2: 99}, partitionEpoch=3, isr=[1, 0]), [0, 1]),
        (reported("t-0", [2, 0, 1], (100, 100), {0: 100, 1: -1}, partitionEpoch=1, isr=[2]), [2]),
        (reported("t-0", [2, 0, 1], (100, 100), {0: 100, 1: -1}), [2, 0, 1]),  # as created: every replica
        (reported("t-0", [3], (7, 7), {}, partitionEpoch=2, isr=[3]), [3]),
    ):
        stored = shown.in_sync()
        assert (topic_cli.in_sync(shown.to_json_dict()), sorted(stored)) == (listed, sorted(listed))
    assert (topic_cli.in_sync(partition("t-0", [0, 1]).to_json_dict()), topic_cli.lag(partition("t-0", [0, 1]).to_json_dict())) == (None, None)
    assert topic_cli.lag(reported("t-0", [2, 0, 1], (100, 100), {0: 100, 1: -1}).to_json_dict()) == 100


async def test_lists_are_read_in_pages_to_the_end(server: api_server.ApiServer, sc: Sc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_client, "PAGE_SIZE", 7)
    names = [f"t{number}-{index}" for number in range(3) for index in range(20)]
    await server.put(*(partition(name, [1]) for name in names))
    code, out, _ = await sc("partition", "list", "-o", "json")
    assert (code, [obj["name"] for obj in json.loads(out)]) == (0, names)
    code, out, _ = await sc("partition", "list", "--topic", "t1", "-o", "json")
    assert (code, [obj["name"] for obj in json.loads(out)]) == (0, names[20:40])
    assert server.context.gate.admitted["list"] == 9 + 3  # 60 partitions in pages of 7, then 20


async def test_a_list_refused_for_load_is_tried_again_after_retry_after() -> None:
    server = api_server.ApiServer(settings=config.Settings(max_expensive_requests=1, max_expensive_queue=0, expensive_queue_seconds=1))
    await server.start()
    try:
        await server.put(topic("a"))
        holder = server.context.gate.slot("placement")
        await holder.__aenter__()
        listing = asyncio.create_task(asyncio.to_thread(cli.main, ["topic", "list", "-o", "json", "--sc", server.url]))
        while not server.context.gate.refused:
            await asyncio.sleep(0.01)
        await holder.__aexit__(None, None, None)  # free before the CLI's next try (Retry-After: 1 s)
        assert await asyncio.wait_for(listing, 30) == 0
        assert server.context.gate.refused == {"list": 1}
    finally:
        await server.stop()


# ---------------------------------------------------------------------------- reaching the SC


async def test_the_address_comes_from_sc_addr(server: api_server.ApiServer, sc: Sc, monkeypatch: pytest.MonkeyPatch) -> None:
    await server.put(topic("a"))
    monkeypatch.setenv("SC_ADDR", server.url.removeprefix("http://"))
    code, out, _ = await sc("topic", "list", "-o", "json", address=False)
    assert (code, [obj["name"] for obj in json.loads(out)]) == (0, ["a"])


async def test_an_unreachable_sc_is_a_clear_error(sc: Sc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_ADDR", "http://127.0.0.1:1")
    assert await sc("topic", "list", address=False) == (
        1,
        "",
        "error: cannot reach the SC at http://127.0.0.1:1: connection refused. Is it running? Start it with "
        "`sc run`, or point to it with --sc URL or SC_ADDR\n",
    )


async def test_an_unusable_ca_file_is_a_clear_error(sc: Sc, tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "none.pem"
    code, out, err = await sc("topic", "list", "--ca", str(missing))
    assert (code, out) == (1, "")
    assert err.startswith(f"error: cannot use CA file {str(missing)!r} (")
    assert err.endswith("give the PEM CA that signed the SC's certificate\n")


async def test_a_starting_sc_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    server = api_server.ApiServer()
    await server.start(sync=False)
    try:
        result: Any = await Sc(server, capsys)("spu", "list")
        assert result == (1, "", "error: the SC is still loading its store; retry shortly (see /healthz)\n")
    finally:
        await server.stop()


# ---------------------------------------------------------------------------- numbers: no traceback, whatever their length

FIVE_THOUSAND_DIGITS = "9" * 5000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topic", "create", "t", "--partitions", FIVE_THOUSAND_DIGITS], "argument -p/--partitions: 99999999999999999999... (5000 characters) is above 2147483647, the largest value here"),
        (["topic", "create", "t", "--partitions", "²"], "argument -p/--partitions: '²' is not a whole number"),
        (["topic", "create", "t", "--partitions", "0" * 5000 + "2147483648"], "argument -p/--partitions: 00000000000000000000... (5010 characters) is above 2147483647, the largest value here"),
        (["spu", "register", "--id", "2147483648", "--name", "s", "--public-server", "h:1", "--private-server", "h:2"], "argument --id: 2147483648 is above 2147483647, the largest value here"),
        (["spu", "register", "--id", "1", "--name", "s", "--public-server", "h:²", "--private-server", "h:2"], "argument --public-server: 'h:²' is not HOST:PORT"),
        (["spu", "register", "--id", "1", "--name", "s", "--public-server", "h:" + FIVE_THOUSAND_DIGITS, "--private-server", "h:2"], "argument --public-server: 'h:999999999999999999... (5002 characters)' is not HOST:PORT"),
    ],
)
async def test_a_number_of_any_length_is_refused_with_the_reason(sc: Sc, argv: list[str], message: str) -> None:
    code, out, err = await sc(*argv)
    assert (code, out, err.splitlines()[-1]) == (2, "", f"sc {' '.join(argv[:2])}: error: {message}")


async def test_drain_of_an_spu_named_by_a_number_of_any_length_says_it_is_not_found(server: api_server.ApiServer, sc: Sc) -> None:
    await server.put(spu(1))
    assert await sc("spu", "drain", FIVE_THOUSAND_DIGITS) == (1, "", f"error: SPU '{FIVE_THOUSAND_DIGITS}' not found\n")
    assert await sc("spu", "drain", "7") == (1, "", "error: no SPU has id 7\n")


def test_a_whole_number_may_have_any_number_of_leading_zeros() -> None:
    from controller.cli import admin as admin_cli

    assert admin_cli.whole_number("0" * 5000 + "42") == 42
    assert admin_cli.whole_number("0000") == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"id": 0, "replicas": [' + "9" * 5000 + "]}]", "holds a number of 5000 digits at [0].replicas[0] (999999999999...): no value here has more than 20 digits"),
        ("[" * 100_000, "is nested too deeply"),
        ("[{", "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 3 (char 2)"),
    ],
)
async def test_a_replica_assignment_file_that_is_not_usable_json_is_named(
    sc: Sc, tmp_path: pathlib.Path, content: str, message: str
) -> None:
    path = tmp_path / "assignment.json"
    path.write_text(content)
    result = await sc("topic", "create", "t", "--replica-assignment", str(path))
    assert result == (1, "", f"error: replica assignment file {str(path)!r} {message}\n")


async def test_cluster_status_shows_the_active_sc_and_this_one(server: api_server.ApiServer, sc: Sc) -> None:
    code, out, _ = await sc("cluster", "status")
    assert (code, out) == (0, "no SC holds the store's claim: writes wait until one does\nthis SC: - (standby) at -\n")
    claim = active_sc.ActiveSc(server.kv_store, ttl=5)
    await claim.acquire("sc-a.example:9003")
    standby = active_sc.ActiveSc(server.kv_store, ttl=5)
    await standby.join("sc-b.example:9003")
    server.context.active = claim
    try:
        assert claim.identity is not None and standby.identity is not None
        identity, other = claim.identity, standby.identity
        stored = await builders.present(server.kv_store, active_sc.KEY)

        async def shown() -> None:
            code, out, _ = await sc("cluster", "status")
            assert (code, out.splitlines()) == (0, [
                "ROLE     ID" + " " * (len(identity.id) - 2) + "  ADDRESS            SINCE" + " " * (len(identity.started) - 5) + "  EPOCH",
                f"leader   {identity.id}  sc-a.example:9003  {identity.started}  {stored.mod_revision}",
                f"standby  {other.id}  sc-b.example:9003  -" + " " * (len(identity.started) + 1) + "-",
                f"this SC: {identity.id} (leader) at sc-a.example:9003",
            ])  # fmt: skip
            code, out, _ = await sc("-o", "json", "cluster", "status")
            assert json.loads(out)["leader"]["epoch"] == stored.mod_revision
            assert json.loads(out)["standbys"] == [{"id": other.id, "address": "sc-b.example:9003"}]

        await builders.eventually(shown)
    finally:
        await standby.release()
        await claim.release()
