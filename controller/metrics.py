"""Prometheus metrics of one SC instance, in a registry of its own (no process-global state).

Counters and histograms are updated by the pipeline; object gauges are read from the local
store at scrape time, so they can never drift from what the SC actually holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from connection_manager import server as cm_server
from connection_manager import tls, transport
from controller.reconcile import actions, partition, spu_ids
from store import active_sc, history, kv, local, models, supervisor as supervisor_module

# Every frame type an SPU sends after its registration, so each series exists from the start.
SPU_FRAME_TYPES = ("hosted", "heartbeat", "leading", "alterIsr", "offsets")
# Every cause a leader election is recorded with (Action.cause), so each series exists from the start.
ELECTION_CAUSES = (
    partition.CAUSE_SPU_OFFLINE, partition.CAUSE_PREFERRED, partition.CAUSE_DRAIN, partition.CAUSE_UNCLEAN, partition.CAUSE_REASSIGNMENT
)
# The KV store requests the SC times: the Reader's listing and the dispatcher's transactions.
ETCD_OPERATIONS = ("list", "txn")


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
        self.reconcile_faults = prometheus_client.Counter(
            "sc_reconcile_faults",
            "Objects whose decision raised in a controller pass (left as they are; the others went on)",
            ["controller", "kind"],
            registry=r,
        )
        self.takeovers = prometheus_client.Counter(
            "sc_takeovers",
            "Terms this SC began as its store's leader, by what became of the claim before "
            "(unclaimed, resigned, lease-expired, claim-deleted)",
            ["cause"],
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
            "KV store request latency, by operation (list, txn)",
            ["operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        for operation in ETCD_OPERATIONS:
            self.etcd_request_seconds.labels(operation)
        for operation in (*ETCD_OPERATIONS, "watch"):
            self.etcd_errors.labels(operation)
        self.leader_elections = prometheus_client.Counter(
            "sc_leader_elections", "Leader changes written to the store, by cause", ["cause"], registry=r
        )
        for cause in ELECTION_CAUSES:
            self.leader_elections.labels(cause)
        self.relists = prometheus_client.Counter(
            "sc_reader_relists", "Full relists of a kind (startup, compaction, broken watch)", ["kind"], registry=r
        )
        self.malformed_objects = prometheus_client.Counter(
            "sc_malformed_objects", "Values in the store that failed validation and were skipped", ["kind"], registry=r
        )

    def action_done(self, action: actions.Action, outcome: str) -> None:
        """Count one action's outcome; an applied election also counts under its cause."""
        self.actions.labels(action.kind, action.verb.value, outcome).inc()
        if outcome == "applied" and action.verb is actions.Verb.ELECT:
            self.leader_elections.labels(action.cause or "unspecified").inc()

    @contextlib.contextmanager
    def etcd_request(self, operation: str) -> Iterator[None]:
        """Time one KV store request; a failure counts as an error, a lost compare-and-swap does not
        (it is etcd's answer, and the key's controller decides again)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield
        except kv.Conflict:
            raise
        except kv.StoreError:
            self.etcd_errors.labels(operation).inc()
            raise
        finally:
            self.etcd_request_seconds.labels(operation).observe(loop.time() - started)

    def watch_history(self, recorder: history.Recorder) -> None:
        self.registry.register(_HistoryCollector(recorder))

    def watch_active(self, active: active_sc.ActiveSc) -> None:
        self.registry.register(_ActiveCollector(active))

    def watch_local_store(self, local_store: local.LocalStore) -> None:
        self.registry.register(_ObjectsCollector(local_store))

    def watch_connections(self, connections: cm_server.ConnectionManager) -> None:
        self.registry.register(_ConnectionsCollector(connections))

    def watch_tasks(self, supervisor: supervisor_module.Supervisor) -> None:
        self.registry.register(_TasksCollector(supervisor))

    def watch_ports(self, *ports: transport.Port) -> None:
        self.registry.register(_PortsCollector(ports))

    def watch_reloads(self, reloadables: list[tls.Reloadable[Any]]) -> None:
        self.registry.register(_ReloadsCollector(reloadables))

    def watch(self, collector: Collector) -> None:
        """Another part's gauges and counters, read at scrape time (the API's reads: api/read_metrics.py)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class _ActiveCollector(Collector):
    """This SC's claim on its store: whether it leads, and what the store refused it."""

    def __init__(self, active: active_sc.ActiveSc) -> None:
        self.active = active

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        leader = GaugeMetricFamily("sc_leader", "1 while this SC holds its store's claim and may write, else 0")
        leader.add_metric([], 1 if self.active.leading else 0)
        yield leader
        fenced = CounterMetricFamily(
            "sc_fenced_writes", "Writes the store refused because the claim they carried was not its claim any more"
        )
        fenced.add_metric([], self.active.fenced_writes)
        yield fenced
        losses = CounterMetricFamily("sc_claim_losses", "Times this SC lost its store's claim while holding it")
        losses.add_metric([], self.active.losses)
        yield losses
        no_space = CounterMetricFamily(
            "sc_etcd_no_space_refusals",
            "Writes etcd refused because its database reached its space quota (NOSPACE alarm: an operator must "
            "compact, defragment and disarm it)",
        )
        no_space.add_metric([], self.active.kv_store.no_space_refusals)
        yield no_space


