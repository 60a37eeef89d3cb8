"""What the daemon's parts share: settings, the KV store, the local store, metrics.

Built once by the daemon and passed explicitly (no module-global registries).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from connection_manager import server as cm_server
from controller import config, metrics
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
