"""README.md and docs/*.md are tested: their shell blocks run as written (markers say how), outputs are
compared, the configuration table is checked against controller/config.py and `sc run`'s flags, and every
relative link resolves."""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import os
import re
import signal
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import parser

from controller import config
from controller.cli import run as run_cli
from store import embedded_etcd

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
OPERATIONS = DOCS / "operations.md"
DEVELOPMENT = DOCS / "development.md"
# The README is the front page: what it is, the quickstart, concepts, the tour, the layout, links.
README_MAX_BYTES = 12 * 1024

MARKER = re.compile(r"^<!-- test: (?P<kind>[a-z-]+)(?P<argument>.*?) -->$")
FENCE = re.compile(r"^```[a-z]*\s*$")  # an opening fence: three backticks and a language, alone on the line
SHELL_MARKERS = ("run", "daemon", "skip")
OUTPUT_MARKERS = {"expect": "text", "expect-json": "json"}
# The first `scripts/sc` of a fresh checkout installs the project: allow for it.
BLOCK_TIMEOUT = 300.0


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    marker: str | None = None
    argument: str = ""
    expected: Block | None = None  # for a run block: the output block that follows it
    document: str = "README.md"  # relative to the repository root

    def where(self) -> str:
        return f"{self.document}:{self.line}"


def documents() -> list[Path]:
    """README.md first (its tour starts the SC), then docs/*.md by name: their blocks run in this order."""
    return [README, *sorted(DOCS.glob("*.md"))]


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in parse(path.read_text(), str(path.relative_to(ROOT)))]


def parse(text: str, document: str = "README.md") -> list[Block]:
    """Every fenced block, with the `<!-- test: ... -->` comment right before it (blank lines allowed)."""
    blocks: list[Block] = []
    pending: tuple[str, str] | None = None
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        found = MARKER.match(line.strip())
        if found:
            pending = (found["kind"], found["argument"].strip())
        elif FENCE.match(line):
            language = line[3:].strip()
            body: list[str] = []
            index += 1
            while index < len(lines) and lines[index].rstrip() != "```":
                body.append(lines[index])
                index += 1
            kind, argument = pending if pending is not None else (None, "")
            blocks.append(Block(index - len(body), language, "\n".join(body) + "\n", kind, argument, document=document))
            pending = None
        elif line.strip():
            pending = None  # a marker applies only to the block right after it
        index += 1
    return blocks


def shell_blocks(blocks: list[Block]) -> list[Block]:
    """The sh blocks in order, each run block holding its expected output; malformed markers fail."""
    result: list[Block] = []
    previous: Block | None = None
    for block in blocks:
        if block.marker in OUTPUT_MARKERS:
            assert previous is not None and previous.marker == "run" and previous.expected is None, (
                f"{block.where()}: an output block must follow a run block"
            )
            assert block.language == OUTPUT_MARKERS[block.marker], (
                f"{block.where()}: `{block.marker}` output goes in a ```{OUTPUT_MARKERS[block.marker]} block"
            )
            previous.expected = block
        if block.language == "sh":
            assert block.marker in SHELL_MARKERS, (
                f"{block.where()}: a ```sh block needs <!-- test: run --> , <!-- test: daemon --> or "
                f"<!-- test: skip REASON --> before it, found {block.marker!r}"
            )
            result.append(block)
        elif block.marker in SHELL_MARKERS:
            raise AssertionError(f"{block.where()}: `{block.marker}` marks a ```{block.language} block, not ```sh")
        previous = block
    return result


def expected_status(block: Block) -> int:
    if not block.argument:
        return 0
    found = re.fullmatch(r"status=(\d+)", block.argument)
    assert found, f"{block.where()}: a run marker takes only status=N, got {block.argument!r}"
    return int(found[1])


def same_output(actual: str, expected: Block) -> None:
    if expected.marker == "expect-json":
        try:
            answer = json.loads(actual)
        except json.JSONDecodeError:
            raise AssertionError(f"{expected.where()}: the command printed no JSON but:\n{actual}") from None
        wanted = json.loads(expected.text)
        assert isinstance(answer, dict) and isinstance(wanted, dict), expected.where()
        assert {key: answer.get(key) for key in wanted} == wanted, f"{expected.where()}: printed {actual}"
    else:
        assert _lines(actual) == _lines(expected.text), f"{expected.where()}: printed\n{actual}"


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# ---------------------------------------------------------------------------- static checks


def test_every_shell_block_is_marked_and_every_skip_says_why() -> None:
    blocks = shell_blocks(all_blocks())
    assert len(blocks) >= 10
    for block in blocks:
        if block.marker == "skip":
            assert len(block.argument.split()) >= 4, f"{block.where()}: say why the block is not run"
        if block.marker == "run":
            expected_status(block)
    assert [(block.document, block.marker) for block in blocks if block.marker == "daemon"] == [("README.md", "daemon")]


