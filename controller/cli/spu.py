"""`sc spu ...`: register, list, unregister, drain, undrain, decommission SPUs and set their rack (HTTP calls to the
SC, see admin.py); and `sc spu run`: run one simulated SPU (or K of them in this process) until
SIGTERM/SIGINT.

Owns the flags and exit codes only; the simulator is ``connection_manager.spu.simulator``, loaded
only when SPUs run (the other commands and --help start faster without it). `sc spu run` exits with status 2 for bad flags, 1 when the SPUs cannot start (an unusable checkpoint), 0 on
a signal.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from pathlib import Path
from typing import Any

from connection_manager.spu import settings as spu_settings
from controller.api import client
from controller.cli import admin

_DEFAULTS = spu_settings.SpuSettings()
# SPUs one process runs at most (as many as an SPU group may have).
MAX_SPUS = 10_000
LARGEST_SPU_ID = 2**31 - 1


def register(parser: argparse.ArgumentParser) -> None:
    spus = admin.Group(parser)
    register_spu = spus.command("register", _spu_register, "register a custom SPU")
    register_spu.add_argument("--id", type=admin.whole_number, required=True, metavar="ID", help="SPU id, unique in the cluster")
    register_spu.add_argument("--name", dest="spu_name", required=True, metavar="NAME", help="SPU name")
    register_spu.add_argument(
        "--public-server", type=_server_address, required=True, metavar="HOST:PORT", help="where clients reach it"
    )
    register_spu.add_argument(
        "--private-server", type=_server_address, required=True, metavar="HOST:PORT", help="where other SPUs reach it"
    )
    register_spu.add_argument("--rack", metavar="R", help="its rack (a label, or a path such as /dc1/r2)")
    spus.command("list", admin.lister("spus", spu_rows), "list SPUs")
    unregister = spus.command("unregister", _spu_unregister, "unregister a custom SPU (by NAME or --id)")
    unregister.add_argument("name", metavar="NAME", nargs="?")
    unregister.add_argument("--id", type=admin.whole_number, metavar="ID")
    drain = spus.command("drain", _spu_drain, "move every leadership off an SPU before stopping it (until undrained)")
    drain.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")
    drain.add_argument("--timeout-ms", type=admin.whole_number, default=30_000, metavar="MS", help="longest wait (default 30000)")
    drain.add_argument(
        "--force", action="store_true", help="drain even if some partitions cannot move now (they keep it as leader)"
    )
    decommission = spus.command(
        "decommission", _spu_decommission, "move every replica off an SPU (respecting racks), so it can be deleted with nothing lost"
    )
    decommission.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")
    decommission.add_argument(
        "--max-moves-per-spu", type=admin.whole_number, metavar="N",
        help="moves in flight at once on any SPU (default: the SC's setting rebalance_max_moves_per_spu)",
    )  # fmt: skip
    undrain = spus.command("undrain", _spu_undrain, "cancel an SPU's drain: it may lead again")
    undrain.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")

    set_rack = spus.command("set-rack", _spu_set_rack, "give a custom SPU a rack, or take it away (--no-rack)")
    set_rack.add_argument("spu", metavar="ID|NAME", help="the SPU's id or name")
    rack_choice = set_rack.add_mutually_exclusive_group(required=True)
    rack_choice.add_argument("--rack", metavar="R", help="its rack (a label, or a path such as /dc1/r2)")
    rack_choice.add_argument("--no-rack", action="store_true", help="take its rack away")

    summary = "run simulated SPUs: register with the SC's private port, host their replicas, replicate offsets"
    run = spus.subcommands.add_parser("run", help=summary, description=summary + ". Stops cleanly on SIGTERM or SIGINT.")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=admin.whole_number, metavar="ID", help="run the SPU with this id")
    which.add_argument("--first-id", type=admin.whole_number, metavar="N", help="with --count K: run SPUs N .. N+K-1")
    run.add_argument("--count", type=admin.whole_number, default=1, metavar="K", help="SPUs to run in this process (default 1)")
    run.add_argument(
        "--sc-private",
        type=_addresses,
        default=[("127.0.0.1", 9004)],
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the SC's private port (default 127.0.0.1:9004); several SCs of one store (a leader and its "
        "standbys) separated by commas: the SPU finds the leader among them",
    )
    run.add_argument("--token-file", type=Path, metavar="FILE", help="file holding the token the SC requires of SPUs (of several, one a line, the first)")
    run.add_argument("--tls-ca", type=Path, metavar="FILE", help="PEM CA that signed the SC's certificate: connect over TLS")
    run.add_argument("--tls-cert", type=Path, metavar="FILE", help="this SPU's PEM client certificate (CN or a DNS SAN spu-<id>), with --tls-ca")
    run.add_argument("--tls-key", type=Path, metavar="FILE", help="the PEM private key of --tls-cert")
    run.add_argument(
        "--data-dir", type=Path, metavar="DIR",
        help="journal logs here as they change (spu-ID/), and resume them on restart",
    )
    run.add_argument(
        "--record", type=Path, metavar="FILE",
        help="append a JSON line here for every leadership taken and every offset acknowledged (for chaos tests)",
    )
    run.add_argument(
        "--listen-host", metavar="HOST", help="bind the private endpoint here instead of its registered host"
    )
    rates = run.add_argument_group("rates")
    rates.add_argument(
        "--append-interval", type=float, default=_DEFAULTS.append_interval, metavar="S",
        help=f"seconds between a leader's append bursts (default {_DEFAULTS.append_interval:g})",
    )
    rates.add_argument(
        "--append-records", type=admin.whole_number, default=_DEFAULTS.append_records, metavar="N",
        help=f"records a burst appends to each partition led (default {_DEFAULTS.append_records})",
    )
    rates.add_argument(
        "--fetch-interval", type=float, default=_DEFAULTS.fetch_interval, metavar="S",
        help=f"seconds between a follower's fetch rounds (default {_DEFAULTS.fetch_interval:g})",
    )
    rates.add_argument(
        "--fetch-max-records", type=admin.whole_number, default=_DEFAULTS.fetch_max_records, metavar="N",
        help=f"records one fetch round brings a partition at most (default {_DEFAULTS.fetch_max_records})",
    )
    rates.add_argument(
        "--replica-lag-time", type=float, default=_DEFAULTS.replica_lag_time, metavar="S",
        help=f"seconds a follower may go without catching up before it leaves the ISR (default {_DEFAULTS.replica_lag_time:g})",
    )
    # Checked when the SPUs start (config.LogFormat): the settings' module is not loaded for the other commands.
    run.add_argument("--log-format", default="auto", metavar="{auto,console,json}", help="auto (default), console or json")
    run.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    run.set_defaults(handler=handle_run, usage=run.error)


# ---------------------------------------------------------------------------- the commands calling the SC


def _server_address(text: str) -> dict[str, Any]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as an endpoint (the SC checks the port's range)."""
    host, separator, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not admin.is_digits(port) or len(port) > 5:
        raise argparse.ArgumentTypeError(f"{admin.shown(text)!r} is not HOST:PORT")
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
    _, spu = admin.client_of(args).call("POST", "/v1/spus", {"name": args.spu_name, "spec": spec})
    admin.show(args, spu, lambda answer: spu_rows([answer]))
    return 0


