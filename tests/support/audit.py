"""Record every file-system write (and reads of chosen paths) the process makes, through Python's audit
hooks (PEP 578): a test proves that nothing is written or read outside a declared root by recording every
``open``/``rename``/``mkdir``/``chmod``/``link``/``remove`` on the way, not by looking for a marker file.

An audit hook cannot be removed, so one hook is installed for the session and records only inside
:func:`recording`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: Events whose first (and for the two-path ones, second) argument is a path being changed.
_ONE_PATH = {
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.remove",
    "os.rmdir",
    "os.truncate",
    "os.utime",
    "os.mkfifo",
    "os.mknod",
}
_TWO_PATHS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat"}


@dataclass
class Record:
    """What happened while recording: (event, absolute path) pairs."""

    writes: list[tuple[str, str]] = field(default_factory=list)
    reads: list[tuple[str, str]] = field(default_factory=list)

    def writes_outside(self, *roots: Path) -> list[tuple[str, str]]:
        keep = [os.path.realpath(r) for r in roots]
        return [(e, p) for e, p in self.writes if not any(_inside(p, r) for r in keep)]

    def reads_under(self, root: Path) -> list[tuple[str, str]]:
        r = os.path.realpath(root)
        return [(e, p) for e, p in self.reads if _inside(p, r)]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


_current: Record | None = None
_mu = threading.Lock()


def _abs(p: object, dir_fd: object = None) -> str | None:
    if isinstance(p, int) or p is None:
        return None
    try:
        text = os.fsdecode(p)  # type: ignore[arg-type]
    except TypeError:
        return None
    if isinstance(dir_fd, int) and not text.startswith("/"):  # shutil.rmtree removes by (dir_fd, name)
        text = os.readlink(f"/proc/self/fd/{dir_fd}") + "/" + text  # noqa: PTH115 (no pathlib in a hook)
    # Resolve the parent (a symlink on the way is where a write really lands), keep the last part. os.path,
    # not pathlib: inside an audit hook, plain string functions raise no further events.
    head, tail = os.path.split(os.path.abspath(text))  # noqa: PTH100
    return os.path.join(os.path.realpath(head), tail)  # noqa: PTH118


def _hook(event: str, args: tuple[object, ...]) -> None:
    rec = _current
    if rec is None:
        return
    if event == "open" and args:
        path = _abs(args[0])
        if path is None:
            return
        mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
        write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        with _mu:
            (rec.writes if write else rec.reads).append(("open", path))
    elif event in _ONE_PATH and args:
        # Each of these events ends with its dir_fd (None for a plain path).
        path = _abs(args[0], args[-1] if len(args) > 1 else None)
        if path is not None:
            with _mu:
                rec.writes.append((event, path))
    elif event in _TWO_PATHS and len(args) >= 2:
        for p in args[:2] if event != "os.link" and event != "shutil.copyfile" else args[1:2]:
            path = _abs(p)
            if path is not None:
                with _mu:
                    rec.writes.append((event, path))


_installed = False


@contextmanager
def recording() -> Iterator[Record]:
    """Record file-system events of this process (all threads) for the duration."""
    global _current, _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    rec = Record()
    _current = rec
    try:
        yield rec
    finally:
        _current = None
