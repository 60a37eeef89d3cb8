"""`sc cluster status`: the SCs of the store, which one is active, and since when (GET /v1/cluster)."""

from __future__ import annotations

import argparse
from typing import Any

from controller.cli import admin


def describe_cluster(answer: dict[str, Any]) -> str:
    """The active SC and the standbys, one per line, then this SC and its role."""
    leader = answer.get("leader")
    rows: list[list[object]] = []
    if leader is not None:
        rows.append(["leader", leader["id"], leader["address"], leader["since"], leader["epoch"]])
    rows += [["standby", standby["id"], standby["address"], None, None] for standby in answer.get("standbys", [])]
    this = answer["self"]
    lines = [admin.table(["ROLE", "ID", "ADDRESS", "SINCE", "EPOCH"], rows)] if rows else []
    if leader is None:
        lines.append("no SC holds the store's claim: writes wait until one does")
    lines.append(f"this SC: {admin.cell(this['id'])} ({this['role']}) at {admin.cell(this['address'])}")
    return "\n".join(lines)


def status(args: argparse.Namespace) -> int:
    _, answer = admin.client_of(args).call("GET", "/v1/cluster")
    admin.show(args, answer, describe_cluster)
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    cluster = admin.Group(parser)
    cluster.command("status", status, "show which SC of the store is active, since when, and the standbys")
