"""Readers of the files under deploy/, shared by the static and the running tests of them.

They read what Docker, Compose, Kubernetes and systemd would read (the Dockerfile's final stage,
the Compose file after YAML anchors and Compose's `$$` escape, every Kubernetes document, the
unit's keys), and help swap only the values that must differ on a test machine (etcd endpoints,
ports, paths) while failing loudly if the value to swap is not where it should be.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "compose" / "Dockerfile"
COMPOSE_FILE = DEPLOY / "compose" / "compose.yaml"
KUBERNETES_DIR = DEPLOY / "kubernetes"
SYSTEMD_UNIT = DEPLOY / "systemd" / "sc.service"
SYSTEMD_CONFIG = DEPLOY / "systemd" / "sc.toml"


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


# ---------------------------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY ...
    arguments: str  # the rest of the (joined) line


def dockerfile_stages(path: Path = DOCKERFILE) -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage (each starting with its FROM)."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, f"{path} ends inside a continued line"
    stages: list[list[Instruction]] = []
    for text in logical:
        keyword, _, arguments = text.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip())
        if instruction.keyword == "FROM":
            stages.append([])
        assert stages, f"{path}: {text!r} comes before any FROM"
        stages[-1].append(instruction)
    return stages


def final_stage() -> list[Instruction]:
    return dockerfile_stages()[-1]


def exec_form(instruction: Instruction) -> list[str]:
    """An ENTRYPOINT/CMD in exec (JSON) form; the shell form would not pass signals to `sc`."""
    value = json.loads(instruction.arguments)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), instruction
    return value


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [instruction for instruction in stage if instruction.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the stage, found {found}"
    return found[0]


def image_entrypoint() -> list[str]:
    return exec_form(only(final_stage(), "ENTRYPOINT"))


def image_cmd() -> list[str]:
    return exec_form(only(final_stage(), "CMD"))


def image_env(base_path: str) -> dict[str, str]:
    """The final stage's ENV (``key=value`` form), ``$PATH`` expanded from ``base_path``."""
    env: dict[str, str] = {"PATH": base_path}
    for instruction in final_stage():
        if instruction.keyword != "ENV":
            continue
        for word in shlex.split(instruction.arguments):
            key, separator, value = word.partition("=")
            assert separator, f"ENV {instruction.arguments!r}: use the key=value form"
            env[key] = re.sub(r"\$\{?PATH\}?", env["PATH"], value)
    return env


def image_workdir() -> str:
    return [instruction for instruction in final_stage() if instruction.keyword == "WORKDIR"][-1].arguments


# ------------------------------------------------------------------------------------------- Compose


def compose() -> dict[str, Any]:
    """The Compose file as Compose sees it: anchors and merge keys resolved by YAML."""
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def unescape_compose(text: str) -> str:
    """Compose's interpolation of one string: ``$$`` is a literal ``$``. The file interpolates no
    variable of the host, so any other ``$`` is a mistake (Compose would put an empty string there)."""
    unescaped = text.replace("$$", "")
    assert "$" not in unescaped, f"unescaped $ in a Compose value (write $$ for the shell): {text!r}"
    return text.replace("$$", "$")


def compose_strings(value: Any) -> list[str]:
    """Every string in a Compose value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [*compose_strings(key), *compose_strings(item)]]
    if isinstance(value, list):
        return [text for item in value for text in compose_strings(item)]
    return []


# ---------------------------------------------------------------------------------------- Kubernetes


def kubernetes_documents() -> list[tuple[Path, dict[str, Any]]]:
    documents = []
    for path in sorted(KUBERNETES_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                documents.append((path, document))
    return documents


def kubernetes_object(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in kubernetes_documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"expected one container {name}"
    return found[0]


# ------------------------------------------------------------------------------------------- systemd


def systemd_unit() -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values in order (a key may repeat, e.g. Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in SYSTEMD_UNIT.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("["):
            current = sections.setdefault(stripped.strip("[]"), {})
            continue
        assert current is not None, f"{line!r} before any section"
        key, separator, value = stripped.partition("=")
        assert separator, f"not a key=value line: {line!r}"
        current.setdefault(key, []).append(value)
    return sections


def systemd_environment(values: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values:
        for word in shlex.split(value):
            key, _, setting = word.partition("=")
            env[key] = setting
    return env


# ------------------------------------------------------------------------------------ substitutions


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with the value of ``flag`` (``--flag=v`` or ``--flag v``) replaced; it must be there once."""
    positions = [i for i, word in enumerate(argv) if word == flag or word.startswith(flag + "=")]
    assert len(positions) == 1, f"expected {flag} once in {argv}"
    i = positions[0]
    if argv[i] == flag:
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv[:i], f"{flag}={value}", *argv[i + 1 :]]


def flag_value(argv: list[str], flag: str) -> str:
    for i, word in enumerate(argv):
        if word == flag:
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


def replace_settings(text: str, **values: Any) -> str:
    """A TOML config with some top-level keys given new values; each key must already be set in it."""
    settings = tomllib.loads(text)
    missing = set(values) - set(settings)
    assert not missing, f"the config sets no {sorted(missing)}"
    settings.update(values)
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in settings.items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what these configs hold
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML for {value!r}")
