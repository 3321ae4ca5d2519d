"""Pure core of model fetching: which files, what hashes, what must happen, what a patch does.

Nothing here touches the network. The few functions that read the disk take the paths they read as
arguments and say so; everything else is a function of data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any, BinaryIO

from rigsmith import confine, userhome
from rigsmith.digits import ascii_digits
from rigsmith.errors import AdapterError, PreflightError, RigsmithError, SpecError
from rigsmith.resolving.lock.lock import LockedFile, LockedModel, file_changes
from rigsmith.resolving.model.verified import STATE_DIR as STATE_DIR
from rigsmith.resolving.model.verified import HashKind as HashKind
from rigsmith.spec import ConfigPatch

#: rigsmith's book-keeping inside a model dir (STATE_DIR): the verified-file record, partial downloads,
#: the Hub's bytes of a patched config file (ORIGINAL_DIR); and huggingface_hub's temp files.
PARTIAL_DIR = "partial"
ORIGINAL_DIR = "original"
HF_DOWNLOAD_DIR = ".cache/huggingface/download"
HASH_CHUNK = 8 * 1024 * 1024
#: How many files download and hash at once, like ``hf download`` (hashlib releases the GIL on large
#: buffers, so the threads really overlap).
WORKERS = 8
MAX_WORKERS = 64
_HUB_HINT = "check HF_ENDPOINT: it must be a Hugging Face Hub (or a mirror of its API)"


class HashMismatch(RigsmithError):
    """A downloaded or on-disk file does not hash to what the Hub says."""


class Stopped(Exception):
    """A download was told to stop (Ctrl-C): raised by the sink, or by the Hub adapter between attempts."""


class Hasher:
    """Incremental sha256 or git-blob-sha1 (``sha1("blob <size>\\0" + bytes)``) of a file of known size."""

    def __init__(self, kind: HashKind, size: int) -> None:
        h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)
        self.update, self.hexdigest = h.update, h.hexdigest


def hash_stream(
    kind: HashKind, size: int, stream: BinaryIO, limit: int | None = None, stop: Event | None = None
) -> Hasher:
    """Hash ``stream`` from its position (``limit`` bytes, or to EOF) into a fresh Hasher; raises
    :class:`Stopped` once ``stop`` is set (Ctrl-C), looked at every :data:`HASH_CHUNK` bytes."""
    h, view = Hasher(kind, size), memoryview(bytearray(HASH_CHUNK))
    left = -1 if limit is None else limit  # -1: to EOF
    while left and (n := stream.readinto(view[: left if 0 < left < HASH_CHUNK else HASH_CHUNK])):  # type: ignore[attr-defined]
        if stop is not None and stop.is_set():
            raise Stopped("stopped while hashing")
        h.update(view[:n])
        left -= n
    return h


def hash_file(path: Path, kind: HashKind, size: int, stop: Event | None = None) -> str:
    """Hex digest of a whole file (reads ``path``); ``stop`` as for :func:`hash_stream`."""
    with path.open("rb") as fh:
        return hash_stream(kind, size, fh, stop=stop).hexdigest()


def describe_repin(old: LockedModel | None, new: LockedModel) -> list[str]:
    """Human lines saying what a (re-)pin changed, for the user to read before fetching."""
    ref = new.requested or "main"
    if old is None:
        what = f" at {new.commit}" if ref == new.commit else f"@{ref} -> {new.commit}"
        return [f"pinned {new.repo}{what} ({len(new.files)} files)"]
    if old.commit == new.commit and old.repo == new.repo:
        return [f"{new.repo}@{ref} still at {new.commit}: nothing changed"]
    repo = new.repo if old.repo == new.repo else f"{old.repo} -> {new.repo}"
    lines = [f"re-pinned {repo}@{ref}: {old.commit} -> {new.commit}"]
    for sign, path, a, b in file_changes(old.files, new.files):
        sizes = "" if b is None else f" ({b.size} bytes)" if a is None else f" ({a.size} -> {b.size} bytes)"
        lines.append(f"  {sign} {path}{sizes}")
    return lines if len(lines) > 1 else [*lines, "  (same files, same hashes)"]


def select(
    files: Mapping[str, LockedFile], allow: Sequence[str], ignore: Sequence[str]
) -> dict[str, LockedFile]:
    """The files a fetch wants: huggingface_hub's own allow/ignore pattern semantics."""
    if not allow and not ignore:
        return dict(sorted(files.items()))
    # huggingface_hub only with patterns: a warm run loads none of it (tests/resolving/test_fetch_warm.py).
    from huggingface_hub.utils import filter_repo_objects

    keep = filter_repo_objects(
        list(files), allow_patterns=list(allow) or None, ignore_patterns=list(ignore) or None
    )
    return {p: files[p] for p in sorted(keep)}


