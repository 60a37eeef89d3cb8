"""`sc partition list`: the partitions of every topic, or of one."""

from __future__ import annotations

import argparse
from typing import Any

from controller.cli import admin


def partition_rows(partitions: list[dict[str, Any]]) -> str:
    rows = [
        [
            partition["name"],
            partition["spec"]["leader"],
            partition["spec"]["replicas"],
            admin.resolution_of(partition),
            partition.get("status", {}).get("lrs", 0),
        ]
        for partition in partitions
    ]
    return admin.table(["NAME", "LEADER", "REPLICAS", "RESOLUTION", "LRS"], rows)


def register(parser: argparse.ArgumentParser) -> None:
    partitions = admin.Group(parser)
    list_partitions = partitions.command("list", admin.lister("partitions", partition_rows, by_topic=True), "list partitions")
    list_partitions.add_argument("--topic", metavar="NAME", help="only this topic's partitions")
