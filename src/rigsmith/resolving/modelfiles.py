"""Pure core of model fetching: which files, what hashes, what must happen, what a patch does.

Nothing here touches the network. The few functions that read the disk take the paths they read as
arguments and say so; everything else is a function of data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any, BinaryIO

from rigsmith import confine, userhome
from rigsmith.errors import AdapterError, PreflightError, RigsmithError, SpecError
from rigsmith.resolving.lock import LockedFile, LockedModel, LockedPatch, file_changes
from rigsmith.resolving.verified import STATE_DIR as STATE_DIR
from rigsmith.resolving.verified import STATE_FILE as STATE_FILE
from rigsmith.resolving.verified import DirState as DirState
from rigsmith.resolving.verified import FileState as FileState
from rigsmith.resolving.verified import HashKind as HashKind
from rigsmith.resolving.verified import Seen as Seen
from rigsmith.resolving.verified import dump_state as dump_state
from rigsmith.resolving.verified import read_state as read_state
from rigsmith.resolving.verified import seen as seen
from rigsmith.resolving.verified import seen_at as seen_at
from rigsmith.resolving.verified import verified as verified
from rigsmith.resolving.verified import vouches as vouches
from rigsmith.spec import ConfigPatch

#: rigsmith's book-keeping inside a model dir (STATE_DIR): the verified-file record (STATE_FILE), partial
#: downloads, the Hub's bytes of a patched config file (ORIGINAL_DIR); and huggingface_hub's temp files.
PARTIAL_DIR = "partial"
ORIGINAL_DIR = "original"
HF_DOWNLOAD_DIR = ".cache/huggingface/download"
HASH_CHUNK = 8 * 1024 * 1024
#: How many files download and hash at once, like ``hf download`` (hashlib releases the GIL on large
#: buffers, so the threads really overlap).
WORKERS = 8
MAX_WORKERS = 64


class HashMismatch(RigsmithError):
    """A downloaded or on-disk file does not hash to what the Hub says."""


class Stopped(Exception):
    """A download was told to stop (Ctrl-C): raised by the sink, or by the Hub adapter between attempts."""


# --------------------------------------------------------------------------------------------------
# Hashes


def expected_hash(f: LockedFile) -> tuple[HashKind, str]:
    """The hash the Hub vouches for: sha256 for LFS files, the git blob sha1 for small ones."""
    if f.sha256:
        return "sha256", f.sha256
    if f.git_sha1:
        return "git_sha1", f.git_sha1
    raise RigsmithError("a locked file has neither sha256 nor git_sha1", hint="re-pin with `invoke pin`")


class Hasher:
    """Incremental sha256 or git-blob-sha1 (``sha1("blob <size>\\0" + bytes)``) of a file of known size."""

    def __init__(self, kind: HashKind, size: int) -> None:
        self.kind, self.size = kind, size
        self._h = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
        if kind == "git_sha1":
            self._h.update(b"blob %d\0" % size)

    def update(self, data: bytes | memoryview) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def hash_stream(
    kind: HashKind, size: int, stream: BinaryIO, limit: int | None = None, stop: Event | None = None
) -> Hasher:
    """Hash ``stream`` from its position (``limit`` bytes, or to EOF) into a fresh Hasher.

    Raises:
        Stopped: ``stop`` was set (Ctrl-C); checked every :data:`HASH_CHUNK` bytes.
    """
    h = Hasher(kind, size)
    left = limit
    view = memoryview(bytearray(HASH_CHUNK))
    while left is None or left > 0:
        if stop is not None and stop.is_set():
            raise Stopped("stopped while hashing")
        n = stream.readinto(view[: HASH_CHUNK if left is None else min(HASH_CHUNK, left)])  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
        if left is not None:
            left -= n
    return h


def hash_file(path: Path, kind: HashKind, size: int, stop: Event | None = None) -> str:
    """Hex digest of a whole file (reads ``path``); ``stop`` as for :func:`hash_stream`."""
    with path.open("rb") as fh:
        return hash_stream(kind, size, fh, stop=stop).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------------
# Tree → lock


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit, as the Hub's tree metadata describes it."""

    path: str
    size: int
    git_sha1: str  # blob id; for LFS files this is the sha1 of the *pointer*
    sha256: str | None  # LFS content hash

    def locked(self) -> LockedFile:
        if self.sha256:
            return LockedFile(size=self.size, sha256=self.sha256)
        return LockedFile(size=self.size, git_sha1=self.git_sha1)


