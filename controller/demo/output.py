"""What `sc demo` shows: numbered steps, tables and notes; rich on a terminal, plain lines otherwise.
Presentation only: the demo hands it titles, details and rows, and never formats for a medium."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TextIO


class Step(Protocol):
    def progress(self, text: str) -> None:
        """What the step is doing now (a spinner's text on a terminal, a line otherwise)."""

    def done(self, detail: str) -> None:
        """The step's outcome, shown when it ends."""


class Output(Protocol):
    def intro(self, text: str) -> None: ...

    def step(self, title: str) -> contextlib.AbstractContextManager[Step]: ...

    def table(self, title: str, headers: Sequence[str], sections: Sequence[Sequence[Sequence[object]]]) -> None:
        """Rows in sections (e.g. one per rack), separated by a rule on a terminal, a blank line otherwise."""

    def note(self, text: str) -> None: ...


def for_stream(stream: TextIO, steps: int) -> Output:
    """Rich output when ``stream`` is a terminal and rich is installed; plain lines otherwise."""
    if stream.isatty():
        try:
            import rich.console  # only a terminal pays for importing rich
        except ImportError:
            return PlainOutput(stream, steps)
        return RichOutput(rich.console.Console(file=stream, highlight=False), steps)
    return PlainOutput(stream, steps)


class _PlainStep:
    def __init__(self, output: PlainOutput, label: str) -> None:
        self.output = output
        self.label = label
        self.detail = ""

    def progress(self, text: str) -> None:
        self.output.line(f"{self.label} {text}")

    def done(self, detail: str) -> None:
        self.detail = detail


class PlainOutput:
    """One line when a step starts and one when it ends, each prefixed [n/N]; aligned plain tables."""

    def __init__(self, stream: TextIO, steps: int) -> None:
        self.stream = stream
        self.steps = steps
        self.number = 0

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def intro(self, text: str) -> None:
        self.line(text)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[Step]:
        self.number += 1
        label = f"[{self.number}/{self.steps}]"
        self.line(f"{label} {title} ...")
        step = _PlainStep(self, label)
        started = time.monotonic()
        try:
            yield step
        except KeyboardInterrupt:
            self.line(f"{label} interrupted")
            raise
        except BaseException:
            self.line(f"{label} failed ({time.monotonic() - started:.1f} s)")
            raise
        self.line(f"{label} ok ({time.monotonic() - started:.1f} s){': ' + step.detail if step.detail else ''}")

    def table(self, title: str, headers: Sequence[str], sections: Sequence[Sequence[Sequence[object]]]) -> None:
        self.line()
        self.line(title)
        for line in aligned(headers, sections):
            self.line(f"  {line}" if line else "")
        self.line()

    def note(self, text: str) -> None:
        self.line(text)


class _RichStep:
    def __init__(self, status: Any, title: str) -> None:
        self.status = status
        self.title = title
        self.detail = ""

    def progress(self, text: str) -> None:
        from rich.markup import escape

        self.status.update(f"{escape(self.title)}: {escape(text)}")

    def done(self, detail: str) -> None:
        self.detail = detail


class RichOutput:
    """A spinner while a step runs, then a check mark with its outcome; rich tables."""

    def __init__(self, console: Any, steps: int) -> None:
        self.console = console
        self.steps = steps
        self.number = 0

    def intro(self, text: str) -> None:
        from rich.markup import escape

        self.console.print(f"[bold]{escape(text)}[/bold]")

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[Step]:
        from rich.markup import escape

        self.number += 1
        label = escape(f"[{self.number}/{self.steps}]")
        started = time.monotonic()
        try:
            with self.console.status(f"{label} {escape(title)}") as status:
                step = _RichStep(status, f"[{self.number}/{self.steps}] {title}")
                yield step
        except KeyboardInterrupt:
            self.console.print(f"[yellow]■[/yellow] {label} {escape(title)}: interrupted")
            raise
        except BaseException:
            self.console.print(f"[red]✗[/red] {label} {escape(title)} [dim]({time.monotonic() - started:.1f} s)[/dim]")
            raise
        detail = f"\n    {escape(step.detail)}" if step.detail else ""
        self.console.print(f"[green]✓[/green] {label} {escape(title)} [dim]({time.monotonic() - started:.1f} s)[/dim]{detail}")

    def table(self, title: str, headers: Sequence[str], sections: Sequence[Sequence[Sequence[object]]]) -> None:
        from rich import box
        from rich.table import Table

        from rich.markup import escape

        self.console.print()
        self.console.print(f"[bold]{escape(title)}[/bold]")  # not the table's title: that wraps at the table's width
        table = Table(box=box.SIMPLE_HEAD)
        for header in headers:
            table.add_column(header)
        for section in sections:
            for index, row in enumerate(section):
                table.add_row(*(_cell(value) for value in row), end_section=index == len(section) - 1)
        self.console.print(table)

    def note(self, text: str) -> None:
        from rich.markup import escape

        self.console.print(escape(text))


def aligned(headers: Sequence[str], sections: Sequence[Sequence[Sequence[object]]]) -> list[str]:
    """Columns aligned over every section, two spaces apart, a blank line between sections."""
    cells = [[[text(value) for value in row] for row in section] for section in sections]
    widths = [len(header) for header in headers]
    for section in cells:
        for row in section:
            widths = [max(width, len(value)) for width, value in zip(widths, row)]

    def joined(row: Sequence[str]) -> str:
        return "  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()

    lines = [joined(headers)]
    for index, section in enumerate(cells):
        if index:
            lines.append("")
        lines.extend(joined(row) for row in section)
    return lines


def text(value: object) -> str:
    """A cell: "-" for nothing, a list as comma-separated items."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


def _cell(value: object) -> str:
    from rich.markup import escape

    return escape(text(value))

