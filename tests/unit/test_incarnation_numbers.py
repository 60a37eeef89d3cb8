"""Incarnation numbers (an SPU connection's number, in Accepted) of different SC processes do not
meet: after an SC restart or a standby's takeover, an SPU's new process is not given the number its
previous process had, which a leader's proposal may still name (KIP-903)."""

from __future__ import annotations

from connection_manager import health, lrs, server, wire
from store import local


def manager() -> server.ConnectionManager:
    return server.ConnectionManager(local.LocalStore(), health.HealthView(0.0), lrs.LiveReplicas())


def test_each_sc_process_numbers_its_connections_from_its_own_random_base() -> None:
    bases = [manager()._incarnation_counter for _ in range(20)]
    # Random in [0, 2**52): twenty processes in a row all differ (a repeat is a 1-in-10**13 event).
    assert len(set(bases)) == len(bases)
    assert all(0 <= base < server.INCARNATION_BASE_RANGE == 2**52 for base in bases)


def test_numbers_stay_exact_in_json_and_within_the_wire_limit() -> None:
    # The largest first number, plus as many connections again, is below 2**53 (exact as a JSON
    # number anywhere) and far below what Accepted may carry (2**63 - 1).
    first = server.INCARNATION_BASE_RANGE  # the largest base, plus one
    assert first + server.INCARNATION_BASE_RANGE - 1 < 2**53
    accepted = wire.Accepted(spu_id=0, incarnation=first, heartbeat_timeout=1.0, offsets_interval=1.0)
    assert wire.parse_sc_message(wire.encode(accepted)) == accepted
