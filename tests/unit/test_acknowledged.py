"""The proof the functional tests on real SPU processes end with (tests/fixtures/acknowledged.py)
fails when a record is lost: the checks themselves, on logs and records written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connection_manager.spu import checkpoint, state
from tests.fixtures import acknowledged

PLACED = {"t-0": acknowledged.Placed(leader=1, leader_epoch=2, replicas=(1, 0))}


def write(tmp_path: Path, logs: dict[int, state.Offsets], lines: list[dict[str, Any]]) -> Path:
    for spu_id, offsets in logs.items():
        checkpoint.save(checkpoint.path_for(tmp_path / "data", spu_id), checkpoint.encode({"t-0": offsets}))
    record = tmp_path / "record.jsonl"
    record.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b'{"spu": 0, "ev')
    return record


def ack(spu: int, epoch: int, offset: int, last_epoch: int) -> dict[str, Any]:
    return {"spu": spu, "event": "ack", "partition": "t-0", "epoch": epoch, "offset": offset, "lastEpoch": last_epoch}


# SPU 0 led at epoch 1 (records 0..9), SPU 1 leads at epoch 2 from offset 10.
GOOD = state.Offsets(leo=25, hw=20, epochs=((1, 0), (2, 10)))
LINES = [
    {"spu": 0, "event": "lead", "partition": "t-0", "epoch": 1},
    ack(0, 1, 8, 1),
    {"spu": 1, "event": "lead", "partition": "t-0", "epoch": 2},
    ack(1, 2, 20, 2),
]


def test_every_acknowledged_record_held_at_its_epoch_passes(tmp_path: Path) -> None:
    record = write(tmp_path, {0: GOOD, 1: GOOD}, LINES)
    assert acknowledged.check(record, tmp_path / "data", range(2), PLACED) == {"t-0": 20}
    assert acknowledged.caught_up(acknowledged.read(record), PLACED)
    # A leader that has not acknowledged as far as its predecessor did is not caught up.
    assert not acknowledged.caught_up(acknowledged.read(record), {"t-0": acknowledged.Placed(0, 1, (0, 1))})
    # Nor one whose preferred replica is to lead it next.
    assert not acknowledged.caught_up(acknowledged.read(record), {"t-0": acknowledged.Placed(1, 2, (0, 1))})


@pytest.mark.parametrize(
    ("leader_log", "lines", "message"),
    [
        # The records of epoch 1 were overwritten at epoch 2 (truncated and appended again).
        (state.Offsets(leo=25, hw=20, epochs=((1, 0), (2, 5))), LINES, "acknowledged records lost"),
        # The log ends before what was acknowledged.
        (state.Offsets(leo=15, hw=15, epochs=((1, 0), (2, 10))), LINES, "t-0"),
        # Everything is there but the HW says less was committed.
        (state.Offsets(leo=25, hw=19, epochs=((1, 0), (2, 10))), LINES, "t-0"),
        # Two SPUs took the leadership at one epoch.
        (GOOD, [*LINES, {"spu": 0, "event": "lead", "partition": "t-0", "epoch": 2}], "two leaders"),
    ],
)
def test_a_lost_record_fails(tmp_path: Path, leader_log: state.Offsets, lines: list[dict[str, Any]], message: str) -> None:
    record = write(tmp_path, {0: GOOD, 1: leader_log}, lines)
    with pytest.raises(AssertionError, match=message):
        acknowledged.check(record, tmp_path / "data", range(2), PLACED)


def test_replicas_whose_logs_part_fail(tmp_path: Path) -> None:
    follower = state.Offsets(leo=22, hw=20, epochs=((1, 0), (3, 12)))
    record = write(tmp_path, {0: follower, 1: GOOD}, LINES)
    with pytest.raises(AssertionError, match="t-0"):
        acknowledged.check(record, tmp_path / "data", range(2), PLACED)


def test_settled_needs_the_newest_leaderships_recorded_to_be_those_of_the_sc() -> None:
    """Read with the SPUs frozen and the SC's view read after: a leader change the SC decided and no
    SPU took yet, or one taken after the view was read, is not settled (the check would read the
    log of a leader that is, or is becoming, a follower)."""
    assert acknowledged.settled(LINES, PLACED)
    # The SC elected SPU 0 at epoch 3; nobody has taken it yet.
    assert not acknowledged.settled(LINES, {"t-0": acknowledged.Placed(leader=0, leader_epoch=3, replicas=(0, 1))})
    # SPU 0 took epoch 3 after the view (leader 1 at epoch 2) was read.
    taken_since = [*LINES, {"spu": 0, "event": "lead", "partition": "t-0", "epoch": 3}, ack(0, 3, 20, 2)]
    assert acknowledged.caught_up(taken_since, PLACED)
    assert not acknowledged.settled(taken_since, PLACED)
    # A process of the leader started again takes the same leadership again: still settled.
    assert acknowledged.settled([*LINES, {"spu": 1, "event": "lead", "partition": "t-0", "epoch": 2}], PLACED)
    # Not caught up: not settled either.
    assert not acknowledged.settled(LINES[:3], PLACED)
    assert acknowledged.newest_leaderships(taken_since) == {"t-0": (0, 3)}


def test_a_leader_hw_below_its_acknowledgements_names_the_leaderships_taken(tmp_path: Path) -> None:
    """What the CI failure of a rebalance test said (a leader whose log ends as a follower's)."""
    record = write(tmp_path, {0: GOOD, 1: state.Offsets(leo=25, hw=19, epochs=((1, 0), (2, 10)))}, LINES)
    with pytest.raises(AssertionError, match=r"HW of leader 1 \(leader epoch 2\) on disk is 19, below .* 20.*\(0, 1\), \(1, 2\)"):
        acknowledged.check(record, tmp_path / "data", range(2), PLACED)
