"""Untrusted archives of source trees and release assets, unpacked in memory once the members' declared sizes
passed the budget and the memory available now: nothing escapes the tree.

Refused as a whole: an absolute name, ``..``, a link leaving the tree (or a file below a symlink), a device, a
duplicate member, an unpack larger than the limit. Pure (bytes in, files out).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Mapping
from pathlib import PurePosixPath

from rigsmith import confine
from rigsmith.errors import RigsmithError
from rigsmith.resolving.image.image import ContextFile


class ArchiveError(RigsmithError):
    """An archive (a git tree or a release asset) holds a member that cannot be unpacked safely."""


def _member_path(raw: str, what: str) -> str:
    """A member's name, checked by the one confinement rule (``./`` in front is tar's, not the author's)."""
    name = raw.removeprefix("./")
    return confine.check(name, f"{what}: member", ArchiveError)


#: The most an archive may unpack to (a tree or an asset): a compression bomb stops here.
MAX_UNPACKED = 16 << 30


def unpack_tar(
    data: bytes, what: str, into: str = ".", *, max_bytes: int = MAX_UNPACKED
) -> dict[str, ContextFile]:
    """The regular files and inside-pointing symlinks of a tar (any compression), tree-relative under
    ``into``. Refuses absolute names, '..', links leaving the tree, devices, duplicates and a member
    below a symlink. Pure: nothing is written."""
    out: dict[str, ContextFile] = {}
    base = PurePosixPath(into)
    total = 0
    _presize(data, what, max_bytes)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar:
                if m.isdir() or m.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                    continue
                rel = str(base / _member_path(m.name, what))
                if rel in out:
                    raise ArchiveError(f"{what}: member {m.name!r} appears twice", hint="refused as a whole")
                if m.issym() or m.islnk():
                    target = PurePosixPath(m.linkname)
                    resolved = (
                        _normalize(PurePosixPath(rel).parent / target) if m.issym() else _normalize(target)
                    )
                    if target.is_absolute() or resolved is None:
                        raise ArchiveError(
                            f"{what}: link {m.name!r} -> {m.linkname!r} points outside the tree",
                            hint="the archive is refused as a whole; check where it came from",
                        )
                    if m.islnk():
                        src = out.get(str(base / resolved))
                        if src is None or src.link is not None:
                            raise ArchiveError(f"{what}: hard link {m.name!r} to a file not before it")
                        out[rel] = src
                    else:
                        out[rel] = ContextFile(b"", 0o777, m.linkname)
                    continue
                if not m.isreg():
                    raise ArchiveError(f"{what}: member {m.name!r} is not a file, directory or link")
                total += m.size
                if total > max_bytes:
                    raise ArchiveError(
                        f"{what}: unpacks to more than {max_bytes} bytes (at member {m.name!r})",
                        hint="the archive is refused; check that the URL names the asset you meant",
                    )
                f = tar.extractfile(m)
                assert f is not None
                out[rel] = ContextFile(f.read(), 0o755 if m.mode & 0o111 else 0o644)
    except tarfile.TarError as err:
        raise ArchiveError(f"{what}: not a readable tar archive ({err})") from None
    links = {k for k, v in out.items() if v.link is not None}
    for rel in out:
        parents = {str(p) for p in PurePosixPath(rel).parents}
        if parents & links:
            raise ArchiveError(f"{what}: member {rel!r} lies below a symlink", hint="the archive is refused")
    return out


def _presize(data: bytes, what: str, max_bytes: int) -> None:
    """Sum the members' declared sizes from the headers alone (nothing is kept) and refuse an archive that
    would unpack past ``max_bytes`` or past half of the memory available now, before a byte is read."""
    declared = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar:
                declared += m.size if m.isreg() else 0
    except tarfile.TarError as err:
        raise ArchiveError(f"{what}: not a readable tar archive ({err})") from None
    budget = min(max_bytes, available_memory() // 2)
    if declared > budget:
        raise ArchiveError(
            f"{what}: its members declare {declared} bytes unpacked, more than the {budget} bytes this "
            "machine can hold in memory for it; refused before unpacking",
            hint="check that the URL names the asset you meant (a compression bomb looks like this)",
        )


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable), or the physical total where /proc is not there."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:  # noqa: PTH123 (a kernel file, read once)
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _normalize(p: PurePosixPath) -> PurePosixPath | None:
    """``p`` with '..' resolved lexically; None when it climbs above the root."""
    parts: list[str] = []
    for part in p.parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def merge_tree(
    tree: Mapping[str, ContextFile], assets: Mapping[str, Mapping[str, ContextFile]]
) -> dict[str, ContextFile]:
    """The commit's files plus each asset's (in declaration order); an asset never replaces a file."""
    out = dict(tree)
    for asset, files in assets.items():
        clash = sorted(set(files) & set(out))
        if clash:
            raise ArchiveError(
                f"asset {asset!r} would replace {len(clash)} file(s) of the tree, e.g. {clash[0]!r}",
                hint="unpack it into another directory (tree.assets[].unpack) or drop the clashing files",
            )
        out.update(files)
    links = {k for k, v in out.items() if v.link is not None}
    for rel in out:
        if {str(p) for p in PurePosixPath(rel).parents} & links:
            raise ArchiveError(f"{rel!r} lies below a symlink of the tree", hint="the asset is refused")
    return out
