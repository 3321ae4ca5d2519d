"""``rigsmith.lock``: the resolved facts. Written only by pin / fetch-model / build.

JSON with sorted keys (diff-friendly), updated under a file lock so concurrent steps do not lose each
other's entries: ``with locked(path) as lock: lock.images[ref] = ...`` reads, lets you change, writes, and
keeps the new text in the lock's history (``rigsmith.resolving.lock.lockhistory``) when it changed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from rigsmith import confine
from rigsmith.errors import LockError
from rigsmith.resolving.lock import lockhistory
from rigsmith.writer import write_one

#: Version 2 added ``secondary`` (secondary Hub models); a lock without them is still written as version 1,
#: byte for byte as before, and a version 1 lock reads as one with no secondary models.
LOCK_VERSION = 2
LOCK_VERSIONS = (1, 2)

# The lock is committed and edited by hand; its hashes and digests become file names and image references,
# so each is held to its exact shape (a hostile or mangled value is a LockError, not a path or a ref).
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Sha1 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
#: A git commit of a source tree (SHA-1, or SHA-256 in a sha256 repository): it becomes a bundle member's
#: name and a git refspec, so nothing else (``x:refs/heads/y``, ``--opt``, ``../``) may pass.
GitCommit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")]


def _repo_path(v: str) -> str:
    why = confine.why_unsafe(v)
    if why is not None:
        raise ValueError(f"{v!r} is not a file path inside the repo ({why})")
    return v


#: A file of a repo snapshot: it becomes a path under the model dir, so it passes the confinement rule.
RepoPath = Annotated[str, AfterValidator(_repo_path)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LockedFile(_M):
    """One file of a model snapshot as the Hub describes it."""

    size: int = Field(ge=0)
    sha256: Sha256 | None = None  # LFS files
    git_sha1: Sha1 | None = None  # small (non-LFS) files: git blob sha1


def file_changes(
    old: dict[str, LockedFile], new: dict[str, LockedFile]
) -> list[tuple[str, str, LockedFile | None, LockedFile | None]]:
    """Pure: ``(sign, path, old, new)`` per file added (+), removed (-) or changed (~), by path."""
    out: list[tuple[str, str, LockedFile | None, LockedFile | None]] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a != b:
            out.append(("+" if a is None else "-" if b is None else "~", path, a, b))
    return out


class LockedPatch(_M):
    """A checkpoint config patch applied after verification."""

    file: RepoPath
    original_sha256: Sha256
    patched_sha256: Sha256


class LockedModel(_M):
    """A model repo at an exact commit."""

    repo: str
    requested: str | None = None  # what the spec asked for (branch, tag or sha)
    commit: Sha1
    files: dict[RepoPath, LockedFile] = Field(default_factory=dict)
    patches: list[LockedPatch] = Field(default_factory=list)


class LockedImage(_M):
    """An image tag resolved to a registry digest."""

    digest: Digest
    media_type: str | None = None


class LockedBuild(_M):
    """An image rigsmith built."""

    ref: str  # repository the digest belongs to, e.g. 127.0.0.1:5000/vllm-3x3090
    image_id: Digest
    digest: Digest | None = None  # registry digest after a push
    base: str  # name@sha256:…
    patches: dict[str, str] = Field(default_factory=dict)  # patch file → sha256
    inputs_sha256: str | None = None
    provides: list[str] | None = None  # absolute paths the image definition puts in (tree dest, files)

    @property
    def pinned_ref(self) -> str:
        """name@sha256:… when pushed, else the local image ID."""
        return f"{self.ref}@{self.digest}" if self.digest else self.image_id


class LockedAsset(_M):
    """A release asset of a source tree: its URL and the sha256 verified before every use."""

    url: str
    sha256: Digest  # becomes a file name in the asset cache and a bundle member's name
    size: int = Field(ge=0)


class LockedSource(_M):
    """The source tree of an image: a git ref resolved to a commit, and its assets."""

    repo: str
    ref: str  # what image.yaml asked for (branch, tag or short sha)
    commit: GitCommit
    assets: dict[str, LockedAsset] = Field(default_factory=dict)


class Lock(_M):
    """The whole lock file."""

    version: int = LOCK_VERSION
    models: dict[str, LockedModel] = Field(default_factory=dict)  # key: deployment name
    #: Secondary Hub models (draft, tokenizer, LoRA): deployment name → repo → the locked snapshot.
    secondary: dict[str, dict[str, LockedModel]] = Field(default_factory=dict)
    images: dict[str, LockedImage] = Field(default_factory=dict)  # key: image reference as written
    builds: dict[str, LockedBuild] = Field(default_factory=dict)  # key: images/<name>
    sources: dict[str, LockedSource] = Field(default_factory=dict)  # key: images/<name>


@dataclass(frozen=True)
class Slot:
    """Where one model's entry lives: the deployment's main model (``models[NAME]``) or one of its
    secondary models (``secondary[NAME][REPO]``)."""

    deployment: str
    repo: str | None = None

    def get(self, lock: Lock) -> LockedModel | None:
        if self.repo is None:
            return lock.models.get(self.deployment)
        return lock.secondary.get(self.deployment, {}).get(self.repo)

    def put(self, lock: Lock, entry: LockedModel | None) -> None:
        """Set (or, with None, drop) the entry."""
        if self.repo is None:
            table = lock.models
            key = self.deployment
        else:
            table = lock.secondary.setdefault(self.deployment, {})
            key = self.repo
        if entry is None:
            table.pop(key, None)
        else:
            table[key] = entry


def first_problem(err: ValidationError) -> str:
    """The first problem pydantic found in an untrusted lock or manifest, as ``field.path: message``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])[:200]
    return f"{where + ': ' if where else ''}{first['msg']}"


