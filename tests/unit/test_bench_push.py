"""bench/push.py checks, on a seeded provisioning burst, that the pusher tells every SPU what the
plain reading of the rule tells it. Run small here, so that the check (and the bench) cannot rot
unseen: once partitions had a random uid, the bench stopped at that check for two sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_push_bench_finds_the_pusher_telling_what_the_plain_rule_tells() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "push.py"), "--topics", "20", "--spus", "10", "--repeat", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "push (by SPU, states shared)" in ran.stdout, ran.stdout
