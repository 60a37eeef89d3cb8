"""`sc audit`: the daemon's command line loads no audit dependency until an audit command runs."""

from __future__ import annotations

import subprocess
import sys


def test_building_the_sc_command_line_imports_no_pyarrow_pyspark_or_matplotlib() -> None:
    probe = (
        "import sys; from controller import cli, daemon; cli.build_parser(); "
        "print(sorted(name for name in ('pyarrow', 'pyspark', 'matplotlib') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_audit_commands_and_their_arguments() -> None:
    from controller import cli

    parser = cli.build_parser()
    args = parser.parse_args(["audit", "report", "--history", "h", "--out", "o", "--master", "spark://m:7077", "--flap-count", "4"])
    assert (str(args.history), str(args.out), args.master, args.at, args.flap_count, args.flap_window) == (
        "h", "o", "spark://m:7077", None, 4, 600.0,
    )
    args = parser.parse_args(["audit", "export", "--out", "o", "--since", "2026-03-01"])
    assert (str(args.history_dir), str(args.out), args.since, args.until) == ("sc-data/history", "o", "2026-03-01", None)
