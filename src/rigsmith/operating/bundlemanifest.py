"""A bundle's manifest (``manifest.json``: every member's size and sha256, the lock's sha256, the image pin)
and the rule for a member's name. The manifest is untrusted on the offline side: it is read into frozen
models, and a member is only ever a safe name of a regular file inside the bundle. What each model,
source-tree and asset member must hash to comes from the bundle's lock, not from the manifest. See
:mod:`.bundle`.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rigsmith import confine
from rigsmith.errors import RigsmithError
from rigsmith.resolving.verified import STATE_DIR

FORMAT = "rigsmith-bundle/2"
MANIFEST = "manifest.json"
LOCK_MEMBER = "rigsmith.lock"
IMAGE_MEMBER = "image/engine.oci.tar"
MODEL_PREFIX = "model/"
SECONDARY_PREFIX = "secondary/"
SOURCES_PREFIX = "sources/"
ARTIFACT_PREFIX = "artifacts/"
DEFAULT_TARGETS = ("podman",)


class BundleError(RigsmithError):
    """A bundle is incomplete, tampered with, or does not match its lock."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Member(_M):
    """One file of the bundle."""

    size: int
    sha256: str


class ImageEntry(_M):
    """The engine image archive and the pin it must match."""

    member: str
    name: str
    tag: str | None
    digest: str | None
    image_id: str | None
    pinned_ref: str
    config_digest: str


class Manifest(_M):
    """``manifest.json``."""

    format: str = FORMAT
    deployment: str
    lock_sha256: str
    image: ImageEntry | None = None
    targets: list[str] = Field(default_factory=list)
    members: dict[str, Member] = Field(default_factory=dict)


def dump_manifest(m: Manifest) -> str:
    return json.dumps(m.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def read_manifest(bundle: Path) -> Manifest:
    """The bundle's manifest, or a BundleError saying the bundle is incomplete or not one."""
    path = bundle / MANIFEST
    again = "run `invoke bundle OUT` again on the connected machine"
    try:
        m = Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise BundleError(
            f"{bundle} is not a complete bundle: {MANIFEST} is missing",
            hint=f"an interrupted bundle has no manifest (it is written last): {again} and copy the whole "
            "directory",
        ) from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:200]
        raise BundleError(
            f"{path}: not a rigsmith bundle manifest ({err.error_count()} problem(s); first: "
            f"{where + ': ' if where else ''}{first['msg']})",
            hint=f"unbundle reads the manifest.json that bundle writes; {again}",
        ) from None
    except (OSError, ValueError) as err:
        raise BundleError(f"{path}: not a rigsmith bundle manifest ({err})") from None
    if m.format != FORMAT:
        raise BundleError(f"{path}: format {m.format!r}, this rigsmith reads {FORMAT!r}", hint=again)
    return m


def member_path(bundle: Path, member: str) -> Path:
    """The file of a member: a safe name (:mod:`rigsmith.confine`), not the bundle's verified-file record,
    and on disk a regular file reached through no symlink (the manifest and the directory are untrusted)."""
    where = f"{bundle / MANIFEST}: member"
    confine.check(member, where, BundleError)
    if member.split("/")[0] == STATE_DIR:
        raise BundleError(f"{where} {member!r} is not a path inside the bundle's members (book-keeping)")
    path = confine.under(bundle, member, where, BundleError)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"{where} {member!r}: {path} is not a regular file (a link, FIFO or device)",
                          hint="copy the bundle again from the connected machine")  # fmt: skip
    return path
