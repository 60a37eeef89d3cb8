"""The project's rule for silencing the type checker: each `# type: ignore` names its error code
and says on its line why the checker is wrong there (mypy itself reports an ignore that is no
longer needed, and one without a code)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("controller", "store", "connection_manager", "tests", "bench")
IGNORE = re.compile(r"#\s*type:\s*ignore")
EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(, [a-z-]+)*\]  # \S")


def unexplained(text: str) -> list[int]:
    """Line numbers of the ignores in ``text`` that lack a code or a reason."""
    return [number for number, line in enumerate(text.splitlines(), 1) if IGNORE.search(line) and not EXPLAINED.search(line)]


def test_the_rule_tells_an_explained_ignore_from_a_bare_one() -> None:
    lines = [
        "x = f()  # type: ignore[arg-type]  # f's stub is wrong about None",
        "x = f()  # type: ignore",
        "x = f()  # type: ignore[arg-type]",
        "x = f()  # type: ignore  # no code",
        "x = f()  # type: ignore[arg-type, union-attr]  # two codes, one reason",
        "x = 'a # type: ignore in a string is still flagged'",
    ]
    assert unexplained("\n".join(lines)) == [2, 3, 4, 6]


def test_every_type_ignore_names_its_code_and_says_why() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{number}"
        for package in CHECKED
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "test_type_ignores.py"
        for number in unexplained(path.read_text())
    }
    assert not found, "give each a code and a reason on its line (`# type: ignore[code]  # why`): " + ", ".join(sorted(found))
