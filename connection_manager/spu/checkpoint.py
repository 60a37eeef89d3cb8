"""A simulated SPU's logs on disk (``--data-dir``): a snapshot and a journal of every change since,
so a restarted process resumes each replica's LEO, HW and leader epochs.

``encode``/``decode``/``replay`` are pure; ``Journal`` and ``load`` do blocking I/O. A change is
journaled (written to the operating system, which keeps it when the process is killed) before the
SPU acts on it: a follower before it fetches past it, a leader before its HW counts it. The
snapshot is written atomically (temporary file, rename) and then the journal starts afresh.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from connection_manager.spu import state

FORMAT_VERSION = 2
MAX_UID = 2**63 - 1  # as on the wire (connection_manager/wire.py Uid)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong."""


def path_for(data_dir: Path, spu_id: int) -> Path:
    """One directory per SPU, so several SPUs of one process share a data directory."""
    return data_dir / f"spu-{spu_id}" / "offsets.json"


def journal_path(snapshot: Path) -> Path:
    return snapshot.with_name("journal.jsonl")


def _entry(value: state.Offsets) -> dict[str, object]:
    entry: dict[str, object] = {"leo": value.leo, "hw": value.hw, "epochs": [list(run) for run in value.epochs]}
    if value.uid is not None:
        # Which partition of the name the log is of (a file without it is read as before).
        entry["uid"] = value.uid
    return entry


def encode(offsets: Mapping[str, state.Offsets]) -> bytes:
    partitions = {name: _entry(value) for name, value in sorted(offsets.items())}
    return json.dumps({"version": FORMAT_VERSION, "partitions": partitions}, indent=1).encode()


def journal_lines(offsets: Mapping[str, state.Offsets]) -> bytes:
    """One line per changed replica, its whole log state: replaying keeps the last line of each."""
    return b"".join(
        json.dumps({"partition": name, **_entry(value)}, separators=(",", ":")).encode() + b"\n"
        for name, value in sorted(offsets.items())
    )


def decode(data: bytes, source: str) -> dict[str, state.Offsets]:
    try:
        content = json.loads(data)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {source} is not valid JSON ({error}); delete it to start from offset 0") from None
    if not isinstance(content, dict) or content.get("version") != FORMAT_VERSION:
        version = content.get("version") if isinstance(content, dict) else None
        raise CheckpointError(
            f"checkpoint {source} has format version {version!r}, this SPU reads version {FORMAT_VERSION} "
            "(logs with leader epochs); delete it to start from offset 0"
        )
    partitions = content.get("partitions")
    if not isinstance(partitions, dict):
        raise CheckpointError(f"checkpoint {source} has no 'partitions' object")
    return {name: _offsets(name, value, source) for name, value in partitions.items()}


def _offsets(name: str, value: object, source: str) -> state.Offsets:
    valid = isinstance(value, dict) and _offset(value.get("leo")) and _offset(value.get("hw"))
    epochs = value.get("epochs") if isinstance(value, dict) else None
    runs = isinstance(epochs, list) and all(
        isinstance(run, list) and len(run) == 2 and _offset(run[0]) and _offset(run[1]) for run in epochs
    )
    if not isinstance(value, dict) or not valid or not runs or value["hw"] > value["leo"]:
        raise CheckpointError(
            f"checkpoint {source}: partition {name!r} has {value!r}; expected whole numbers with 0 <= hw <= leo "
            "and epochs as [[epoch, start offset], ...]"
        )
    assert isinstance(value, dict) and isinstance(epochs, list)
    # Files of an earlier version of this format may name a "createRevision" instead: the create
    # revision of the partition's key in the SC's store, which is no uid (a copy of the store gives
    # every key another one). It is not read: such a log takes the uid the SC tells next as its own.
    identity = value.get("uid")
    if identity is not None and not (_offset(identity) and 1 <= identity <= MAX_UID):
        raise CheckpointError(
            f"checkpoint {source}: partition {name!r} has uid {identity!r}; expected a whole number from 1 to "
            f"{MAX_UID} (the uid of the partition the log is of)"
        )
    return state.Offsets(value["leo"], value["hw"], tuple((run[0], run[1]) for run in epochs), identity)


def replay(offsets: dict[str, state.Offsets], journal: bytes, source: str) -> dict[str, state.Offsets]:
    """``offsets`` with each journal line applied in order. A last line cut short (the process
    died while writing it) is ignored: what it described was not acted on yet."""
    lines = journal.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise CheckpointError(f"journal {source}: line {number} is not valid JSON; delete the data directory to start afresh") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("partition"), str):
            raise CheckpointError(f"journal {source}: line {number} names no partition")
        offsets[entry["partition"]] = _offsets(entry["partition"], entry, f"{source} line {number}")
    return offsets


def _offset(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load(path: Path) -> dict[str, state.Offsets]:
    """The logs saved at ``path`` and its journal; empty when there is nothing yet (a first start)."""
    offsets: dict[str, state.Offsets] = {}
    try:
        offsets = decode(path.read_bytes(), str(path))
    except FileNotFoundError:
        pass
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
    journal = journal_path(path)
    try:
        data = journal.read_bytes()
    except FileNotFoundError:
        return offsets
    except OSError as error:
        raise CheckpointError(f"cannot read journal {journal}: {error.strerror}") from None
    return replay(offsets, data, str(journal))


def save(path: Path, data: bytes, sync: bool = True) -> None:
    """Replace the file at ``path`` with ``data`` atomically: a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        if sync:
            os.fsync(file.fileno())
    os.replace(temporary, path)
    if sync:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class Journal:
    """The append-only journal next to a snapshot: ``write`` before acting on a change."""

    def __init__(self, snapshot: Path) -> None:
        self.snapshot = snapshot
        self.path = journal_path(snapshot)
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(self.path, "ab")

    def write(self, offsets: Mapping[str, state.Offsets]) -> None:
        if offsets:
            self._file.write(journal_lines(offsets))
            self._file.flush()  # to the operating system: a killed process loses nothing

    def compact(self, offsets: Mapping[str, state.Offsets], sync: bool = False) -> None:
        """Write the snapshot of ``offsets`` (every log now), then start an empty journal."""
        save(self.snapshot, encode(offsets), sync)
        self._file.close()
        self._file = open(self.path, "wb")

    def close(self) -> None:
        self._file.close()
