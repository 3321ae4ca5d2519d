"""The pure build-context render of an image definition (:mod:`rigsmith.resolving.image.imagedef`).

Three steps, kept apart: :func:`imagedef.load` validates the YAML (no other file is read, so ``pin``
works while patch files are still missing); :func:`gather` reads the patch and extra files and refuses a
missing one by slot; :func:`render_context` turns definition + lock + file bytes into the exact build
context (Dockerfile first), from which :func:`context_tar` makes a byte-stable tar. Only ``gather`` and
``load`` touch disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rigsmith import render
from rigsmith.errors import LockError, SpecError
from rigsmith.imageref import parse_ref
from rigsmith.resolving.image.imagedef import TREE_CONTEXT_DIR, ImageDef, Patch
from rigsmith.resolving.lock import lock as lockmod

#: Where rigsmith's helper and the patches live inside the image (also the build-context directory name).
IMAGE_DIR = "/opt/rigsmith"
CONTEXT_DIR = "rigsmith"
#: The patch helper copied into every context; static, shellcheck-clean.
HELPER = "apply-patch.sh"

# -- inputs -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Everything a build context is made from: the definition plus the bytes of its files."""

    name: str
    definition: ImageDef
    patches: Mapping[str, bytes]  # slot → patch bytes
    files: Mapping[str, bytes]  # src → bytes
    template_dir: Path | None = None  # images/<name>/ when the definition overrides the template
    tree: Mapping[str, ContextFile] | None = None  # the locked commit's files + assets, tree-relative


def gather(images_dir: Path, name: str, definition: ImageDef) -> Inputs:
    """Read the patch and extra files; every missing one is named with its slot and where it goes."""
    home = images_dir / name
    source = f"images/{name}/image.yaml"
    problems: list[tuple[str, str]] = []
    patches: dict[str, bytes] = {}
    files: dict[str, bytes] = {}
    for i, p in enumerate(definition.patches):
        try:
            patches[p.slot] = (home / p.file).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            where = f" (from {p.source})" if p.source else ""
            problems.append(
                (
                    f"patches[{i}]",
                    f"patch slot {p.slot!r} is declared but images/{name}/{p.file} is missing; put the patch "
                    f"file{where} there, or remove the slot — the build cannot run without it",
                )
            )
    for i, f in enumerate(definition.files):
        try:
            files[f.src] = (home / f.src).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            problems.append((f"files[{i}]", f"images/{name}/{f.src} is missing; add it or remove the entry"))
    if definition.template and not (home / definition.template).is_file():
        problems.append(("template", f"images/{name}/{definition.template} is missing"))
    if problems:
        raise SpecError(source, problems, what="image definition")
    return Inputs(name, definition, patches, files, home if definition.template else None)


