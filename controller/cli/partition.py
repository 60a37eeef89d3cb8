"""`sc partition list`: the partitions of every topic, or of one, with their leaders' offsets."""

from __future__ import annotations

import argparse
from typing import Any

from controller.cli import admin


def partition_rows(partitions: list[dict[str, Any]]) -> str:
    """Each partition with its leader's offsets (HW: committed, LEO: written); LRS last, as scripts read it."""
    rows = []
    for partition in partitions:
        status = partition.get("status", {})
        leader = status.get("leader") or {}
        rows.append(
            [
                partition["name"],
                partition["spec"]["leader"],
                partition["spec"]["replicas"],
                admin.resolution_of(partition),
                _offset(leader.get("hw")),
                _offset(leader.get("leo")),
                status.get("lrs", 0),
            ]
        )
    return admin.table(["NAME", "LEADER", "REPLICAS", "RESOLUTION", "HW", "LEO", "LRS"], rows)


def _offset(offset: int | None) -> int | None:
    """None (shown "-") for an offset not reported yet (absent, or -1 as on Fluvio's wire)."""
    return None if offset is None or offset < 0 else offset


def register(parser: argparse.ArgumentParser) -> None:
    partitions = admin.Group(parser)
    list_partitions = partitions.command("list", admin.lister("partitions", partition_rows, by_topic=True), "list partitions")
    list_partitions.add_argument("--topic", metavar="NAME", help="only this topic's partitions")
