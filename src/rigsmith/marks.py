"""Marks: what a command that changed nothing answered, with a key over the inputs it followed from and the
``stat`` of the files it looked at, so the same command with the same inputs answers again from stat calls
(``fetch-model`` on a complete model dir, ``deploy --check`` of files that are up to date).

Marks live in ``<checkout>/.rigsmith/`` (ignored by git) and are only a cache: a mark that cannot be read
or written is passed over, and anything that differs runs the command in full. Stdlib only, on purpose:
the point is to answer before pydantic, Jinja or a network library loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rigsmith.errors import RigsmithError

#: A file's size, mtime, ctime, inode, device and mode (None: missing). ctime and inode change on any
#: rewrite, even one that puts size and mtime back.
Stat = list[int] | None


def stat(path: Path, follow: bool = True) -> Stat:
    try:
        st = path.stat() if follow else path.lstat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode]


def digest(header: object, files: Iterable[Path]) -> str:
    """sha256 over ``header`` (JSON-able) and the bytes of ``files`` (a missing file counts as empty)."""
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for path in files:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def read(path: Path) -> dict[str, Any] | None:
    try:
        mark = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def write(path: Path, mark: dict[str, Any]) -> None:
    from rigsmith.writer import write_one  # difflib, tempfile: not for the answering side

    with contextlib.suppress(OSError, RigsmithError):
        write_one(path, json.dumps(mark, sort_keys=True) + "\n")


def forget(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
