"""The history recorder: framing, sequence numbers, rotation, torn tails, resume point, the bounded queue."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

from store import history

TOPIC = b'{"name":"orders","spec":{"partitions":1,"replicationFactor":1},"status":{"resolution":"Init"}}'


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def open_started(directory: Path, **options: Any) -> history.Recorder:
    recorder = history.Recorder.open(directory, **options)
    await recorder.start()
    return recorder


def read_all(directory: Path, after_seq: int = 0) -> list[dict]:
    return list(history.HistoryReader(directory).records(after_seq))


async def test_records_round_trip_with_sequence_numbers_and_exact_fields(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder = await open_started(tmp_path, clock=clock)
    recorder.record_change("topics", "orders", history.CREATE, 7, TOPIC)
    clock.now += 0.5
    recorder.record_action(
        "topics", "orders", "update-status", "valid config", "", 7, "applied", 8, ["topics/orders"], ""
    )
    recorder.record_change("topics", "orders", history.DELETE, 9, None)
    recorder.record_gap(10, 12, "compacted")
    recorder.record_sync(12, snapshot=True)
    await recorder.close()

    records = read_all(tmp_path)
    assert records == [
        {
            "seq": 1, "type": "change", "kind": "topics", "name": "orders", "op": "create", "revision": 7,
            "source": "watch", "time": 1_700_000_000_000_000, "object": json.loads(TOPIC),
        },
        {
            "seq": 2, "type": "action", "kind": "topics", "name": "orders", "verb": "update-status",
            "reason": "valid config", "cause": "", "causeRevision": 7, "outcome": "applied", "revision": 8,
            "keys": ["topics/orders"], "detail": "", "time": 1_700_000_000_500_000,
        },
        {
            "seq": 3, "type": "change", "kind": "topics", "name": "orders", "op": "delete", "revision": 9,
            "source": "watch", "time": 1_700_000_000_500_000, "object": None,
        },
        {
            "seq": 4, "type": "gap", "firstRevision": 10, "lastRevision": 12, "reason": "compacted", "dropped": 0,
            "time": 1_700_000_000_500_000,
        },
        {"seq": 5, "type": "sync", "revision": 12, "snapshot": True, "time": 1_700_000_000_500_000},
    ]
    assert recorder.stats.recorded == {"change": 2, "action": 1, "gap": 1, "sync": 1}


async def test_segments_rotate_by_size_and_are_named_by_their_first_sequence_number(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path, segment_bytes=1024, clock=FakeClock())
    for revision in range(1, 31):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    await recorder.close()
    names = [path.name for path in history.segment_paths(tmp_path)]
    # Each framed record is 237 or 238 bytes: a segment takes a fifth one (reaching >= 1024), then rotates.
    assert names == [history.segment_name(seq) for seq in (1, 6, 11, 16, 21, 26)]
    assert [record["seq"] for record in read_all(tmp_path)] == list(range(1, 31))
    assert [record["revision"] for record in read_all(tmp_path, after_seq=22)] == list(range(23, 31))

    reopened = await open_started(tmp_path, segment_bytes=1024)
    assert reopened.next_seq == 31
    reopened.record_change("topics", "orders", history.UPDATE, 31, TOPIC)
    await reopened.close()
    assert [record["seq"] for record in read_all(tmp_path, after_seq=29)] == [30, 31]


@pytest.mark.parametrize("cut", [3, 8, 50], ids=["inside-the-frame-header", "after-the-header", "inside-the-payload"])
async def test_a_torn_last_record_is_cut_on_open_and_the_log_goes_on(tmp_path: Path, cut: int) -> None:
    recorder = await open_started(tmp_path)
    for revision in (1, 2, 3):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    await recorder.close()
    [segment] = history.segment_paths(tmp_path)
    whole = segment.stat().st_size
    record_size = whole // 3
    with open(segment, "r+b") as file:
        file.truncate(whole - record_size + cut)  # the third record, torn after `cut` bytes

    reopened = await open_started(tmp_path)
    assert reopened.stats.truncated_bytes == cut
    assert reopened.next_seq == 3
    assert reopened.resume_revision == 2
    reopened.record_change("topics", "orders", history.UPDATE, 4, TOPIC)
    await reopened.close()
    assert [(record["seq"], record["revision"]) for record in read_all(tmp_path)] == [(1, 1), (2, 2), (3, 4)]


async def test_a_record_whose_checksum_fails_ends_the_log_there(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path)
    for revision in (1, 2):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    await recorder.close()
    [segment] = history.segment_paths(tmp_path)
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0xFF  # a flipped byte in the last payload
    segment.write_bytes(bytes(data))

    reopened = await open_started(tmp_path)
    assert reopened.stats.truncated_bytes == len(data) // 2
    await reopened.close()
    assert [record["revision"] for record in read_all(tmp_path)] == [1]


async def test_reading_skips_a_corrupt_middle_segment_tail_and_says_so(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path, segment_bytes=1024, clock=FakeClock())
    for revision in range(1, 13):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    await recorder.close()
    first = history.segment_paths(tmp_path)[0]
    assert first.stat().st_size == 5 * 237  # records 1..5, each of 237 bytes
    data = bytearray(first.read_bytes())
    struct.pack_into("<I", data, 3 * 237, 10**9)  # the fourth record's length is garbage
    first.write_bytes(bytes(data))

    reader = history.HistoryReader(tmp_path)
    assert [record["seq"] for record in reader.records()] == [1, 2, 3, 6, 7, 8, 9, 10, 11, 12]
    assert reader.problems == [history.ReadProblem(first.name, 3 * 237, 2 * 237)]


async def test_the_resume_revision_is_the_last_position_recorded_not_list_records_or_actions(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path)
    assert recorder.resume_revision is None
    recorder.record_change("topics", "orders", history.CREATE, 5, TOPIC, source=history.LIST, snapshot=9)
    assert recorder.resume_revision is None  # a snapshot counts only once its sync record is there
    recorder.record_sync(9, snapshot=True)
    recorder.record_change("topics", "orders", history.UPDATE, 11, TOPIC, source=history.REPLAY)
    recorder.record_action("topics", "orders", "update-status", "", "", 11, "applied", 14, ["topics/orders"])
    assert recorder.resume_revision == 11
    recorder.record_gap(12, 20, "compacted")
    assert recorder.resume_revision == 20
    recorder.record_change("topics", "orders", history.CREATE, 21, TOPIC, source=history.LIST, snapshot=25)
    await recorder.close()

    reopened = history.Recorder.open(tmp_path)
    assert reopened.resume_revision == 20
    await reopened.close()


async def test_a_full_queue_drops_and_counts_records_then_writes_a_gap_naming_their_revisions(tmp_path: Path) -> None:
    recorder = history.Recorder.open(tmp_path, max_queue=3)  # not started: nothing drains the queue
    for revision in range(1, 7):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    recorder.record_action("topics", "orders", "update-status", "", "", 6, "applied", 7, ["topics/orders"])
    assert recorder.queue_depth == 3
    assert recorder.stats.dropped == 4
    await recorder.start()
    await recorder.flush()
    recorder.record_change("topics", "orders", history.UPDATE, 8, TOPIC)
    await recorder.close()
    assert [
        (record["seq"], record["type"], record.get("revision"), record.get("firstRevision"), record.get("dropped"))
        for record in read_all(tmp_path)
    ] == [
        (1, "change", 1, None, None),
        (2, "change", 2, None, None),
        (3, "change", 3, None, None),
        (4, "gap", None, 4, 4),
        (5, "change", 8, None, None),
    ]
    assert read_all(tmp_path)[3]["lastRevision"] == 6
    assert read_all(tmp_path)[3]["reason"] == "queue-full"


async def test_records_after_close_are_dropped_and_counted_not_raised(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path)
    await recorder.close()
    recorder.record_change("topics", "orders", history.UPDATE, 1, TOPIC)
    assert recorder.stats.dropped == 1
    assert read_all(tmp_path) == []


async def test_lag_is_the_age_of_the_oldest_queued_record(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder = history.Recorder.open(tmp_path, clock=clock)
    assert recorder.lag() == 0.0
    recorder.record_change("topics", "orders", history.UPDATE, 1, TOPIC)
    clock.now += 2.5
    recorder.record_change("topics", "orders", history.UPDATE, 2, TOPIC)
    assert recorder.lag() == 2.5
    await recorder.start()
    await recorder.flush()
    assert recorder.lag() == 0.0
    await recorder.close()


async def test_only_one_recorder_per_history_directory(tmp_path: Path) -> None:
    recorder = history.Recorder.open(tmp_path)
    with pytest.raises(history.HistoryLocked, match=r"already used by another running SC"):
        history.Recorder.open(tmp_path)
    await recorder.close()
    again = history.Recorder.open(tmp_path)
    assert again.history_id == recorder.history_id
    await again.close()


def test_a_directory_without_an_id_is_not_a_history(tmp_path: Path) -> None:
    with pytest.raises(history.HistoryError, match=r"is not a history directory: it has no history.id"):
        history.read_history_id(tmp_path)


async def test_the_metrics_read_the_recorder_at_scrape_time(tmp_path: Path) -> None:
    from controller import metrics

    clock = FakeClock()
    recorder = history.Recorder.open(tmp_path, max_queue=2, clock=clock)
    registry = metrics.Metrics()
    registry.watch_history(recorder)
    for revision in (1, 2, 3):
        recorder.record_change("topics", "orders", history.UPDATE, revision, TOPIC)
    clock.now += 1.5
    exposition = registry.exposition().decode()
    for line in (
        "sc_history_queue_depth 2.0",
        "sc_history_lag_seconds 1.5",
        "sc_history_revision 2.0",
        "sc_history_dropped_records_total 1.0",
    ):
        assert line in exposition.splitlines(), line
    await recorder.start()
    await recorder.close()
    assert 'sc_history_records_total{type="change"} 2.0' in registry.exposition().decode().splitlines()
    assert 'sc_history_records_total{type="gap"} 1.0' in registry.exposition().decode().splitlines()


async def test_a_failed_write_is_counted_as_dropped_and_the_log_goes_on_in_a_new_segment(tmp_path: Path) -> None:
    recorder = await open_started(tmp_path, clock=FakeClock())
    recorder.record_change("topics", "orders", history.UPDATE, 1, TOPIC)
    await recorder.flush()
    log = recorder._log
    real_file = log._file

    class FullDisk:
        def write(self, data: bytes) -> int:
            real_file.write(data[:10])  # a partial record reaches the file, then the disk is full
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            real_file.close()

    log._file = FullDisk()
    recorder.record_change("topics", "orders", history.UPDATE, 2, TOPIC)
    await recorder.flush()
    assert recorder.stats.dropped == 1
    recorder.record_change("topics", "orders", history.UPDATE, 3, TOPIC)
    await recorder.close()
    assert [path.name for path in history.segment_paths(tmp_path)] == [history.segment_name(1), history.segment_name(2)]
    assert [(record["seq"], record["revision"]) for record in read_all(tmp_path)] == [(1, 1), (2, 3)]


async def test_a_writer_that_crashes_is_restarted_and_the_log_goes_on_in_a_new_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not an OSError (a file closed underneath the writer): the writer task dies, is logged,
    counted and started again; the batch it held is counted as dropped, the next one is written."""
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    recorder = await open_started(tmp_path, clock=FakeClock())
    recorder.record_change("topics", "orders", history.UPDATE, 1, TOPIC)
    await recorder.flush()
    log = recorder._log
    real_file = log._file

    class ClosedFile:
        def write(self, data: bytes) -> int:
            raise ValueError("I/O operation on closed file.")

        def close(self) -> None:
            real_file.close()

    log._file = ClosedFile()
    recorder.record_change("topics", "orders", history.UPDATE, 2, TOPIC)
    for _ in range(500):
        if caplog.records:
            break
        await asyncio.sleep(0.01)
    recorder.record_change("topics", "orders", history.UPDATE, 3, TOPIC)
    await recorder.close()
    assert [record.getMessage() for record in caplog.records] == [
        "task history-writer failed (ValueError: I/O operation on closed file.); "
        "restarting it in 0.1 s (failure 1 in a row, restart 1)"
    ]
    assert recorder.stats.dropped == 1
    assert [path.name for path in history.segment_paths(tmp_path)] == [history.segment_name(1), history.segment_name(2)]
    assert [(record["seq"], record["revision"]) for record in read_all(tmp_path)] == [(1, 1), (2, 3)]
