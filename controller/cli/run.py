"""`sc run`: parse the daemon's flags into Settings and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from controller import config, logs


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = commands.add_parser(
        "run",
        help="run the SC daemon",
        description="Run the SC. With no --etcd-endpoints it starts and supervises its own etcd under --data-dir.",
    )
    run.add_argument("--config", type=Path, help="TOML config file (keys as the settings, e.g. public_port = 9003)")
    run.add_argument("--bind-host", help="address both ports bind to (default 0.0.0.0; the public port stays on 127.0.0.1 while no credential is configured)")
    run.add_argument("--public-port", type=int, help="public API port (default 9003)")
    run.add_argument("--private-port", type=int, help="private SPU port (default 9004)")
    run.add_argument("--store", choices=[kind.value for kind in config.StoreKind], help="etcd (default) or memory")
    run.add_argument("--etcd-endpoints", help="comma-separated http://host:port of an existing etcd cluster")
    run.add_argument("--key-prefix", help="key prefix of this cluster's objects in etcd (default /sc/)")
    run.add_argument("--data-dir", type=Path, help="where the embedded etcd keeps its data (default ./sc-data)")
    run.add_argument("--history-dir", type=Path, help="where the metadata history is recorded (default <data-dir>/history with the embedded etcd; none otherwise unless given)")
    run.add_argument("--no-history", dest="record_history", action="store_false", default=None, help="record no metadata history")
    run.add_argument("--embedded-etcd-client-port", type=int, help="embedded etcd client port (default 12379)")
    run.add_argument("--embedded-etcd-peer-port", type=int, help="embedded etcd peer port (default 12380)")
    run.add_argument("--resync-interval", type=float, help="seconds between full controller resyncs (default 60)")
    run.add_argument("--spu-offline-grace", type=float, help="seconds an SPU recorded Online may take to reconnect after an SC start (default 30)")
    run.add_argument("--spu-heartbeat-timeout", type=float, help="seconds of SPU silence before it is marked offline (default 10)")
    run.add_argument("--spu-token-file", type=Path, help="file holding a shared token every SPU must present")
    run.add_argument("--tls-cert", type=Path, help="PEM certificate (chain) of both ports: they speak TLS 1.2+ (reloaded on change and SIGHUP)")
    run.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    run.add_argument("--tls-client-ca", type=Path, help="PEM CA of client certificates: SPUs must present one naming spu-<id>; on the public port one is a credential")
    run.add_argument("--auth-tokens", type=Path, help="credentials of the public port: lines NAME ROLE TOKEN or NAME ROLE cert:CN (roles read, admin, admin:PREFIX)")
    run.add_argument("--public-bind-without-auth", action="store_true", default=None, help="bind the public port to --bind-host even with no credential configured (anyone reaching it may change everything)")
    run.add_argument("--client-header-timeout", type=float, help="seconds a client has to send a request's line and headers, or a Fluvio frame's length (default 10)")
    run.add_argument("--client-body-timeout", type=float, help="seconds a request body or Fluvio frame may pause; the whole may take this plus 1 s per 64 KiB (default 30)")
    run.add_argument("--client-idle-timeout", type=float, help="seconds a connection may wait between requests (default 60)")
    run.add_argument("--max-connections-public", type=int, help="connections the public port holds at once (default: derived from the open-file limit)")
    run.add_argument("--max-connections-private", type=int, help="connections the private port holds at once (default: derived from the open-file limit)")
    run.add_argument("--max-connections-per-address", type=int, help="connections one client address may hold on each port (default: a quarter of the public port's)")
    run.add_argument("--max-buffered-request-bytes", type=int, help="bytes of large request bodies and Fluvio frames buffered at once (default 134217728)")
    run.add_argument("--unclean-leader-election", action="store_true", default=None, help="let an out-of-sync replica lead when no in-sync one is online (may lose committed records)")
    run.add_argument("--leader-rebalance-batch", type=int, help="preferred-leader moves per controller pass (default 100; 0 disables)")
    run.add_argument(
        "--placement-plugin",
        dest="placement_plugins",
        action="append",
        metavar="NAME=module:Class",
        help="load a placement plug-in at start, which topics then name as placement strategy NAME (repeatable)",
    )
    run.add_argument(
        "--placement-entry-points",
        action="store_true",
        default=None,
        help="also load the placement plug-ins installed packages declare (entry points streaming_controller.placement)",
    )
    run.add_argument("--log-format", choices=[fmt.value for fmt in config.LogFormat], help="auto (default), console or json")
    run.add_argument("--log-level", help="debug, info (default), warning or error")
    # Each setting's flag as written here, for the errors that name where a bad value came from.
    flags = {action.dest: action.option_strings[0] for action in run._actions if action.option_strings}
    run.set_defaults(handler=handle_run, flags=flags)


def handle_run(args: argparse.Namespace) -> int:
    overrides = {
        name: getattr(args, name)
        for name in (
            "bind_host", "public_port", "private_port", "store", "etcd_endpoints", "key_prefix", "data_dir",
            "history_dir", "record_history",
            "embedded_etcd_client_port", "embedded_etcd_peer_port", "resync_interval", "spu_offline_grace",
            "spu_heartbeat_timeout", "spu_token_file", "tls_cert", "tls_key", "tls_client_ca", "auth_tokens",
            "public_bind_without_auth", "client_header_timeout", "client_body_timeout",
            "client_idle_timeout", "max_connections_public", "max_connections_private", "max_connections_per_address",
            "max_buffered_request_bytes", "unclean_leader_election", "leader_rebalance_batch",
            "log_format", "log_level", "placement_plugins", "placement_entry_points",
        )
    }
    try:
        settings = config.load(args.config, args.flags, **overrides)
        config.read_token(settings.spu_token_file)  # fail now, with the file's name, not at the first SPU
        logs.configure(settings.log_format, settings.log_level)
    except ValueError as error:
        for problem in error.problems if isinstance(error, config.ConfigError) else [str(error)]:
            print(f"error: invalid configuration: {problem}", file=sys.stderr)
        return 2
    # Imported here: every other `sc` command (an SPU simulator, an admin call) starts faster
    # without the daemon's modules.
    from connection_manager import tls
    from controller import daemon, placement_plugins
    from controller.api import auth
    from store import active_sc, embedded_etcd, history, kv

    try:
        asyncio.run(daemon.Daemon(settings).run_until_signalled())
    except (placement_plugins.PluginError, tls.TlsError, auth.CredentialsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (embedded_etcd.EtcdError, history.HistoryError, kv.Unavailable, active_sc.AnotherScActive, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
