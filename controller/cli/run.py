"""`sc run`: the daemon's flags, one per setting, made from controller/config.py's Settings (name,
type, default and help from the field); parses them into Settings and runs the daemon until
SIGTERM/SIGINT. Writes no setting's name, default or meaning a second time.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

from controller import config, logs

# The settings whose flag is not --<name> with its value: a negated switch, or one given once per item.
NEGATED_FLAGS = {"record_history": "--no-history"}
REPEATED_FLAGS = {"placement_plugins": ("--placement-plugin", "NAME=module:Class")}


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = "Run the SC. With no --etcd-endpoints it starts and supervises its own etcd under --data-dir."
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML config file (keys as the settings, e.g. public_port = 9003)")
    for name, field in config.Settings.model_fields.items():
        _add_flag(parser, name, field)
    # Each setting's flag as written here, for the errors that name where a bad value came from.
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    parser.set_defaults(handler=handle_run, flags=flags)


def _add_flag(parser: argparse.ArgumentParser, name: str, field: Any) -> None:
    """The flag of one setting. Values stay text: Settings converts and checks them, and its errors
    name the flag, the value and the limit. None means "not given" (the environment or file decides)."""
    value_type = _without_none(field.annotation)
    default = field.default_factory() if field.default_factory is not None else field.default
    help_text = field.description + _shown_default(default)
    if name in NEGATED_FLAGS:
        parser.add_argument(NEGATED_FLAGS[name], dest=name, action="store_false", default=None, help=f"do not {field.description}")
    elif name in REPEATED_FLAGS:
        flag, metavar = REPEATED_FLAGS[name]
        parser.add_argument(flag, dest=name, action="append", metavar=metavar, help=help_text + " (repeatable)")
    elif value_type is bool:
        parser.add_argument(_flag(name), dest=name, action="store_true", default=None, help=help_text)
    elif isinstance(value_type, type) and issubclass(value_type, enum.Enum):
        parser.add_argument(_flag(name), dest=name, choices=[member.value for member in value_type], help=help_text)
    else:
        parser.add_argument(_flag(name), dest=name, metavar=_metavar(value_type), help=help_text)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``; the type itself otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [member for member in typing.get_args(annotation) if member is not type(None)]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _metavar(value_type: Any) -> str:
    if value_type is int:
        return "N"
    if value_type is float:
        return "SECONDS"
    if value_type is Path:
        return "PATH"
    if typing.get_origin(value_type) is list:
        return "LIST"
    return "TEXT"


def _shown_default(default: Any) -> str:
    if default is None or default == [] or default == {}:
        return ""
    if isinstance(default, enum.Enum):
        default = default.value
    elif isinstance(default, bool):
        default = str(default).lower()
    elif isinstance(default, Path) and not default.is_absolute():
        default = f"./{default}"
    elif isinstance(default, float) and default.is_integer():
        default = int(default)
    return f" (default {default})"


def handle_run(args: argparse.Namespace) -> int:
    overrides = {name: getattr(args, name) for name in config.Settings.model_fields}
    try:
        settings = config.load(args.config, args.flags, **overrides)
        config.read_tokens(settings.spu_token_file)  # fail now, with the file's name, not at the first SPU
        logs.configure(settings.log_format, settings.log_level)
    except ValueError as error:
        for problem in error.problems if isinstance(error, config.ConfigError) else [str(error)]:
            print(f"error: invalid configuration: {problem}", file=sys.stderr)
        return 2
    # Imported here: `sc run --help` starts faster without the daemon's modules.
    from connection_manager import tls
    from controller import daemon, placement_plugins
    from controller.api import auth
    from store import embedded_etcd, history, kv

    try:
        asyncio.run(daemon.Daemon(settings).run_until_signalled())
    except (placement_plugins.PluginError, tls.TlsError, auth.CredentialsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (embedded_etcd.EtcdError, history.HistoryError, kv.StoreError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
