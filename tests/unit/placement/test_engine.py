"""The entry point: request checks, typed errors, add-partitions and plug-ins."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import pytest

from controller import placement
from tests.unit.placement import helpers


def request(**options: Any) -> placement.PlacementRequest:
    values: dict[str, Any] = {"spus": helpers.plain(3), "partitions": 2, "replication_factor": 2}
    values.update(options)
    return placement.PlacementRequest(**values)


def error_of(req: placement.PlacementRequest, placers: placement.Placers | None = None) -> placement.PlacementError:
    with pytest.raises(placement.PlacementError) as caught:
        placement.compute(req, placers or {})
    return caught.value


# --------------------------------------------------------------------------- not enough SPUs


def test_rf_above_online_spus_names_what_is_missing() -> None:
    spus = [placement.SpuInfo(0), placement.SpuInfo(1), placement.SpuInfo(2, online=False)]
    error = error_of(request(spus=spus, replication_factor=3))
    assert isinstance(error, placement.InsufficientResources)
    assert error.code == "InsufficientResources"
    assert str(error) == (
        "replication factor 3 needs 3 online SPUs, only 2 are online (ids 0, 1): 1 more needed (offline: 2)"
    )
    assert error.needed_spus == 1


def test_no_online_spu_at_all() -> None:
    error = error_of(request(spus=[placement.SpuInfo(4, online=False)], replication_factor=1))
    assert str(error) == "replication factor 1 needs 1 online SPU, none is online: 1 more needed (offline: 4)"
    assert isinstance(error, placement.InsufficientResources) and error.needed_spus == 1


@pytest.mark.parametrize("strategy", ["computed", "kafka", "least-loaded", "multi-level", "policies"])
def test_every_strategy_reports_too_few_spus_the_same_way(strategy: str) -> None:
    error = error_of(request(spus=helpers.plain(1), strategy=strategy))
    assert str(error) == "replication factor 2 needs 2 online SPUs, only 1 is online (ids 0): 1 more needed"


# --------------------------------------------------------------------------- bad parameters


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partitions": 0}, "partitions must be an integer of at least 1, got 0"),
        ({"replication_factor": -1}, "replication factor must be an integer of at least 1, got -1"),
        ({"start_index": -5}, "start index must be an integer of at least 0, got -5"),
        ({"partitions": True}, "partitions must be an integer of at least 1, got True"),
        (
            {"strategy": "random"},
            "placement strategy 'random' is neither built in (computed, kafka, least-loaded, multi-level, "
            "policies, manual) nor a placement plug-in configured on this SC (configured: first, second); plug-ins are "
            "configured by the operator (sc run --placement-plugin NAME=module:Class)",
        ),
        (
            {"strategy": "kafka", "policies": "node=balanced"},
            "placement policies 'node=balanced' only apply to strategy policies, not kafka",
        ),
        ({"replica_assignment": [(0, [0])]}, "a replica assignment needs strategy manual, not computed"),
        ({"spus": [placement.SpuInfo(1), placement.SpuInfo(1)]}, "SPU id 1 appears more than once in spus"),
        (
            {"existing": [{"topic": "t", "partition": 0, "replicas": [1]}]},
            "existing partition {'topic': 't', 'partition': 0, 'replicas': [1]} is not (topic, partition, [spu ids])",
        ),
        ({"existing": [("t", 0, ["1"])]}, "existing partition ('t', 0, ['1']) is not (topic, partition, [spu ids])"),
        ({"spus": [placement.SpuInfo(-1)]}, "SPU id -1 is not a non-negative integer"),
        ({"spus": [placement.SpuInfo(0, rack=" ")]}, "rack ' ' of SPU 0 must be a non-empty string or null"),
        (
            {"strategy": "first", "plugin": "second"},
            "strategy 'first' and plugin 'second' name two different plug-ins",
        ),
    ],
)
def test_invalid_requests(options: dict[str, object], message: str) -> None:
    error = error_of(request(**options), placers={"first": ReverseIds(), "second": ReverseIds()})
    assert isinstance(error, placement.InvalidConfig)
    assert error.code == "InvalidConfig"
    assert str(error) == message


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"spus": [placement.SpuInfo(0, "r1"), placement.SpuInfo(1)]}, placement.Fix.CLUSTER),
        ({"spus": [placement.SpuInfo(0, "r1"), placement.SpuInfo(1, "/dc1/r1")]}, placement.Fix.CLUSTER),
        ({"spus": helpers.racked({0: "/dc1/r1", 1: "/dc2"}), "strategy": "multi-level"}, placement.Fix.CLUSTER),
        ({"policies": "node=exclusive"}, placement.Fix.CLUSTER),
        ({"policies": "preferred_nodes=9"}, placement.Fix.CLUSTER),
        ({"strategy": "manual", "replica_assignment": [(0, [9])], "partitions": 0}, placement.Fix.CLUSTER),
        ({"strategy": "manual", "replica_assignment": [(0, [9]), (2, [0])], "partitions": 0}, placement.Fix.SPEC),
        ({"strategy": "manual", "replica_assignment": [(1, [0]), (0, [1])], "partitions": 0}, placement.Fix.SPEC),
        ({"policies": "node=sideways"}, placement.Fix.SPEC),
        ({"strategy": "kafka", "policies": "node=balanced"}, placement.Fix.SPEC),
    ],
)
def test_each_invalid_config_says_whether_the_cluster_or_only_the_spec_can_fix_it(
    options: dict[str, object], fix: placement.Fix
) -> None:
    """Racks and registered SPUs are the cluster's: giving an SPU a rack places the same topic."""
    error = error_of(request(**{"replication_factor": 1, **options}))
    assert isinstance(error, placement.InvalidConfig)
    assert error.fix is fix, str(error)


