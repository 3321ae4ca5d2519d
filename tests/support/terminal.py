"""A command in a real pseudo-terminal, and what a terminal shows of its output.

:func:`run_in_pty` starts a command with stdin, stdout and stderr on the slave side of a pty of a fixed
size (``os.openpty``; rich and other libraries see a terminal, as a user's would) and reads everything it
writes until it exits. :class:`Screen` replays those bytes as a terminal does for the control sequences a
progress display uses (carriage return, newline, cursor up/down/left/right/column, erase line/screen,
colours and cursor visibility ignored) and keeps every other escape it meets in ``unknown``: what a user
would see as garbage, or a terminal would act on in a way this model does not.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: CSI sequences: ESC [ parameters intermediates final.
_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")
_ESC_OTHER = re.compile(r"\x1b[^\[]")
#: (parameters, final) of sequences with no effect on the text: cursor show/hide (SGR colours: any "m").
_IGNORED = {("?25", "h"), ("?25", "l")}


@dataclass
class PtyRun:
    """What a command wrote to its terminal, and how it ended."""

    raw: bytes
    returncode: int

    @property
    def text(self) -> str:
        """The output with every escape sequence removed (what was drawn at some point, frame by frame)."""
        return _ESC_OTHER.sub("", _CSI.sub("", self.raw.decode("utf-8", "replace")))


def run_in_pty(
    argv: Sequence[str], env: Mapping[str, str], *, cols: int = 120, rows: int = 40, timeout: float = 600
) -> PtyRun:
    """Run ``argv`` on a ``cols`` x ``rows`` pty until it exits; its output and exit status."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    full = {**env, "COLUMNS": str(cols), "LINES": str(rows), "TERM": env.get("TERM", "xterm-256color")}
    with subprocess.Popen(
        list(argv), stdin=slave, stdout=slave, stderr=slave, env=full, start_new_session=True
    ) as proc:
        os.close(slave)
        chunks: list[bytes] = []
        try:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the slave side has closed it (Linux)
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(master)
        code = proc.wait(timeout=timeout)
    return PtyRun(b"".join(chunks), code)


@dataclass
class Screen:
    """The lines a terminal shows after the output (an unbounded scrollback: no line scrolls away)."""

    lines: list[str] = field(default_factory=lambda: [""])
    row: int = 0
    col: int = 0
    unknown: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, raw: bytes) -> Screen:
        screen = cls()
        screen.feed(raw.decode("utf-8", "replace"))
        return screen

    def _put(self, ch: str) -> None:
        line = self.lines[self.row].ljust(self.col)
        self.lines[self.row] = line[: self.col] + ch + line[self.col + 1 :]
        self.col += 1

    def _down(self) -> None:
        self.row += 1
        while len(self.lines) <= self.row:
            self.lines.append("")

    def _csi(self, params: str, final: str) -> None:
        n = int(params) if params.isdigit() else 1
        if final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            for _ in range(n):
                self._down()
        elif final == "C":
            self.col += n
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "G":
            self.col = n - 1
        elif final == "K":
            line = self.lines[self.row]
            mode = params or "0"
            self.lines[self.row] = {"0": line[: self.col], "1": " " * self.col + line[self.col :], "2": ""}[
                mode
            ]
        elif final == "J" and (params or "0") == "0":
            self.lines[self.row] = self.lines[self.row][: self.col]
            del self.lines[self.row + 1 :]
        else:
            self.unknown.append(f"ESC[{params}{final}")

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = _CSI.match(text, i)
                if m is None:
                    self.unknown.append(repr(text[i : i + 2]))
                    i += 2
                    continue
                if m.group(3) != "m" and (m.group(1), m.group(3)) not in _IGNORED:
                    self._csi(m.group(1), m.group(3))
                i = m.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._down()
                self.col = 0  # the pty's onlcr turns \n into \r\n
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch == "\t":
                self.col = (self.col // 8 + 1) * 8
            elif ch < " " or ch == "\x7f":
                self.unknown.append(repr(ch))
            else:
                self._put(ch)
            i += 1

    @property
    def shown(self) -> list[str]:
        """The lines as shown, trailing blanks and the empty lines after the last one dropped."""
        out = [line.rstrip() for line in self.lines]
        while out and not out[-1]:
            out.pop()
        return out

    @property
    def partial(self) -> str:
        """Text left on the cursor's line after the output ended (a line the command never finished)."""
        return self.lines[self.row][: self.col].rstrip() if self.row < len(self.lines) else ""