def test_the_markers_catch_an_unmarked_block_and_a_stray_output() -> None:
    with pytest.raises(AssertionError, match="README.md:2: a ```sh block needs"):
        shell_blocks(parse("text\n```sh\nls\n```\n"))
    with pytest.raises(AssertionError, match="must follow a run block"):
        shell_blocks(parse("<!-- test: skip no reason needed here -->\n```sh\nls\n```\n<!-- test: expect -->\n```text\nx\n```\n"))
    inline = "a ```` ```sh ```` block\n```` ```text ```` too\n<!-- test: skip not run, for a good reason -->\n```sh\nls\n```\n"
    assert [(block.line, block.marker) for block in shell_blocks(parse(inline))] == [(4, "skip")]
    marked = shell_blocks(parse("<!-- test: run status=1 -->\n\n```sh\nfalse\n```\n<!-- test: expect -->\n```text\n\n```\n"))
    assert [(block.marker, expected_status(block), block.expected is not None) for block in marked] == [("run", 1, True)]


def test_the_output_comparisons_fail_on_a_difference() -> None:
    text_block = Block(1, "text", "a  b\nc\n", "expect")
    same_output("a  b   \nc\n\n", text_block)
    with pytest.raises(AssertionError):
        same_output("a b\nc\n", text_block)
    json_block = Block(1, "json", '{"replicaMap": [[0, 1]]}', "expect-json")
    same_output('{"replicaMap": [[0, 1]], "balance": {}}', json_block)
    with pytest.raises(AssertionError):
        same_output('{"replicaMap": [[1, 0]], "balance": {}}', json_block)
    with pytest.raises(AssertionError):
        same_output('{"balance": {}}', json_block)


def test_the_quickstart_is_exactly_the_demo_and_the_test_suite_that_ci_runs() -> None:
    text = README.read_text()
    quickstart = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    commands = [block.text.strip() for block in parse(quickstart) if block.language == "sh"]
    assert commands == ["scripts/sc demo", "scripts/test"]
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == "exec scripts/test"


