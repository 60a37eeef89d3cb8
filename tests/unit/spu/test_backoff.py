"""Reconnect delays: exponential, capped, with half of each delay random; and the SPU settings' validation."""

from __future__ import annotations

import random
from typing import Any

import pytest

from connection_manager.spu.backoff import Backoff
from connection_manager.spu.settings import SpuSettings


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("draw", "delays"),
    [
        (0.0, [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]),
        (1.0, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]),
        (0.5, [0.075, 0.15, 0.3, 0.6, 0.75, 0.75]),
    ],
)
def test_delays_double_up_to_the_cap_and_half_of_each_is_jitter(draw: float, delays: list[float]) -> None:
    backoff = Backoff(0.1, 1.0, rng=FixedRandom(draw))
    assert [round(backoff.next_delay(), 9) for _ in delays] == delays


def test_a_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(0.1, 1.0, multiplier=3.0, rng=FixedRandom(1.0))
    assert [round(backoff.next_delay(), 9) for _ in range(3)] == [0.1, 0.3, 0.9]
    backoff.reset()
    assert (backoff.attempt, round(backoff.next_delay(), 9)) == (0, 0.1)


def test_thousands_of_failures_stay_at_the_cap() -> None:
    backoff = Backoff(0.1, 5.0, rng=FixedRandom(1.0))
    for _ in range(5000):
        backoff.next_delay()
    assert backoff.next_delay() == 5.0


def test_real_jitter_stays_within_half_and_all_of_the_ceiling() -> None:
    backoff = Backoff(1.0, 1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(200)]
    assert all(0.5 <= delay <= 1.0 for delay in delays) and len(set(delays)) == 200


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((0.0, 1.0, 2.0), "backoff needs 0 < initial <= maximum, got initial 0.0 and maximum 1.0"),
        ((2.0, 1.0, 2.0), "backoff needs 0 < initial <= maximum, got initial 2.0 and maximum 1.0"),
        ((0.1, 1.0, 0.5), "backoff multiplier must be at least 1, got 0.5"),
    ],
)
def test_invalid_backoffs_are_refused(arguments: tuple[float, float, float], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        Backoff(*arguments)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"append_interval": 0}, "append_interval must be a positive number of seconds, got 0"),
        ({"replica_lag_time": float("nan")}, "replica_lag_time must be a positive number of seconds, got nan"),
        ({"fetch_max_records": -1}, "fetch_max_records must be 0 or more, got -1"),
        ({"sc_ping_timeout": 0.0}, "sc_ping_timeout must be a positive number of seconds or None, got 0.0"),
        ({"sc_ping_timeout": float("inf")}, "sc_ping_timeout must be a positive number of seconds or None, got inf"),
        ({"reconnect_initial": 2.0, "reconnect_max": 1.0}, "reconnect_max (1.0 s) must be at least reconnect_initial (2.0 s)"),
        (
            {"fetch_retry_initial": 2.0, "fetch_retry_max": 1.0},
            "fetch_retry_max (1.0 s) must be at least fetch_retry_initial (2.0 s)",
        ),
    ],
)
def test_invalid_settings_name_the_setting_and_its_value(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        SpuSettings(**changes)
    assert str(refused.value) == message
