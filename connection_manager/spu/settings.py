"""The knobs of a simulated SPU: append rate, fetch rate, ISR lag time, heartbeat and retry periods.

Purely computational, no I/O. Every value is validated here, with the offending value in the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpuSettings:
    # A leader appends ``append_records`` records to each partition it leads every ``append_interval`` s.
    append_interval: float = 0.5
    append_records: int = 100
    # A follower fetches from each leader every ``fetch_interval`` s, at most ``fetch_max_records``
    # records a partition a round: catching up 10,000 records takes 1 s by default.
    fetch_interval: float = 0.05
    fetch_max_records: int = 500
    # Kafka's replica.lag.time.max.ms: a follower that has not caught up for this long is proposed
    # out of the in-sync set; one caught up for this long is proposed back in.
    replica_lag_time: float = 2.0
    # How often a leader looks at its in-sync set (and HW) when no fetch or append made it look.
    tick_interval: float = 0.25
    # A proposal the SC refused is not made again before this many seconds (unless its state moves).
    proposal_retry: float = 1.0
    # A heartbeat at most this often apart (and at least four per SC heartbeat timeout).
    heartbeat_interval: float = 2.5
    # Reconnecting to the SC after a drop or a refusal.
    reconnect_initial: float = 0.1
    reconnect_max: float = 5.0
    # While a standby SC refuses this SPU (not-leader), an election may be under way: the SPU asks
    # again this often, without backing off, so that it joins the new leader soon after it leads.
    leader_wait: float = 0.25
    # Reconnecting to a leader's private endpoint, or retrying to listen on our own.
    fetch_retry_initial: float = 0.05
    fetch_retry_max: float = 1.0
    # Longest wait for an SC answer to Register, or a leader's answer to a fetch, before giving up on the connection.
    request_timeout: float = 5.0
    # WebSocket ping period towards the SC, to notice a dead connection that TCP has not reported.
    sc_ping_interval: float = 5.0
    # How long a ping may go unanswered (counting only time this SPU's loop was free to read) before
    # the SPU leaves the connection. None: the SC's heartbeat timeout, as its Accepted says, so that
    # the SPU waits for the SC as long as the SC waits for the SPU (leaving sooner only makes it a
    # new incarnation, a restart to the SC, and no other SC may lead before the claim's lease ends).
    sc_ping_timeout: float | None = None
    # With --data-dir every change of a log is journaled at once (before anything depends on it);
    # the journal is folded into a snapshot this often (and on a clean exit).
    checkpoint_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "append_interval", "fetch_interval", "replica_lag_time", "tick_interval", "proposal_retry",
            "heartbeat_interval", "reconnect_initial", "leader_wait",
            "reconnect_max", "fetch_retry_initial", "fetch_retry_max", "request_timeout", "sc_ping_interval",
            "checkpoint_interval",
        ):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.sc_ping_timeout is not None and not 0 < self.sc_ping_timeout < math.inf:
            raise ValueError(f"sc_ping_timeout must be a positive number of seconds or None, got {self.sc_ping_timeout!r}")
        for name in ("append_records", "fetch_max_records"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value!r}")
        if self.reconnect_max < self.reconnect_initial:
            raise ValueError(
                f"reconnect_max ({self.reconnect_max!r} s) must be at least reconnect_initial ({self.reconnect_initial!r} s)"
            )
        if self.fetch_retry_max < self.fetch_retry_initial:
            raise ValueError(
                f"fetch_retry_max ({self.fetch_retry_max!r} s) must be at least fetch_retry_initial "
                f"({self.fetch_retry_initial!r} s)"
            )
