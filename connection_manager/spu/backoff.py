"""Exponential backoff with jitter, capped: the delays before reconnecting to the SC or to a leader.

Purely computational, no I/O: the caller sleeps. Randomness comes from the ``random.Random`` given.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays ``initial * multiplier**attempt``, capped at ``maximum``, each drawn in [delay/2, delay].

    Half the delay is kept so retries still back off; the other half is random, so SPUs dropped
    together (an SC restart) do not come back in step.
    """

    def __init__(
        self, initial: float, maximum: float, multiplier: float = 2.0, rng: random.Random | None = None
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got initial {initial!r} and maximum {maximum!r}")
        if multiplier < 1:
            raise ValueError(f"backoff multiplier must be at least 1, got {multiplier!r}")
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.attempt = 0
        self._rng = rng if rng is not None else random.Random()

    def ceiling(self) -> float:
        """The largest delay the next ``next_delay`` can return."""
        # Past the cap the power would overflow a float for no purpose.
        if self.initial * self.multiplier ** min(self.attempt, 64) >= self.maximum:
            return self.maximum
        return self.initial * self.multiplier**self.attempt

    def next_delay(self) -> float:
        ceiling = self.ceiling()
        self.attempt += 1
        return ceiling / 2 + self._rng.random() * ceiling / 2

    def reset(self) -> None:
        """After a success: the next failure waits ``initial`` again."""
        self.attempt = 0
