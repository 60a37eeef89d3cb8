"""The balance report: per SPU and per rack, rack violations, failover spread."""

from __future__ import annotations

from controller import placement

SPUS = [
    placement.SpuInfo(0, "r1"),
    placement.SpuInfo(1, "r1"),
    placement.SpuInfo(2, "r2"),
    placement.SpuInfo(3, "r2", online=False),
]


def test_full_report() -> None:
    assert placement.balance([[0, 1], [0, 2], [1, 2], [2, 0]], SPUS) == {
        "replicas": {"perSpu": {"0": 3, "1": 2, "2": 3}, "min": 2, "max": 3, "spread": 1},
        "leaders": {"perSpu": {"0": 2, "1": 1, "2": 1}, "min": 1, "max": 2, "spread": 1},
        "rackReplicas": {"perRack": {"r1": 5, "r2": 3}, "min": 3, "max": 5, "spread": 2},
        "rackLeaders": {"perRack": {"r1": 3, "r2": 1}, "min": 1, "max": 3, "spread": 2},
        "rackViolations": {"count": 1, "partitions": [0]},
        "failover": {"perSpu": {"0": 1, "1": 1, "2": 1}, "max": 1, "worstSpu": 0},
    }


def test_failover_counts_the_busiest_survivor() -> None:
    report = placement.balance([[0, 1], [0, 1], [0, 2], [1, 0]], SPUS)
    assert report["failover"] == {"perSpu": {"0": 2, "1": 1, "2": 0}, "max": 2, "worstSpu": 0}


def test_failover_skips_offline_followers_and_reports_offline_spus_in_use() -> None:
    report = placement.balance([[0, 3, 1]], SPUS)
    assert report["failover"] == {"perSpu": {"0": 1, "1": 0, "2": 0, "3": 0}, "max": 1, "worstSpu": 0}
    assert report["replicas"] == {"perSpu": {"0": 1, "1": 1, "2": 0, "3": 1}, "min": 0, "max": 1, "spread": 1}


def test_rf_one_has_no_failover_and_no_violations() -> None:
    report = placement.balance([[0], [2]], SPUS)
    assert report["failover"] == {"perSpu": {"0": 0, "1": 0, "2": 0}, "max": 0, "worstSpu": None}
    assert report["rackViolations"] == {"count": 0, "partitions": []}


def test_no_racks() -> None:
    report = placement.balance([[0, 1]], [placement.SpuInfo(0), placement.SpuInfo(1)])
    assert report["rackReplicas"] is None
    assert report["rackLeaders"] is None
    assert report["rackViolations"] == {"count": 0, "partitions": []}


def test_empty_map() -> None:
    assert placement.balance([], []) == {
        "replicas": {"perSpu": {}, "min": 0, "max": 0, "spread": 0},
        "leaders": {"perSpu": {}, "min": 0, "max": 0, "spread": 0},
        "rackReplicas": None,
        "rackLeaders": None,
        "rackViolations": {"count": 0, "partitions": []},
        "failover": {"perSpu": {}, "max": 0, "worstSpu": None},
    }


def test_rack_violations_are_the_balance_reports_partitions() -> None:
    """One function serves the report and the topic controller's note on a placed topic."""
    uneven = [placement.SpuInfo(spu_id, rack) for spu_id, rack in enumerate(["r1", "r1", "r1", "r2", "r3"])]
    replica_map = [[0, 3, 4], [3, 4, 1], [4, 1, 2], [1, 2, 0], [2, 0, 3], [0, 3, 4]]
    assert placement.rack_violations(replica_map, uneven) == [2, 3, 4]
    assert placement.balance(replica_map, uneven)["rackViolations"] == {"count": 3, "partitions": [2, 3, 4]}
    assert placement.rack_violations([[0, 1], [0, 2], [1, 2], [2, 0]], SPUS) == [0]
    assert placement.rack_violations([[0, 1]], [placement.SpuInfo(0), placement.SpuInfo(1)]) == []