def test_the_same_spu_tuple_placed_on_again_gives_what_an_equal_fresh_one_gives() -> None:
    """The engine remembers the last SPU tuple by identity: reusing it changes no result, and a
    tuple that failed its checks fails them again (nothing is remembered from a failure)."""
    spus = tuple(placement.SpuInfo(spu_id, rack=f"r{spu_id % 3}", online=spu_id != 9) for spu_id in range(10))
    for start_index in range(4):
        for ignore in (False, True, False):  # the rack layout is remembered with the flag it was worked out for
            options = {"partitions": 5, "replication_factor": 3, "start_index": start_index, "ignore_rack_assignment": ignore}
            again = placement.compute(request(spus=spus, **options))
            fresh = placement.compute(request(spus=tuple(list(spus)), **options))
            assert again == fresh
            assert all(9 not in row for row in again.replica_map)  # the offline SPU is still left out
            if ignore:  # exactly what the same SPUs without racks get
                no_racks = tuple(placement.SpuInfo(spu.id, online=spu.online) for spu in spus)
                assert again == placement.compute(request(spus=no_racks, **options))
            else:  # rack-aware: a replica in each rack
                assert all(len({spus[spu_id].rack for spu_id in row}) == 3 for row in again.replica_map)
    duplicated = (placement.SpuInfo(1), placement.SpuInfo(1))
    for _ in range(2):
        assert str(error_of(request(spus=duplicated))) == "SPU id 1 appears more than once in spus"


# --------------------------------------------------------------------------- add partitions


def test_add_partitions_places_only_the_new_ones_as_a_run_from_the_start_index() -> None:
    current = [[4, 0, 1], [0, 1, 2]]
    result = placement.compute(
        request(spus=helpers.plain(5), partitions=5, replication_factor=3, current_replica_map=current, start_index=9)
    )
    # The three new partitions are the seed table's indexes 9, 10 and 11.
    assert result.replica_map == [[4, 0, 1], [0, 1, 2], [4, 1, 2], [0, 3, 4], [1, 4, 0]]
    assert result.next_start_index == 12


def test_current_partitions_on_offline_spus_are_kept() -> None:
    spus = [placement.SpuInfo(0), placement.SpuInfo(1), placement.SpuInfo(2, online=False)]
    result = placement.compute(request(spus=spus, partitions=2, current_replica_map=[[2, 0]]))
    assert result.replica_map == [[2, 0], [0, 1]]


def test_nothing_to_add_returns_the_current_map_and_keeps_the_index() -> None:
    result = placement.compute(request(spus=helpers.plain(1), partitions=1, current_replica_map=[[0, 1]], start_index=3))
    assert result.replica_map == [[0, 1]]
    assert result.next_start_index == 3


@pytest.mark.parametrize(
    ("current", "message"),
    [
        ([[0, 1], [1, 2], [2, 0]], "the topic already has 3 partitions, more than the 2 asked for: partitions can be added, not removed"),
        ([[0, 1, 2]], "current partition 0 has 3 replicas but the replication factor is 2: existing partitions keep their replicas, so the replication factor cannot change here"),
        ([[1, 1]], "current partition 0 repeats an SPU: [1, 1]"),
        ([[0, -1]], "current partition 0 has replicas [0, -1], not SPU ids"),
    ],
)  # fmt: skip
def test_bad_current_maps(current: list[list[int]], message: str) -> None:
    assert str(error_of(request(current_replica_map=current))) == message


def test_same_request_same_result() -> None:
    for strategy in ("computed", "kafka", "least-loaded", "multi-level", "policies"):
        spus = helpers.racked({spu_id: f"r{spu_id % 3}" for spu_id in range(9)})
        first = placement.compute(request(spus=spus, partitions=20, replication_factor=3, strategy=strategy))
        again = placement.compute(request(spus=list(reversed(spus)), partitions=20, replication_factor=3, strategy=strategy))
        assert first == again


def test_request_is_frozen_and_normalised() -> None:
    req = request(current_replica_map=[[0, 1]], existing=[["t", 0, [1, 2]]])
    assert req.current_replica_map == ((0, 1),)
    with pytest.raises(AttributeError):
        req.partitions = 5  # type: ignore[misc]  # the assignment is the test: a frozen request refuses it