def sha256(data: bytes) -> str:
    """``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def base_digest(definition: ImageDef, lock: lockmod.Lock, name: str) -> str:
    """The base digest: from image.yaml, else from the lock; refuses a tag-only base."""
    base = definition.base
    if base.digest:
        return base.digest
    assert base.tag_ref is not None
    locked = lock.images.get(base.tag_ref)
    if locked is None:
        raise LockError(
            f"images/{name}: base {base.tag_ref} is a tag without a digest; a build must start FROM a "
            "pinned digest",
            hint=f"run `invoke pin` to lock {base.tag_ref} in rigsmith.lock (or set base.digest in "
            f"images/{name}/image.yaml)",
        )
    return locked.digest


# -- render -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextFile:
    """One file of the build context (a symlink when ``link`` is set; it points inside the context)."""

    data: bytes
    mode: int = 0o644
    link: str | None = None


@dataclass(frozen=True)
class Context:
    """A rendered build context and the facts recorded about it."""

    files: Mapping[str, ContextFile]  # relative path → file; "Dockerfile" included
    base: str  # name@sha256:…
    base_digest: str
    patch_hashes: Mapping[str, str]  # images/<name>/<file> → sha256:…
    labels: Mapping[str, str]
    inputs_sha256: str

    @property
    def dockerfile(self) -> str:
        """The rendered Dockerfile text."""
        return self.files["Dockerfile"].data.decode()


def _exec_form(argv: list[str] | tuple[str, ...]) -> str:
    """A Dockerfile exec-form array (JSON): no shell, no variable expansion."""
    return json.dumps(list(argv))


def _helper_argv(p: Patch, python: str) -> list[str]:
    where = p.package if p.target == "python-package" else p.path
    assert where is not None
    return [
        "/bin/sh",
        f"{IMAGE_DIR}/{HELPER}",
        p.target,
        where,
        str(p.strip),
        f"{IMAGE_DIR}/patches/{p.slot}.patch",
        python,
    ]


def render_context(inputs: Inputs, lock: lockmod.Lock, *, command: str) -> Context:
    """The exact build context: Dockerfile, the patch helper, patches and extra files. Pure."""
    d = inputs.definition
    name = inputs.name
    digest = base_digest(d, lock, name)
    base_ref = parse_ref(d.base.name)
    base = base_ref.pinned(digest)
    helper = (render.TEMPLATES / "images" / HELPER).read_bytes()
    files: dict[str, ContextFile] = {f"{CONTEXT_DIR}/{HELPER}": ContextFile(helper, 0o755)}
    patch_hashes: dict[str, str] = {}
    for p in d.patches:
        data = inputs.patches[p.slot]
        files[f"{CONTEXT_DIR}/patches/{p.slot}.patch"] = ContextFile(data)
        patch_hashes[f"images/{name}/{p.file}"] = sha256(data)
    for f in d.files:
        files[f"files/{f.src}"] = ContextFile(inputs.files[f.src], f.mode)
    tree = _tree_context(inputs, lock)
    for rel, tf in (inputs.tree or {}).items():
        files[f"{TREE_CONTEXT_DIR}/{rel}"] = tf

    labels: dict[str, str] = {
        "org.opencontainers.image.title": name,
        "org.opencontainers.image.base.name": base_ref.name + (f":{d.base.tag}" if d.base.tag else ""),
        "org.opencontainers.image.base.digest": digest,
    }
    if d.source:
        labels["org.opencontainers.image.source"] = d.source
    for p in d.patches:
        labels[f"io.rigsmith.patch.{p.slot}.sha256"] = sha256(inputs.patches[p.slot])
    labels.update(tree_labels(d, lock, name))
    labels.update(d.labels)

    def dockerfile(revision: str) -> bytes:
        all_labels = {**labels, "org.opencontainers.image.revision": revision}
        ctx: dict[str, Any] = {
            "banner": render.banner(command, f"images/{name}/image.yaml"),
            "base": base,
            "base_tag": d.base.tag_ref,
            "epoch": d.source_date_epoch,
            "build_args": sorted(d.build_args.items()),
            "pip": _exec_form([d.python, "-m", "pip", "install", "--no-cache-dir", *d.pip]) if d.pip else "",
            "files": [(_exec_form([f"files/{f.src}", f.dest])) for f in d.files],
            "has_patches": bool(d.patches),
            "context_dir": CONTEXT_DIR,
            "image_dir": IMAGE_DIR,
            "patches": [(p.slot, _exec_form(_helper_argv(p, d.python))) for p in d.patches],
            "smoke": _exec_form(d.smoke) if d.smoke else None,
            "tree": tree,
            "labels": sorted(all_labels.items()),
        }
        template = d.template or "Dockerfile.j2"
        overlay = inputs.template_dir
        return render.render_in(template, overlay, ctx).encode()

    # The revision label defaults to a hash of everything else, so it is computed with the label empty.
    files["Dockerfile"] = ContextFile(dockerfile(""))
    inputs_sha256 = sha256(context_tar(files, d.source_date_epoch))
    revision = d.revision or f"rigsmith-inputs-{inputs_sha256}"
    files["Dockerfile"] = ContextFile(dockerfile(revision))
    labels["org.opencontainers.image.revision"] = revision
    return Context(dict(sorted(files.items())), base, digest, patch_hashes, labels, inputs_sha256)


def context_tar(files: Mapping[str, ContextFile], epoch: int) -> bytes:
    """A byte-stable tar of the context: sorted, fixed mtime, root-owned, explicit modes and parent dirs."""
    buf = io.BytesIO()
    dirs: set[str] = set()
    for rel in files:
        parts = PurePosixPath(rel).parts[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    entries: list[tuple[str, ContextFile | None]] = [(d, None) for d in dirs]
    entries += list(files.items())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for rel, f in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(rel)
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if f is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif f.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = f.link
                info.mode = 0o777
                tar.addfile(info)
            else:
                info.size = len(f.data)
                info.mode = f.mode
                tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


# -- source trees -------------------------------------------------------------------------------------------


def provided_paths(definition: ImageDef) -> list[str]:
    """Absolute paths the definition puts into the image: the tree's dest and each copied file."""
    out = [definition.tree.dest_path] if definition.tree else []
    return out + [f.dest for f in definition.files]


