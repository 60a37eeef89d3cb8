"""Prometheus metrics of one SC instance, in a registry of its own (no process-global state).

Counters and histograms are updated by the pipeline; object gauges are read from the local
store at scrape time, so they can never drift from what the SC actually holds.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from store import local


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconcile_passes = prometheus_client.Counter(
            "sc_reconcile_passes", "Controller reconcile passes", ["controller"], registry=r
        )
        self.reconcile_seconds = prometheus_client.Histogram(
            "sc_reconcile_seconds",
            "Time one reconcile pass takes",
            ["controller"],
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.actions = prometheus_client.Counter(
            "sc_actions", "Actions applied, by verb and outcome", ["kind", "verb", "outcome"], registry=r
        )
        self.action_queue_depth = prometheus_client.Gauge(
            "sc_action_queue_depth", "Actions waiting for their key to be written", registry=r
        )
        self.etcd_errors = prometheus_client.Counter(
            "sc_etcd_errors", "KV store requests that failed", ["operation"], registry=r
        )
        self.etcd_request_seconds = prometheus_client.Histogram(
            "sc_etcd_request_seconds",
            "KV store transaction latency",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.relists = prometheus_client.Counter(
            "sc_reader_relists", "Full relists of a kind (startup, compaction, broken watch)", ["kind"], registry=r
        )
        self.malformed_objects = prometheus_client.Counter(
            "sc_malformed_objects", "Values in the store that failed validation and were skipped", ["kind"], registry=r
        )

    def watch_local_store(self, local_store: local.LocalStore) -> None:
        self.registry.register(_ObjectsCollector(local_store))

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class _ObjectsCollector(Collector):
    def __init__(self, local_store: local.LocalStore) -> None:
        self.local_store = local_store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        objects = GaugeMetricFamily(
            "sc_objects", "Objects in the local store by kind and resolution", labels=["kind", "resolution"]
        )
        for kind, table in self.local_store.tables.items():
            tally = Tally(str(entry.obj.status.resolution.value) for entry in table)  # type: ignore[attr-defined]
            for resolution, count in sorted(tally.items()):
                objects.add_metric([kind, resolution], count)
        yield objects
        synced = GaugeMetricFamily("sc_store_synced", "1 once every kind is listed and watched")
        synced.add_metric([], 1.0 if self.local_store.synced else 0.0)
        yield synced
