"""The admin commands of `sc` (topic, spu, spu-group, partition): HTTP calls to the public API.

Owns flags, the requests they become, and the output (aligned tables, or JSON with -o json);
decides nothing itself: every check and verdict is the SC's. Errors go to stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from controller.api import json_input

DEFAULT_ADDRESS = "http://127.0.0.1:9003"
# The SC waits up to 30 s for a topic's verdict; leave it room to answer.
REQUEST_TIMEOUT = 60.0
# The largest number a flag takes: the largest SPU id, above every count and timeout.
MAX_WHOLE_NUMBER = 2**31 - 1
# Lists are read in pages of this many objects, each page a short request for the SC.
PAGE_SIZE = 1000
# A read the SC refuses for load (429) is tried again after its Retry-After, this many times.
BUSY_RETRIES = 5
# The longest Retry-After honoured: a longer one is the SC's business, not a reason to hang.
MAX_RETRY_AFTER = 10.0


class CliError(Exception):
    """Printed as ``error: <message>``; the command exits with status 1."""


# ---------------------------------------------------------------------------- talking to the SC


class Client:
    def __init__(self, address: str) -> None:
        address = address.strip().rstrip("/")
        if "://" not in address:
            address = f"http://{address}"
        self.address = address

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
        """(status, decoded JSON answer) for any status below 400; raises CliError for the others."""
        status, _, answer = self.exchange(method, path, body, query)
        return status, answer

    def list_all(self, path: str, query: dict[str, str] | None = None) -> list[Any]:
        """Every object of a list, read page by page (?limit=, following X-Continue)."""
        objects: list[Any] = []
        token = None
        while True:
            page_query = {**(query or {}), "limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            _, headers, page = self.exchange("GET", path, query=page_query)
            if not isinstance(page, list):
                raise CliError(f"the SC answered a list with {str(page)[:200]}")
            objects.extend(page)
            token = headers.get("X-Continue")
            if not token:
                return objects

    def exchange(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        """(status, headers, decoded answer) for any status below 400; reads refused for load are retried."""
        url = self.address + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(BUSY_RETRIES + 1):
            request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                    return response.status, dict(response.headers), _decode(response.read())
            except urllib.error.HTTPError as failure:
                answer = _decode(failure.read())
                retry_after = failure.headers.get("Retry-After", "")
                failure.close()
                if failure.code == 429 and method == "GET" and attempt < BUSY_RETRIES and retry_after.isdigit():
                    time.sleep(min(float(retry_after), MAX_RETRY_AFTER))
                    continue
                raise CliError(_error_message(failure.code, answer)) from None
            except urllib.error.URLError as failure:
                if isinstance(failure.reason, ConnectionRefusedError):
                    raise CliError(
                        f"cannot reach the SC at {self.address}: connection refused. Is it running? "
                        "Start it with `sc run`, or point to it with --sc URL or SC_ADDR"
                    ) from None
                raise CliError(f"cannot reach the SC at {self.address}: {failure.reason}") from None
            except TimeoutError:
                raise CliError(f"the SC at {self.address} did not answer within {REQUEST_TIMEOUT:g} s") from None
            except (ConnectionError, ValueError) as failure:
                raise CliError(f"cannot talk to the SC at {self.address}: {failure}") from None
        raise AssertionError("unreachable: the last attempt returns or raises")


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _error_message(status: int, answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", answer["error"]))
    return f"the SC answered HTTP {status}: {str(answer)[:200]}"


def _address(args: argparse.Namespace) -> str:
    return args.sc or os.environ.get("SC_ADDR") or DEFAULT_ADDRESS


# ---------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned with two spaces between them; no trailing spaces."""
    cells = [[str(header) for header in headers]] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(headers))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip() for line in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value)


def _print_json(answer: Any) -> None:
    print(json.dumps(answer, indent=2))


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _resolution(obj: dict[str, Any]) -> str:
    return str(obj.get("status", {}).get("resolution", "-"))


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
        rows.append([topic["name"], _resolution(topic), partitions, replication, status.get("reason")])
    return table(["NAME", "RESOLUTION", "PARTITIONS", "REPLICATION", "REASON"], rows)


def partition_rows(partitions: list[dict[str, Any]]) -> str:
    rows = [
        [
            partition["name"],
            partition["spec"]["leader"],
            partition["spec"]["replicas"],
            _resolution(partition),
            partition.get("status", {}).get("lrs", 0),
        ]
        for partition in partitions
    ]
    return table(["NAME", "LEADER", "REPLICAS", "RESOLUTION", "LRS"], rows)


