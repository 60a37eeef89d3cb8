"""`sc topic ...`: create (or dry-run), list, describe and delete topics; add partitions."""

from __future__ import annotations

import argparse
from typing import Any

from controller.api import json_input
from controller.cli import admin


def _topic_create(args: argparse.Namespace) -> int:
    sc = admin.client_of(args)
    if args.replica_assignment is not None:
        computed_flags = [
            flag
            for flag, given in (
                ("--partitions", args.partitions is not None),
                ("--replication-factor", args.replication_factor is not None),
                ("--ignore-rack-assignment", args.ignore_rack_assignment),
                ("--placement-policies", args.placement_policies is not None),
                ("--placement-strategy", args.placement_strategy is not None),
            )
            if given
        ]
        if computed_flags:
            args.usage(f"--replica-assignment cannot be combined with {', '.join(computed_flags)}")
        spec: dict[str, Any] = {"replicaAssignment": _read_assignment(args.replica_assignment)}
    else:
        if args.validate_only:
            args.usage("--validate-only checks a --replica-assignment file; use --dry-run for a computed topic")
        missing = [
            flag
            for flag, value in (("--partitions", args.partitions), ("--replication-factor", args.replication_factor))
            if value is None
        ]
        if missing:
            args.usage(f"a computed topic needs {' and '.join(missing)} (or give --replica-assignment FILE)")
        spec = {"partitions": args.partitions, "replicationFactor": args.replication_factor}
        if args.ignore_rack_assignment:
            spec["ignoreRackAssignment"] = True
        if args.placement_strategy is not None or args.placement_policies is not None:
            placement: dict[str, Any] = {"strategy": args.placement_strategy or "policies"}
            if args.placement_policies is not None:
                placement["policies"] = args.placement_policies
            spec["placement"] = placement
    body = {"name": args.name, "spec": spec}
    if args.dry_run or args.validate_only:
        _, answer = sc.call("POST", "/v1/topics", body, {"dryRun": "true"})
        if args.output == "json":
            admin.print_json(answer)
            return 0
        if args.validate_only:
            print(f"replica assignment {args.replica_assignment} is valid for topic {args.name!r}")
        print(placement_rows(answer))
        return 0
    status, answer = sc.call("POST", "/v1/topics", body)
    admin.show_written(args, "topic", status, answer, lambda topic: topic_rows([topic]))
    return 0


def _read_assignment(path: str) -> list[Any]:
    """A replica assignment file: ``[{"id": 0, "replicas": [..]}, ..]`` (or that list under
    ``replicaAssignment`` or ``partitions``). The SC validates the entries themselves."""
    try:
        with open(path, "rb") as file:
            content = json_input.loads(file.read())
    except OSError as failure:
        raise admin.CliError(f"cannot read the replica assignment file {path!r}: {failure.strerror}") from None
    except json_input.JsonInputError as failure:
        raise admin.CliError(f"replica assignment file {path!r} {failure}") from None
    if isinstance(content, dict):
        for key in ("replicaAssignment", "partitions"):
            if key in content:
                content = content[key]
                break
    if not isinstance(content, list):
        raise admin.CliError(
            f'replica assignment file {path!r} must hold a list like [{{"id": 0, "replicas": [0, 1]}}]'
        )
    return content


def _topic_describe(args: argparse.Namespace) -> int:
    sc = admin.client_of(args)
    _, topic = sc.call("GET", admin.path("topics", args.name))
    if args.output == "json":
        admin.print_json(topic)
        return 0
    partitions = sc.list_all("/v1/partitions", query={"topic": args.name})
    print(describe_topic(topic, partitions))
    return 0


def _topic_add_partitions(args: argparse.Namespace) -> int:
    status, topic = admin.client_of(args).call("POST", admin.path("topics", args.name, "partitions"), {"count": args.count})
    admin.show_written(args, "topic", status, topic, lambda answer: topic_rows([answer]))
    return 0


# ---------------------------------------------------------------------------- output


def topic_rows(topics: list[dict[str, Any]]) -> str:
    rows = []
    for topic in topics:
        spec, status = topic["spec"], topic.get("status", {})
        if "replicaAssignment" in spec:
            partitions: object = len(spec["replicaAssignment"])
            factors = sorted({len(entry["replicas"]) for entry in spec["replicaAssignment"]})
            replication: object = "/".join(str(factor) for factor in factors) + " (manual)"
        else:
            partitions, replication = spec.get("partitions"), spec.get("replicationFactor")
        rows.append([topic["name"], admin.resolution_of(topic), partitions, replication, status.get("reason")])
    return admin.table(["NAME", "RESOLUTION", "PARTITIONS", "REPLICATION", "REASON"], rows)


def placement_rows(answer: dict[str, Any]) -> str:
    rows = [[index, replicas] for index, replicas in enumerate(answer["replicaMap"])]
    text = admin.table(["PARTITION", "REPLICAS"], rows) + f"\nnext start index: {answer['nextStartIndex']}"
    violations = ((answer.get("balance") or {}).get("rackViolations") or {}).get("partitions") or []
    if violations:
        shown = ", ".join(str(partition) for partition in violations[:20]) + (" ..." if len(violations) > 20 else "")
        text += f"\nrack violations: partition{'s' if len(violations) > 1 else ''} {shown} (replicas in fewer racks than they could be)"
    return text


