"""Logging: structlog events and the standard-library records of libraries share one renderer."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, structlog
from controller import config, logs
logs.configure(config.LogFormat.JSON, "info")
structlog.get_logger("sc").info("action applied", key="topics/orders", reason="configuration is valid")
logging.getLogger("store.embedded_etcd").info("etcd started on %s", "127.0.0.1:2379")
logging.getLogger("aiohttp.access").debug("below the level: not shown")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("aiohttp.server").exception("handler failed")
"""


def test_every_line_is_one_json_object_off_a_terminal() -> None:
    # A subprocess: configure() sets the process's root logger, which pytest's own capture uses.
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["event"], line["level"]) for line in lines] == [
        ("action applied", "info"),
        ("etcd started on 127.0.0.1:2379", "info"),
        ("handler failed", "error"),
    ]
    assert lines[0]["key"] == "topics/orders" and lines[0]["reason"] == "configuration is valid"
    assert lines[1]["logger"] == "store.embedded_etcd" and lines[1]["timestamp"].endswith("Z")
    assert "ZeroDivisionError" in lines[2]["exception"]
