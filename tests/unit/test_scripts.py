"""scripts/sc and scripts/bootstrap: `sc` installs only what its command needs, and an install that
already holds more is used as it is. Run on copies of the scripts in a temporary checkout whose
pip, venv and `sc` are stand-ins recording how they were called."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# bootstrap with the dev extra installs the browser when it is missing: not in these tests (but in
# the one about it, with stand-ins).
NO_BROWSER = {**os.environ, "SC_NO_BROWSER": "1"}


def checkout(tmp_path: Path) -> Path:
    """A checkout with the real scripts and pyproject.toml, and a .venv whose python and sc only log."""
    (tmp_path / "scripts").mkdir()
    for script in ("sc", "bootstrap"):
        shutil.copy2(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for program in ("python", "sc"):
        (bin_dir / program).write_text(f'#!/bin/sh\necho "{program} $*" >> "{tmp_path}/calls.log"\n')
        (bin_dir / program).chmod(0o755)
    return tmp_path


def installed(root: Path, extras: str) -> None:
    """Mark the stand-in venv as installed with ``extras`` (as bootstrap's stamp does)."""
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (root / ".venv" / f".installed-{digest}-{extras.replace(',', '_')}").touch()


def calls(root: Path) -> list[str]:
    log = root / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


def pip_install(root: Path, extras: str) -> list[str]:
    """The calls that install the project with ``extras``: uv, then the project with uv."""
    target = f"{root}[{extras}]" if extras else str(root)
    return [
        "python -m pip install --quiet --disable-pip-version-check uv>=0.5",
        f"python -m uv pip install --quiet --python {root}/.venv/bin/python -e {target}",
    ]


@pytest.mark.parametrize(
    ("argv", "extras"),
    [
        (["topic", "list"], ""),
        (["--sc", "http://h:9003", "-o", "json", "topic", "list"], ""),
        (["run", "--store", "memory"], ""),
        (["placement", "compute"], ""),
        (["--help"], ""),
        (["demo"], "audit"),
        (["audit", "report", "--out", "o"], "audit"),
        (["-o", "json", "audit", "export"], "audit"),
    ],
)
def test_sc_installs_the_audit_extra_only_for_demo_and_audit(tmp_path: Path, argv: list[str], extras: str) -> None:
    root = checkout(tmp_path)
    subprocess.run([root / "scripts" / "sc", *argv], check=True, capture_output=True, timeout=60)
    assert calls(root) == [*pip_install(root, extras), f"sc {' '.join(argv)}"]


def test_an_install_with_more_extras_serves_a_command_needing_fewer(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    installed(root, "audit,dev")
    for argv in (["topic", "list"], ["demo"]):
        subprocess.run([root / "scripts" / "sc", *argv], check=True, capture_output=True, timeout=60)
        assert calls(root) == [f"sc {' '.join(argv)}"]
    subprocess.run([root / "scripts" / "bootstrap", "dev"], check=True, capture_output=True, timeout=60, env=NO_BROWSER)
    assert calls(root) == []


def test_an_install_without_an_extra_asked_for_installs_again(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    installed(root, "")
    subprocess.run([root / "scripts" / "sc", "topic", "list"], check=True, capture_output=True, timeout=60)
    assert calls(root) == ["sc topic list"]
    subprocess.run([root / "scripts" / "sc", "demo"], check=True, capture_output=True, timeout=60)
    assert calls(root) == [*pip_install(root, "audit"), "sc demo"]
    subprocess.run([root / "scripts" / "bootstrap", "audit,dev"], check=True, capture_output=True, timeout=60, env=NO_BROWSER)
    assert calls(root) == pip_install(root, "audit,dev")
    assert [path.name.rsplit("-", 1)[1] for path in (root / ".venv").glob(".installed-*")] == ["audit_dev"]


def test_without_uv_bootstrap_installs_with_pip(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    python = root / ".venv" / "bin" / "python"
    # A python whose pip cannot get uv (an index without it, say).
    python.write_text(
        f'#!/bin/sh\necho "python $*" >> "{tmp_path}/calls.log"\ncase "$*" in *"uv>=0.5"*) exit 1 ;; esac\n'
    )
    done = subprocess.run([root / "scripts" / "bootstrap", "audit"], check=True, capture_output=True, text=True, timeout=60, env=NO_BROWSER)
    assert calls(root) == [
        "python -m pip install --quiet --disable-pip-version-check uv>=0.5",
        "python -m pip install --quiet --upgrade pip",
        f"python -m pip install --quiet -e {root}[audit]",
    ]
    assert "uv could not install the project; installing with pip" in done.stderr
    assert [path.name.rsplit("-", 1)[1] for path in (root / ".venv").glob(".installed-*")] == ["audit"]


def test_when_uv_cannot_install_the_project_pip_does(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    # uv is had, but the project's install fails (an index only pip.conf names, say).
    (root / ".venv" / "bin" / "python").write_text(
        f'#!/bin/sh\necho "python $*" >> "{tmp_path}/calls.log"\ncase "$*" in *"uv pip install"*) exit 2 ;; esac\n'
    )
    done = subprocess.run([root / "scripts" / "bootstrap", "audit"], check=True, capture_output=True, text=True, timeout=60, env=NO_BROWSER)
    assert calls(root) == [
        *pip_install(root, "audit"),
        "python -m pip install --quiet --upgrade pip",
        f"python -m pip install --quiet -e {root}[audit]",
    ]
    assert "uv could not install the project; installing with pip" in done.stderr


def tools(tmp_path: Path, uid: int, *present: str) -> dict[str, str]:
    """An environment whose PATH holds only what bootstrap runs, with stand-ins: ``id -u`` says
    ``uid``, apt-get logs its calls, and the ``present`` programs exist."""
    directory = tmp_path / "tools"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for program in ("env", "bash", "dirname", "sha256sum", "cut", "basename", "sed", "rm", "touch", "sleep"):
        real = shutil.which(program)
        assert real is not None, program
        (directory / program).symlink_to(real)
    (directory / "python3").symlink_to(sys.executable)
    # apt-get takes a while: bootstrap runs it beside the Python install and must wait for it.
    stand_ins = {"id": f"echo {uid}", "apt-get": f'sleep 0.3; echo "apt-get $*" >> "{tmp_path}/calls.log"'}
    stand_ins.update({program: "true" for program in present})
    for program, body in stand_ins.items():
        (directory / program).write_text(f"#!/bin/sh\n{body}\n")
        (directory / program).chmod(0o755)
    return {"PATH": str(directory), "HOME": str(tmp_path)}


def test_bootstrap_installs_the_browser_with_apt_get_only_where_it_is_missing_and_apt_get_may_run(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    installed(root, "audit,dev")
    bootstrap: list[str | Path] = [root / "scripts" / "bootstrap", "dev"]
    apt_get = ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends chromium chromium-driver"]
    done = subprocess.run(bootstrap, check=True, capture_output=True, text=True, timeout=60, env=tools(tmp_path, 0))
    assert calls(root) == apt_get
    # Done only once apt-get is (a pipe on its output would wait for apt-get anyway: none here).
    subprocess.run(bootstrap, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, env=tools(tmp_path, 0))
    assert calls(root) == apt_get
    assert done.stderr == "bootstrap: installing chromium and chromium-driver with apt-get (for the browser tests)\n"
    # Installed: nothing to do, nothing said.
    done = subprocess.run(bootstrap, check=True, capture_output=True, text=True, timeout=60, env=tools(tmp_path, 0, "chromium", "chromedriver"))
    assert (calls(root), done.stderr) == ([], "")
    # Not root: apt-get is not tried, and the skip is announced.
    done = subprocess.run(bootstrap, check=True, capture_output=True, text=True, timeout=60, env=tools(tmp_path, 1000))
    assert calls(root) == []
    assert "the browser tests will be skipped" in done.stderr
    # Only the dev extra's users run the browser tests.
    subprocess.run([root / "scripts" / "bootstrap", "audit"], check=True, capture_output=True, timeout=60, env=tools(tmp_path, 0))
    assert calls(root) == []
