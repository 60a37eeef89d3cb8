"""`sc placement compute|rebalance`: offline placement and rebalance plans from a JSON request.

The only placement module doing I/O: reads stdin or --input, writes the JSON answer on stdout;
the work is done by the pure modules. Plug-ins are the ones --placement-plugin names, loaded like
the daemon's; never what the request names.
"""

from __future__ import annotations

import argparse
import json
import sys

from controller import placement_plugins
from controller.api import json_input
from controller.placement import codec, engine, model, planner


def register(group: argparse.ArgumentParser) -> None:
    """Fill the `placement` command group's parser."""
    actions = group.add_subparsers(dest="placement_command", metavar="COMMAND", required=True)
    compute = actions.add_parser(
        "compute",
        help="place a topic's replicas from a JSON request",
        description=(
            'Reads {"spus": [...], "partitions": P, "replicationFactor": R, "strategy": ...} and prints '
            '{"replicaMap": [...], "nextStartIndex": N, "balance": {...}}; exit status 1 with '
            '{"error": {"code", "message"}} when the placement cannot be made.'
        ),
    )
    compute.add_argument("--input", metavar="FILE", default="-", help="request file (default: stdin)")
    compute.add_argument(
        "--placement-plugin",
        dest="placement_plugins",
        action="append",
        default=[],
        metavar="NAME=module:Class",
        help="load a placement plug-in that the request may name as strategy (or plugin) NAME (repeatable)",
    )
    compute.set_defaults(handler=compute_command)
    rebalance = actions.add_parser(
        "rebalance",
        help="plan replica moves that balance the SPUs, from a JSON request",
        description=(
            'Reads {"spus": [{"id", "rack", "online", "decommissioning"}], "partitions": [{"partition": "t-0", '
            '"replicas": [..]}], "maxMovesPerSpu": N} and prints the plan: {"replicaMoves", "lowerBound", '
            '"leaderChanges", "moves": [{"partition", "from", "to"}], "before", "after", ...}; exit status 1 with '
            '{"error": {"code", "message"}} when the request is invalid.'
        ),
    )
    rebalance.add_argument("--input", metavar="FILE", default="-", help="request file (default: stdin)")
    rebalance.set_defaults(handler=rebalance_command)


def compute_command(args: argparse.Namespace) -> int:
    """Print the answer to the request; 0 on success, 1 with an error object on failure (2: a plug-in
    given on the command line cannot be loaded)."""
    try:
        placers = placement_plugins.load(placement_plugins.parse_references(args.placement_plugins))
    except (ValueError, placement_plugins.PluginError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        request = codec.request_from_json(_read_request(args.input))
        result = engine.compute(request, placers)
        answer, status = codec.result_to_json(result, request.spus), 0
    except model.PlacementError as error:
        answer, status = codec.error_to_json(error), 1
    sys.stdout.write(json.dumps(answer) + "\n")
    return status


def rebalance_command(args: argparse.Namespace) -> int:
    """Print the rebalance plan for the request; 0 when planned (even if not balanced), 1 with an error object."""
    try:
        request = codec.rebalance_request_from_json(_read_request(args.input))
        answer, status = codec.plan_to_json(planner.plan(request)), 0
    except model.PlacementError as error:
        answer, status = codec.error_to_json(error), 1
    sys.stdout.write(json.dumps(answer) + "\n")
    return status


def _read_request(path: str) -> object:
    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise model.InvalidConfig(f"cannot read the request from {source}: {error}") from error
    try:
        return json_input.loads(text)
    except json_input.JsonInputError as error:
        raise model.InvalidConfig(f"the request in {source} {error}") from None
