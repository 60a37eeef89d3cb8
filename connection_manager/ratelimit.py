"""Rate-limited logging of events a client can repeat at will, and the short escaped excerpt of a
client's bytes that a log line or a reply may carry. No I/O of its own: it calls the logger it is
given, and its only clock is the one passed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

# The most of a client's bytes (or characters) a log line or a reply may quote.
EXCERPT_BYTES = 64
# Seconds between two lines of the same key.
DEFAULT_INTERVAL = 10.0
# Keys kept at most; beyond, keys whose interval is over are forgotten first.
MAX_KEYS = 1024


def excerpt(data: bytes | bytearray | memoryview | str, limit: int = EXCERPT_BYTES) -> str:
    """At most ``limit`` bytes (or characters) of ``data``, escaped as Python would print them
    (quotes, control and non-ASCII characters escaped), and the full length when it was cut."""
    if isinstance(data, str):
        shown = ascii(data[:limit])
    else:
        shown = repr(bytes(data[:limit]))
    if len(data) > limit:
        return f"{shown}... ({len(data)} {'characters' if isinstance(data, str) else 'bytes'})"
    return shown


def clipped(text: str, limit: int = EXCERPT_BYTES) -> str:
    """``text`` as it is when it is short and printable, else its excerpt: for a message of ours that
    may quote a client's bytes (readable as usual, bounded and escaped when it quotes much)."""
    return text if len(text) <= limit and text.isprintable() else excerpt(text, limit)


class Logger(Protocol):
    """What is needed of a logger (a structlog bound logger has it)."""

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...

    def error(self, event: str, **fields: Any) -> Any: ...


class RateLimitedLog:
    """At most one line per key per interval: the first occurrence is logged at once, later ones
    within the interval are only counted, and the next line logged for that key carries the count
    as ``suppressed``. Keys name the kind of event (``"malformed-http"``, a refusal code); they must
    come from a small set chosen by the code, never from what a client sent."""

    def __init__(
        self, logger: Logger, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.suppressed_total = 0
        self._quiet_until: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def info(self, key: str, event: str, **fields: Any) -> bool:
        return self._log(self.logger.info, key, event, fields)

    def warning(self, key: str, event: str, **fields: Any) -> bool:
        return self._log(self.logger.warning, key, event, fields)

    def error(self, key: str, event: str, **fields: Any) -> bool:
        return self._log(self.logger.error, key, event, fields)

    def _log(self, emit: Callable[..., Any], key: str, event: str, fields: dict[str, Any]) -> bool:
        """True when the line was written, False when it was only counted."""
        now = self.clock()
        quiet_until = self._quiet_until.get(key)
        if quiet_until is not None and now < quiet_until:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.suppressed_total += 1
            return False
        if quiet_until is None and len(self._quiet_until) >= MAX_KEYS:
            self._forget_expired(now)
        self._quiet_until[key] = now + self.interval
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            fields = {**fields, "suppressed": suppressed}
        emit(event, **fields)
        return True

    def _forget_expired(self, now: float) -> None:
        for key in [key for key, until in self._quiet_until.items() if until <= now]:
            del self._quiet_until[key]
            self._suppressed.pop(key, None)
