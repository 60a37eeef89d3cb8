"""What the daemon's parts share: settings, the KV store, the local store, metrics.

Built once by the daemon and passed explicitly (no module-global registries).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from connection_manager import server as cm_server
from controller import admission, config, listing, metrics
from store import history, kv, local


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
    # Wakes the partition controller (set by the pipeline), e.g. after a drain request.
    kick_partitions: Callable[[], None] = lambda: None
    # Built from the settings: the gate every expensive read passes (HTTP and Fluvio alike), the
    # registry of watch streams, and the list answers.
    gate: admission.Gate = field(init=False)
    watchers: admission.Watchers = field(init=False)
    lists: listing.Lists = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self.gate = admission.Gate(settings.max_expensive_requests, settings.max_expensive_queue, settings.expensive_queue_seconds)
        self.watchers = admission.Watchers(settings.max_watchers, settings.max_watchers_per_address)
        self.lists = listing.Lists(self.local_store, self.gate, settings.list_cache_bytes)
        self.metrics.watch_reads(self.gate, self.watchers, self.lists)