def locked_model(repo: str, requested: str | None, commit: str, files: Iterable[RemoteFile]) -> LockedModel:
    """The lock entry for a resolved snapshot (all files of the commit; patterns apply at fetch)."""
    return LockedModel(
        repo=repo,
        requested=requested,
        commit=commit,
        files={f.path: f.locked() for f in sorted(files, key=lambda f: f.path)},
    )


def describe_repin(old: LockedModel | None, new: LockedModel) -> list[str]:
    """Human lines saying what a (re-)pin changed, for the user to read before fetching."""
    ref = new.requested or "main"
    if old is None:
        if ref == new.commit:
            return [f"pinned {new.repo} at {new.commit} ({len(new.files)} files)"]
        return [f"pinned {new.repo}@{ref} -> {new.commit} ({len(new.files)} files)"]
    if old.commit == new.commit and old.repo == new.repo:
        return [f"{new.repo}@{ref} still at {new.commit}: nothing changed"]
    lines = [f"re-pinned {new.repo}@{ref}: {old.commit} -> {new.commit}"]
    if old.repo != new.repo:
        lines[0] = f"re-pinned {old.repo} -> {new.repo}@{ref}: {old.commit} -> {new.commit}"
    for _sign, path, a, b in file_changes(old.files, new.files):
        if b is None:
            lines.append(f"  - {path}")
        elif a is None:
            lines.append(f"  + {path} ({b.size} bytes)")
        else:
            lines.append(f"  ~ {path} ({a.size} -> {b.size} bytes)")
    if len(lines) == 1:
        lines.append("  (same files, same hashes)")
    return lines


def select(
    files: Mapping[str, LockedFile], allow: Sequence[str], ignore: Sequence[str]
) -> dict[str, LockedFile]:
    """The files a fetch wants: huggingface_hub's own allow/ignore pattern semantics."""
    if not allow and not ignore:
        return dict(sorted(files.items()))
    from huggingface_hub.utils._paths import filter_repo_objects  # only with patterns: a warm run skips it

    keep = filter_repo_objects(
        list(files), allow_patterns=list(allow) or None, ignore_patterns=list(ignore) or None
    )
    return {p: files[p] for p in sorted(keep)}


_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def safe_relpath(
    path: object, where: str = "the Hub or the lock", error: type[RigsmithError] = RigsmithError
) -> str:
    """``path`` (a repo file path from the Hub or the lock: untrusted) when it may be written under a model
    dir: the one confinement rule (:func:`rigsmith.confine.why_unsafe`), and not inside rigsmith's or
    huggingface_hub's book-keeping. Otherwise ``error``, naming ``where`` it came from."""
    why = confine.why_unsafe(path)
    top = str(path).split("/")[0]
    if why is None and top in (STATE_DIR, ".cache"):
        why = f"it is inside {top}/, the download book-keeping"
    if why is not None:
        raise error(
            f"{where}: refusing the file {path!r}: {why}",
            hint="rigsmith writes only plain relative paths under the model dir; check repo and HF_ENDPOINT",
        )
    return str(path)


