"""The health view: which SPUs are connected right now, as the connection manager sees them.

In memory only (never written to the KV store here); the SPU controller turns it into SPU
resolutions. Listeners are told about every change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class Health(str, enum.Enum):
    ONLINE = "online"  # connected now
    OFFLINE = "offline"  # was connected since this SC started, and is not any more
    UNKNOWN = "unknown"  # has not connected since this SC started


@dataclass(frozen=True, slots=True)
class HealthRecord:
    state: Health
    since: float  # loop time of the last change
    # The connection (incarnation) it is online through; while offline, the last one it had.
    incarnation: int = 0


class HealthView:
    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self._records: dict[int, HealthRecord] = {}
        self._listeners: list[Callable[[int, Health], None]] = []

    def restart(self, now: float) -> None:
        """Forget every SPU, as at a start (a new term of this SC: the SPUs connect to it again).
        Listeners are not told: whoever starts the term looks at every SPU anyway."""
        self.started_at = now
        self._records.clear()

    def subscribe(self, listener: Callable[[int, Health], None]) -> None:
        self._listeners.append(listener)

    def set(self, spu_id: int, state: Health, now: float, incarnation: int | None = None) -> None:
        """``incarnation``: the connection it is online through (None: the one it had)."""
        current = self._records.get(spu_id)
        if incarnation is None:
            incarnation = 0 if current is None else current.incarnation
        if current is not None and current.state is state and current.incarnation == incarnation:
            return
        self._records[spu_id] = HealthRecord(state, now, incarnation)
        for listener in self._listeners:
            listener(spu_id, state)

    def forget(self, spu_id: int) -> None:
        """An SPU no longer registered and not connected: nothing to keep (ids come and go with
        SPU groups and registrations, and every pass copies the records). Listeners are not told:
        it was told offline already, or never connected to this SC."""
        self._records.pop(spu_id, None)

    def known(self) -> list[int]:
        return list(self._records)

    def get(self, spu_id: int) -> Health:
        record = self._records.get(spu_id)
        return Health.UNKNOWN if record is None else record.state

    def snapshot(self) -> Mapping[int, HealthRecord]:
        return dict(self._records)