class _HistoryCollector(Collector):
    """The history recorder's queue and counters, read at scrape time."""

    def __init__(self, recorder: history.Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[GaugeMetricFamily | prometheus_client.core.CounterMetricFamily]:
        recorder, stats = self.recorder, self.recorder.stats
        depth = GaugeMetricFamily("sc_history_queue_depth", "History records waiting to be written")
        depth.add_metric([], recorder.queue_depth)
        yield depth
        lag = GaugeMetricFamily("sc_history_lag_seconds", "How long the oldest queued history record has waited")
        lag.add_metric([], recorder.lag())
        yield lag
        revision = GaugeMetricFamily("sc_history_revision", "The store revision through which the history is complete")
        revision.add_metric([], recorder.resume_revision or 0)
        yield revision
        recorded = prometheus_client.core.CounterMetricFamily(
            "sc_history_records", "History records written, by type", labels=["type"]
        )
        for record_type, count in sorted(stats.recorded.items()):
            recorded.add_metric([record_type], count)
        yield recorded
        dropped = prometheus_client.core.CounterMetricFamily(
            "sc_history_dropped_records", "History records dropped (queue full, or the disk failed)"
        )
        dropped.add_metric([], stats.dropped)
        yield dropped
        torn = GaugeMetricFamily("sc_history_torn_bytes", "Bytes of a torn last record cut when the history was opened")
        torn.add_metric([], stats.truncated_bytes)
        yield torn


class _ObjectsCollector(Collector):
    """Gauges counted over whole tables, each count kept until its tables change (their epochs):
    scraped often while nothing changes (a takeover watched every 50 ms, 10,000 partitions), a
    pass over every partition at each scrape took half the new leader's CPU."""

    def __init__(self, local_store: local.LocalStore) -> None:
        self.local_store = local_store
        self._tallies: dict[str, tuple[int, Tally[str]]] = {}  # kind -> (its table's epoch, by resolution)
        self._leaderless: tuple[tuple[int, int], int] | None = None  # ((partitions, spus epochs), count)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        objects = GaugeMetricFamily(
            "sc_objects",
            "Objects in the local store by kind and resolution (every resolution listed, 0 included)",
            labels=["kind", "resolution"],
        )
        for kind, table in self.local_store.tables.items():
            cached = self._tallies.get(kind)
            if cached is None or cached[0] != table.epoch:
                tally = Tally(str(entry.obj.status.resolution.value) for entry in table)
                for resolution in RESOLUTIONS[kind]:
                    tally.setdefault(resolution, 0)
                cached = self._tallies[kind] = (table.epoch, tally)
            for resolution, count in sorted(cached[1].items()):
                objects.add_metric([kind, resolution], count)
        yield objects
        sharing = GaugeMetricFamily(
            "sc_spus_sharing_an_id",
            "SPUs placement ignores because another SPU holds their id (written behind the SC's back)",
        )
        sharing.add_metric([], len(spu_ids.shadowed(self.local_store["spus"].view, self.local_store.meta.values.get)))
        yield sharing
        leaderless = GaugeMetricFamily(
            "sc_partitions_without_leader",
            "Partitions that are LeaderOffline, or whose leader is not an Online SPU (an election is due)",
        )
        epochs = (self.local_store["partitions"].epoch, self.local_store["spus"].epoch)
        if self._leaderless is None or self._leaderless[0] != epochs:
            self._leaderless = (epochs, partitions_without_leader(self.local_store))
        leaderless.add_metric([], self._leaderless[1])
        yield leaderless
        draining = GaugeMetricFamily("sc_spus_draining", "SPUs an operator asked to drain (spec.drain), drained or not yet")
        draining.add_metric([], sum(1 for entry in self.local_store["spus"] if entry.obj.spec.drain))
        yield draining
        synced = GaugeMetricFamily("sc_store_synced", "1 once every kind is listed and watched")
        synced.add_metric([], 1.0 if self.local_store.synced else 0.0)
        yield synced