def remote_files(entries: Sequence[object], source: str) -> list[RemoteFile]:
    """The files of a Hub tree listing (``/api/models/REPO/tree/COMMIT?recursive=true``), each checked.

    Args:
        entries: the listing's JSON items, as received (untrusted).
        source: where they came from, for messages.

    Raises:
        AdapterError: an entry is not a Hub tree entry, or names a path that cannot be written safely
            (``.``, ``..``, absolute, NUL, an over-long name, a path escaping the model dir).
    """
    out: dict[str, RemoteFile] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or e.get("type") not in ("file", "directory"):
            raise AdapterError(
                f"{source}: entry {i} is not a tree entry (an object with type file or directory)",
                hint="check HF_ENDPOINT: it must be a Hugging Face Hub (or a mirror of its API)",
            )
        path = safe_relpath(e.get("path"), source, AdapterError)
        if e["type"] == "directory":
            continue
        size, oid, lfs = e.get("size"), e.get("oid"), e.get("lfs")
        sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
        if (
            not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(oid, str)
            or not _HEX40.match(oid)
            or (lfs is not None and not (isinstance(sha256, str) and _HEX64.match(sha256)))
        ):
            raise AdapterError(
                f"{source}: the entry for {path!r} lacks a size or a hash (size: a whole number, "
                "oid: 40 hex, lfs.oid: 64 hex)",
                hint="check HF_ENDPOINT: it must be a Hugging Face Hub (or a mirror of its API)",
            )
        if path in out:
            raise AdapterError(f"{source}: the file {path!r} is listed twice", hint="check HF_ENDPOINT")
        out[path] = RemoteFile(path, size, oid, sha256)
    return list(out.values())


# --------------------------------------------------------------------------------------------------
# Planning a fetch


@dataclass(frozen=True)
class Want:
    """One file the fetch must end with on disk, where, and with which hash."""

    repo_path: str  # path in the repo
    disk_path: (
        str  # path relative to local_dir (the pristine copy of a patched file lives in .rigsmith/original)
    )
    size: int
    kind: HashKind
    digest: str

    @property
    def partial_name(self) -> str:
        """The file's digest and its path: two files with the same bytes (two ``{}`` configs) must not
        share one partial file while both download."""
        where = hashlib.sha256(self.repo_path.encode()).hexdigest()[:16]
        return f"{self.digest}-{where}.incomplete"


def wants(files: Mapping[str, LockedFile], patched: Iterable[str]) -> list[Want]:
    """Where each selected file's verified Hub bytes must land."""
    patched = set(patched)
    out = []
    for p, f in files.items():
        kind, digest = expected_hash(f)
        disk = f"{STATE_DIR}/{ORIGINAL_DIR}/{p}" if p in patched else p
        out.append(Want(safe_relpath(p), disk, f.size, kind, digest))
    return out


def stale_partials(partial_names: Iterable[str], wanted: Iterable[Want]) -> list[str]:
    """Partial downloads no current file can resume from (other commit, killed run of another spec)."""
    keep = {w.partial_name for w in wanted}
    return sorted(n for n in partial_names if n not in keep)


