"""The `sc` command line: one argparse tree; each command group registers its own parser.

Owns argument parsing and exit codes only; the work is done by the modules it calls.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controller.cli import audit, demo, partition, placement, run, spu, spu_group, topic


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sc",
        description="Streaming Controller: the control plane of a Fluvio-style streaming cluster.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # In the order `sc --help` lists them.
    for group in (run, topic, spu, spu_group, partition, placement, audit, demo):
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
