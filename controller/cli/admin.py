"""What the commands that call the SC's HTTP API share (topic, spu, spu-group, partition): the --sc
and -o flags, tables and JSON output, warnings, and errors with exit status 1 (on stderr, or with
``-o json`` as ``{"error": {"code", "message"}}`` on stdout).

Decides nothing itself: every check and verdict is the SC's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controller.api import client

DEFAULT_ADDRESS = "http://127.0.0.1:9003"
# The largest number a flag takes: the largest SPU id, above every count and timeout.
MAX_WHOLE_NUMBER = 2**31 - 1


class CliError(Exception):
    """Printed as ``error: <message>`` (or a JSON error object with ``code``); the command exits with status 1."""

    def __init__(self, message: str, code: str = "InvalidInput") -> None:
        super().__init__(message)
        self.code = code


def address(args: argparse.Namespace) -> str:
    return args.sc or os.environ.get("SC_ADDR") or DEFAULT_ADDRESS


def client_of(args: argparse.Namespace) -> client.Client:
    """A client of the SC at --sc, with --token (else $SC_TOKEN) and --ca (else $SC_CA) if given."""
    token = getattr(args, "token", None) or os.environ.get("SC_TOKEN") or None
    ca = getattr(args, "ca", None) or os.environ.get("SC_CA") or None
    return client.Client(address(args), token=token, ca=Path(ca) if ca else None)


# ---------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned with two spaces between them; no trailing spaces."""
    cells = [[str(header) for header in headers]] + [[cell(value) for value in row] for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(headers))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(lines)


def cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value)


def print_json(answer: Any) -> None:
    print(json.dumps(answer, indent=2))


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def resolution_of(obj: dict[str, Any]) -> str:
    return str(obj.get("status", {}).get("resolution", "-"))


# ---------------------------------------------------------------------------- command helpers


def show(args: argparse.Namespace, answer: Any, human: Callable[[Any], str]) -> None:
    if args.output == "json":
        print_json(answer)
    else:
        print(human(answer))


def show_written(args: argparse.Namespace, kind: str, status: int, obj: dict[str, Any], human: Callable[[Any], str]) -> None:
    """What a create shows: the object, then a failure if the SC has not made it usable (with -o json
    the error object alone, so that stdout holds one JSON document)."""
    if args.output != "json":
        show(args, obj, human)
    report_pending(kind, status, obj)
    if args.output == "json":
        show(args, obj, human)


def report_pending(kind: str, status: int, obj: dict[str, Any]) -> None:
    """A 202: written, but the controller has not (or not yet) made it usable: a failure, as with
    Kafka's tool, though what was written stays (the SC finishes it once it can)."""
    if status != 202:
        return
    resolution = resolution_of(obj)
    reason = obj.get("status", {}).get("reason")
    name = obj["name"]
    command = kind.replace(" ", "-")
    if resolution == "InsufficientResources":
        raise CliError(
            f"{kind} {name!r} is not provisioned: {reason}; it was kept and will be provisioned once enough SPUs "
            f"are online (or delete it: sc {command} delete {name})",
            code=resolution,
        )
    # The reason, when the SC gave one (etcd refusing its writes, say), is what the operator needs.
    because = f": {reason}" if reason else ""
    raise CliError(
        f"{kind} {name!r} was written but the SC has not finished with it yet (resolution {resolution}{because}); "
        f"check it with `sc {command} list`",
        code="Pending",
    )


def report_deleted(args: argparse.Namespace, kind: str, name: str, answer: dict[str, Any]) -> None:
    for warning in answer.get("warnings", []):
        warn(warning)
    if args.output == "json":
        print_json(answer)
    else:
        print(f"{kind} {name!r} deleted")


def path(kind: str, name: str, *more: str) -> str:
    return "/".join(["/v1", kind, urllib.parse.quote(name, safe=""), *more])


def lister(kind: str, human: Callable[[Any], str], by_topic: bool = False) -> Callable[[argparse.Namespace], int]:
    def list_objects(args: argparse.Namespace) -> int:
        query = {"topic": args.topic} if by_topic and args.topic is not None else None
        objects = client_of(args).list_all(f"/v1/{kind}", query=query)
        show(args, objects, human)
        return 0

    return list_objects


def deleter(kind: str, label: str) -> Callable[[argparse.Namespace], int]:
    def delete(args: argparse.Namespace) -> int:
        _, answer = client_of(args).call("DELETE", path(kind, args.name))
        report_deleted(args, label, args.name, answer)
        return 0

    return delete


# ---------------------------------------------------------------------------- argparse


def run(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (CliError, client.ClientError) as failure:
            if args.output == "json":
                print_json({"error": {"code": failure.code, "message": str(failure)}})
            else:
                print(f"error: {failure}", file=sys.stderr)
            return 1

    return run


def whole_number(text: str) -> int:
    """A command-line whole number: ASCII digits, at most MAX_WHOLE_NUMBER (checked before int(),
    which gives up at 4,300 digits)."""
    if not is_digits(text):
        raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a whole number")
    digits = text.lstrip("0") or "0"  # int() counts leading zeros towards its limit too
    if len(digits) > len(str(MAX_WHOLE_NUMBER)) or int(digits) > MAX_WHOLE_NUMBER:
        raise argparse.ArgumentTypeError(f"{shown(text)} is above {MAX_WHOLE_NUMBER}, the largest value here")
    return int(digits)


def is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # "²".isdigit() is true, and int() refuses it


def shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


# The global flags' values when no command line gives them.
GLOBAL_DEFAULTS = {"sc": None, "output": "table", "token": None, "ca": None}


def add_global_flags(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """--sc, -o, --token and --ca: on the root parser with GLOBAL_DEFAULTS, and again on each command calling the
    SC with no default (SUPPRESS), so that they go before or after the command and the one nearest
    the command wins."""
    parser.add_argument(
        "--sc", metavar="URL", default=defaults.get("sc", argparse.SUPPRESS),
        help=f"the SC's public address (default: $SC_ADDR, else {DEFAULT_ADDRESS})",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", choices=["table", "json"], default=defaults.get("output", argparse.SUPPRESS),
        help="table (default) or json; with json, errors are a JSON object on stdout too",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=defaults.get("token", argparse.SUPPRESS),
        help="bearer token of the SC's --auth-tokens file (default: $SC_TOKEN)",
    )  # fmt: skip
    parser.add_argument(
        "--ca", metavar="FILE", default=defaults.get("ca", argparse.SUPPRESS),
        help="PEM CA that signed the SC's certificate, for an https:// --sc (default: $SC_CA)",
    )  # fmt: skip


def common() -> argparse.ArgumentParser:
    """The flags of every command that calls the SC (a parent parser): --sc, -o, --token, --ca."""
    parser = argparse.ArgumentParser(add_help=False)
    add_global_flags(parser, {})
    return parser


class Group:
    """The subcommands of one command group (``sc topic ...``), each with the common flags."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.subcommands = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
        self._common = common()

    def command(self, name: str, handler: Callable[[argparse.Namespace], int], summary: str) -> argparse.ArgumentParser:
        parser = self.subcommands.add_parser(name, parents=[self._common], help=summary, description=summary)
        parser.set_defaults(handler=run(handler), usage=parser.error)
        return parser
