"""The verified-file record of a model dir, and its one rule.

``<local_dir>/.rigsmith/state.json`` maps each file rigsmith hashed and found to be the locked bytes to how
the file looked on disk then: size, mtime, ctime, inode and device. A later command (``fetch-model``,
``doctor``, ``up``'s drift gate) trusts a file unhashed only while all five are still the same
(:func:`vouches`): any write changes ctime, even one that puts size and mtime back; a rename over it
changes the inode; a copy elsewhere changes inode or device. Anything else is hashed again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

HashKind = Literal["sha256", "git_sha1"]
#: Where the record lives in a model dir: ``<local_dir>/STATE_DIR/STATE_FILE``.
STATE_DIR = ".rigsmith"
STATE_FILE = "state.json"
#: What identifies a file's bytes without reading them: size, mtime_ns, ctime_ns, inode, device.
Seen = tuple[int, int, int, int, int]


def seen(st: os.stat_result) -> Seen:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def seen_at(path: Path) -> Seen | None:
    """:func:`seen` of ``path`` (followed through symlinks), or None when there is no such file."""
    try:
        return seen(path.stat())
    except OSError:
        return None


class FileState(BaseModel):
    """One file rigsmith hashed and found to be the locked bytes, and how it looked on disk then (a record
    without all five, from before this rule, does not validate: :func:`read_state` then starts empty)."""

    model_config = ConfigDict(extra="forbid")
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    kind: HashKind
    digest: str


def verified(now: Seen, kind: HashKind, digest: str) -> FileState:
    """The record of a file that was just hashed to ``digest`` and looked like ``now``."""
    size, mtime, ctime, ino, dev = now
    return FileState(size=size, mtime_ns=mtime, ctime_ns=ctime, ino=ino, dev=dev, kind=kind, digest=digest)


def vouches(rec: FileState | None, now: Seen | None, kind: HashKind, digest: str) -> bool:
    """The one rule: ``rec`` vouches for the file as it is ``now`` (the same size, mtime, ctime, inode and
    device as when rigsmith hashed it) holding the bytes that hash to ``digest``."""
    if rec is None or (rec.kind, rec.digest) != (kind, digest):
        return False
    return (rec.size, rec.mtime_ns, rec.ctime_ns, rec.ino, rec.dev) == now


class DirState(BaseModel):
    """``<local_dir>/.rigsmith/state.json``: the verified-file record of a model dir."""

    model_config = ConfigDict(extra="forbid")
    repo: str = ""
    commit: str = ""
    files: dict[str, FileState] = Field(default_factory=dict)  # key: path relative to local_dir
    patches: list[dict[str, Any]] = Field(default_factory=list)  # the spec patches last applied


def read_state(path: Path) -> DirState:
    """The record, or an empty one when it is missing or unreadable (then every file is hashed again)."""
    try:
        return DirState.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return DirState()


def dump_state(state: DirState) -> str:
    return json.dumps(state.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