def describe_topic(topic: dict[str, Any], partitions: list[dict[str, Any]]) -> str:
    """The topic's settings, then each partition as Kafka's ``--describe`` shows it: leader, replicas,
    in-sync set, and the lag of its slowest follower."""
    spec, status = topic["spec"], topic.get("status", {})
    lines = [("Name", topic["name"]), ("Resolution", admin.resolution_of(topic))]
    if "replicaAssignment" in spec:
        lines.append(("Assignment", f"manual, {len(spec['replicaAssignment'])} partitions"))
    else:
        placement = spec.get("placement") or {}
        lines += [
            ("Partitions", spec.get("partitions")),
            ("Replication", spec.get("replicationFactor")),
            ("Rack-aware", "no (ignoreRackAssignment)" if spec.get("ignoreRackAssignment") else "yes"),
            ("Strategy", placement.get("strategy", "computed")),
        ]
        if placement.get("policies"):
            lines.append(("Policies", placement["policies"]))
    lines.append(("Reason", status.get("reason")))
    text = "\n".join(f"{label + ':':<13}{admin.cell(value)}" for label, value in lines)
    by_index = {_index(topic["name"], partition["name"]): partition for partition in partitions}
    replica_map = status.get("replicaMap") or {}
    indexes = sorted({*(int(index) for index in replica_map), *(index for index in by_index if index is not None)})
    if indexes:
        rows = [_partition_row(index, replica_map.get(str(index)), by_index.get(index)) for index in indexes]
        table = admin.table(["PARTITION", "LEADER", "REPLICAS", "ISR", "LAG", "RESOLUTION"], rows)
        text += "\nPartitions:\n" + "\n".join("  " + line for line in table.splitlines())
    return text


def _index(topic: str, partition: str) -> int | None:
    """The index of partition ``<topic>-<index>``; None for a name of another shape."""
    index = partition.removeprefix(f"{topic}-")
    return int(index) if index != partition and admin.is_digits(index) and len(index) <= 10 else None


def _partition_row(index: int, mapped: list[int] | None, partition: dict[str, Any] | None) -> list[object]:
    """One partition: from its object once created (its leader may have changed), else from the map."""
    if partition is None:
        return [index, mapped[0] if mapped else None, mapped, None, None, None]
    spec = partition["spec"]
    return [index, spec["leader"], spec["replicas"], in_sync(partition), lag(partition), admin.resolution_of(partition)]


def in_sync(partition: dict[str, Any]) -> list[int] | None:
    """The committed in-sync set the SC stores (store.models.Partition.in_sync): ``status.isr``, or
    every replica while the partition is as created (partition epoch 0), in replica order; None
    before its leader has confirmed it leads."""
    status = partition.get("status", {})
    if not status.get("leader"):
        return None
    replicas = partition["spec"]["replicas"]
    committed = set(replicas) if status.get("partitionEpoch", 0) == 0 else set(status.get("isr", []))
    return [spu for spu in replicas if spu in committed]


def lag(partition: dict[str, Any]) -> int | None:
    """Records the slowest follower is behind the leader's LEO (0 without followers); None before any report."""
    status = partition.get("status", {})
    leader = status.get("leader")
    if not leader:
        return None
    # A follower not reported yet has LEO -1 (nothing): it lacks every record, LEO of them.
    followers = [max(replica["leo"], 0) for replica in status.get("replicas", []) if replica["spu"] != leader["spu"]]
    return max(0, leader["leo"] - min(followers)) if followers else 0


def register(parser: argparse.ArgumentParser) -> None:
    topics = admin.Group(parser)
    create = topics.command("create", _topic_create, "create a topic (waits until it is provisioned or cannot be)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("-p", "--partitions", type=admin.whole_number, metavar="N", help="number of partitions")
    create.add_argument("-r", "--replication-factor", type=admin.whole_number, metavar="R", help="replicas per partition")
    create.add_argument("--ignore-rack-assignment", action="store_true", help="place replicas without regard to racks")
    create.add_argument(
        "--replica-assignment", metavar="FILE", help='manual placement: a JSON file [{"id": 0, "replicas": [0, 1]}, ...]'
    )
    create.add_argument(
        "--validate-only", action="store_true", help="with --replica-assignment: check the file, create nothing"
    )
    create.add_argument(
        "--placement-policies", metavar="POLICIES", help="placement policies, e.g. 'node=..;shard=..;preferred_nodes=..'"
    )
    create.add_argument(
        "--placement-strategy",
        metavar="S",
        help="computed (default), kafka, least-loaded, multi-level, policies, or the NAME of a placement plug-in "
        "configured on the SC (sc run --placement-plugin NAME=module:Class)",
    )
    create.add_argument("--dry-run", action="store_true", help="show the placement the topic would get; create nothing")
    topics.command("list", admin.lister("topics", topic_rows), "list topics")
    describe = topics.command("describe", _topic_describe, "show one topic and its partitions: leader, replicas, in-sync set, lag")
    describe.add_argument("name", metavar="NAME")
    delete = topics.command("delete", admin.deleter("topics", "topic"), "delete a topic and its partitions")
    delete.add_argument("name", metavar="NAME")
    add = topics.command("add-partitions", _topic_add_partitions, "add partitions to a topic")
    add.add_argument("name", metavar="NAME")
    add.add_argument("-c", "--count", type=admin.whole_number, default=1, metavar="N", help="partitions to add (default 1)")
