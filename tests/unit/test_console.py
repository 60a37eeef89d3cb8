"""The `sc` executable's exit: after Arrow was loaded it ends without the interpreter's module
teardown (where Arrow's thread pools may abort the process), but with the exit handlers run and the
command's status kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    from pathlib import Path
    from controller.cli import main as cli

    marker = Path(sys.argv[1])
    if sys.argv[2] == "arrow":
        import pyarrow  # noqa: F401

    atexit.register(lambda: marker.write_text("exit handlers ran"))
    cli.main = lambda: print("done") or 3  # a command that finished with status 3
    cli.console()
    """
)


@pytest.mark.parametrize("loaded", ["arrow", "plain"])
def test_the_command_status_and_the_exit_handlers_survive_the_exit(tmp_path: Path, loaded: str) -> None:
    pytest.importorskip("pyarrow")
    marker = tmp_path / "marker"
    finished = subprocess.run([sys.executable, "-c", SCRIPT, str(marker), loaded], capture_output=True, text=True, timeout=60)
    assert (finished.returncode, finished.stdout, finished.stderr) == (3, "done\n", "")
    assert marker.read_text() == "exit handlers ran"


def test_after_arrow_the_process_skips_the_interpreters_teardown(tmp_path: Path) -> None:
    """A finaliser that runs only in the interpreter's teardown (a module global's __del__) does not
    run once Arrow was loaded: the teardown where Arrow's pools may abort is skipped."""
    pytest.importorskip("pyarrow")
    script = SCRIPT.replace(
        "cli.console()",
        "class Late:\n    def __del__(self):\n        print('teardown ran')\nlate = Late()\ncli.console()",
    )
    arrow = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), "arrow"], capture_output=True, text=True, timeout=60)
    plain = subprocess.run([sys.executable, "-c", script, str(tmp_path / "p"), "plain"], capture_output=True, text=True, timeout=60)
    assert (arrow.returncode, arrow.stdout) == (3, "done\n")
    assert (plain.returncode, plain.stdout) == (3, "done\nteardown ran\n")


def test_python_dash_m_controller_cli_ends_the_same_way(tmp_path: Path) -> None:
    """The demo and the tests start `python -m controller.cli ...`, not the `sc` script: that entry
    must end through console() as well, or an `sc audit export` run so may still abort (status -6)
    in the teardown after it finished."""
    pytest.importorskip("pyarrow")
    script = textwrap.dedent(
        """
        import runpy, sys
        import pyarrow  # noqa: F401
        from controller.cli import main as cli

        class Late:
            def __del__(self):
                print('teardown ran')
        late = Late()
        cli.main = lambda: print("done") or 3
        sys.argv = ["controller.cli"]
        runpy.run_module("controller.cli", run_name="__main__", alter_sys=True)
        """
    )
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (finished.returncode, finished.stdout) == (3, "done\n")