def _endpoint(endpoint: dict[str, Any] | None) -> str:
    if not endpoint:
        return "-"
    host = endpoint["host"]
    return f"[{host}]:{endpoint['port']}" if ":" in host else f"{host}:{endpoint['port']}"


def _drain(spu: dict[str, Any]) -> str | None:
    """Draining or Drained while a drain is asked for (Draining until the SC has looked)."""
    if not spu["spec"].get("drain"):
        return None
    return str(spu.get("status", {}).get("drain") or "Draining")


def spu_rows(spus: list[dict[str, Any]]) -> str:
    rows = [
        [
            spu["spec"]["id"],
            spu["name"],
            spu["spec"].get("spuType", "Custom"),
            spu["spec"].get("rack"),
            _resolution(spu),
            _drain(spu),
            _endpoint(spu["spec"].get("publicEndpoint")),
            _endpoint(spu["spec"].get("privateEndpoint")),
        ]
        for spu in spus
    ]
    return table(["ID", "NAME", "TYPE", "RACK", "RESOLUTION", "DRAIN", "PUBLIC", "PRIVATE"], rows)


def spu_group_rows(groups: list[dict[str, Any]]) -> str:
    rows = [
        [
            group["name"],
            group["spec"]["replicas"],
            group["spec"].get("minId", 0),
            group["spec"].get("rack"),
            _resolution(group),
            group.get("status", {}).get("reason"),
        ]
        for group in groups
    ]
    return table(["NAME", "REPLICAS", "MIN-ID", "RACK", "RESOLUTION", "REASON"], rows)


def placement_rows(answer: dict[str, Any]) -> str:
    rows = [[index, replicas] for index, replicas in enumerate(answer["replicaMap"])]
    text = table(["PARTITION", "REPLICAS"], rows) + f"\nnext start index: {answer['nextStartIndex']}"
    violations = ((answer.get("balance") or {}).get("rackViolations") or {}).get("partitions") or []
    if violations:
        shown = ", ".join(str(partition) for partition in violations[:20]) + (" ..." if len(violations) > 20 else "")
        text += f"\nrack violations: partition{'s' if len(violations) > 1 else ''} {shown} (replicas in fewer racks than they could be)"
    return text


def describe_topic(topic: dict[str, Any]) -> str:
    spec, status = topic["spec"], topic.get("status", {})
    lines = [("Name", topic["name"]), ("Resolution", _resolution(topic))]
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
    text = "\n".join(f"{label + ':':<13}{_cell(value)}" for label, value in lines)
    replica_map = status.get("replicaMap") or {}
    if replica_map:
        rows = [[index, replica_map[index]] for index in sorted(replica_map, key=int)]
        text += "\nReplica map:\n" + "\n".join("  " + line for line in table(["PARTITION", "REPLICAS"], rows).splitlines())
    return text


# ---------------------------------------------------------------------------- command helpers


def _show(args: argparse.Namespace, answer: Any, human: Callable[[Any], str]) -> None:
    if args.output == "json":
        _print_json(answer)
    else:
        print(human(answer))


def _report_pending(kind: str, status: int, obj: dict[str, Any]) -> None:
    """A 202: written, but the controller has not (or not yet) made it usable."""
    if status != 202:
        return
    resolution = _resolution(obj)
    reason = obj.get("status", {}).get("reason")
    if resolution == "InsufficientResources":
        _warn(f"{kind} {obj['name']!r} is not provisioned yet: {reason}; it will be once enough SPUs are online")
    else:
        _warn(
            f"{kind} {obj['name']!r} was written but the SC has not finished with it yet "
            f"(resolution {resolution}); check it with `sc {kind.replace(' ', '-')} list`"
        )


def _report_deleted(args: argparse.Namespace, kind: str, name: str, answer: dict[str, Any]) -> None:
    for warning in answer.get("warnings", []):
        _warn(warning)
    if args.output == "json":
        _print_json(answer)
    else:
        print(f"{kind} {name!r} deleted")


def _path(kind: str, name: str, *more: str) -> str:
    return "/".join(["/v1", kind, urllib.parse.quote(name, safe=""), *more])


def _lister(kind: str, human: Callable[[Any], str], by_topic: bool = False) -> Callable[[argparse.Namespace], int]:
    def list_objects(args: argparse.Namespace) -> int:
        query = {"topic": args.topic} if by_topic and args.topic is not None else None
        objects = Client(_address(args)).list_all(f"/v1/{kind}", query=query)
        _show(args, objects, human)
        return 0

    return list_objects


