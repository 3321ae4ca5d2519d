"""The progress bars of long work (fetch-model's downloads, bundle's copies, unbundle's placing): one shape.

Each line: what moves, the bar, the percentage (a 100 GiB phase moves the bar slowly), done/total and the
rate in the same binary units (rich's own speed column is decimal: "7.0/8.0 MiB 1.0 MB/s" mixed two units on
one line, seen under a pty by tests/operating/bundle/test_progress_pty.py), and the time left. On stderr,
drawn only on a terminal, and transient: the command's summary line takes its place when it ends.
"""

from __future__ import annotations

from rich import filesize
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

#: The units of :class:`rich.progress.DownloadColumn` with ``binary_units=True``.
BINARY_UNITS = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]


class BinarySpeedColumn(ProgressColumn):
    """The transfer rate in the binary units the sizes beside it use (``10.8 MiB/s``)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("?", style="progress.data.speed")
        unit, suffix = filesize.pick_unit_and_suffix(int(speed), BINARY_UNITS, 1024)
        precision = 0 if unit == 1 else 1
        return Text(f"{speed / unit:,.{precision}f} {suffix}/s", style="progress.data.speed")


def bars(show: bool | None) -> Progress:
    """The bars for one command (``show`` None: only when stderr is a terminal)."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        BinarySpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (console.is_terminal if show is None else show),
        transient=True,
    )
