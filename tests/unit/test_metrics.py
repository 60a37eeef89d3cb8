"""The SC's metrics: scrape-time gauges read from a local store, elections by cause, etcd requests by operation."""

from __future__ import annotations

import pytest

from connection_manager import transport
from controller import metrics
from controller.reconcile import actions
from store import kv, local, models
from tests.builders import partition, spu


def store_of(*objects: models.AnyObject) -> local.LocalStore:
    local_store = local.LocalStore()
    for revision, obj in enumerate(objects, start=1):
        local_store[obj.kind].apply(obj, revision)
    return local_store


def value(instance: metrics.Metrics, name: str, **labels: str) -> float | None:
    return instance.registry.get_sample_value(name, labels)


def test_every_resolution_of_every_kind_is_exported_even_at_zero() -> None:
    instance = metrics.Metrics()
    instance.watch_local_store(store_of(spu(0, "Online"), spu(1, "Offline"), spu(2, "Offline")))
    spus = {resolution: value(instance, "sc_objects", kind="spus", resolution=resolution) for resolution in ("Init", "Online", "Offline")}
    assert spus == {"Init": 0.0, "Online": 1.0, "Offline": 2.0}
    assert value(instance, "sc_objects", kind="topics", resolution="InsufficientResources") == 0.0
    assert value(instance, "sc_objects", kind="partitions", resolution="LeaderOffline") == 0.0
    assert value(instance, "sc_objects", kind="spu-groups", resolution="Invalid") == 0.0


def test_partitions_without_a_leader_are_leader_offline_or_led_by_an_spu_that_is_not_online() -> None:
    local_store = store_of(
        spu(0, "Online"),
        spu(1, "Offline"),
        spu(2, "Init"),
        partition("t-0", [0, 1], leader=0, resolution="Online"),  # led by an online SPU
        partition("t-1", [0, 1], leader=0, resolution="Offline"),  # new, its online leader has not reported: has a leader
        partition("t-2", [1, 0], leader=1, resolution="Online"),  # its leader went offline, no election written yet
        partition("t-3", [2, 0], leader=2, resolution="Offline"),  # led by an SPU that never came online
        partition("t-4", [0], leader=0, resolution="LeaderOffline"),  # recorded as leaderless
        partition("t-5", [7], leader=7, resolution="Online"),  # led by an SPU the store does not know
    )
    assert metrics.partitions_without_leader(local_store) == 4
    instance = metrics.Metrics()
    instance.watch_local_store(local_store)
    assert value(instance, "sc_partitions_without_leader") == 4.0


def test_the_object_gauges_follow_every_change_and_scrapes_in_between_do_not_walk_the_tables() -> None:
    """A scrape costs a pass over each table that changed since the last one: at a takeover the
    bench (and Prometheus) scraping 10,000 partitions every 50 ms took half the new leader's CPU."""
    local_store = store_of(spu(0, "Online"), spu(1, "Offline"), partition("t-0", [0], leader=0, resolution="Online"))
    instance = metrics.Metrics()
    instance.watch_local_store(local_store)
    assert value(instance, "sc_partitions_without_leader") == 0.0
    partitions = local_store["partitions"]
    walks: list[str] = []
    original_iter = type(partitions).__iter__

    def counting_iter(table: local.KindStore[models.Partition]):  # noqa: ANN202 (the table's own iterator)
        walks.append(table.kind)
        return original_iter(table)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(partitions), "__iter__", counting_iter)
        for _ in range(3):
            assert value(instance, "sc_objects", kind="partitions", resolution="Online") == 1.0
            assert value(instance, "sc_partitions_without_leader") == 0.0
        assert walks == []  # nothing changed since the first scrape
        partitions.apply(partition("t-1", [1], leader=1, resolution="Online"), 10)  # led by an offline SPU
        assert value(instance, "sc_objects", kind="partitions", resolution="Online") == 2.0
        assert value(instance, "sc_partitions_without_leader") == 1.0
        local_store["spus"].apply(spu(1, "Online"), 11)  # its leader comes back
        assert value(instance, "sc_partitions_without_leader") == 0.0
        assert value(instance, "sc_objects", kind="spus", resolution="Online") == 2.0
        partitions.delete("t-0", 12)
        assert value(instance, "sc_objects", kind="partitions", resolution="Online") == 1.0


def test_an_empty_store_has_no_partition_without_a_leader() -> None:
    instance = metrics.Metrics()
    instance.watch_local_store(local.LocalStore())
    assert value(instance, "sc_partitions_without_leader") == 0.0
    assert value(instance, "sc_store_synced") == 0.0


