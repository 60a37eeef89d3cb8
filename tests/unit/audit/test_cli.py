"""`sc audit`: the daemon's command line loads no audit dependency until an audit command runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.audit import export
from store import history


def test_building_the_sc_command_line_imports_no_pyarrow_pyspark_or_matplotlib() -> None:
    probe = (
        "import sys; from controller import daemon; from controller.cli import main; main.build_parser(); "
        "print(sorted(name for name in ('pyarrow', 'pyspark', 'matplotlib') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_audit_commands_and_their_arguments() -> None:
    from controller.cli import main as cli

    parser = cli.build_parser()
    args = parser.parse_args(["audit", "report", "--history", "h", "--out", "o", "--master", "spark://m:7077", "--flap-count", "4"])
    assert ([str(path) for path in args.history], str(args.out), args.master, args.at, args.flap_count, args.flap_window) == (
        ["h"], "o", "spark://m:7077", None, 4, 600.0,
    )
    args = parser.parse_args(["audit", "report", "--history", "h1", "--history", "h2", "--out", "o"])
    assert [str(path) for path in args.history] == ["h1", "h2"]
    args = parser.parse_args(["audit", "export", "--out", "o", "--since", "2026-03-01"])
    assert (str(args.history_dir), str(args.out), args.since, args.until) == ("sc-data/history", "o", "2026-03-01", None)


def test_sc_audit_export_says_which_records_it_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from controller.cli import main as cli

    (tmp_path / "history").mkdir()
    (tmp_path / "history" / history.ID_FILE).write_text("abc\n")
    log = history.SegmentLog(tmp_path / "history")
    log.open()
    log.append([b'{"seq":1,"type":"sync","revision":3,"time":0}', b"[]"] + [b"null"] * (export.MALFORMED_LISTED + 1))
    log.close()
    assert cli.main(["audit", "export", "--history-dir", str(tmp_path / "history"), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert (printed["rows"], printed["malformedRecords"], len(printed["malformed"])) == (1, 102, 100)
    warnings = captured.err.splitlines()
    assert warnings[:2] == [
        "warning: history record 2 skipped: it is not a JSON object (got an array)",
        "warning: history record 3 skipped: it is not a JSON object (got null)",
    ]
    assert warnings[100:] == ["warning: 2 more malformed history records skipped"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--flap-window", "inf"], "--flap-window inf must be a number of seconds above 0 and at most 1000000000"),
        (["--flap-window", "nan"], "--flap-window nan must be a number of seconds above 0 and at most 1000000000"),
        (["--flap-window", "1e300"], "--flap-window 1e+300 must be a number of seconds above 0 and at most 1000000000"),
        (["--flap-window", "0"], "--flap-window 0 must be a number of seconds above 0 and at most 1000000000"),
        (["--flap-count", "1"], "--flap-count 1 is too small: an SPU flaps when it goes offline at least twice"),
    ],
)
def test_sc_audit_report_refuses_bad_flap_settings_before_starting_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    from controller.cli import main as cli

    code = cli.main(["audit", "report", "--history", str(tmp_path), "--out", str(tmp_path / "report"), *flags])
    assert (code, capsys.readouterr().err) == (2, f"error: {message}\n")
