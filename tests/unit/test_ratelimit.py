"""Rate-limited logging and the escaped excerpt of a client's bytes (connection_manager/ratelimit.py)."""

from __future__ import annotations

from typing import Any

from connection_manager import ratelimit


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append(("error", event, fields))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_per_interval_and_the_next_says_how_many_were_suppressed() -> None:
    recorder, clock = Recorder(), Clock()
    log = ratelimit.RateLimitedLog(recorder, interval=10.0, clock=clock)
    assert log.warning("junk", "refused", port="public") is True
    assert [log.warning("junk", "refused", port="public") for _ in range(3)] == [False, False, False]
    assert log.info("timeout", "closed", reason="header") is True  # another key is not held back
    clock.now += 9.99
    assert log.warning("junk", "refused", port="public") is False
    clock.now += 0.01
    assert log.warning("junk", "refused", port="public") is True
    clock.now += 10.0
    assert log.warning("junk", "refused", port="public") is True
    assert recorder.lines == [
        ("warning", "refused", {"port": "public"}),
        ("info", "closed", {"reason": "header"}),
        ("warning", "refused", {"port": "public", "suppressed": 4}),
        ("warning", "refused", {"port": "public"}),
    ]
    assert log.suppressed_total == 4


def test_keys_beyond_the_bound_forget_the_expired_ones_first(monkeypatch: Any) -> None:
    monkeypatch.setattr(ratelimit, "MAX_KEYS", 3)
    recorder, clock = Recorder(), Clock()
    log = ratelimit.RateLimitedLog(recorder, interval=10.0, clock=clock)
    for key in ("a", "b", "c"):
        log.error(key, "failed")
    clock.now += 5.0
    assert log.error("a", "failed") is False  # still quiet
    clock.now += 5.0
    assert log.error("d", "failed") is True  # a, b, c expired: forgotten to make room
    assert sorted(log._quiet_until) == ["d"]
    assert log.error("a", "failed") is True
    assert [line[1:] for line in recorder.lines[-2:]] == [("failed", {}), ("failed", {})]


def test_excerpt_quotes_at_most_the_limit_escaped_and_says_how_long_it_was() -> None:
    assert ratelimit.excerpt(b"GET / HTTP/1.1") == "b'GET / HTTP/1.1'"
    assert ratelimit.excerpt(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 100, limit=8) == (
        "b'\\x16\\x03\\x01\\x02\\x00\\x01\\x00\\x01'... (1100 bytes)"
    )
    assert ratelimit.excerpt("naïve\r\nX-Injected: 1", limit=12) == "'na\\xefve\\r\\nX-Inj'... (20 characters)"
    assert len(ratelimit.excerpt(b"Z" * (1 << 20))) == len("b''... (1048576 bytes)") + ratelimit.EXCERPT_BYTES


def test_a_message_is_clipped_only_when_long_or_unprintable() -> None:
    assert ratelimit.clipped("unknown message type 'gossip'") == "unknown message type 'gossip'"
    assert ratelimit.clipped("x" * 64) == "x" * 64
    assert ratelimit.clipped("x" * 65) == "'" + "x" * 64 + "'... (65 characters)"
    assert ratelimit.clipped("a\nb") == "'a\\nb'"
    assert ratelimit.clipped("y" * 100, limit=10) == "'yyyyyyyyyy'... (100 characters)"