def _election(cause: str) -> actions.Action:
    before = partition("t-0", [0, 1], leader=0, resolution="Online")
    after = partition("t-0", [0, 1], leader=1, resolution="Online")
    return actions.elect(before, after, 5, "SPU 0 went offline: SPU 1 now leads", cause)


def test_applied_elections_are_counted_by_cause_and_other_outcomes_are_not() -> None:
    instance = metrics.Metrics()
    assert {cause: value(instance, "sc_leader_elections_total", cause=cause) for cause in metrics.ELECTION_CAUSES} == {
        "spu-offline": 0.0,
        "preferred-leader": 0.0,
        "drain": 0.0,
        "unclean": 0.0,
        "reassignment": 0.0,
    }
    instance.action_done(_election("spu-offline"), "applied")
    instance.action_done(_election("spu-offline"), "applied")
    instance.action_done(_election("drain"), "conflict")
    instance.action_done(_election("unclean"), "unavailable")
    instance.action_done(_election("preferred-leader"), "applied")
    instance.action_done(actions.update_status(spu(0), models.SpuStatus(), 3, "connected"), "applied")
    assert {cause: value(instance, "sc_leader_elections_total", cause=cause) for cause in metrics.ELECTION_CAUSES} == {
        "spu-offline": 2.0,
        "preferred-leader": 1.0,
        "drain": 0.0,
        "unclean": 0.0,
        "reassignment": 0.0,
    }
    assert value(instance, "sc_actions_total", kind="partitions", verb="elect", outcome="applied") == 3.0
    assert value(instance, "sc_actions_total", kind="partitions", verb="elect", outcome="conflict") == 1.0
    assert value(instance, "sc_actions_total", kind="spus", verb="update-status", outcome="applied") == 1.0


async def test_etcd_requests_are_timed_by_operation_and_failures_counted_but_not_lost_compares() -> None:
    instance = metrics.Metrics()
    assert value(instance, "sc_etcd_request_seconds_count", operation="txn") == 0.0
    assert value(instance, "sc_etcd_errors_total", operation="watch") == 0.0
    with instance.etcd_request("txn"):
        pass
    with pytest.raises(kv.Unavailable), instance.etcd_request("txn"):
        raise kv.Unavailable("etcd is down")
    with pytest.raises(kv.Conflict), instance.etcd_request("txn"):
        raise kv.Conflict("spus/spu-0", 4, 5)
    with pytest.raises(kv.Unavailable), instance.etcd_request("list"):
        raise kv.Unavailable("etcd is down")
    assert value(instance, "sc_etcd_request_seconds_count", operation="txn") == 3.0
    assert value(instance, "sc_etcd_request_seconds_count", operation="list") == 1.0
    assert value(instance, "sc_etcd_errors_total", operation="txn") == 1.0
    assert value(instance, "sc_etcd_errors_total", operation="list") == 1.0
    assert value(instance, "sc_etcd_errors_total", operation="watch") == 0.0


def test_each_port_exports_its_connections_refusals_by_reason_and_buffered_bytes() -> None:
    instance = metrics.Metrics()
    public = transport.Port(transport.PUBLIC, transport.Limits(connections=1, per_address=1))
    private = transport.Port(transport.PRIVATE, transport.Limits(connections=5, per_address=5))
    instance.watch_ports(public, private)
    assert [public.admit("10.0.0.1"), public.admit("10.0.0.2"), private.admit("10.0.0.1")] == [True, False, True]
    public.stats.accept_pauses = 2
    public.stats.abandoned_requests = 3
    public.budget.held = 1 << 20
    assert {port: value(instance, "sc_connections_open", port=port) for port in ("public", "private")} == {"public": 1.0, "private": 1.0}
    refused = {reason: value(instance, "sc_connections_refused_total", port="public", reason=reason) for reason in transport.REASONS}
    assert refused == {**dict.fromkeys(transport.REASONS, 0.0), transport.LIMIT: 1.0}
    assert value(instance, "sc_connections_refused_total", port="private", reason=transport.HEADER_TIMEOUT) == 0.0
    assert value(instance, "sc_accept_paused_total", port="public") == 2.0
    assert value(instance, "sc_requests_abandoned_total", port="public") == 3.0
    assert value(instance, "sc_request_bytes_buffered", port="public") == float(1 << 20)
    assert value(instance, "sc_log_lines_suppressed_total", port="public") == 0.0
