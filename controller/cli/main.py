"""The `sc` command line: the root parser, its global flags, and the dispatch to one command group.

Owns argument parsing, exit codes and how usage errors are printed. Loads a command group's module
only when that command runs: `sc --help` and `sc topic list` load neither the daemon, the SPU
simulator, the Fluvio codec nor Spark.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from controller.cli import admin

# Each command group and its summary, in the order `sc --help` lists them.
COMMANDS = {
    "run": "run the SC daemon",
    "topic": "create, list, describe and delete topics; add partitions",
    "spu": "register, list and unregister SPUs; run simulated SPUs",
    "spu-group": "create, scale, list and delete SPU groups (managed SPUs)",
    "partition": "list partitions",
    "cluster": "show which SC of the store is active and the standbys",
    "placement": "compute replica placements offline (no server needed)",
    "audit": "export the metadata history and run the Spark audits over it",
    "demo": "a local cluster end to end: placement, an SPU killed and back, the Spark audit (a few minutes)",
}
# A shell reports a command that a closed pipe ended with 128 + SIGPIPE.
BROKEN_PIPE_STATUS = 141


def _module(command: str) -> types.ModuleType:
    """The module of one command group, imported now: each import is written out (no import by name)."""
    if command == "run":
        from controller.cli import run
        return run
    if command == "topic":
        from controller.cli import topic
        return topic
    if command == "spu":
        from controller.cli import spu
        return spu
    if command == "spu-group":
        from controller.cli import spu_group
        return spu_group
    if command == "cluster":
        from controller.cli import cluster
        return cluster
    if command == "partition":
        from controller.cli import partition
        return partition
    if command == "placement":
        from controller.cli import placement
        return placement
    if command == "audit":
        from controller.cli import audit
        return audit
    if command == "demo":
        from controller.cli import demo
        return demo
    raise AssertionError(f"no command group {command!r}")


class UsageError(Exception):
    """A command line that does not parse, raised by the parser it concerns (so its usage is shown)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message

    def exit(self, as_json: bool) -> NoReturn:
        if as_json:
            admin.print_json({"error": {"code": "Usage", "message": f"{self.parser.prog}: {self.message}"}})
        else:
            self.parser.print_usage(sys.stderr)
            print(f"{self.parser.prog}: error: {self.message}", file=sys.stderr)
        sys.exit(2)


class Parser(argparse.ArgumentParser):
    """Every parser of `sc` (subparsers inherit the class): an argument its own command does not
    take is that command's error, shown with that command's usage, not the root's."""

    def parse_known_args(  # type: ignore[override]  # argparse's stub overloads the namespace type
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def build_parser(commands: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The root parser, with the full parser of each group in ``commands``; the other groups are
    listed (for `sc --help` and the choices) but their modules not loaded."""
    parser = Parser(prog="sc", description="Streaming Controller: the control plane of a Fluvio-style streaming cluster.")
    parser.add_argument("--version", action=_Version, help="print the version of sc and exit")
    admin.add_global_flags(parser, admin.GLOBAL_DEFAULTS)
    groups = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    loaded = set(commands)
    for name, summary in COMMANDS.items():
        group = groups.add_parser(name, help=summary, description=summary)
        if name in loaded:
            _module(name).register(group)
    return parser


def command_of(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The command group ARGV names: its first word that is neither a global flag nor a flag's value."""
    taking_a_value = {option for action in parser._actions if action.nargs != 0 for option in action.option_strings}
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if word in taking_a_value:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def asks_for_json(argv: Sequence[str]) -> bool:
    """Whether ARGV asks for JSON output, read before parsing: a usage error is then JSON too."""
    for previous, word in zip(["", *argv], argv):
        if word in ("-ojson", "--output=json") or (previous in ("-o", "--output") and word == "json"):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    listing = build_parser(commands=())
    command = command_of(listing, argv)
    parser = build_parser(commands=[command]) if command in COMMANDS else listing
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        error.exit(asks_for_json(argv))
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe can be handled, not at exit
    except UsageError as error:
        error.exit(args.output == "json")
    except BrokenPipeError:
        # The reader is gone (`sc topic list | head -1`): nothing more can be shown, and Python's
        # own flush at exit must not fail again and print a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_STATUS
    return status


class _Version(argparse.Action):
    """--version: reads the installed package's version only when asked (importlib.metadata is slow)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:  # noqa: A002 (argparse's name)
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        from importlib import metadata

        print(f"sc {metadata.version('streaming-controller')}")
        parser.exit()


def console() -> NoReturn:
    """The `sc` executable: main(), then the interpreter's exit, except after Arrow was loaded
    (`sc audit export`, `sc audit report`): its C++ thread pools may abort the process while Python
    tears its modules down ("terminate called without an active exception", apache/arrow#34314),
    turning a finished command into exit status 134 about once in 40 runs. Then the exit handlers
    run (Spark's, temporary directories') and the process ends without that teardown."""
    status = main()
    if "pyarrow" not in sys.modules:
        sys.exit(status)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(status)


if __name__ == "__main__":
    console()