RESOLUTIONS: dict[str, tuple[str, ...]] = {
    "spus": tuple(resolution.value for resolution in models.SpuResolution),
    "spu-groups": tuple(resolution.value for resolution in models.SpuGroupResolution),
    "topics": tuple(resolution.value for resolution in models.TopicResolution),
    "partitions": tuple(resolution.value for resolution in models.PartitionResolution),
}


def partitions_without_leader(local_store: local.LocalStore) -> int:
    """Partitions nobody leads now: LeaderOffline, or led by an SPU the store does not hold Online.

    A new partition whose leader is online but has not reported yet is not counted: it has a leader.
    """
    online = {
        entry.obj.spec.id
        for entry in local_store["spus"]
        if entry.obj.status.resolution is models.SpuResolution.ONLINE
    }
    return sum(
        1
        for entry in local_store["partitions"]
        if entry.obj.status.resolution is models.PartitionResolution.LEADER_OFFLINE
        or entry.obj.spec.leader not in online
    )


class _ConnectionsCollector(Collector):
    """The connection manager's counters, read at scrape time."""

    def __init__(self, connections: cm_server.ConnectionManager) -> None:
        self.connections = connections

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.connections.stats
        connected = GaugeMetricFamily("sc_spus_connected", "SPUs connected to the private port now")
        connected.add_metric([], len(self.connections.sessions))
        yield connected
        accepted = CounterMetricFamily("sc_spu_connections_accepted", "SPU connections accepted")
        accepted.add_metric([], stats.accepted)
        yield accepted
        rejected = CounterMetricFamily("sc_spu_connections_rejected", "SPU connections refused, by code", labels=["code"])
        for code, count in sorted(stats.rejected.items()):
            rejected.add_metric([code], count)
        yield rejected
        frames = CounterMetricFamily("sc_spu_frame_errors", "SPU frames refused, by code", labels=["code"])
        for code, count in sorted(stats.frame_errors.items()):
            frames.add_metric([code], count)
        yield frames
        by_type = CounterMetricFamily("sc_spu_frames", "SPU frames taken in, by type", labels=["type"])
        for kind in SPU_FRAME_TYPES:
            by_type.add_metric([kind], stats.frames.get(kind, 0))
        yield by_type
        offsets = CounterMetricFamily("sc_spu_offsets_entries", "Per-partition live offsets merged (changes only)")
        offsets.add_metric([], self.connections.live.reports)
        yield offsets
        stale = CounterMetricFamily(
            "sc_spu_stale_entries", "Offsets and leadership confirmations dropped for an epoch that is not the SPU's"
        )
        stale.add_metric([], stats.stale_entries)
        yield stale
        paced = CounterMetricFamily(
            "sc_spu_offsets_paced", "Offsets frames an SPU sent sooner than the protocol allows (its reading slowed down)"
        )
        paced.add_metric([], stats.offsets_paced)
        yield paced
        frames_paced = CounterMetricFamily(
            "sc_spu_frames_paced",
            "Times an SPU's reading stopped because its frames came over spu_frame_bytes_per_second",
        )
        frames_paced.add_metric([], stats.frames_paced)
        yield frames_paced
        held = CounterMetricFamily(
            "sc_spu_registrations_held",
            "SPU registrations held before answering (by a standby: no leader to name, or the SPU could not reach it; by a leader that could not renew its claim)",
        )
        held.add_metric([], stats.held)
        yield held
        proposals = CounterMetricFamily("sc_isr_proposals", "In-sync set proposals (AlterIsr) received from leaders")
        proposals.add_metric([], stats.proposals)
        yield proposals
        timeouts = CounterMetricFamily("sc_spu_heartbeat_timeouts", "SPUs dropped for silence")
        timeouts.add_metric([], stats.heartbeat_timeouts)
        yield timeouts
        updates = CounterMetricFamily("sc_spu_updates_sent", "Update frames pushed to SPUs")
        updates.add_metric([], stats.updates_sent)
        yield updates


