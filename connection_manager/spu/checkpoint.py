"""A simulated SPU's offsets on disk (``--data-dir``), so a restarted process resumes its LEOs.

``encode``/``decode`` are pure; ``save`` writes atomically (temporary file, fsync, rename) and
``load`` reads, both blocking: the simulator runs them in a thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from connection_manager.spu import state

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong."""


def path_for(data_dir: Path, spu_id: int) -> Path:
    """One file per SPU, so several SPUs of one process share a data directory."""
    return data_dir / f"spu-{spu_id}" / "offsets.json"


def encode(offsets: Mapping[str, state.Offsets]) -> bytes:
    partitions = {name: {"leo": value.leo, "hw": value.hw} for name, value in sorted(offsets.items())}
    return json.dumps({"version": FORMAT_VERSION, "partitions": partitions}, indent=1).encode()


def decode(data: bytes, source: str) -> dict[str, state.Offsets]:
    try:
        content = json.loads(data)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {source} is not valid JSON ({error}); delete it to start from offset 0") from None
    if not isinstance(content, dict) or content.get("version") != FORMAT_VERSION:
        version = content.get("version") if isinstance(content, dict) else None
        raise CheckpointError(
            f"checkpoint {source} has format version {version!r}, this SPU reads version {FORMAT_VERSION}"
        )
    partitions = content.get("partitions")
    if not isinstance(partitions, dict):
        raise CheckpointError(f"checkpoint {source} has no 'partitions' object")
    offsets: dict[str, state.Offsets] = {}
    for name, value in partitions.items():
        valid = isinstance(value, dict) and _offset(value.get("leo")) and _offset(value.get("hw"))
        if not valid or value["hw"] > value["leo"]:
            raise CheckpointError(
                f"checkpoint {source}: partition {name!r} has {value!r}; expected whole numbers with 0 <= hw <= leo"
            )
        offsets[name] = state.Offsets(value["leo"], value["hw"])
    return offsets


def _offset(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load(path: Path) -> dict[str, state.Offsets]:
    """The offsets saved at ``path``; empty when there is no file yet (a first start)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
    return decode(data, str(path))


def save(path: Path, data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` atomically: a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
