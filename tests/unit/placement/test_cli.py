"""`sc placement compute|rebalance` through the real `sc` entry point: stdin, --input, answers and exit codes."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main as cli

SEED_CHAIN_REQUEST = {
    "spus": [{"id": spu_id, "rack": None, "online": True} for spu_id in range(5)],
    "partitions": 3,
    "replicationFactor": 3,
    "strategy": "computed",
    "startIndex": 9,
}

SEED_CHAIN_ANSWER = {
    "replicaMap": [[4, 1, 2], [0, 3, 4], [1, 4, 0]],
    "nextStartIndex": 12,
    "balance": {
        "replicas": {"perSpu": {"0": 2, "1": 2, "2": 1, "3": 1, "4": 3}, "min": 1, "max": 3, "spread": 2},
        "leaders": {"perSpu": {"0": 1, "1": 1, "2": 0, "3": 0, "4": 1}, "min": 0, "max": 1, "spread": 1},
        "rackReplicas": None,
        "rackLeaders": None,
        "rackViolations": {"count": 0, "partitions": []},
        "failover": {"perSpu": {"0": 1, "1": 1, "2": 0, "3": 0, "4": 1}, "max": 1, "worstSpu": 0},
    },
}


def run(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    status = cli.main(argv)
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1, "one JSON document on one line"
    return status, json.loads(out), out


def test_request_on_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer, _ = run(["placement", "compute"], json.dumps(SEED_CHAIN_REQUEST), monkeypatch, capsys)
    assert status == 0
    assert answer == SEED_CHAIN_ANSWER


def test_request_from_input_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(SEED_CHAIN_REQUEST), encoding="utf-8")
    status, answer, _ = run(["placement", "compute", "--input", str(path)], "ignored", monkeypatch, capsys)
    assert status == 0
    assert answer == SEED_CHAIN_ANSWER


def test_rack_example_with_racks_in_the_balance(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    racks = {0: "rack-a", 1: "rack-b", 2: "rack-b", 3: "rack-c", 4: "rack-c", 5: "rack-c"}
    request = {"spus": [{"id": i, "rack": r} for i, r in racks.items()], "partitions": 6, "replicationFactor": 3}
    status, answer, _ = run(["placement", "compute"], json.dumps(request), monkeypatch, capsys)
    assert status == 0
    assert isinstance(answer, dict)
    assert answer["replicaMap"] == [[3, 2, 0], [2, 0, 4], [0, 4, 1], [4, 1, 5], [1, 5, 3], [5, 3, 2]]
    assert answer["balance"]["rackLeaders"] == {"perRack": {"rack-a": 1, "rack-b": 2, "rack-c": 3}, "min": 1, "max": 3, "spread": 2}
    # Partitions 3-5 ([4, 1, 5], [1, 5, 3], [5, 3, 2]) span two racks though three exist: the
    # seed's caveat that racks with more SPUs handle more replicas.
    assert answer["balance"]["rackViolations"] == {"count": 3, "partitions": [3, 4, 5]}


def test_insufficient_resources(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    request = {"spus": [{"id": 0}, {"id": 1, "online": False}], "partitions": 1, "replicationFactor": 2}
    status, answer, _ = run(["placement", "compute"], json.dumps(request), monkeypatch, capsys)
    assert status == 1
    assert answer == {
        "error": {
            "code": "InsufficientResources",
            "message": "replication factor 2 needs 2 online SPUs, only 1 is online (ids 0): 1 more needed (offline: 1)",
        }
    }


def test_invalid_manual_assignment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    request = {"spus": [{"id": 0}, {"id": 1}], "replicaAssignment": [{"id": 0, "replicas": [0, 0]}, {"id": 2, "replicas": [1, 0]}]}
    status, answer, _ = run(["placement", "compute"], json.dumps(request), monkeypatch, capsys)
    assert status == 1
    assert answer == {
        "error": {
            "code": "InvalidConfig",
            "message": "invalid replica assignment: partition 0: SPU 0 is listed more than once; "
            "assigned partition ids must be in sequence and without gaps: 1 is missing (ids given: 0, 2)",
        }
    }


def test_valid_manual_assignment_is_validated_and_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request = {"spus": [{"id": 0}, {"id": 1}], "replicaAssignment": [{"id": 0, "replicas": [1, 0]}, {"id": 1, "replicas": [0, 1]}]}
    status, answer, _ = run(["placement", "compute"], json.dumps(request), monkeypatch, capsys)
    assert status == 0
    assert isinstance(answer, dict)
    assert (answer["replicaMap"], answer["nextStartIndex"]) == ([[1, 0], [0, 1]], 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{partitions: 3", "the request in stdin is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ('{"partitions": ' + "9" * 5000 + "}", "the request in stdin holds a number of 5000 digits at partitions (999999999999...): no value here has more than 20 digits"),
        ("[" * 100_000, "the request in stdin is nested too deeply"),
    ],
)
def test_not_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    status, answer, _ = run(["placement", "compute"], text, monkeypatch, capsys)
    assert status == 1
    assert answer == {"error": {"code": "InvalidConfig", "message": message}}


def test_missing_input_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    status, answer, _ = run(["placement", "compute", "--input", str(missing)], "", monkeypatch, capsys)
    assert status == 1
    assert answer == {
        "error": {
            "code": "InvalidConfig",
            "message": f"cannot read the request from {missing}: [Errno 2] No such file or directory: '{missing}'",
        }
    }


def test_malformed_field(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer, _ = run(["placement", "compute"], '{"spus": [{"id": -1}], "partitions": 1, "replicationFactor": 1}', monkeypatch, capsys)
    assert status == 1
    assert answer == {"error": {"code": "InvalidConfig", "message": "spus[0].id must be an integer from 0 to 2147483647, got -1"}}


def test_placement_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["placement"])
    assert caught.value.code == 2
    assert "sc placement: error: the following arguments are required: COMMAND" in capsys.readouterr().err


def test_plugins_come_from_the_command_line_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    request = {"spus": [{"id": spu_id} for spu_id in range(3)], "partitions": 2, "replicationFactor": 2}
    flags = ["--placement-plugin", "highest-first=tests.placement_plugins:HighestFirst"]
    status, answer, _ = run(
        ["placement", "compute", *flags], json.dumps({**request, "strategy": "highest-first"}), monkeypatch, capsys
    )
    assert (status, answer["replicaMap"]) == (0, [[2, 1], [2, 1]])
    # The request may name the module itself: it is not imported, and the answer says how plug-ins are given.
    name = "tests.unit.placement.never_imported"
    monkeypatch.delitem(sys.modules, name, raising=False)
    status, answer, _ = run(["placement", "compute", *flags], json.dumps({**request, "strategy": f"{name}:Placer"}), monkeypatch, capsys)
    assert status == 1 and answer["error"]["code"] == "InvalidConfig"
    assert name not in sys.modules


def test_a_plugin_flag_that_cannot_load_is_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["placement", "compute", "--placement-plugin", "broken=tests.placement_plugins:BrokenAtStart"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "error: placement plug-in 'broken' (tests.placement_plugins:BrokenAtStart) could not be created: "
        "RuntimeError: no licence file\n",
    )


# --------------------------------------------------------------------------- sc placement rebalance

KIP6_REQUEST = {
    "spus": [{"id": spu_id} for spu_id in range(4)],
    "partitions": [{"partition": f"kip-{index}", "replicas": [0, 1] if index % 2 == 0 else [1, 0]} for index in range(6)]
    + [{"partition": "kip-6", "replicas": [0]}],
}


def test_rebalance_plan_on_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    status, answer, _ = run(["placement", "rebalance"], json.dumps(KIP6_REQUEST), monkeypatch, capsys)
    assert status == 0
    assert isinstance(answer, dict)
    assert (answer["replicaMoves"], answer["lowerBound"], answer["balanced"]) == (6, 6, True)
    assert answer["before"]["replicasPerSpu"] == {"0": 7, "1": 6, "2": 0, "3": 0}
    assert answer["after"]["replicasPerSpu"] == {"0": 4, "1": 3, "2": 3, "3": 3}
    assert [move["partition"] for move in answer["moves"]] == [f"kip-{index}" for index in range(6)]


def test_rebalance_plan_from_an_input_file_with_a_decommission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request = {
        "spus": [{"id": 0}, {"id": 1}, {"id": 2, "decommissioning": True}],
        "partitions": [{"partition": "t-0", "replicas": [2, 0]}, {"partition": "t-1", "replicas": [1]}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    status, answer, _ = run(["placement", "rebalance", "--input", str(path)], "ignored", monkeypatch, capsys)
    assert status == 0
    assert isinstance(answer, dict)
    # SPU 1 takes SPU 2's replica (and its leadership, handed to SPU 0 so that each leads one).
    assert answer["moves"] == [{"partition": "t-0", "from": [2, 0], "to": [0, 1]}]
    assert answer["after"] == {"replicasPerSpu": {"0": 1, "1": 2, "2": 0}, "leadersPerSpu": {"0": 1, "1": 1, "2": 0}}


def test_rebalance_of_a_bad_request_is_an_error_object(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request = {"spus": [{"id": 0}], "partitions": [{"partition": "t-0", "replicas": [0, 4]}]}
    status, answer, _ = run(["placement", "rebalance"], json.dumps(request), monkeypatch, capsys)
    assert status == 1
    assert answer == {
        "error": {
            "code": "InvalidConfig",
            "message": "partition t-0 has a replica on SPU 4, which is not in spus: list every SPU that holds "
            "replicas (online false for one that is down)",
        }
    }