def _spu_name_of(sc: client.Client, spu_id: int) -> str:
    spus = sc.list_all("/v1/spus")
    matching = [spu["name"] for spu in spus if spu["spec"]["id"] == spu_id]
    if not matching:
        raise admin.CliError(f"no SPU has id {spu_id}")
    return str(matching[0])


def _spu_unregister(args: argparse.Namespace) -> int:
    if (args.name is None) == (args.id is None):
        args.usage("name the SPU to unregister: give its NAME or --id ID (one of them)")
    sc = admin.client_of(args)
    name = args.name if args.name is not None else _spu_name_of(sc, args.id)
    _, answer = sc.call("DELETE", admin.path("spus", name))
    admin.report_deleted(args, "SPU", name, answer)
    return 0


def _spu_drain(args: argparse.Namespace) -> int:
    """Controlled shutdown: every leadership moves off the SPU before it is stopped. Exit status
    1 while it still leads something (it stays draining): stopping it then would leave those
    partitions without a leader."""
    sc = admin.client_of(args)
    name = _spu_by_id_or_name(sc, args.spu)
    query = {"timeout": str(args.timeout_ms), **({"force": "true"} if args.force else {})}
    _, answer = sc.call("POST", admin.path("spus", name, "drain"), query=query)
    who = f"SPU {answer['spu']} ({answer['name']})"
    if args.output == "json":
        admin.print_json(answer)
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


def _spu_decommission(args: argparse.Namespace) -> int:
    """Store the plan that empties the SPU and start it; `sc cluster rebalance --status` follows it,
    and the SPU's status says Done once no partition lists it."""
    sc = admin.client_of(args)
    name = _spu_by_id_or_name(sc, args.spu)
    body = None if args.max_moves_per_spu is None else {"maxMovesPerSpu": args.max_moves_per_spu}
    _, answer = sc.call("POST", admin.path("spus", name, "decommission"), body)
    if args.output == "json":
        admin.print_json(answer)
        return 0
    moves = answer["moves"]
    print(admin.table(["PARTITION", "FROM", "TO"], [[m["partition"], _listed(m["from"]), _listed(m["to"])] for m in moves]) if moves else "")
    who = f"SPU {answer['spu']} ({answer['name']})"
    if answer["state"] == "done":
        print(f"{who} holds no replica: it can be deleted")
    else:
        print(
            f"{who} is decommissioned: {len(moves)} move(s) started; follow them with `sc cluster rebalance --status`, "
            f"and delete it once `sc spu list` shows its decommission Done"
        )
    return 0