def _deleter(kind: str, label: str) -> Callable[[argparse.Namespace], int]:
    def delete(args: argparse.Namespace) -> int:
        _, answer = Client(_address(args)).call("DELETE", _path(kind, args.name))
        _report_deleted(args, label, args.name, answer)
        return 0

    return delete


# ---------------------------------------------------------------------------- topic


def _topic_create(args: argparse.Namespace) -> int:
    client = Client(_address(args))
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
        _, answer = client.call("POST", "/v1/topics", body, {"dryRun": "true"})
        if args.output == "json":
            _print_json(answer)
            return 0
        if args.validate_only:
            print(f"replica assignment {args.replica_assignment} is valid for topic {args.name!r}")
        print(placement_rows(answer))
        return 0
    status, answer = client.call("POST", "/v1/topics", body)
    _show(args, answer, lambda topic: topic_rows([topic]))
    _report_pending("topic", status, answer)
    return 0


def _read_assignment(path: str) -> list[Any]:
    """A replica assignment file: ``[{"id": 0, "replicas": [..]}, ..]`` (or that list under
    ``replicaAssignment`` or ``partitions``). The SC validates the entries themselves."""
    try:
        with open(path, "rb") as file:
            content = json_input.loads(file.read())
    except OSError as failure:
        raise CliError(f"cannot read the replica assignment file {path!r}: {failure.strerror}") from None
    except json_input.JsonInputError as failure:
        raise CliError(f"replica assignment file {path!r} {failure}") from None
    if isinstance(content, dict):
        for key in ("replicaAssignment", "partitions"):
            if key in content:
                content = content[key]
                break
    if not isinstance(content, list):
        raise CliError(
            f'replica assignment file {path!r} must hold a list like [{{"id": 0, "replicas": [0, 1]}}]'
        )
    return content


def _topic_describe(args: argparse.Namespace) -> int:
    _, topic = Client(_address(args)).call("GET", _path("topics", args.name))
    _show(args, topic, describe_topic)
    return 0


def _topic_add_partitions(args: argparse.Namespace) -> int:
    status, topic = Client(_address(args)).call("POST", _path("topics", args.name, "partitions"), {"count": args.count})
    _show(args, topic, lambda answer: topic_rows([answer]))
    _report_pending("topic", status, topic)
    return 0


# ---------------------------------------------------------------------------- spu