def check_disk(needed: int, free: int, where: Path) -> None:
    """Refuse to start when the bytes still to download do not fit."""
    if needed > free:
        raise PreflightError(
            f"not enough disk space in {where}: the download needs {_gib(needed)} more, {_gib(free)} is free",
            hint="free some space, or pass --dest DIR on a bigger disk",
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# --------------------------------------------------------------------------------------------------
# Config patches


def patch_json(text: str, patches: Sequence[tuple[int, ConfigPatch]], file: str) -> str:
    """Apply dotted-key patches to JSON text; deterministic output (2-space indent, trailing newline).

    Args:
        text: the pristine file content.
        patches: (index in spec.model.config_patches, patch) pairs for this file, in spec order.
        file: the file name, for messages.

    Raises:
        SpecError: naming ``model.config_patches[i].key`` when the path cannot be set.
    """
    try:
        data = json.loads(text)
    except ValueError as err:
        raise SpecError(
            "model.config_patches",
            [(f"model.config_patches[{patches[0][0]}].file", f"{file} is not JSON: {err}")],
        ) from None
    problems = []
    for i, p in patches:
        node: Any = data
        keys = p.key.split(".")
        for depth, k in enumerate(keys[:-1]):
            nxt = node.get(k) if isinstance(node, dict) else None
            if nxt is None and isinstance(node, dict):
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                where = ".".join(keys[: depth + 1])
                problems.append((f"model.config_patches[{i}].key", f"{where} in {file} is not an object"))
                break
            node = nxt
        else:
            if not isinstance(node, dict):
                problems.append((f"model.config_patches[{i}].key", f"{file} is not a JSON object"))
            else:
                node[keys[-1]] = p.value
    if problems:
        raise SpecError("model.config_patches", problems)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def patches_by_file(patches: Sequence[ConfigPatch]) -> dict[str, list[tuple[int, ConfigPatch]]]:
    out: dict[str, list[tuple[int, ConfigPatch]]] = {}
    for i, p in enumerate(patches):
        out.setdefault(p.file, []).append((i, p))
    return out


def check_patch_files(patches: Sequence[ConfigPatch], files: Mapping[str, LockedFile]) -> None:
    """Every patched file must be one the fetch downloads."""
    problems = [
        (f"model.config_patches[{i}].file", f"{p.file} is not among the files fetched from the repo")
        for i, p in enumerate(patches)
        if p.file not in files
    ]
    if problems:
        raise SpecError("model.config_patches", problems)


def locked_patches(applied: Mapping[str, tuple[str, str]]) -> list[LockedPatch]:
    return [LockedPatch(file=f, original_sha256=a, patched_sha256=b) for f, (a, b) in sorted(applied.items())]


# --------------------------------------------------------------------------------------------------
# Tokens (never printed)


def token_from(env: Mapping[str, str], read: Callable[[Path], str | None]) -> str | None:
    """HF_TOKEN, then HUGGING_FACE_HUB_TOKEN, then the token file (HF_TOKEN_PATH or $HF_HOME/token)."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip()
    home = Path(
        env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    path = Path(env["HF_TOKEN_PATH"]) if env.get("HF_TOKEN_PATH") else home / "token"
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
                f"{self.files} files ({_gib(self.local_bytes)}) in {self.local_dir}",
                f"{self.weight_files} weight file(s)",
                "config.json present" if self.has_config else "no config.json",
            ]
            if self.patched:
                parts.append(
                    f"patched {', '.join(self.patched)} (original kept in {STATE_DIR}/{ORIGINAL_DIR}/)"
                )
            return "; ".join(parts)
        parts = [
            f"{self.files} files at {self.commit[:12]} in {self.local_dir}",
            f"{len(self.downloaded)} downloaded ({_gib(self.downloaded_bytes)}"
            + (f", {_gib(self.resumed_bytes)} resumed" if self.resumed_bytes else "")
            + ")",
            f"{self.hashed_files} hashed",
            f"{self.cached} verified earlier",
        ]
        if self.cleaned:
            parts.append(f"{len(self.cleaned)} stale partial(s) removed")
        if self.patched:
            parts.append(f"patched {', '.join(self.patched)}")
        return "; ".join(parts)


def expand_dir(text: str, env: Mapping[str, str] = os.environ) -> Path:
    """``~/x`` and ``$HOME``-style values as an absolute path (at the edge, from the caller's environment;
    ``~`` is the invoking user's home, SUDO_USER's under sudo: rigsmith.userhome)."""
    return Path(userhome.expand(text, userhome.invoking_home(env))).absolute()


def user_home() -> str:
    """The user's home directory, as the model-dir check judges ``model.local_dir`` against it (the invoking
    user's, SUDO_USER's under sudo: rigsmith.userhome)."""
    return userhome.invoking_home()


def parse_workers(text: object) -> int:
    """``--workers`` as given on the command line: a whole number from 1 to :data:`MAX_WORKERS`.

    Raises:
        RigsmithError: naming the flag and the range.
    """
    raw = str(text).strip()
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_WORKERS:
        shown = raw if len(raw) <= 20 else raw[:20] + "…"
        raise RigsmithError(
            f"--workers {shown!r}: must be a whole number from 1 to {MAX_WORKERS}",
            hint=f"the default, {WORKERS}, matches `hf download`",
        )
    return int(raw)