# --------------------------------------------------------------------------- plug-ins


class ReverseIds:
    """Places every partition on the highest ids first, and records what it saw."""

    seen: list[tuple[placement.PlacementSpec, placement.ClusterView, list[int]]] = []

    def place(
        self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]
    ) -> list[list[int]]:
        ReverseIds.seen.append((spec, cluster, list(spu_ids)))
        ordered = sorted(spu_ids, reverse=True)
        return [ordered[: spec.replication_factor] for _ in range(spec.count)]


class Defers:
    def place(self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]) -> None:
        return None


class Cheats:
    def place(self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]) -> list[list[int]]:
        return [[0, 9] for _ in range(spec.count)]


class Crashes:
    def place(self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]) -> None:
        raise RuntimeError("disk on fire")


class NotAPlacer:
    pass


PLACERS: dict[str, placement.ReplicaPlacer] = {"reverse": ReverseIds(), "defers": Defers(), "cheats": Cheats(), "crashes": Crashes()}


def test_plugin_places_and_sees_the_cluster_view() -> None:
    ReverseIds.seen.clear()
    spus = [*helpers.plain(3), placement.SpuInfo(3, online=False)]
    result = placement.compute(
        request(
            spus=spus,
            strategy="reverse",
            existing=[("other", 0, (0, 1))],
            current_replica_map=[[0, 1]],
            partitions=3,
            start_index=4,
        ),
        PLACERS,
    )
    assert result.replica_map == [[0, 1], [2, 1], [2, 1]]
    assert result.next_start_index == 6
    spec, cluster, spu_ids = ReverseIds.seen[0]
    assert spec == placement.PlacementSpec(
        count=2,
        first_partition=1,
        replication_factor=2,
        start_index=4,
        current_replica_map=((0, 1),),
        ignore_rack_assignment=False,
        policies=None,
    )
    assert cluster.assignments == {("other", 0): (0, 1)}
    assert [spu.id for spu in cluster.spus] == [0, 1, 2, 3]
    assert spu_ids == [0, 1, 2]


def test_plugin_returning_none_defers_to_the_strategy() -> None:
    assert placement.compute(request(plugin="defers", strategy="kafka"), PLACERS).replica_map == [[0, 1], [1, 2]]
    assert placement.compute(request(strategy="defers"), PLACERS).replica_map == [[0, 1], [1, 2]]


@pytest.mark.parametrize(
    ("options", "message", "fix"),
    [
        ({"plugin": "cheats"}, "placement plug-in 'cheats': partition 0 uses [9], which is not an online SPU", placement.Fix.PLUGINS),
        ({"plugin": "crashes"}, "placement plug-in 'crashes' failed: RuntimeError: disk on fire", placement.Fix.PLUGINS),
        (
            {"strategy": "unknown"},
            "placement strategy 'unknown' is neither built in (computed, kafka, least-loaded, multi-level, policies, "
            "manual) nor a placement plug-in configured on this SC (configured: cheats, crashes, defers, reverse); "
            "plug-ins are configured by the operator (sc run --placement-plugin NAME=module:Class)",
            placement.Fix.PLUGINS,
        ),
        (
            {"plugin": "unknown"},
            "placement plug-in 'unknown' is not configured on this SC (configured: cheats, crashes, defers, reverse); "
            "plug-ins are configured by the operator (sc run --placement-plugin NAME=module:Class)",
            placement.Fix.PLUGINS,
        ),
        (
            {"strategy": "os:abort"},
            "placement strategy 'os:abort' names a module: a topic names a built-in strategy (computed, kafka, "
            "least-loaded, multi-level, policies, manual) or a placement plug-in configured on this SC, by its "
            "name (configured: cheats, crashes, defers, reverse); the SC imports only the plug-ins its operator "
            "configures (sc run --placement-plugin NAME=module:Class)",
            placement.Fix.SPEC,
        ),
        (
            {"plugin": "os:abort"},
            "placement plug-in 'os:abort' is not configured on this SC (configured: cheats, crashes, defers, reverse); "
            "plug-ins are configured by the operator (sc run --placement-plugin NAME=module:Class)",
            placement.Fix.SPEC,
        ),
    ],
)  # fmt: skip
def test_plugin_failures_and_unknown_names_are_invalid_config(
    options: dict[str, object], message: str, fix: placement.Fix
) -> None:
    error = error_of(request(**options), PLACERS)
    assert isinstance(error, placement.InvalidConfig)
    assert (str(error), error.fix) == (message, fix)


def test_a_request_naming_a_module_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a request names, placement never imports it: a module it names stays unimported."""
    name = "tests.unit.placement.never_imported"
    monkeypatch.delitem(sys.modules, name, raising=False)
    for options in ({"strategy": f"{name}:Placer"}, {"plugin": f"{name}:Placer"}):
        assert isinstance(error_of(request(**options)), placement.InvalidConfig)
    assert name not in sys.modules
