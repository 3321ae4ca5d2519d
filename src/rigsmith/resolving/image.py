"""Image definitions (``images/<name>/image.yaml``) and the pure build-context render.

Three steps, kept apart: :func:`load` validates the YAML (no other file is read, so ``pin`` works while
patch files are still missing); :func:`gather` reads the patch and extra files and refuses a missing one by
slot; :func:`render_context` turns definition + lock + file bytes into the exact build context (Dockerfile
first), from which :func:`context_tar` makes a byte-stable tar. Only ``gather`` and ``load`` touch disk.
"""

# Over 500 lines (708), left whole: the image.yaml models (base, patches, files, the source tree) and the
# render they feed are one schema and one pure function; the archive handling is already apart (archive.py).
# The next split is the tree models and their lock lookups into their own module.

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rigsmith import render
from rigsmith.errors import LockError, SpecError
from rigsmith.importing.proposal import check_asset_url, check_git_url
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.imageref import DIGEST_RE, parse_ref
from rigsmith.spec import NAME_RE, problems_from, repeated

#: Where rigsmith's helper and the patches live inside the image (also the build-context directory name).
IMAGE_DIR = "/opt/rigsmith"
CONTEXT_DIR = "rigsmith"
#: The patch helper copied into every context; static, shellcheck-clean.
HELPER = "apply-patch.sh"
_PIP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_LABEL_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_ARG_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Label keys rigsmith sets itself; an image.yaml may not set these.
RESERVED_LABEL_PREFIXES = ("org.opencontainers.image.", "io.rigsmith.")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _single_line(v: str, what: str) -> str:
    breaks = render.line_breaks(v)
    if breaks:
        raise ValueError(f"{what} must be one line (holds the line break {breaks[0]!r})")
    return v


