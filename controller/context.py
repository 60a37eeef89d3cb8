"""What the daemon's parts share: settings, the KV store, the local store, metrics.

Built once by the daemon and passed explicitly (no module-global registries).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from connection_manager import server as cm_server
from controller import config, metrics, placement
from controller.api import admission, auth, decisions as decisions_module, listing, placement_worker as placement_worker_module, read_metrics
from store import active_sc, history, kv, local, supervisor as supervisor_module


@dataclass
class Context:
    settings: config.Settings
    kv_store: kv.KVStore
    local_store: local.LocalStore
    metrics: metrics.Metrics
    # Records every change and action for the audits (None when this SC records no history).
    history: history.Recorder | None = None
    # Set once every kind has been listed and is being watched (/healthz turns 200).
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    # The private server for SPUs (None in a context without one, such as some tests).
    connections: cm_server.ConnectionManager | None = None
    # Runs every long-lived task of this SC, restarting it after a crash (/healthz reads it).
    supervisor: supervisor_module.Supervisor = field(default_factory=supervisor_module.Supervisor)
    # This SC's claim to be the store's active SC (None where nothing claims, such as some tests).
    active: active_sc.ActiveSc | None = None
    # The operator's placement plug-ins, created at start, by the name a topic's strategy gives them.
    placers: placement.Placers = field(default_factory=dict)
    # Who may call the public port (disabled, everyone anonymous, when no credential is configured).
    authenticator: auth.Authenticator = field(default_factory=lambda: auth.Authenticator(None, client_certificates=False))
    # The latest decisions of this SC's controllers, for the live page (/v1/watch/events).
    decisions: decisions_module.Decisions = field(default_factory=decisions_module.Decisions)
    # Built from the settings: the gate every expensive read passes (HTTP and Fluvio alike), the
    # registry of watch streams, and the list answers.
    gate: admission.Gate = field(init=False)
    watchers: admission.Watchers = field(init=False)
    lists: listing.Lists = field(init=False)
    # POST /v1/placement's child process (started at its first request).
    placement_worker: placement_worker_module.PlacementWorker = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self.gate = admission.Gate(settings.max_expensive_requests, settings.max_expensive_queue, settings.expensive_queue_seconds)
        self.watchers = admission.Watchers(settings.max_watchers, settings.max_watchers_per_address)
        self.lists = listing.Lists(self.local_store, self.gate, settings.list_cache_bytes)
        self.placement_worker = placement_worker_module.PlacementWorker(settings.placement_plugins, settings.placement_entry_points)
        self.metrics.watch(read_metrics.ReadsCollector(self.gate, self.watchers, self.lists))
