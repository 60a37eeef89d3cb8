"""The logs of --data-dir: the snapshot's format, the journal replayed over it, atomic replacement,
and unusable files named with the reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connection_manager.spu import checkpoint
from connection_manager.spu.state import Offsets


def test_logs_are_written_sorted_with_their_epochs_and_read_back(tmp_path: Path) -> None:
    path = checkpoint.path_for(tmp_path, 3)
    assert path == tmp_path / "spu-3" / "offsets.json"
    data = checkpoint.encode({"b-0": Offsets(7, 5, ((0, 0),)), "a-1": Offsets(100, 100, ((1, 0), (4, 60)))})
    assert data == (
        b'{\n "version": 2,\n "partitions": {\n  "a-1": {\n   "leo": 100,\n   "hw": 100,\n   "epochs": [\n    [\n     1,\n     0\n    ],\n'
        b'    [\n     4,\n     60\n    ]\n   ]\n  },\n  "b-0": {\n   "leo": 7,\n   "hw": 5,\n   "epochs": [\n    [\n     0,\n     0\n    ]\n   ]\n  }\n }\n}'
    )
    checkpoint.save(path, data)
    checkpoint.save(path, checkpoint.encode({"a-1": Offsets(120, 110, ((1, 0),))}))
    assert checkpoint.load(path) == {"a-1": Offsets(120, 110, ((1, 0),))}
    assert sorted(p.name for p in path.parent.iterdir()) == ["offsets.json"]  # no temporary file left


def test_the_journal_replays_every_change_since_the_snapshot_and_ignores_a_cut_last_line(tmp_path: Path) -> None:
    path = checkpoint.path_for(tmp_path, 0)
    journal = checkpoint.Journal(path)
    journal.compact({"a-0": Offsets(10, 10, ((1, 0),))})
    journal.write({"a-0": Offsets(20, 15, ((1, 0),)), "b-0": Offsets(5, 0, ((2, 0),))})
    journal.write({"a-0": Offsets(12, 12, ((1, 0), (3, 10)))})  # truncated, then appended at epoch 3
    journal.close()
    with open(checkpoint.journal_path(path), "ab") as file:
        file.write(b'{"partition":"a-0","leo":99')  # the process died while writing this line
    assert checkpoint.load(path) == {"a-0": Offsets(12, 12, ((1, 0), (3, 10))), "b-0": Offsets(5, 0, ((2, 0),))}
    # Folded into a snapshot, the journal starts empty.
    journal = checkpoint.Journal(path)
    journal.compact(checkpoint.load(path))
    journal.close()
    assert checkpoint.journal_path(path).read_bytes() == b""
    assert checkpoint.load(path) == {"a-0": Offsets(12, 12, ((1, 0), (3, 10))), "b-0": Offsets(5, 0, ((2, 0),))}


def test_a_missing_checkpoint_is_a_first_start(tmp_path: Path) -> None:
    assert checkpoint.load(checkpoint.path_for(tmp_path, 0)) == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "checkpoint F is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); delete it to start from offset 0"),
        (
            b'{"version": 1, "partitions": {}}',
            "checkpoint F has format version 1, this SPU reads version 2 (logs with leader epochs); delete it to start from offset 0",
        ),
        (b"[]", "checkpoint F has format version None, this SPU reads version 2 (logs with leader epochs); delete it to start from offset 0"),
        (b'{"version": 2}', "checkpoint F has no 'partitions' object"),
        (
            b'{"version": 2, "partitions": {"t-0": {"leo": 5, "hw": 6, "epochs": []}}}',
            "checkpoint F: partition 't-0' has {'leo': 5, 'hw': 6, 'epochs': []}; expected whole numbers with 0 <= hw <= leo "
            "and epochs as [[epoch, start offset], ...]",
        ),
        (
            b'{"version": 2, "partitions": {"t-0": {"leo": true, "hw": 0, "epochs": []}}}',
            "checkpoint F: partition 't-0' has {'leo': True, 'hw': 0, 'epochs': []}; expected whole numbers with 0 <= hw <= leo "
            "and epochs as [[epoch, start offset], ...]",
        ),
        (
            b'{"version": 2, "partitions": {"t-0": {"leo": 5, "hw": 0, "epochs": [[1]]}}}',
            "checkpoint F: partition 't-0' has {'leo': 5, 'hw': 0, 'epochs': [[1]]}; expected whole numbers with 0 <= hw <= leo "
            "and epochs as [[epoch, start offset], ...]",
        ),
    ],
)
def test_an_unusable_checkpoint_is_refused_naming_the_file_and_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.decode(data, "F")
    assert str(refused.value) == message


def test_a_journal_line_broken_in_the_middle_is_refused(tmp_path: Path) -> None:
    with pytest.raises(checkpoint.CheckpointError, match=r"^journal J: line 1 is not valid JSON; delete the data directory"):
        checkpoint.replay({}, b'{"partition"\n{"partition":"a-0","leo":1,"hw":0,"epochs":[[0,0]]}\n', "J")


def test_a_log_is_saved_with_the_uid_of_its_partition(tmp_path: Path) -> None:
    """So that a restarted process knows which partition of the name each log is of (one deleted
    and created again meanwhile is another). A file without it (written before) is read as before."""
    path = checkpoint.path_for(tmp_path, 0)
    journal = checkpoint.Journal(path)
    journal.compact({"a-0": Offsets(10, 10, ((1, 0),), 5), "b-0": Offsets(3, 3, ((0, 0),))})
    journal.write({"a-0": Offsets(0, 0, (), 9)})  # created again: another log
    journal.close()
    assert checkpoint.load(path) == {"a-0": Offsets(0, 0, (), 9), "b-0": Offsets(3, 3, ((0, 0),))}
    assert b'"uid": 5' in path.read_bytes() and b"uid" not in path.read_bytes().split(b'"b-0"')[1]
    for odd in ("-1", "0", str(2**63), '"5"', "true"):
        with pytest.raises(
            checkpoint.CheckpointError,
            match=rf"^checkpoint F: partition 't-0' has uid {re.escape(odd.replace('true', 'True').replace(chr(34), chr(39)))}; "
            rf"expected a whole number from 1 to {2**63 - 1}",
        ):
            checkpoint.decode(b'{"version": 2, "partitions": {"t-0": {"leo": 0, "hw": 0, "epochs": [], "uid": %s}}}' % odd.encode(), "F")


def test_a_log_saved_with_the_create_revision_of_its_partitions_key_keeps_its_records(tmp_path: Path) -> None:
    """A file of the version before partitions had a uid names their key's create revision
    ("createRevision"), which is no uid: read as a log of no known identity, which keeps its records
    and takes the uid the SC tells next (a copied store gives every key another create revision)."""
    old = b'{"version": 2, "partitions": {"a-0": {"leo": 10, "hw": 10, "epochs": [[1, 0]], "createRevision": 5}}}'
    assert checkpoint.decode(old, "F") == {"a-0": Offsets(10, 10, ((1, 0),))}
    journal = b'{"partition":"a-0","leo":12,"hw":11,"epochs":[[1,0]],"createRevision":5}\n'
    assert checkpoint.replay({}, journal, "J") == {"a-0": Offsets(12, 11, ((1, 0),))}