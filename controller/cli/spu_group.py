"""`sc spu-group ...`: create, scale, list and delete SPU groups (their managed SPUs are the SC's)."""

from __future__ import annotations

import argparse
from typing import Any

from controller.cli import admin


def _spu_group_create(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {"replicas": args.replicas, "minId": args.min_id}
    if args.rack is not None:
        spec["rack"] = args.rack
    status, group = admin.client_of(args).call("POST", "/v1/spu-groups", {"name": args.name, "spec": spec})
    admin.show_written(args, "spu group", status, group, lambda answer: spu_group_rows([answer]))
    return 0


def _spu_group_scale(args: argparse.Namespace) -> int:
    _, group = admin.client_of(args).call("POST", admin.path("spu-groups", args.name, "scale"), {"replicas": args.replicas})
    for warning in group.get("warnings", []):
        admin.warn(warning)
    admin.show(args, group, lambda answer: spu_group_rows([answer]))
    return 0


def spu_group_rows(groups: list[dict[str, Any]]) -> str:
    rows = [
        [
            group["name"],
            group["spec"]["replicas"],
            group["spec"].get("minId", 0),
            group["spec"].get("rack"),
            admin.resolution_of(group),
            group.get("status", {}).get("reason"),
        ]
        for group in groups
    ]
    return admin.table(["NAME", "REPLICAS", "MIN-ID", "RACK", "RESOLUTION", "REASON"], rows)


def register(parser: argparse.ArgumentParser) -> None:
    groups = admin.Group(parser)
    create_group = groups.command("create", _spu_group_create, "create an SPU group")
    create_group.add_argument("name", metavar="NAME")
    create_group.add_argument("--replicas", type=admin.whole_number, required=True, metavar="N", help="number of SPUs")
    create_group.add_argument("--min-id", type=admin.whole_number, default=0, metavar="M", help="id of the first SPU (default 0)")
    create_group.add_argument("--rack", metavar="R", help="rack given to every SPU of the group")
    scale = groups.command("scale", _spu_group_scale, "change the number of SPUs of a group")
    scale.add_argument("name", metavar="NAME")
    scale.add_argument("--replicas", type=admin.whole_number, required=True, metavar="N", help="number of SPUs")
    groups.command("list", admin.lister("spu-groups", spu_group_rows), "list SPU groups")
    delete_group = groups.command("delete", admin.deleter("spu-groups", "SPU group"), "delete an SPU group and its SPUs")
    delete_group.add_argument("name", metavar="NAME")
