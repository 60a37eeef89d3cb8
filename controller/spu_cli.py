"""`sc spu run`: run one simulated SPU (or K of them in this process) until SIGTERM/SIGINT.

Owns the flags and exit codes only; the simulator is ``connection_manager.spu.simulator``.
Exit status 2 for bad flags, 1 when the SPUs cannot start (an unusable checkpoint), 0 on a signal.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from connection_manager.spu import checkpoint, settings as spu_settings, simulator
from controller import admin_cli, config, logs

_DEFAULTS = spu_settings.SpuSettings()


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    spus = admin_cli.command_group(commands, "spu", "register, list and unregister SPUs; run simulated SPUs")
    summary = "run simulated SPUs: register with the SC's private port, host their replicas, replicate offsets"
    run = spus.add_parser("run", help=summary, description=summary + ". Stops cleanly on SIGTERM or SIGINT.")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=_whole_number, metavar="ID", help="run the SPU with this id")
    which.add_argument("--first-id", type=_whole_number, metavar="N", help="with --count K: run SPUs N .. N+K-1")
    run.add_argument("--count", type=_whole_number, default=1, metavar="K", help="SPUs to run in this process (default 1)")
    run.add_argument(
        "--sc-private",
        type=_address,
        default=("127.0.0.1", 9004),
        metavar="HOST:PORT",
        help="the SC's private port (default 127.0.0.1:9004)",
    )
    run.add_argument("--token-file", type=Path, metavar="FILE", help="file holding the token the SC requires of SPUs")
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
        "--append-records", type=_whole_number, default=_DEFAULTS.append_records, metavar="N",
        help=f"records a burst appends to each partition led (default {_DEFAULTS.append_records})",
    )
    rates.add_argument(
        "--fetch-interval", type=float, default=_DEFAULTS.fetch_interval, metavar="S",
        help=f"seconds between a follower's fetch rounds (default {_DEFAULTS.fetch_interval:g})",
    )
    rates.add_argument(
        "--fetch-max-records", type=_whole_number, default=_DEFAULTS.fetch_max_records, metavar="N",
        help=f"records one fetch round brings a partition at most (default {_DEFAULTS.fetch_max_records})",
    )
    rates.add_argument(
        "--replica-lag-time", type=float, default=_DEFAULTS.replica_lag_time, metavar="S",
        help=f"seconds a follower may go without catching up before it leaves the ISR (default {_DEFAULTS.replica_lag_time:g})",
    )
    run.add_argument("--log-format", choices=[fmt.value for fmt in config.LogFormat], default="auto", help="auto (default), console or json")
    run.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    run.set_defaults(handler=handle_run, usage=run.error)


def _whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def _address(text: str) -> tuple[str, int]:
    try:
        return simulator.parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def handle_run(args: argparse.Namespace) -> int:
    if args.id is not None and args.count != 1:
        args.usage(f"--count {args.count} runs several SPUs: give --first-id N instead of --id")
    if args.count < 1:
        args.usage("--count must be at least 1")
    first = args.id if args.id is not None else args.first_id
    try:
        token = _read_token(args.token_file)
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


def _read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ValueError(f"cannot read the token file {str(path)!r}: {error.strerror}") from None
    if not token:
        raise ValueError(f"the token file {str(path)!r} is empty")
    return token
