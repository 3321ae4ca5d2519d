"""Image definitions: the ``images/<name>/image.yaml`` schema (base, patches, files, pip pins, the source
tree and its assets) and :func:`load`, which reads and validates that one file and nothing else (so
``pin`` works while patch files are still missing). The build context made from a definition is
:mod:`rigsmith.resolving.image.image`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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

from rigsmith import confine, render
from rigsmith.errors import SpecError
from rigsmith.imageref import DIGEST_RE, parse_ref
from rigsmith.importing.proposal import check_asset_url, check_git_url
from rigsmith.spec import NAME_RE, problems_from, repeated
from rigsmith.yamldoc import yaml_problem

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
    why = confine.why_unsafe(v)
    if why is not None:
        raise ValueError(f"must be a relative path inside the image directory ({why})")
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
    why = confine.why_unsafe(v) if v != "." else None
    if why is not None:
        raise ValueError(f"{what} must be a relative path inside the tree ({why})")
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
        raise SpecError(source, [("(file)", yaml_problem(err))], what="image definition") from None
    if not isinstance(data, dict):
        raise SpecError(source, [("(top level)", "must be a mapping (YAML object)")], what="image definition")
    try:
        return ImageDef.model_validate(data)
    except ValidationError as err:
        problems = [
            (path, msg.replace("schema/deployment.schema.json", "schema/image.schema.json"))
            for path, msg in problems_from(err, ImageDef)
        ]
        raise SpecError(source, problems, what="image definition") from None


def names(images_dir: Path) -> list[str]:
    """Every image definition under images/."""
    return sorted(p.parent.name for p in images_dir.glob("*/image.yaml"))


def schema() -> dict[str, Any]:
    """JSON Schema of image.yaml, for editors."""
    out = ImageDef.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "rigsmith image definition"
    return out