def _server_address(text: str) -> dict[str, Any]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as an endpoint (the SC checks the port's range)."""
    host, separator, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not _is_digits(port) or len(port) > 5:
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not HOST:PORT")
    return {"host": host, "port": int(port)}


def _spu_register(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {
        "id": args.id,
        "spuType": "Custom",
        "publicEndpoint": args.public_server,
        "privateEndpoint": args.private_server,
    }
    if args.rack is not None:
        spec["rack"] = args.rack
    _, spu = Client(_address(args)).call("POST", "/v1/spus", {"name": args.spu_name, "spec": spec})
    _show(args, spu, lambda answer: spu_rows([answer]))
    return 0


def _spu_name_of(client: Client, spu_id: int) -> str:
    spus = client.list_all("/v1/spus")
    matching = [spu["name"] for spu in spus if spu["spec"]["id"] == spu_id]
    if not matching:
        raise CliError(f"no SPU has id {spu_id}")
    return str(matching[0])


def _spu_unregister(args: argparse.Namespace) -> int:
    if (args.name is None) == (args.id is None):
        args.usage("name the SPU to unregister: give its NAME or --id ID (one of them)")
    client = Client(_address(args))
    name = args.name if args.name is not None else _spu_name_of(client, args.id)
    _, answer = client.call("DELETE", _path("spus", name))
    _report_deleted(args, "SPU", name, answer)
    return 0


def _spu_drain(args: argparse.Namespace) -> int:
    """Controlled shutdown: every leadership moves off the SPU before it is stopped. Exit status
    1 while it still leads something (it stays draining): stopping it then would leave those
    partitions without a leader."""
    client = Client(_address(args))
    name = _spu_by_id_or_name(client, args.spu)
    query = {"timeout": str(args.timeout_ms), **({"force": "true"} if args.force else {})}
    _, answer = client.call("POST", _path("spus", name, "drain"), query=query)
    who = f"SPU {answer['spu']} ({answer['name']})"
    if args.output == "json":
        _print_json(answer)
    elif answer["drained"]:
        print(f"{who} leads no partition: it can be stopped")
    else:
        moved = ", ".join(f"{move['partition']} to SPU {move['to']}" for move in answer["moved"]) or "none"
        print(f"{who} is draining; leaderships moved: {moved}")
    if answer["drained"]:
        return 0
    left = "; ".join(f"{item['partition']}: {item['reason']}" for item in answer.get("blocked", []))
    print(
        f"error: {who} still leads {len(answer['leading'])} partition(s), so it cannot be stopped yet ({left}); "
        f"it stays draining, and `sc spu undrain {answer['spu']}` cancels the drain",
        file=sys.stderr,
    )
    return 1


def _spu_by_id_or_name(client: Client, spu: str) -> str:
    """The name of the SPU an argument names: a number is an id (no SPU id has more than 10 digits,
    so a longer one is a name, and not found), anything else a name."""
    return _spu_name_of(client, int(spu)) if _is_digits(spu) and len(spu) <= 10 else spu


def _spu_undrain(args: argparse.Namespace) -> int:
    client = Client(_address(args))
    name = _spu_by_id_or_name(client, args.spu)
    _, answer = client.call("DELETE", _path("spus", name, "drain"))
    if args.output == "json":
        _print_json(answer)
    else:
        print(f"SPU {answer['spu']} ({answer['name']}) is not draining: it may lead again")
    return 0


def _spu_set_rack(args: argparse.Namespace) -> int:
    """Give an SPU a rack (or none): topics waiting for one are then placed by themselves."""
    client = Client(_address(args))
    name = _spu_by_id_or_name(client, args.spu)
    _, spu = client.call("POST", _path("spus", name, "rack"), {"rack": None if args.no_rack else args.rack})
    _show(args, spu, lambda answer: spu_rows([answer]))
    return 0


# ---------------------------------------------------------------------------- spu-group


def _spu_group_create(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {"replicas": args.replicas, "minId": args.min_id}
    if args.rack is not None:
        spec["rack"] = args.rack
    status, group = Client(_address(args)).call("POST", "/v1/spu-groups", {"name": args.name, "spec": spec})
    _show(args, group, lambda answer: spu_group_rows([answer]))
    _report_pending("spu group", status, group)
    return 0


def _spu_group_scale(args: argparse.Namespace) -> int:
    _, group = Client(_address(args)).call("POST", _path("spu-groups", args.name, "scale"), {"replicas": args.replicas})
    for warning in group.get("warnings", []):
        _warn(warning)
    _show(args, group, lambda answer: spu_group_rows([answer]))
    return 0


# ---------------------------------------------------------------------------- argparse


def _run(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except CliError as failure:
            print(f"error: {failure}", file=sys.stderr)
            return 1

    return run


def whole_number(text: str) -> int:
    """A command-line whole number: ASCII digits, at most MAX_WHOLE_NUMBER (checked before int(),
    which gives up at 4,300 digits)."""
    if not _is_digits(text):
        raise argparse.ArgumentTypeError(f"{_shown(text)!r} is not a whole number")
    digits = text.lstrip("0") or "0"  # int() counts leading zeros towards its limit too
    if len(digits) > len(str(MAX_WHOLE_NUMBER)) or int(digits) > MAX_WHOLE_NUMBER:
        raise argparse.ArgumentTypeError(f"{_shown(text)} is above {MAX_WHOLE_NUMBER}, the largest value here")
    return int(digits)


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # "²".isdigit() is true, and int() refuses it


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def command_group(commands: argparse._SubParsersAction, name: str, summary: str) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """The subcommands of group ``name`` (``sc spu ...``), created if absent.

    `sc spu run` (the SPU simulator) lives in another module: whichever registers first
    creates the group, the other adds its commands to it.
    """
    existing = commands.choices.get(name)
    if existing is not None:
        for action in existing._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
    parser = commands.add_parser(name, help=summary, description=summary)
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--sc", metavar="URL", help=f"the SC's public address (default: $SC_ADDR, else {DEFAULT_ADDRESS})"
    )
    common.add_argument("-o", "--output", choices=["table", "json"], default="table", help="table (default) or json")

    def command(group: argparse._SubParsersAction, name: str, handler: Callable[[argparse.Namespace], int], summary: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
        parser = group.add_parser(name, parents=[common], help=summary, description=summary)
        parser.set_defaults(handler=_run(handler), usage=parser.error)
        return parser

    def group_of(name: str, summary: str) -> argparse._SubParsersAction:  # type: ignore[type-arg]
        return command_group(commands, name, summary)

    topics = group_of("topic", "create, list, describe and delete topics; add partitions")
    create = command(topics, "create", _topic_create, "create a topic (waits until it is provisioned or cannot be)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("-p", "--partitions", type=whole_number, metavar="N", help="number of partitions")
    create.add_argument("-r", "--replication-factor", type=whole_number, metavar="R", help="replicas per partition")
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
    command(topics, "list", _lister("topics", topic_rows), "list topics")
    describe = command(topics, "describe", _topic_describe, "show one topic and its replica map")
    describe.add_argument("name", metavar="NAME")
    delete = command(topics, "delete", _deleter("topics", "topic"), "delete a topic and its partitions")
    delete.add_argument("name", metavar="NAME")
    add = command(topics, "add-partitions", _topic_add_partitions, "add partitions to a topic")
    add.add_argument("name", metavar="NAME")
    add.add_argument("-c", "--count", type=whole_number, default=1, metavar="N", help="partitions to add (default 1)")

    spus = group_of("spu", "register, list and unregister SPUs; run simulated SPUs")
    register_spu = command(spus, "register", _spu_register, "register a custom SPU")
    register_spu.add_argument("--id", type=whole_number, required=True, metavar="ID", help="SPU id, unique in the cluster")
    register_spu.add_argument("--name", dest="spu_name", required=True, metavar="NAME", help="SPU name")
    register_spu.add_argument(
        "--public-server", type=_server_address, required=True, metavar="HOST:PORT", help="where clients reach it"
    )
    register_spu.add_argument(
        "--private-server", type=_server_address, required=True, metavar="HOST:PORT", help="where other SPUs reach it"
    )
    register_spu.add_argument("--rack", metavar="R", help="its rack (a label, or a path such as /dc1/r2)")
    command(spus, "list", _lister("spus", spu_rows), "list SPUs")
    unregister = command(spus, "unregister", _spu_unregister, "unregister a custom SPU (by NAME or --id)")
    unregister.add_argument("name", metavar="NAME", nargs="?")
    unregister.add_argument("--id", type=whole_number, metavar="ID")
    drain = command(spus, "drain", _spu_drain, "move every leadership off an SPU before stopping it (until undrained)")
    drain.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")
    drain.add_argument("--timeout-ms", type=whole_number, default=30_000, metavar="MS", help="longest wait (default 30000)")
    drain.add_argument(
        "--force", action="store_true", help="drain even if some partitions cannot move now (they keep it as leader)"
    )
    undrain = command(spus, "undrain", _spu_undrain, "cancel an SPU's drain: it may lead again")
    undrain.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")

    set_rack = command(spus, "set-rack", _spu_set_rack, "give a custom SPU a rack, or take it away (--no-rack)")
    set_rack.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")
    rack_choice = set_rack.add_mutually_exclusive_group(required=True)
    rack_choice.add_argument("--rack", metavar="R", help="its rack (a label, or a path such as /dc1/r2)")
    rack_choice.add_argument("--no-rack", action="store_true", help="take its rack away")

    groups = group_of("spu-group", "create, scale, list and delete SPU groups (managed SPUs)")
    create_group = command(groups, "create", _spu_group_create, "create an SPU group")
    create_group.add_argument("name", metavar="NAME")
    create_group.add_argument("--replicas", type=whole_number, required=True, metavar="N", help="number of SPUs")
    create_group.add_argument("--min-id", type=whole_number, default=0, metavar="M", help="id of the first SPU (default 0)")
    create_group.add_argument("--rack", metavar="R", help="rack given to every SPU of the group")
    scale = command(groups, "scale", _spu_group_scale, "change the number of SPUs of a group")
    scale.add_argument("name", metavar="NAME")
    scale.add_argument("--replicas", type=whole_number, required=True, metavar="N", help="number of SPUs")
    command(groups, "list", _lister("spu-groups", spu_group_rows), "list SPU groups")
    delete_group = command(groups, "delete", _deleter("spu-groups", "SPU group"), "delete an SPU group and its SPUs")
    delete_group.add_argument("name", metavar="NAME")

    partitions = group_of("partition", "list partitions")
    list_partitions = command(partitions, "list", _lister("partitions", partition_rows, by_topic=True), "list partitions")
    list_partitions.add_argument("--topic", metavar="NAME", help="only this topic's partitions")