class _TasksCollector(Collector):
    """The supervised tasks' restarts and failing state, read at scrape time."""

    def __init__(self, supervisor: supervisor_module.Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        restarts = CounterMetricFamily(
            "sc_task_restarts", "Restarts of a long-lived task after an unexpected error", labels=["task"]
        )
        for task, count in sorted(self.supervisor.restarts.items()):
            restarts.add_metric([task], count)
        yield restarts
        failing_now = {failing.task for failing in self.supervisor.failing()}
        failing = GaugeMetricFamily(
            "sc_task_failing", "1 while a task keeps failing (/healthz answers 503 naming it)", labels=["task"]
        )
        for task in sorted(self.supervisor.restarts):
            failing.add_metric([task], 1.0 if task in failing_now else 0.0)
        yield failing


class _ReloadsCollector(Collector):
    """The secret files read again (TLS, credentials, SPU token), read at scrape time; the list
    grows as the daemon starts its parts."""

    def __init__(self, reloadables: list[tls.Reloadable[Any]]) -> None:
        self.reloadables = reloadables

    def collect(self) -> Iterator[CounterMetricFamily]:
        reloads = CounterMetricFamily("sc_file_reloads", "Secret files loaded again since the start, by file", labels=["file"])
        failures = CounterMetricFamily(
            "sc_file_reload_failures",
            "Secret files that changed but did not load (the previous ones stay in place), by file",
            labels=["file"],
        )
        for reloadable in self.reloadables:
            reloads.add_metric([reloadable.name], reloadable.reloads)
            failures.add_metric([reloadable.name], reloadable.failures)
        yield reloads
        yield failures


class _PortsCollector(Collector):
    """The listening ports' connections, refusals and buffered bytes, read at scrape time."""

    def __init__(self, ports: tuple[transport.Port, ...]) -> None:
        self.ports = ports

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        open_now = GaugeMetricFamily("sc_connections_open", "Connections open now, by port", labels=["port"])
        refused = CounterMetricFamily(
            "sc_connections_refused",
            "Connections refused at a limit, or closed because the client was too slow, by port and reason",
            labels=["port", "reason"],
        )
        paused = CounterMetricFamily(
            "sc_accept_paused", "Times accepting paused because accept() failed (out of descriptors)", labels=["port"]
        )
        abandoned = CounterMetricFamily(
            "sc_requests_abandoned", "Requests whose client left in the middle of their body or frame", labels=["port"]
        )
        buffered = GaugeMetricFamily(
            "sc_request_bytes_buffered", "Bytes of large request bodies and frames being received now", labels=["port"]
        )
        suppressed = CounterMetricFamily(
            "sc_log_lines_suppressed", "Log lines about clients left out by the rate limit", labels=["port"]
        )
        for port in self.ports:
            stats = port.stats
            open_now.add_metric([port.name], stats.open)
            for reason in transport.REASONS:
                refused.add_metric([port.name, reason], stats.refused[reason])
            paused.add_metric([port.name], stats.accept_pauses)
            abandoned.add_metric([port.name], stats.abandoned_requests)
            buffered.add_metric([port.name], port.budget.held)
            suppressed.add_metric([port.name], port.log.suppressed_total)
        yield from (open_now, refused, paused, abandoned, buffered, suppressed)