def locked_source(definition: ImageDef, lock: lockmod.Lock, name: str) -> lockmod.LockedSource:
    """The lock's entry for the tree of ``images/<name>``; refuses a missing or stale one."""
    tree = definition.tree
    assert tree is not None
    entry = lock.sources.get(name)
    where = f"images/{name}/image.yaml"
    if entry is None:
        raise LockError(
            f"{where}: tree {tree.repo or '(repo not filled in)'} @ {tree.ref} is not locked; a build must "
            "copy an exact commit",
            hint="fill in every empty tree field and run `invoke pin` to lock the commit and asset hashes",
        )
    stale = [
        f"{field} is {want!r} in image.yaml but {have!r} in the lock"
        for field, want, have in (("tree.repo", tree.repo, entry.repo), ("tree.ref", tree.ref, entry.ref))
        if want != have
    ]
    for a in tree.assets:
        got = entry.assets.get(a.name)
        if got is None or got.url != a.url or (a.sha256 and a.sha256 != got.sha256):
            stale.append(f"asset {a.name!r} is not locked as declared")
    extra = sorted(set(entry.assets) - {a.name for a in tree.assets})
    if extra:
        stale.append(f"the lock holds asset(s) {extra} image.yaml no longer declares")
    if stale:
        raise LockError(
            f"{where}: the locked tree no longer matches the definition: {'; '.join(stale)}",
            hint="run `invoke pin --repin` to lock what image.yaml now declares",
        )
    return entry


def tree_labels(definition: ImageDef, lock: lockmod.Lock, name: str) -> dict[str, str]:
    """io.rigsmith.tree.* and io.rigsmith.asset.*: what a built image says about its source."""
    if definition.tree is None:
        return {}
    entry = locked_source(definition, lock, name)
    out = {"io.rigsmith.tree.repo": entry.repo, "io.rigsmith.tree.commit": entry.commit}
    for asset, got in sorted(entry.assets.items()):
        out[f"io.rigsmith.asset.{asset}.sha256"] = got.sha256
    return out


def _tree_context(inputs: Inputs, lock: lockmod.Lock) -> dict[str, Any] | None:
    tree = inputs.definition.tree
    if tree is None:
        return None
    locked_source(inputs.definition, lock, inputs.name)
    if inputs.tree is None:
        raise LockError(
            f"images/{inputs.name}: the tree's files were not gathered",
            hint="build with `invoke build`, which checks out the locked commit",
        )
    py = inputs.definition.python
    pip = [py, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--no-build-isolation", tree.dest_path]
    return {
        "copy_form": _exec_form([f"{TREE_CONTEXT_DIR}/", tree.dest_path + "/"]),
        "env": [("PYTHONPATH", tree.pythonpath_dir)] if tree.install == "pythonpath" else [],
        "pip": _exec_form(pip) if tree.install == "pip" else None,
        "workdir": tree.dest_path if tree.workdir else None,
    }
