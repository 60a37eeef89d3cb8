"""`sc placement compute`: offline placement from a JSON request; the only placement module doing I/O.

Reads stdin or --input, writes the JSON answer on stdout; the work is done by the pure modules.
"""

from __future__ import annotations

import argparse
import json
import sys

from controller import json_input
from controller.placement import codec, engine, model


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `placement` command group to the root `sc` parser."""
    group = commands.add_parser("placement", help="compute replica placements offline (no server needed)")
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
    compute.set_defaults(handler=compute_command)


def compute_command(args: argparse.Namespace) -> int:
    """Print the answer to the request; 0 on success, 1 with an error object on failure."""
    try:
        request = codec.request_from_json(_read_request(args.input))
        result = engine.compute(request)
        answer, status = codec.result_to_json(result, request.spus), 0
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