def test_the_readme_fits_on_a_few_screens() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, above {README_MAX_BYTES}: move the reference into docs/ and link it"
    )


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without code: a bracket in a JSON example or a shell block is no link, a `# comment` no heading."""
    return CODE_SPAN.sub("", FENCED.sub("", text))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces to
    hyphens, and a repeated one numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.finditer(FENCED.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading["title"].replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    """Each relative link of a Markdown file whose file, or heading anchor, does not exist."""
    broken = []
    for link in LINK.finditer(_prose(path.read_text())):
        target = link["target"]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... are not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: {linked.name} has no heading with anchor #{anchor}")
    return broken


def test_every_relative_link_of_the_readme_and_the_docs_resolves_to_a_file_and_heading() -> None:
    checked = [*documents(), ROOT / "CHANGELOG.md"]
    found = {str(path.relative_to(ROOT)): broken_links(path) for path in checked}
    assert {name: links for name, links in found.items() if links} == {}
    assert sum(len(LINK.findall(_prose(path.read_text()))) for path in checked) >= 50


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Pages and `limits`: two\n\n## Pages\n\n## Pages\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```sh\n# not a heading\necho [x](gone.md)\n```\n"
        "[a](other.md#pages-and-limits-two) [b](other.md#pages-1) [`c`](other.md#pages) [d](#title) [e](https://x.org/y)\n"
        "[f](gone.md) [g](other.md#gone) [h](#not-a-heading) `[i](in-code.md)` [j](other.md#pages-2)\n"
    )
    assert anchors(page.read_text()) == {"title"}
    assert broken_links(page) == [
        f"gone.md: no file {tmp_path / 'gone.md'}",
        "other.md#gone: other.md has no heading with anchor #gone",
        "#not-a-heading: page.md has no heading with anchor #not-a-heading",
        "other.md#pages-2: other.md has no heading with anchor #pages-2",
    ]


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sc run")
    run_cli.register(parser)
    return parser


def _shown_default(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return "(none)"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return str(value) if value.is_absolute() else f"./{value}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _configuration_table() -> list[list[str]]:
    section = CONFIGURATION.read_text().split("<!-- config-table: begin -->\n", 1)[1].split("<!-- config-table: end -->", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.strip().splitlines()[2:]]
    return [[cell.strip().strip("`") for cell in row] for row in rows]


def test_the_configuration_table_lists_every_setting_with_its_flag_variable_and_default() -> None:
    flags = {action.dest: action.option_strings[0] for action in _run_parser()._actions if action.option_strings}
    wanted = []
    for name, info in config.Settings.model_fields.items():
        default = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]  # Settings' factories take no argument
        wanted.append([name, flags.get(name, "(none)"), f"SC_{name.upper()}", _shown_default(default)])
    table = _configuration_table()
    assert [row[:4] for row in table] == wanted, "docs/configuration.md's table differs from controller/config.py"
    assert all(row[4] for row in table), "every setting says what it means"
    # Every flag of `sc run` is a setting, except --config (the file) and --help.
    assert set(flags) - set(config.Settings.model_fields) == {"help", "config"}


def _dependencies_named() -> set[str]:
    """The first column of "Dependencies and why": `pyspark, pyarrow, matplotlib (`audit` extra)` names three."""
    section = DEVELOPMENT.read_text().split("\n## Dependencies and why\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|")[0] for line in section.strip().splitlines()[2:]]
    cells = [re.sub(r"\(.*?\)", "", row) for row in rows]
    return {name.split()[0].lower() for cell in cells for name in cell.split(",") if name.strip()}


def test_the_dependencies_table_says_why_for_every_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(req for extra in project["optional-dependencies"].values() for req in extra)]
    declared = {re.match(r"[A-Za-z0-9_.-]+", requirement)[0].lower() for requirement in requirements}  # type: ignore[index]  # every requirement starts with its name
    assert declared - _dependencies_named() == set(), "add a row to docs/development.md's Dependencies and why"


# ---------------------------------------------------------------------------- running the blocks


@dataclass
class Session:
    directory: Path
    env: dict[str, str]
    groups: list[int] = field(default_factory=list)  # process groups of the blocks run (background jobs)
    daemon: subprocess.Popen[bytes] | None = None

    def start_daemon(self, block: Block) -> None:
        with (self.directory / "daemon.log").open("wb") as log:  # the SC keeps its own descriptor
            self.daemon = subprocess.Popen(
                ["bash", "-c", block.text], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + BLOCK_TIMEOUT
        while not self._healthy():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{block.where()}: the SC did not come up:\n{self.daemon_log()}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.env["SC_ADDR"] + "/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def daemon_log(self) -> str:
        return (self.directory / "daemon.log").read_text(errors="replace")[-4000:]

    def run(self, block: Block) -> str:
        out, err = self.directory / f"block-{block.line}.out", self.directory / f"block-{block.line}.err"
        # Files, not pipes: a job the block leaves in the background keeps them open.
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", block.text],
                cwd=ROOT, env=self.env, stdout=stdout, stderr=stderr, start_new_session=True,
            )
            self.groups.append(process.pid)
            try:
                status = process.wait(BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{block.where()}: still running after {BLOCK_TIMEOUT} s") from None
        printed = out.read_text()
        assert status == expected_status(block), (
            f"{block.where()}: exit status {status}\n--- stdout\n{printed}\n--- stderr\n{err.read_text()[-4000:]}"
            f"\n--- the SC's log\n{self.daemon_log() if self.daemon else ''}"
        )
        return printed

    def stop(self) -> None:
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
        if self.daemon is not None and self.daemon.poll() is None:
            os.killpg(self.daemon.pid, signal.SIGINT)  # Ctrl-C, as the README says
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    public, private, client, peer = embedded_etcd.free_ports(4)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SC_")}
    env.update(
        SC_PUBLIC_PORT=str(public),
        SC_PRIVATE_PORT=str(private),
        SC_EMBEDDED_ETCD_CLIENT_PORT=str(client),
        SC_EMBEDDED_ETCD_PEER_PORT=str(peer),
        SC_DATA_DIR=str(tmp_path / "sc-data"),
        SC_ADDR=f"http://127.0.0.1:{public}",
        SC_LOG_FORMAT="json",
    )
    running = Session(tmp_path, env)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.etcd
@pytest.mark.timeout(900)
def test_the_readme_commands_run_as_written_and_print_what_it_shows(session: Session) -> None:
    ran = 0
    for block in shell_blocks(all_blocks()):
        if block.marker == "daemon":
            session.start_daemon(block)
        elif block.marker == "run":
            printed = session.run(block)
            if block.expected is not None:
                same_output(printed, block.expected)
            ran += 1
    assert ran >= 10
    assert session.daemon is not None and session.daemon.poll() is None, session.daemon_log()
    # Every metric the Metrics section names is served by the tour's SC.
    with urllib.request.urlopen(session.env["SC_ADDR"] + "/metrics", timeout=10) as response:
        served = set()
        for family in parser.text_string_to_metric_families(response.read().decode()):
            served |= {family.name, *(sample.name for sample in family.samples)}
            if family.type == "counter":  # a labelled counter with no child yet has no sample
                served.add(f"{family.name}_total")
    named = set(re.findall(r"`(sc_[a-z_]+)", metrics_section()))
    assert len(named) >= 20
    assert named - served == set()


def metrics_section() -> str:
    return OPERATIONS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
