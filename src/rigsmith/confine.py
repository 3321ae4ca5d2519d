"""One confinement rule for every path that comes from outside.

A bundle's members and manifest, a tar's members, a lock's and a Hub listing's file lists, a checkpoint's
safetensors index and the members of source-tree and asset archives all name files by a relative POSIX
name that someone else wrote. Every one of them goes through :func:`check` (the name) and then
:func:`under` / :func:`open_regular` / :func:`make_dirs` (the name against a real directory), so the rule
is written once:

- the name is text, relative, ``/``-separated, with no empty, ``.`` or ``..`` part (so no ``//``, no
  trailing ``/``), no backslash, NUL, control character or line break, no part longer than NAME_MAX and
  no name longer than PATH_MAX, and it reads the same after normalisation (POSIX and Unicode NFKC: a
  fullwidth solidus or a one-dot leader that a later tool might fold into ``/`` or ``.`` is refused);
- on disk, no existing part of the way from the root to the file is a symlink, and what is opened is a
  regular file (never a FIFO, a device or a socket: opening those can block or read another thing).

Pure stdlib, imports nothing of rigsmith's but the error base, so every layer may use it.
"""

from __future__ import annotations

import os
import posixpath
import stat
import unicodedata
from pathlib import Path
from typing import BinaryIO

from rigsmith.errors import RigsmithError

#: Linux limits for one path component and a whole path (bytes, UTF-8).
NAME_MAX = 255
PATH_MAX = 4096


class PathRefused(RigsmithError):
    """A name from outside would leave its root, or names something that is not a plain file."""


def why_unsafe(name: object) -> str | None:
    """Why ``name`` cannot be placed under a root, or None when it can (pure: looks at the text only)."""
    if not isinstance(name, str) or not name:
        return "it is empty or not text"
    if "\0" in name:
        return "it contains a NUL byte"
    if "\\" in name:
        return "it contains a backslash"
    if name.startswith("/"):
        return "it is absolute"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        return "it contains a control character or line break"
    if len(name.encode("utf-8", "surrogatepass")) > PATH_MAX:
        return f"it is longer than {PATH_MAX} bytes"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"it has a {part!r} part" if part else "it has an empty part (// or a trailing /)"
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            return f"a part of it is longer than {NAME_MAX} bytes"
    if posixpath.normpath(name) != name:
        return "it changes under path normalisation"
    folded = unicodedata.normalize("NFKC", name)
    if folded != name and (folded.count("/") != name.count("/") or _folds_unsafe(folded)):
        return "it holds characters that fold into '/', '\\' or '.' (Unicode look-alikes)"
    return None


def _folds_unsafe(name: str) -> str | None:
    """The separators and dot parts of an NFKC-folded name (what a look-alike would turn into)."""
    if "\\" in name or name.startswith("/"):
        return "separator"
    return next(("dot part" for p in name.split("/") if p in ("", ".", "..")), None)


def check(name: object, what: str, error: type[RigsmithError] = PathRefused) -> str:
    """``name`` when it is a safe relative name; else ``error`` naming ``what`` (the file and field)."""
    why = why_unsafe(name)
    if why is not None:
        raise error(
            f"{what}: {name!r} is not a path inside its directory ({why}); refused, nothing was written",
            hint="a name from a bundle, lock, listing, index or archive must be a plain relative path; check "
            "where the file came from",
        )
    assert isinstance(name, str)
    return name


def _no_symlink(root: Path, rel: str, what: str, error: type[RigsmithError], *, last: bool) -> Path:
    """``root / rel``, refusing an existing symlink on the way (the last part too when ``last``)."""
    path = root
    parts = rel.split("/")
    for i, part in enumerate(parts):
        path = path / part
        if i == len(parts) - 1 and not last:
            break
        try:
            st = path.lstat()
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise error(f"{what}: {rel!r}: a part of the way to it is a file, not a directory") from None
        if stat.S_ISLNK(st.st_mode):
            raise error(
                f"{what}: {rel!r} would pass through the symlink {path}; nothing was written",
                hint="remove the link (rigsmith never follows a link inside a directory it fills)",
            )
    return root / rel


def under(root: Path, name: object, what: str, error: type[RigsmithError] = PathRefused) -> Path:
    """The path of ``name`` under ``root``, checked as text and against symlinks already on disk."""
    return _no_symlink(root, check(name, what, error), what, error, last=True)


def make_dirs(root: Path, name: str, what: str, error: type[RigsmithError] = PathRefused) -> Path:
    """Create the directories of ``name`` (a file's name) under ``root``, one at a time, never through a
    symlink; returns the file's path."""
    rel = check(name, what, error)
    path = root
    for part in rel.split("/")[:-1]:
        path = path / part
        try:
            path.mkdir()
        except FileExistsError:
            if path.is_symlink() or not path.is_dir():
                raise error(f"{what}: {rel!r}: {path} is a link or a file, not a directory") from None
    return _no_symlink(root, rel, what, error, last=True)


def open_regular(root: Path, name: object, what: str, error: type[RigsmithError] = PathRefused) -> BinaryIO:
    """Open ``name`` under ``root`` for reading: no symlink on the way, and a regular file (a FIFO, a
    device or a socket is refused without blocking)."""
    path = under(root, name, what, error)
    return open_file(path, what, error)


def open_file(path: Path, what: str, error: type[RigsmithError] = PathRefused) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (not a link, FIFO, device or socket)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{what}: {path} does not exist") from None
    except OSError as err:
        raise error(f"{what}: {path} cannot be opened as a plain file ({err.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{what}: {path} is not a regular file (a directory, FIFO, device or socket); refused")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(root: Path, name: object, what: str, error: type[RigsmithError] = PathRefused) -> bytes:
    """The bytes of a regular file under ``root`` (see :func:`open_regular`)."""
    with open_regular(root, name, what, error) as fh:
        return fh.read()