def _lower_name(v: str, what: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError(f"{what} {v!r}: use lowercase letters, digits, '.', '_' or '-'")
    return v


def _inside(v: str) -> str:
    p = PurePosixPath(v)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError("must be a relative path inside the image directory (no leading /, no ..)")
    return v


def _one_line(what: str) -> AfterValidator:
    return AfterValidator(lambda v: _single_line(v, what))


def _named(what: str) -> AfterValidator:
    """A lowercase name, the error naming ``what`` it is."""
    return AfterValidator(lambda v: _lower_name(v, what))


def _checked(check: Callable[[str], object]) -> AfterValidator:
    """``check`` raises ValueError for a bad value; the value itself is kept."""

    def run(v: str) -> str:
        check(v)
        return v

    return AfterValidator(run)


#: A file of images/<name>/ (relative, no ..).
InsideDir = Annotated[str, AfterValidator(_inside)]


class Base(_Frozen):
    """The base image: a human tag for reviewers, and the digest that is actually used."""

    name: str = Field(description="Repository, e.g. vllm/vllm-openai or 127.0.0.1:5000/tinybase.")
    tag: str | None = Field(None, description="Human tag; `invoke pin` locks its digest in rigsmith.lock.")
    digest: str | None = Field(None, description="sha256:… when pinned here; else taken from rigsmith.lock.")

    @model_validator(mode="after")
    def _check(self) -> Base:
        if "@" in self.name or ":" in self.name.rsplit("/", 1)[-1]:
            raise ValueError("name is the repository only; put the tag in `tag` and the digest in `digest`")
        if self.tag is None and self.digest is None:
            raise ValueError("set tag (and run `invoke pin`) or digest")
        if self.digest is not None and not DIGEST_RE.match(self.digest):
            raise ValueError(f"digest {self.digest!r} is not sha256:<64 hex digits>")
        parse_ref(self.tag_ref or self.name)
        return self

    @property
    def tag_ref(self) -> str | None:
        """``name:tag`` as written: the key of rigsmith.lock's ``images`` table."""
        return f"{self.name}:{self.tag}" if self.tag else None


class Patch(_Frozen):
    """A patch slot: a file applied with ``patch -pN`` to an installed Python package or a directory."""

    slot: Annotated[str, _named("slot")] = Field(description="Name of the slot, e.g. ple-host-gather.")
    file: InsideDir = Field(description="Patch file, relative to images/<name>/.")
    target: Literal["python-package", "path"] = "python-package"
    package: str | None = Field(None, description="python-package: the import name, e.g. vllm.")
    path: str | None = Field(None, description="path: absolute directory inside the image.")
    strip: int = Field(1, ge=0, description="patch -p level (1 for `git diff` output).")
    source: str | None = Field(None, description="Where the patch comes from (named when it is missing).")
    note: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Patch:
        if self.target == "python-package" and not self.package:
            raise ValueError("target python-package needs `package` (the import name, e.g. vllm)")
        if self.target == "path" and not (self.path and self.path.startswith("/")):
            raise ValueError("target path needs `path`, an absolute directory inside the image")
        return self


class ExtraFile(_Frozen):
    """A file copied into the image."""

    src: InsideDir = Field(description="Relative to images/<name>/.")
    dest: str = Field(description="Absolute path inside the image.")
    mode: int = Field(0o644, ge=0, le=0o7777, description="Permission bits (YAML: 0o755 or 493).")

    @field_validator("dest")
    @classmethod
    def _dest(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("dest must be an absolute path inside the image")
        return _single_line(v, "dest")


_SHA256_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
GitUrl = Annotated[str, AfterValidator(check_git_url)]
AssetUrl = Annotated[str, AfterValidator(check_asset_url)]
_DEST_RE = re.compile(r"/[A-Za-z0-9._+@/-]+")
_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")
#: Where the tree lands in the build context.
TREE_CONTEXT_DIR = "tree"


def _sha256(v: str) -> None:
    if not _SHA256_RE.match(v):
        raise ValueError(f"{v!r} is not sha256:<64 lowercase hex digits>")


def _ref(v: str) -> None:
    if not _REF_RE.fullmatch(v) or ".." in v or v.endswith((".lock", "/", ".")) or "//" in v:
        raise ValueError(f"{v!r} is not a branch, tag or commit sha")


def _commit(v: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{4,40}", v):
        raise ValueError(f"{v!r} is not a commit sha (4 to 40 lowercase hex digits)")


def _no_escape(v: str, what: str) -> str:
    p = PurePosixPath(v)
    if p.is_absolute() or ".." in p.parts or "\\" in v:
        raise ValueError(f"{what} must be a relative path inside the tree (no leading /, no ..)")
    return _single_line(v, what)


def _unique(attr: str, what: str) -> AfterValidator:
    """A tuple whose items' ``attr`` values are distinct."""

    def check(items: tuple[Any, ...]) -> tuple[Any, ...]:
        dup = repeated(getattr(i, attr) for i in items)
        if dup:
            raise ValueError(f"{what} {dup} used twice")
        return items

    return AfterValidator(check)


def _in_tree(what: str) -> AfterValidator:
    return AfterValidator(lambda v: _no_escape(v, what))


class Asset(_Frozen):
    """A release asset: fetched by URL, verified by sha256, unpacked into the tree or placed in it."""

    name: Annotated[str, _named("asset name")] = Field(
        description="Name of the asset (lowercase), e.g. compiled-ops."
    )
    url: AssetUrl | None = Field(
        None, description="http(s) URL; empty until filled in (pin refuses it then)."
    )
    sha256: Annotated[str, _checked(_sha256)] | None = Field(
        None, description="sha256:… if known; `invoke pin` locks it otherwise."
    )
    unpack: Annotated[str, _in_tree("unpack")] | None = Field(
        None, description="Unpack this tar(.gz/.bz2/.xz) into this directory of the tree ('.' = its root)."
    )
    dest: Annotated[str, _in_tree("dest")] | None = Field(
        None, description="Or place the file unchanged at this path in the tree."
    )
    note: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Asset:
        if (self.unpack is None) == (self.dest is None):
            raise ValueError("set exactly one of unpack (a directory of the tree) or dest (a file in it)")
        if self.dest is not None and PurePosixPath(self.dest).name in ("", "."):
            raise ValueError("dest must name a file")
        return self


class Tree(_Frozen):
    """A source tree: a git repository at a ref, locked to a commit by `invoke pin`, copied into the image."""

    repo: GitUrl | None = Field(
        None, description="Git URL (https, http, git, ssh, file); empty until filled."
    )
    ref: Annotated[str, _checked(_ref)] = Field(
        description="Branch, tag or (short) commit sha; `invoke pin` locks the full commit."
    )
    commit: Annotated[str, _checked(_commit)] | None = Field(
        None,
        description="The commit (or its prefix) the recipe says ref is; pin refuses a ref resolving "
        "elsewhere.",
    )
    dest: str = Field(description="Absolute directory in the image the tree is copied to.")
    install: Literal["pythonpath", "pip", "copy"] = Field(
        "pythonpath",
        description="pythonpath: copied and put on PYTHONPATH; pip: copied and `pip install`ed (no deps); "
        "copy: copied only.",
    )
    pythonpath: Annotated[str, _in_tree("pythonpath")] = Field(
        ".", description="install: pythonpath: the tree directory put on PYTHONPATH."
    )
    workdir: bool = Field(
        True,
        description="WORKDIR is the tree: the recipe's relative env values (TREE=./vllm-v2.5) resolve there.",
    )
    assets: Annotated[tuple[Asset, ...], _unique("name", "name(s)")] = ()
    note: str | None = None

    @field_validator("dest")
    @classmethod
    def _dest(cls, v: str) -> str:
        p = PurePosixPath(v)
        if not p.is_absolute() or ".." in p.parts or p == PurePosixPath("/"):
            raise ValueError("dest must be an absolute directory inside the image (not /)")
        if not _DEST_RE.fullmatch(v):
            raise ValueError("dest: use letters, digits and . _ - + @ / only (it is written raw as WORKDIR)")
        return _single_line(v, "dest")

    @property
    def dest_path(self) -> str:
        """``dest`` without a trailing slash."""
        return str(PurePosixPath(self.dest))

    @property
    def pythonpath_dir(self) -> str:
        """The absolute directory put on PYTHONPATH."""
        return str(PurePosixPath(self.dest) / self.pythonpath)

    def unfilled(self) -> list[tuple[str, str]]:
        """(field, what to do) for every field pin cannot work without."""
        out: list[tuple[str, str]] = []
        if not self.repo:
            out.append(("tree.repo", "is empty; write the git URL of the source repository"))
        for i, a in enumerate(self.assets):
            if not a.url:
                out.append((f"tree.assets[{i}].url", f"asset {a.name!r} has no URL; write its download URL"))
        return out


def _one_line_map(v: dict[str, str], field: str, key_re: re.Pattern[str], key_is: str) -> None:
    """Keys matching ``key_re`` (else "<key> is not <key_is>"), every value one line."""
    for k, val in v.items():
        if not key_re.fullmatch(k):
            raise ValueError(f"{k!r} is not {key_is}")
        _single_line(val, f"{field}.{k}")


def _build_args(v: dict[str, str]) -> dict[str, str]:
    _one_line_map(v, "build_args", _ARG_RE, "a build-arg name")
    if "SOURCE_DATE_EPOCH" in v:
        raise ValueError("SOURCE_DATE_EPOCH comes from source_date_epoch; remove it from build_args")
    return v


def _labels(v: dict[str, str]) -> dict[str, str]:
    _one_line_map(v, "labels", _LABEL_KEY_RE, "a label key (lowercase, dots and dashes)")
    reserved = [k for k in v if k.startswith(RESERVED_LABEL_PREFIXES)]
    if reserved:
        sets = " and ".join(f"{p}*" for p in RESERVED_LABEL_PREFIXES)
        raise ValueError(f"{reserved[0]!r}: rigsmith sets {sets} itself")
    return v


class ImageDef(_Frozen):
    """``images/<name>/image.yaml``: the inputs of one engine image."""

    version: Literal[1] = 1
    description: str | None = None
    base: Base
    python: str = Field("python3", description="Interpreter in the image (pip, python-package patches).")
    pip: tuple[str, ...] = Field((), description="Exact pins, name==version, installed in this order.")
    files: tuple[ExtraFile, ...] = ()
    patches: Annotated[tuple[Patch, ...], _unique("slot", "slot(s)")] = ()
    build_args: Annotated[dict[str, str], AfterValidator(_build_args)] = Field(
        default_factory=dict,
        description="ARG defaults in the Dockerfile (also the env of RUN steps, e.g. PIP_INDEX_URL); they "
        "are visible in the Dockerfile and the image history, so never put a secret here.",
    )
    labels: Annotated[dict[str, str], AfterValidator(_labels)] = Field(default_factory=dict)
    smoke: tuple[str, ...] = Field(
        (), description="argv run as the last build step; failing fails the build."
    )
    # Both become LABEL values; a newline would end the LABEL and start a Dockerfile instruction.
    source: Annotated[str, _one_line("source")] | None = Field(
        None, description="org.opencontainers.image.source (upstream of the patches)."
    )
    revision: Annotated[str, _one_line("revision")] | None = Field(
        None, description="org.opencontainers.image.revision; default: inputs hash."
    )
    source_date_epoch: int = Field(0, ge=0, description="Fixed timestamp for reproducible builds.")
    template: str | None = Field(
        None, description="A .j2 file in images/<name>/ that extends Dockerfile.j2 and overrides its blocks."
    )
    notes: tuple[str, ...] = ()
    tree: Tree | None = Field(
        None, description="A source tree (git repo at a ref, release assets) copied into the image."
    )

    @field_validator("pip")
    @classmethod
    def _pip(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [p for p in v if not _PIP_RE.fullmatch(p)]
        if bad:
            raise ValueError(f"{bad} are not exact pins; write each as name==version")
        return v

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and (v == "Dockerfile.j2" or not v.endswith(".j2") or "/" in v):
            raise ValueError(
                "name a .j2 file in images/<name>/ (not Dockerfile.j2) that extends Dockerfile.j2"
            )
        return v



def load(images_dir: Path, name: str) -> ImageDef:
    """Read and validate ``images/<name>/image.yaml`` (only that file)."""
    path = images_dir / name / "image.yaml"
    source = f"images/{name}/image.yaml"
    if not NAME_RE.match(name):
        raise SpecError(
            source,
            [("(name)", f"{name!r}: use lowercase letters, digits, '.', '_' or '-'")],
            what="image definition",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        known = sorted(p.parent.name for p in images_dir.glob("*/image.yaml"))
        raise SpecError(
            source,
            [
                (
                    "(file)",
                    f"does not exist; known images: {', '.join(known) or 'none'} "
                    f"(create images/{name}/image.yaml)",
                )
            ],
            what="image definition",
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(source, [("(file)", f"not valid YAML: {err}")], what="image definition") from None
    if not isinstance(data, dict):
        raise SpecError(source, [("(top level)", "must be a mapping (YAML object)")], what="image definition")
    try:
        return ImageDef.model_validate(data)
    except ValidationError as err:
        problems = [
            (path, msg.replace("schema/deployment.schema.json", "schema/image.schema.json"))
            for path, msg in problems_from(err)
        ]
        raise SpecError(source, problems, what="image definition") from None


def names(images_dir: Path) -> list[str]:
    """Every image definition under images/."""
    return sorted(p.parent.name for p in images_dir.glob("*/image.yaml"))


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


def schema() -> dict[str, Any]:
    """JSON Schema of image.yaml, for editors."""
    out = ImageDef.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "rigsmith image definition"
    return out