def read(path: Path) -> Lock:
    """The lock at ``path``, empty if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Lock()
    except UnicodeDecodeError as err:
        raise LockError(
            f"{path} is not a valid rigsmith lock: byte {err.start} is not UTF-8 text",
            hint="restore it from git, or delete it and re-run `invoke pin`",
        ) from None
    except OSError as err:
        raise LockError(
            f"cannot read {path}: {err.strerror}",
            hint="rigsmith.lock must be a readable file; restore it from git, or delete it and re-run "
            "`invoke pin`",
        ) from None
    return parse(text, str(path), hint="restore it from git, or delete it and re-run `invoke pin`")


def parse(text: str, where: str, hint: str) -> Lock:
    """A lock's text parsed, or a LockError naming ``where`` (the file or history entry) with ``hint``."""
    try:
        lock = Lock.model_validate_json(text)
    except ValidationError as err:
        raise LockError(f"{where} is not a valid rigsmith lock: {first_problem(err)}", hint=hint) from None
    if lock.version not in LOCK_VERSIONS:
        raise LockError(
            f"{where} is a version {lock.version} rigsmith lock; this rigsmith reads versions "
            f"{', '.join(map(str, LOCK_VERSIONS))}",
            hint="update rigsmith, or restore the lock from git",
        )
    return lock


def dumps(lock: Lock) -> str:
    """Stable JSON text."""
    data = lock.model_dump(mode="json", exclude_none=True)
    if not data["sources"]:
        del data["sources"]  # a lock without source trees stays as it was before the table existed
    data["secondary"] = {k: v for k, v in data["secondary"].items() if v}
    if data["secondary"]:
        data["version"] = LOCK_VERSION
    else:
        del data["secondary"]  # nor one without secondary models: version 1, as before
        data["version"] = 1
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


@contextmanager
def locked(path: Path) -> Iterator[Lock]:
    """Read-modify-write the lock under a cross-process file lock."""
    from filelock import FileLock  # 14 ms (-X importtime, asyncio with it) deploy --check, a reader, skips

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".flock", timeout=600):
        lock = read(path)
        before = dumps(lock) if path.exists() else None
        yield lock
        after = dumps(lock)
        write_one(path, after)
        # Every change is kept (.rigsmith/locks/), under the same file lock, so rows never interleave.
        lockhistory.record(path, before, after)