def safe_relpath(
    path: object, where: str = "the Hub or the lock", error: type[RigsmithError] = RigsmithError
) -> str:
    """``path`` (a repo file path from the Hub or the lock: untrusted) when it may be written under a model
    dir: the one confinement rule (:func:`rigsmith.confine.why_unsafe`), and not inside rigsmith's or
    huggingface_hub's book-keeping. Otherwise ``error``, naming ``where`` it came from."""
    why = confine.why_unsafe(path)
    if why is None and (top := str(path).split("/")[0]) in (STATE_DIR, ".cache"):
        why = f"it is inside {top}/, the download book-keeping"
    if why is not None:
        raise error(
            f"{where}: refusing the file {path!r}: {why}",
            hint="rigsmith writes only plain relative paths under the model dir; check repo and HF_ENDPOINT",
        )
    return str(path)


def remote_files(entries: Sequence[object], source: str) -> dict[str, LockedFile]:
    """The files of a Hub tree listing (``/api/models/REPO/tree/COMMIT?recursive=true``, untrusted JSON
    items from ``source``) by path, with the hash the lock keeps (sha256 for LFS files, else the git blob
    sha1), each checked: an entry that is not a tree entry, lacks a size or hash, names a
    path that cannot be written safely (:func:`safe_relpath`) or comes twice raises :class:`AdapterError`."""
    out: dict[str, LockedFile] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or e.get("type") not in ("file", "directory"):
            why = f"entry {i} is not a tree entry (an object with type file or directory)"
            raise AdapterError(f"{source}: {why}", hint=_HUB_HINT)
        path = safe_relpath(e.get("path"), source, AdapterError)
        if e["type"] == "directory":
            continue
        size, oid, lfs = e.get("size"), e.get("oid"), e.get("lfs")
        sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
        if (
            type(size) is not int
            or size < 0
            or not _hex(oid, 40)
            or (lfs is not None and not _hex(sha256, 64))
        ):
            why = "lacks a size or a hash (size: a whole number, oid: 40 hex, lfs.oid: 64 hex)"
            raise AdapterError(f"{source}: the entry for {path!r} {why}", hint=_HUB_HINT)
        if path in out:
            raise AdapterError(f"{source}: the file {path!r} is listed twice", hint="check HF_ENDPOINT")
        out[path] = LockedFile(size=size, sha256=sha256) if sha256 else LockedFile(size=size, git_sha1=oid)
    return out


def _hex(value: object, digits: int) -> bool:
    return isinstance(value, str) and re.fullmatch(f"[0-9a-f]{{{digits}}}", value) is not None


@dataclass(frozen=True)
class Want:
    """One file the fetch must end with on disk, where, and with which hash."""

    repo_path: str
    disk_path: str  # relative to local_dir (the pristine copy of a patched file lives in .rigsmith/original)
    size: int
    kind: HashKind
    digest: str

    @property
    def partial_name(self) -> str:
        """The file's digest and its path: two files with the same bytes (two ``{}`` configs) must not
        share one partial file while both download."""
        return f"{self.digest}-{hashlib.sha256(self.repo_path.encode()).hexdigest()[:16]}.incomplete"


def wants(files: Mapping[str, LockedFile], patched: Collection[str]) -> list[Want]:
    """Where each selected file's verified Hub bytes must land, and the hash the Hub vouches for: sha256 for
    LFS files, the git blob sha1 for small ones."""
    out = []
    for p, f in files.items():
        digest = f.sha256 or f.git_sha1
        if not digest:
            raise RigsmithError(
                f"{p}: a locked file has neither sha256 nor git_sha1", hint="re-pin with `invoke pin`"
            )
        disk = f"{STATE_DIR}/{ORIGINAL_DIR}/{p}" if p in patched else p
        out.append(Want(safe_relpath(p), disk, f.size, "sha256" if f.sha256 else "git_sha1", digest))
    return out


def stale_partials(partial_names: Iterable[str], wanted: Iterable[Want]) -> list[str]:
    """Partial downloads no current file can resume from (other commit, killed run of another spec)."""
    keep = {w.partial_name for w in wanted}
    return sorted(n for n in partial_names if n not in keep)


