"""The offsets checkpoint of --data-dir: its format, atomic replacement, and unusable files named with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from connection_manager.spu import checkpoint
from connection_manager.spu.state import Offsets


def test_offsets_are_written_sorted_and_read_back(tmp_path: Path) -> None:
    path = checkpoint.path_for(tmp_path, 3)
    assert path == tmp_path / "spu-3" / "offsets.json"
    data = checkpoint.encode({"b-0": Offsets(7, 5), "a-1": Offsets(100, 100)})
    assert data == b'{\n "version": 1,\n "partitions": {\n  "a-1": {\n   "leo": 100,\n   "hw": 100\n  },\n  "b-0": {\n   "leo": 7,\n   "hw": 5\n  }\n }\n}'
    checkpoint.save(path, data)
    checkpoint.save(path, checkpoint.encode({"a-1": Offsets(120, 110)}))
    assert checkpoint.load(path) == {"a-1": Offsets(120, 110)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["offsets.json"]  # no temporary file left


def test_a_missing_checkpoint_is_a_first_start(tmp_path: Path) -> None:
    assert checkpoint.load(checkpoint.path_for(tmp_path, 0)) == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "checkpoint F is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); delete it to start from offset 0"),
        (b'{"version": 2, "partitions": {}}', "checkpoint F has format version 2, this SPU reads version 1"),
        (b"[]", "checkpoint F has format version None, this SPU reads version 1"),
        (b'{"version": 1}', "checkpoint F has no 'partitions' object"),
        (
            b'{"version": 1, "partitions": {"t-0": {"leo": 5, "hw": 6}}}',
            "checkpoint F: partition 't-0' has {'leo': 5, 'hw': 6}; expected whole numbers with 0 <= hw <= leo",
        ),
        (
            b'{"version": 1, "partitions": {"t-0": {"leo": true, "hw": 0}}}',
            "checkpoint F: partition 't-0' has {'leo': True, 'hw': 0}; expected whole numbers with 0 <= hw <= leo",
        ),
        (
            b'{"version": 1, "partitions": {"t-0": 5}}',
            "checkpoint F: partition 't-0' has 5; expected whole numbers with 0 <= hw <= leo",
        ),
    ],
)
def test_an_unusable_checkpoint_is_refused_naming_the_file_and_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.decode(data, "F")
    assert str(refused.value) == message