def _listed(spus: list[int]) -> str:
    return ",".join(str(spu) for spu in spus)


def _spu_by_id_or_name(sc: client.Client, spu: str) -> str:
    """The name of the SPU an argument names: a number is an id (no SPU id has more than 10 digits,
    so a longer one is a name, and not found), anything else a name."""
    return _spu_name_of(sc, int(spu)) if admin.is_digits(spu) and len(spu) <= 10 else spu


def _spu_undrain(args: argparse.Namespace) -> int:
    sc = admin.client_of(args)
    name = _spu_by_id_or_name(sc, args.spu)
    _, answer = sc.call("DELETE", admin.path("spus", name, "drain"))
    if args.output == "json":
        admin.print_json(answer)
    else:
        print(f"SPU {answer['spu']} ({answer['name']}) is not draining: it may lead again")
    return 0


def _spu_set_rack(args: argparse.Namespace) -> int:
    """Give an SPU a rack (or none): topics waiting for one are then placed by themselves."""
    sc = admin.client_of(args)
    name = _spu_by_id_or_name(sc, args.spu)
    _, spu = sc.call("POST", admin.path("spus", name, "rack"), {"rack": None if args.no_rack else args.rack})
    admin.show(args, spu, lambda answer: spu_rows([answer]))
    return 0


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


def _decommission(spu: dict[str, Any]) -> str | None:
    """InProgress or Done once decommissioned (InProgress until the SC has looked)."""
    if not spu["spec"].get("decommission"):
        return None
    return str(spu.get("status", {}).get("decommission") or "InProgress")


def spu_rows(spus: list[dict[str, Any]]) -> str:
    rows = [
        [
            spu["spec"]["id"],
            spu["name"],
            spu["spec"].get("spuType", "Custom"),
            spu["spec"].get("rack"),
            admin.resolution_of(spu),
            _drain(spu),
            _decommission(spu),
            _endpoint(spu["spec"].get("publicEndpoint")),
            _endpoint(spu["spec"].get("privateEndpoint")),
        ]
        for spu in spus
    ]
    return admin.table(["ID", "NAME", "TYPE", "RACK", "RESOLUTION", "DRAIN", "DECOMMISSION", "PUBLIC", "PRIVATE"], rows)


# ---------------------------------------------------------------------------- sc spu run


def _addresses(text: str) -> list[tuple[str, int]]:
    from connection_manager.spu import simulator

    try:
        return simulator.parse_addresses(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def handle_run(args: argparse.Namespace) -> int:
    from connection_manager.spu import checkpoint, simulator
    from controller import config, logs

    if args.log_format not in {fmt.value for fmt in config.LogFormat}:
        args.usage(f"argument --log-format: invalid choice: {admin.shown(args.log_format)!r} (choose from auto, console, json)")
    if args.id is not None and args.count != 1:
        args.usage(f"--count {args.count} runs several SPUs: give --first-id N instead of --id")
    if args.count < 1:
        args.usage("--count must be at least 1")
    if args.count > MAX_SPUS:
        args.usage(f"--count {args.count}: at most {MAX_SPUS} SPUs run in one process")
    first = args.id if args.id is not None else args.first_id
    if first + args.count - 1 > LARGEST_SPU_ID:
        args.usage(f"SPU ids {first} to {first + args.count - 1}: the largest SPU id is {LARGEST_SPU_ID}")
    try:
        token = _read_token(args.token_file)
        tls_context = _tls_context(args)
        settings = spu_settings.SpuSettings(
            append_interval=args.append_interval,
            append_records=args.append_records,
            fetch_interval=args.fetch_interval,
            fetch_max_records=args.fetch_max_records,
            replica_lag_time=args.replica_lag_time,
        )
        logs.configure(config.LogFormat(args.log_format), args.log_level)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    spus = [
        simulator.SimulatedSpu(
            spu_id, args.sc_private, token, settings=settings, data_dir=args.data_dir, listen_host=args.listen_host,
            tls=tls_context,
            record=args.record,
        )
        for spu_id in range(first, first + args.count)
    ]
    try:
        asyncio.run(simulator.run_until_signalled(spus))
    except checkpoint.CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The SPUs' TLS client context from --tls-ca, --tls-cert and --tls-key (None: plaintext)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
    if args.tls_ca is None:
        if args.tls_cert is not None:
            raise ValueError("--tls-cert needs --tls-ca (the CA that signed the SC's certificate)")
        return None
    from connection_manager import tls  # only when an SPU runs over TLS

    try:
        return tls.client_context(args.tls_ca, args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot use the TLS files --tls-ca {str(args.tls_ca)!r}, --tls-cert {args.tls_cert}: {error}") from None


def _read_token(path: Path | None) -> str | None:
    """The token the SPUs present: the file's first (in a rotation the SC's file lists the new
    token first and the old one after it, and may be given to SPUs as it is)."""
    from controller import config

    tokens = config.read_tokens(path, "token file")
    return None if tokens is None else tokens[0]
