"""`sc cluster status`: the SCs of the store, which one is active, and since when (GET /v1/cluster);
`sc cluster rebalance`: plan, start, follow or cancel a rebalance (/v1/cluster/rebalance)."""

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


def describe_plan(answer: dict[str, Any]) -> str:
    """The moves (one per line), then the cost against the lower bound and the load before and after."""
    lines = []
    moves = answer["moves"]
    if moves:
        rows = [[move["partition"], _ids(move["from"]), _ids(move["to"])] for move in moves]
        lines.append(admin.table(["PARTITION", "FROM", "TO"], rows))
    before, after = answer["before"], answer["after"]
    spus = sorted(set(before["replicasPerSpu"]) | set(after["replicasPerSpu"]), key=int)
    load = [
        [spu, before["replicasPerSpu"].get(spu, 0), after["replicasPerSpu"].get(spu, 0),
         before["leadersPerSpu"].get(spu, 0), after["leadersPerSpu"].get(spu, 0)]
        for spu in spus
    ]  # fmt: skip
    lines.append(admin.table(["SPU", "REPLICAS BEFORE", "AFTER", "LEADERS BEFORE", "AFTER"], load))
    lines.append(f"{answer['replicaMoves']} replica move(s); lower bound {answer['lowerBound']}")
    lines += [f"note: {note}" for note in answer.get("notes", [])]
    lines += [f"unbalanced: SPU {item['spu']} {item['kind']}: {item['reason']}" for item in answer.get("unreachable", [])]
    state = answer.get("state")
    if state == "running":
        lines.append(f"started, at most {answer['maxMovesPerSpu']} move(s) in flight per SPU: follow it with `sc cluster rebalance --status`")
    elif state == "done":
        lines.append("nothing to move: the cluster is balanced")
    else:
        lines.append("dry run: nothing was changed")
    return "\n".join(lines)


def describe_progress(answer: dict[str, Any]) -> str:
    lines = [f"state: {answer['state']}" + (f" ({answer['kind']})" if answer.get("kind") else "")]
    if answer.get("problem"):
        lines.append(f"the stored run cannot be read: {answer['problem']}")
    if answer["state"] != "idle":
        lines.append(f"moves: {answer['done']} done of {answer['total']}, {answer.get('pending', 0)} not started")
        if answer["inFlight"]:
            lines.append("in flight: " + ", ".join(answer["inFlight"]))
        if answer.get("skipped"):
            lines.append("skipped (partition deleted or changed meanwhile): " + ", ".join(answer["skipped"]))
    return "\n".join(lines)


def _ids(spus: list[int]) -> str:
    return ",".join(str(spu) for spu in spus)


def rebalance(args: argparse.Namespace) -> int:
    sc = admin.client_of(args)
    if args.status:
        _, answer = sc.call("GET", "/v1/cluster/rebalance")
        admin.show(args, answer, describe_progress)
        return 0
    if args.cancel:
        _, answer = sc.call("DELETE", "/v1/cluster/rebalance")
        admin.show(args, answer, lambda cancelled: f"{cancelled['kind']} cancelled: moves in flight go back to where they were")
        return 0
    body = None if args.max_moves_per_spu is None else {"maxMovesPerSpu": args.max_moves_per_spu}
    query = {"dryRun": "true"} if args.dry_run else None
    _, answer = sc.call("POST", "/v1/cluster/rebalance", body, query)
    admin.show(args, answer, describe_plan)
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    cluster = admin.Group(parser)
    cluster.command("status", status, "show which SC of the store is active, since when, and the standbys")
    command = cluster.command(
        "rebalance", rebalance, "plan a rebalance of the replicas over the SPUs and start it; or show or cancel the one running"
    )
    which = command.add_mutually_exclusive_group()
    which.add_argument("--dry-run", action="store_true", help="show the plan only: moves, lower bound, load before and after")
    which.add_argument("--status", action="store_true", help="show the progress of the stored run")
    which.add_argument("--cancel", action="store_true", help="cancel the running rebalance: unfinished moves go back")
    command.add_argument(
        "--max-moves-per-spu", type=admin.whole_number, metavar="N",
        help="moves in flight at once on any SPU (default: the SC's setting rebalance_max_moves_per_spu)",
    )  # fmt: skip
