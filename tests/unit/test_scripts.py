"""scripts/sc and scripts/bootstrap: `sc` installs only what its command needs, and an install that
already holds more is used as it is. Run on copies of the scripts in a temporary checkout whose
pip, venv and `sc` are stand-ins recording how they were called."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    target = f"{root}[{extras}]" if extras else str(root)
    return ["python -m pip install --quiet --upgrade pip", f"python -m pip install --quiet -e {target}"]


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
    subprocess.run([root / "scripts" / "bootstrap", "dev"], check=True, capture_output=True, timeout=60)
    assert calls(root) == []


def test_an_install_without_an_extra_asked_for_installs_again(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    installed(root, "")
    subprocess.run([root / "scripts" / "sc", "topic", "list"], check=True, capture_output=True, timeout=60)
    assert calls(root) == ["sc topic list"]
    subprocess.run([root / "scripts" / "sc", "demo"], check=True, capture_output=True, timeout=60)
    assert calls(root) == [*pip_install(root, "audit"), "sc demo"]
    subprocess.run([root / "scripts" / "bootstrap", "audit,dev"], check=True, capture_output=True, timeout=60)
    assert calls(root) == pip_install(root, "audit,dev")
    assert [path.name.rsplit("-", 1)[1] for path in (root / ".venv").glob(".installed-*")] == ["audit_dev"]
