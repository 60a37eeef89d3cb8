"""`sc demo`: its flags; the demo itself is controller/demo/demo.py (which handles its exit codes and signals)."""

from __future__ import annotations

import argparse
from pathlib import Path



def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start the SC on its embedded etcd in a temporary data dir and six simulated SPUs in racks "
        "r1, r2, r3; create three topics (computed, rack-aware, placement policies) and show their placement; "
        "kill the SPU leading the most partitions and show the new leaders, bring it back and show the preferred "
        "leaders return; then export the history and run the Spark audit report into --out. Every process it "
        "starts is stopped when it ends, fails or is interrupted (Ctrl-C: exit status 130)."
    )
    parser.add_argument(
        "--out", type=Path, default=Path("./sc-demo-report"), metavar="DIR",
        help="where the report, the exported history and the processes' logs go (default ./sc-demo-report; "
        "an earlier demo's output there is replaced)",
    )
    parser.add_argument("--keep-data", action="store_true", help="keep the temporary data dir (etcd data, history) and print where it is")
    parser.add_argument("--no-audit", dest="audit", action="store_false", help="skip the history export and the Spark report")
    parser.add_argument(
        "--pause", action="store_true",
        help="wait for Enter after each step (to talk through a step while its cluster runs); Ctrl-C still stops everything",
    )
    parser.add_argument(
        "--tls-dir", type=Path, metavar="DIR",
        help="run both ports over mutual TLS with DIR's ca.pem, sc.crt and sc.key (for 127.0.0.1), spu.crt and spu.key "
        "(DNS SANs spu-0 .. spu-5); the API then needs a token, which the demo makes",
    )
    parser.set_defaults(handler=handle_demo)


def handle_demo(args: argparse.Namespace) -> int:
    from controller.demo import demo  # its processes and output: only when the demo runs

    return demo.handle_demo(args)
