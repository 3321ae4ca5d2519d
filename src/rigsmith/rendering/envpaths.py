"""Container paths the env names through a placeholder, and what provides each. Pure.

Seed 003's env says ``VLLM_QSA_KV_SCALES=<repo>/scales/qsa_kv_scales_262k.json (required — …)``: once
``<repo>`` is filled, the value is a path inside the container, and something must put a file there —
a mount, or the image (a source tree or a file its definition copies in; recorded in rigsmith.lock by
``invoke build``). :func:`env_paths` finds each such path and its provider; :func:`unprovided` turns the
ones nothing provides into spec problems naming the variable and its note.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from rigsmith import spec as specmod

Provider = Literal["mount", "image"]


@dataclass(frozen=True)
class EnvPath:
    """One container path an env value names through a placeholder."""

    index: int  # position in spec.env
    name: str
    path: str
    placeholder: str
    note: str | None
    provider: Provider | None  # None: nothing provides it
    by: str | None = None  # the mount's container path or the image path that holds it
    image_known: bool = False  # the image is a build whose definition rigsmith knows


def _under(path: str, roots: Iterable[str]) -> str | None:
    p = PurePosixPath(path)
    for root in roots:
        r = PurePosixPath(root)
        if p == r or r in p.parents:
            return root
    return None


def env_paths(
    spec: specmod.Deployment, mounts: Iterable[str], image_paths: Iterable[str], *, image_known: bool
) -> tuple[EnvPath, ...]:
    """Every absolute container path an active, non-secret env value names through a placeholder
    (``PATH``-style lists are split on ``:``), with what provides it: a mount first, then the image."""
    mounts, image_paths = tuple(mounts), tuple(image_paths)
    out: list[EnvPath] = []
    for i, e in enumerate(spec.env):
        if not e.active or e.secret:
            continue
        tokens = specmod.PLACEHOLDER_RE.findall(e.value)
        if not tokens:
            continue
        for part in e.value.split(":"):
            used = [t for t in tokens if t in part]
            path = spec.fill(part)
            if not used or not path.startswith("/") or ".." in PurePosixPath(path).parts:
                continue
            mount = _under(path, mounts)
            image = None if mount else _under(path, image_paths)
            provider: Provider | None = "mount" if mount else "image" if image else None
            out.append(EnvPath(i, e.name, path, used[0], e.note, provider, mount or image, image_known))
    return tuple(out)


def unprovided(paths: Iterable[EnvPath]) -> list[tuple[str, str]]:
    """(field, message) for each path nothing provides."""
    problems: list[tuple[str, str]] = []
    for p in paths:
        if p.provider is not None:
            continue
        note = f" ({p.note})" if p.note else ""
        where = (
            "nor in the built image (its tree.dest and files)"
            if p.image_known
            else "and the image's contents are not known to rigsmith (engine.image / --image)"
        )
        problems.append(
            (
                f"env.{p.name}",
                f"{p.path} (from {p.placeholder}) is not under any mount {where}{note}; add a mount whose "
                f"container path holds it, or build the tree into the image (engine.build with a tree whose "
                f"dest contains it, then `invoke build`)",
            )
        )
    return problems
