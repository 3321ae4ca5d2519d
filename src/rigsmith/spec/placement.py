"""Where each secondary Hub model lives (host directory, container path, files fetched) and why a spec's
secondary models cannot be placed. Pure rules over the spec's values, below the spec models, which refuse a
spec these rules refuse; ``secondary`` builds on them (views for pin and fetch, rewritten argv, GGUF).

The functions take the spec structurally (``Layout``): the deployment model is defined above this module.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Entry(Protocol):
    """One ``secondary_models`` entry (``spec.SecondaryModel``)."""

    @property
    def role(self) -> str: ...
    @property
    def repo(self) -> str: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def arg(self) -> int: ...
    @property
    def local_dir(self) -> str | None: ...
    @property
    def container_path(self) -> str | None: ...
    @property
    def allow_patterns(self) -> tuple[str, ...]: ...


class _Model(Protocol):
    @property
    def local_dir(self) -> str: ...
    @property
    def container_path(self) -> str: ...


class _Engine(Protocol):
    @property
    def args(self) -> Sequence[str]: ...


class _Mount(Protocol):
    @property
    def container(self) -> str: ...


class Layout(Protocol):
    """What placement reads of a deployment spec (``spec.Deployment``)."""

    @property
    def model(self) -> _Model: ...
    @property
    def secondary_models(self) -> Sequence[Entry]: ...
    @property
    def engine(self) -> _Engine: ...
    @property
    def mounts(self) -> Sequence[_Mount]: ...


#: What a tokenizer needs from a model repo (the weights are not fetched for a ``--tokenizer`` repo).
TOKENIZER_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.py", "*.jinja")
#: Where secondary models are mounted in the container by default.
CONTAINER_ROOT = "/models"


@dataclass(frozen=True)
class Placement:
    """One secondary repo: what is fetched, where on the host, where in the container."""

    repo: str
    revision: str | None
    local_dir: str
    container_path: str
    allow_patterns: tuple[str, ...]
    #: Indices in ``secondary_models`` of the entries this repo serves (the first names it in messages).
    entries: tuple[int, ...]

    @property
    def field(self) -> str:
        """The spec field errors name: ``secondary_models[I]``."""
        return f"secondary_models[{self.entries[0]}]"


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def _default_dir(spec: Layout, repo: str) -> str:
    parent = posixpath.dirname(spec.model.local_dir.rstrip("/")) or "."
    owner, name = repo.split("/", 1)
    taken = {_norm(spec.model.local_dir)} | {
        _norm(posixpath.join(parent, sm.repo.split("/", 1)[1]))
        for sm in spec.secondary_models
        if sm.repo != repo
    }
    plain = posixpath.join(parent, name)
    return plain if _norm(plain) not in taken else posixpath.join(parent, f"{owner}--{name}")


def _patterns(group: Sequence[Entry]) -> tuple[str, ...]:
    """Every file when one entry needs the whole repo; else the union of the entries' patterns."""
    out: list[str] = []
    for sm in group:
        own = sm.allow_patterns or (TOKENIZER_PATTERNS if sm.role == "tokenizer" else ())
        if not own:
            return ()
        out += [p for p in own if p not in out]
    return tuple(out)


def _first(values: Iterable[str | None]) -> str | None:
    return next((v for v in values if v is not None), None)


def placements(spec: Layout) -> list[Placement]:
    """One placement per secondary repo, in the order the spec first names them."""
    groups: dict[str, list[int]] = {}
    for i, sm in enumerate(spec.secondary_models):
        groups.setdefault(sm.repo, []).append(i)
    out = []
    for repo, idx in groups.items():
        group = [spec.secondary_models[i] for i in idx]
        local = _first(sm.local_dir for sm in group) or _default_dir(spec, repo)
        container = _first(sm.container_path for sm in group)
        out.append(
            Placement(
                repo=repo,
                revision=_first(sm.revision for sm in group),
                local_dir=local,
                container_path=container or posixpath.join(CONTAINER_ROOT, posixpath.basename(local)),
                allow_patterns=_patterns(group),
                entries=tuple(idx),
            )
        )
    return out


def _differs(spec: Layout, idx: Sequence[int], attr: str) -> str | None:
    values = {getattr(spec.secondary_models[i], attr) for i in idx} - {None}
    if len(values) > 1:
        where = ", ".join(f"secondary_models[{i}]" for i in idx)
        return (
            f"{where} name the same repo with different {attr} values {sorted(values)}; one repo is "
            f"fetched once, so give them the same {attr} (or leave it null on all but one)"
        )
    return None


def placement_problem(spec: Layout) -> str | None:
    """Why the secondary models cannot be placed as the spec says, or None."""
    for i, sm in enumerate(spec.secondary_models):
        named = named_repo(spec.engine.args[sm.arg], sm.role)
        if named != sm.repo:
            return (
                f"secondary_models[{i}].arg {sm.arg}: engine.args[{sm.arg}] does not name {sm.repo} "
                f"(it names {named!r}); point arg at the word that names the {sm.role} model"
            )
    groups: dict[str, list[int]] = {}
    for i, sm in enumerate(spec.secondary_models):
        groups.setdefault(sm.repo, []).append(i)
    for idx in groups.values():
        for attr in ("revision", "local_dir", "container_path"):
            problem = _differs(spec, idx, attr)
            if problem:
                return problem
    taken = {spec.model.container_path: "model.container_path"}
    taken.update({m.container: f"mounts[{j}].container" for j, m in enumerate(spec.mounts)})
    dirs = {_norm(spec.model.local_dir): "model.local_dir"}
    for p in placements(spec):
        if p.container_path in taken:
            return (
                f"{p.field}.container_path {p.container_path} is also {taken[p.container_path]}; set "
                f"{p.field}.container_path to a path of its own"
            )
        if _norm(p.local_dir) in dirs:
            return (
                f"{p.field}.local_dir {p.local_dir} is also {dirs[_norm(p.local_dir)]}; a model dir holds "
                f"one repo, so set {p.field}.local_dir to a directory of its own"
            )
        taken[p.container_path] = f"{p.field}.container_path"
        dirs[_norm(p.local_dir)] = f"{p.field}.local_dir"
    return None


def split_word(word: str) -> tuple[str, str]:
    """(``--flag=`` prefix or '', value) of one argv word."""
    if word.startswith("-") and "=" in word:
        flag, _, value = word.partition("=")
        return flag + "=", value
    return "", word


def json_value(value: str) -> dict[str, object] | None:
    if not value.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def named_repo(word: str, role: str) -> str | None:
    """The model an argv word names for ``role``: the ``model`` of a speculative config, the path of a
    ``NAME=PATH`` LoRA module (or its JSON form), the word itself for a tokenizer."""
    value = split_word(word)[1]
    conf = json_value(value)
    key = "model" if role == "speculative" else "path"
    if conf is not None and role != "tokenizer":
        got = conf.get(key)
        return got if isinstance(got, str) else None
    if role == "lora":
        _name, eq, path = value.partition("=")
        return path if eq else None
    return value