def check_disk(needed: int, free: int, where: Path) -> None:
    """Refuse to start when the bytes still to download do not fit."""
    if needed > free:
        raise PreflightError(
            f"not enough disk space in {where}: the download needs {gib(needed)} more, {gib(free)} is free",
            hint="free some space, or pass --dest DIR on a bigger disk",
        )


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def patch_json(original: bytes, patches: Sequence[tuple[int, ConfigPatch]], file: str) -> bytes:
    """Apply dotted-key patches ((index in spec.model.config_patches, patch) pairs for ``file``, in spec
    order) to JSON bytes; deterministic output (2-space indent, trailing newline). A file that is not UTF-8
    JSON, or a key that cannot be set, is a :class:`SpecError` naming ``model.config_patches[i]``."""
    try:
        data = json.loads(original.decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError too
        what = "UTF-8 text" if isinstance(err, UnicodeDecodeError) else f"JSON: {err}"
        field = f"model.config_patches[{patches[0][0]}].file"
        raise SpecError("model.config_patches", [(field, f"{file} is not {what}")]) from None
    problems = []
    for i, p in patches:
        node: Any = data
        keys = p.key.split(".")
        for depth, k in enumerate(keys[:-1]):
            if isinstance(node, dict) and node.get(k) is None:
                node[k] = {}
            node = node.get(k) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                where = ".".join(keys[: depth + 1])
                problems.append((f"model.config_patches[{i}].key", f"{where} in {file} is not an object"))
                break
        else:
            if not isinstance(node, dict):
                problems.append((f"model.config_patches[{i}].key", f"{file} is not a JSON object"))
            else:
                node[keys[-1]] = p.value
    if problems:
        raise SpecError("model.config_patches", problems)
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def patches_by_file(patches: Sequence[ConfigPatch]) -> dict[str, list[tuple[int, ConfigPatch]]]:
    out: dict[str, list[tuple[int, ConfigPatch]]] = {}
    for i, p in enumerate(patches):
        out.setdefault(p.file, []).append((i, p))
    return out


def check_patch_files(patches: Sequence[ConfigPatch], has: Callable[[str], bool], where: str) -> None:
    """Every patched file must be one that ``has`` (the fetch downloads it, or the checkpoint holds it)."""
    problems = [
        (f"model.config_patches[{i}].file", f"{p.file} is not {where}")
        for i, p in enumerate(patches)
        if not has(p.file)
    ]
    if problems:
        raise SpecError("model.config_patches", problems)


def token_from(env: Mapping[str, str], read: Callable[[Path], str | None]) -> str | None:
    """HF_TOKEN, then HUGGING_FACE_HUB_TOKEN, then the token file (HF_TOKEN_PATH or $HF_HOME/token)."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip()
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = Path(env.get("HF_TOKEN_PATH") or Path(env.get("HF_HOME") or cache / "huggingface") / "token")
    text = read(path)
    return text.strip() or None if text else None


def read_text_or_none(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


@dataclass
class FetchReport:
    """What one fetch did; the task prints it, the tests assert on it."""

    commit: str = ""
    local_dir: str = ""
    files: int = 0
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    resumed_bytes: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    cached: int = 0
    cleaned: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    #: A local checkpoint (``model.repo: null``): what is on disk, nothing downloaded or verified.
    local: bool = False
    local_bytes: int = 0
    weight_files: int = 0
    has_config: bool = False
    #: The secondary models fetched after the main one (repo, its report).
    secondary: list[tuple[str, FetchReport]] = field(default_factory=list)

    def summary(self) -> str:
        """The main model's line, then one per secondary model."""
        return "\n".join([self._line(), *(f"{repo}: {r._line()}" for repo, r in self.secondary)])

    def _line(self) -> str:
        if self.local:
            parts = [
                "local checkpoint (model.repo is null): nothing downloaded or verified",
                f"{self.files} files ({gib(self.local_bytes)}) in {self.local_dir}",
                f"{self.weight_files} weight file(s)",
                "config.json present" if self.has_config else "no config.json",
            ]
            kept = f" (original kept in {STATE_DIR}/{ORIGINAL_DIR}/)"
        else:
            resumed = f", {gib(self.resumed_bytes)} resumed" if self.resumed_bytes else ""
            parts = [
                f"{self.files} files at {self.commit[:12]} in {self.local_dir}",
                f"{len(self.downloaded)} downloaded ({gib(self.downloaded_bytes)}{resumed})",
                f"{self.hashed_files} hashed",
                f"{self.cached} verified earlier",
            ]
            if self.cleaned:
                parts.append(f"{len(self.cleaned)} stale partial(s) removed")
            kept = ""
        if self.patched:
            parts.append(f"patched {', '.join(self.patched)}{kept}")
        return "; ".join(parts)


def expand_dir(text: str, env: Mapping[str, str] = os.environ) -> Path:
    """``~/x`` and ``$HOME``-style values as an absolute path (at the edge, from the caller's environment;
    ``~`` is the invoking user's home, SUDO_USER's under sudo: rigsmith.userhome)."""
    return Path(userhome.expand(text, userhome.invoking_home(env))).absolute()


def parse_workers(text: object) -> int:
    """``--workers`` as given on the command line: a whole number from 1 to :data:`MAX_WORKERS`."""
    raw = str(text).strip()
    if not (ascii_digits(raw)) or not 1 <= int(raw) <= MAX_WORKERS:
        shown = raw if len(raw) <= 20 else raw[:20] + "…"
        raise RigsmithError(
            f"--workers {shown!r}: must be a whole number from 1 to {MAX_WORKERS}",
            hint=f"the default, {WORKERS}, matches `hf download`",
        )
    return int(raw)
